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


def test_a_loader_nothing_holds_is_active_while_the_loop_iterates_it():
    # `for b in DataLoader(...)`: the iterator holds no reference to its
    # loader, which is garbage at once. A QA run read "idle: no iterator now"
    # at a 62 % wait, and no hint ever came.
    import dlwatch.hook  # noqa: F401
    from dlwatch.probe import patches

    patches.registry.clear()
    seen = []
    for i, _ in enumerate(DataLoader(TensorDataset(torch.arange(12.0)), batch_size=2)):
        gc.collect()
        if i == 2:
            now = time.perf_counter_ns()
            seen = [st.frame(now) for st in patches.registry.snapshot()]
    (f,) = seen
    assert f["active"] is True and f["epoch_open"] is True
    gc.collect()
    (st,) = patches.registry.snapshot()
    assert st.frame(time.perf_counter_ns())["active"] is False  # the loop is done with it
