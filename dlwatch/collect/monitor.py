"""The collector's scheduler: when to read jobs' sockets and sample processes,
host and GPUs, and when to build the snapshot.

``Monitor`` owns all I/O (sockets, /proc, psutil, NVML); ``model.py`` turns
what it holds into the snapshot document (``dlwatch.snapshot``). Views never
call into it from their event loop except ``latest()``, which returns a
prebuilt snapshot. Its public API:

- ``start()`` / ``stop()`` / ``subscribe(callback)`` / ``latest()``: the
  background collector a live consumer (the TUI, ``record``, ``export``) runs;
- ``sample_now(window_s)``: one settled measurement (``ls``);
- ``judge_now(window_s)``: that measurement, then one a second until the
  hints are judged as the live view judges them (``dlwatch snapshot``,
  ``take_snapshot``);
- ``dismiss(pid)``: forget an exited job.

A sampler that raises never stops the collector: the fault is counted per
sampler (``error_counts``), kept in ``errors`` (the newest 20) and shown in the
snapshot's ``errors`` list, and logged on the ``dlwatch.collect`` logger. A
sampler that cannot even be made is listed in every snapshot's ``errors``; a
diagnosis that cannot be made or that raises sets the snapshot's
``hints_error``, so that no hints never reads as "nothing to fix".
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Literal, TypeVar, cast

from dlwatch import rundir
from dlwatch.collect import model
from dlwatch.collect.exit_clock import ExitClock
from dlwatch.collect.hang import COMPLETE_BOUND_S, StacksCompleter
from dlwatch.collect.jobs import ONE_SHOT_EVERY, JobConnection, discover, pid_alive
from dlwatch.collect.samplers import GpuSource, HintSource, HostSource, ProcSource
from dlwatch.collect.schedstat import SchedSampler, add_runqueue
from dlwatch.diagnose.facts import window_util
from dlwatch.snapshot import SCHEMA_VERSION, Hint, Snapshot

__all__ = ["Monitor", "take_snapshot", "SCHEMA_VERSION", "DEFAULT_WINDOW_S"]

log = logging.getLogger("dlwatch.collect")
DEFAULT_WINDOW_S = 3.0
DIAGNOSE_WINDOW_S = 3.0
# The runtime directory is listed this often for new jobs: a job shows about
# this long after its socket appears (listing it and a kill(pid, 0) per socket
# cost microseconds). At 1 s a new job waited 0.3-1.0 s to be seen, and every
# judgement of it (warm-up and hold) started that much later.
RESCAN_S = 0.25
# A job that refused a connection (not yet listening, another user's) is
# tried again this often: a connect may block up to CONNECT_TIMEOUT_S.
RETRY_S = 1.0
# A connected job that has not said hello after this long is shown as such.
HELLO_GRACE_S = 2.0
# How long a build waits for a new job's hello and history (Monitor.catch_up):
# a QA run's --follow, beside a job and another keeping 2 cores busy, got a
# history's first frames, 17 s old, as its first document; the rest came
# within the next second.
CATCH_UP_S = 2.0
GPU_EVERY_S = 1.0
HISTORY_POINTS = model.HISTORY_POINTS
# Why a one-shot snapshot's workers have no USS. /proc/PID/smaps_rollup walks
# the process's page tables under its memory-map lock: ~10 ms of CPU per GiB
# of RSS here (1.2 GiB: 10-12 ms), so 8 workers of 2-4 GiB cost a one-shot
# snapshot 0.2-0.4 s and stall the job's page faults meanwhile. The live view
# spreads its reads over seconds (USS_INTERVAL_S); a snapshot reads none.
USS_SKIPPED = (
    "not read by a one-shot snapshot (`dlwatch snapshot --uss` reads it: ~10 ms of CPU per GiB of RSS)"
)
# The live loop builds twice a second; the host figures and the diagnosis
# (whose hold times are seconds) are refreshed once a second.
HOST_EVERY_S = 1.0
DIAGNOSE_EVERY_S = 1.0
# The live view samples its processes at most this often (the display may
# refresh faster: the figures stay from the last sample). A new PID is sampled
# at once.
PROC_EVERY_S = 1.0
# Run-queue wait (/proc/PID/task/*/schedstat, a file per thread) of workers
# and trainers only feeds the diagnosis, which judges 3 s windows: sampled
# every 2 s.
SCHED_EVERY_S = 2.0
# A worker younger than this without a run-queue figure yet is read again at
# the next snapshot, not 2 s later: it may be gone by then.
YOUNG_RETRY_S = 2.0
# USS reads /proc/PID/smaps_rollup: milliseconds of kernel time per torch
# process, so each worker's is read every 10 s, the workers at phases spread
# over the interval. The worker-memory-growth rule takes a USS sample every
# 2 s and wants >= 10 of them over >= 60 s: with a fresh reading every 10 s a
# steady leak still fits a line with R^2 >= 0.97 (its bar is 0.80).
USS_INTERVAL_S = 10.0
# A worker whose USS holds still (< 0.5 MiB between reads) is read every 20,
# then 30 s, and every 10 s again once it moves. The slowest growth the rule
# reports (32 MiB within its 300 s window, 1.1 MiB per 10 s) always moves
# that much, so a leak keeps the 10 s cadence; it is noticed at most 30 s late.
USS_MAX_INTERVAL_S = 30.0
# And all of those repeat reads together spend at most 0.2 % of one core:
# a small torch worker's smaps_rollup costs ~3.5 ms here (a worker holding a
# few hundred MiB, ~10 ms), so 8 small workers keep the 10-20 s pace and 32
# are each read about once a minute. The rule still fits a steady leak (a
# staircase of 5 steps over its 300 s window has R^2 ~0.96, its bar is 0.8);
# with many large workers it speaks later. (At 0.1 % the memory-growth
# scenario's two 450 MiB workers were read too rarely to be judged in time.)
USS_CPU_BUDGET = 0.002
# A one-shot snapshot judges its hints as the live view does (the stateful
# diagnosis: a condition shows after it held engine.HOLD_ON_S = 3 s, CPU
# figures averaged over the loader's window, held states), fed one snapshot
# a second like the live loop. It watches until no loader is "judging" any
# more, at most this long after its first measurement: a loader whose window
# still holds its epoch's start-up waits out its grace (engine.WARMUP_STEADY_S,
# 3 s), then the 3 s hold, and a second for the builds' own time; a steady
# job's hints take the hold alone (about 3.6 s). A loader still warming up
# then is listed as judging, with the seconds the one-shot watched
# (``judged_s``). Issue
# 43: the stateless judgement of one 0.6 s sample (no hold, CPU figures of
# that sample alone, among them "other processes" that include the
# snapshot's own start-up) printed workers-oversubscribe-cores beside a
# live view (and a recording) that held none.
JUDGE_S = 7.0
# Exited jobs stay on screen with their last figures until dismissed, but a
# box that runs thousands of short jobs must not grow the model without bound.
MAX_EXITED = 32

_T = TypeVar("_T")
_R = TypeVar("_R")


class Monitor:
    def __init__(
        self,
        directory: str | None = None,
        window_s: float = DEFAULT_WINDOW_S,
        interval: float = 0.5,
        gpu: GpuSource | Literal[False] | None = None,
        procs: ProcSource | Literal[False] | None = None,
        host: HostSource | Literal[False] | None = None,
        diagnoser: HintSource | Literal[False] | None = None,
        only_pid: int | None = None,
        clock: Callable[[], float] = time.time,
        attach: Iterable[int] = (),
        uss: bool = True,
        frame_every: int = 1,
    ) -> None:
        self.directory = directory or rundir.runtime_dir()
        # Read workers' USS (/proc/PID/smaps_rollup)? A one-shot snapshot
        # does not: see USS_SKIPPED.
        self.uss = uss
        self.frame_every = frame_every  # each job sends every Nth frame (jobs.FRAME_EVERY)
        self.window_s = window_s
        # Hints are judged on a steadier window than the live figures: the
        # view wants a change on screen within a second, a diagnosis wants a
        # few seconds of evidence (the rules were tuned and tested on 3 s).
        self.diagnose_window_s = DIAGNOSE_WINDOW_S
        self.interval = interval
        self.only_pid = only_pid
        self.clock = clock
        self.conns: dict[int, JobConnection] = {}
        self.dir_error: str | None = None
        self._sel = selectors.DefaultSelector()
        self._last_scan = 0.0
        self.errors: deque[str] = deque(maxlen=20)
        self.error_counts: dict[str, int] = {}
        # What could not be made, "what: ExcType: message": in every snapshot.
        self.broken: dict[str, str] = {}
        # None: the real sampler; False: none at all (``dlwatch ls`` needs no figures).
        self._gpu = self._pick("gpu", gpu, partial(_default_gpu, window_s))
        self._procs = self._pick("processes", procs, _default_procs)
        # Run-queue wait of workers: CPU-starved vs off-CPU (sleeping on I/O).
        self._sched = SchedSampler() if self._procs is not None else None
        self._host = self._pick("host", host, _default_host)
        self._diagnoser = self._pick("diagnosis", diagnoser, _default_diagnoser)
        self._gpu_state: tuple[str, list] = ("n/a: not sampled yet", [])
        # GPU index (None: a device without one) -> its recent figures
        self._gpu_hist: dict[int | None, deque[float | None]] = {}
        self._gpu_mem_hist: dict[int | None, deque[float | None]] = {}
        self._last_gpu = 0.0
        self._proc_cache: dict[int, dict] = {}
        self._proc_cache_at: float | None = None
        self._latest: dict[str, Any] | None = None
        self._host_cache: dict = {}
        self._host_at: float | None = None
        self._hints: list = []
        self._hints_at: float | None = None
        self._hints_error: str | None = None
        self._judging: list = []
        self._judged_loaders: set[tuple[Any, Any]] = set()
        self._sched_cache: dict[int, float | None] = {}
        self._sched_at: float | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._listeners: list[Callable[[], None]] = []
        # When each job's process ended, to the millisecond (the order a run's ranks ended in).
        self._exits = ExitClock()
        # A stall's stacks, completed from outside (py-spy, /proc) off this thread.
        self._stacks = StacksCompleter()
        # Jobs started without the hook, sampled from outside (attach.py).
        self.attached: dict[int, Any] = {}
        if attach:
            from dlwatch.collect.attach import LiveAttach

            self.attached = {pid: LiveAttach(pid) for pid in attach}

    def _pick(self, what: str, given: _T | Literal[False] | None, default: Callable[[], _T]) -> _T | None:
        """``given``, or the real sampler when None, or none when False. A real
        one that cannot be made (a missing or broken dependency) is recorded in
        ``broken``: its figures are missing for a reason the user can read."""
        if given is False:
            return None
        if given is not None:
            return given
        try:
            return default()
        except Exception as e:
            self.broken[what] = f"{what} could not start: {type(e).__name__}: {e}"
            self.error_counts[what] = self.error_counts.get(what, 0) + 1
            log.debug("%s could not start", what, exc_info=e)
            return None

    def _safe(self, what: str, fn: Callable[[], _R], default: _R) -> _R:
        """``fn()``, or ``default`` when it raises: a sampler's fault costs its
        figures (n/a), never the collector; the fault is counted and kept."""
        try:
            return fn()
        except Exception as e:
            self._fault(what, e)
            return default

    def _fault(self, what: str, e: BaseException) -> None:
        self.error_counts[what] = self.error_counts.get(what, 0) + 1
        self.errors.append(f"{what}: {type(e).__name__}: {e}")
        log.debug("%s failed", what, exc_info=e)

    # --- discovery and reading ----------------------------------------------------

    def scan(self) -> None:
        self._last_scan = time.monotonic()
        try:
            rundir.check_dir(self.directory)
        except rundir.RuntimeDirError as e:
            # A missing directory just means no job has run yet, unless it
            # cannot be created either: then no job ever will publish there.
            missing = not os.path.lexists(self.directory)
            self.dir_error = rundir.creatable_problem(self.directory) if missing else str(e)
            return
        self.dir_error = None
        for pid, path in discover(self.directory):
            if self.only_pid is not None and pid != self.only_pid:
                continue
            c = self.conns.get(pid)
            if c is None:
                c = JobConnection(pid, path, every=self.frame_every, exits=self._exits)
                self.conns[pid] = c
                self._exits.watch(pid)
            due = c.state == "connecting" or (
                c.state == "unreachable" and self._last_scan - c.tried_at >= RETRY_S
            )
            if c.sock is None and due:
                c.tried_at = self._last_scan
                if c.connect() and c.sock is not None:
                    self._sel.register(c.sock, selectors.EVENT_READ, c)
        # Jobs whose socket vanished while we were not connected.
        for pid, c in list(self.conns.items()):
            if c.sock is None and c.state == "unreachable":
                if not pid_alive(pid):
                    c._set_ended("exited", "the process has exited")
        self._trim_exited()

    def _trim_exited(self) -> None:
        ended = sorted(
            (c.ended_at or 0, pid) for pid, c in self.conns.items() if not c.live and c.state == "exited"
        )
        for _, pid in ended[: max(0, len(ended) - MAX_EXITED)]:
            self.conns.pop(pid, None)
            self._exits.forget(pid)

    def poll(self, timeout: float) -> None:
        """Wait up to ``timeout`` for frames and read them (rescans as due)."""
        if time.monotonic() - self._last_scan >= RESCAN_S:
            self.scan()
        try:
            events = self._sel.select(timeout) if self._sel.get_map() else _sleep(timeout)
        except (OSError, ValueError):
            events = []
        for key, _ in events:
            c: JobConnection = key.data
            c.read()
            if c.sock is None:
                try:
                    self._sel.unregister(key.fileobj)
                except (KeyError, ValueError):
                    pass

    def catch_up(self, bound_s: float = CATCH_UP_S) -> None:
        """Read until every connected job's hello and history have come, for
        at most ``bound_s``: a build before then shows a job as it was
        seconds ago (its newest frame is an old one of the history)."""
        # Once per connection: a job that never finishes its history (or
        # never says hello) must not slow every later build.
        new = [c for c in self.conns.values() if c.catching_up and not c.caught_up_once]
        end = time.monotonic() + bound_s
        while any(c.catching_up for c in new) and (left := end - time.monotonic()) > 0:
            self.poll(min(left, 0.05))
        for c in new:
            c.caught_up_once = True

    def dismiss(self, job_pid: int) -> None:
        c = self.conns.get(job_pid)
        if c is not None and not c.live:
            self.conns.pop(job_pid, None)
            self._exits.forget(job_pid)

    # --- the model ---------------------------------------------------------------------

    def build(self, window_s: float | None = None, reuse_procs: bool = False) -> Snapshot:
        """The snapshot now. ``reuse_procs``: keep the process figures of a
        sample less than ``PROC_EVERY_S`` old if it covers every PID (the
        live loop's cadence); otherwise sample the processes now."""
        window_s = window_s or self.window_s
        now = self.clock()
        # Jobs that never said hello (incompatible, stopped before answering)
        # are listed too, with their state and reason: hiding them would
        # read as "no jobs".
        conns = [
            c
            for c in self.conns.values()
            if c.job is not None or c.state != "connecting" or time.time() - c.first_seen > HELLO_GRACE_S
        ]
        self._stacks.step(conns)
        mains, workers = self._pids(conns)
        for pid, att in self.attached.items():
            if not att.exited:
                mains.add(pid)
                workers.update(att.worker_pids())
        procs_at = self._proc_cache_at
        procs = self._sample_procs(mains, workers, reuse_procs) if self._procs else {}
        # Host load with the processes' figures, over the same interval: the
        # diagnosis subtracts one from the other ("everyone else's" CPU).
        host = self._sample_host(reuse_procs and self._proc_cache_at == procs_at)
        self._sample_gpu()
        status, gpus = self._gpu_state
        # A job that publishes through the hook as well is shown once, hooked.
        hooked = {c.pid for c in conns if c.live}
        attached: list[dict[str, Any]] = []
        for pid, a in self.attached.items():
            if pid in hooked:
                continue
            job = self._safe("attach", partial(a.job, procs, self.diagnose_window_s), None)
            if job is not None:
                attached.append(job)
        snap = model.snapshot_dict(
            now=now,
            window_s=window_s,
            host=host,
            gpu_status=status,
            gpus=[self._gpu_record(g, window_s) for g in gpus],
            conns=conns,
            procs=procs,
            runtime_dir=self.directory,
            runtime_dir_error=self.dir_error,
            errors=[*self.broken.values(), *self.errors],
            attached=attached,
        )
        if not self.uss and self._procs is not None:
            snap["uss_reason"] = USS_SKIPPED
        if "diagnosis" in self.broken:
            snap["hints_error"] = self.broken["diagnosis"]
        diagnoser = self._diagnoser
        if diagnoser is not None:
            t = time.monotonic()
            if reuse_procs and self._hints_at is not None and t - self._hints_at < DIAGNOSE_EVERY_S:
                snap["hints"] = self._hints
                snap["judging"] = self._judging + _unjudged(snap, self._judged_loaders)
                if self._hints_error:
                    snap["hints_error"] = self._hints_error
                return snap
            dw = self.diagnose_window_s
            judged = snap
            if abs(dw - window_s) > 1e-6:
                judged = dict(
                    snap,
                    window_s=dw,
                    jobs=attached  # type: ignore[assignment]
                    + [model.job_dict(c, dw, procs, now, history=False) for c in conns],
                )
            try:
                snap["hints"] = cast(list[Hint], diagnoser.update(judged))
                # The loaders not judged yet: "judging… (N s)", not "nothing to fix".
                # The diagnosis keeps one state per loader (judging, or its hints).
                judging = getattr(diagnoser, "judging", None)
                self._judging = list(judging()) if callable(judging) else []
                self._judged_loaders = _loader_keys(judged)
                snap["judging"] = list(self._judging)
                self._hints_error = None
            except Exception as e:
                self._fault("diagnosis", e)
                snap["hints"] = []
                self._hints_error = f"diagnosis failed: {type(e).__name__}: {e}"
                snap["hints_error"] = self._hints_error
                snap["errors"] = [*self.broken.values(), *self.errors]
            self._hints, self._hints_at = snap["hints"], t
        return snap

    @staticmethod
    def _pids(conns) -> tuple[set[int], set[int]]:
        """Trainer PIDs and worker PIDs of the live jobs, from their last frames."""
        mains: set[int] = set()
        workers: set[int] = set()
        for c in conns:
            if c.live:
                mains.add(c.pid)
                if c.frames:
                    for ld in c.frames[-1]["loaders"]:
                        workers.update(w["pid"] for w in ld["workers"] if w.get("pid"))
                        workers.update(pipeline_pids(ld, "process"))
        return mains, workers

    @staticmethod
    def _thread_pids(conns) -> set[int]:
        """Live jobs whose pipeline runs worker threads (nodes, Grain): their
        threads' CPU is read one by one (/proc/PID/task/TID)."""
        return {
            c.pid
            for c in conns
            if c.live and c.frames and any(pipeline_pids(ld, "thread") for ld in c.frames[-1]["loaders"])
        }

    @staticmethod
    def _own_tids(conns) -> dict[int, list[int]]:
        """dlwatch's own threads in each live job's processes, as their last
        frames list them (``own_tids``): left out of the processes' figures."""
        out: dict[int, list[int]] = {}
        for c in conns:
            if not (c.live and c.frames):
                continue
            fr = c.frames[-1]
            pairs = [(c.pid, (fr.get("main") or {}).get("own_tids"))]
            pairs += [(w.get("pid"), w.get("own_tids")) for ld in fr["loaders"] for w in ld["workers"]]
            for pid, tids in pairs:
                if isinstance(pid, int) and tids:
                    out.setdefault(pid, []).extend(t for t in tids if type(t) is int and t > 0)
        return out

    @staticmethod
    def _active_since(conns) -> dict[int, tuple[float, float]]:
        """When each live job's DataLoader workers began their work, as their
        last frames say (``started_cpu_s`` and ``started_ns``: the worker's
        CPU seconds and monotonic clock then): the process sampler averages a
        new worker's CPU from there (procs.py, ``active_since``)."""
        out: dict[int, tuple[float, float]] = {}
        for c in conns:
            if not (c.live and c.frames):
                continue
            for ld in c.frames[-1]["loaders"]:
                for w in ld["workers"]:
                    pid, cpu0, t0 = w.get("pid"), w.get("started_cpu_s"), w.get("started_ns")
                    if isinstance(pid, int) and pid > 0 and isinstance(cpu0, (int, float)) and t0:
                        out[pid] = (float(cpu0), t0 / 1e9)
        return out

    def sample_now(self, window_s: float | None = None, settle_s: float = 0.6) -> Snapshot:
        """One settled measurement, about ``settle_s`` and a little after the call.

        Jobs send their recent frames on attach, so the window is there at
        once; the settle time is for CPU percentages (two samples of each
        process) and for frames still in flight. Every process's USS is read
        now (the live collector spreads those reads over seconds)."""
        self.scan()
        deadline = time.monotonic() + settle_s
        self.poll(0.15)  # the hello and the history replay
        self.catch_up()
        if self._procs is not None:
            mains, workers = self._pids(self.conns.values())
            self._sample_procs(mains, workers, reuse=False, force_uss=True)
        if self._host is not None:
            primed: dict[str, Any] = self._safe("host", self._host.sample, {})  # primes the CPU counters
            del primed
        while (left := deadline - time.monotonic()) > 0:
            self.poll(min(left, 0.1))
        self._stacks.step(self.conns.values())
        self._stacks.wait(COMPLETE_BOUND_S)
        self._last_gpu = 0.0
        return self.build(window_s)

    def judge_now(
        self, window_s: float | None = None, settle_s: float = 0.6, judge_s: float = JUDGE_S
    ) -> Snapshot:
        """``sample_now``, then a snapshot every ``DIAGNOSE_EVERY_S`` fed to
        the diagnosis, until no loader is judging or ``judge_s`` after the
        first: the hints the live view would show for the same job then.
        ``judged_s`` in the result: the seconds the figures behind the hints
        were watched (the first measurement's settle time included)."""
        began = time.monotonic()
        snap = self.sample_now(window_s, settle_s)
        first = time.monotonic()
        live = _live_pids(snap)
        frozen: dict[Any, tuple[dict[str, Any], list[Any]]] = {}
        while snap.get("judging") and (left := judge_s - (time.monotonic() - first)) > 0:
            if self._stop.wait(min(left, DIAGNOSE_EVERY_S)):
                break
            self.scan()
            self.poll(0.0)
            later = self.build(window_s)
            ended = live - _live_pids(later) - frozen.keys()
            if ended:
                # A job ended while it was watched: its last live figures,
                # with the hints judged on them, are the measurement asked
                # for, and it says that the job ended and what its loaders
                # reported on the way out (a QA run: a worker killed during
                # the watch left "[live]" and "judging…", and nothing else).
                ended_while_watched(snap, later, ended)
                frozen.update(_frozen(snap, ended))
                if live <= frozen.keys():
                    break
                # The others are judged on (a QA run: another job's exit cut
                # the watch of a data-bound one at 3.7 s, without its hint).
            snap = with_frozen(later, frozen)
        snap["judged_s"] = round(time.monotonic() - began, 1)
        return snap

    def _sample_host(self, reuse: bool) -> dict:
        if not self._host:
            return {}
        t = time.monotonic()
        if reuse and self._host_at is not None and t - self._host_at < HOST_EVERY_S:
            return self._host_cache
        self._host_cache, self._host_at = self._safe("host", self._host.sample, {}), t
        return self._host_cache

    def _sample_procs(self, mains: set[int], workers: set[int], reuse: bool, force_uss: bool = False) -> dict:
        pids = mains | workers
        t = time.monotonic()
        at = self._proc_cache_at
        if reuse and at is not None and t - at < PROC_EVERY_S and pids.issubset(self._proc_cache):
            return {p: self._proc_cache[p] for p in pids}
        sampler, sched = self._procs, self._sched
        if sampler is None:
            return {}
        own = self._own_tids(self.conns.values())
        active = self._active_since(self.conns.values())
        procs: dict[int, dict[str, Any]] = self._safe(
            "processes",
            lambda: sampler.sample(
                sorted(pids),
                main_pids=mains,
                uss_pids=workers if self.uss else (),
                force_uss=force_uss,
                thread_pids=self._thread_pids(self.conns.values()),
                own_tids=own,
                active_since=active,
            ),
            {},
        )
        # The threads found by name since (a burst's sampler before a frame lists it).
        named = getattr(sampler, "named_own", None)
        for pid, tids in (named() if callable(named) else {}).items():
            own.setdefault(pid, []).extend(tids)
        if sched is not None:
            # Workers' ages: a young one's first sight gives its lifetime wait
            # (one of sub-second epochs may not live to a second sample).
            young = _ages({p: procs[p] for p in workers if p in procs})
            unread = any(self._sched_cache.get(p) is None and a < YOUNG_RETRY_S for p, a in young.items())
            if (
                not reuse
                or self._sched_at is None
                or t - self._sched_at >= SCHED_EVERY_S
                or not pids.issubset(self._sched_cache)
                or unread
            ):
                self._sched_cache = self._safe(
                    "run-queue", lambda: sched.sample(sorted(pids), own, young), {}
                )
                self._sched_at = t
            procs = add_runqueue(procs, {p: v for p, v in self._sched_cache.items() if p in pids})
        self._proc_cache, self._proc_cache_at = procs, t
        return procs

    def _gpu_record(self, g: dict[str, Any], window_s: float) -> dict[str, Any]:
        hist = list(self._gpu_hist.get(g["index"], ()))
        # The window's mean and spread: what the view shows and the hints quote.
        mean_u, lo, hi = window_util(hist, window_s / GPU_EVERY_S)
        return dict(
            g,
            history=hist,
            mem_history=list(self._gpu_mem_hist.get(g["index"], ())),
            util_window_percent=mean_u,
            util_window_min_percent=lo,
            util_window_max_percent=hi,
        )

    def _sample_gpu(self) -> None:
        t = time.monotonic()
        if self._gpu is None or t - self._last_gpu < GPU_EVERY_S:
            return
        self._last_gpu = t
        failed: tuple[str, list[dict[str, Any]]] = ("n/a: GPU sampling failed", [])
        status, gpus = self._safe("gpu", self._gpu.sample, failed)
        self._gpu_state = (status, gpus)
        for g in gpus:
            i = g.get("index")
            self._gpu_hist.setdefault(i, deque(maxlen=HISTORY_POINTS)).append(g.get("util_percent"))
            total = g.get("mem_total_bytes") or 0
            used = g.get("mem_used_bytes")
            self._gpu_mem_hist.setdefault(i, deque(maxlen=HISTORY_POINTS)).append(
                round(used / total, 4) if total and used is not None else None
            )

    # --- background thread for the TUI -------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        for att in self.attached.values():
            att.start()
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="dlwatch-monitor", daemon=True)
        self._thread.start()

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from the collector thread) after each new
        snapshot, so a view can redraw at once instead of polling on a timer
        of its own (which would add up to one more period of delay)."""
        self._listeners.append(callback)

    def _notify(self) -> None:
        for callback in list(self._listeners):
            try:
                callback()
            except Exception as e:  # a view's problem must not stop the sampling
                self._fault("listener", e)

    def _run(self) -> None:
        while not self._stop.is_set():
            deadline = time.monotonic() + self.interval
            try:
                # Frames are only looked at when the snapshot is built, so
                # rather than waking for each one (jobs x 10 a second) the
                # thread sleeps until the build and then drains every socket
                # at once; the sockets' buffers hold far more than an interval.
                if self._stop.wait(max(0.0, deadline - time.monotonic())):
                    break
                self.poll(0.0)
                # Just connected (the rescan above): its hello and history are
                # a moment away; show the job now, not a build later.
                self.catch_up()
                snap = self.build(reuse_procs=True)
                with self._lock:
                    self._latest = cast(dict[str, Any], snap)  # a TypedDict is a dict
                self._notify()
            except Exception as e:  # keep sampling; the view shows the error
                self._fault("collector", e)
                self._stop.wait(self.interval)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None
        for att in self.attached.values():
            att.stop()
        for c in self.conns.values():
            c.close()
        self._exits.stop()
        try:
            self._sel.close()
        except (OSError, RuntimeError):
            pass

    def latest(self) -> dict | None:
        with self._lock:
            return self._latest


def _sleep(t: float) -> list:
    time.sleep(max(0.0, t))
    return []


# The real samplers, imported when first made: ``dlwatch ls`` needs none of them.
def _default_gpu(window_s: float) -> GpuSource:
    from dlwatch.collect.gpu import GpuSampler

    # The first read's mean covers the window (a one-shot snapshot reads the
    # GPU once), not NVML's whole buffer from before the monitor started.
    return GpuSampler(first_window_s=max(window_s, GPU_EVERY_S))


def _default_procs() -> ProcSource:
    from dlwatch.collect.procs import ProcSampler

    return ProcSampler(
        uss_interval_s=USS_INTERVAL_S,
        uss_max_interval_s=USS_MAX_INTERVAL_S,
        uss_cpu_budget=USS_CPU_BUDGET,
    )


def _default_host() -> HostSource:
    from dlwatch.collect.host import HostSampler

    return HostSampler()


def _ages(procs: Mapping[int, Mapping[str, Any]]) -> dict[int, float]:
    """Seconds since each process started (its ``create_time``), for the run-
    queue sampler's first sight of a young worker (``SchedSampler.sample``)."""
    from dlwatch.collect.procs import process_age_s

    return {
        pid: process_age_s(ct)
        for pid, p in procs.items()
        if isinstance(ct := p.get("create_time"), (int, float)) and not isinstance(ct, bool)
    }


