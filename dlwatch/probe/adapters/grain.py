"""Grain: the loop iterates a ``grain.DataLoader`` or an ``IterDataset``.

- the loop's ``next()``: Grain puts an ``_OutputIterDataset`` at the end of
  every pipeline (``grain.DataLoader``'s included); the iterator its
  ``__iter__`` returns is the one the loop steps, measured;
- workers: a ``PrefetchDatasetIterator``'s thread pool (``ReadOptions
  (num_threads=…)``, threads named ``grain-prefetch_N``) and ``mp_prefetch``'s
  processes (``MultiprocessingOptions(num_workers=…)``);
- buffer: the prefetch buffer against ``ReadOptions(prefetch_buffer_size=…)``;
- in Grain's own worker processes nothing is measured (they are not the loop).

Grain before 0.2.16 (the last for Python 3.10 is 0.2.13) has no output
stage: there every ``IterDataset`` class's own ``__iter__`` is wrapped, and
the outermost call on a thread (the loop's ``iter(ds)``; the parents'
``__iter__`` run inside it) is the epoch's iterator.
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from dlwatch.probe import postimport
from dlwatch.probe.adapters.common import MethodPatch, iter_patch, iter_wrapper, start_epoch, walk, workers_of

LIBRARY = "grain"
# Parents, and mp_prefetch's per-worker iterators (``_iterators_in_use`` of
# its interleave). Not the interleave's own ``_prefetch_ds_iter``: a thread
# pool that makes those iterators, not the user's ReadOptions.
_GRAPH = ("_parents", "_iter_parent", "_maybe_nonnative_parent", "_iterator", "_iterators_in_use")
# Grain's own per-worker parts of an mp_prefetch pipeline: iterated inside
# the loop's pipeline, never by the loop.
_INTERNAL = ("ProcessPrefetchIterDataset",)
_WORKER_FLAG = "grain._src.python.dataset.transformations.process_prefetch"


# Grain < 0.2.16's mp_prefetch: its worker processes run this function.
_POOL = "grain._src.python.grain_pool"


def _in_grain_worker() -> bool:
    mod = sys.modules.get(_WORKER_FLAG)
    if getattr(mod, "_is_in_worker_process", False):
        return True
    # Grain < 0.2.16 keeps no flag: a worker is a process whose thread runs
    # the pool's worker loop below this call (read once an epoch).
    loop = getattr(getattr(sys.modules.get(_POOL), "_worker_loop", None), "__code__", None)
    f = sys._getframe(1) if loop is not None else None
    while f is not None:
        if f.f_code is loop:
            return True
        f = f.f_back
    return False


# Grain < 0.2.16's mp_prefetch pools, as they are made: a pool is a local
# of the pipeline's reader thread, out of the graph's reach.
_pools: weakref.WeakSet[Any] = weakref.WeakSet()


def _register_pool(orig_init: Any) -> Any:
    def __init__(pool: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(pool, *args, **kwargs)
        try:
            _pools.add(pool)
        except Exception:
            pass

    return __init__


_pool_patch = MethodPatch(_POOL, "GrainPool", "__init__", _register_pool)


def _pool_processes(node: Any) -> list[Any]:
    """The worker processes of the pool that feeds this mp_prefetch iterator.

    The pool is a local of the iterator's reader thread; what ties the two is
    the reader's termination event, which the iterator makes and hands to the
    pool. Two mp_prefetch pipelines at once (train and eval) each list their
    own workers."""
    event = getattr(getattr(node, "_raw_iterator", None), "_termination_event", None)
    if event is None:
        return []
    out: list[Any] = []
    for pool in list(_pools):
        if getattr(pool, "_reader_termination_event", None) is event:
            out.extend(getattr(pool, "processes", None) or ())
    return out


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
    start_epoch(it, it, _config(src), describe_graph, fresh=True, key=_shape(src), processes=processes)


_MODULE = "grain._src.python.dataset.dataset"
_patch = iter_patch(_MODULE, "_OutputIterDataset", _on_output_iter)


def _note_dataloader(orig_init: Any) -> Any:
    """A ``grain.DataLoader``'s iterator steps the pipeline's own iterator
    (the one measured), which keeps no reference to the loader: tie the
    two, weakly, so the loader's arguments name its knobs."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        orig_init(self, *args, **kwargs)
        try:
            self._iterator._dlw_grain_loader = weakref.ref(self._data_loader)
        except Exception:
            pass

    return __init__


