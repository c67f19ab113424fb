"""A loader's counters at the frame's time: ``LoaderStats.counters(now)``
against the loop's own timeline, the state read a little after ``now`` (the
publisher reads its clock, then the counters; on a busy box the loop may
return a batch in between: a recorded window once read 0.504 where the loop's
own clock said 0.525)."""

from __future__ import annotations

import random
import time

import pytest
import torch

from dlwatch.probe.stats import LoaderStats


def timeline(rng: random.Random, n: int = 40) -> list[tuple[float, float]]:
    """Each batch's (enter, return) on the loop's clock: waits and steps of
    1-30 ms, some long (a descheduled loop)."""
    t, out = 1.0, []
    for _ in range(n):
        t0 = t
        t1 = t0 + rng.choice((0.001, 0.005, 0.03))
        out.append((t0, t1))
        t = t1 + rng.choice((0.001, 0.005, 0.03))
    return out


def state_at(batches: list[tuple[float, float]], read: float) -> LoaderStats:
    """The stats as the patched ``__next__`` leaves them at time ``read``."""
    st = LoaderStats(0, None, {"num_workers": 0})
    for t0, t1 in batches:
        if t0 > read:
            break
        st.t_enter = t0
        if t1 > read:
            break
        st.wait_s += t1 - t0
        last, st.t_last = st.t_last, t1
        st.batches += 1
        if last:
            st.step_s += t0 - last
    return st


def truth(batches: list[tuple[float, float]], now: float) -> tuple[float, float, bool]:
    wait = step = 0.0
    inside, prev = False, None
    for t0, t1 in batches:
        if prev is not None:
            step += max(0.0, min(t0, now) - prev)
        if t0 >= now:
            break
        wait += min(t1, now) - t0
        inside = t1 > now
        prev = t1
    return wait, step, inside


def events_between(batches, a: float, b: float) -> int:
    return sum((a < t0 <= b) + (a < t1 <= b) for t0, t1 in batches)


@pytest.mark.parametrize("seed", range(20))
def test_the_counters_are_the_loops_own_at_now_when_the_loop_ran_on_before_they_were_read(seed):
    rng = random.Random(seed)
    batches = timeline(rng)
    checked = 0
    for _ in range(400):
        now = rng.uniform(batches[1][0], batches[-2][1])
        read = now + rng.choice((0.0, 0.0005, 0.004, 0.02, 0.04))
        # Exact while the loop returned at most one batch and entered at most
        # once more after `now` (a 40 ms gap here may hold more: best effort).
        if events_between(batches, now, read) > 2 or (
            events_between(batches, now, read) == 2 and not any(now < t0 < t1 <= read for t0, t1 in batches)
        ):
            continue
        wait, step, inside = state_at(batches, read).counters(now)
        want = truth(batches, now)
        assert (wait, step) == pytest.approx(want[:2], abs=1e-9), (now, read)
        assert inside is want[2]
        checked += 1
    assert checked > 200


class _Raising(torch.utils.data.Dataset):
    """Item 3 waits 0.3 s, then raises (a DataLoader's timeout, a worker's
    error) in a loop that catches it and trains on."""

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int):
        if i == 3:
            time.sleep(0.3)
            raise TimeoutError("no data for 0.3 s")
        return torch.zeros(2)


def test_the_wait_inside_a_next_that_raised_is_the_loops_wait_not_its_step(probe):
    """A QA run: a loop that caught torch's 6 s timeout read 0 % data wait,
    the 6 s as its step."""
    it = iter(torch.utils.data.DataLoader(_Raising(), batch_size=None))
    st = it._dlw_stats
    got = 0
    while got < 7:
        try:
            next(it)
            got += 1
        except TimeoutError:
            pass
    assert st.wait_s >= 0.3 and st.step_s < 0.2, (st.wait_s, st.step_s)
