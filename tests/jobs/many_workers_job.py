"""An instrumented job with many DataLoader workers that costs almost no CPU.

For measuring the monitor (bench/tui_footprint.py): several of these run at
once on a small machine, so every cost is a sleep — the samples (off-CPU, as
if reading from storage) and the training step — and the batches are tiny.
Workers are forked once (``persistent_workers=True``) and keep their PIDs.

    python tests/jobs/many_workers_job.py --workers 8 --duration 60 --ready FILE

The ready file is created after the first batch. The job stops after
``--duration`` seconds, or earlier on SIGTERM/SIGINT.
"""

import argparse
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401  (as a user would; a no-op under DLWATCH_DISABLE=1)


class SleepySamples(Dataset):
    def __init__(self, n: int, sample_ms: float) -> None:
        self.n, self.sample_ms = n, sample_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sample_ms / 1000)
        return torch.zeros(4), i


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--sample-ms", type=float, default=40.0)
    p.add_argument("--step-ms", type=float, default=100.0)
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--ready", help="create this file after the first batch")
    a = p.parse_args()

    torch.set_num_threads(1)
    stop = [False]

    def on_signal(signum, frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    loader = DataLoader(
        SleepySamples(a.size, a.sample_ms),
        batch_size=a.batch_size,
        num_workers=a.workers,
        multiprocessing_context="fork",
        persistent_workers=a.workers > 0,
        prefetch_factor=a.prefetch if a.workers else None,
    )
    end = None
    while not stop[0]:
        for _ in loader:
            if end is None:
                end = time.monotonic() + a.duration
                if a.ready:
                    open(a.ready, "w").close()
            time.sleep(a.step_ms / 1000)
            if stop[0] or time.monotonic() > end:
                stop[0] = True
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
