"""Attached jobs: PyTorch jobs started without the hook, sampled from outside.

``measure`` is ``dlwatch attach --pid P --seconds S``: one py-spy recording
per job over S seconds, the job's processes sampled from /proc at both ends
(CPU, run-queue wait, RSS/USS, threads: the samplers of the hooked jobs), and
one snapshot built from both. ``LiveAttach`` is the live view's
(``dlwatch --attach P``): back-to-back one-second recordings in a thread of
its own, the last few merged into the job's figures.

Attaching never writes into the job and never pauses it (``spy.py``); what
is read is the job's memory (by py-spy) and /proc.
"""

from __future__ import annotations

import glob
import os
import shlex
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import cast

import psutil

from dlwatch.collect import ptrace, sampled, spy
from dlwatch.collect.model import HISTORY_POINTS
from dlwatch.collect.stacks import Stack, parse_raw
from dlwatch.snapshot import Hint

# The live view's recordings: py-spy takes whole seconds.
CHUNK_S = 1.0
# The live figures cover at least this much (the diagnosis judges 3 s): about
# 300 samples of the training thread, a ±6-point interval at 50 %.
LIVE_MIN_WINDOW_S = 3.0
KEEP_CHUNKS = 10
# py-spy needs a moment to attach and to write its file after the span.
RECORD_GRACE_S = 15.0
# How often the job's process tree is listed during a recording, to tell a
# replaced worker from one more (sampled.merge_slots): one listing reads
# /proc/*/stat, ~1.7 ms of CPU for ~100 processes here, so ~0.7 % of a core.
POLL_S = 0.25
# The live view forgets processes not seen for this long (bounded memory).
FORGET_S = 60.0


def identity(pid: int) -> dict:
    """What /proc says about a job: command line, rank (torchrun's
    environment), torch version (from the library it has mapped)."""
    out: dict = {"cmdline": "", "torch_version": None, "age_s": None, "torch_loaded": False}
    try:
        p = psutil.Process(pid)
        out["cmdline"] = shlex.join(p.cmdline())
        out["age_s"] = round(max(0.0, time.time() - p.create_time()), 1)
    except (psutil.Error, OSError):
        return out
    env = _environ(pid)
    for key, name in (("rank", "RANK"), ("local_rank", "LOCAL_RANK"), ("world_size", "WORLD_SIZE")):
        try:
            out[key] = int(env[name]) if name in env else None
        except ValueError:
            out[key] = None
    out["run_id"] = env.get("TORCHELASTIC_RUN_ID")
    out["cuda_visible_devices"] = env.get("CUDA_VISIBLE_DEVICES")
    out["cuda_device_order"] = env.get("CUDA_DEVICE_ORDER")
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    out["master"] = f"{addr}:{port}" if addr and port else None
    torch_dir = _torch_dir(pid)
    if torch_dir is not None:
        out["torch_loaded"] = True
        out["torch_version"] = torch_version(torch_dir)
    return out


def _environ(pid: int) -> dict[str, str]:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    env = {}
    for item in data.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def _torch_dir(pid: int) -> str | None:
    """The torch package directory a process has mapped its library from."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                i = line.find("/torch/lib/libtorch")
                if i >= 0:
                    return line[line.index("/") : i + len("/torch")]
    except (OSError, ValueError):
        pass
    return None


def torch_version(torch_dir: str) -> str | None:
    """From the dist-info beside the package (``torch-2.13.0.dist-info``)."""
    site = os.path.dirname(torch_dir)
    for d in sorted(glob.glob(os.path.join(site, "torch-*.dist-info"))):
        return os.path.basename(d)[len("torch-") : -len(".dist-info")]
    return None


def descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except (psutil.Error, OSError):
        return []


def worker_facts(pid: int, worker_pids: Iterable[int]) -> tuple[dict[int, float], dict[int, str]]:
    """Start order (create time) and start method of each worker process."""
    order: dict[int, float] = {}
    methods: dict[int, str] = {}
    try:
        root_cmd = " ".join(psutil.Process(pid).cmdline())
    except (psutil.Error, OSError):
        root_cmd = ""
    for w in worker_pids:
        try:
            p = psutil.Process(w)
            order[w] = p.create_time()
            methods[w] = sampled.start_method(root_cmd, " ".join(p.cmdline()), p.ppid(), pid)
        except (psutil.Error, OSError):
            continue
    return order, methods


class Lifetimes:
    """When each descendant of the attached PIDs was first and last seen
    alive, from listings of their process trees every ``POLL_S`` seconds in
    a thread of its own (``start``/``stop``, or ``with``)."""

    def __init__(self, roots: Iterable[int], every_s: float = POLL_S) -> None:
        self.roots = list(roots)
        self.every_s = every_s
        # pid -> (first seen, last seen, create_time)
        self._seen: dict[int, tuple[float, float, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll(self) -> None:
        # Both ends are times of listings, on one clock: two workers overlap
        # when one listing saw both. (A process's create_time is counted from
        # boot time rounded to the second: it cannot be set against now.)
        now = time.monotonic()
        found = []
        for root in self.roots:
            for p in descendants(root):
                try:
                    found.append((p.pid, p.create_time()))
                except (psutil.Error, OSError):
                    continue
        with self._lock:
            for pid, created in found:
                old = self._seen.get(pid)
                # A reused PID is a new process: its create_time differs.
                if old is None or old[2] != created:
                    self._seen[pid] = (now, now, created)
                else:
                    self._seen[pid] = (old[0], now, created)
            for pid in [p for p, (_, last, _) in self._seen.items() if now - last > FORGET_S]:
                del self._seen[pid]

    def lives(self) -> dict[int, tuple[float, float]]:
        """Each process's (first seen, last seen alive), monotonic seconds."""
        with self._lock:
            return {pid: (first, last) for pid, (first, last, _) in self._seen.items()}

    def start(self) -> None:
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="dlwatch-attach-tree", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            try:
                self.poll()
            except Exception:
                pass  # a listing that fails costs one point of the lifetimes
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> Lifetimes:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


