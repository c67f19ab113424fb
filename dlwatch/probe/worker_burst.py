"""Trainer side of a worker profile burst: ask a loader's workers to sample
their fetches for a few seconds, then gather what they saw.

Why this way: the workers are the user's processes, and the one channel we
already have into each of them is its row of shared counters, which its
timed fetch touches anyway. The burst writes an id, a rate and a deadline
there; each worker starts its own sampler at its next fetch
(``worker_sampler.py``), so it needs no ptrace, no root, no signal, and
works in containers. Results come back as small files in the runtime
directory (0700, ours), one per worker, named for the burst id.

Followed: workers of iterators created during the burst (a non-persistent
loader's next epoch) are armed as their iterator is created. Reported: a
worker that sampled but left no file and is dead or a zombie (killed); a
worker that never fetched during the burst simply has no samples. The burst
ends at its deadline plus ``GRACE_S`` at the latest, whatever the workers do.
Runs on the publisher's thread (``poll``) and, for ``on_new_slots``, on the
thread that creates an iterator.
"""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from time import perf_counter as _clock

from dlwatch import rundir, wire
from dlwatch.probe import loop_follow, worker_sampler
from dlwatch.probe.worker_row import BURST_ACK, BURST_END_S, BURST_GEN, BURST_HZ, NFIELDS, PID

# After the deadline: workers finish their sample and write their file.
GRACE_S = 3.0
# Iterators of the loader armed during one burst (a new one per epoch).
MAX_TABLES = 256
MAX_FILE_BYTES = 8 << 20
# What goes on the wire: the distinct stacks with the most samples (the
# answer must fit in a frame; the rest is counted as "other").
MAX_RESULT_STACKS = 3000
# No burst lasts longer (60 s + the grace): an older result file is litter.
STALE_S = 120.0
RUNNING, DONE = "running", "done"

_lock = threading.Lock()
_current: WorkerBurst | None = None