def _live_pids(snap: Mapping[str, Any]) -> set[Any]:
    return {j.get("pid") for j in snap.get("jobs") or [] if isinstance(j, dict) and j.get("state") == "live"}


def _loader_keys(snap: Mapping[str, Any]) -> set[tuple[Any, Any]]:
    return {
        (j.get("pid"), ld.get("id"))
        for j in snap.get("jobs") or []
        if isinstance(j, dict)
        for ld in j.get("loaders") or []
        if isinstance(ld, dict)
    }


def _unjudged(snap: Mapping[str, Any], judged: set[tuple[Any, Any]]) -> list[dict]:
    """Loaders of live jobs that appeared after the last diagnosis (it runs
    once a second, snapshots come twice): judging, not "nothing to fix"."""
    live = {
        "jobs": [
            j for j in snap.get("jobs") or [] if isinstance(j, dict) and j.get("state", "live") == "live"
        ]
    }
    return [
        {
            "job_pid": pid,
            "loader_id": lid,
            "judging_s": None,
            "reason": "not judged yet: new since the last diagnosis",
        }
        for pid, lid in sorted(_loader_keys(live) - judged, key=str)
    ]


def _default_diagnoser() -> HintSource:
    from dlwatch.diagnose import Diagnoser

    return Diagnoser()


