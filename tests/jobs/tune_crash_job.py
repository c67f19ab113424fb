"""A training loop that crashes when its DataLoader's num_workers is not the
one it was written with (for ``dlwatch tune``'s crash path): a script whose
dataset cannot be shared with more workers, say. Runs until stopped."""

import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

WRITTEN_WITH = 1


class Sleepy(Dataset):
    def __len__(self):
        return 4096

    def __getitem__(self, i):
        time.sleep(0.004)
        return torch.full((4,), float(i))


def main():
    loader = DataLoader(Sleepy(), batch_size=4, num_workers=WRITTEN_WITH)
    if loader.num_workers != WRITTEN_WITH:
        print(f"tune_crash_job: cannot run with num_workers={loader.num_workers}", file=sys.stderr)
        sys.exit(3)
    while True:
        for _ in loader:
            time.sleep(0.002)


if __name__ == "__main__":
    main()
