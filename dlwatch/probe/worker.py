"""Worker-side timing: code that runs inside DataLoader worker processes.

Patches made in the trainer reach fork workers but not spawn/forkserver ones,
so the trainer hands each worker a ``WorkerHook`` through the iterator's
``_worker_init_fn``. Unpickling it in a spawned child imports this module; its
``__call__`` (torch calls it as the worker init function) patches the dataset
fetchers of *that* process and then runs the user's own init function.

Each worker owns a row of a shared-memory array of 8-byte fields created by
the trainer (``multiprocessing.RawArray``: anonymous shared memory, inherited
by fork and passed as a file descriptor to spawn/forkserver children). The
worker writes its counters there with plain stores; the trainer's publisher
thread reads them. No locks: one writer per row, and a reader that sees a
half-updated row is off by one batch for one window.

The two fields the fetch writes with clock readings, FETCH_S and CUR_START_S,
are float64 seconds of ``time.perf_counter()`` (written and read through a
float64 view of the same memory); the others are int64, through an int64
view. The fetch keeps its running totals in closure cells and only *stores*
into shared memory: a memoryview subscript is not specialised by the
interpreter (~25 ns a read or a store, ~50 ns a ``+=``), a cell is. With float
seconds (a float store into a 'd' view is ~19 ns, a 2-digit int into a 'q'
view ~32 ns), the wrapper alone went from +301 to +231 ns per fetch
(bench/hotpath_variants.py, Xeon, 3.11).
"""

from __future__ import annotations

import os
import sys
import zlib
from bisect import bisect_right as _bucket
from time import perf_counter as _clock
from time import perf_counter_ns as _clock_ns
from time import process_time as _cpu_clock
from typing import Any

from dlwatch.probe.frames import as_frame_of

# The row layout (worker_row.py), re-exported: the trainer's readers and the
# tests name the fields as worker.X.
from dlwatch.probe.worker_row import (  # noqa: E402,F401
    _HIST_EDGES,
    BATCHES,
    BURST_ACK,
    BURST_END_S,
    BURST_GEN,
    BURST_HZ,
    CUR_START_S,
    FETCH_S,
    FIRST_FP,
    HIST0,
    HIST_BUCKETS,
    HIST_LO_S,
    HIST_PER_OCTAVE,
    NFIELDS,
    OWN_TID0,
    OWN_TIDS,
    PID,
    SECOND_FP,
    STACK_ACK,
    STACK_REQ,
    STARTED_CPU_S,
    STARTED_NS,
    read_own_tids,
)

# This process's row (int64 view), set when the hook runs in a worker; None
# outside one.
_row = None


def make_slots(num_workers: int):
    """Shared counters for ``num_workers`` workers (trainer side)."""
    from multiprocessing.sharedctypes import RawArray

    return RawArray("q", num_workers * NFIELDS)


def as_int64_view(slots: Any) -> memoryview[int]:
    # Indexing a memoryview is several times cheaper than a ctypes array.
    return memoryview(slots).cast("B").cast("q")


def as_float64_view(slots: Any) -> memoryview[float]:
    return memoryview(slots).cast("B").cast("d")


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
    """Worker side: claim row ``worker_id`` and time this process's fetches into it.

    Called once per worker process; calling it again (tests, benchmarks)
    re-aims the fetchers at the new row, still around torch's originals.
    """
    global _row
    row = as_int64_view(slots)
    frow = as_float64_view(slots)
    base = worker_id * NFIELDS
    if base + NFIELDS > len(row):
        return
    row[base + PID] = os.getpid()
    frow[base + CUR_START_S] = 0.0
    if not row[base + STARTED_NS]:
        frow[base + STARTED_CPU_S] = _cpu_clock()
        row[base + STARTED_NS] = _clock_ns()
    _row = row
    _patch_fetchers(row, frow, base)
    _start_watch(row, base)


def _start_watch(row, base: int) -> None:
    try:
        from dlwatch.probe import worker_watch

        worker_watch.start(row, base)
    except Exception:
        pass  # no stacks from this worker on a stall, never a broken worker


def _patch_fetchers(row, frow, base: int) -> None:
    from torch.utils.data._utils import fetch

    for cls in (fetch._MapDatasetFetcher, fetch._IterableDatasetFetcher):
        cur = cls.__dict__.get("fetch")
        if cur is None:
            continue
        timed = _timed(getattr(cur, "_dlwatch_orig", cur), row, frow, base, fetch)
        if cls is fetch._IterableDatasetFetcher:
            timed = _fingerprint_first(cls, timed, row, base + FIRST_FP, base + SECOND_FP, fetch)
        cls.fetch = timed  # type: ignore[method-assign]


def _fingerprint_first(cls, timed, row, i_first: int, i_second: int, mod=None):
    """``timed`` that stores digests of this process's first two batches,
    then puts ``timed`` itself on the class: the later fetches pay nothing.
    Dressed as the original fetch of ``mod`` (frames.py), as ``timed`` is."""
    orig_timed, fingerprint = timed, digest

    def fetch(self, possibly_batched_index):
        data = orig_timed(self, possibly_batched_index)
        try:
            i = i_second if row[i_first] else i_first
            if i == i_second or row[i_second]:
                cls.fetch = orig_timed
            if not row[i]:
                row[i] = fingerprint(data)
        except Exception:
            cls.fetch = orig_timed
        return data

    if mod is not None:
        fetch = as_frame_of(fetch, timed._dlwatch_orig, mod)
    fetch._dlwatch_orig = timed._dlwatch_orig  # type: ignore[attr-defined]
    return fetch


