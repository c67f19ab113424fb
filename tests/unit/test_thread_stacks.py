"""What a stuck fetch was on, read from inside the process
(probe/thread_stacks.py): a new user's stall named the frame of a dataset
that hung at one sample, not the sample."""

from __future__ import annotations

import sys
import threading

import torch
from torch.utils.data import DataLoader, Dataset

from dlwatch.diagnose import hang
from dlwatch.probe import thread_stacks


class Stuck(Dataset):
    def __init__(self, at: int, gate: threading.Event, inside: threading.Event):
        self.at, self.gate, self.inside = at, gate, inside

    def __len__(self):
        return 100

    def __getitem__(self, i):
        if i == self.at:
            self.inside.set()
            self.gate.wait(30)
        return torch.zeros(2)


def _stuck_thread(at: int = 37, batch_size: int = 8, shuffle: bool = False):
    gate, inside = threading.Event(), threading.Event()
    g = torch.Generator().manual_seed(0)
    loader = DataLoader(
        Stuck(at, gate, inside), batch_size=batch_size, num_workers=0, shuffle=shuffle, generator=g
    )
    t = threading.Thread(target=lambda: list(loader), name="loads", daemon=True)
    t.start()
    assert inside.wait(30)
    return t, gate


def _thread(name: str) -> dict:
    (th,) = [t for t in thread_stacks.capture() if t["name"] == name]
    return th


def test_a_fetch_stuck_at_one_sample_is_read_with_its_batch():
    t, gate = _stuck_thread()
    try:
        th = _thread("loads")
    finally:
        gate.set()
        t.join(30)
    assert th["item"] == {"index": 37, "batch": [32, 39, 8], "batch_contiguous": True}, th.get("item")
    line = hang.thread_line(th)
    assert "(from Stuck.__getitem__, test_thread_stacks.py:" in line, line
    assert line.endswith("), at sample 37 of a batch of 8 (indices 32…39)"), line


def test_under_a_tracer_no_frames_locals_are_read():
    # CPython before 3.13 writes a traced frame's locals back from the dict a
    # read fills: a debugger's or coverage's job is left alone.
    t, gate = _stuck_thread()
    old = sys.gettrace()
    threading.settrace(lambda *a: None)
    try:
        th = _thread("loads")
    finally:
        threading.settrace(None)  # type: ignore[arg-type]
        sys.settrace(old)
        gate.set()
        t.join(30)
    assert "item" not in th and th["frames"], th


def test_a_shuffled_batch_is_not_read_as_a_range():
    # Lightning's shuffled train loader read "at sample 4163 of a batch of 16
    # (indices 426…2109)", a range without its own sample.
    t, gate = _stuck_thread(shuffle=True)
    try:
        th = _thread("loads")
    finally:
        gate.set()
        t.join(30)
    assert th["item"]["index"] == 37 and th["item"]["batch_contiguous"] is False, th["item"]
    assert "(shuffled indices, the first " in hang.thread_line(th)
    item = {"index": 4163, "batch": [426, 2109, 16], "batch_contiguous": False}
    assert hang.item_text(item) == "at sample 4163 of a batch of 16 (shuffled indices, the first 426)"
    assert (
        hang.item_text({"batch": [32, 39, 8], "batch_contiguous": True}) == "at a batch of 8 (indices 32…39)"
    )
