"""DataLoader settings overridden from the environment: how ``dlwatch tune``
runs the user's unmodified script with other settings.

``DLWATCH_OVERRIDES`` holds one JSON object (README "Tune")::

    {"loader": {"index": 0, "dataset": "ImageFolder", "batch_size": 64},
     "num_workers": 4, "prefetch_factor": 4, "pin_memory": true, "persistent_workers": true}

``"replay": {"batches": 20, "max_bytes": 1073741824, "after_s": 1.0}`` (each
key optional, those are the defaults) makes the selected loaders replay
batches they already produced instead of loading new ones (``replay.py``):
the ceiling trial of ``dlwatch tune``. Without the key nothing replays.

``loader`` picks which ``DataLoader(...)`` constructions are changed: ``"all"``,
or the ``index``-th construction (0-based, in this process) among those whose
dataset class name and batch size match the given ones (each optional). The
tuner reads those from the baseline trial's snapshot, where loaders are listed
in the order they were first iterated; a script builds its loaders in that
order almost always (train, then val). Knobs left out keep the script's value.

The variable is read once, at install; ``dlwatch.hook`` installs this only
when it is set, so without it nothing here runs. The patch is on
``DataLoader.__init__`` (once per loader, never per batch) and never raises
into the job: if anything goes wrong the script's own arguments are used.

Nothing the script's own DataLoader would reject is produced: with 0 workers
``prefetch_factor``, ``persistent_workers`` and ``multiprocessing_context``
are cleared (torch raises on each), and ``pin_memory`` is only turned on when
CUDA is available (torch otherwise warns and ignores it).

Stdlib at import; torch only once its dataloader module is imported anyway.
"""

from __future__ import annotations

import json
import os
import sys
import threading

from dlwatch.probe import postimport

ENV_VAR = "DLWATCH_OVERRIDES"
TARGET_MODULE = "torch.utils.data.dataloader"
KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
# More would be a typo, not a setting: a pid and some memory per worker.
MAX_WORKERS = 256
MAX_PREFETCH = 64
MAX_REPLAY_BATCHES = 10_000

_spec: dict | None = None
_seen: dict[tuple, int] = {}
_lock = threading.Lock()
_orig_init = None
_orig_iter = None
_finder = None


class OverrideError(ValueError):
    """The override document is malformed; the message says where."""


def parse(text: str) -> dict:
    """The validated override document (raises OverrideError). The tuner
    checks what it writes with this too, so both sides agree on the format."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise OverrideError(f"{ENV_VAR} is not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise OverrideError(f"{ENV_VAR} must be a JSON object")
    unknown = set(doc) - set(KNOBS) - {"loader", "replay"}
    if unknown:
        raise OverrideError(f"{ENV_VAR}: unknown keys {sorted(unknown)}")
    out: dict = {"loader": _parse_selector(doc.get("loader", "all"))}
    nw = doc.get("num_workers")
    if nw is not None:
        if not _is_int(nw) or not 0 <= nw <= MAX_WORKERS:
            raise OverrideError(f"num_workers must be an integer 0..{MAX_WORKERS}, got {nw!r}")
        out["num_workers"] = nw
    pf = doc.get("prefetch_factor")
    if pf is not None:
        if not _is_int(pf) or not 1 <= pf <= MAX_PREFETCH:
            raise OverrideError(f"prefetch_factor must be an integer 1..{MAX_PREFETCH}, got {pf!r}")
        out["prefetch_factor"] = pf
    for key in ("pin_memory", "persistent_workers"):
        v = doc.get(key)
        if v is not None:
            if not isinstance(v, bool):
                raise OverrideError(f"{key} must be true or false, got {v!r}")
            out[key] = v
    if doc.get("replay") is not None:
        out["replay"] = _parse_replay(doc["replay"])
    return out


def _parse_replay(rep) -> dict:
    if not isinstance(rep, dict):
        raise OverrideError('replay must be an object {"batches", "max_bytes", "after_s"}')
    unknown = set(rep) - {"batches", "max_bytes", "after_s"}
    if unknown:
        raise OverrideError(f"replay: unknown keys {sorted(unknown)}")
    out = {}
    n = rep.get("batches")
    if n is not None:
        if not _is_int(n) or not 1 <= n <= MAX_REPLAY_BATCHES:
            raise OverrideError(f"replay.batches must be an integer 1..{MAX_REPLAY_BATCHES}, got {n!r}")
        out["batches"] = n
    b = rep.get("max_bytes")
    if b is not None:
        if not _is_int(b) or b < 1:
            raise OverrideError(f"replay.max_bytes must be a positive integer, got {b!r}")
        out["max_bytes"] = b
    a = rep.get("after_s")
    if a is not None:
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a <= 3600:
            raise OverrideError(f"replay.after_s must be a number of seconds 0..3600, got {a!r}")
        out["after_s"] = float(a)
    return out


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse_selector(sel):
    if sel == "all":
        return "all"
    if not isinstance(sel, dict):
        raise OverrideError('loader must be "all" or an object {"index", "dataset", "batch_size"}')
    unknown = set(sel) - {"index", "dataset", "batch_size"}
    if unknown:
        raise OverrideError(f"loader: unknown keys {sorted(unknown)}")
    idx = sel.get("index", 0)
    if not _is_int(idx) or idx < 0:
        raise OverrideError(f"loader.index must be a non-negative integer, got {idx!r}")
    ds = sel.get("dataset")
    if ds is not None and not isinstance(ds, str):
        raise OverrideError("loader.dataset must be a class name")
    bs = sel.get("batch_size")
    if bs is not None and (not _is_int(bs) or bs < 1):
        raise OverrideError("loader.batch_size must be a positive integer")
    return {"index": idx, "dataset": ds, "batch_size": bs}


def encode(doc: dict) -> str:
    """The environment value for ``doc`` (validated first)."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    parse(text)
    return text


def resolve(settings: dict, knobs: dict, cuda_available) -> dict:
    """The script's DataLoader ``settings`` (num_workers, prefetch_factor,
    pin_memory, persistent_workers, multiprocessing_context) with ``knobs``
    applied, made valid for torch. ``cuda_available``: a callable, asked only
    when pin_memory is to be turned on."""
    out = dict(settings)
    for k in KNOBS:
        if k in knobs:
            out[k] = knobs[k]
    if out.get("pin_memory") and not settings.get("pin_memory") and not cuda_available():
        out["pin_memory"] = False
    if not out.get("num_workers"):
        out["num_workers"] = 0
        out["prefetch_factor"] = None
        out["persistent_workers"] = False
        out["multiprocessing_context"] = None
    return out


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
    __init__.__wrapped__ = orig
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

        loader._dlw_replay = Replay(spec["replay"], loader)
    except Exception:
        pass


def _patch_iter(cls) -> None:
    """``iter(loader)`` of a replaying loader: the replaying iterator again
    (no workers spawned, none reset); before that, the loader's own iterator
    with its batches routed through the replay. Patched only in replay mode."""
    global _orig_iter
    orig = cls.__iter__

    def __iter__(self):
        rep = getattr(self, "_dlw_replay", None)
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
    __iter__.__wrapped__ = orig
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
