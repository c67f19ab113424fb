"""Which loader a profile burst follows (control.busiest_loader): a real
publisher's frames, real DataLoaders through the probe's patches."""

from __future__ import annotations

import gc
import json
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

from dlwatch.probe.publisher import BUSY_FRAMES, Publisher


def _loader(n: int = 8) -> DataLoader:
    return DataLoader(TensorDataset(torch.arange(float(n))), batch_size=2)


def test_a_loader_between_two_epochs_is_still_the_one_to_profile(probe, tmp_path):
    pub = Publisher(directory=str(tmp_path))
    dl = _loader()
    pub.build_frame()
    for _ in dl:  # one whole epoch; its iterator is gone once it ends
        pass
    gc.collect()
    pub.build_frame()
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    assert st.iter_ref() is None, "the epoch's iterator should be gone"
    # It stepped within the publisher's last second: a burst asked now (the
    # next epoch's workers starting) is for it, not "nothing to profile".
    assert pub._control.busiest_loader() is st
    # A second of frames later with no batch, it has stopped: nothing to profile.
    for _ in range(BUSY_FRAMES):
        pub.build_frame()
    assert pub._control.busiest_loader() is None


def test_a_live_iterator_comes_before_a_loader_that_finished_its_epoch(probe, tmp_path):
    pub = Publisher(directory=str(tmp_path))
    done, stepping = _loader(16), _loader(16)
    pub.build_frame()
    for _ in done:
        pass
    it = iter(stepping)
    next(it)
    gc.collect()
    pub.build_frame()
    # The finished loader returned 8 batches in that second, the live one 1.
    assert pub._control.busiest_loader() is next(s for s in probe.snapshot() if s.loader_ref() is stepping)


class _Slow(torch.utils.data.Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        time.sleep(0.05)
        return torch.zeros(2)


def test_a_frames_counters_stop_at_the_frames_time(probe, tmp_path, monkeypatch):
    # The loop goes on while the publisher builds a frame. A batch it takes
    # between the frame's clock and the reading of the counters was counted
    # whole, after the time the frame claims (fresh-clone run 26: a recorded
    # window read 0.5025 against the loop's own 0.529). Here the stall check
    # is where the loop takes a 50 ms batch, as another thread would.
    pub = Publisher(directory=str(tmp_path))
    dl = DataLoader(_Slow(), batch_size=1)
    it = iter(dl)
    t_before = time.perf_counter_ns()
    next(it)
    check = pub._stall.check

    def loop_steps_meanwhile(sts, now):
        next(it)
        return check(sts, now)

    monkeypatch.setattr(pub._stall, "check", loop_steps_meanwhile)
    frame = pub.build_frame()
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    (ld,) = [x for x in frame["loaders"] if x["id"] == st.id]
    assert ld["batches"] == 1
    # The counters cover at most the time from before the first batch to the frame's time.
    assert ld["wait_ns"] + ld["step_ns"] <= frame["mono_ns"] - t_before, (ld, frame["mono_ns"] - t_before)


def test_a_stall_that_starts_during_a_gathering_gets_stacks_of_its_own(probe, tmp_path):
    # Fresh-clone run 72: a rank's loader stalled before its first batch,
    # trained on, and hung seconds later while the first stall's stacks were
    # still the job's last; the second stall must get its own, after the first's.
    ctl = Publisher(directory=str(tmp_path))._control
    ctl.on_stall([{"id": 0, "epoch": 0, "batches": 5}])
    ctl.on_stall([{"id": 0, "epoch": 0, "batches": 13}])
    answers: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(answers) < 2 and time.monotonic() < deadline:
        ctl.poll()
        last = ctl._last_stacks
        if last is not None and (not answers or last is not answers[-1]):
            answers.append(last)
        time.sleep(0.01)
    docs = [json.loads(a)["result"] for a in answers]
    assert [(d["reason"], d["loaders"][0]["batches"]) for d in docs] == [("stall", 5), ("stall", 13)]
    ctl.poll()
    assert ctl._stacks is None, "one gathering per stall, none after"
