"""DataLoader settings overridden from the environment: how ``dlwatch tune``
runs the user's unmodified script with other settings. The document's format
(``DLWATCH_OVERRIDES``, its knobs and limits) is ``dlwatch/overrides.py``.

The variable is read once, at install; ``dlwatch.hook`` installs this only
when it is set, so without it nothing here runs. The patch is on
``DataLoader.__init__`` (once per loader, never per batch) and never raises
into the job: if anything goes wrong the script's own arguments are used.

With ``"replay"`` in the document the selected loaders also get a ``Replay``
(``replay.py``) and ``DataLoader.__iter__`` is patched to route their batches
through it; without it ``__iter__`` stays torch's own.

Nothing the script's own DataLoader would reject is produced: with 0 workers
``prefetch_factor``, ``persistent_workers`` and ``multiprocessing_context``
are cleared (torch raises on each), and ``pin_memory`` is only turned on when
CUDA is available (torch otherwise warns and ignores it).

Stdlib at import; torch only once its dataloader module is imported anyway.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from dlwatch.overrides import ENV_VAR, KNOBS, OverrideError, parse, resolve
from dlwatch.probe import postimport

TARGET_MODULE = "torch.utils.data.dataloader"

_spec: dict | None = None
_seen: dict[tuple, int] = {}
_lock = threading.Lock()
_orig_init = None
_orig_iter = None
_finder = None
# The replays armed on selected loaders, with each loader's dataset: a
# framework may iterate a loader it built from the script's over the same
# dataset (Accelerate's prepare(), and the HF Trainer through it: a new
# DataLoader inside a DataLoaderShard), and the script's own is then never
# iterated. A QA run: every ceiling trial of a Trainer or Accelerate job
# ended "the loader did not start replaying within 60 s".
_armed: list[tuple[Any, Any]] = []


def install() -> None:
    """Read the variable and patch DataLoader.__init__ (now, or when torch's
    dataloader module is imported). Idempotent; a malformed value is ignored
    with one line on stderr (the job runs with its own settings)."""
    global _spec, _finder
    if _spec is not None:
        return
    text = os.environ.get(ENV_VAR, "").strip()
    if not text:
        return
    try:
        _spec = parse(text)
    except OverrideError as e:
        print(f"dlwatch: ignoring {ENV_VAR}: {e}", file=sys.stderr)
        return
    mod = sys.modules.get(TARGET_MODULE)
    if mod is not None and hasattr(mod, "DataLoader"):
        _patch(mod)
    elif _finder is None:
        _finder = postimport.arm(TARGET_MODULE, _patch)


def uninstall() -> None:
    global _spec, _finder, _orig_init, _orig_iter
    postimport.disarm(_finder)
    _finder = None
    mod = sys.modules.get(TARGET_MODULE)
    if mod is not None and _orig_init is not None:
        mod.DataLoader.__init__ = _orig_init
    if mod is not None and _orig_iter is not None:
        mod.DataLoader.__iter__ = _orig_iter
    _orig_init = _orig_iter = None
    _spec = None
    _seen.clear()
    _armed.clear()


def _patch(mod) -> None:
    global _orig_init
    if _orig_init is not None:
        return
    import inspect

    cls = mod.DataLoader
    orig = cls.__init__
    signature = inspect.signature(orig)

    def __init__(self, *args, **kwargs):
        selected = False
        try:
            args, kwargs, selected = _overridden(signature, self, args, kwargs)
        except Exception:
            pass
        out = orig(self, *args, **kwargs)
        if selected:
            _arm_replay(self)
        return out

    __init__.__doc__ = orig.__doc__
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]  # inspect.signature sees the original
    _orig_init = orig
    cls.__init__ = __init__
    if _spec is not None and "replay" in _spec:
        _patch_iter(cls)


def _arm_replay(loader) -> None:
    spec = _spec
    if spec is None or "replay" not in spec:
        return
    try:
        from dlwatch.probe.replay import Replay

        rep = Replay(spec["replay"], loader)
        loader._dlw_replay = rep
        _armed.append((getattr(loader, "dataset", None), rep))
    except Exception:
        pass


def _adopt(loader):
    """The replay of a selected loader never iterated over the same dataset
    as ``loader``, moved to ``loader`` (which is being iterated), or None."""
    ds = getattr(loader, "dataset", None)
    if ds is None:
        return None
    for armed_ds, rep in _armed:
        if armed_ds is ds and not rep.attached:
            rep.move_to(loader)
            return rep
    return None


def _patch_iter(cls) -> None:
    """``iter(loader)`` of a replaying loader: the replaying iterator again
    (no workers spawned, none reset); before that, the loader's own iterator
    with its batches routed through the replay. Patched only in replay mode."""
    global _orig_iter
    orig = cls.__iter__

    def __iter__(self):
        rep = getattr(self, "_dlw_replay", None)
        if rep is None and _armed:
            try:
                rep = _adopt(self)
            except Exception:
                rep = None
        if rep is None:
            return orig(self)
        try:
            if rep.replaying:
                return rep.new_epoch()
        except Exception:
            pass
        it = orig(self)
        try:
            rep.attach(it)
        except Exception:
            pass
        return it

    __iter__.__doc__ = orig.__doc__
    __iter__.__wrapped__ = orig  # type: ignore[attr-defined]
    _orig_iter = orig
    cls.__iter__ = __iter__


def _overridden(signature, self, args: tuple, kwargs: dict) -> tuple[tuple, dict, bool]:
    spec = _spec
    if spec is None or _in_worker_process():
        return args, kwargs, False
    bound = signature.bind(self, *args, **kwargs)
    a = bound.arguments
    if not _selected(spec["loader"], a):
        return args, kwargs, False
    keys = (*KNOBS, "multiprocessing_context")
    settings = {k: a.get(k, signature.parameters[k].default) for k in keys if k in signature.parameters}
    knobs = {k: spec[k] for k in KNOBS if k in spec}
    new = resolve(settings, knobs, _cuda_available)
    for k, v in new.items():
        if k in signature.parameters and v != settings.get(k):
            a[k] = v
    return bound.args[1:], bound.kwargs, True


def _selected(sel, a: dict) -> bool:
    if sel == "all":
        return True
    ds = type(a.get("dataset")).__name__
    bs = a.get("batch_size", 1)
    if a.get("batch_sampler") is not None:
        bs = getattr(a["batch_sampler"], "batch_size", None)
    if sel.get("dataset") is not None and ds != sel["dataset"]:
        return False
    if sel.get("batch_size") is not None and bs != sel["batch_size"]:
        return False
    key = (sel.get("dataset"), sel.get("batch_size"))
    with _lock:
        n = _seen.get(key, 0)
        _seen[key] = n + 1
    return n == sel["index"]


def _in_worker_process() -> bool:
    # A loader built inside a DataLoader worker is not the training loop's.
    w = sys.modules.get("torch.utils.data._utils.worker")
    return w is not None and getattr(w, "_worker_info", None) is not None


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
