"""Measure the training loop's ``next()`` on iterators that are not torch's.

Two ways, the same hot path as the DataLoader patch (patches._wrap_next):

- ``measure(it, st)``: an adapter hands over the iterator its library gave
  the loop (torchdata.nodes' ``LoaderIterator``, Grain's outermost
  ``DatasetIterator``). Its class is swapped for a subclass whose only change
  is a timed ``__next__`` (cached per class), so ``isinstance``, attributes
  and the library's own checks see what they saw; where a class cannot be
  swapped (``__slots__`` of another layout, a C type), nothing is measured.
- ``watch(iterable, name=...)``: the public one-liner for anything else (a
  generator, a custom prefetcher, Ray's or DALI's iterators): a thin proxy
  whose ``__next__`` is timed and whose other attributes are the original's.

Every measured iterator belongs to a ``LoaderStats`` made by
``registry.for_source`` and is published like a DataLoader.
"""

from __future__ import annotations

import operator
import os
import sys
import threading
import types
from time import perf_counter as _clock
from typing import Any

from dlwatch.probe import patches
from dlwatch.probe.handover import EXACT
from dlwatch.probe.stats import LoaderStats

_measured: dict[type, type] = {}
_lock = threading.Lock()


def _timed_class(cls: type) -> type:
    sub = _measured.get(cls)
    if sub is not None:
        return sub
    with _lock:
        sub = _measured.get(cls)
        if sub is None:
            orig = cls.__next__  # type: ignore[attr-defined]
            # Dressed as the library's own __next__ (frames.py): an exception
            # from the pipeline shows no dlwatch file in the user's traceback.
            nxt = patches._wrap_next(orig, sys.modules.get(getattr(orig, "__module__", "")))
            ns = {
                "__next__": nxt,
                "__slots__": (),
                "_dlw_measured": cls,
                "_dlw_stats": None,
                "__module__": cls.__module__,
            }
            sub = type(cls.__name__, (cls,), ns)
            sub.__qualname__ = cls.__qualname__
            _measured[cls] = sub
    return sub


def measure(it: Any, st: LoaderStats) -> bool:
    """Time ``it.__next__`` into ``st`` from now on (a new epoch begins).
    False, and ``it`` untouched, where its class cannot be swapped."""
    try:
        cls = type(it)
        if getattr(cls, "_dlw_measured", None) is None:
            it.__class__ = _timed_class(cls)
        it._dlw_stats = st
        st.begin_epoch(it, _clock())
        patches.announce(st)
        return True
    except Exception:
        return False


class _Forwarding:
    """Everything but iteration is the wrapped object's (``_dlw_src``)."""

    _dlw_src: Any

    def __len__(self) -> int:
        return len(self._dlw_src)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_dlw_"):
            raise AttributeError(name)
        return getattr(self._dlw_src, name)


class _Watched(_Forwarding):
    """What ``watch()`` returns for an iterable: each ``iter()`` an epoch."""

    def __init__(self, src: Any, st: LoaderStats) -> None:
        self._dlw_src = src
        self._dlw_st = st

    def __iter__(self) -> _WatchedIterator:
        it = _proxy(iter(self._dlw_src), self._dlw_st)
        self._dlw_st.begin_epoch(it, _clock())
        patches.announce(self._dlw_st)
        return it

    def __repr__(self) -> str:
        return f"dlwatch.watch({self._dlw_src!r})"


class _WatchedIterator(_Forwarding):
    """A timed iterator around ``src`` (``__next__`` is made below)."""

    def __init__(self, src: Any, st: LoaderStats) -> None:
        self._dlw_next = src.__next__
        self._dlw_src = src
        self._dlw_stats = st

    def __iter__(self) -> _WatchedIterator:
        return self


# Called from C (no frame of its own in a traceback); patches._wrap_next
# registers the wrapper's code in stats.METER_CODES (nesting).
_call_src = operator.methodcaller("_dlw_next")
_WatchedIterator.__next__ = patches._wrap_next(_call_src)  # type: ignore[attr-defined]

