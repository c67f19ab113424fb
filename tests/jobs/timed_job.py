"""A training loop with known costs that measures itself, for end-to-end tests.

It records, per loader, when each ``next()`` was entered and left (the job's
own ground truth, on the same monotonic clock as the probe's frames), the
worker PIDs per epoch, and optionally a checksum of every batch. The hook is
imported unless DLWATCH_DISABLE=1, exactly as a user would.
"""

import argparse
import hashlib
import json
import os
import time
import traceback

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

import dlwatch.hook  # noqa: F401  (a no-op under DLWATCH_DISABLE=1)

_trace = None


def _log(trace_dir, line):
    global _trace
    if _trace is None:
        _trace = open(os.path.join(trace_dir, f"{os.getpid()}.txt"), "a", buffering=1)
    _trace.write(line + "\n")


def _cost(sample_ms, trace_dir):
    """Spend the sample's cost; with a trace dir, log its span (worker truth)."""
    t0 = time.perf_counter_ns()
    if sample_ms:
        time.sleep(sample_ms / 1000)
    if trace_dir:
        _log(trace_dir, f"{t0} {time.perf_counter_ns()}")


class TracedCollate:
    """torch's default_collate, then the batch's end in the worker's trace.
    A worker's fetch is its samples and their collate, which in a worker
    allocates the batch in shared memory: on a loaded box that alone took
    over a millisecond a batch, and a truth of the samples' spans only read
    busy 0.91-0.93 where the worker never idled (the probe: 0.99)."""

    def __init__(self, trace_dir):
        self.trace_dir = trace_dir

    def __call__(self, samples):
        batch = default_collate(samples)
        _log(self.trace_dir, f"c {time.perf_counter_ns()}")
        return batch


class SleepyMap(Dataset):
    def __init__(self, n, sample_ms, raise_at=-1, trace_dir=None):
        self.n, self.sample_ms, self.raise_at, self.trace_dir = n, sample_ms, raise_at, trace_dir

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.raise_at:
            raise ValueError(f"corrupt sample {i}")
        _cost(self.sample_ms, self.trace_dir)
        g = torch.Generator().manual_seed(i)
        return torch.rand(8, generator=g), i


class SleepyIterable(IterableDataset):
    def __init__(self, n, sample_ms, trace_dir=None):
        self.n, self.sample_ms, self.trace_dir = n, sample_ms, trace_dir

    def __iter__(self):
        info = get_worker_info()
        wid, nw = (info.id, info.num_workers) if info else (0, 1)
        for i in range(wid, self.n, nw):
            _cost(self.sample_ms, self.trace_dir)
            yield torch.full((8,), float(i)), i


def make_loader(a, sample_ms, batch_size, n, trace_dir=None):
    ds = (
        SleepyIterable(n, sample_ms, trace_dir)
        if a.iterable
        else SleepyMap(n, sample_ms, a.raise_at, trace_dir)
    )
    kw = dict(batch_size=batch_size, num_workers=a.workers, shuffle=a.shuffle and not a.iterable)
    if a.workers:
        kw.update(
            multiprocessing_context=a.start_method,
            persistent_workers=a.persistent,
            prefetch_factor=a.prefetch,
        )
    if a.pin_memory:
        kw["pin_memory"] = True
    if trace_dir and a.workers:
        kw["collate_fn"] = TracedCollate(trace_dir)
    if a.shuffle:
        kw["generator"] = torch.Generator().manual_seed(a.seed)
    if a.stateful:
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, **kw)
    return DataLoader(ds, **kw)


_W = None


def _gpu_work():
    global _W
    if _W is None:
        _W = torch.randn(2048, 2048, device="cuda")
    return (_W @ _W).mean()


