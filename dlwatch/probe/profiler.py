"""Profiler bursts: ``torch.profiler`` over N training steps of a running job.

The profiler is thread-local, so it must start and stop on the training
thread, and the only code of ours that runs there is the DataLoader's
``__next__``. Rather than add a check to that hot path, a burst swaps the
class-level ``__next__`` for its own duration: ``Burst.install`` puts a
wrapper around whatever ``__next__`` is installed now; at the first call
from the target loader's iterator the wrapper starts the profiler, marks a
step at each later call, stops after N steps (or the time bound, or when
the profiler's memory grows past its cap) and puts the previous
``__next__`` back. No burst, no cost.

Everything after the stop runs on a short-lived thread: reading Kineto's
events, the figures (``profile_figures``), the Chrome trace (mode 0600,
size-bounded). The publisher thread polls ``Burst.poll`` and answers the
monitor that asked. Nothing here may raise into the training loop: a
profiler that cannot start becomes an error in the result, and the job
trains on.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import sys
import threading
import time
from time import perf_counter_ns as _clock
from typing import Any

from dlwatch import autograd_threads, own_threads, wire
from dlwatch.probe import loop_follow, profile_events, profile_figures

TARGET_MODULE = "torch.utils.data.dataloader"
# The trace file is at most this big. Kineto writes ~260 bytes per CPU event
# and ~400 per kernel; a burst whose estimate passes the cap is written by
# our own bounded writer (the first events that fit, chronologically).
MAX_TRACE_BYTES = 64 << 20
TRACE_BYTES_PER_EVENT = 400
# The profiler buffers every event in the job until it stops: a burst stops
# early once the process has grown this much since it started.
MAX_RSS_GROWTH = 512 << 20
ARMED, RUNNING, PROCESSING, DONE = "armed", "running", "processing", "done"
# The loop's own pace and data wait, judged on steps the profiler does not
# slow: a window of plain steps just before the profiled ones and one after
# (once the events are read: see Burst._after). The profiler stretched a
# resnet's step 34 -> 45 ms and its wait fell from 49-59 % to under 30 %; a
# 10-step burst of a 12-worker loader fit in one wave of prefetched batches
# and read "0 % waiting". So each window lasts
# at least this long and this many waves of the batches the workers keep in
# flight (num_workers x prefetch_factor) ...
AROUND_MIN_S = 1.0
AROUND_WAVES = 2
# ... and at most this long (the loop may be slow, or leave this loader).
AROUND_MAX_S = 10.0

_lock = threading.Lock()
_current: Burst | None = None


def enabled() -> bool:
    """False in a job started with DLWATCH_PROFILE=0: it announces no
    profiling and refuses requests."""
    return os.environ.get("DLWATCH_PROFILE", "").strip().lower() not in ("0", "false", "no", "off")


def current() -> Burst | None:
    return _current


def _iter_class():
    mod = sys.modules.get(TARGET_MODULE)
    return getattr(mod, "_BaseDataLoaderIter", None) if mod is not None else None


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


class Burst:
    """One burst: armed by the publisher thread, run by the training thread,
    finished by its own thread. ``state`` moves armed → running →
    processing → done (or armed → done when it cannot start)."""

    def __init__(
        self,
        target,
        steps: int,
        max_s: float,
        out_dir: str | None,
        fallback_dir: str | None,
        loader: dict | None = None,
    ) -> None:
        self.target = target  # the LoaderStats of the loader the loop steps now
        self.loader = dict(loader or {})
        # A loop that builds a new DataLoader every pass steps a new loader
        # object each time: the burst follows it (loop_follow.py). The line
        # that stepped the target, once it has; loaders seen not to be the loop's.
        self.site: tuple | None = None
        self.loaders = 1
        self._not_loop: set[int] = set()
        self.steps = steps
        self.max_s = max_s
        self.out_dir = out_dir
        self.fallback_dir = fallback_dir
        self.deadline_ns = _clock() + int(max_s * 1e9)
        self.state = ARMED
        self.steps_done = 0
        self.bounds: list[int] = []  # the burst's clock at each step's start
        self.wait_ns = 0
        self.stop_note: str | None = None
        self.cancelled = False
        self.result: dict | None = None
        self.error: str | None = None
        self.cuda = False
        self._prof: Any = None  # torch.profiler.profile, while a burst runs
        self._tid: int | None = None
        self._rss0 = 0
        self._cls = None
        self._prev = None
        self._wrapper = None
        self._reported = -1
        self._lock = threading.Lock()
        self.in_flight = _in_flight(target)
        self.before = _Window()
        self.after = _Window()
        self.cpu_ns = 0  # the training thread's CPU time over the profiled steps
        self._cpu0 = 0
        # On CUDA the backward pass runs on autograd's device threads while the
        # training thread waits (autograd_threads.py): their CPU time too.
        self.autograd: tuple[int, ...] = autograd_threads.find()
        self.autograd_ns: int | None = None
        self._ag0: dict[int, int] = {}
        self._after_done = threading.Event()
        # Set once the burst's own thread has read the events and written the
        # trace: the plain window after the burst opens at the loop's next
        # batch from then on (processed_ns says when).
        self._processed = False
        self.processed_ns: int | None = None

    # --- publisher thread ---------------------------------------------------------

    def install(self) -> None:
        cls = _iter_class()
        prev = cls.__dict__.get("__next__") if cls is not None else None
        if prev is None:
            raise RuntimeError("torch's DataLoader iterator is not loaded in this job")
        self._cls, self._prev = cls, prev
        self._wrapper = _make_next(self, prev)
        cls.__next__ = self._wrapper

    def poll(self) -> list[dict]:
        """Messages for the monitor since the last poll (progress, the result)."""
        out: list[dict] = []
        if self.state == ARMED and _clock() > self.deadline_ns:
            with self._lock:
                if self.state == ARMED:
                    self._uninstall()
                    name = self.loader.get("name") or f"loader {self.loader.get('id')}"
                    what = "took no step" if self.before.t0 is not None else "produced no batch"
                    self._finish(error=f"{name} {what} within {self.max_s:g} s; nothing profiled")
        if self.state in (RUNNING, PROCESSING) and self.steps_done != self._reported:
            self._reported = self.steps_done
            out.append(self.status())
        if self.state == DONE:
            out.append(wire.profile_result(self.result or {}, self.error or None))
        return out

    def status(self) -> dict:
        late = self.state == RUNNING and _clock() > self.deadline_ns
        return wire.profile_status(
            self.state if self.state != DONE else PROCESSING,
            "past the time bound: the profiler stops at the loop's next batch" if late else None,
            steps=self.steps,
            steps_done=self.steps_done,
            loader=self.loader,
        )

    def cancel(self) -> None:
        """The monitor went away: stop at the next step, write nothing."""
        self.cancelled = True
        if self.state == ARMED:
            with self._lock:
                if self.state == ARMED:
                    self._uninstall()
                    self._finish(error="cancelled")

    # --- training thread --------------------------------------------------------------

    def follows(self, st, caller) -> bool:
        """A call on another loader's iterator: is it the loop's new loader
        (built again this pass)? Then it becomes the target. Never raises."""
        try:
            if st.id in self._not_loop or self.state not in (ARMED, RUNNING, PROCESSING):
                return False
            site = (caller.f_code, caller.f_lineno) if caller is not None else None
            same_line = self.site is None or site == self.site
            same_thread = self._tid is None or threading.get_ident() == self._tid
            follow = same_line and same_thread and loop_follow.finished(self.target)
            if not (follow and loop_follow.successor(self.target, st)):
                self._not_loop.add(st.id)
                return False
            self.target = st
            self.loaders += 1
            name = (st.config or {}).get("dataset") or "dataset"
            self.loader["id"] = st.id
            self.loader["name"] = f"loader {st.id} ({name})"[:80]
            return True
        except Exception:
            return False

    def on_target_next(self, it, prev):
        window = self._advance(_clock())
        if window is None:
            return prev(it)
        # Clocked after _advance: starting or stepping the profiler is not data wait.
        t0 = _clock()
        data = prev(it)  # StopIteration and the dataset's errors pass as they are
        dt = _clock() - t0
        if window is self:
            self.wait_ns += dt
        else:
            window.wait_ns += dt
        return data

    def _advance(self, t0: int):
        """Start, step or stop the profiler; what this call's wait belongs
        to: the burst (a profiled step), a plain window (before or after
        it), or None. Never raises."""
        try:
            if self.state == ARMED:
                return self._before(t0)
            if self.state == PROCESSING:
                return self._after(t0)
            if self.state != RUNNING or threading.get_ident() != self._tid:
                return None
            self.bounds.append(t0)
            self.steps_done += 1
            if self.cancelled:
                self._stop(discard=True)
                return None
            if self.steps_done >= self.steps:
                self._stop()
                return None
            if t0 >= self.deadline_ns:
                self.stop_note = f"stopped at the {self.max_s:g} s bound after {self.steps_done} steps"
                self._stop()
                return None
            grown = _rss_bytes() - self._rss0
            if self._rss0 and grown > MAX_RSS_GROWTH:
                self.stop_note = (
                    f"stopped after {self.steps_done} steps: the profiler's buffer grew the job by "
                    f"{grown >> 20} MiB (cap {MAX_RSS_GROWTH >> 20} MiB)"
                )
                self._stop()
                return None
            self._prof.step()
            return self
        except Exception as e:  # whatever torch does, the loop goes on
            self._abort(f"profiler failed: {type(e).__name__}: {e}")
            return None

    def _before(self, t0: int):
        """The plain steps before the burst, on the thread that runs the
        loop; then the profiler starts."""
        w = self.before
        if w.t0 is None:
            if t0 > self.deadline_ns:
                return self._begin(t0)  # says why nothing was profiled
            self._tid = threading.get_ident()
            w.open(t0, self.autograd)
            return w
        if threading.get_ident() != self._tid:
            return None
        w.steps += 1
        # The window may take a quarter of the burst's time bound at most.
        cap = min(AROUND_MAX_S, self.max_s / 4) * 1e9
        if not w.long_enough(t0, self.in_flight) and t0 - w.t0 < cap:
            return w
        w.close(t0)
        return self._begin(t0)

    def _after(self, t0: int):
        """The plain steps after the burst, once its events are read: while
        the burst's own thread turns them into rows and writes the trace it
        holds the GIL for most of a second or more, and a window that ran
        meanwhile read our work as the loop's (on an H100 a launch loop's
        plain steps read 72 ms and its main thread 40 % busy, against 51 ms
        and 100 % in the profiled steps)."""
        w = self.after
        if w.t1 is not None or threading.get_ident() != self._tid:
            return None
        if w.t0 is None:
            if not self._processed:
                return None
            w.open(t0, self.autograd)
            return w
        w.steps += 1
        if w.long_enough(t0, self.in_flight) or t0 - w.t0 >= AROUND_MAX_S * 1e9:
            w.close(t0)
            self._uninstall()
            self._after_done.set()
            return None
        return w

    def _begin(self, t0: int):
        with self._lock:
            if self.state != ARMED:
                return None
            if t0 > self.deadline_ns:
                self._uninstall()
                self._finish(error=f"no batch within {self.max_s:g} s; nothing profiled")
                return None
            try:
                self._prof = self._start_profiler()
            except Exception as e:
                self._uninstall()
                self._finish(error=f"the profiler could not start: {type(e).__name__}: {_short(e)}")
                return None
            self._tid = threading.get_ident()
            self._rss0 = _rss_bytes()
            # The first step starts once the profiler runs (its first start
            # initialises Kineto: up to seconds, and none of it the loop's).
            self.bounds = [_clock()]
            self._cpu0 = time.thread_time_ns()
            self._ag0 = autograd_threads.cpu_ns(self.autograd)
            self.state = RUNNING
            return self

    def _start_profiler(self):
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        if torch.autograd._profiler_enabled():
            raise RuntimeError("another profiler is already running in this job")
        # CUDA only in a job that uses it: asking would initialise CUDA in a CPU job.
        self.cuda = bool(torch.cuda.is_initialized())
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.cuda else [])
        # A schedule that always records: the same as none, plus a
        # "ProfilerStep#k" span per step in the trace.
        prof = profile(activities=activities, schedule=lambda _step: ProfilerAction.RECORD)
        prof.start()
        return prof

    def stop_elsewhere(self) -> None:
        """Past the deadline, the target loader has stopped stepping but the
        loop goes on (another loader, a new epoch): stop from this call, if
        it runs on the thread the profiler belongs to."""
        if self.state == RUNNING and threading.get_ident() == self._tid:
            self.stop_note = f"stopped at the {self.max_s:g} s bound after {self.steps_done} steps"
            self._stop(discard=self.cancelled)

    def _stop(self, discard: bool = False) -> None:
        self.cpu_ns = time.thread_time_ns() - self._cpu0
        if self.autograd:
            self.autograd_ns = autograd_threads.spent(self._ag0, autograd_threads.cpu_ns(self.autograd))
        prof, self._prof = self._prof, None
        try:
            prof.stop()
        except Exception as e:
            self._uninstall()
            self._finish(error=f"the profiler failed to stop: {type(e).__name__}: {_short(e)}")
            return
        if discard:
            self._uninstall()
            self._finish(error="cancelled")
            return
        # The plain window after the burst starts once the events are read
        # (_process); the wrapper stays until that window is long enough.
        self.state = PROCESSING
        own_threads.start(self._process, "dlwatch-profile", (prof,))

    def _abort(self, reason: str) -> None:
        self._uninstall()
        prof, self._prof = self._prof, None
        if prof is not None:
            with contextlib.suppress(Exception):
                prof.stop()
        self._finish(error=reason)

    def _uninstall(self) -> None:
        cls, wrapper = self._cls, self._wrapper
        if cls is not None and cls.__dict__.get("__next__") is wrapper:
            cls.__next__ = self._prev

    # --- the burst's own thread --------------------------------------------------------------

    def _process(self, prof) -> None:
        result: dict = {}
        error = None
        try:
            events = prof.profiler.kineto_results.events()
            rows = profile_events.rows(events, _torch_version())
            step_ns = [b - a for a, b in zip(self.bounds, self.bounds[1:])]
            result = profile_figures.summarize(rows, step_ns, self.wait_ns, self.cuda)
            total = sum(step_ns)
            result["main_thread_cpu_fraction"] = round(self.cpu_ns / total, 4) if total > 0 else None
            ag = self.autograd_ns
            result["autograd_cpu_fraction"] = round(ag / total, 4) if ag is not None and total > 0 else None
            result.update(self._write_trace(prof, rows))
        except profile_events.Unsupported as e:
            error = str(e)
        except Exception as e:
            error = f"could not read the profile: {type(e).__name__}: {_short(e)}"
        # The window after the burst opens at the loop's next batch and runs as
        # long as it takes, within its bound (a loop that left this loader ends
        # it here, as far as it got); a burst that failed ends it now. Either
        # way the wrapper goes before the result.
        self.autograd = autograd_threads.find()  # a device's first backward may have come since
        self.processed_ns = _clock()
        self._processed = True
        if error is not None or not self._after_done.wait(AROUND_MAX_S + 1.0):
            self.after.close(_clock(), on_loop_thread=False)
            self._uninstall()
        if error is None:
            result["unprofiled"] = profile_figures.unprofiled(
                [self.before.figures(), self.after.figures()], self.in_flight
            )
        self._finish(result, error)

    def _write_trace(self, prof, rows: list) -> dict:
        out: dict[str, Any] = {
            "trace_path": None,
            "trace_bytes": None,
            "trace_truncated": False,
            "trace_note": None,
        }
        try:
            path, note = self._create_trace_file()
        except OSError as e:
            out["trace_note"] = f"no trace written: {e}"
            return out
        out["trace_note"] = note
        try:
            truncated = False
            if len(rows) * TRACE_BYTES_PER_EVENT <= MAX_TRACE_BYTES:
                prof.export_chrome_trace(path)  # Kineto's own: flows, streams, metadata
            if os.path.getsize(path) == 0 or os.path.getsize(path) > MAX_TRACE_BYTES:
                truncated = write_bounded_trace(path, rows, MAX_TRACE_BYTES)
            os.chmod(path, 0o600)
            out.update(trace_path=path, trace_bytes=os.path.getsize(path), trace_truncated=truncated)
        except Exception as e:
            out["trace_note"] = f"no trace written: {type(e).__name__}: {_short(e)}"
            try:
                os.unlink(path)
            except OSError:
                pass
        return out

    def _create_trace_file(self) -> tuple[str, str | None]:
        """An empty 0600 file of ours: in the monitor's directory, else in the
        runtime directory (the note says why)."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        name = f"dlwatch-profile-{os.getpid()}-{stamp}"
        errors = []
        for d in (self.out_dir, self.fallback_dir):
            if not d:
                continue
            for n in range(100):
                path = os.path.join(d, f"{name}{'' if n == 0 else f'-{n}'}.json")
                try:
                    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                except FileExistsError:
                    continue
                except OSError as e:
                    errors.append(f"cannot write in {d}: {e.strerror or e}")
                    break
                os.close(fd)
                note = None
                if d != self.out_dir and self.out_dir:
                    note = f"{errors[0]}; wrote the trace to the runtime directory {d} instead"
                return path, note
        raise OSError("; ".join(errors) or "no directory to write the trace in")

    def _finish(self, result: dict | None = None, error: str | None = None) -> None:
        result = dict(result or {})
        result.setdefault("steps", len(self.bounds) - 1 if len(self.bounds) > 1 else 0)
        result["steps_requested"] = self.steps
        result["loader"] = self.loader
        result["loaders_followed"] = self.loaders
        result["stop_note"] = self.stop_note
        result["window_mono_ns"] = [self.bounds[0], self.bounds[-1]] if self.bounds else None
        result["done_mono_ns"] = _clock()
        self.result = result
        self.error = error
        self.state = DONE