@dataclass
class Attached:
    """One attached job's recording, as ``measure`` and ``LiveAttach`` hold it."""

    pid: int
    stacks: list[Stack]
    span_s: float
    exited: bool
    error: tuple[int, str] | None = None
    # CLOCK_MONOTONIC ns around the recording (py-spy starting to sampling ended).
    span_ns: tuple[int, int] | None = None
    # Each descendant's (first, last seen alive), monotonic seconds (Lifetimes).
    lives: dict[int, tuple[float, float]] | None = None

    def summary(self) -> sampled.Sampled:
        s = sampled.summarize(self.stacks, self.pid)
        s.workers = sampled.merge_slots(s.workers, self.lives)
        return s


def preflight(pid: int) -> tuple[int, str] | None:
    """Why ``pid`` cannot be attached to (exit code, line), or None."""
    access = ptrace.check(pid)
    if not access.allowed:
        return access.code, f"cannot attach to PID {pid}: {access.line()}"
    if not ptrace.looks_like_python(pid):
        return ptrace.EXIT_NOT_PYTHON, f"PID {pid} is not a Python process: nothing to attach to"
    if _torch_dir(pid) is None:
        return ptrace.EXIT_NOT_PYTHON, (
            f"PID {pid} is a Python process without torch (no libtorch loaded): not a PyTorch job "
            "(a job that is still starting loads it within seconds)"
        )
    if spy.find() is None:
        return ptrace.EXIT_NO_SAMPLER, spy.INSTALL_HINT
    return None


def record(pids: list[int], seconds: float) -> list[Attached]:
    """One recording of each job, all at once, over ``seconds``."""
    binary = spy.find()
    assert binary is not None, "preflight() checks for py-spy"
    t0 = time.monotonic_ns()
    out = []
    with Lifetimes(pids) as tree:
        recs = [spy.Recording(binary, pid, seconds) for pid in pids]
        for rec in recs:
            res = rec.wait(seconds + RECORD_GRACE_S)
            t1 = time.monotonic_ns()
            stacks, _bad = parse_raw(res.text, rec.pid)
            # py-spy samples for --duration from the moment it has attached,
            # which on a loaded box is a good part of a second after it started:
            # the span is the last --duration before it exited.
            start = t0 if res.exited else max(t0, t1 - int(rec.seconds * 1e9))
            out.append(Attached(rec.pid, stacks, (t1 - start) / 1e9, res.exited, res.error, (start, t1)))
        tree.poll()  # a worker started since the last listing
    lives = tree.lives()
    for att in out:
        att.lives = lives
    return out


def job_from(att: Attached, ident: dict, procs: dict) -> dict:
    """The snapshot's job for an attached recording."""
    s = att.summary()
    order, methods = worker_facts(att.pid, [w.pid for w in s.workers])
    state, reason = "live", ""
    if att.exited:
        state, reason = "exited", f"the job exited during the attach (sampled {att.span_s:.1f} s)"
    job = sampled.job_dict(
        ident,
        s,
        procs,
        span_s=att.span_s,
        state=state,
        state_reason=reason,
        worker_order=order,
        start_methods=methods,
    )
    if att.span_ns is not None:
        job["sampling"]["span_mono_ns"] = list(att.span_ns)
    return job


