"""torchdata.nodes: the loop iterates a ``Loader`` over a graph of nodes.

- the loop's ``next()``: the ``LoaderIterator`` that ``Loader.__iter__``
  returns (the same object every epoch, reset each time), measured;
- workers: each ``ParallelMapper``'s ``num_workers`` threads (its default
  ``method="thread"``) or processes (``method="process"``);
- buffer: the mapper's output queue against its ``max_concurrent`` bound;
- knobs: ``ParallelMapper(num_workers=…, method=…)``,
  ``Prefetcher(prefetch_factor=…)``, ``Batcher(batch_size=…)``;
- pinning: whether the graph has a ``PinMemory`` node (the pipeline's
  ``pin_memory=True``), so enable-pin-memory can speak of one.
"""

from __future__ import annotations

from typing import Any

from dlwatch.probe.adapters.common import iter_patch, qsize, start_epoch, walk, workers_of

LIBRARY = "torchdata.nodes"
_GRAPH = ("root", "source", "_it", "_source", "sources")


def _on_iter(loader: Any, it: Any) -> Any:
    start_epoch(loader, it, _config(loader), describe, processes=processes)
    return it


_patch = iter_patch("torchdata.nodes.loader", "Loader", _on_iter)
install, uninstall = _patch.install, _patch.uninstall


def _config(loader: Any) -> dict:
    return {
        "num_workers": 0,
        "library": LIBRARY,
        "kind": "nodes",
        "dataset": type(loader.root).__name__,
        "iterator": "LoaderIterator",
    }


def processes(loader: Any) -> list[Any]:
    """The ``method="process"`` workers of the graph's running mappers; none
    of a mapper whose stop is set (its workers exit then by design)."""
    out: list[Any] = []
    for node in walk(loader.root, _GRAPH):
        if type(node).__name__ != "_ParallelMapperIter" or getattr(node, "method", None) != "process":
            continue
        stop = getattr(node, "_stop", None)
        if stop is not None and stop.is_set():
            continue
        out.extend(getattr(node, "_workers", ()) or ())
    return out


def describe(loader: Any) -> dict:
    knobs: dict[str, Any] = {}
    workers: list[Any] = []
    out: dict[str, Any] = {}
    queue: dict[str, int | None] = {"ready": None, "in_flight": None, "capacity": None}
    kind = None
    pinned = False
    for node in walk(loader.root, _GRAPH):
        name = type(node).__name__
        pinned = pinned or name == "PinMemory"
        if name == "ParallelMapper":
            knobs["ParallelMapper.num_workers"] = int(getattr(node, "num_workers", 0) or 0)
            kind = str(getattr(node, "method", "thread"))
            knobs["ParallelMapper.method"] = kind
            mc = getattr(node, "max_concurrent", None)
            if isinstance(mc, int):
                knobs["ParallelMapper.max_concurrent"] = mc
        elif name == "_ParallelMapperIter":
            workers.extend(getattr(node, "_workers", ()) or ())
            ready = qsize(getattr(node, "_out_q", None))
            if ready is not None:
                queue["ready"] = ready
            cap = getattr(node, "_max_tasks", None)
            queue["capacity"] = cap if isinstance(cap, int) else None
        elif name == "Prefetcher":
            pf = getattr(node, "prefetch_factor", None)
            if isinstance(pf, int):
                knobs["Prefetcher.prefetch_factor"] = pf
        elif name == "Batcher":
            bs = getattr(node, "batch_size", None)
            if isinstance(bs, int):
                out["batch_size"] = bs
    if "ParallelMapper.num_workers" in knobs:
        out["num_workers"] = knobs["ParallelMapper.num_workers"]
        out["worker_kind"] = kind
    out["pin_memory"] = pinned
    out["knobs"] = knobs
    out["pipeline_workers"] = workers_of(workers)
    out["queue"] = queue
    return out
