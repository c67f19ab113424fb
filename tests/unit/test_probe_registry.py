"""The probe's loader registry forgets garbage-collected loaders (bounded frames)."""

from __future__ import annotations

import gc
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from dlwatch.probe.stats import DEAD_LOADER_KEEP_NS, Registry


def test_dead_loader_stays_a_while_then_leaves_the_frames():
    reg = Registry()
    keep = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)
    gone = DataLoader(TensorDataset(torch.arange(4.0)), batch_size=2)
    for loader in (keep, gone):
        it = iter(loader)
        reg.for_iterator(it, loader)
        del it
    del gone, loader
    gc.collect()
    now = time.perf_counter_ns()
    for st in reg.snapshot():
        st.frame(now)  # the publisher notices the loader is gone here
    assert [s.id for s in reg.snapshot(now + DEAD_LOADER_KEEP_NS // 2)] == [0, 1]
    assert [s.id for s in reg.snapshot(now + DEAD_LOADER_KEEP_NS + 1)] == [0]
    # A live loader whose iterator ended is not dropped.
    assert [s.id for s in reg.snapshot(now + 10 * DEAD_LOADER_KEEP_NS)] == [0]
