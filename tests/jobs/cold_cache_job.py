"""A loop whose data is slow to read the first time and fast after, as files
behind a cold page cache are: each sample sleeps --cold-ms the first time
any process of any run reads it (a marker file per index in --cache-dir
records the read: later runs, such as tune's later trials, find it warm)
and --warm-ms after. Epochs of --samples samples, batches of 4, one step of
--step-ms; its input is I/O-bound, so more workers help.

Usage: cold_cache_job.py --cache-dir DIR [--num-workers N] [--samples N]
       [--cold-ms MS] [--warm-ms MS] [--step-ms MS]
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401


class ColdFirstRead(Dataset):
    def __init__(self, n: int, cache: str, cold_s: float, warm_s: float) -> None:
        self.n, self.cache, self.cold_s, self.warm_s = n, cache, cold_s, warm_s

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        mark = os.path.join(self.cache, str(i))
        if os.path.exists(mark):
            time.sleep(self.warm_s)
        else:
            time.sleep(self.cold_s)
            open(mark, "w").close()
        return torch.zeros(4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cache-dir", required=True)
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--samples", type=int, default=160)
    p.add_argument("--cold-ms", type=float, default=40.0)
    p.add_argument("--warm-ms", type=float, default=10.0)
    p.add_argument("--step-ms", type=float, default=20.0)
    a = p.parse_args()
    ds = ColdFirstRead(a.samples, a.cache_dir, a.cold_ms / 1000, a.warm_ms / 1000)
    loader = DataLoader(ds, batch_size=4, shuffle=True, num_workers=a.num_workers)
    while True:  # until tune stops it
        for _batch in loader:
            time.sleep(a.step_ms / 1000)


if __name__ == "__main__":
    main()