_dl_patch = MethodPatch("grain._src.python.data_loader", "DataLoaderIterator", "__init__", _note_dataloader)


def install() -> None:
    _patch.install()
    _dl_patch.install()
    _legacy.finder = postimport.now_or_on_import(_MODULE, "IterDataset", _legacy.install, _legacy.finder)


def uninstall() -> None:
    _patch.uninstall()
    _dl_patch.uninstall()
    _legacy.uninstall()


class _BeforeOutputStage:
    """Grain < 0.2.16: each ``IterDataset`` class's own ``__iter__`` wrapped
    (those defined later too, through the metaclass's ``__init__``); only
    the outermost call on a thread starts an epoch, so the parents'
    iterators, made inside it, are not loaders of their own."""

    def __init__(self) -> None:
        self.finder: postimport.PostImportFinder | None = None
        self.meta: Any = None
        self.meta_init: Any = None  # the metaclass's own __init__, if it had one
        self.wrapped: dict[Any, Any] = {}  # class -> its own __iter__, as Grain wrote it
        self.depth = threading.local()

    def install(self, mod: Any) -> None:
        base = getattr(mod, "IterDataset", None)
        if base is not None and not hasattr(mod, "_OutputIterDataset"):
            self.install_on(base)

    def install_on(self, base: Any) -> None:
        """Every class under ``base`` (``IterDataset``), now and later."""
        meta = type(base)
        if self.meta is not None or meta is type:
            return
        own_init = meta.__dict__.get("__init__")
        legacy = self

        def __init__(cls: Any, name: str, bases: tuple, ns: dict, **kw: Any) -> None:
            if own_init is not None:
                own_init(cls, name, bases, ns, **kw)
            else:
                type.__init__(cls, name, bases, ns, **kw)
            try:
                legacy.wrap(cls)
            except Exception:
                pass

        self.meta, self.meta_init = meta, own_init
        meta.__init__ = __init__
        _pool_patch.install()
        todo = [base]
        while todo:
            cls = todo.pop()
            self.wrap(cls)
            todo.extend(cls.__subclasses__())

    def wrap(self, cls: Any) -> None:
        orig = cls.__dict__.get("__iter__")
        if orig is None or cls in self.wrapped or getattr(orig, "__isabstractmethod__", False):
            return
        depth = self.depth

        def __iter__(ds: Any, *args: Any, **kwargs: Any) -> Any:
            d = getattr(depth, "n", 0)
            depth.n = d + 1
            try:
                it = orig(ds, *args, **kwargs)
            finally:
                depth.n = d
            if d == 0:
                try:
                    _on_later_iter(ds, it)
                except Exception:
                    pass
            return it

        __iter__._dlwatch_orig = orig  # type: ignore[attr-defined]
        __iter__.__doc__ = getattr(orig, "__doc__", None)
        self.wrapped[cls] = orig
        cls.__iter__ = __iter__

    def uninstall(self) -> None:
        postimport.disarm(self.finder)
        self.finder = None
        _pool_patch.uninstall()
        for cls, orig in self.wrapped.items():
            cls.__iter__ = orig
        self.wrapped.clear()
        if self.meta is not None:
            if self.meta_init is not None:
                self.meta.__init__ = self.meta_init
            else:
                del self.meta.__init__
            self.meta = self.meta_init = None


_legacy = _BeforeOutputStage()


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


def _ready_in_order(futures: list[Any]) -> tuple[int, int]:
    """(ready, in flight) of a prefetch buffer of futures, handed out in
    order: only the done ones at its head are ready, as Grain's own
    prefetch-depth metric counts them. Its length counts every submitted
    fetch (a QA run: "ready 16 / 16" while both threads were deadlocked)."""
    ready = 0
    for f in futures:
        done = getattr(f, "done", None)
        if not callable(done) or not done():
            break
        ready += 1
    return ready, len(futures) - ready


def processes(it: Any) -> list[Any]:
    """mp_prefetch's worker processes that run: none whose stop is set
    (Grain joins, then kills, a worker it stops: not a death)."""
    out: list[Any] = []
    for node in walk(it, _GRAPH):
        if type(node).__name__ == "_MultiprocessPrefetchDatasetIterator":
            out.extend(_pool_processes(node))
        p = getattr(node, "_prefetch_process", None)
        stop = getattr(node, "_prefetch_should_stop", None)
        if p is not None and not (stop is not None and stop.is_set()):
            out.append(p)
    return out