def _frozen(snap: Snapshot, pids: set[Any]) -> dict[Any, tuple[dict[str, Any], list[Any]]]:
    """The jobs of ``pids`` in ``snap`` with their hints, as they stand."""
    hints = [h for h in snap.get("hints") or [] if isinstance(h, dict)]
    return {
        j.get("pid"): (j, [h for h in hints if h.get("job_pid") == j.get("pid")])
        for j in cast(list[dict[str, Any]], snap.get("jobs") or [])
        if j.get("pid") in pids
    }


def with_frozen(snap: Snapshot, frozen: Mapping[Any, tuple[dict[str, Any], list[Any]]]) -> Snapshot:
    """``snap`` with the ended jobs of ``frozen`` as they were last seen live
    (``ended_while_watched``), their hints with them, none of them judging."""
    if not frozen:
        return snap
    jobs = cast(list[dict[str, Any]], snap.get("jobs") or [])
    listed = {j.get("pid") for j in jobs}
    merged = [frozen[j.get("pid")][0] if j.get("pid") in frozen else j for j in jobs]
    merged += [job for pid, (job, _) in frozen.items() if pid not in listed]
    snap["jobs"] = cast(Any, merged)
    kept = [h for h in snap.get("hints") or [] if not (isinstance(h, dict) and h.get("job_pid") in frozen)]
    snap["hints"] = kept + [h for _, hints in frozen.values() for h in hints]
    snap["judging"] = [j for j in snap.get("judging") or [] if j.get("job_pid") not in frozen]
    return snap