class WorkerBurst:
    def __init__(self, st, seconds: float, hz: int, loader: dict) -> None:
        self.st = st
        self.loader_ids = {st.id}  # the loaders whose workers were armed
        self.loader = loader
        self.seconds = seconds
        self.hz = hz
        self.gen = secrets.randbits(62) | 1
        self.t0 = _clock()
        self.end = self.t0 + seconds
        self.tables: list[tuple[memoryview, memoryview, int]] = []
        self.participants: dict[int, int] = {}  # pid -> worker id
        self.pids_seen: dict[int, int] = {}
        self.state = RUNNING
        self.result: dict | None = None
        self.error: str | None = None
        self.cancelled = False
        self._last_status = 0.0

    def arm(self, view, fview, count: int) -> None:
        if view is None or len(self.tables) >= MAX_TABLES:
            return
        for i in range(count):
            b = i * NFIELDS
            fview[b + BURST_END_S] = self.end
            view[b + BURST_HZ] = self.hz
            view[b + BURST_GEN] = self.gen  # last: the worker reads the id first
        self.tables.append((view, fview, count))

    def _disarm(self) -> None:
        for view, _f, count in self.tables:
            for i in range(count):
                if view[i * NFIELDS + BURST_GEN] == self.gen:
                    view[i * NFIELDS + BURST_GEN] = 0

    def _scan(self) -> None:
        for view, _f, count in self.tables:
            for i in range(count):
                b = i * NFIELDS
                pid = int(view[b + PID])
                if pid:
                    self.pids_seen.setdefault(pid, i)
                if pid and view[b + BURST_ACK] == self.gen:
                    self.participants.setdefault(pid, i)

    def poll(self) -> list[dict]:
        """Messages for the monitor since the last poll."""
        if self.state == DONE:
            return []
        now = _clock()
        self._scan()
        if self.cancelled:
            self._disarm()
            self._cleanup()
            self.state = DONE
            return []
        if now < self.end:
            if now - self._last_status >= 1.0:
                self._last_status = now
                return [self.status()]
            return []
        directory = rundir.runtime_dir()
        missing = [
            p
            for p in self.participants
            if not os.path.exists(worker_sampler.result_path(directory, self.gen, p)) and running(p)
        ]
        if missing and now < self.end + GRACE_S:
            return []
        self._finish(directory)
        return [self.answer()]

    def status(self) -> dict:
        left = max(0.0, self.end - _clock())
        return wire.profile_status(
            "running", f"{len(self.participants)} workers sampling, {left:.0f} s left", loader=self.loader
        )

    def answer(self) -> dict:
        return wire.worker_profile_result(self.result or {}, self.error)

    def _finish(self, directory: str) -> None:
        self._disarm()
        workers = []
        merged: dict[tuple, int] = {}
        frames: list[list] = []
        findex: dict[tuple, int] = {}
        src: dict[str, str] = {}
        other = 0
        for pid, wid in sorted(self.participants.items(), key=lambda kv: kv[1]):
            path = worker_sampler.result_path(directory, self.gen, pid)
            doc = read_result(path)
            if doc is None:
                why = "killed or exited before it could report" if not running(pid) else "did not report"
                workers.append({"pid": pid, "id": wid, "reported": False, "note": why})
                continue
            local = []
            for fr in doc.get("frames") or []:
                k = (str(fr[0]), str(fr[1]), int(fr[2]))
                if k not in findex:
                    findex[k] = len(frames)
                    frames.append(list(k))
                local.append(findex[k])
            for n, idx, line in doc.get("stacks") or []:
                key = (*(local[i] for i in idx), int(line))
                merged[key] = merged.get(key, 0) + int(n)
            for k, text in (doc.get("src") or {}).items():
                i, _, line = k.partition(":")
                src.setdefault(f"{local[int(i)]}:{line}", str(text))
            other += int(doc.get("other") or 0)
            workers.append(
                {
                    "pid": pid,
                    "id": wid,
                    "reported": True,
                    "samples": int(doc.get("samples") or 0),
                    "in_fetch": int(doc.get("in_fetch") or 0),
                    "wall_s": doc.get("wall_s"),
                    "sampler_cpu_s": doc.get("sampler_cpu_s"),
                }
            )
        ranked = sorted(merged.items(), key=lambda kv: -kv[1])
        keep = MAX_RESULT_STACKS
        while True:
            self.result = self._result(ranked[:keep], frames, src, other, workers, ranked[keep:])
            # The answer is one wire frame: halve the rarest stacks until it fits.
            if keep <= 1 or len(json.dumps(self.result)) < wire.MAX_FRAME_BYTES * 3 // 4:
                break
            keep //= 2
        if not self.participants:
            self.error = (
                f"no worker of {self.loader.get('name')} fetched a batch in {self.seconds:g} s: "
                "nothing sampled"
            )
        self._cleanup(directory)
        self.state = DONE

    def _result(self, ranked, frames, src, other, workers, rest) -> dict:
        stacks = [[n, list(k[:-1]), k[-1]] for k, n in ranked]
        used = {i for _n, idx, _l in stacks for i in idx}
        return {
            "loader": self.loader,
            "loaders_followed": len(self.loader_ids),
            "seconds": self.seconds,
            "hz": self.hz,
            "window_mono_ns": [int(self.t0 * 1e9), int(self.end * 1e9)],
            "done_mono_ns": time.perf_counter_ns(),
            "workers": workers,
            "workers_seen": len(self.pids_seen),
            "frames": [fr if i in used else None for i, fr in enumerate(frames)],
            "stacks": stacks,
            "src": {k: v for k, v in src.items() if int(k.split(":")[0]) in used},
            "other": other + sum(n for _k, n in rest),
        }

    def _cleanup(self, directory: str | None = None) -> None:
        directory = directory or rundir.runtime_dir()
        for pid in set(self.participants) | set(self.pids_seen):
            path = worker_sampler.result_path(directory, self.gen, pid)
            for p in (path, path + ".tmp"):
                try:
                    os.unlink(p)
                except OSError:
                    pass


def read_result(path: str, limit: int = MAX_FILE_BYTES) -> dict | None:
    """A worker's JSON result file, or None (missing, too big, not JSON)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            return None
        doc = json.loads(data)
        return doc if isinstance(doc, dict) else None
    except (OSError, ValueError):
        return None


def running(pid: int) -> bool:
    """Alive and not a zombie (a killed worker stays one until torch reaps it)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] not in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def remove_stale(directory: str, prefix: str = "wprof-") -> None:
    """Files of a worker that started sampling just as an earlier burst was
    being gathered (it reported after the trainer had looked), or (prefix
    ``wstacks-``) answered a stack request too late."""
    now = time.time()
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            path = os.path.join(directory, name)
            try:
                if now - os.lstat(path).st_mtime > STALE_S:
                    os.unlink(path)
            except OSError:
                pass


def start(st, seconds: float, hz: int, loader: dict) -> WorkerBurst:
    global _current
    remove_stale(rundir.runtime_dir())
    b = WorkerBurst(st, seconds, hz, loader)
    with _lock:
        _current = b
        b.arm(st.slots_view, st.slots_fview, st.num_workers)
    return b


def release(b: WorkerBurst) -> None:
    global _current
    with _lock:
        if _current is b:
            _current = None


def on_new_slots(st) -> None:
    """A new iterator: arm its workers if the burst follows its loader, or
    its loader is newer and of the same shape (a DataLoader the loop builds
    every pass: loop_follow.py). An eval's loader of that shape is armed
    too: the same dataset class, the same code sampled."""
    b = _current
    if b is None or b.state != RUNNING or (b.st is not st and not loop_follow.successor(b.st, st)):
        return
    with _lock:
        if _current is b and b.state == RUNNING:
            b.loader_ids.add(st.id)
            b.arm(st.slots_view, st.slots_fview, st.num_workers)
