"""The probe's hot paths, in process: every figure they keep, and never harm.

The trainer's patched ``__next__`` and the worker's timed ``fetch`` keep float
seconds (cheaper than int ns on the hot path, issue 16); frames still carry
integer nanoseconds. These pin what each figure means: wait, step, teardown,
epoch start, batches, worker busy, and a fetch or ``__next__`` in progress.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
from torch.utils.data._utils import fetch as F
from torch.utils.data._utils.collate import default_collate

from dlwatch.probe import patches, worker

SAMPLE_S = 0.004
STEP_S = 0.006


class Sleepy(Dataset):
    def __init__(
        self,
        n: int,
        sleep_s: float = SAMPLE_S,
        raise_at: int | None = None,
        gate: threading.Event | None = None,
        gate_at: int | None = None,
    ) -> None:
        self.n, self.sleep_s, self.raise_at = n, sleep_s, raise_at
        self.gate, self.gate_at = gate, gate_at
        self.entered = threading.Event()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if i == self.gate_at:
            self.entered.set()
            self.gate.wait(10)
        if i == self.raise_at:
            raise ValueError(f"corrupt sample {i}")
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return torch.tensor([float(i)])


@pytest.fixture
def hooked():
    """patches installed (no publisher: on_first_iterator stays unset) for one test."""
    was = patches.installed()
    cb = patches.on_first_iterator
    patches.on_first_iterator = None
    patches.install()
    try:
        yield patches
    finally:
        patches.on_first_iterator = cb
        if not was:
            patches.uninstall()


def stats_of(it):
    st = it._dlw_stats
    assert st is not None, "iterator not instrumented"
    return st


def frame_of(it, now_ns: int | None = None) -> dict:
    return stats_of(it).frame(time.perf_counter_ns() if now_ns is None else now_ns)


def test_wait_step_teardown_epoch_start_and_batches(hooked):
    n = 6
    loader = DataLoader(Sleepy(n), batch_size=1, num_workers=0)
    it = iter(loader)
    st = stats_of(it)
    time.sleep(0.02)  # before the first next(): neither wait nor step
    got = 0
    for _ in it:
        got += 1
        time.sleep(STEP_S)
    assert got == n
    fr = frame_of(it)
    assert fr["batches"] == n and fr["epoch"] == 1
    for key in ("wait_ns", "step_ns", "teardown_ns"):
        assert isinstance(fr[key], int), key
    # Every __next__ sleeps SAMPLE_S in the dataset; the loop sleeps STEP_S
    # after each batch, the last one's gap ending in the teardown __next__.
    assert n * SAMPLE_S * 1e9 <= fr["wait_ns"] < n * SAMPLE_S * 1e9 + 0.5e9
    assert n * STEP_S * 1e9 <= fr["step_ns"] < n * STEP_S * 1e9 + 0.5e9
    assert 0 < fr["teardown_ns"] < 0.5e9
    # The first batch came 20 ms + one sample after the iterator was made.
    assert len(fr["epoch_start_ms"]) == 1
    assert 20 + SAMPLE_S * 1e3 <= fr["epoch_start_ms"][0] < 500
    assert len(fr["epoch_ms"]) == 1 and fr["epoch_ms"][0] >= 20 + n * (SAMPLE_S + STEP_S) * 1e3
    # Between epochs nothing runs on: a later frame adds no wait and no step.
    later = frame_of(it, time.perf_counter_ns() + 10**9)
    assert (later["wait_ns"], later["step_ns"]) == (fr["wait_ns"], fr["step_ns"])
    assert st.t_last == 0.0 and st.t_enter == 0.0 and not st.first_pending


class Spinning(Dataset):
    """Samples that keep the loading thread on a CPU for ``cpu_s``."""

    def __init__(self, n: int, cpu_s: float) -> None:
        self.n, self.cpu_s = n, cpu_s

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        end = time.thread_time() + self.cpu_s
        while time.thread_time() < end:
            pass
        return torch.tensor([float(i)])


@pytest.mark.parametrize("cpu_s", [0.0, 0.004])
def test_the_loop_threads_cpu_in_next_is_read_on_one_batch_in_16(hooked, cpu_s):
    """With num_workers=0 the loop's next() is the loading: 4 ms of CPU a
    sample reads about 4 ms, 4 ms of sleep (the wait) reads next to none,
    so the figure is the thread's CPU, not its time in next()."""
    ds = Spinning(40, cpu_s) if cpu_s else Sleepy(40)
    it = iter(DataLoader(ds, batch_size=1, num_workers=0))
    for _ in it:
        pass
    fr = frame_of(it)
    # Batches 8 and 24 of 0..39 (the closing next() at 40 returns no batch).
    assert fr["next_cpu_batches"] == 2
    per_batch_ms = fr["next_cpu_ns"] / 1e6 / fr["next_cpu_batches"]
    if cpu_s:
        assert 0.9 * cpu_s * 1e3 <= per_batch_ms < 3 * cpu_s * 1e3, per_batch_ms
    else:
        assert per_batch_ms < 0.5 * SAMPLE_S * 1e3 and fr["wait_ns"] >= 40 * SAMPLE_S * 1e9, fr


