"""An epoch ends when its iterator is exhausted, replaced or dropped: a loop
that leaves with ``break`` (steps-per-epoch limits) still records its epochs."""

from __future__ import annotations

import gc
import time

import torch
from torch.utils.data import DataLoader, TensorDataset


def _stats(registry, loader):
    return next(s for s in registry.snapshot() if s.loader_ref() is loader)


def _loader() -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(40.0)), batch_size=2)


def test_break_drops_the_iterator_and_ends_the_epoch(probe):
    dl = _loader()
    for _ in range(3):
        for i, _batch in enumerate(dl):
            time.sleep(0.01)
            if i == 3:
                break
    st = _stats(probe, dl)
    f = st.frame(time.perf_counter_ns())
    assert f["epoch_batches"] == [4, 4, 4]
    assert len(f["epoch_ms"]) == 3
    # Four 10 ms steps each; no more than a loaded box adds.
    assert all(35 <= ms < 1000 for ms in f["epoch_ms"]), f["epoch_ms"]
    # The last step of each cut epoch counts as the loop's work: 12 steps.
    assert f["step_ns"] >= 12 * 10e6, f["step_ns"]
    assert f["active"] is False


def test_replacing_a_kept_iterator_ends_the_epoch_at_the_new_iter(probe):
    dl = _loader()
    it = iter(dl)
    next(it)
    next(it)
    time.sleep(0.02)
    kept = it
    it = iter(dl)  # the old one is still referenced: replaced, not dropped
    st = _stats(probe, dl)
    assert list(st.epoch_batches) == [2]
    assert list(st.epoch_ms)[0] >= 20
    del kept
    gc.collect()
    # The old iterator's late death does not end the new epoch.
    assert list(st.epoch_batches) == [2]
    next(it)
    assert st.epoch_t0 != 0


def test_exhausted_epochs_record_their_batches_once(probe):
    dl = _loader()
    for _ in range(2):
        for _batch in dl:
            pass
    gc.collect()
    st = _stats(probe, dl)
    assert list(st.epoch_batches) == [20, 20]
    assert len(st.epoch_ms) == 2


def test_an_iterator_dropped_before_its_first_batch_is_no_epoch(probe):
    dl = _loader()
    it = iter(dl)
    del it
    gc.collect()
    st = _stats(probe, dl)
    assert list(st.epoch_ms) == [] and list(st.epoch_batches) == []
