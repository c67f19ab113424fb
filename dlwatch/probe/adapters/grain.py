"""Grain: the loop iterates a ``grain.DataLoader`` or an ``IterDataset``.

- the loop's ``next()``: Grain puts an ``_OutputIterDataset`` at the end of
  every pipeline (``grain.DataLoader``'s included); the iterator its
  ``__iter__`` returns is the one the loop steps, measured;
- workers: a ``PrefetchDatasetIterator``'s thread pool (``ReadOptions
  (num_threads=…)``, threads named ``grain-prefetch_N``) and ``mp_prefetch``'s
  processes (``MultiprocessingOptions(num_workers=…)``);
- buffer: the prefetch buffer against ``ReadOptions(prefetch_buffer_size=…)``;
- in Grain's own worker processes nothing is measured (they are not the loop).
"""

from __future__ import annotations

import sys
from typing import Any

from dlwatch.probe.adapters.common import iter_patch, iter_wrapper, start_epoch, walk, workers_of

LIBRARY = "grain"
# Parents, and mp_prefetch's per-worker iterators (``_iterators_in_use`` of
# its interleave). Not the interleave's own ``_prefetch_ds_iter``: a thread
# pool that makes those iterators, not the user's ReadOptions.
_GRAPH = ("_parents", "_iter_parent", "_maybe_nonnative_parent", "_iterator", "_iterators_in_use")
# Grain's own per-worker parts of an mp_prefetch pipeline: iterated inside
# the loop's pipeline, never by the loop.
_INTERNAL = ("ProcessPrefetchIterDataset",)
_WORKER_FLAG = "grain._src.python.dataset.transformations.process_prefetch"


def _in_grain_worker() -> bool:
    mod = sys.modules.get(_WORKER_FLAG)
    return bool(getattr(mod, "_is_in_worker_process", False))


def _on_output_iter(output: Any, it: Any) -> Any:
    """The pipeline's output stage made the epoch's iterator (a dataset's
    first ``iter()``)."""
    src = getattr(output, "_parent", None) or output
    if not _in_grain_worker() and type(src).__name__ not in _INTERNAL:
        _measure_later_epochs(src)
        _start(src, it)
    return it


def _start(src: Any, it: Any) -> None:
    # Pipelines are often rebuilt every epoch: one loader per shape. The
    # epoch's iterator stands for the loader (the dataset may be dropped once
    # iterated): it is what is alive while the loop runs, and what is read.
    start_epoch(it, it, _config(src), describe_graph, fresh=True, key=_shape(src))


_patch = iter_patch("grain._src.python.dataset.dataset", "_OutputIterDataset", _on_output_iter)
install, uninstall = _patch.install, _patch.uninstall


def _shape(src: Any) -> tuple[str, ...]:
    """The pipeline's datasets' classes, outermost first: the same for a
    pipeline rebuilt each epoch, different for a second pipeline (an eval's
    of another shape shares a loader with training only if built alike)."""
    names: list[str] = ["grain"]
    for node in walk(src, ("_parents", "_parent")):
        names.append(type(node).__name__)
    return tuple(names[:32])


def _config(src: Any) -> dict:
    name = type(src).__name__
    if name == "_DataLoaderPipelineMarkerIterDataset":
        name = "grain.DataLoader"
    return {"num_workers": 0, "library": LIBRARY, "kind": "grain", "dataset": name[:80]}


def describe_graph(it: Any) -> dict:
    knobs: dict[str, Any] = {}
    threads: list[Any] = []
    procs: list[Any] = []
    queue: dict[str, int | None] = {"ready": None, "in_flight": None, "capacity": None}
    for node in walk(it, _GRAPH):
        name = type(node).__name__
        if name == "PrefetchDatasetIterator":
            n = getattr(node, "_target_num_threads", None)
            b = getattr(node, "_target_prefetch_buffer_size", None)
            if isinstance(n, int):
                knobs["ReadOptions.num_threads"] = n
            if isinstance(b, int):
                knobs["ReadOptions.prefetch_buffer_size"] = b
                queue["capacity"] = b
            buf = getattr(node, "_buffer", None)
            if buf is not None:
                try:
                    queue["ready"] = len(buf)
                except Exception:
                    pass
            ex = getattr(node, "_executor", None)
            threads.extend(sorted(getattr(ex, "_threads", ()) or (), key=lambda t: t.name))
        elif name == "ThreadPrefetchDatasetIterator":
            b = getattr(node, "_target_prefetch_buffer_size", None)
            if isinstance(b, int):
                knobs["ThreadPrefetchIterDataset.prefetch_buffer_size"] = b
        p = getattr(node, "_prefetch_process", None)
        if p is not None:
            procs.append(p)
    out: dict[str, Any] = {"knobs": knobs, "queue": queue}
    if procs:
        # The ReadOptions threads run inside the worker processes: not this
        # process's to count; the processes are the pipeline's workers.
        for k in ("ReadOptions.num_threads", "ReadOptions.prefetch_buffer_size"):
            knobs.pop(k, None)
        queue["capacity"] = queue["ready"] = None
        knobs["MultiprocessingOptions.num_workers"] = len(procs)
        out["num_workers"] = len(procs)
        out["worker_kind"] = "process"
        out["pipeline_workers"] = workers_of(procs)
    elif "ReadOptions.num_threads" in knobs:
        out["num_workers"] = knobs["ReadOptions.num_threads"]
        out["worker_kind"] = "thread"
        out["pipeline_workers"] = workers_of(threads)
    return out


_iter_classes: dict[type, type] = {}


def _on_later_iter(src: Any, it: Any) -> Any:
    if (
        getattr(it, "_dlw_stats", None) is None
        and not _in_grain_worker()
        and type(src).__name__ not in _INTERNAL
    ):
        _start(src, it)
    return it


def _measure_later_epochs(src: Any) -> None:
    """Grain injects its output stage only at a dataset's first ``iter()``
    (the dataset then ``has_child``): later epochs' iterators come straight
    from the dataset's own ``__iter__``. So the dataset's class is swapped,
    once, for a subclass whose ``__iter__`` measures what it returns."""
    cls = type(src)
    if getattr(cls, "_dlw_iter_measured", False):
        return
    sub = _iter_classes.get(cls)
    if sub is None:
        __iter__ = iter_wrapper(cls.__iter__, _on_later_iter)
        ns = {"__iter__": __iter__, "__slots__": (), "_dlw_iter_measured": True, "__module__": cls.__module__}
        sub = type(cls.__name__, (cls,), ns)
        sub.__qualname__ = cls.__qualname__
        _iter_classes[cls] = sub
    try:
        src.__class__ = sub
    except TypeError:
        pass