# Leaves of a batch read for its digest, and elements of each tensor: enough
# to tell two streams apart, bounded whatever the batch holds.
_DIGEST_LEAVES = 8
_DIGEST_ELEMENTS = 256


def digest(batch) -> int:
    """A digest of a batch that is equal in two processes exactly when the
    first leaves (tensors, strings, numbers) of their batches are: CRC-32 of
    their text, never Python's ``hash`` (randomised per spawned process).
    Never 0."""
    crc = 0
    leaves = 0
    stack = [batch]
    while stack and leaves < _DIGEST_LEAVES:
        x = stack.pop()
        if isinstance(x, dict):
            stack.extend(reversed(list(x.values())[:_DIGEST_LEAVES]))
            continue
        if isinstance(x, (list, tuple)):
            stack.extend(reversed(list(x[:_DIGEST_LEAVES])))
            continue
        flat = getattr(x, "reshape", None)
        if flat is not None:
            x = flat(-1)[:_DIGEST_ELEMENTS].tolist()
        crc = zlib.crc32(repr(x).encode(), crc)
        leaves += 1
    return crc | (1 << 32)


def _timed(orig_fetch, row, frow, base: int, mod=None):
    """``orig_fetch`` (a fetcher's ``fetch``) timed into row ``base`` of the
    table whose int64 and float64 views are ``row`` and ``frow``; with
    ``mod`` (torch's fetch module), dressed as the original (frames.py): a
    dataset's exception then shows no dlwatch frame in the worker's
    traceback, which torch copies into the message the trainer raises.
    Everything the wrapper uses is a cell: dressed, it runs with torch's
    globals."""
    clock, bucket, start_sampler = _clock, _bucket, _start_sampler
    i_batches, i_fetch, i_cur = base + BATCHES, base + FETCH_S, base + CUR_START_S
    i_hist = base + HIST0
    # Running totals, continued from the row (a re-activated worker adds on).
    busy = frow[i_fetch]
    batches = row[i_batches]
    # The histogram's counts, kept in a list (a list item += is specialised,
    # a memoryview's is not) and stored into the row.
    hist = [row[i_hist + k] for k in range(HIST_BUCKETS)]
    hrow = row[i_hist : i_hist + HIST_BUCKETS]  # the row's histogram, indexed by bucket
    edges = _HIST_EDGES
    i_gen = base + BURST_GEN
    # The last burst id this worker looked at: a new one starts its sampler
    # (one int64 load and compare per fetch: a memoryview read, ~25 ns as
    # measured above; no thread until then).
    seen = 0

    def fetch(self, possibly_batched_index):
        nonlocal busy, batches, seen
        if row[i_gen] != seen:
            seen = row[i_gen]
            start_sampler(row, frow, base, seen)
        t0 = clock()
        frow[i_cur] = t0
        try:
            data = orig_fetch(self, possibly_batched_index)
        except BaseException:
            # StopIteration ends an IterableDataset: time spent, no batch.
            busy += clock() - t0
            frow[i_fetch] = busy
            frow[i_cur] = 0.0
            raise
        d = clock() - t0
        busy += d
        batches += 1
        frow[i_fetch] = busy
        row[i_batches] = batches
        frow[i_cur] = 0.0
        k = bucket(edges, d)
        c = hist[k] + 1
        hist[k] = c
        hrow[k] = c
        return data

    if mod is not None:
        fetch = as_frame_of(fetch, orig_fetch, mod)
    fetch._dlwatch_orig = orig_fetch  # type: ignore[attr-defined]  # what a re-patch unwraps
    return fetch


def _start_sampler(row, frow, base: int, gen: int) -> None:
    """Called by the timed fetch only: its frame, the caller's, is where the
    burst's samples stop (dressed or not, whichever code it runs)."""
    try:
        from dlwatch.probe import worker_sampler

        # Its own code too: the sampler leaves out the samples of this very call.
        worker_sampler.start(row, frow, base, gen, sys._getframe(1).f_code, _start_sampler.__code__)
    except Exception:
        pass  # a burst that cannot sample costs its samples, never the fetch


def read_workers(
    view: memoryview, fview: memoryview, count: int, now_ns: int, fallback_pids=()
) -> list[dict]:
    """Trainer side: the workers' cumulative counters, in-progress fetch included.

    ``view`` and ``fview`` are the int64 and float64 views of the table.
    """
    now = now_ns / 1e9
    out = []
    for i in range(count):
        b = i * NFIELDS
        pid = view[b + PID] or (fallback_pids[i] if i < len(fallback_pids) else 0)
        fetch = fview[b + FETCH_S]
        cur = fview[b + CUR_START_S]
        busy = fetch + (now - cur if 0 < cur <= now else 0.0)
        w = {
            "id": i,
            "pid": int(pid or 0),
            "batches": int(view[b + BATCHES]),
            "fetch_ns": round(fetch * 1e9),
            "busy_ns": round(busy * 1e9),
            "started_ns": int(view[b + STARTED_NS]),
            "started_cpu_s": round(fview[b + STARTED_CPU_S], 4),
            # Sparse [bucket, count] pairs: a worker's fetch times fall in few.
            "fetch_hist": [[k, c] for k in range(HIST_BUCKETS) if (c := int(view[b + HIST0 + k]))],
        }
        own = read_own_tids(view, b)
        if own:
            # dlwatch's own threads in the worker (worker_row.OWN_TID0): the
            # monitor does not count them as the worker's.
            w["own_tids"] = own
        first, second = int(view[b + FIRST_FP]), int(view[b + SECOND_FP])
        if first:
            w["first_batch_digest"] = first
        if second:
            w["second_batch_digest"] = second
        out.append(w)
    return out
