"""Run-queue wait per process, from /proc/PID/task/*/schedstat.

CPU % alone cannot tell a worker sleeping on storage from a worker starved
of a core: both are "busy" in the fetch but off-CPU. The scheduler knows:
schedstat's second field is the time a thread spent runnable, waiting on a
run queue. Summed over a process's threads and divided by the interval, it
says how many cores' worth of work was waiting for a CPU. dlwatch's own
threads in the process (the ids its frames list: a worker's stack watcher,
a burst's sampler) are left out of the sum: the monitor must not count its
own probe's waits as the job's.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping


def parse_schedstat(text: str) -> tuple[int, int] | None:
    """(on-CPU ns, run-queue wait ns) from one schedstat line, None if malformed."""
    parts = text.split()
    if len(parts) < 2:
        return None
    try:
        return int(parts[0]), int(parts[1])
    except ValueError:
        return None


def read_process(pid: int, proc: str = "/proc", tids: list[str] | None = None) -> tuple[int, int] | None:
    """Summed over the process's threads (``tids``, else its whole task
    list); None when /proc cannot tell."""
    base = f"{proc}/{pid}/task"
    if tids is None:
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


# A worker's threads rarely change: list them again after this long (or when
# one has gone), not on every sample.
TIDS_EVERY_S = 5.0


# A first sight's lifetime average needs this much life (the age is
# tick-granular, 10 ms): procs.MIN_ACTIVE_S's reason.
YOUNG_MIN_S = 0.1


class SchedSampler:
    """``sample(pids)`` -> {pid: run-queue wait in % of one core since the last
    sample of that pid} (None on the first sample or when unreadable)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, proc: str = "/proc") -> None:
        self._clock = clock
        self._proc = proc
        self._last: dict[int, tuple[float, int]] = {}
        self._tids: dict[int, tuple[float, list[str]]] = {}
        self._summed: dict[int, list[str]] = {}  # the thread ids each pid's last sum covered

    def _threads(self, pid: int, now: float) -> list[str] | None:
        """The process's thread ids, listed again every TIDS_EVERY_S."""
        cached = self._tids.get(pid)
        if cached is not None and now - cached[0] < TIDS_EVERY_S:
            return cached[1]
        try:
            tids = sorted(os.listdir(f"{self._proc}/{pid}/task"))
        except OSError:
            return None
        self._tids[pid] = (now, tids)
        return tids

    def sample(
        self,
        pids: Iterable[int],
        own_tids: Mapping[int, Iterable[int]] | None = None,
        young: Mapping[int, float] | None = None,
    ) -> dict[int, float | None]:
        """``own_tids``: per pid, the threads dlwatch runs there, left out.
        ``young``: per pid, its age in seconds, for a process whose first
        sight should give its lifetime wait rather than None (a DataLoader
        worker that may not live to a second sample: a forked process's wait
        counters start at zero)."""
        now = self._clock()
        out: dict[int, float | None] = {}
        last: dict[int, tuple[float, int]] = {}
        summed: dict[int, list[str]] = {}
        for pid in pids:
            tids = self._threads(pid, now)
            if tids is not None and own_tids and own_tids.get(pid):
                own = {str(t) for t in own_tids[pid]}
                tids = [t for t in tids if t not in own]
            old = self._summed.get(pid)
            changed = old is not None and old != tids
            if tids is not None:
                summed[pid] = tids
            v = read_process(pid, self._proc, tids) if tids is not None else None
            if v is None:
                self._tids.pop(pid, None)
                out[pid] = None
                continue
            prev = self._last.get(pid)
            age = (young or {}).get(pid) if prev is None else None
            if age is not None and age < YOUNG_MIN_S:
                # Too young for a lifetime figure: no baseline either, so
                # that its next sight is a first one with a usable age.
                out[pid] = None
                continue
            last[pid] = (now, v[1])
            if prev is None or changed or now <= prev[0] or v[1] < prev[1]:
                # First sight, a new process behind a reused pid, or other
                # threads in the sum (a new one would bring its whole past
                # wait into one interval): start a new baseline.
                if prev is not None and v[1] < prev[1]:
                    self._tids.pop(pid, None)  # a thread has gone: list them again
                ok = age is not None and age < 86400.0
                out[pid] = round(v[1] / 1e9 / age * 100.0, 1) if ok else None  # type: ignore[operator]
                continue
            out[pid] = round((v[1] - prev[1]) / 1e9 / (now - prev[0]) * 100.0, 1)
        self._last = last  # forget pids no longer asked about
        self._summed = summed
        self._tids = {p: t for p, t in self._tids.items() if p in last}
        return out


def add_runqueue(procs: dict, waits: dict) -> dict:
    """Each process's figures with its run-queue wait (``runqueue_percent``)."""
    for pid, v in waits.items():
        if pid in procs and isinstance(procs[pid], dict):
            procs[pid] = dict(procs[pid], runqueue_percent=v)
    return procs
