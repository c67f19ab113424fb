"""A training loop started WITHOUT the hook, for ``dlwatch attach`` tests.

It measures itself: every ``next()`` of its loader is logged as
``enter_ns exit_ns`` (CLOCK_MONOTONIC, the clock ``dlwatch attach`` reports
its span on) to ``--trace``, line by line as it goes, so a test can compute
the loop's own data wait over exactly the attach's span; at the end it prints
its overall figure as JSON. ``--ready`` is created after the first batch.
"""

import argparse
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset


def _spend(ms, spin):
    if spin:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass
    else:
        time.sleep(ms / 1000)


class Costly(Dataset):
    def __init__(self, sample_ms, spin, size=10**7):
        self.sample_ms, self.spin, self.size = sample_ms, spin, size

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        _spend(self.sample_ms, self.spin)
        return torch.full((8,), float(i))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--sample-ms", type=float, default=10.0)
    p.add_argument("--step-ms", type=float, default=10.0)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--spin", action="store_true", help="burn CPU instead of sleeping")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--trace")
    p.add_argument("--ready")
    p.add_argument(
        "--epoch-batches", type=int, help="epochs of N batches (workers not persistent: new ones each epoch)"
    )
    a = p.parse_args()
    kw = dict(batch_size=a.batch_size, num_workers=a.workers, pin_memory=a.pin_memory)
    if a.workers:
        kw["multiprocessing_context"] = a.start_method
    size = a.epoch_batches * a.batch_size if a.epoch_batches else 10**7
    loader = DataLoader(Costly(a.sample_ms, a.spin, size), **kw)
    trace = open(a.trace, "w", buffering=1) if a.trace else None
    wait = total = 0
    it = iter(loader)
    end = None
    start = time.monotonic_ns()
    n = 0
    while True:
        t0 = time.monotonic_ns()
        try:
            next(it)
        except StopIteration:
            it = iter(loader)  # the next epoch
            continue
        t1 = time.monotonic_ns()
        if end is None:
            end = time.monotonic() + a.duration
            start = t1
            if a.ready:
                open(a.ready, "w").close()
        else:
            wait += t1 - t0
        if trace:
            trace.write(f"{t0} {t1}\n")
        n += 1
        _spend(a.step_ms, a.spin)
        if time.monotonic() > end:
            break
    total = time.monotonic_ns() - start
    del it
    print(json.dumps({"data_wait_fraction": wait / total, "batches": n, "pid": os.getpid()}), flush=True)


if __name__ == "__main__":
    main()
