"""Where a job is stuck: the Python stacks of its threads and workers.

``gather_stacks(pid)`` is the one entry point (``dlwatch stacks``, and any
other consumer: it returns a JSON-able dict). It asks the job over its own
socket first (``control.request_stacks``: the job reads its own threads and
asks each DataLoader worker through the worker's row of shared counters, no
ptrace). What the job cannot give — a worker whose Python is not running (a
C call holding the GIL), or a job started without the hook — is read from
outside with ``py-spy dump --nonblocking`` when py-spy is installed and the
kernel lets us read that process (the checks ``dlwatch attach`` makes,
``ptrace.py``); otherwise the answer says which permission is missing.
Never signals, pauses or slows the job.
"""

from __future__ import annotations

import json
import linecache
import os
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

from dlwatch import qualnames
from dlwatch.collect import job_end, ptrace, spy
from dlwatch.collect.control import ProfileError, request_stacks
from dlwatch.collect.jobs import pid_alive
from dlwatch.diagnose import hang

PY_SPY_TIMEOUT_S = 10.0
# How long a thread's CPU time is watched to tell a call blocked in C (no CPU
# time) from one that runs: 50 clock ticks of a busy thread at 100 Hz.
CPU_SAMPLE_S = 0.5
# py-spy dumps run at once for a stall's unanswered processes (each a
# short-lived reader of one process's memory); more wait for a free slot.
PY_SPY_PARALLEL = 8
# What a one-shot snapshot waits for a stall's stacks to be completed: the
# dumps (side by side, each bounded), then the threads' CPU sample.
COMPLETE_BOUND_S = PY_SPY_TIMEOUT_S + CPU_SAMPLE_S + 1.0
_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def gather_stacks(pid: int, directory: str | None = None, py_spy: bool = True) -> dict[str, Any]:
    """The stacks of job ``pid``: ``{"pid", "source": "job"|"py-spy"|None,
    "reason", "t", "processes": [{"role", "pid", "threads": [{"name",
    "main", "frames": [[function, file, line], ...] outermost first, "src"}]
    | "error"}], "summary": [{"line", "kind", "at", ...}], "error"}``."""
    try:
        doc = request_stacks(pid, directory=directory)
        doc["source"] = "job"
    except ProfileError as e:
        if e.kind == "unsupported" and py_spy and pid_alive(pid):
            doc = {"pid": pid, "reason": "request", "processes": [], "source": "py-spy", "error": None}
            doc["processes"].append(_from_outside(pid, "trainer", str(e)))
            return complete(doc, py_spy=False)
        else:
            return {
                "pid": pid,
                "source": None,
                "processes": [],
                "summary": [],
                "error": str(e),
                "kind": e.kind,
            }
    doc = complete(doc, py_spy=py_spy)
    return doc


def complete(doc: dict[str, Any], py_spy: bool = True, sample_s: float = CPU_SAMPLE_S) -> dict[str, Any]:
    """``doc`` with what the job's own channel could not say filled in from
    outside: each process that answered with an ``error`` (a worker whose
    Python is not running) read by ``py-spy dump``, whose threads then
    replace the error (kept as ``channel_error``); every thread's /proc
    state and CPU over ``sample_s`` (what tells a call blocked in C from one
    that runs); the summary made again. A new document: ``doc`` is not
    changed (a snapshot may be reading it)."""
    out = dict(doc)
    procs = [dict(p) for p in doc.get("processes") or [] if isinstance(p, dict)]
    unanswered = [
        p for p in procs if p.get("error") and not p.get("threads") and as_pid(p.get("pid")) is not None
    ]
    readable: list[dict[str, Any]] = []
    root = as_pid(doc.get("pid"))
    for p in unanswered:
        pid = as_pid(p.get("pid")) or 0
        if py_spy and pid_alive(pid) and not in_tree(pid, root):
            # The job names the processes to read: only its own are read
            # (a job cannot point the monitor's py-spy at another process).
            p["error"] = f"{p['error']}; not read: PID {pid} is not a process of job {root}"
        elif py_spy and pid_alive(pid):
            readable.append(p)
        elif ended := how_it_ended(as_pid(p.get("pid")) or 0):
            p["error"] = ended
    for p, outside in zip(readable, _read_from_outside(readable)):
        if outside.get("threads"):
            p["channel_error"] = p.pop("error")
            p["threads"], p["via"] = outside["threads"], outside["via"]
        else:
            p["error"] = outside.get("error") or p["error"]
    # The CPU sample is what tells a plain call blocked in C from one that
    # runs: without such a frame, /proc's state alone (no wait) will do.
    plain = any(
        hang.frame_kind(t, str(p.get("role") or "trainer")) == hang.RUNNING
        for p in procs
        for t in p.get("threads") or []
        if isinstance(t, dict)
    )
    annotate_threads(
        [p for p in procs if in_tree(as_pid(p.get("pid")) or 0, root)], sample_s if plain else 0.0
    )
    out["processes"] = procs
    out["summary"] = hang.summarize(out)
    out["completed"] = True
    return out


