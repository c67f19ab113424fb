"""When a loader that is being iterated has stopped delivering batches.

Read by the publisher thread from what the hot path stores anyway (the clock
of the last batch returned, of the last entry into ``__next__``, of the
epoch's start): detecting a stall adds nothing to a batch's cost.

A loader is stalled when its epoch is open (an iterator is alive and has not
raised StopIteration), and no batch came for longer than
``max(floor, K x its recent batch period)`` — or, before an epoch's first
batch, ``max(EPOCH_START_FACTOR x floor, EPOCH_START_FACTOR x its slowest
recent epoch start)``: starting workers (spawn imports, a first fetch that
opens files) is slow, and not a stall. A loader is not stalled while another
loader of the same process delivers batches (a validation loop inside the
training epoch).

The floor is 10 s: a step of a healthy job is milliseconds to a couple of
seconds, and a hung job should show within a minute. ``DLWATCH_STALL_FLOOR_S``
changes it (the tests use a short one; an operator whose steps legitimately
pause longer than that, say for checkpoints inside an epoch, may raise it).
"""

from __future__ import annotations

import os
import threading
from collections import deque
from statistics import median

FLOOR_S = 10.0
MIN_FLOOR_S = 0.5
MAX_FLOOR_S = 3600.0
# A gap this many times the recent median batch period is no jitter (a GC
# pause, a slow file, a logging step cost a few periods); the floor covers
# fast loops, where 10 periods are milliseconds.
K = 10.0
EPOCH_START_FACTOR = 3.0
PERIODS_KEPT = 32


def floor_from_env(environ=os.environ) -> float:
    raw = environ.get("DLWATCH_STALL_FLOOR_S")
    if not raw:
        return FLOOR_S
    try:
        v = float(raw)
    except ValueError:
        return FLOOR_S
    if v != v:
        return FLOOR_S
    return min(MAX_FLOOR_S, max(MIN_FLOOR_S, v))


def awaited_worker(it) -> int | None:
    """The worker whose batch an in-order loader waits for: torch hands
    batch ``_rcvd_idx`` to one worker and returns them in order, so while
    its entry in ``_task_info`` holds only the worker id, that worker has not
    delivered. None for ``in_order=False`` (any worker may answer) or when
    torch's private fields are not there."""
    try:
        if getattr(it, "_in_order", True) is False:
            return None
        info = it._task_info.get(it._rcvd_idx)
        if isinstance(info, tuple) and len(info) == 1 and isinstance(info[0], int):
            return info[0]
    except Exception:
        pass
    return None


class _Track:
    __slots__ = ("epoch", "batches", "t_last", "periods")

    def __init__(self) -> None:
        self.epoch = -1
        self.batches = 0
        self.t_last = 0.0
        self.periods: deque[float] = deque(maxlen=PERIODS_KEPT)


def _busy(o, now: float, thr: float) -> bool:
    """Whether loader ``o`` has the loop now or had it within ``thr``."""
    if o.t_last and now - o.t_last <= thr:
        return True
    if not o.epoch_t0:
        return False
    return now - o.epoch_t0 <= thr or o.t_enter > o.t_last


def _thread_alive(ident: int | None) -> bool | None:
    if ident is None:
        return None
    return any(t.ident == ident for t in threading.enumerate())


class StallWatch:
    """One per publisher; ``check`` once a frame with all the loaders."""

    def __init__(self, floor_s: float | None = None) -> None:
        self.floor_s = floor_from_env() if floor_s is None else floor_s
        self._tracks: dict[int, _Track] = {}

    def _learn(self, st) -> _Track:
        tr = self._tracks.get(st.id)
        if tr is None:
            tr = self._tracks[st.id] = _Track()
        batches, t_last, epoch = st.batches, st.t_last, st.epoch
        if epoch == tr.epoch and batches > tr.batches and t_last > tr.t_last > 0:
            tr.periods.append((t_last - tr.t_last) / (batches - tr.batches))
        if batches != tr.batches or epoch != tr.epoch:
            tr.epoch, tr.batches, tr.t_last = epoch, batches, t_last
        return tr

    def threshold_s(self, st, tr: _Track) -> float:
        period = median(tr.periods) if tr.periods else 0.0
        if st.first_pending:
            starts = [ms / 1e3 for ms in st.epoch_start_ms]
            return max(EPOCH_START_FACTOR * self.floor_s, EPOCH_START_FACTOR * max(starts, default=0.0))
        return max(self.floor_s, K * period)

    def check(self, loaders, now: float) -> dict[int, dict]:
        """For each loader id: ``stalled_s`` (None when not stalled),
        ``stall_threshold_s``, ``in_next`` (the loop is inside ``__next__``)."""
        out: dict[int, dict] = {}
        live = []
        for st in loaders:
            tr = self._learn(st)
            it = st.iter_ref() if st.iter_ref is not None else None
            thr = self.threshold_s(st, tr)
            out[st.id] = {"stalled_s": None, "stall_threshold_s": round(thr, 3), "in_next": False}
            if it is None or not st.epoch_t0:
                continue  # no iterator, or its epoch has ended: not a stall
            live.append(st)
        for st in live:
            since = st.t_last or st.paused_t or st.epoch_t0
            idle = now - since
            thr = out[st.id]["stall_threshold_s"]
            out[st.id]["in_next"] = st.t_enter > st.t_last
            if idle <= thr:
                continue
            # The loop is elsewhere (validation), not stuck: another loader
            # of this process stepped recently, began an epoch recently, or
            # the loop is inside its next() now (a QA run of Lightning: the
            # validation loader fetching its first batch, t_last 0, and the
            # train loader read as stalled).
            if any(o is not st and _busy(o, now, thr) for o in loaders):
                continue
            out[st.id]["stalled_s"] = round(idle, 3)
            if out[st.id]["in_next"]:
                out[st.id]["awaited_worker"] = awaited_worker(st.iter_ref())
        for st in loaders:
            self._check_consumer(st, loaders, out[st.id], now)
        gone = set(self._tracks) - {st.id for st in loaders}
        for k in gone:
            del self._tracks[k]
        return out

    def _check_consumer(self, st, loaders, rec: dict, now: float) -> None:
        """A loader a feeder thread iterates (handover.py, consumer.py): the
        loop's wait is its consumer's, in the ``get`` of the queue the feeder
        fills. The loop is inside ``next()`` while that wait is open; it is
        stalled once the wait outlasts the threshold, whether or not the
        feeder's epoch is still open (a QA run: a producer that returned
        early left the loop in ``q.get()`` for minutes, and no stall was
        said). ``feeder_alive``: whether the feeder's thread still runs."""
        c = getattr(st, "consumer", None)
        if c is None or not getattr(c, "thread_ident", None):
            return
        waiting = bool(c.t_enter) and c.t_enter > c.t_last
        rec["in_next"] = waiting
        if not waiting:
            if rec.get("stalled_s") is not None:
                # The feeder stopped but the loop is not waiting on it yet.
                rec["stalled_s"] = None
                rec.pop("awaited_worker", None)
            return
        thr = rec["stall_threshold_s"]
        if now - c.t_enter <= thr:
            return
        if rec.get("stalled_s") is None:
            if any(o is not st and o.t_last and now - o.t_last <= thr for o in loaders):
                return
            rec["stalled_s"] = round(now - (c.t_last or c.t_enter), 3)
        rec["feeder_alive"] = _thread_alive(st.thread_ident)