class LiveAttach:
    """Keeps sampling one job in a thread of its own for the live view."""

    def __init__(self, pid: int, chunk_s: float = CHUNK_S) -> None:
        self.pid = pid
        self.chunk_s = chunk_s
        self.ident = identity(pid)
        self.error: tuple[int, str] | None = None
        self.exited = False
        self._chunks: deque[tuple[float, Attached]] = deque(maxlen=KEEP_CHUNKS)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rec: spy.Recording | None = None
        self._thread: threading.Thread | None = None
        self._workers: list[int] = []
        self._tree = Lifetimes([pid])
        # The data wait of each recording, oldest first: the view's history
        # graph (about a point a second, as a hooked job's).
        self._history: deque[float | None] = deque(maxlen=HISTORY_POINTS)

    def start(self) -> None:
        if self._thread is None:
            self._tree.start()
            self._thread = threading.Thread(target=self._run, name=f"dlwatch-attach-{self.pid}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        rec = self._rec
        if rec is not None:
            rec.stop()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            self._thread = None
        self._tree.stop()

    def _run(self) -> None:
        binary = spy.find()
        if binary is None:
            self.error = (ptrace.EXIT_NO_SAMPLER, spy.INSTALL_HINT)
            return
        while not self._stop.is_set():
            t0 = time.monotonic()
            self._rec = spy.Recording(binary, self.pid, self.chunk_s)
            res = self._rec.wait(self.chunk_s + RECORD_GRACE_S)
            self._rec = None
            stacks, _ = parse_raw(res.text, self.pid)
            att = Attached(
                self.pid, stacks, time.monotonic() - t0, res.exited, res.error, lives=self._tree.lives()
            )
            with self._lock:
                if stacks:
                    self._chunks.append((time.monotonic(), att))
                    summary = att.summary()
                    self._workers = [w.pid for w in summary.workers]
                    self._history.append(summary.data_wait.fraction if summary.data_wait else None)
                if res.error is not None and not self._chunks:
                    self.error = res.error
                if res.exited or res.error is not None:
                    self.exited = True
            if self.exited:
                return

    def worker_pids(self) -> list[int]:
        with self._lock:
            return list(self._workers)

    def job(self, procs: dict, window_s: float) -> dict:
        """The job over the last ``max(window_s, LIVE_MIN_WINDOW_S)`` seconds
        of recordings (at least the newest one)."""
        span_wanted = max(window_s, LIVE_MIN_WINDOW_S)
        with self._lock:
            chunks = list(self._chunks)
            exited, error = self.exited, self.error
            history = list(self._history)
        picked: list[Attached] = []
        span = 0.0
        for _, att in reversed(chunks):
            if picked and span >= span_wanted - 0.5:
                break
            picked.append(att)
            span += att.span_s
        stacks = [st for a in picked for st in a.stacks]
        merged = Attached(self.pid, stacks, span, exited, lives=self._tree.lives())
        job = job_from(merged, self.ident, procs)
        for ld in job["loaders"]:
            ld["history"] = {"data_wait_fraction": history}
        if error is not None:
            job["state"], job["state_reason"] = "unreachable", error[1]
        elif exited:
            job["state"], job["state_reason"] = "exited", "the process has exited"
        elif not picked:
            job["state"], job["state_reason"] = "connecting", "sampling the first second"
        return job


def _tree(pids: Iterable[int]) -> set[int]:
    out = set(pids)
    for p in list(out):
        out.update(c.pid for c in descendants(p))
    return out


def _gpu_sampler(seconds: float):
    """NVML's sampler, or None where it cannot start (no driver): the
    snapshot then says why in ``gpu_status``. Its one read, at the end,
    averages NVML's samples over the ``seconds`` recorded."""
    try:
        from dlwatch.collect.gpu import GpuSampler

        return GpuSampler(first_window_s=seconds)
    except Exception:
        return None


def measure(pids: list[int], seconds: float) -> tuple[dict, list[tuple[int, str]]]:
    """``dlwatch attach``: the snapshot of ``pids`` sampled over ``seconds``,
    and the (exit code, line) of each job that could not be sampled at all.
    Process, run-queue and host figures cover the same span as the stacks
    (sampled once before the recording starts and once after it ends)."""
    from dlwatch.collect import model
    from dlwatch.collect.host import HostSampler
    from dlwatch.collect.procs import ProcSampler
    from dlwatch.collect.schedstat import SchedSampler, add_runqueue
    from dlwatch.diagnose import evaluate

    procs, sched, host, gpu = ProcSampler(), SchedSampler(), HostSampler(), _gpu_sampler(seconds)
    idents = {p: identity(p) for p in pids}
    before = _tree(pids)
    procs.sample(sorted(before), main_pids=pids)
    sched.sample(sorted(before))
    host.sample()
    atts = record(pids, seconds)
    after = sorted(_tree(pids) | before)
    figures = add_runqueue(procs.sample(after, main_pids=pids, force_uss=True), sched.sample(after))
    status, gpus = gpu.sample() if gpu is not None else ("n/a: NVML not available", [])
    jobs = [job_from(a, idents[a.pid], figures) for a in atts if a.error is None]
    snap = model.snapshot_dict(
        now=time.time(),
        window_s=seconds,
        host=host.sample(),
        gpu_status=status,
        gpus=gpus,
        conns=[],
        procs=figures,
        runtime_dir="",
        runtime_dir_error=None,
        errors=[],
        attached=jobs,
    )
    snap["hints"] = cast(list[Hint], evaluate(snap))
    return dict(snap), [a.error for a in atts if a.error is not None]