# What the job's channel says of a worker that did not answer and is gone:
# it cannot tell a crash from a worker that finished its share (an uneven
# partition in a barrier hang), and reads like a crash.
_GONE = "the worker has exited or died"


def how_it_ended(pid: int) -> str | None:
    """For a process not yet reaped (a zombie), how it ended, from the wait
    status /proc keeps for it (the exit_code field of /proc/PID/stat): exit
    code 0 with no signal is a worker whose share was done, not a crash.
    None when /proc has no such status (reaped, or not a zombie)."""
    status = job_end.zombie_status(pid)
    if status is None:
        return None
    if status == 0:
        return "exited (its share done): exit code 0, no signal; not yet reaped by the loader"
    if os.WIFSIGNALED(status):
        return f"{_GONE}: killed by {job_end.signal_name(os.WTERMSIG(status))}, not yet reaped"
    if os.WIFEXITED(status):
        return f"{_GONE}: exit code {os.WEXITSTATUS(status)}, not yet reaped"
    return None


def in_tree(pid: int, root: int | None) -> bool:
    """Whether ``pid`` is ``root`` or descends from it (a worker, a
    forkserver's child, a pipeline's process)."""
    if root is None:
        return False
    if pid == root:
        return True
    try:
        return any(p.pid == root for p in psutil.Process(pid).parents())
    except (psutil.Error, OSError):
        return False


