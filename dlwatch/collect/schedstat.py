"""Run-queue wait per process, from /proc/PID/task/*/schedstat.

CPU % alone cannot tell a worker sleeping on storage from a worker starved
of a core: both are "busy" in the fetch but off-CPU. The scheduler knows:
schedstat's second field is the time a thread spent runnable, waiting on a
run queue. Summed over a process's threads and divided by the interval, it
says how many cores' worth of work was waiting for a CPU.
"""

from __future__ import annotations

import os
import time
from typing import Callable, Iterable


def parse_schedstat(text: str) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) from one schedstat line, None if malformed."""
    parts = text.split()
    if len(parts) < 2:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


def read_process(pid: int, proc: str = "/proc") -> tuple[int, int] | None:
    """Summed over the process's threads; None when /proc cannot tell."""
    base = f"{proc}/{pid}/task"
    try:
        tids = os.listdir(base)
    except OSError:
        return None
    run = wait = 0
    seen = False
    for tid in tids:
        try:
            with open(f"{base}/{tid}/schedstat") as f:
                v = parse_schedstat(f.read())
        except OSError:
            continue  # a thread that just exited
        if v is not None:
            run += v[0]
            wait += v[1]
            seen = True
    return (run, wait) if seen else None


class SchedSampler:
    """``sample(pids)`` -> {pid: run-queue wait in % of one core since the last
    sample of that pid} (None on the first sample or when unreadable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = "/proc") -> None:
        self._clock = clock
        self._proc = proc
        self._last: dict[int, tuple[float, int]] = {}

    def sample(self, pids: Iterable[int]) -> dict[int, float | None]:
        now = self._clock()
        out: dict[int, float | None] = {}
        last: dict[int, tuple[float, int]] = {}
        for pid in pids:
            v = read_process(pid, self._proc)
            if v is None:
                out[pid] = None
                continue
            prev = self._last.get(pid)
            last[pid] = (now, v[1])
            if prev is None or now <= prev[0] or v[1] < prev[1]:
                out[pid] = None  # first sight, or a new process behind a reused pid
                continue
            out[pid] = round((v[1] - prev[1]) / 1e9 / (now - prev[0]) * 100.0, 1)
        self._last = last  # forget pids no longer asked about
        return out
