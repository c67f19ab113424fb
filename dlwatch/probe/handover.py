"""The training loop's side of a queue: a loader iterated on a feeder thread.

A common shape (a producer thread and a ``queue.Queue``; MONAI's
``ThreadDataLoader``, whose ``ThreadBuffer`` is exactly that): one thread
iterates the loader and ``put``s its batches, the training thread ``get``s
them. The loader's own ``__next__`` times the feeder, which waits almost
always; the loop waits only when the queue runs dry. So once a loader's
batch is first taken off the main thread (``note_feeder``), ``queue.Queue``'s
``put`` and ``get`` are patched at class level: a queue that such a thread
puts into is marked as carrying that loader's batches, and a ``get`` from it
by another thread is the loop's ``next()``, timed as the loader's consumer.
Until a loader is iterated off the main thread nothing here is installed,
and a queue nobody marked costs its ``get`` one attribute read.

A ``get`` that times out (MONAI polls with a 10 ms timeout) keeps the wait
open: the wait runs from the first ``get`` after a batch to the ``get`` that
returns the next one.
"""

from __future__ import annotations

import itertools
import queue
import threading
from time import perf_counter as _clock
from typing import Any

# thread ident -> the loader stats it iterates (the feeder's)
_feeders: dict[int, Any] = {}
_originals: dict[str, Any] = {}
_lock = threading.Lock()
# A consumer's handover_q when an adapter times the loop's own iterator
# (monai.py): its feeder marks no queue (stats.first_batch), so the queue
# beneath it is not timed again.
EXACT = -1


def note_feeder(st: Any) -> None:
    """``st``'s loader had an epoch's first batch on this (non-main) thread."""
    try:
        _feeders[threading.get_ident()] = st
        install()
    except Exception:
        pass


def install() -> None:
    with _lock:
        if _originals:
            return
        cls: Any = queue.Queue  # patched in place: typed loosely
        orig_put, orig_get = cls.put, cls.get
        _originals["put"], _originals["get"] = orig_put, orig_get
        cls._dlw_fed = None  # class default: an unmarked queue reads None at once
        get_ident, feeders, clock, serials = threading.get_ident, _feeders, _clock, itertools.count(1)

        def put(self, item, block=True, timeout=None):
            if self._dlw_fed is None:
                st = feeders.get(get_ident())
                if st is not None:
                    # A serial, not id(): a queue made each epoch often takes
                    # the address of the one freed before it.
                    self._dlw_serial = next(serials)
                    self._dlw_fed = st
            return orig_put(self, item, block, timeout)

        def get(self, block=True, timeout=None):
            st = self._dlw_fed
            if st is None:
                return orig_get(self, block, timeout)
            c = st.consumer
            if c is None or c.thread_ident != get_ident():
                c = _consumer_for(st)
                if c is None:
                    return orig_get(self, block, timeout)
            t0 = clock()
            if c.handover_q != self._dlw_serial:
                _new_handover(c, st, self._dlw_serial, t0)
            if c.t_enter <= c.t_last or not c.t_enter:
                c.t_enter = t0  # the loop's wait for this batch starts now
            item = orig_get(self, block, timeout)  # queue.Empty keeps the wait open
            t1 = clock()
            t_enter, last = c.t_enter, c.t_last
            c.wait_s += t1 - t_enter
            if last:
                c.step_s += t_enter - last
            c.t_last = t1
            c.batches += 1
            return item

        put.__doc__, get.__doc__ = orig_put.__doc__, orig_get.__doc__
        put._dlwatch_orig, get._dlwatch_orig = orig_put, orig_get  # type: ignore[attr-defined]
        cls.put, cls.get = put, get


def _new_handover(c: Any, st: Any, serial: int, t0: float) -> None:
    """The loop takes from another queue than before (a feeder that makes a
    queue every epoch). A wait left open on the old one (polls while its
    thread shut down) is no part of this epoch's; the loop has waited since
    the feeder's epoch began (the new queue's first gets came before any
    batch marked it, so none was timed)."""
    if c.handover_q is not None:
        e0 = st.epoch_t0
        c.t_last = 0.0  # the epoch boundary is neither wait nor step
        c.t_enter = e0 if 0 < e0 <= t0 else t0
    c.handover_q = serial


def _consumer_for(st: Any) -> Any:
    """The consumer counters of ``st`` for the calling thread, made on its
    first ``get``; None for the feeder's own thread or a second consumer."""
    ident = threading.get_ident()
    if ident == st.thread_ident:
        return None
    c = st.consumer
    if c is not None:
        return c if c.thread_ident == ident else None
    from dlwatch.probe.stats import LoaderStats

    c = LoaderStats(-1, None, {})
    th = threading.current_thread()
    c.thread_name, c.thread_main, c.thread_ident = th.name, th is threading.main_thread(), ident
    st.consumer = c
    return c


def uninstall() -> None:
    with _lock:
        if not _originals:
            return
        cls: Any = queue.Queue
        cls.put = _originals.pop("put")
        cls.get = _originals.pop("get")
        try:
            del cls._dlw_fed
        except AttributeError:
            pass
        _feeders.clear()


def forget() -> None:
    """After fork, in the child: its threads are gone."""
    _feeders.clear()