def as_pid(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else None


def _thread_stat(pid: int, tid: int) -> tuple[str, int] | None:
    """(state letter, user + system clock ticks) of one thread, from /proc."""
    try:
        with open(f"/proc/{pid}/task/{tid}/stat", "rb") as f:
            rest = f.read().rsplit(b")", 1)[1].split()
        return rest[0].decode(), int(rest[11]) + int(rest[12])
    except (OSError, IndexError, ValueError):
        return None


def annotate_threads(procs: list[dict[str, Any]], sample_s: float = CPU_SAMPLE_S) -> None:
    """Give each thread whose OS id is known (``tid``; a process's main
    thread is its pid) its /proc ``state`` and ``cpu_percent`` over
    ``sample_s``, in place (on copies: the threads are copied first)."""
    targets: list[tuple[dict[str, Any], int, int]] = []
    for p in procs:
        pid = as_pid(p.get("pid"))
        if pid is None:
            continue
        threads = [dict(t) for t in p.get("threads") or [] if isinstance(t, dict)]
        p["threads"] = threads if p.get("threads") is not None else p.get("threads")
        for t in threads:
            tid = as_pid(t.get("tid")) or (pid if t.get("main") else None)
            if tid is not None:
                targets.append((t, pid, tid))
    if not targets:
        return
    first = {(pid, tid): _thread_stat(pid, tid) for _t, pid, tid in targets}
    t0 = time.monotonic()
    if sample_s > 0:
        time.sleep(sample_s)
    span = max(time.monotonic() - t0, 1e-3)
    for t, pid, tid in targets:
        a, b = first.get((pid, tid)), _thread_stat(pid, tid)
        if b is None:
            continue
        t["state"] = b[0]
        if a is not None and sample_s > 0:
            t["cpu_percent"] = round(100.0 * (b[1] - a[1]) / _CLK_TCK / span, 1)


def _read_from_outside(procs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``_from_outside`` for each process, side by side: one after the other,
    a stall of many workers blocked in C took a dump's time per worker, and
    on a loaded box a one-shot snapshot (which waits one dump's bound) went
    out with the channel's errors instead."""
    if not procs:
        return []

    def read(p: dict[str, Any]) -> dict[str, Any]:
        return _from_outside(as_pid(p.get("pid")) or 0, p.get("role") or "worker", str(p["error"]))

    with ThreadPoolExecutor(min(PY_SPY_PARALLEL, len(procs)), thread_name_prefix="dlwatch-py-spy") as pool:
        return list(pool.map(read, procs))


def _from_outside(pid: int, role: str, why_not_inside: str) -> dict[str, Any]:
    """One process's stacks by ``py-spy dump``, or why not."""
    out: dict[str, Any] = {"role": role, "pid": pid}
    binary = spy.find()
    if binary is None:
        out["error"] = f"{why_not_inside}; {spy.INSTALL_HINT}"
        return out
    access = ptrace.check(pid)
    if not access.allowed:
        out["error"] = f"{why_not_inside}; py-spy may not read it: {access.line()}"
        return out
    try:
        for _ in range(2):
            proc = subprocess.run(
                [binary, "dump", "--pid", str(pid), "--json", "--nonblocking"],
                capture_output=True,
                text=True,
                timeout=PY_SPY_TIMEOUT_S,
            )
            # py-spy's version heuristic misses now and then on a Python
            # process (pyenv's 3.10): one more dump usually reads it.
            if proc.returncode == 0 or not spy.missed_the_version(proc.stderr):
                break
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = f"{why_not_inside}; py-spy dump failed: {e}"
        return out
    if proc.returncode != 0:
        _code, line = spy.failure(proc.stderr, pid, access)
        out["error"] = f"{why_not_inside}; {line}"
        return out
    try:
        out["threads"] = threads_from_py_spy(json.loads(proc.stdout), pid)
        out["via"] = "py-spy"
    except (ValueError, TypeError, KeyError) as e:
        out["error"] = f"{why_not_inside}; unreadable py-spy output: {e}"
    return out


def threads_from_py_spy(dump: Any, pid: int | None = None) -> list[dict[str, Any]]:
    """``py-spy dump --json`` (threads, frames innermost first) in the
    job's own format (frames outermost first). The main thread is the one
    named so, or (py-spy often has no names) the one whose OS id is ``pid``."""
    threads = []
    for t in dump if isinstance(dump, list) else []:
        frames: list[list[Any]] = []
        leaf: tuple[str, int] | None = None
        for f in t.get("frames") or []:  # innermost first
            if isinstance(f, dict):
                fn, line = str(f.get("filename")), int(f.get("line") or 0)
                # A Python 3.10 job's frames carry bare names: qualified from the source.
                frames.append([qualnames.qualify(str(f.get("name")), fn, line), fn, line])
                if leaf is None:
                    leaf = (str(f.get("filename")), int(f.get("line") or 0))
        frames.reverse()
        name = str(t.get("thread_name") or f"thread {t.get('thread_id')}")
        if name.startswith("dlwatch-"):
            continue  # our own threads in the job (the stack watcher), as the job leaves them out
        rec: dict[str, Any] = {
            "name": name,
            "main": name == "MainThread" or (pid is not None and t.get("os_thread_id") == pid),
            "daemon": None,
            "frames": frames,
            "src": linecache.getline(leaf[0], leaf[1]).strip()[:160] if leaf else "",
        }
        # py-spy's own view: whether the thread was on a CPU ("active"; its
        # "idle" is what --idle keeps) and whether it held the GIL.
        for key in ("active", "owns_gil"):
            if isinstance(t.get(key), bool):
                rec[key] = t[key]
        if as_pid(t.get("os_thread_id")) is not None:
            rec["tid"] = t["os_thread_id"]
        threads.append(rec)
    if pid is not None:
        _main_of_a_job_without_thread_ids(threads, pid)
    threads.sort(key=lambda th: (not th["main"], th["name"]))
    return threads


def _main_of_a_job_without_thread_ids(threads: list[dict[str, Any]], pid: int) -> None:
    """py-spy gives no OS thread ids for a Python 3.10 job (its thread
    states keep no native id; py-spy then calls every thread active). The
    main thread's OS id is the process's, so /proc still gives its state
    and CPU. Which thread is main: the one named so, or, in a process that
    never imported ``threading`` (no names), the one thread not started
    by it (an outermost frame other than ``threading``'s ``_bootstrap``)."""
    mains = [th for th in threads if th["main"]]
    if not mains:
        mains = [th for th in threads if not _started_by_threading(th["frames"])]
        if len(mains) != 1:
            return
        mains[0]["main"] = True
    for th in mains:
        th.setdefault("tid", pid)


def _started_by_threading(frames: list[list[Any]]) -> bool:
    return (
        bool(frames)
        and frames[0][0] in ("_bootstrap", "Thread._bootstrap")
        and os.path.basename(frames[0][1]) == "threading.py"
    )


class StacksCompleter:
    """The monitor's side of ``complete``: each new stacks document a job
    sends (at a stall) is completed in a thread of its own (py-spy and the
    CPU sample take a second), and the result replaces the connection's
    document on the collector's own thread (``step``), only if the job has
    sent no newer one meanwhile. Never blocks the collector."""

    def __init__(self, py_spy: bool = True) -> None:
        self.py_spy = py_spy
        self._lock = threading.Lock()
        self._started: dict[int, dict[str, Any]] = {}  # pid -> the document being (or last) completed
        self._done: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # pid -> (in, out)
        self._threads: dict[int, threading.Thread] = {}

    def step(self, conns: Any) -> None:
        """Apply finished completions, start one for each new document."""
        for c in list(conns):
            pid, doc = getattr(c, "pid", None), getattr(c, "stacks", None)
            if not isinstance(pid, int) or not isinstance(doc, dict):
                continue
            with self._lock:
                done = self._done.pop(pid, None)
            if done is not None and done[0] is doc:
                c.stacks = doc = done[1]
                self._started[pid] = doc
            if doc is self._started.get(pid) or pid in self._threads:
                continue
            self._started[pid] = doc
            th = threading.Thread(target=self._run, args=(pid, doc), name="dlwatch-stacks", daemon=True)
            self._threads[pid] = th
            th.start()
        for pid in [p for p, th in self._threads.items() if not th.is_alive()]:
            del self._threads[pid]

    def _run(self, pid: int, doc: dict[str, Any]) -> None:
        try:
            out = complete(doc, py_spy=self.py_spy)
        except Exception:  # a document we cannot complete stays as the job sent it
            return
        with self._lock:
            self._done[pid] = (doc, out)

    def wait(self, timeout: float) -> None:
        """Wait up to ``timeout`` for the completions under way (one-shot
        snapshots: their stacks should be the completed ones)."""
        end = time.monotonic() + timeout
        for th in list(self._threads.values()):
            th.join(max(0.0, end - time.monotonic()))