def test_an_epochs_first_batch_is_never_read(hooked):
    # Four 4-batch epochs: the one batch of 16 read (index 8) is the third
    # epoch's first, whose next() waits on a new epoch's start: left out.
    loader = DataLoader(Sleepy(4, sleep_s=0), batch_size=1, num_workers=0)
    seen = []
    for _ in range(4):
        it = iter(loader)
        for _ in it:
            pass
        seen.append(frame_of(it).get("next_cpu_batches"))
    assert stats_of(it).batches == 16 and seen == [None, None, None, None]


def test_a_second_epoch_has_its_own_start_and_the_step_spans_only_batches(hooked):
    loader = DataLoader(Sleepy(3, sleep_s=0), batch_size=1, num_workers=0)
    for _ in loader:
        pass
    time.sleep(0.05)  # between epochs: not the loop's work on batches
    it = iter(loader)
    for _ in it:
        pass
    fr = frame_of(it)
    assert fr["epoch"] == 2 and fr["batches"] == 6
    assert len(fr["epoch_start_ms"]) == 2 and len(fr["epoch_ms"]) == 2
    assert fr["step_ns"] < 0.04e9


def test_time_in_progress_counts_as_wait_inside_next_and_as_step_between(hooked):
    gate = threading.Event()
    ds = Sleepy(4, sleep_s=0, gate=gate, gate_at=2)
    loader = DataLoader(ds, batch_size=1, num_workers=0)
    it = iter(loader)
    next(it)
    next(it)
    st = stats_of(it)
    # Between batches: the live figure grows as step, wait stands still.
    a = st.frame(time.perf_counter_ns())
    b = st.frame(time.perf_counter_ns() + 50_000_000)
    assert b["step_ns"] - a["step_ns"] >= 49_000_000 and b["wait_ns"] == a["wait_ns"]
    t = threading.Thread(target=lambda: next(it))
    t.start()
    try:
        assert ds.entered.wait(10)
        # Inside __next__ (blocked in the dataset): it grows as wait instead.
        a = st.frame(time.perf_counter_ns())
        b = st.frame(time.perf_counter_ns() + 50_000_000)
        assert b["wait_ns"] - a["wait_ns"] >= 49_000_000 and b["step_ns"] == a["step_ns"]
        assert a["batches"] == 2
    finally:
        gate.set()
        t.join(10)
    assert st.frame(time.perf_counter_ns())["batches"] == 3


def test_batches_identical_and_dataset_exception_unchanged(hooked):
    data = TensorDataset(torch.arange(40.0).reshape(20, 2))
    hooked_batches = [b[0].clone() for b in DataLoader(data, batch_size=3, shuffle=False)]
    patches.uninstall()
    try:
        plain = [b[0].clone() for b in DataLoader(data, batch_size=3, shuffle=False)]
    finally:
        patches.install()
    assert len(plain) == len(hooked_batches) == 7
    assert all(torch.equal(x, y) for x, y in zip(plain, hooked_batches))

    it = iter(DataLoader(Sleepy(10, sleep_s=0, raise_at=4), batch_size=1))
    for _ in range(4):
        next(it)
    with pytest.raises(ValueError, match="corrupt sample 4") as info:
        next(it)
    # The dataset's own frame is in the traceback; the probe adds no exception,
    # and no frame that names a dlwatch file (its wrapper reads as torch's).
    assert any(fr.name == "__getitem__" for fr in info.traceback)
    assert not [fr for fr in info.traceback if "dlwatch/probe" in str(fr.path)], info.traceback
    assert info.value.__context__ is None and info.value.__cause__ is None
    st = stats_of(it)
    assert st.t_enter == 0.0, "a raising __next__ is not left 'in progress'"
    assert st.batches == 4
    next(it)  # the loop may go on past a bad sample, as without the hook
    assert st.batches == 5


