"""Per-process figures for the PIDs the jobs report (trainer main loops, workers).

CPU figures are deltas between successive ``sample()`` calls, so the sampler
keeps state per PID; that state belongs to one process (PID and start time)
so a recycled PID starts afresh instead of producing a nonsense delta against
a dead process. PIDs no longer asked for are forgotten, which bounds memory.

Costs, for a monitor that samples tens of processes every second: the
figures sampled every second (state, CPU times, threads, RSS and the start
time that tells a recycled PID) all come from one read of /proc/PID/stat,
parsed here (``read_stat``): psutil reads stat, status and statm for them,
four times the CPU for the same numbers. psutil still builds the process
once (create time) and reads USS. The main thread's CPU is its own
/proc/PID/task/PID/stat, read only for the processes that want it
(``main_pids``); and USS, whose /proc/PID/smaps_rollup walks the whole
address space (milliseconds of kernel time for a torch process), is read per
process at most every ``uss_interval_s``, each process at its own phase so
that the reads spread out instead of bunching, and within a CPU budget.

dlwatch's own threads inside a process (``own_tids``: the ids the job's
frames list, its publisher, a worker's stack watcher, a burst's sampler) are
left out of its thread count and CPU: the monitor must not measure its own
probe as the job's work (pressing W once made a 1-worker job's worker run
"5 threads" and raised worker-thread-oversubscription). A frame comes after
the thread it lists has started, so the threads are also found by their
kernel names (``own_threads``), looked for when a process's thread count
changes: no extra read while it does not. A thread's memory
cannot be told from its process's; its stack is small and a burst's
sampler keeps at most a few thousand stacks.

Every psutil/OS failure becomes a ``state`` and a readable ``error``; a
vanished or unreadable process must never take the monitor down.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple, TypeVar

import psutil

from dlwatch import autograd_threads, own_threads
from dlwatch.collect.job_end import zombie_reason

T = TypeVar("T")

# Below this age a first-sample lifetime average is too coarse to report.
MIN_LIFETIME_S = 0.5
# A worker whose start of work the job reports (``active_since``) is averaged
# from there, once it has worked this long: /proc counts CPU in 10 ms ticks,
# so the figure is within ±10 points at this age and within ±2 at 0.5 s (the
# diagnosis averages a worker slot's figures over its window). Workers of
# 0.3 s epochs live about 0.25 s: at 0.2 s most were never figured.
MIN_ACTIVE_S = 0.1
# With ``uss_max_interval_s``: a USS that moved less than this since the
# previous read counts as steady and the next read waits twice as long.
USS_STEADY_BYTES = 512 << 10
# Threads of a trainer whose CPU is read one by one (/proc/PID/task/TID/stat).
MAX_THREADS = 64
# A thread seen for the first time this young has no CPU figure: its
# tick-granular lifetime average is noise. Shorter than a process's bar:
# pools restart their threads every epoch (torchdata.nodes), and an epoch of
# a second must still give its threads a figure.
MIN_THREAD_LIFETIME_S = 0.2
# Until one of torch's autograd device threads is found (autograd_threads.py),
# the trainer's task list is searched for it on every this-many-th sample (a
# CPU job never has one; a CUDA job has it from its first backward on).
AUTOGRAD_LOOK_EVERY = 5


@dataclass
class _Tracked:
    proc: psutil.Process
    create_time: float
    start_ticks: int | None = None  # /proc/PID/stat starttime: the process's identity
    cpu_s: float | None = None  # user+system seconds at the previous sample
    main_cpu_s: float | None = None
    # tid -> user+system seconds of each thread at the previous sample
    thread_cpu_s: dict[int, float] = field(default_factory=dict)
    # tid -> user+system seconds of each of dlwatch's own threads at the previous sample
    own_cpu_s: dict[int, float] = field(default_factory=dict)
    # dlwatch's threads found by their kernel name (own_threads.find), and
    # the thread count when they were looked for: looked for again when it changes.
    named_own: frozenset[int] = frozenset()
    named_at_threads: int = -1
    # tid -> user+system seconds of each of torch's autograd device threads at the previous sample
    autograd_cpu_s: dict[int, float] = field(default_factory=dict)
    at: float = 0.0  # monotonic time of the previous sample
    uptime_at: float | None = None  # /proc/uptime at the previous sample
    calls: int = 0
    uss: int | None = None
    uss_failure: _Failed | None = None
    uss_calls: int = 0  # samples that wanted USS (for ``uss_every``)
    uss_due: float | None = None  # monotonic time of the next USS read (``uss_interval_s``)
    uss_gap: float = 0.0  # seconds from this USS read to the next (backs off while steady)


@dataclass(frozen=True)
class UssPolicy:
    """When ``ProcSampler`` reads USS again (its ``uss_*`` arguments)."""

    every: int = 1
    interval_s: float | None = None
    max_interval_s: float | None = None
    cpu_budget: float | None = None

    def __post_init__(self) -> None:
        if self.every < 1:
            raise ValueError("uss_every must be >= 1")
        if self.interval_s is not None and self.interval_s < 0:
            raise ValueError("uss_interval_s must be >= 0")
        if self.cpu_budget is not None and not 0 < self.cpu_budget <= 1:
            raise ValueError("uss_cpu_budget must be a fraction of one core in (0, 1]")


class _Failed(Exception):
    """One field could not be read; carries the readable reason."""

    def __init__(self, reason: str, state: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.state = state  # "gone" / "zombie" when the whole process is affected


def describe_error(pid: int, exc: BaseException, what: str = "") -> _Failed:
    """Turn a psutil/OS exception into a reason a user can act on."""
    where = f"/proc/{pid}{'/' + what if what else ''}"
    if isinstance(exc, psutil.ZombieProcess):
        return _Failed(zombie_reason(pid), "zombie")
    if isinstance(exc, psutil.NoSuchProcess):
        return _Failed(f"process {pid} exited", "gone")
    if isinstance(exc, (psutil.AccessDenied, PermissionError)):
        return _Failed(f"no permission to read {where}")
    if isinstance(exc, FileNotFoundError):
        # /proc/PID disappearing between two reads is the process exiting.
        return _Failed(f"process {pid} exited", "gone")
    if isinstance(exc, OSError):
        return _Failed(f"cannot read {where}: {exc.strerror or exc}")
    return _Failed(f"cannot read {where}: {exc}")


_PSUTIL_ERRORS = (psutil.Error, OSError)


def _call(pid: int, fn: Callable[[], T], what: str = "") -> T:
    try:
        return fn()
    except _PSUTIL_ERRORS as e:
        raise describe_error(pid, e, what) from None


def _working_since(active: tuple[float, float] | None, cpu_s: float | None, now: float) -> bool:
    """Whether ``active`` (CPU seconds, clock) is a usable baseline at
    ``now``: old enough (``MIN_ACTIVE_S``), and not ahead of the process's
    CPU now (a reused PID's, or a baseline from another clock)."""
    if active is None or cpu_s is None:
        return False
    cpu0, t0 = active
    return MIN_ACTIVE_S <= now - t0 < 86400.0 and 0.0 <= cpu0 <= cpu_s + 0.02


def rate_percent(prev_s: float | None, cur_s: float, interval_s: float) -> float | None:
    """CPU % (100 = one core) from two CPU-seconds readings ``interval_s`` apart."""
    if prev_s is None or interval_s <= 0:
        return None
    # CPU time never goes backwards for one process; clamp clock-tick jitter.
    return max(cur_s - prev_s, 0.0) / interval_s * 100.0


def _empty(pid: int, state: str, error: str | None) -> dict[str, Any]:
    return {
        "pid": pid,
        "cpu_percent": None,
        "cpu_interval_s": None,
        "rss_bytes": None,
        "uss_bytes": None,
        "threads": None,
        "own_threads": None,
        "state": state,
        "main_thread_cpu_percent": None,
        "autograd_cpu_percent": None,
        "create_time": None,
        "nice": None,
        "error": error,
    }


class ProcSampler:
    """Samples a changing set of PIDs; CPU % covers the time between calls.

    USS (``/proc/PID/smaps_rollup``) costs far more than the rest together on
    processes with large heaps, so it is read on a process's first sample and
    then again only when due, keeping the last value in between:

    - ``uss_interval_s`` (time based): each process again after that many
      seconds, the first repeat at a phase of its own (from its PID) so that
      many processes' reads are spread over the interval; with
      ``uss_max_interval_s``, a process whose USS stays put (moved less than
      ``USS_STEADY_BYTES`` since the previous read) is read half as often
      each time, up to that interval, and at ``uss_interval_s`` again as soon
      as it moves;
    - ``uss_every`` (count based, when no interval is given): every
      ``uss_every``-th sample of the process.

    - ``uss_cpu_budget`` (with an interval): repeat reads together may use
      at most this fraction of one core. Each read's CPU time is measured;
      until the budget has paid it back no repeat read runs, and then only
      the longest overdue process's. Many large processes are then read
      less often than the interval; a first read is never held back.

    ``sample(..., force_uss=True)`` reads it for every process regardless.

    On the first sample of a process, ``cpu_percent`` is its average since it
    started (as ``ps`` and top's first frame show) rather than an invented 0;
    ``cpu_interval_s`` says what span each figure covers.
    """

    def __init__(
        self,
        uss_every: int = 1,
        clock: Callable[[], float] = time.monotonic,
        uss_interval_s: float | None = None,
        uss_max_interval_s: float | None = None,
        uss_cpu_budget: float | None = None,
        cpu_clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.uss_policy = UssPolicy(uss_every, uss_interval_s, uss_max_interval_s, uss_cpu_budget)
        self._clock = clock
        self._cpu_clock = cpu_clock
        self._uss_free_at = float("-inf")  # budget: no repeat read before this time
        self._tracked: dict[int, _Tracked] = {}

    def tracked_pids(self) -> set[int]:
        return set(self._tracked)

    def sample(
        self,
        pids: Iterable[int],
        main_pids: Iterable[int] | None = None,
        uss_pids: Iterable[int] | None = None,
        force_uss: bool = False,
        thread_pids: Iterable[int] = (),
        own_tids: Mapping[int, Iterable[int]] | None = None,
        active_since: Mapping[int, tuple[float, float]] | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Figures for ``pids``.

        ``main_pids``: the processes whose main-thread CPU is wanted (reading
        the thread list costs a directory walk); None: all of them.
        ``uss_pids``: the processes whose USS is wanted; None: all of them.
        ``thread_pids``: the processes whose every thread's CPU is wanted
        (``thread_cpu``: a pipeline's worker threads); none by default.
        Others get ``None`` for those figures.
        ``own_tids``: per pid, the native ids of dlwatch's threads there,
        left out of ``threads``, ``cpu_percent`` and ``thread_cpu``
        (``own_threads``: how many were).
        ``active_since``: per pid, (its CPU seconds, this sampler's clock)
        when the process began its work (a DataLoader worker's hook ran):
        its first figure averages from there, not from its start (a spawned
        worker's imports are not its work), and a worker as young as
        ``MIN_ACTIVE_S`` gets one.
        """
        threaded = {int(p) for p in thread_pids}
        own = {int(p): frozenset(int(t) for t in ts) for p, ts in (own_tids or {}).items()}
        uptime = _uptime_s()
        wanted = list(dict.fromkeys(int(p) for p in pids))
        mains = None if main_pids is None else {int(p) for p in main_pids}
        ussing = None if uss_pids is None else {int(p) for p in uss_pids}
        granted = self._uss_grant(wanted, ussing)
        out = {
            pid: self._sample_one(
                pid,
                mains is None or pid in mains,
                ussing is None or pid in ussing,
                force_uss,
                pid == granted,
                pid in threaded,
                own.get(pid, frozenset()),
                uptime,
                (active_since or {}).get(pid),
            )
            for pid in wanted
        }
        # Bounded memory: keep state only for PIDs asked for this time and still alive.
        self._tracked = {
            pid: self._tracked[pid] for pid in wanted if pid in self._tracked and out[pid]["state"] != "gone"
        }
        return out

    def named_own(self) -> dict[int, frozenset[int]]:
        """dlwatch's threads per process as their kernel names tell
        (``own_threads``), for the other samplers: as of the last sample."""
        return {pid: st.named_own for pid, st in self._tracked.items() if st.named_own}

    def _budgeted(self) -> bool:
        return self.uss_policy.cpu_budget is not None and self.uss_policy.interval_s is not None

    def _uss_grant(self, wanted: list[int], ussing: set[int] | None) -> int | None:
        """With a CPU budget: the one process whose repeat USS read may run
        in this sample, the longest overdue, once the budget has refilled."""
        if not self._budgeted():
            return None
        now = self._clock()
        if now < self._uss_free_at:
            return None
        due = []
        for pid in wanted:
            st = self._tracked.get(pid)
            if (
                st is not None
                and st.uss_due is not None
                and now >= st.uss_due
                and (ussing is None or pid in ussing)
            ):
                due.append((st.uss_due, pid))
        return min(due)[1] if due else None

    def _track(self, pid: int, stat: ProcStat) -> _Tracked:
        """State for ``pid``, reset when the PID now belongs to another process
        (its start time in /proc/PID/stat, in clock ticks since boot, differs)."""
        old = self._tracked.get(pid)
        if old is not None and old.start_ticks == stat.start_ticks:
            return old
        proc = _call(pid, lambda: psutil.Process(pid))
        ct = _call(pid, proc.create_time, "stat")
        fresh = _Tracked(proc=proc, create_time=ct, start_ticks=stat.start_ticks)
        self._tracked[pid] = fresh
        return fresh

    def _sample_one(
        self,
        pid: int,
        want_main: bool = True,
        want_uss: bool = True,
        force_uss: bool = False,
        uss_granted: bool = False,
        want_threads: bool = False,
        own: frozenset[int] = frozenset(),
        uptime: float | None = None,
        active: tuple[float, float] | None = None,
    ) -> dict[str, Any]:
        if pid <= 0:
            return _empty(pid, "gone", f"invalid pid {pid}")
        try:
            stat = _call(pid, lambda: read_stat(pid), "stat")
            st = self._track(pid, stat)
        except _Failed as f:
            self._tracked.pop(pid, None)
            return _empty(pid, f.state or "unknown", f.reason)

        now = self._clock()
        res = _empty(pid, "unknown", None)
        res["create_time"] = st.create_time
        errors: list[str] = []

        def note(f: _Failed) -> None:
            if f.state == "gone":
                raise f
            if f.state == "zombie":
                res["state"] = "zombie"
            if f.reason not in errors:
                errors.append(f.reason)

        def read(fn: Callable[[], T], what: str = "") -> T | None:
            try:
                return _call(pid, fn, what)
            except _Failed as f:
                note(f)
                return None

        try:
            main_s = read(lambda: read_stat(pid, pid).cpu_s, "task") if want_main else None
            uss = self._uss(st, pid, note, now, force_uss, uss_granted) if want_uss else None
        except _Failed as f:
            self._tracked.pop(pid, None)
            return _empty(pid, f.state or "gone", f.reason)

        if res["state"] != "zombie":
            res["state"] = stat.state
        if res["state"] == "zombie" and not any("zombie" in e for e in errors):
            errors.insert(0, zombie_reason(pid))

        if stat.threads != st.named_at_threads:
            # A thread came or went: one of ours, named so, is left out from
            # this sample on, before the job's frames list it.
            st.named_own, st.named_at_threads = own_threads.find(pid), stat.threads
        own = own | st.named_own
        own_n, own_cpu = self._own(st, pid, own, uptime) if own or st.own_cpu_s else (0, 0.0)
        res["nice"] = stat.nice
        res["threads"] = max(stat.threads - own_n, 1)
        res["own_threads"] = own_n
        res["rss_bytes"] = stat.rss_bytes
        res["uss_bytes"] = uss
        cpu_s = stat.cpu_s
        prev_cpu: float | None
        prev_main: float | None
        if st.calls == 0 and active is not None and _working_since(active, cpu_s, now):
            # First sight of a worker that said when it began its work.
            interval, prev_cpu, prev_main = now - active[1], active[0], None
        elif st.calls == 0:
            # First sight: average since the process started, from a zero baseline.
            interval = process_age_s(st.create_time)
            if interval < MIN_LIFETIME_S:
                # A process this young: its tick-granular lifetime average is noise.
                interval = 0.0
            prev_cpu = 0.0
            prev_main = 0.0
        else:
            interval, prev_cpu, prev_main = now - st.at, st.cpu_s, st.main_cpu_s
        if cpu_s is not None:
            # Our own threads' CPU since the previous sample, out of the delta.
            res["cpu_percent"] = rate_percent(prev_cpu, cpu_s - own_cpu, interval)
        if res["cpu_percent"] is not None:
            res["cpu_interval_s"] = interval
        if main_s is not None:
            res["main_thread_cpu_percent"] = rate_percent(prev_main, main_s, interval)
            res["autograd_cpu_percent"] = self._autograd(st, pid, interval)
        if want_threads:
            tc = self._threads(st, pid, interval, first=st.calls == 0)
            res["thread_cpu"] = {t: v for t, v in tc.items() if t not in own}
        st.cpu_s, st.main_cpu_s = cpu_s, main_s
        st.at, st.uptime_at = now, uptime
        st.calls += 1
        res["error"] = "; ".join(errors) if errors else None
        return res

    def _own(self, st: _Tracked, pid: int, own: frozenset[int], uptime: float | None) -> tuple[int, float]:
        """dlwatch's threads in ``pid`` (``own``): how many are alive, and the
        CPU seconds they used since the previous sample. A thread seen for
        the first time counts all of its CPU if it started since then (or
        on the process's first sample, whose figure is its lifetime's);
        one that is older (its id came late) starts a baseline only. A
        thread that has ended leaves its last seconds in the process's
        figure: at most one interval of a thread that was ours."""
        n, used = 0, 0.0
        seen: dict[int, float] = {}
        for tid in own:
            if tid == pid:
                continue  # the main thread is never ours
            try:
                ts = read_stat(pid, tid)
            except _PSUTIL_ERRORS:
                continue  # ended, or not this process's
            n += 1
            seen[tid] = ts.cpu_s
            prev = st.own_cpu_s.get(tid)
            if prev is not None:
                used += max(ts.cpu_s - prev, 0.0)
            elif st.calls == 0 or (
                uptime is not None
                and st.uptime_at is not None
                and ts.start_ticks / _CLK_TCK >= st.uptime_at - 1.0 / _CLK_TCK
            ):
                used += ts.cpu_s
        st.own_cpu_s = seen
        return n, used

    def _autograd(self, st: _Tracked, pid: int, interval: float) -> float | None:
        """CPU % of torch's autograd device threads (``pt_autograd_N``) since
        the previous sample: on CUDA they run the backward pass while the
        training thread waits, so a host-bound step is the two threads' sum
        (an H100's MLP at batch 1 read its training thread 70 % busy). None
        without such a thread (CPU torch starts none) or on its first sight.
        Looked for on every AUTOGRAD_LOOK_EVERY-th sample until found; once
        found they live as long as the process."""
        if not st.autograd_cpu_s and st.calls % AUTOGRAD_LOOK_EVERY != 0:
            return None
        tids = list(st.autograd_cpu_s) or autograd_threads.find(f"/proc/{pid}/task")
        seen: dict[int, float] = {}
        used, known = 0.0, False
        for tid in tids:
            try:
                ts = read_stat(pid, tid)
            except _PSUTIL_ERRORS:
                continue  # ended: looked for again below
            seen[tid] = ts.cpu_s
            prev = st.autograd_cpu_s.get(tid)
            if prev is not None:
                used += max(ts.cpu_s - prev, 0.0)
                known = True
        st.autograd_cpu_s = seen
        return rate_percent(0.0, used, interval) if known else None

    def _threads(self, st: _Tracked, pid: int, interval: float, first: bool) -> dict[int, float | None]:
        """Each thread's CPU % since the last sample (a pipeline's worker
        threads: nodes' ParallelMapper, Grain's prefetch pool); None on a
        thread's first sight. At most MAX_THREADS threads, unreadable ones
        left out."""
        out: dict[int, float | None] = {}
        seen: dict[int, float] = {}
        try:
            tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task"))[:MAX_THREADS]
        except (OSError, ValueError):
            return out
        uptime = _uptime_s()
        for tid in tids:
            try:
                ts = read_stat(pid, tid)
            except _PSUTIL_ERRORS:
                continue
            seen[tid] = ts.cpu_s
            prev = st.thread_cpu_s.get(tid)
            if not first and prev is not None:
                out[tid] = rate_percent(prev, ts.cpu_s, interval)
                continue
            # First sight (pools restart their threads each epoch): the
            # average over the thread's own life, as for a new process.
            age = uptime - ts.start_ticks / _CLK_TCK if uptime is not None else 0.0
            out[tid] = rate_percent(0.0, ts.cpu_s, age) if age >= MIN_THREAD_LIFETIME_S else None
        st.thread_cpu_s = seen
        return out

    def _uss_due(self, st: _Tracked, pid: int, now: float) -> bool:
        if self.uss_policy.interval_s is None:
            due = st.uss_calls % self.uss_policy.every == 0
            st.uss_calls += 1
            return due
        return st.uss_due is None or now >= st.uss_due

    def _schedule_uss(self, st: _Tracked, pid: int, now: float, prev: int | None) -> None:
        base = self.uss_policy.interval_s
        if base is None:
            return
        if st.uss_due is None:
            # The first repeat comes at this PID's own phase of the interval
            # (at least half of it away), then every interval: processes seen
            # at the same moment (a job's workers) do not read together again.
            st.uss_gap = base
            st.uss_due = now + base * (0.5 + 0.5 * _phase(pid))
            return
        top = self.uss_policy.max_interval_s
        if (
            top is not None
            and top > base
            and prev is not None
            and st.uss is not None
            and abs(st.uss - prev) < USS_STEADY_BYTES
        ):
            st.uss_gap = min(top, max(st.uss_gap, base) * 2)
        else:
            st.uss_gap = base
        # Keep the phase: a late sample does not push every later read.
        st.uss_due = max(st.uss_due + st.uss_gap, now + st.uss_gap / 2)

    def _uss(
        self,
        st: _Tracked,
        pid: int,
        note: Callable[[_Failed], None],
        now: float,
        force: bool = False,
        granted: bool = False,
    ) -> int | None:
        first = st.uss is None and st.uss_failure is None
        due = self._uss_due(st, pid, now)
        if force or first or (due and (granted or not self._budgeted())):
            prev = st.uss
            cpu0 = self._cpu_clock()
            try:
                st.uss = _call(pid, st.proc.memory_full_info, "smaps").uss
                st.uss_failure = None
            except _Failed as f:
                st.uss, st.uss_failure = None, f
            budget = self.uss_policy.cpu_budget
            if budget is not None and self._budgeted():
                # The read's own CPU time, paid back at the budget's rate; a
                # burst of first reads (a job starting) adds at most one
                # interval on top.
                cost = max(0.0, self._cpu_clock() - cpu0) / budget
                self._uss_free_at = min(
                    max(self._uss_free_at, now) + cost, now + max(cost, self.uss_policy.interval_s or 0.0)
                )
            self._schedule_uss(st, pid, now, prev)
        # Between USS reads the last failure still explains the missing figure.
        if st.uss_failure is not None:
            note(st.uss_failure)
        return st.uss


def _phase(pid: int) -> float:
    """A fixed number in [0, 1) per PID, spread evenly for consecutive PIDs
    (the golden-ratio sequence): a job's workers usually have neighbouring PIDs."""
    return (pid * 0.6180339887498949) % 1.0


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")
# /proc/PID/stat state letters, named as psutil names them.
_STATES = {
    "R": psutil.STATUS_RUNNING,
    "S": psutil.STATUS_SLEEPING,
    "D": psutil.STATUS_DISK_SLEEP,
    "T": psutil.STATUS_STOPPED,
    "t": psutil.STATUS_TRACING_STOP,
    "Z": psutil.STATUS_ZOMBIE,
    "X": psutil.STATUS_DEAD,
    "x": psutil.STATUS_DEAD,
    "K": "wake-kill",
    "W": psutil.STATUS_WAKING,
    "I": psutil.STATUS_IDLE,
    "P": psutil.STATUS_PARKED,
}


class ProcStat(NamedTuple):
    state: str
    cpu_s: float  # user + system
    threads: int
    start_ticks: int  # clock ticks since boot: with the PID, the process's identity
    rss_bytes: int
    nice: int = 0  # its CPU time counts as /proc/stat's "nice" when > 0


def read_stat(pid: int, tid: int | None = None, proc_path: str = "/proc") -> ProcStat:
    """/proc/PID/stat (or one thread's /proc/PID/task/TID/stat), parsed.

    Raises OSError when it cannot be read or does not look like a stat line.
    """
    path = f"{proc_path}/{pid}/task/{tid}/stat" if tid is not None else f"{proc_path}/{pid}/stat"
    with open(path, "rb") as f:
        data = f.read()
    try:
        # The command name (field 2) may hold spaces and parentheses: split
        # after the last ")"; what follows starts at field 3.
        fields = data.rsplit(b")", 1)[1].split()
        return ProcStat(
            state=_STATES.get(fields[0].decode("ascii", "replace"), "unknown"),
            cpu_s=(int(fields[11]) + int(fields[12])) / _CLK_TCK,
            threads=int(fields[17]),
            start_ticks=int(fields[19]),
            rss_bytes=int(fields[21]) * _PAGE_SIZE,
            nice=int(fields[16]),
        )
    except (IndexError, ValueError):
        raise OSError(f"unexpected contents of {path}") from None


def _uptime_s(uptime_path: str = "/proc/uptime") -> float | None:
    try:
        with open(uptime_path) as f:
            return float(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_age_s(create_time: float, uptime_path: str = "/proc/uptime") -> float:
    """Seconds since a process started.

    ``time.time() - create_time`` can be off by up to a second, because psutil
    builds create_time on the boot time, which /proc/stat gives in whole
    seconds. Both create_time and the uptime count from the same boot, so
    subtracting on that clock cancels the rounding.
    """
    try:
        with open(uptime_path) as f:
            uptime = float(f.read().split()[0])
        return uptime - (create_time - psutil.boot_time())
    except (OSError, ValueError, IndexError):
        return time.time() - create_time
