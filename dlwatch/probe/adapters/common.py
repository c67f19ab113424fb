"""What the adapters share: patching one method of a library's class once,
walking a pipeline's graph, and describing thread and process workers."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from dlwatch.probe import consumer, patches, postimport
from dlwatch.probe.stats import workers_of as workers_of

# How many objects a walk over a pipeline's graph visits at most.
MAX_NODES = 64


class MethodPatch:
    """``cls.<name>`` wrapped by ``make(orig)`` once ``module`` is imported;
    ``uninstall`` puts the original back."""

    def __init__(self, module: str, cls_name: str, name: str, make: Callable[[Any], Any]) -> None:
        self.module, self.cls_name, self.name, self.make = module, cls_name, name, make
        self.finder: postimport.PostImportFinder | None = None
        self.cls: Any = None
        self.orig: Any = None

    def install(self) -> None:
        self.finder = postimport.now_or_on_import(self.module, self.cls_name, self._patch, self.finder)

    def _patch(self, mod) -> None:
        if self.cls is not None:
            return
        cls = getattr(mod, self.cls_name)
        orig = cls.__dict__.get(self.name)
        if orig is None:
            return
        wrapper = self.make(orig)
        wrapper._dlwatch_orig = orig
        wrapper.__doc__ = getattr(orig, "__doc__", None)
        setattr(cls, self.name, wrapper)
        self.cls, self.orig = cls, orig

    def uninstall(self) -> None:
        postimport.disarm(self.finder)
        self.finder = None
        if self.cls is not None:
            setattr(self.cls, self.name, self.orig)
            self.cls = self.orig = None


def iter_wrapper(orig_iter: Any, on_iter: Callable[[Any, Any], Any]) -> Any:
    """``__iter__`` as the library wrote it, then ``on_iter(obj, it)``: the
    iterator the loop gets (``it`` itself, or a proxy that times it). Never
    raises into the job: on any failure the library's own iterator."""

    def __iter__(self, *args, **kwargs):
        it = orig_iter(self, *args, **kwargs)
        try:
            return on_iter(self, it)
        except Exception:
            return it

    return __iter__


def iter_patch(module: str, cls_name: str, on_iter: Callable[[Any, Any], Any]) -> MethodPatch:
    """``cls.__iter__`` wrapped by ``iter_wrapper`` once ``module`` is imported."""
    return MethodPatch(module, cls_name, "__iter__", lambda orig: iter_wrapper(orig, on_iter))


def start_epoch(
    source: Any,
    it: Any,
    config: dict,
    describe: Callable[[Any], dict],
    fresh: bool = False,
    key: Any = None,
    processes: Callable[[Any], list] | None = None,
) -> None:
    """The loop got ``it`` from ``source``: measure it as a new epoch of
    ``source``'s loader, with ``describe(source)`` read at each frame
    (``fresh``: this epoch's reader replaces the last one's) and
    ``processes(source)``, the pipeline's worker ``Process`` objects, read
    where the death scan and a stack request need them."""
    if patches._in_worker_process():
        return
    st = patches.registry.for_source(source, config, key)
    if st.autotune is None and _autotune_on():
        lib = config.get("library") or "this pipeline"
        st.autotune = {
            "state": "left alone",
            "reason": f"autotune sets a torch DataLoader's num_workers; {lib} has no setting it can change",
            "changes": [],
        }
    if fresh or st.describe is None:
        ref = _ref(source)
        st.describe = lambda: _describe_ref(ref, describe)
        if processes is not None:
            st.pipeline_procs = lambda: _procs_ref(ref, processes)
    consumer.measure(it, st)


def _autotune_on() -> bool:
    """``dlwatch run --autotune``, as probe/autotune.py decides it (imported
    only where its variable is set, as dlwatch.hook does)."""
    if not os.environ.get("DLWATCH_AUTOTUNE"):
        return False
    from dlwatch.probe import autotune

    return autotune.enabled()


def _ref(obj: Any) -> Callable[[], Any]:
    try:
        return weakref.ref(obj)
    except TypeError:
        return lambda: obj


def _describe_ref(ref: Callable[[], Any], describe: Callable[[Any], dict]) -> dict:
    obj = ref()
    if obj is None:
        return {}
    try:
        return describe(obj)
    except Exception:
        return {}


def _procs_ref(ref: Callable[[], Any], processes: Callable[[Any], list]) -> list:
    obj = ref()
    if obj is None:
        return []
    try:
        return [p for p in processes(obj) if isinstance(getattr(p, "pid", None), int)]
    except Exception:
        return []


def walk(root: Any, attrs: tuple[str, ...]) -> Iterator[Any]:
    """``root`` and the objects reachable through ``attrs`` (each an object
    or a list/tuple of them), breadth first, each once."""
    seen: set[int] = set()
    todo = [root]
    while todo and len(seen) < MAX_NODES:
        obj = todo.pop(0)
        if obj is None or id(obj) in seen:
            continue
        seen.add(id(obj))
        yield obj
        for a in attrs:
            try:
                v = obj.__dict__.get(a) if hasattr(obj, "__dict__") else getattr(obj, a, None)
            except Exception:
                continue
            if isinstance(v, (list, tuple)):
                todo.extend(v)
            elif v is not None:
                todo.append(v)


def qsize(q: Any) -> int | None:
    try:
        return int(q.qsize())
    except Exception:
        return None
