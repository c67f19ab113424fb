"""A training loop for the autotune tests: epochs of a shuffled map-style
dataset, a digest of every batch in the order the loop received them, and each
epoch's duration. Prints one JSON line at the end.

    python autotune_job.py --kind io --epochs 12 [--workers 1] [--persistent]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

if os.environ.get("AUTOTUNE_JOB_HOOK"):
    import dlwatch.hook  # noqa: F401


class Sleepy(Dataset):
    """Storage-like: each sample sleeps ``ms`` milliseconds."""

    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.ms / 1000)
        return {"x": torch.full((4,), float(i)), "i": i}


class Crunchy(Sleepy):
    """CPU-bound: each sample spins ``ms`` milliseconds of Python."""

    def __getitem__(self, i: int):
        end = time.thread_time() + self.ms / 1000
        while time.thread_time() < end:
            pass
        return {"x": torch.full((4,), float(i)), "i": i}


class Raises(Sleepy):
    """Sample 37 is corrupt from epoch ``raise_from`` on (the loop sets
    ``epoch`` before each; non-persistent workers get a fresh copy)."""

    epoch = 0
    raise_from = 0

    def __getitem__(self, i: int):
        if i == 37 and self.epoch >= self.raise_from:
            raise ValueError(f"sample {i} is corrupt")
        return super().__getitem__(i)


class Stream(IterableDataset):
    def __init__(self, n: int, ms: float) -> None:
        self.n, self.ms = n, ms

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        k, m = (info.id, info.num_workers) if info else (0, 1)
        for i in range(k, self.n, m):
            time.sleep(self.ms / 1000)
            yield {"x": torch.full((4,), float(i)), "i": i}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["io", "cpu", "raises", "iterable"], default="io")
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--batches", type=int, default=100, help="batches per epoch")
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--sample-ms", type=float, default=10.0)
    ap.add_argument("--step-ms", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--persistent", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--raise-from-epoch", type=int, default=0)
    a = ap.parse_args()
    torch.manual_seed(a.seed)
    n = a.batches * a.batch_size
    ds = {"io": Sleepy, "cpu": Crunchy, "raises": Raises, "iterable": Stream}[a.kind](n, a.sample_ms)
    ds.raise_from = a.raise_from_epoch
    kw = {"persistent_workers": a.persistent} if a.workers else {}
    shuffle = a.kind != "iterable"
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=shuffle, num_workers=a.workers, **kw)
    digest = hashlib.sha256()
    epochs = []
    workers_seen = []
    for e in range(a.epochs):
        ds.epoch = e
        t0 = time.perf_counter()
        for k, batch in enumerate(loader):
            if k == 0:
                workers_seen.append(loader.num_workers)
                print(f"epoch {e} num_workers {loader.num_workers}", flush=True)
            digest.update(batch["x"].numpy().tobytes())
            end = time.perf_counter() + a.step_ms / 1000
            while time.perf_counter() < end:
                pass
        epochs.append(time.perf_counter() - t0)
    out = {"digest": digest.hexdigest(), "epoch_s": epochs, "num_workers": loader.num_workers}
    print(json.dumps(dict(out, workers_seen=workers_seen)))


if __name__ == "__main__":
    main()