class _Window:
    """Plain (unprofiled) steps of the target loader, on the burst's clock
    and the training thread's CPU clock."""

    __slots__ = ("t0", "t1", "steps", "wait_ns", "cpu0", "cpu_ns", "autograd", "ag0", "autograd_ns")

    def __init__(self) -> None:
        self.t0: int | None = None
        self.t1: int | None = None
        self.steps = 0
        self.wait_ns = 0
        self.cpu0 = 0
        self.cpu_ns: int | None = 0
        self.autograd: tuple[int, ...] = ()
        self.ag0: dict[int, int] = {}
        self.autograd_ns: int | None = None

    def open(self, t0: int, autograd: tuple[int, ...] = ()) -> None:
        self.t0 = t0
        self.cpu0 = time.thread_time_ns()
        self.autograd = autograd
        self.ag0 = autograd_threads.cpu_ns(autograd)

    def close(self, t1: int, on_loop_thread: bool = True) -> None:
        if self.t0 is not None and self.t1 is None:
            self.t1 = t1
            # thread_time is the calling thread's: closed from the burst's own
            # thread (a loop that left the loader) it says nothing of the loop.
            self.cpu_ns = time.thread_time_ns() - self.cpu0 if on_loop_thread else None
            if self.autograd:
                self.autograd_ns = autograd_threads.spent(self.ag0, autograd_threads.cpu_ns(self.autograd))

    def long_enough(self, t: int, in_flight: int) -> bool:
        assert self.t0 is not None
        return t - self.t0 >= AROUND_MIN_S * 1e9 and self.steps >= AROUND_WAVES * in_flight

    def figures(self) -> dict:
        return {
            "steps": self.steps,
            "wall_ns": (self.t1 - self.t0) if self.t0 is not None and self.t1 is not None else 0,
            "wait_ns": self.wait_ns,
            "cpu_ns": self.cpu_ns,
            "autograd_cpu_ns": self.autograd_ns,
        }


