"""The layout of a worker's row in the shared counters table: which 8-byte
field holds what. Written by the worker (worker.py: the timed fetch;
worker_sampler.py: a profile burst's ack; worker_watch.py: a stack request's
ack) and read by the trainer (worker.py's reader, worker_burst.py,
stack_request.py): one module both sides import, so that none of them has to
import another for its field numbers."""

from __future__ import annotations

import threading

from dlwatch import wire

# Row layout, one row per worker: PID, BATCHES, STARTED_NS int64; FETCH_S
# (completed fetch time) and CUR_START_S (start of the fetch in progress, 0
# when idle) float64 seconds; FIRST_FP and SECOND_FP, digests of the first two
# batches an iterable dataset's worker delivered (0: none yet), which tell an
# unsharded dataset (every worker yields the same stream) from a sharded one
# (and constant data, whose two batches are alike, from both); then
# HIST_BUCKETS int64 counts of fetch times, the tail of the fetch time
# (head-of-line blocking) in fixed memory.
PID, BATCHES, FETCH_S, CUR_START_S, STARTED_NS, FIRST_FP, SECOND_FP = range(7)
HIST0 = 7
# The buckets are the wire's (``wire.fetch_hist_bounds_ms``).
HIST_PER_OCTAVE = wire.FETCH_HIST_PER_OCTAVE
HIST_BUCKETS = wire.FETCH_HIST_BUCKETS
HIST_LO_S = wire.FETCH_HIST_LO_S
# The lower edges of buckets 1.. (seconds): a fetch's bucket is how many of
# them it reaches (a C bisect, cheaper than a log and no clamping needed).
_HIST_EDGES = [wire.fetch_hist_bounds_ms(k)[0] / 1e3 for k in range(1, HIST_BUCKETS)]
# A worker profile burst (worker_sampler.py), after the histogram: the
# trainer writes BURST_GEN (its id), BURST_HZ and BURST_END_S (float64
# seconds); the worker writes BURST_ACK = BURST_GEN once it samples.
BURST_GEN, BURST_HZ, BURST_END_S, BURST_ACK = range(HIST0 + HIST_BUCKETS, HIST0 + HIST_BUCKETS + 4)
# A stack request (worker_watch.py): the trainer writes STACK_REQ (its id);
# the worker's stack watcher writes its stacks to a file, then STACK_ACK.
STACK_REQ, STACK_ACK = HIST0 + HIST_BUCKETS + 4, HIST0 + HIST_BUCKETS + 5
# The native thread ids of the threads dlwatch runs in this worker (the stack
# watcher, a burst's sampler), 0 where free. The trainer publishes them with
# the worker (``own_tids``) and the monitor leaves those threads out of the
# worker's thread count, CPU and run-queue wait: pressing W once added a
# fifth thread to a 1-worker job's worker and raised
# worker-thread-oversubscription about dlwatch's own sampler (issue 43).
OWN_TID0, OWN_TIDS = HIST0 + HIST_BUCKETS + 6, 4
# The worker's own CPU seconds (float64, ``time.process_time()``) when the
# hook activated it, with STARTED_NS its clock: the monitor averages a new
# worker's CPU over its working life from there. A worker of a loader with
# sub-second epochs (persistent_workers off) lives under a second, too short
# for two /proc samples or a lifetime average, and a spawned one's lifetime
# would count its imports as work.
STARTED_CPU_S = OWN_TID0 + OWN_TIDS
NFIELDS = STARTED_CPU_S + 1

_own_lock = threading.Lock()


def claim_tid(row, base: int) -> int:
    """From a dlwatch thread inside a worker: write its native id into a free
    slot of row ``base``; the slot's index, -1 when none is free (the thread
    is then counted as the job's, never an error)."""
    tid = threading.get_native_id()
    with _own_lock:
        for i in range(base + OWN_TID0, base + OWN_TID0 + OWN_TIDS):
            if row[i] == 0 or row[i] == tid:
                row[i] = tid
                return i
    return -1


def release_tid(row, index: int) -> None:
    """The thread of slot ``index`` (``claim_tid``'s) ends: free the slot."""
    if index >= 0:
        with _own_lock:
            row[index] = 0


def read_own_tids(view, base: int) -> list[int]:
    """Trainer side: the native ids of the dlwatch threads in row ``base``'s worker."""
    return [t for i in range(base + OWN_TID0, base + OWN_TID0 + OWN_TIDS) if (t := int(view[i]))]
