"""Instrumented jobs for the freshness and scale benchmarks (bench/freshness.py,
bench/scale.py). One script, three modes:

``--mode switch``  (freshness) 2 persistent fork workers, 4 samples x 5 ms of
    sleep per batch: a batch every ~10 ms. While the trigger file is absent the
    loop steps 20 ms (loop-bound, data wait ~0); while it exists the loop steps
    5 ms (data-bound, data wait ~50 %). Every change is logged to ``--log`` as
    ``on|off <time.monotonic_ns()>`` at the exact moment the loop switched (the
    clock the probe stamps its frames with, system-wide on Linux).

``--mode sleepy``  (scale) many persistent fork workers whose every cost is a
    sleep, ``torch.set_num_threads(1)``: many processes, almost no CPU.

``--mode fast``    (scale) ``DataLoader(TensorDataset(arange(N)), batch_size=1,
    num_workers=0)`` as fast as it goes for ``--duration`` seconds; writes the
    batches and the seconds to ``--result`` (JSON).

The ready file (``--ready``) is created after the first batch. SIGTERM/SIGINT
end the job cleanly. The hook is imported as a user would (a no-op under
DLWATCH_DISABLE=1).
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

import dlwatch.hook  # noqa: F401


class Sleepy(Dataset):
    def __init__(self, n: int, sample_ms: float) -> None:
        self.n, self.sample_ms = n, sample_ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.sample_ms / 1000)
        return torch.zeros(4), i


def _ready(path) -> None:
    if path:
        open(path, "w").close()


def run_switch(a, stop) -> None:
    loader = DataLoader(
        Sleepy(a.size, a.sample_ms),
        batch_size=a.batch_size,
        num_workers=a.workers,
        multiprocessing_context="fork",
        persistent_workers=True,
        prefetch_factor=a.prefetch,
    )
    log = open(a.log, "a", buffering=1) if a.log else None
    on = False
    end = None
    while not stop[0]:
        for _ in loader:
            if end is None:
                end = time.monotonic() + a.duration
                _ready(a.ready)
            now_on = os.path.exists(a.trigger)
            if now_on != on:
                on = now_on
                if log:
                    log.write(f"{'on' if on else 'off'} {time.monotonic_ns()}\n")
            time.sleep((a.fast_step_ms if on else a.step_ms) / 1000)
            if stop[0] or time.monotonic() > end:
                stop[0] = True
                break


def run_sleepy(a, stop) -> None:
    loader = DataLoader(
        Sleepy(a.size, a.sample_ms),
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
                _ready(a.ready)
            time.sleep(a.step_ms / 1000)
            if stop[0] or time.monotonic() > end:
                stop[0] = True
                break


def run_fast(a, stop) -> None:
    ds = TensorDataset(torch.arange(a.size).float())
    loader = DataLoader(ds, batch_size=1, num_workers=0)
    n = 0
    t0 = None
    end = None
    while not stop[0]:
        for _ in loader:
            n += 1
            if t0 is None:
                t0 = time.perf_counter()
                c0 = time.thread_time()
                n0 = n
                end = t0 + a.duration
                _ready(a.ready)
            if n & 1023 == 0 and (stop[0] or time.perf_counter() > end):
                stop[0] = True
                break
    secs = time.perf_counter() - t0
    cpu = time.thread_time() - c0
    n -= n0
    if a.result:
        with open(a.result + ".tmp", "w") as f:
            json.dump(
                {
                    "batches": n,
                    "seconds": secs,
                    "batches_per_s": n / secs,
                    "cpu_ns_per_batch": cpu * 1e9 / n,
                    "hook": os.environ.get("DLWATCH_DISABLE") != "1",
                },
                f,
            )
        os.replace(a.result + ".tmp", a.result)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("switch", "sleepy", "fast"), required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-ms", type=float, default=5.0)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--fast-step-ms", type=float, default=5.0, help="switch mode: step while triggered")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--size", type=int, default=1_000_000)
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--trigger", help="switch mode: data-bound while this file exists")
    p.add_argument("--log", help="switch mode: where to log each switch")
    p.add_argument("--ready", help="create this file after the first batch")
    p.add_argument("--result", help="fast mode: write the achieved rate here (JSON)")
    a = p.parse_args()
    if a.mode == "switch" and not a.trigger:
        p.error("--mode switch needs --trigger")

    torch.set_num_threads(1)
    stop = [False]

    def on_signal(signum, frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    {"switch": run_switch, "sleepy": run_sleepy, "fast": run_fast}[a.mode](a, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
