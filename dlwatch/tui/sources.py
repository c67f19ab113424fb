"""Where the TUI gets snapshots from.

The app only ever calls ``latest()`` from its event loop, so a source must
answer from memory; the real one (``dlwatch.collect``) samples in its own thread.
The sources here serve tests (``StaticSource``) and recordings (``ReplaySource``,
what ``dlwatch replay`` plays).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from dlwatch.snapshot import SnapshotSource


@runtime_checkable
class ReplayControls(SnapshotSource, Protocol):
    """A source that plays a recording: what the replay keys call."""

    replay: bool
    speed: float

    def status(self) -> str: ...
    def toggle_pause(self) -> None: ...
    def set_speed(self, speed: float) -> None: ...
    def step(self, lines: int) -> None: ...
    def seek(self, seconds: float) -> None: ...
    def jump_hint(self, direction: int = 1) -> tuple[str, ...] | None: ...


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

    def subscribe(self, callback: Callable[[], None]) -> None:
        """Nothing to announce: the app's timer polls."""

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
    """Plays a recording (``dlwatch record``'s file, or any JSON Lines of
    snapshots) in its own time: each snapshot is shown for as long as it
    lasted when recorded, divided by ``speed``; the last one then holds (or
    play starts over with ``loop=True``).

    It has the controls the live view's replay keys call (``toggle_pause``,
    ``seek``, ``step``, ``jump_hint``, ``set_speed``) and ``status()`` for the
    status line; ``replay = True`` is how the app tells it from a live source.
    A recording leaves out each loader's and GPU's 120-point history (the
    file is the history): it is rebuilt here from the lines before, so the
    history graphs draw as they did live.
    """

    replay = True
    HISTORY_POINTS = 120
    # However long a gap between two recorded lines (a stalled recorder, a
    # suspended laptop), replay moves on after this long at speed 1.
    MAX_GAP_S = 5.0

    def __init__(
        self,
        snapshots: list[dict],
        *,
        speed: float = 1.0,
        loop: bool = False,
        name: str = "",
        skipped: int = 0,
    ) -> None:
        self.name = name
        self.loop = loop
        self.skipped = skipped
        self.warnings: list[str] = []
        self.speed = speed if speed > 0 else 1.0
        self._snapshots = [s for s in snapshots if isinstance(s, dict)]
        self._times = [_time(s) for s in self._snapshots]
        self._index = -1
        self._paused = False
        self._current: dict | None = None
        self._dismissed: set[int] = set()
        self._listeners: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        # Where each hint id starts showing (not shown on the line before):
        # what "jump to the next hint" jumps to.
        self._onsets: list[tuple[int, tuple[str, ...]]] = []
        before: set[Any] = set()
        for i, snap in enumerate(self._snapshots):
            ids = {h.get("id") for h in snap.get("hints") or () if isinstance(h, dict) and h.get("id")}
            new = sorted(str(x) for x in ids - before)
            if new:
                self._onsets.append((i, tuple(new)))
            before = ids

    @classmethod
    def from_file(cls, path: str, **kwargs) -> ReplaySource:
        """Raises OSError when the file cannot be read; bad lines are skipped."""
        from dlwatch.record.reader import read

        rec = read(path)
        src = cls(rec.snapshots, name=rec.name, **kwargs)
        src.warnings = rec.warnings
        return src

    def __len__(self) -> int:
        return len(self._snapshots)

    # ------------------------------------------------------------ the Source protocol

    def start(self) -> None:
        if self._thread is not None:
            return
        self._show(0)
        self._thread = threading.Thread(target=self._run, name="dlwatch-replay", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None:
            t.join(timeout=2)

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def latest(self) -> dict | None:
        with self._lock:
            return self._current

    def dismiss(self, job_pid: int) -> None:
        with self._lock:
            self._dismissed.add(job_pid)
            self._current = _without_jobs(self._current, self._dismissed)

    # ------------------------------------------------------------ controls

    @property
    def paused(self) -> bool:
        return self._paused

    @property
    def index(self) -> int:
        return self._index

    def toggle_pause(self) -> None:
        with self._lock:
            self._paused = not self._paused
            if not self._paused and self._index >= len(self._snapshots) - 1 and self.loop:
                self._index = -1
        self._wake.set()
        self._notify()

    def set_speed(self, speed: float) -> None:
        self.speed = min(64.0, max(1 / 16, speed))
        self._wake.set()
        self._notify()

    def step(self, lines: int) -> None:
        """Move ``lines`` snapshots forward (negative: back)."""
        self._show(self._index + lines)

    def seek(self, seconds: float) -> None:
        """Move by ``seconds`` of recorded time."""
        if not self._snapshots:
            return
        here = self._times[max(0, self._index)]
        target = here + seconds
        if seconds >= 0:
            i = next((k for k in range(self._index + 1, len(self._times)) if self._times[k] >= target), None)
            self._show(len(self._times) - 1 if i is None else i)
        else:
            i = next((k for k in range(self._index - 1, -1, -1) if self._times[k] <= target), None)
            self._show(0 if i is None else i)

    def jump_hint(self, direction: int = 1) -> tuple[str, ...] | None:
        """Go to where the next (``direction`` -1: previous) hint starts
        showing; the ids that start there, or None when there is none."""
        if direction >= 0:
            found = next((o for o in self._onsets if o[0] > self._index), None)
        else:
            found = next((o for o in reversed(self._onsets) if o[0] < self._index), None)
        if found is None:
            return None
        self._show(found[0])
        return found[1]

    def status(self) -> str:
        """ "▶ replay rec.jsonl 1:05 / 5:00 ×2": for the status line."""
        n = len(self._snapshots)
        if not n:
            return "replay: empty recording"
        i = max(0, self._index)
        t0 = self._times[0]
        state = "⏸ replay paused" if self._paused else ("■ replay ended" if self._at_end() else "▶ replay")
        speed = "" if self.speed == 1 else f" ×{self.speed:g}"
        where = f"{_clock(self._times[i] - t0)} / {_clock(self._times[-1] - t0)}"
        name = f" {self.name}" if self.name else ""
        return f"{state}{name} {where} (line {i + 1}/{n}){speed}"

    # ------------------------------------------------------------ playing

    def _at_end(self) -> bool:
        return self._index >= len(self._snapshots) - 1 and not self.loop

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                delay = None if self._paused or self._at_end() else self._delay()
            woken = self._wake.wait(delay)
            if self._stop.is_set():
                return
            if woken:
                self._wake.clear()
                continue  # a control moved or paused: time the next step afresh
            nxt = self._index + 1
            self._show(0 if nxt >= len(self._snapshots) else nxt)

    def _delay(self) -> float:
        i = self._index
        if i + 1 >= len(self._times):
            gap = 1.0  # looping: the first line again after a second
        else:
            gap = self._times[i + 1] - self._times[i]
            if not gap > 0:
                gap = 1.0
        return min(gap, self.MAX_GAP_S) / self.speed

    def _show(self, index: int) -> None:
        if not self._snapshots:
            return
        index = min(max(0, index), len(self._snapshots) - 1)
        snap = self._with_history(index)
        with self._lock:
            self._index = index
            # Built here, off the UI thread; latest() hands out this dict.
            self._current = _without_jobs(snap, self._dismissed)
        self._wake.set()
        self._notify()

    def _notify(self) -> None:
        for callback in list(self._listeners):
            try:
                callback()
            except Exception:
                pass

    def _with_history(self, index: int) -> dict:
        snap = copy.deepcopy(self._snapshots[index])
        first = max(0, index - self.HISTORY_POINTS + 1)
        past = self._snapshots[first : index + 1]
        for job in snap.get("jobs") or ():
            if not isinstance(job, dict):
                continue
            for ld in job.get("loaders") or ():
                if isinstance(ld, dict) and "history" not in ld:
                    ld["history"] = _loader_history(past, job.get("pid"), ld.get("id"))
        for g in snap.get("gpus") or ():
            if isinstance(g, dict) and "history" not in g:
                g["history"] = [_gpu_value(s, g.get("index"), "util_percent") for s in past]
        return snap


def _time(snap: dict) -> float:
    t = snap.get("time")
    return float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else 0.0


def _clock(t: float) -> str:
    t = int(round(max(0.0, t)))
    return f"{t // 3600}:{t // 60 % 60:02d}:{t % 60:02d}" if t >= 3600 else f"{t // 60}:{t % 60:02d}"


def _loader_history(past: list[dict], pid, loader_id) -> dict:
    waits: list = []
    rates: list = []
    for s in past:
        ld = _find_loader(s, pid, loader_id)
        if ld is None:
            if waits:  # the loader went away and came back: a gap
                waits.append(None)
                rates.append(None)
            continue
        waits.append(ld.get("data_wait_fraction"))
        rates.append(ld.get("batches_per_s"))
    return {"data_wait_fraction": waits, "batches_per_s": rates}


def _find_loader(snap: dict, pid, loader_id) -> dict | None:
    for job in snap.get("jobs") or ():
        if isinstance(job, dict) and job.get("pid") == pid and job.get("state", "live") == "live":
            for ld in job.get("loaders") or ():
                if isinstance(ld, dict) and ld.get("id") == loader_id:
                    return ld
    return None


def _gpu_value(snap: dict, index, key: str):
    for g in snap.get("gpus") or ():
        if isinstance(g, dict) and g.get("index") == index:
            return g.get(key)
    return None