def _in_flight(target) -> int:
    """Batches the loader's workers keep in flight (0 without workers)."""
    try:
        nw = int(getattr(target, "num_workers", 0) or 0)
        pf = (getattr(target, "config", None) or {}).get("prefetch_factor")
        return nw * (int(pf) if isinstance(pf, int) and pf > 0 else 2)
    except Exception:
        return 0


def _make_next(burst: Burst, prev):
    def __next__(self):
        st = getattr(self, "_dlw_stats", None)
        if st is burst.target:
            if burst.site is None:
                caller = _caller()  # the loop's line, once per burst
                burst.site = (caller.f_code, caller.f_lineno) if caller is not None else None
            return burst.on_target_next(self, prev)
        if st is not None and burst.follows(st, _caller()):
            return burst.on_target_next(self, prev)
        if burst.state == RUNNING and _clock() > burst.deadline_ns:
            burst.stop_elsewhere()
        return prev(self)

    __next__.__doc__ = getattr(prev, "__doc__", None)
    __next__._dlwatch_orig = prev  # type: ignore[attr-defined]  # what uninstall restores
    return __next__


def _caller():
    """The frame that called the wrapper's ``__next__`` (the loop's), or
    None when no Python frame did."""
    try:
        return sys._getframe(2)
    except ValueError:
        return None


