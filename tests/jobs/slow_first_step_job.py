"""A loop whose first step takes seconds (as cudnn benchmark, torch.compile or
AMP set-up make a GPU job's), then a short steady step; its input is I/O-bound
(each sample sleeps), so more workers help.

Usage: slow_first_step_job.py [--num-workers N[,N...]] [--first-step-s S] [--step-ms MS]
       [--duration S] [--report PATH] [--batch-log PATH]

With --report, writes {"batches_per_s": [...]} over its steady steps (after the
first step, past one second of warm-up) when --duration has passed since the
first step ended: the plain runs' paces, whose ratio tune's speed-up must match. Each
count of --num-workers is one such run with a loader of its own, one after the
other in this process (torch imported once: the test's plain runs took ~2 s
each to start).

With --batch-log, appends one line a batch, "pid num_workers epoch t0 t1": the
loop's own record of each blocking next() on ``time.perf_counter_ns`` (the
hook's clock), so a tune trial's pace can be checked over its own window.
"""

import argparse
import itertools
import json
import os
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
    p.add_argument("--num-workers", default="1")
    p.add_argument("--first-step-s", type=float, default=12.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--duration", type=float, default=600.0)
    p.add_argument("--report")
    p.add_argument("--batch-log")
    a = p.parse_args()
    log = open(a.batch_log, "a", buffering=1) if a.batch_log else None  # a line a batch
    paces = [run(int(n), a.first_step_s, a.step_ms, a.duration, log) for n in a.num_workers.split(",")]
    if a.report:
        with open(a.report, "w") as f:
            json.dump({"batches_per_s": paces}, f)


def run(num_workers: int, first_step_s: float, step_ms: float, duration: float, log=None) -> float:
    """Train until ``duration`` past the first step; the steady batches/s."""
    loader = DataLoader(Sleepy(), batch_size=8, num_workers=num_workers)
    steady_from = end = 0.0
    n = 0
    it = iter(loader)
    for i in itertools.count():
        t0 = time.perf_counter_ns()
        next(it)
        if log is not None:
            # the loader's own count: tune's trials override the script's
            log.write(f"{os.getpid()} {loader.num_workers} 0 {t0} {time.perf_counter_ns()}\n")
        if i == 0:
            time.sleep(first_step_s)
            t = time.monotonic()
            steady_from, end = t + 1.0, t + duration
            continue
        time.sleep(step_ms / 1000)
        now = time.monotonic()
        if now >= steady_from:
            n += 1
        if now >= end:
            break
    return n / (end - steady_from)


if __name__ == "__main__":
    main()