def _dataloader_knobs(it: Any) -> tuple[dict[str, Any], int | None] | None:
    """A ``grain.DataLoader``'s own arguments, read from the loader its
    iterator keeps: the knobs as the script writes them (``worker_count=``,
    ``worker_buffer_size=``), not the datasets Grain builds from them (a QA
    run of a public trainer listed ``MultiprocessingOptions.num_workers`` and
    ``ThreadPrefetchIterDataset.prefetch_buffer_size``, classes its code never
    names), and its ``Batch`` operation's size; None for a dataset pipeline."""
    ref = getattr(it, "_dlw_grain_loader", None)
    dl = ref() if callable(ref) else None
    if dl is None:
        return None
    mp = getattr(dl, "_multiprocessing_options", None)
    n = getattr(mp, "num_workers", None)
    knobs: dict[str, Any] = {}
    if isinstance(n, int):
        knobs["DataLoader.worker_count"] = n
        b = getattr(mp, "per_worker_buffer_size", None)
        if n > 0 and isinstance(b, int):
            knobs["DataLoader.worker_buffer_size"] = b
    batch = None
    for op in getattr(dl, "_operations", None) or ():
        size = getattr(op, "batch_size", None)
        if type(op).__name__ == "Batch" and isinstance(size, int) and not isinstance(size, bool):
            batch = size
    return knobs, batch


def describe_graph(it: Any) -> dict:
    out = _describe_graph(it)
    try:
        own = _dataloader_knobs(it)
    except Exception:
        own = None
    if own is None:
        return out
    knobs, batch = own
    graph = out["knobs"]
    # The per-worker buffer is what mp_prefetch's interleave prefetches each
    # worker's batches with: worker_buffer_size, already listed.
    graph.pop("ThreadPrefetchIterDataset.prefetch_buffer_size", None)
    graph.pop("MultiprocessingOptions.num_workers", None)
    # worker_count is the DataLoader's worker knob, first (facts.knob() names
    # the first that matches). At 0 the operations (maps, Batch) run in the
    # loop's own thread inside next(), as a torch DataLoader's loading does
    # at num_workers=0, and the ReadOptions threads only read records ahead:
    # the loader has no workers, and its threads are listed for their CPU.
    # Its read-ahead buffer then holds records, not batches: full while the
    # loop waits on its own maps, it is no prefetch queue of the loop's.
    out["knobs"] = {**knobs, **graph}
    if knobs.get("DataLoader.worker_count") == 0:
        out["num_workers"] = 0
        out["queue"] = {"ready": None, "in_flight": None, "capacity": None}
    if batch is not None:
        out["batch_size"] = batch
    return out


def _describe_graph(it: Any) -> dict:
    knobs: dict[str, Any] = {}
    threads: list[Any] = []
    procs: list[Any] = []
    queue: dict[str, int | None] = {"ready": None, "in_flight": None, "capacity": None}
    for node in walk(it, _GRAPH):
        name = type(node).__name__
        if name == "PrefetchDatasetIterator":
            # Grain < 0.2.16 names them without "_target".
            n = getattr(node, "_target_num_threads", getattr(node, "_num_threads", None))
            b = getattr(node, "_target_prefetch_buffer_size", getattr(node, "_prefetch_buffer_size", None))
            if isinstance(n, int):
                knobs["ReadOptions.num_threads"] = n
            if isinstance(b, int):
                knobs["ReadOptions.prefetch_buffer_size"] = b
                queue["capacity"] = b
            buf = getattr(node, "_buffer", None)
            if buf is not None:
                try:
                    queue["ready"], queue["in_flight"] = _ready_in_order(list(buf))
                except Exception:
                    pass
            ex = getattr(node, "_executor", None)
            threads.extend(sorted(getattr(ex, "_threads", ()) or (), key=lambda t: t.name))
        elif name == "ThreadPrefetchDatasetIterator":
            b = getattr(node, "_target_prefetch_buffer_size", None)
            if isinstance(b, int):
                knobs["ThreadPrefetchIterDataset.prefetch_buffer_size"] = b
        elif name == "_MultiprocessPrefetchDatasetIterator":
            procs.extend(_pool_processes(node))
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
