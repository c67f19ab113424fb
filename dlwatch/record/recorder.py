"""``dlwatch record``: the live collector, headless, writing what it builds.

The recorder is one more consumer of ``Monitor``: the same builds, the same
default stateful ``Diagnoser`` (hysteresis, the memory-growth slope over
minutes of samples), so a hint appears in a recording exactly when it would
have appeared on screen. Each line is the snapshot as built
(``fileformat.compact``); the recorder adds nothing of its own to it.

Stopping: ``stop()`` (a signal handler calls it), ``duration_s``, or
``until()`` saying so (``dlwatch record --pid`` stops when the job has
exited; ``dlwatch run --record`` when its command has). The last snapshot
before the stop is written, the file is closed, and nothing is left torn.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, InitVar, dataclass
from typing import Any

from dlwatch import __version__
from dlwatch.diagnose import hang
from dlwatch.record import fileformat
from dlwatch.snapshot import SCHEMA_VERSION, SnapshotSource, as_int, records

# How many builds the recorder may fall behind before a line is written
# anyway: a missed notification (none is lost, but be safe) costs a line's
# delay, never a stall.
WAKE_SLACK = 2.0


@dataclass
class RecordStats:
    lines: int = 0  # snapshots written
    bytes: int = 0  # uncompressed
    jobs: frozenset[int] = frozenset()
    elapsed_s: float = 0.0
    reason: str = ""


@dataclass(eq=False)
class Recorder:
    """Write ``monitor``'s snapshots to ``path`` until stopped.

    ``keep_job(pid)`` picks the jobs that go into the file (all by default);
    hints about jobs that are left out are left out too, hints about no job
    (the host's) stay. The monitor is started and stopped here.
    """

    path: str
    monitor: SnapshotSource
    _: KW_ONLY
    interval: float
    window_s: float
    duration_s: float | None = None
    until: Callable[[dict[str, Any]], str | None] | None = None
    keep_job: Callable[[int], bool] | None = None
    overwrite: InitVar[bool] = False
    meta: dict[str, Any] | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self, overwrite: bool) -> None:
        self.meta = self.meta or {}
        self.stats = RecordStats()
        self._stop = threading.Event()
        self._stop_reason = ""
        self._built = threading.Event()
        # Opened here, so that a path that cannot be written is an error
        # before any sampling starts.
        self._out = fileformat.open_write(self.path, exclusive=not overwrite)
        self.stacks_path = stacks_path(self.path)
        # (pid, the stacks' time, completed from outside): a stall's stacks
        # come twice, as the job sent them and completed (py-spy's threads
        # for a worker that could not answer, collect.hang.complete).
        self._stacks_seen: set[tuple[int, float, bool]] = set()

    def discard(self) -> None:
        """Close and remove the file without recording (the job never started)."""
        self.monitor.stop()
        self._out.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def stop(self, reason: str = "stopped") -> None:
        """End the recording (safe from a signal handler or another thread)."""
        self._stop_reason = self._stop_reason or reason
        self._stop.set()
        self._built.set()

    def run(self) -> RecordStats:
        started = self.clock()
        self._write(
            fileformat.header(
                schema_version=SCHEMA_VERSION,
                dlwatch_version=__version__,
                start_time=round(time.time(), 3),
                interval_s=self.interval,
                window_s=self.window_s,
                host={
                    "hostname": socket.gethostname(),
                    "platform": platform.platform(),
                    "python": platform.python_version(),
                    "logical_cpus": os.cpu_count(),
                },
                **(self.meta or {}),
            )
        )
        jobs: set[int] = set()
        self.monitor.subscribe(self._built.set)
        self.monitor.start()
        last = None
        reason = ""
        try:
            while True:
                self._built.wait(self.interval * WAKE_SLACK)
                self._built.clear()
                snap = self.monitor.latest()
                if snap is not None and snap is not last and not self._stop.is_set():
                    last = snap
                    kept = self._kept(snap)
                    jobs.update(p for p in (as_int(j.get("pid")) for j in kept["jobs"]) if p is not None)
                    self._write(fileformat.compact(kept))
                    self.stats.lines += 1
                    self._keep_stacks(kept)
                    if self.until is not None:
                        reason = self.until(kept) or ""
                if self._stop.is_set():
                    reason = self._stop_reason
                elif self.duration_s is not None and self.clock() - started >= self.duration_s:
                    reason = f"--duration {self.duration_s:g} s reached"
                if reason:
                    break
        finally:
            self.monitor.stop()
            self._out.close()
            self.stats.jobs = frozenset(jobs)
            self.stats.elapsed_s = self.clock() - started
            self.stats.reason = reason or self._stop_reason or "ended"
        return self.stats

    def _kept(self, snap: dict[str, Any]) -> dict[str, Any]:
        if self.keep_job is None:
            return snap
        keep = {
            p
            for j in records(snap.get("jobs"))
            if (p := as_int(j.get("pid"))) is not None and self.keep_job(p)
        }
        return dict(
            snap,
            jobs=[j for j in records(snap.get("jobs")) if as_int(j.get("pid")) in keep],
            hints=[
                h for h in records(snap.get("hints")) if h.get("job_pid") is None or h.get("job_pid") in keep
            ],
        )

    def _keep_stacks(self, snap: dict[str, Any]) -> None:
        """A job's new stacks (a stall's, or asked for), as text in a file
        beside the recording: they outlive the job, readable without dlwatch."""
        for job in records(snap.get("jobs")):
            st, pid = job.get("stacks"), as_int(job.get("pid"))
            if not isinstance(st, dict) or pid is None or not isinstance(st.get("t"), (int, float)):
                continue
            key = (pid, float(st["t"]), st.get("completed") is True)
            if key in self._stacks_seen:
                continue
            self._stacks_seen.add(key)
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st["t"]))
            how = st.get("reason") or "request"
            if key[2] and any(p.get("via") for p in records(st.get("processes"))):
                how += ", completed by py-spy"
            text = [f"=== job {pid} at {when} ({how})", *hang.render(st), "", ""]
            try:
                with open(self.stacks_path, "a", encoding="utf-8") as f:
                    f.write("\n".join(text))
            except OSError:
                pass  # the recording itself goes on

    def _write(self, obj: dict[str, Any]) -> None:
        line = json.dumps(obj, separators=(",", ":"), default=str) + "\n"
        self._out.write(line)
        # Every line reaches the file now: a recorder killed at any moment
        # leaves at most one torn line (gzip: a sync flush per line).
        self._out.flush()
        self.stats.bytes += len(line)


def stacks_path(path: str) -> str:
    """Where a recording's stacks go: ``run.jsonl.gz`` -> ``run.stacks.txt``."""
    base = path
    for suffix in (".gz", ".jsonl", ".json"):
        base = base.removesuffix(suffix)
    return base + ".stacks.txt"


def default_path(compress: bool = True, now: float | None = None) -> str:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    return f"dlwatch-{stamp}.jsonl" + (".gz" if compress else "")