def ended_while_watched(snap: Snapshot, later: Snapshot, ended: set[Any]) -> None:
    """In ``snap``, the jobs of ``ended`` as ``later`` found them: their state
    and its reason, the worker deaths their loaders reported; their figures
    stay ``snap``'s. No loader of theirs is left judging."""
    after: dict[Any, Any] = {j.get("pid"): j for j in later.get("jobs") or [] if isinstance(j, dict)}
    for job in cast(list[dict[str, Any]], snap.get("jobs") or []):
        gone = after.get(job.get("pid"))
        if job.get("pid") not in ended or gone is None:
            continue
        job["state"] = gone.get("state") or "exited"
        job["state_reason"] = f"{gone.get('state_reason') or 'the process has exited'} while it was watched"
        deaths = {ld.get("id"): ld.get("worker_deaths") for ld in gone.get("loaders") or []}
        for ld in job.get("loaders") or []:
            if deaths.get(ld.get("id")):
                ld["worker_deaths"] = deaths[ld.get("id")]
    snap["judging"] = [j for j in snap.get("judging") or [] if j.get("job_pid") not in ended]


def take_snapshot(
    window_s: float = DEFAULT_WINDOW_S,
    directory: str | None = None,
    only_pid: int | None = None,
    settle_s: float = 0.6,
    monitor: Monitor | None = None,
    uss: bool = False,
    judge_s: float = JUDGE_S,
) -> Snapshot:
    """One measurement judged as the live view judges it (``Monitor.judge_now``:
    up to ``judge_s`` seconds of watching), by a monitor of its own unless one
    is given. ``uss``: also read each worker's USS (USS_SKIPPED says why not
    by default)."""
    m = monitor or Monitor(
        directory=directory,
        window_s=window_s,
        only_pid=only_pid,
        uss=uss,
        frame_every=ONE_SHOT_EVERY,
    )
    try:
        return m.judge_now(window_s, settle_s, judge_s)
    finally:
        if monitor is None:
            m.stop()


def pipeline_pids(ld: dict, kind: str) -> list[int]:
    """A loader frame's pipeline workers of ``kind`` ("thread": the ids of
    threads, "process": the pids of processes)."""
    key = "tid" if kind == "thread" else "pid"
    return [
        int(w[key])
        for w in ld.get("pipeline_workers") or ()
        if isinstance(w, dict) and w.get("kind") == kind and isinstance(w.get(key), int)
    ]
