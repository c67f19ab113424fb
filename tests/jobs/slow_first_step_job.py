"""A loop whose first step takes seconds (as cudnn benchmark, torch.compile or
AMP set-up make a GPU job's), then a short steady step; its input is I/O-bound
(each sample sleeps), so more workers help.

Usage: slow_first_step_job.py [--num-workers N] [--first-step-s S] [--step-ms MS]
       [--duration S] [--report PATH]

With --report, writes {"batches_per_s": ...} over its steady steps (after the
first step, past one second of warm-up) when --duration has passed since the
first step ended: the plain run's pace that a tune baseline must match.
"""

import argparse
import json
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401


class Sleepy(Dataset):
    def __len__(self):
        return 10**6

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.zeros(4)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--num-workers", type=int, default=1)
    p.add_argument("--first-step-s", type=float, default=12.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--report")
    a = p.parse_args()
    loader = DataLoader(Sleepy(), batch_size=8, num_workers=a.num_workers)
    steady_from = end = None
    n = 0
    for i, _batch in enumerate(loader):
        if i == 0:
            time.sleep(a.first_step_s)
            t = time.monotonic()
            steady_from, end = t + 1.0, t + a.duration
            continue
        time.sleep(a.step_ms / 1000)
        now = time.monotonic()
        if now >= steady_from:
            n += 1
        if now >= end:
            break
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"batches_per_s": n / (end - steady_from)}, f)


if __name__ == "__main__":
    main()
