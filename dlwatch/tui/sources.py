"""Where the TUI gets snapshots from.

The app only ever calls ``latest()`` from its event loop, so a source must
answer from memory; the real one (``dlwatch.collect``) samples in its own thread.
The sources here serve tests and recorded streams.
"""

from __future__ import annotations

import copy
import json
import threading
from typing import Protocol, runtime_checkable


@runtime_checkable
class Source(Protocol):
    """What the app needs. A source may also have ``subscribe(callback)``:
    the app then redraws when the callback (from any thread) says a new
    snapshot is ready, instead of waiting for its next timer tick."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def latest(self) -> dict | None: ...
    def dismiss(self, job_pid: int) -> None: ...


def _without_jobs(snapshot: dict | None, dismissed: set[int]) -> dict | None:
    if snapshot is None or not dismissed or not isinstance(snapshot, dict):
        return snapshot
    jobs = snapshot.get("jobs")
    if not isinstance(jobs, list):
        return snapshot
    out = dict(snapshot)
    out["jobs"] = [j for j in jobs if not (isinstance(j, dict) and j.get("pid") in dismissed)]
    return out


class StaticSource:
    """Serves a list of snapshots: each ``latest()`` call returns the next one
    and the last one repeats forever. ``advance=False`` keeps the first until
    ``step()`` or ``push()`` is called, which makes pilot tests deterministic.

    ``dismiss(pid)`` hides that job from every later answer, as the real
    source forgets an exited job.
    """

    def __init__(self, snapshots: list[dict | None] | None = None, *, advance: bool = False) -> None:
        self._snapshots: list[dict | None] = list(snapshots or [])
        self._index = 0
        self._advance = advance
        self._lock = threading.Lock()
        self.started = False
        self.stopped = False
        self.dismissed: set[int] = set()
        self.calls = 0

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        self.stopped = True

    def latest(self) -> dict | None:
        with self._lock:
            self.calls += 1
            if not self._snapshots:
                return None
            snap = self._snapshots[min(self._index, len(self._snapshots) - 1)]
            if self._advance and self._index < len(self._snapshots) - 1:
                self._index += 1
            return _without_jobs(snap, self.dismissed)

    def step(self) -> None:
        """Move to the next snapshot (the last one stays)."""
        with self._lock:
            self._index = min(self._index + 1, max(0, len(self._snapshots) - 1))

    def push(self, snapshot: dict | None) -> None:
        """Append a snapshot and make it the current one."""
        with self._lock:
            self._snapshots.append(snapshot)
            self._index = len(self._snapshots) - 1

    def dismiss(self, job_pid: int) -> None:
        with self._lock:
            self.dismissed.add(job_pid)


class ReplaySource:
    """Replays a JSON-lines file of snapshots (one JSON object per line), one
    snapshot per ``period`` seconds in a background thread, then holds the
    last one (or starts over with ``loop=True``). Lines that are not JSON
    objects are skipped and counted in ``skipped``: a truncated recording
    still plays.
    """

    def __init__(self, path: str, *, period: float = 1.0, loop: bool = False) -> None:
        self.path = path
        self.period = period
        self.loop = loop
        self.skipped = 0
        self._snapshots = self._load(path)
        self._index = -1
        self._current: dict | None = None
        self._dismissed: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _load(self, path: str) -> list[dict]:
        out = []
        with open(path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    self.skipped += 1
                    continue
                if isinstance(obj, dict):
                    out.append(obj)
                else:
                    self.skipped += 1
        return out

    def __len__(self) -> int:
        return len(self._snapshots)

    def start(self) -> None:
        if self._thread is not None:
            return
        self._advance()
        self._thread = threading.Thread(target=self._run, name="dlwatch-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            self._advance()

    def _advance(self) -> None:
        if not self._snapshots:
            return
        with self._lock:
            nxt = self._index + 1
            if nxt >= len(self._snapshots):
                if not self.loop:
                    return
                nxt = 0
            self._index = nxt
            # Built once here, off the UI thread; latest() hands out this dict.
            self._current = _without_jobs(copy.deepcopy(self._snapshots[nxt]), self._dismissed)

    def latest(self) -> dict | None:
        with self._lock:
            return self._current

    def dismiss(self, job_pid: int) -> None:
        with self._lock:
            self._dismissed.add(job_pid)
            self._current = _without_jobs(self._current, self._dismissed)