def run_epoch(loader, rec, a, step_ms, deadline, digest, log=None):
    it = iter(loader)
    pids = [w.pid for w in getattr(it, "_workers", [])]
    rec["worker_pids"].append(pids)
    n = 0
    while True:
        t0 = time.perf_counter_ns()
        try:
            batch = next(it)
        except StopIteration:
            break
        t1 = time.perf_counter_ns()
        rec["batches"].append((rec["epoch"], t0, t1))
        if log is not None:  # the same record, readable while the job runs
            log.write(f"{rec['epoch']} {t0} {t1}\n")
        if deadline[0] is None:
            # The run length counts from the first batch, whatever the start
            # method's startup cost; tests wait for this file to settle.
            deadline[0] = time.monotonic() + a.duration
            open(a.out + ".ready", "w").close()
        if digest is not None:
            data = repr(batch[0].tolist()).encode()
            digest.append(
                hashlib.sha256(data).hexdigest()[:16] + ":" + ",".join(str(int(x)) for x in batch[1])
            )
        if a.cuda:
            x = batch[0].to("cuda", non_blocking=a.pin_memory)
            (x.sum() + _gpu_work()).item()
        if step_ms:
            time.sleep(step_ms / 1000)
        n += 1
        if a.batches_per_epoch and n >= a.batches_per_epoch:
            break
        if time.monotonic() > deadline[0]:
            break
        if a.stop_file and os.path.exists(a.stop_file):
            deadline[0] = 0.0  # the run is over: no later epoch either
            break
    rec["epoch"] += 1
    del it


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--iterable", action="store_true")
    p.add_argument("--stateful", action="store_true")
    p.add_argument("--prefetch", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--sample-ms", type=float, default=5)
    p.add_argument("--step-ms", type=float, default=5)
    p.add_argument("--size", type=int, default=100000)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batches-per-epoch", type=int, default=0)
    p.add_argument("--duration", type=float, default=6.0)
    p.add_argument("--val", action="store_true", help="a second loader (validation) per epoch")
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checksum", action="store_true")
    p.add_argument("--raise-at", type=int, default=-1)
    p.add_argument("--cuda", action="store_true", help="copy batches to the GPU and compute there")
    p.add_argument("--pin-memory", action="store_true")
    p.add_argument("--out", required=True)
    p.add_argument("--trace-dir", help="log every train sample's span per worker PID here")
    p.add_argument("--batch-log", help="append each train batch's (epoch, t0, t1) here as it happens")
    p.add_argument("--stop-file", help="end the run after the batch during which this file appears")
    a = p.parse_args()

    deadline = [None]
    train = make_loader(a, a.sample_ms, a.batch_size, a.size, a.trace_dir)
    val = make_loader(a, a.sample_ms / 2, a.batch_size * 2, a.size) if a.val else None
    recs = {
        "train": {"epoch": 0, "batches": [], "worker_pids": []},
        "val": {"epoch": 0, "batches": [], "worker_pids": []},
    }
    digest = [] if a.checksum else None
    batch_log = open(a.batch_log, "a", buffering=1) if a.batch_log else None
    out = {"pid": os.getpid(), "error": None}
    try:
        for _ in range(a.epochs):
            run_epoch(train, recs["train"], a, a.step_ms, deadline, digest, batch_log)
            if val is not None:
                run_epoch(val, recs["val"], a, a.step_ms / 2, deadline, None)
            if deadline[0] is not None and time.monotonic() > deadline[0]:
                break
    except Exception as e:  # the test compares this with and without the hook
        out["error"] = [type(e).__name__, str(e).splitlines()[-1] if str(e) else ""]
        # What the user reads: the traceback, and a worker's copied into the message.
        told = "".join(traceback.format_exception(e))
        out["traceback"] = {"probe_frames": told.count("dlwatch/probe/"), "frames": told.count('  File "')}
        out["chained"] = [e.__cause__ is not None, e.__context__ is not None]
    out.update(recs=recs, digest=digest)
    with open(a.out + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(a.out + ".tmp", a.out)


if __name__ == "__main__":
    main()
