"""What timm's Data meter counts beyond ``DataLoader.__next__`` (dlwatch's data wait).

timm's train.py times from the end of one step to the batch in hand, which
spans its own loader chain around the DataLoader: MultiEpochsDataLoader's
generator and, on a CPU device, PrefetchLoader's ``.to(float).sub_().div_()``
normalisation on the intra-op pool. This builds that chain with timm's
``create_loader`` on a JPEG ImageFolder, runs a ~100 ms CPU step (a matmul on
the intra-op threads) between batches, and prints per batch the time of one
``next()`` of timm's chain and of ``DataLoader.__next__`` inside it.

    python bench/timm_meter_gap.py DATA_DIR --workers 1,2    # needs timm (and torchvision)

DATA_DIR holds ``train/<class>/*.jpg`` (``bench/script_sweep.py`` makes them).
"""

from __future__ import annotations

import argparse
import time

import torch
from timm.data import create_dataset, create_loader
from torch.utils.data import dataloader as dl

STEP_S = 0.1
BATCHES, SKIP = 70, 10


def patch_next(into: list) -> None:
    """Time every DataLoader iterator's ``__next__`` into ``into`` (seconds)."""
    for cls in (dl._SingleProcessDataLoaderIter, dl._MultiProcessingDataLoaderIter):
        orig = cls.__next__

        def timed(self, _orig=orig):
            t = time.perf_counter()
            out = _orig(self)
            into.append(time.perf_counter() - t)
            return out

        cls.__next__ = timed


def measure(data: str, nw: int, inside: list) -> tuple[float, float]:
    ds = create_dataset("", root=data, split="train", is_training=True, batch_size=32)
    cpu = torch.device("cpu")
    kw = {"input_size": (3, 64, 64), "batch_size": 32, "is_training": True, "num_workers": nw, "device": cpu}
    loader = create_loader(ds, **kw)
    inside.clear()
    a = torch.randn(600, 600)
    outer = []
    it = iter(loader)
    for _ in range(BATCHES):
        t = time.perf_counter()
        next(it)
        outer.append(time.perf_counter() - t)
        t = time.perf_counter()
        while time.perf_counter() - t < STEP_S:
            a @ a
    o = outer[SKIP:]
    n = inside[SKIP + 1 : SKIP + 1 + len(o)]  # the prefetcher fetches one batch ahead
    return 1e3 * sum(o) / len(o), 1e3 * sum(n) / len(n)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("data")
    p.add_argument("--workers", default="1,2")
    a = p.parse_args()
    inside: list = []
    patch_next(inside)
    print(f"{'num_workers':>11} {'timm next() ms':>15} {'DataLoader.__next__ ms':>23} {'outside ms':>11}")
    for nw in (int(x) for x in a.workers.split(",")):
        chain, dl_next = measure(a.data, nw, inside)
        print(f"{nw:>11} {chain:>15.2f} {dl_next:>23.2f} {chain - dl_next:>11.2f}")


if __name__ == "__main__":
    main()
