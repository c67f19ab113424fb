"""Class-level patches of torch's DataLoader iterator (docs/ARCHITECTURE.md §2).

``install()`` patches ``_BaseDataLoaderIter`` if torch's dataloader module is
already imported, else arms an import hook that patches it the moment torch
imports it: ``dlwatch run`` activates the hook in every Python process, and
most of those never touch torch, so we must not import it for them.

Patched: ``__init__`` (an epoch starts; a fresh iterator), ``_reset`` (an
epoch starts on a persistent iterator), ``__next__`` (wait inside the call,
the loop's work between calls), and a ``_worker_init_fn`` data descriptor so
that whatever any iterator class assigns there reaches its workers wrapped in
a ``WorkerHook`` (torchdata's iterator assigns it after our ``__init__`` has
run; a descriptor sees every assignment). Originals are kept for
``uninstall()``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from time import perf_counter as _clock  # float seconds: see stats.py
from time import thread_time as _thread_cpu
from typing import Any

from dlwatch.probe import postimport, worker_burst
from dlwatch.probe import worker as _worker
from dlwatch.probe.frames import as_frame_of
from dlwatch.probe.stats import METER_CODES, Registry

TARGET_MODULE = "torch.utils.data.dataloader"

registry = Registry()
_originals: dict[str, object] = {}
_finder = None
# Called with no arguments when the first iterator of a trainer process
# exists; the publisher sets it (keeps this module free of socket code).
on_first_iterator: Callable[[], None] | None = None
# Set by dlwatch.hook when autotune is on (probe/autotune.py): called with
# (iterator, loader, stats) for every new iterator. None: nothing runs.
after_new_iterator: Callable[[Any, Any, Any], None] | None = None


def install() -> None:
    """Idempotent: patch now if torch's dataloader is loaded, else on import."""
    global _finder
    _finder = postimport.now_or_on_import(TARGET_MODULE, "_BaseDataLoaderIter", _patch, _finder)


def installed() -> bool:
    return bool(_originals)


def uninstall() -> None:
    global _finder
    postimport.disarm(_finder)
    _finder = None
    mod = sys.modules.get(TARGET_MODULE)
    if mod is None or not _originals:
        return
    cls = mod._BaseDataLoaderIter
    for name, orig in _originals.items():
        if orig is _MISSING:
            try:
                delattr(cls, name)
            except AttributeError:
                pass
        else:
            setattr(cls, name, orig)
    _originals.clear()


_MISSING = object()


def _patch(mod) -> None:
    if _originals:
        return
    cls = mod._BaseDataLoaderIter
    orig_init = cls.__init__
    orig_next = cls.__next__
    orig_reset = cls._reset
    _originals["__init__"] = orig_init
    _originals["__next__"] = orig_next
    _originals["_reset"] = orig_reset
    _originals["_worker_init_fn"] = cls.__dict__.get("_worker_init_fn", _MISSING)
    _originals["_dlw_stats"] = cls.__dict__.get("_dlw_stats", _MISSING)

    # Locals, not module globals: the wrappers run with torch's globals (below).
    clock, on_new = _clock, _on_new_iterator

    def __init__(self, loader, *args, **kwargs):
        t0 = clock()
        orig_init(self, loader, *args, **kwargs)
        try:
            on_new(self, loader, t0)
        except Exception:
            pass

    def _reset(self, loader, first_iter=False, *args, **kwargs):
        if not first_iter:
            st = self._dlw_stats
            if st is not None:
                try:
                    st.begin_epoch(self, clock())
                except Exception:
                    pass
        return orig_reset(self, loader, first_iter, *args, **kwargs)

    # torch warns from these with stacklevel=2 (pin_memory without an
    # accelerator, ...): the frame it then names is the caller's, which our
    # wrapper would otherwise be. Dressed as the original, the wrapper frame
    # reads as torch's own code, as it would without dlwatch.
    __init__ = as_frame_of(__init__, orig_init, mod)
    _reset = as_frame_of(_reset, orig_reset, mod)
    __next__ = _wrap_next(orig_next, mod)

    __init__._dlwatch_orig = orig_init  # type: ignore[attr-defined]  # what uninstall restores
    _reset._dlwatch_orig = orig_reset  # type: ignore[attr-defined]
    for f, o in ((__init__, orig_init), (__next__, orig_next), (_reset, orig_reset)):
        f.__doc__ = getattr(o, "__doc__", None)
    cls.__init__ = __init__
    cls.__next__ = __next__
    cls._reset = _reset
    cls._worker_init_fn = _InitFnSlot(_originals["_worker_init_fn"])
    cls._dlw_stats = None  # class default: uninstrumented iterators skip at once


# The loop thread's CPU inside next() is read on one batch in 16 (the 9th of
# each 16; an epoch's first is left out when it falls there).
HANDOVER_EVERY = 16
HANDOVER_MASK = HANDOVER_EVERY - 1
HANDOVER_AT = 8


