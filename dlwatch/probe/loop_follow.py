"""Which loader a profile burst follows: the one the training loop steps now.

A burst is asked for "the loop", not for a loader object. Scripts that build
a new ``DataLoader`` every pass or every epoch (a new sampler seed, a
re-shard, a dataset rebuilt) step a new loader object each time, and each
gets its own counters (``stats.Registry``: one per loader object). A burst
bound to the object it found first waited for a loader that had finished
("loader 0 took no step within 60 s"). So the profiler's burst moves on,
once its loader's epoch is over, to a newer loader of the same shape
(dataset class, kind, library: what the loop builds again each pass) that
is stepped from the line and thread that stepped the old one (an eval
loader over the same dataset class is stepped from another line). A worker
profile, which sees iterators made rather than steps, arms the workers of
its loader and of every newer loader of its shape. Bursts only: nothing
here runs on the hot path when no burst is armed.
"""

from __future__ import annotations

from typing import Any


def shape(st) -> tuple:
    """What stays the same when the loop builds its loader again: not the
    object, its sizes or its worker count (a tuner may change those), but
    what it reads and how."""
    cfg: dict[str, Any] = getattr(st, "config", None) or {}
    wrappers = cfg.get("dataset_wrappers")
    return (
        cfg.get("dataset"),
        cfg.get("kind"),
        tuple(wrappers) if isinstance(wrappers, (list, tuple)) else None,
        cfg.get("library"),
        cfg.get("loader_class"),
        getattr(st, "internal", False),
    )


def successor(current, st) -> bool:
    """``st`` is a newer loader the loop built in place of ``current``."""
    if st is None or current is None or st is current:
        return False
    try:
        return st.id > current.id and shape(st) == shape(current)
    except Exception:
        return False


def finished(st) -> bool:
    """Its epoch is over: its last ``next()`` raised StopIteration, or its
    iterator is gone (a loop that left with ``break``)."""
    try:
        ref = st.iter_ref
        return not st.epoch_t0 or ref is None or ref() is None
    except Exception:
        return False


def newest_of_loop(chosen, loaders) -> Any:
    """The loader of ``chosen``'s loop that is stepping now: once
    ``chosen``'s epoch is over, the newest of its shape that has an
    iterator or has returned batches (a loop that builds a DataLoader every
    pass left the older ones finished). A loader mid-epoch stays the one:
    a newer one of its shape may be an eval between its epochs."""
    best = chosen
    for st in loaders:
        if not successor(best, st) or not finished(best):
            continue
        ref = getattr(st, "iter_ref", None)
        if st.batches > 0 or (ref is not None and ref() is not None):
            best = st
    return best


def pick(loaders, recent: dict[int, int]) -> Any:
    """The loader a burst asked for now is for. ``recent``: each loader's
    batches as of a second ago. Candidates: loaders with a live iterator
    or batches in that second. The loop is the shape with the most batches
    in that second (a loop that builds a DataLoader every pass spreads its
    batches over several objects, and an eval running at the moment of the
    request is not the loop); in it, the loader with the most (ties: the
    last to return one), or the newest of its shape once its epoch is over."""
    cands = []
    for st in loaders:
        ref = getattr(st, "iter_ref", None)
        n = st.batches - recent.get(st.id, 0)
        if n > 0 or (ref is not None and ref() is not None):
            cands.append((st, n))
    if not cands:
        return None
    by_shape: dict[tuple, list] = {}
    for st, n in cands:
        by_shape.setdefault(shape(st), []).append((st, n))
    group = max(by_shape.values(), key=lambda g: (sum(n for _, n in g), max(st.t_last for st, _ in g)))
    busiest = max(group, key=lambda c: (c[1], c[0].t_last))[0]
    return newest_of_loop(busiest, [st for st, _ in group])
