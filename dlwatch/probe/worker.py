"""Worker-side timing: code that runs inside DataLoader worker processes.

Patches made in the trainer reach fork workers but not spawn/forkserver ones,
so the trainer hands each worker a ``WorkerHook`` through the iterator's
``_worker_init_fn``. Unpickling it in a spawned child imports this module; its
``__call__`` (torch calls it as the worker init function) patches the dataset
fetchers of *that* process and then runs the user's own init function.

Each worker owns a row of a shared-memory int64 array created by the trainer
(``multiprocessing.RawArray``: anonymous shared memory, inherited by fork and
passed as a file descriptor to spawn/forkserver children). The worker writes
its counters there with plain stores; the trainer's publisher thread reads
them. No locks: one writer per row, and a reader that sees a half-updated row
is off by one batch for one window.
"""

from __future__ import annotations

import os
from time import perf_counter_ns as _clock

# Row layout, one row of int64 per worker.
PID, BATCHES, FETCH_NS, CUR_START_NS, STARTED_NS = range(5)
NFIELDS = 5

# This process's row, set when the hook runs in a worker. Module globals so the
# patched fetch reaches them with two dictionary lookups.
_row = None  # memoryview of int64, or None outside a worker
# Absolute indices of this worker's fields, computed once (saves an add per access).
_i_batches = _i_fetch = _i_cur = 0
_patched = False


def make_slots(num_workers: int):
    """Shared counters for ``num_workers`` workers (trainer side)."""
    from multiprocessing.sharedctypes import RawArray

    return RawArray("q", num_workers * NFIELDS)


def as_int64_view(slots) -> memoryview:
    # Indexing a memoryview is several times cheaper than a ctypes array.
    return memoryview(slots).cast("B").cast("q")


class WorkerHook:
    """Picklable worker init function: activates timing, then calls the user's.

    Deliberately has no ``functools.wraps`` metadata: pickle would then resolve
    it by qualified name to the user's function and drop the hook.
    """

    __slots__ = ("user_fn", "slots")

    def __init__(self, user_fn, slots) -> None:
        self.user_fn = user_fn
        self.slots = slots

    def __getstate__(self):
        return (self.user_fn, self.slots)

    def __setstate__(self, state) -> None:
        self.user_fn, self.slots = state

    def __call__(self, worker_id: int) -> None:
        try:
            activate(self.slots, worker_id)
        except Exception:
            pass  # never let monitoring break a worker
        if self.user_fn is not None:
            self.user_fn(worker_id)

    def __repr__(self) -> str:
        return f"<dlwatch WorkerHook around {self.user_fn!r}>"


def activate(slots, worker_id: int) -> None:
    global _row, _i_batches, _i_fetch, _i_cur
    row = as_int64_view(slots)
    base = worker_id * NFIELDS
    if base + NFIELDS > len(row):
        return
    row[base + PID] = os.getpid()
    row[base + CUR_START_NS] = 0
    if not row[base + STARTED_NS]:
        row[base + STARTED_NS] = _clock()
    _i_batches, _i_fetch, _i_cur = base + BATCHES, base + FETCH_NS, base + CUR_START_NS
    _row = row
    _patch_fetchers()


def _patch_fetchers() -> None:
    global _patched
    if _patched:
        return
    from torch.utils.data._utils import fetch

    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        orig = cls.__dict__.get("fetch")
        if orig is None or getattr(orig, "_dlwatch_orig", None) is not None:
            continue
        cls.fetch = _timed(orig)
    _patched = True


def _timed(orig):
    def fetch(self, possibly_batched_index):
        row = _row
        if row is None:
            return orig(self, possibly_batched_index)
        cur = _i_cur
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            # StopIteration ends an IterableDataset: time spent, no batch.
            row[_i_fetch] += _clock() - t0
            row[cur] = 0
            raise
        row[_i_fetch] += _clock() - t0
        row[cur] = 0
        row[_i_batches] += 1
        return data

    fetch._dlwatch_orig = orig
    return fetch


def read_workers(view: memoryview, count: int, now_ns: int, fallback_pids=()) -> list[dict]:
    """Trainer side: the workers' cumulative counters, in-progress fetch included."""
    out = []
    for i in range(count):
        b = i * NFIELDS
        pid = view[b + PID] or (fallback_pids[i] if i < len(fallback_pids) else 0)
        fetch_ns = view[b + FETCH_NS]
        cur = view[b + CUR_START_NS]
        busy = fetch_ns + (now_ns - cur if 0 < cur <= now_ns else 0)
        out.append(
            {
                "id": i,
                "pid": int(pid or 0),
                "batches": int(view[b + BATCHES]),
                "fetch_ns": int(fetch_ns),
                "busy_ns": int(busy),
                "started_ns": int(view[b + STARTED_NS]),
            }
        )
    return out
