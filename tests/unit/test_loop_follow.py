"""A loop that builds a new DataLoader every pass: which loader a burst is
for (control.busiest_loader with loop_follow), and the profiler burst moving
from one pass's loader to the next. Real DataLoaders through the probe's
patches, a real publisher's frames, torch's profiler."""

from __future__ import annotations

import gc
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dlwatch.probe import loop_follow, profiler
from dlwatch.probe.publisher import Publisher


class Other(Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return torch.zeros(2)


def _pass_loader(n: int = 16) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=2)


def _stats(probe, loader):
    return next(s for s in probe.snapshot() if s.loader_ref() is loader)


def test_the_newest_loader_of_the_loop_is_the_one_to_profile(probe, tmp_path):
    pub = Publisher(directory=str(tmp_path))
    pub.build_frame()
    old = _pass_loader()
    for _ in old:  # a whole pass: 8 batches in the publisher's last second
        pass
    new = _pass_loader()
    it = iter(new)
    next(it)  # the next pass's loader: one batch so far
    evals = DataLoader(Other(), batch_size=2)
    for _ in evals:  # another shape: an eval, not the loop's next pass
        pass
    gc.collect()
    pub.build_frame()
    assert pub._control.busiest_loader() is _stats(probe, new)
    assert loop_follow.successor(_stats(probe, old), _stats(probe, new))
    assert not loop_follow.successor(_stats(probe, new), _stats(probe, old))  # never back
    assert not loop_follow.successor(_stats(probe, old), _stats(probe, evals))


def test_a_loader_mid_epoch_stays_the_one_beside_a_newer_eval_of_its_shape(probe, tmp_path):
    # The training loader is one object, an eval DataLoader over the same
    # dataset class is made each epoch: mid-epoch, the training one is the loop's.
    pub = Publisher(directory=str(tmp_path))
    pub.build_frame()
    train = _pass_loader()
    it = iter(train)
    for _ in range(3):
        next(it)
    evals = _pass_loader(4)
    for _ in evals:
        pass
    pub.build_frame()
    assert pub._control.busiest_loader() is _stats(probe, train)
    assert not loop_follow.finished(_stats(probe, train)) and loop_follow.finished(_stats(probe, evals))


def test_a_request_during_an_eval_is_for_the_training_loop(probe, tmp_path):
    # Two passes of the loop (a new DataLoader each), then an eval over
    # another dataset, mid-way, its iterator live: the loop is the training
    # shape, and its newest loader (finished: the burst waits for the next).
    pub = Publisher(directory=str(tmp_path))
    pub.build_frame()
    passes = [_pass_loader(), _pass_loader()]
    for dl in passes:
        for _ in dl:
            pass
    evals = DataLoader(Other(), batch_size=2)
    it = iter(evals)
    next(it)
    gc.collect()
    pub.build_frame()
    assert pub._control.busiest_loader() is _stats(probe, passes[-1])


def test_a_burst_follows_the_loop_into_its_next_passes_loaders_and_not_an_eval(probe, tmp_path):
    first = _pass_loader()
    for _ in first:
        pass
    st = _stats(probe, first)
    burst, why = profiler.start(st, 12, 30.0, str(tmp_path), None, {"id": st.id, "name": "loader"})
    assert burst is not None, why
    try:
        # Until the burst is done: its plain windows before and after the
        # profiled steps last a second each (8 batches a pass, 5 ms a step).
        train, evals, eval_ids = [], [], set()
        for _pass in range(200):
            if burst.state == profiler.DONE:
                break
            train.append(_pass_loader())
            for _ in train[-1]:  # the same line steps each pass's new loader
                time.sleep(0.005)
            # An eval of the same shape (a TensorDataset too), newer than
            # the pass's loader, stepped from another line: not the loop's.
            evals.append(_pass_loader(4))
            for _ in evals[-1]:
                pass
            eval_ids.add(_stats(probe, evals[-1]).id)
        assert burst.state == profiler.DONE and burst.error is None, burst.error
        assert burst.steps_done == 12 and burst.loaders >= 3 and burst.target is not st
        assert burst.target.loader_ref() in train
        # The evals stepped during the burst were seen and left alone.
        assert len(burst._not_loop & eval_ids) >= burst.loaders - 2 >= 1
        assert burst.result["loaders_followed"] == burst.loaders
        assert burst.before.steps > 0 and burst.after.steps > 0
    finally:
        burst.cancel()
        profiler.release(burst)
