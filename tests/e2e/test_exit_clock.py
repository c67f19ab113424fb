"""The monitor's exit clock on real processes: each end noted once, in order,
and nothing left open once they are gone."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from dlwatch.collect.exit_clock import ExitClock


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def _fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def _until(cond, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end
        time.sleep(0.01)


def test_ends_are_noted_in_order_and_the_thread_closes_what_it_opened():
    before = _fds()
    a, b, c = _sleeper(), _sleeper(), _sleeper()
    clock = ExitClock()
    try:
        assert clock.watch(a.pid) and clock.watch(b.pid) and clock.watch(c.pid)
        assert clock.watch(a.pid)  # twice is once
        a.kill()
        a.wait()  # reaped by its parent at once: the pidfd saw it end regardless
        _until(lambda: clock.ended_at(a.pid) is not None)
        time.sleep(0.1)
        b.kill()
        _until(lambda: clock.ended_at(b.pid) is not None)
        gap = clock.ended_at(b.pid) - clock.ended_at(a.pid)  # type: ignore[operator]
        assert 0 < gap < 5, gap  # b was killed after a was noted
        assert clock.ended_at(c.pid) is None
        clock.forget(c.pid)  # a live process no longer watched: its pidfd goes
        c.kill()
        time.sleep(0.1)
        assert clock.ended_at(c.pid) is None
        # Nothing left to watch: the thread ends and every descriptor is closed.
        _until(lambda: clock._thread is None)
        b.wait()
        c.wait()
        assert _fds() - before == set()
        clock.forget(a.pid)
        assert clock.ended_at(a.pid) is None
    finally:
        for p in (a, b, c):
            p.kill()
            p.wait()
        clock.stop()


def test_a_process_already_gone_is_not_watched_and_stop_releases_the_rest():
    p = _sleeper()
    p.kill()
    p.wait()
    clock = ExitClock()
    assert clock.watch(p.pid) is False  # its frames are all there is
    before = _fds()
    q = _sleeper()
    try:
        assert clock.watch(q.pid)
        clock.stop()
        _until(lambda: clock._thread is None)
        assert _fds() - before == set()
    finally:
        q.kill()
        q.wait()
