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


class _SlowStart:
    """A sampler whose ``iter()`` takes ``seconds``: with ``batch_size=None``
    torch calls it while it makes the epoch's iterator, as it forks workers
    there."""

    def __init__(self, n: int, seconds: float) -> None:
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        time.sleep(self.seconds)
        return iter(range(self.n))


class _GeneratorLoader(DataLoader):
    """A loader whose ``__iter__`` is a generator around torch's, as
    litdata's and Mosaic's StreamingDataLoader and Accelerate's are: the
    epoch's iterator is made inside the loop's first next()."""

    def __iter__(self):
        yield from super().__iter__()


def _loop_waits(it) -> float:
    """Seconds the loop spent inside next() over one epoch."""
    waited = 0.0
    while True:
        t0 = time.perf_counter()
        try:
            next(it)
        except StopIteration:
            return waited
        waited += time.perf_counter() - t0
        time.sleep(0.01)


def test_an_iter_made_inside_the_loops_next_is_the_loops_wait(probe):
    start_s = 0.2
    ds = torch.arange(6.0)
    plain = DataLoader(ds, batch_size=None, sampler=_SlowStart(6, start_s))
    wrapped = _GeneratorLoader(ds, batch_size=None, sampler=_SlowStart(6, start_s))
    it = iter(plain)  # the loop's own iter(): the sampler's 0.2 s is before any next()
    own_plain = _loop_waits(it)
    own_wrapped = _loop_waits(iter(wrapped))  # the 0.2 s is inside the first next()
    st_plain, st_wrapped = _stats(probe, plain), _stats(probe, wrapped)
    assert own_plain < start_s <= own_wrapped
    # dlwatch's wait is the loop's, to the clock reads around each call.
    assert abs(st_plain.wait_s - own_plain) < 0.02, (st_plain.wait_s, own_plain)
    assert abs(st_wrapped.wait_s - own_wrapped) < 0.02, (st_wrapped.wait_s, own_wrapped)
    # The epoch's start (iter() to first batch) is the same for both.
    assert list(st_plain.epoch_start_ms)[0] >= start_s * 1e3
    assert list(st_wrapped.epoch_start_ms)[0] >= start_s * 1e3


class _Gated(torch.utils.data.Dataset):
    """Its first item waits for ``gate``."""

    def __init__(self, n: int, gate) -> None:
        self.n, self.gate = n, gate

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == 0:
            self.gate.wait(10)
        return torch.tensor(float(i))


def test_a_publisher_reading_in_the_first_next_counts_the_iter_before_it(probe):
    # The epoch's iterator took 0.2 s to make, inside the loop's next(); the
    # publisher reads while that next() still waits for its first batch.
    import threading

    gate = threading.Event()
    wrapped = _GeneratorLoader(_Gated(4, gate), batch_size=None, sampler=_SlowStart(4, 0.2))
    it = iter(wrapped)
    got = []
    loop = threading.Thread(target=lambda: got.append(next(it)))
    loop.start()
    try:
        deadline = time.monotonic() + 10
        st = None
        while (st is None or not st.t_enter) and time.monotonic() < deadline:
            st = next((s for s in probe.snapshot() if s.loader_ref() is wrapped), None)
            time.sleep(0.01)
        assert st is not None and st.t_enter
        time.sleep(0.1)
        now = time.perf_counter()
        wait, step, inside = st.counters(now)
        assert inside and step == 0.0, (wait, step, inside)
        assert now - st.t_enter + 0.2 <= wait <= now - st.epoch_t0 + 1e-6, (wait, now - st.epoch_t0)
    finally:
        gate.set()
        loop.join()
    assert got == [torch.tensor(0.0)]
    # Folded into the wait at the first batch, once.
    assert st.iter_t0 == 0.0 and 0.3 <= st.wait_s < 5, st.wait_s


class _PassOn(DataLoader):
    """A subclass whose ``__iter__`` only passes torch's iterator on."""

    def __iter__(self):
        return super().__iter__()


def test_iter_plumbing_is_passed_over_to_the_code_that_asked(probe):
    # Who asked for the iterator decides: the loop itself (outside its
    # next()), or a generator of the user's own that the loop resumes.
    start_s = 0.2
    ds = torch.arange(4.0)
    direct = _PassOn(ds, batch_size=None, sampler=_SlowStart(4, start_s))
    in_gen = _PassOn(ds, batch_size=None, sampler=_SlowStart(4, start_s))

    def batches():
        yield from in_gen

    it = iter(direct)
    own_direct = _loop_waits(it)
    own_in_gen = _loop_waits(batches())
    # A generator expression drained where it is made is iter()'s plumbing.
    drained = _PassOn(ds, batch_size=None, sampler=_SlowStart(4, start_s))
    (it,) = tuple(iter(x) for x in [drained])
    own_drained = _loop_waits(it)
    assert own_direct < start_s <= own_in_gen and own_drained < start_s
    for loader, own in ((direct, own_direct), (in_gen, own_in_gen), (drained, own_drained)):
        st = _stats(probe, loader)
        assert abs(st.wait_s - own) < 0.02, (st.wait_s, own)