@pytest.fixture
def fetch_classes(monkeypatch):
    # activate() here runs in the test process, not a worker: no stack
    # watcher, a dlwatch thread that would live on in the test process (and
    # be counted by the never-perturb tests run after this one).
    monkeypatch.setattr(worker, "_start_watch", lambda row, base: None)
    classes = (F._MapDatasetFetcher, F._IterableDatasetFetcher)
    saved = {c: c.__dict__.get("fetch") for c in classes}
    saved_row = worker._row
    try:
        yield classes
    finally:
        for c, f in saved.items():
            c.fetch = f
        worker._row = saved_row


def test_worker_fetch_figures_and_in_progress(fetch_classes):
    slots = worker.make_slots(2)
    worker.activate(slots, 1)
    q, d = worker.as_int64_view(slots), worker.as_float64_view(slots)
    gate = threading.Event()
    ds = Sleepy(8, gate=gate, gate_at=5, raise_at=6)
    fetcher = F._MapDatasetFetcher(ds, True, default_collate, False)
    for i in range(3):
        assert torch.equal(fetcher.fetch([i]), torch.tensor([[float(i)]]))
    w = worker.read_workers(q, d, 2, time.perf_counter_ns())
    assert w[0]["batches"] == 0 and w[0]["fetch_ns"] == 0, "row 0 belongs to another worker"
    assert w[1]["batches"] == 3
    assert w[1]["pid"] > 0 and w[1]["started_ns"] > 0
    # Its CPU when it began work (the monitor averages a young worker from there).
    assert 0 < w[1]["started_cpu_s"] <= time.process_time()
    assert 3 * SAMPLE_S * 1e9 <= w[1]["fetch_ns"] == w[1]["busy_ns"] < 3 * SAMPLE_S * 1e9 + 0.5e9
    for key in ("batches", "fetch_ns", "busy_ns", "started_ns"):
        assert isinstance(w[1][key], int), key

    t = threading.Thread(target=lambda: fetcher.fetch([5]))
    t.start()
    try:
        assert ds.entered.wait(10)
        now = time.perf_counter_ns()
        a = worker.read_workers(q, d, 2, now)[1]
        b = worker.read_workers(q, d, 2, now + 50_000_000)[1]
        assert b["busy_ns"] - a["busy_ns"] >= 49_000_000, "a fetch in progress counts as busy"
        assert a["fetch_ns"] == b["fetch_ns"] == w[1]["fetch_ns"] and a["batches"] == 3
    finally:
        gate.set()
        t.join(10)
    done = worker.read_workers(q, d, 2, time.perf_counter_ns() + 10**9)[1]
    assert done["batches"] == 4 and done["busy_ns"] == done["fetch_ns"], "idle: busy is fetch"

    with pytest.raises(ValueError, match="corrupt sample 6"):
        fetcher.fetch([6])
    after = worker.read_workers(q, d, 2, time.perf_counter_ns() + 10**9)[1]
    assert after["batches"] == 4, "a raising fetch is time spent, not a batch"
    assert after["fetch_ns"] > done["fetch_ns"] and after["busy_ns"] == after["fetch_ns"]


def test_worker_reactivation_wraps_the_originals_once_and_adds_on(fetch_classes):
    orig = F._MapDatasetFetcher.__dict__["fetch"]
    slots = worker.make_slots(1)
    worker.activate(slots, 0)
    fetcher = F._MapDatasetFetcher(Sleepy(4, sleep_s=0), True, default_collate, False)
    fetcher.fetch([0])
    worker.activate(slots, 0)
    patched = F._MapDatasetFetcher.__dict__["fetch"]
    assert patched._dlwatch_orig is orig, "never a wrapper around a wrapper"
    fetcher.fetch([1])
    q = worker.as_int64_view(slots)
    assert q[worker.BATCHES] == 2, "a re-activated worker adds to its row"
    for cls in fetch_classes:
        assert getattr(cls.__dict__["fetch"], "_dlwatch_orig", None) is not None


def test_an_out_of_range_worker_id_patches_nothing(fetch_classes):
    before = {c: c.__dict__["fetch"] for c in fetch_classes}
    worker.activate(worker.make_slots(1), 3)
    assert {c: c.__dict__["fetch"] for c in fetch_classes} == before
