"""A loop that builds a new DataLoader for every pass, for profile tests.

Each pass makes ``DataLoader(...)`` anew (as scripts that re-shard, change
the sampler's seed or rebuild the dataset every epoch do) and steps it for
``--pass-batches`` batches: each pass is a new loader object with new
workers, and only the newest one is stepping. A second loader (an eval)
over another dataset class is stepped from another line every
``--eval-every`` passes, so "the loop's loader" is not any loader that
stepped last. The first batch writes ``--out``.ready.
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401


class Reads(Dataset):
    """Each sample sleeps ``sample_ms`` (storage-like)."""

    def __init__(self, n, sample_ms):
        self.n, self.sample_ms = n, sample_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        time.sleep(self.sample_ms / 1000)
        return torch.full((8,), float(i))


class EvalReads(Reads):
    pass


def _spin(ms):
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--pass-batches", type=int, default=12)
    p.add_argument("--sample-ms", type=float, default=2.0)
    p.add_argument("--step-ms", type=float, default=5.0)
    p.add_argument("--eval-every", type=int, default=0, help="an eval loader every N passes (0: none)")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    t0 = time.monotonic()
    ready = False
    passes = 0
    while time.monotonic() - t0 < a.duration:
        loader = DataLoader(
            Reads(a.pass_batches * a.batch_size, a.sample_ms), batch_size=a.batch_size, num_workers=a.workers
        )
        for _batch in loader:
            _spin(a.step_ms)
            if not ready:
                ready = True
                open(a.out + ".ready", "w").close()
        passes += 1
        if a.eval_every and passes % a.eval_every == 0:
            evals = DataLoader(EvalReads(4 * a.batch_size, a.sample_ms), batch_size=a.batch_size)
            for _batch in evals:
                _spin(a.step_ms / 2)


if __name__ == "__main__":
    main()