def _wrap_next(orig_next, mod=None, like=None):
    """The patched ``__next__``: the hot path, around torch's own; with
    ``mod`` (torch's dataloader module), dressed as the original, or as
    ``like`` where the original is not Python code (``frames.as_frame_of``):
    an exception from the dataset then shows no dlwatch file in the user's
    traceback.

    Two clock reads, an attribute read, a few float adds and slot stores. The
    shape is the fastest of those bench/hotpath_variants.py times (Xeon, 3.11:
    wrapper alone +185 ns against +221 before issue 16, of which +109 are the
    two clock reads and +19 the extra frame): a closure
    calling the original directly (an exact-args Python call, which 3.11 runs
    in the same interpreter loop); try/except, which costs nothing until it
    catches (try/finally costs ~10 ns); the first-batch check folded into the
    ``t_last == 0`` branch (one attribute read fewer); float clock readings
    (-36 ns against int ns). Not faster: module globals instead of cells, the
    clock as a default argument, counters in a list instead of slots.

    Plain attributes only: on CPython 3.11 merely touching an instance's
    __dict__ makes every later attribute lookup on it slower (~250 ns per
    batch in torch's own __next__). "Inside __next__" is t_enter > t_last, so
    t_enter needs no reset on the way out.
    """

    clock = _clock  # a cell, not a global: the dressed function runs with torch's globals
    cpu, mask, at = _thread_cpu, HANDOVER_MASK, HANDOVER_AT  # cells too

    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig_next(self)
        t0 = clock()
        st.t_enter = t0
        # One batch in HANDOVER_EVERY: the loop thread's CPU inside next(),
        # what taking a batch off the workers' queue costs it (unpickling,
        # tensors rebuilt from shared memory) in series with its step. A
        # thread-clock read is a system call (~0.5 us), so not every batch.
        c0 = cpu() if (st.batches & mask) == at else 0.0
        try:
            data = orig_next(self)
        except StopIteration:
            st.end_epoch(t0, clock())
            raise
        except BaseException as e:
            st.t_enter = 0.0
            try:
                st.raised(self, e, t0, clock())  # a worker's death or exception: errors only
            except Exception:
                pass
            raise
        t1 = clock()
        st.wait_s += t1 - t0
        last = st.t_last
        if c0 and last:  # not an epoch's first: its next() waits on new workers
            st.next_cpu_s += cpu() - c0
            st.next_cpu_n += 1
        st.t_last = t1
        st.batches += 1
        if last:
            st.step_s += t0 - last
        else:
            st.first_batch(t1, data)
        return data

    if mod is not None:
        __next__ = as_frame_of(__next__, like or orig_next, mod)
    METER_CODES.add(__next__.__code__)
    __next__._dlwatch_orig = orig_next  # type: ignore[attr-defined]  # what uninstall restores
    return __next__


def announce(st) -> None:
    """A pipeline other than a DataLoader began an epoch (consumer.py): the
    publisher starts, as for a DataLoader's first iterator."""
    cb = on_first_iterator
    if cb is not None:
        try:
            cb()
        except Exception:
            pass


def _in_worker_process() -> bool:
    w = sys.modules.get("torch.utils.data._utils.worker")
    return w is not None and getattr(w, "_worker_info", None) is not None


def _on_new_iterator(it, loader, t0: float) -> None:
    # A DataLoader iterated inside a worker (nested loaders) is not the job's
    # training loop: leave it alone so workers never open sockets.
    if _in_worker_process():
        return
    st = registry.for_iterator(it, loader)
    nw = int(getattr(it, "_num_workers", 0) or 0)
    if nw > 0:
        slots = _worker.make_slots(nw)
        st.slots = slots
        st.slots_view = _worker.as_int64_view(slots)
        st.slots_fview = _worker.as_float64_view(slots)
        st.num_workers = nw
        it._dlw_slots = slots
        worker_burst.on_new_slots(st)
    else:
        st.slots = st.slots_view = st.slots_fview = None
        st.num_workers = 0
    c = getattr(loader, "_dlw_consumer", None)
    if c is not None:
        st.consumer = c  # an adapter times the loop's side (adapters/monai.py)
    st.begin_epoch(it, t0)
    it._dlw_stats = st
    at = after_new_iterator
    if at is not None:
        try:
            at(it, loader, st)
        except Exception:
            pass
    cb = on_first_iterator
    if cb is not None:
        cb()


class _InitFnSlot:
    """Data descriptor for ``_worker_init_fn`` on the iterator base class.

    Stores what the iterator assigns and hands back a ``WorkerHook`` around it
    when the iterator has worker slots. The DataLoader's own
    ``worker_init_fn`` is never touched, so frameworks that check it for None
    (Lightning) see exactly what the user set.
    """

    def __init__(self, fallback) -> None:
        self._fallback = fallback

    def __set_name__(self, owner, name) -> None:
        pass

    # Attribute access rather than obj.__dict__: see the note on __next__.
    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        user = getattr(obj, "_dlw_init_user", _MISSING)
        if user is _MISSING:
            if self._fallback is not _MISSING:
                return self._fallback
            raise AttributeError("_worker_init_fn")
        slots = getattr(obj, "_dlw_slots", None)
        if slots is None:
            return user
        hook = getattr(obj, "_dlw_init_hook", None)
        if hook is None or hook.user_fn is not user:
            hook = _worker.WorkerHook(user, slots)
            obj._dlw_init_hook = hook
        return hook

    def __set__(self, obj, value) -> None:
        obj._dlw_init_user = value

    def __delete__(self, obj) -> None:
        try:
            del obj._dlw_init_user
        except AttributeError:
            pass