def write_bounded_trace(path: str, rows: list, limit: int) -> bool:
    """A Chrome trace of ``rows`` that stays under ``limit`` bytes: the
    events in time order until the next would not fit. True if some were left out."""
    pid = os.getpid()
    base = min((r[2] for r in rows), default=0)
    head = '{"displayTimeUnit":"ms","traceEvents":[\n'
    size = len(head)
    kept = 0
    ordered = sorted(rows, key=lambda r: r[2])
    with open(path, "w") as f:
        f.write(head)
        for name, cat, start, end, tid in ordered:
            device = cat in profile_figures.DEVICE
            ev = {
                "ph": "X",
                "name": name,
                "cat": cat,
                "ts": (start - base) / 1e3,
                "dur": max(0, end - start) / 1e3,
                "pid": f"GPU ({pid})" if device else pid,
                "tid": tid,
            }
            line = ("," if kept else "") + json.dumps(ev, separators=(",", ":")) + "\n"
            if size + len(line) + 200 > limit:
                break
            f.write(line)
            size += len(line)
            kept += 1
        other = {"dlwatch": f"{kept} of {len(rows)} events (the trace is capped at {limit >> 20} MiB)"}
        f.write('],"otherData":' + json.dumps(other) + "}\n")
    return kept < len(rows)


