"""Monotonic lifetime counters of a job's loaders and worker slots.

A consumer that keeps its own time series (a Prometheus scrape, a recorder)
wants counters that only ever go up, in base units, since the loader was
first iterated, and integrates nothing itself. The job's frames carry
cumulative counters already, with two wrinkles this module smooths over, one
frame at a time as the connection receives them:

- A frame counts the ``__next__`` in progress as data wait. If that call ends
  the epoch, the probe books it as teardown instead, so ``wait_ns`` steps back
  by that much once; the published figure holds at its high-water mark until
  the real one passes it (a counter that goes down reads as a reset to
  Prometheus, whose ``rate()`` would then count the whole total again).
- A worker slot (``id``) gets a new process every epoch unless the loader's
  workers are persistent, and the new process's counters start at zero. The
  slot's total carries the previous processes' busy time as an offset, so
  "busy seconds of worker 3" is one counter over the whole run, labelled by
  index rather than by a PID that changes every epoch. A worker's own figure
  also dips for a frame when the trainer reads its counters mid-update: while
  the PID stays the same, the high-water mark holds.

Memory is bounded by the frames' own bounds (loaders per process, workers per
loader); state of loaders that left the frames is dropped.
"""

from __future__ import annotations

NS = 1e9


class _Slot:
    __slots__ = ("pid", "busy_ns", "offset_ns")

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.busy_ns = 0
        self.offset_ns = 0


class _LoaderTotals:
    __slots__ = ("wait_ns", "step_ns", "slots")

    def __init__(self) -> None:
        self.wait_ns = 0
        self.step_ns = 0
        self.slots: dict[int, _Slot] = {}


class Totals:
    """Fed every accepted window frame of one job, in order (``add``)."""

    def __init__(self) -> None:
        self._loaders: dict[int, _LoaderTotals] = {}

    def add(self, frame: dict) -> None:
        seen = set()
        for ld in frame.get("loaders", ()):
            lid = ld["id"]
            seen.add(lid)
            t = self._loaders.get(lid)
            if t is None:
                t = self._loaders[lid] = _LoaderTotals()
            t.wait_ns = max(t.wait_ns, ld["wait_ns"])
            t.step_ns = max(t.step_ns, ld["step_ns"])
            for w in ld.get("workers", ()):
                pid = w["pid"]
                slot = t.slots.get(w["id"])
                if slot is None:
                    slot = t.slots[w["id"]] = _Slot(pid)
                elif slot.pid != pid:
                    slot.offset_ns += slot.busy_ns
                    slot.pid, slot.busy_ns = pid, 0
                slot.busy_ns = max(slot.busy_ns, w["busy_ns"])
        if len(seen) != len(self._loaders):
            for lid in [k for k in self._loaders if k not in seen]:
                del self._loaders[lid]

    def loader(self, loader_id: int) -> dict[str, float] | None:
        """``wait_s_total`` and ``step_s_total`` of a loader, in seconds."""
        t = self._loaders.get(loader_id)
        if t is None:
            return None
        return {"wait_s_total": round(t.wait_ns / NS, 6), "step_s_total": round(t.step_ns / NS, 6)}

    def worker_busy_s(self, loader_id: int, worker_id: int) -> float | None:
        """Busy seconds of a worker slot over every process that held it."""
        t = self._loaders.get(loader_id)
        slot = t.slots.get(worker_id) if t is not None else None
        if slot is None:
            return None
        return round((slot.offset_ns + slot.busy_ns) / NS, 6)