_dressed: dict[Any, type[_WatchedIterator]] = {}
_DRESSED_MAX = 64  # distinct generator functions; past it, proxies stay plain


def _proxy(src: Any, st: LoaderStats) -> _WatchedIterator:
    """A ``_WatchedIterator`` around ``src`` whose timed frame is dressed as
    ``src``'s generator function (frames.py), so an exception from the
    pipeline shows the library's file, or the user's, never dlwatch's. Plain
    for iterators that are not Python generators."""
    cls: type[_WatchedIterator] = _WatchedIterator
    code = getattr(src, "gi_code", None)
    frame = getattr(src, "gi_frame", None)
    if code is not None and frame is not None:
        sub = _dressed.get(code)
        if sub is None and len(_dressed) < _DRESSED_MAX:
            try:
                like = types.SimpleNamespace(__code__=code, __qualname__="__next__")
                mod = sys.modules.get(frame.f_globals.get("__name__", ""))
                nxt = patches._wrap_next(_call_src, mod, like=like)
                if nxt.__code__.co_filename == code.co_filename:
                    made = type("_WatchedIterator", (_WatchedIterator,), {"__next__": nxt, "__slots__": ()})
                    with _lock:
                        sub = _dressed.setdefault(code, made)
            except Exception:
                sub = None
        if sub is not None:
            cls = sub
    return cls(src, st)


def watch_epoch(source: Any, it: Any, config: dict) -> Any:
    """An adapter's proxy for ``it``, one epoch of ``source``'s loader (for
    iterators whose class cannot be swapped: generators)."""
    st = patches.registry.for_source(source, config)
    w = _proxy(it, st)
    st.begin_epoch(w, _clock())
    patches.announce(st)
    return w


def consumer_iter(loader: Any, it: Any, via: str) -> Any:
    """``it``, the loop's iterator over a DataLoader that a thread of the
    library iterates (MONAI's ThreadDataLoader): timed into the consumer
    counters of that DataLoader's stats, which its iterator picks up
    (patches._on_new_iterator: ``loader._dlw_consumer``)."""
    if patches._in_worker_process():
        return it
    c = getattr(loader, "_dlw_consumer", None)
    if c is None:
        c = LoaderStats(-1, None, {"via": via})
        c.handover_q = EXACT
        loader._dlw_consumer = c
    w = _proxy(it, c)
    c.begin_epoch(w, _clock())
    th = threading.current_thread()
    c.thread_name, c.thread_main, c.thread_ident = th.name, th is threading.main_thread(), th.ident
    return w


def watch(iterable: Any, name: str | None = None) -> Any:
    """``iterable``, measured where the training loop takes from it.

    Returns an object that iterates as ``iterable`` does; each ``iter()`` of
    it is an epoch. Given an iterator (a generator), the one epoch is its
    life. With ``DLWATCH_DISABLE=1``, or in a DataLoader worker, returns
    ``iterable`` itself. Never raises: on any failure the original comes back.
    """
    if os.environ.get("DLWATCH_DISABLE", "").strip() not in ("", "0", "false", "no"):
        return iterable
    if isinstance(iterable, (_Watched, _WatchedIterator)) or patches._in_worker_process():
        return iterable
    try:
        label = name or type(iterable).__name__
        config = {
            "num_workers": 0,
            "library": "watch",
            "kind": "watched",
            "dataset": str(label)[:80],
            "iterator": type(iterable).__name__,
        }
        st = patches.registry.for_source(iterable, config)
        st.num_workers = 0
        if iter(iterable) is iterable:
            it = _proxy(iterable, st)
            st.begin_epoch(it, _clock())
            patches.announce(st)
            # The iterator must outlive this call: the stats hold it weakly.
            return it
        return _Watched(iterable, st)
    except Exception:
        return iterable