def _torch_version() -> str:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "?"))


def _short(e: BaseException) -> str:
    s = str(e).strip().splitlines()[0] if str(e).strip() else ""
    return s if len(s) <= 160 else s[:157] + "..."


def _after_fork_in_child() -> None:
    # A worker forked during a burst inherits the wrapper but not the
    # profiler: put the previous __next__ back and forget the burst.
    global _current, _lock
    b = _current
    _current = None
    _lock = threading.Lock()
    if b is not None:
        with contextlib.suppress(Exception):
            b._uninstall()


os.register_at_fork(after_in_child=_after_fork_in_child)


def start(
    target, steps: int, max_s: float, out_dir: str | None, fallback_dir: str | None, loader: dict
) -> tuple[Burst | None, str | None]:
    """Arm a burst; (burst, None), or (None, why not) when one is running."""
    global _current
    with _lock:
        b = _current
        if b is not None and b.state != DONE:
            return None, (
                f"a profiler burst is already {b.state} in this job "
                f"({b.steps_done} of {b.steps} steps); try again when it is done"
            )
        burst = Burst(target, steps, max_s, out_dir, fallback_dir, loader)
        burst.install()
        _current = burst
        _arm_exit_hook()
        return burst, None


_exit_hook_armed = False


def _arm_exit_hook() -> None:
    global _exit_hook_armed
    if not _exit_hook_armed:
        _exit_hook_armed = True
        atexit.register(_stop_at_exit)


def _stop_at_exit() -> None:
    # An interpreter that exits with Kineto still recording dies in its
    # teardown (measured: a non-zero exit after the job's last line ran).
    # atexit runs on the main thread, usually the training thread: stop there.
    b = _current
    if b is None or b.state not in (ARMED, RUNNING):
        return
    with b._lock:
        b._uninstall()
        prof, b._prof = b._prof, None
        note = f"the job exited during the burst ({b.steps_done} of {b.steps} steps collected)"
        b._finish(error=note)
    if prof is not None:
        try:
            prof.stop()
        except Exception:
            pass


def release(burst: Burst) -> None:
    """The publisher delivered (or could not deliver) the result."""
    global _current
    with _lock:
        if _current is burst and burst.state == DONE:
            _current = None
