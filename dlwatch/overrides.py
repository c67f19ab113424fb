"""The ``DLWATCH_OVERRIDES`` document: DataLoader settings that ``dlwatch
tune`` asks a trial to use, shared by the tuner (which writes it) and the
probe (which applies it, ``dlwatch/probe/overrides.py``).

The variable holds one JSON object (docs/tune.md)::

    {"loader": {"index": 0, "dataset": "ImageFolder", "batch_size": 64},
     "num_workers": 4, "prefetch_factor": 4, "pin_memory": true, "persistent_workers": true}

``"replay": {"batches": 20, "max_bytes": 1073741824, "after_s": 1.0}`` (each
key optional; the probe's defaults are those) makes the selected loaders
replay batches they already produced instead of loading new ones
(``dlwatch/probe/replay.py``): ``dlwatch tune``'s ceiling trial. Without the
key nothing replays.

``loader`` picks which ``DataLoader(...)`` constructions are changed: ``"all"``,
or the ``index``-th construction (0-based, in this process) among those whose
dataset class name and batch size match the given ones (each optional). The
tuner reads those from the baseline trial's snapshot, where loaders are listed
in the order they were first iterated; a script builds its loaders in that
order almost always (train, then val). Knobs left out keep the script's value.

``resolve`` is how a knob set meets a script's own arguments; the tuner uses it
to predict what a trial will run with, the probe to decide what it passes to
torch, so both agree. Stdlib only: the probe imports it inside the job.
"""

from __future__ import annotations

import json

ENV_VAR = "DLWATCH_OVERRIDES"
KNOBS = ("num_workers", "prefetch_factor", "pin_memory", "persistent_workers")
# More would be a typo, not a setting: a pid and some memory per worker.
MAX_WORKERS = 256
MAX_PREFETCH = 64
MAX_REPLAY_BATCHES = 10_000


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
    for key, lo, hi in (("num_workers", 0, MAX_WORKERS), ("prefetch_factor", 1, MAX_PREFETCH)):
        if doc.get(key) is not None:
            out[key] = _int_in(key, doc[key], lo, hi)
    for key in ("pin_memory", "persistent_workers"):
        v = doc.get(key)
        if v is not None:
            if not isinstance(v, bool):
                raise OverrideError(f"{key} must be true or false, got {v!r}")
            out[key] = v
    if doc.get("replay") is not None:
        out["replay"] = _parse_replay(doc["replay"])
    return out


def _int_in(name: str, v: object, lo: int, hi: int | None) -> int:
    """``v`` if it is an integer within lo..hi (no upper bound when None)."""
    if not _is_int(v) or v < lo or (hi is not None and v > hi):  # type: ignore[operator]
        what = f"an integer {lo}..{hi}" if hi is not None else "a positive integer"
        raise OverrideError(f"{name} must be {what}, got {v!r}")
    return v  # type: ignore[return-value]


def _parse_replay(rep) -> dict:
    if not isinstance(rep, dict):
        raise OverrideError('replay must be an object {"batches", "max_bytes", "after_s"}')
    unknown = set(rep) - {"batches", "max_bytes", "after_s"}
    if unknown:
        raise OverrideError(f"replay: unknown keys {sorted(unknown)}")
    out: dict[str, float] = {}
    if rep.get("batches") is not None:
        out["batches"] = _int_in("replay.batches", rep["batches"], 1, MAX_REPLAY_BATCHES)
    if rep.get("max_bytes") is not None:
        out["max_bytes"] = _int_in("replay.max_bytes", rep["max_bytes"], 1, None)
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
