"""What a worker profile burst says: which part of ``__getitem__`` costs what.

Pure. The job sends the stacks its workers sampled inside their fetches
(``dlwatch.probe.worker_sampler``): a table of functions (qualified name,
file, first line), and per distinct stack its count, its frames from the
fetch down to the leaf, and the leaf's line (with that line's source text,
which is how a C call such as ``cv2.imread`` or ``f.read()`` is recognised:
it has no frame of its own). ``classify`` puts each stack in the stage a
user would change (``STAGE_KINDS``); ``summary`` is the document
``dlwatch profile --workers --json`` prints (docs/profiles.md);
``summary_lines`` the text the CLI prints and the live view shows.
"""

from __future__ import annotations

import re
from typing import Any

from dlwatch.snapshot import as_dict, as_int, as_list, as_str, count_of, num, records

SCHEMA_VERSION = 1
# read: the file system; decode: image decoding; transform: a transform
# class (or function) of torchvision/albumentations/kornia; tokenize: a
# tokenizer library; collate: the batch's collate; code: the user's own
# function; image-ops: other PIL calls of the user's code; other: the rest.
STAGE_KINDS = ("read", "decode", "transform", "tokenize", "collate", "code", "image-ops", "other")
# A verdict names the top kind only when it holds this share or more of the
# workers' busy time; below it, no stage dominates.
DOMINANT_SHARE = 0.30
TOP_FUNCTIONS = 25

_TRANSFORM_PKGS = ("torchvision", "albumentations", "kornia")
_TOKENIZER_PKGS = ("transformers", "tokenizers", "sentencepiece", "tiktoken")
_DECODER_PKGS = ("simplejpeg", "turbojpeg", "imageio", "av", "decord")
_READ_PKGS = ("h5py", "lmdb", "webdataset", "fsspec", "s3fs", "pyarrow", "zarr")
# Wrappers around the real transform: look inside them for the named one.
_CONTAINERS = {
    "Compose",
    "Sequential",
    "RandomApply",
    "RandomChoice",
    "RandomOrder",
    "Transform",
    "BasicTransform",
    "DualTransform",
    "ImageOnlyTransform",
    "OneOf",
    "SomeOf",
    "Lambda",
    "Module",
}
# A leaf line that reads (a C call: no frame of its own).
_READ_LINE = re.compile(
    r"\bread(into)?\(|read_bytes\(|read_text\(|\bnp\.load\(|numpy\.load\(|torch\.load\(|fromfile\("
    r"|\bopen\(|\.open\("
)
_DECODE_LINE = re.compile(r"cv2\.imread|imdecode\(|decode_jpeg\(|decode_image\(|\.decode\(b\)|decode_png\(")
_TOKENIZE_LINE = re.compile(r"tokeni[sz]|\.encode(_batch)?\(")


def package_of(path: str) -> str:
    """The top-level package a file belongs to: ``PIL``, ``torch``, ``stdlib``;
    ``""`` for the user's own code."""
    p = path.replace("\\", "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        i = p.rfind(marker)
        if i >= 0:
            head = p[i + len(marker) :].split("/", 1)[0]
            return head[:-3] if head.endswith(".py") else head
    m = re.search(r"/lib/python3\.\d+/", p)
    if m or p.startswith("<frozen"):
        return "stdlib"
    return ""


def _is_fetch_internal(fr: tuple[str, str, int]) -> bool:
    return fr[1].replace("\\", "/").endswith("torch/utils/data/_utils/fetch.py")


def _is_collate(fr: tuple[str, str, int]) -> bool:
    return fr[1].replace("\\", "/").endswith("utils/data/_utils/collate.py") or "collate" in fr[0].lower()


def _class_of(qualname: str) -> str | None:
    parts = [p for p in qualname.split(".") if p != "<locals>"]
    return parts[-2] if len(parts) >= 2 else None


def classify(frames: list[tuple[str, str, int]], leaf_text: str = "") -> tuple[str, str]:
    """(kind, stage) of one sampled stack: ``frames`` from the fetch down to
    the leaf as (qualified name, file, first line), ``leaf_text`` the leaf's
    source line."""
    frames = [f for f in frames if not _is_fetch_internal(f)]
    pkgs = [package_of(f[1]) for f in frames]
    for fr in frames:
        if _is_collate(fr):
            return "collate", "collate"
    leaf_pkg = pkgs[-1] if pkgs else ""
    # A read at the leaf first: PIL reads the file's chunks inside load().
    if _READ_LINE.search(leaf_text) or (frames and leaf_pkg in _READ_PKGS):
        return "read", "file read"
    for fr, pkg in zip(frames, pkgs):
        if pkg == "PIL" and (fr[1].endswith(("ImageFile.py", "ImagePlugin.py")) or fr[0] == "open"):
            return "decode", "image decode"
        if pkg in _DECODER_PKGS or (pkg == "torchvision" and "/io/" in fr[1].replace("\\", "/")):
            return "decode", "image decode"
    if _DECODE_LINE.search(leaf_text) and not leaf_pkg:
        return "decode", "image decode"
    if any(p in _TOKENIZER_PKGS for p in pkgs) or (_TOKENIZE_LINE.search(leaf_text) and not leaf_pkg):
        return "tokenize", "tokenization"
    if any(p in ("numpy", "torch", "stdlib") for p in pkgs) and any(
        f[0].endswith(("load", "read_bytes"))
        for f, p in zip(frames, pkgs)
        if p in ("numpy", "torch", "stdlib")
    ):
        return "read", "file read"
    functional = None
    for fr, pkg in zip(frames, pkgs):
        if pkg not in _TRANSFORM_PKGS:
            continue
        cls = _class_of(fr[0])
        if cls is not None and cls not in _CONTAINERS and not cls.startswith("_"):
            return "transform", f"transform {cls}"
        if cls is None and functional is None and "transforms" in fr[1]:
            functional = fr[0]
    if functional is not None:
        return "transform", f"transform {functional}"
    pil = [fr for fr, pkg in zip(frames, pkgs) if pkg == "PIL"]
    if pil:
        return "image-ops", f"PIL {pil[0][0]}"
    # The user's own steps: what the dataset's method (the first frame of
    # theirs) calls, which is what they would change; else that method itself.
    mine = [fr for fr, pkg in zip(frames, pkgs) if not pkg]
    if mine:
        return "code", (mine[1] if len(mine) > 1 else mine[0])[0]
    return "other", f"{pkgs[-1] or 'other'}" if pkgs else "other"


def _stacks(result: dict[str, Any]) -> tuple[list[tuple[int, list[tuple[str, str, int]], str]], int]:
    """The result's stacks resolved: (count, frames, leaf text); and the
    number of samples in stacks that did not resolve."""
    table = as_list(result.get("frames"))
    src = as_dict(result.get("src"))
    out, bad = [], 0
    for item in as_list(result.get("stacks")):
        try:
            n, idx, line = int(item[0]), list(item[1]), int(item[2])
            frames = [(str(table[i][0]), str(table[i][1]), int(table[i][2])) for i in idx]
        except (TypeError, ValueError, IndexError, KeyError):
            bad += (as_int(item[0]) or 0) if isinstance(item, list) and item else 0
            continue
        text = src.get(f"{idx[-1]}:{line}", "") if idx else ""
        out.append((n, frames, text if isinstance(text, str) else ""))
    return out, bad


def analyse(result: dict[str, Any]) -> dict[str, Any]:
    """Shares of the workers' in-fetch samples by stage and by function."""
    stacks, bad = _stacks(result)
    total = sum(n for n, _f, _t in stacks) + bad + (as_int(result.get("other")) or 0)
    stages: dict[tuple[str, str], int] = {}
    incl: dict[tuple[str, str, int], int] = {}
    self_: dict[tuple[str, str, int], int] = {}
    for n, frames, text in stacks:
        key = classify(frames, text)
        stages[key] = stages.get(key, 0) + n
        visible = [f for f in frames if not _is_fetch_internal(f)]
        for fr in set(visible):
            incl[fr] = incl.get(fr, 0) + n
        if visible and visible[-1] == frames[-1]:
            self_[frames[-1]] = self_.get(frames[-1], 0) + n
    unresolved = total - sum(stages.values())
    if unresolved > 0:
        stages[("other", "other")] = stages.get(("other", "other"), 0) + unresolved

    def share(n: int) -> float:
        return round(n / total, 4) if total else 0.0

    stage_rows: list[dict[str, Any]] = [
        {"stage": name, "kind": kind, "share": share(n), "samples": n}
        for (kind, name), n in sorted(stages.items(), key=lambda kv: -kv[1])
    ]
    fn_rows = [
        {
            "function": fr[0],
            "file": fr[1],
            "line": fr[2],
            "share": share(n),
            "self_share": share(self_.get(fr, 0)),
        }
        for fr, n in sorted(incl.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_FUNCTIONS]
    ]
    kinds: dict[str, float] = {}
    for row in stage_rows:
        kind = str(row["kind"])
        kinds[kind] = round(kinds.get(kind, 0.0) + float(row["share"]), 4)
    return {"samples": total, "stages": stage_rows, "worker_functions": fn_rows, "kinds": kinds}


_NEXT_STEP = {
    "decode": "decode less: PIL's draft() decodes a JPEG at reduced size (draft('RGB', (w, h)) before "
    "convert), Pillow-SIMD decodes faster, or decode on the GPU (torchvision.io.decode_jpeg on CUDA, DALI)",
    "transform": "make the transforms cheaper: crop before resizing (decode with draft() first), a cheaper "
    "interpolation (bilinear, antialias off), or run the augmentation on the GPU on whole batches "
    "(torchvision.transforms.v2 on CUDA tensors)",
    "read": "read faster: copy the data to local disk or cache it in RAM, and use fewer, larger files "
    "(tar shards, LMDB) instead of one small file per sample",
    "collate": "batch the fetch: give the dataset __getitems__ (one call per batch), and a lighter collate "
    "(tensors, not lists of dicts)",
    "tokenize": "tokenize once, ahead of training (store token ids), or use a batched fast tokenizer",
    "code": "optimise that function (it is your own code), or cache its result if it does not change "
    "per epoch",
    "image-ops": "do fewer PIL operations per sample: resize once at reduced size (draft()), or move them "
    "to the GPU on whole batches",
}
_VERDICT = {
    "decode": "decode-bound",
    "transform": "transform-bound",
    "read": "read-bound",
    "collate": "collate-bound",
    "tokenize": "tokenization-bound",
    "code": "code-bound",
    "image-ops": "image-ops-bound",
}


def verdict(a: dict[str, Any]) -> dict[str, Any] | None:
    """{"verdict", "reason", "suggestion"} for an ``analyse`` result; None without samples."""
    stages = records(a.get("stages"))
    if not a.get("samples") or not stages:
        return None
    kinds = as_dict(a.get("kinds"))
    top_kind = max((k for k in kinds if k != "other"), key=lambda k: num(kinds[k]) or 0.0, default=None)
    top_stage = next((s for s in stages if s["kind"] == top_kind), None)
    kshare = num(kinds.get(top_kind)) if top_kind else None
    if top_kind is None or top_stage is None or kshare is None or kshare < DOMINANT_SHARE:
        head = stages[0]
        return {
            "verdict": "spread",
            "reason": f"no stage holds {DOMINANT_SHARE:.0%} of the workers' busy time; the largest is "
            f"{head['stage']} at {head['share']:.0%}",
            "suggestion": "no single fix: look at the top functions, and weigh more workers or cheaper "
            "samples as a whole",
        }
    what = top_stage["stage"]
    if top_kind in ("transform", "code", "image-ops") and kshare > top_stage["share"] + 0.005:
        n = sum(1 for s in stages if s["kind"] == top_kind)
        label = {"transform": "transforms", "code": "your own functions", "image-ops": "PIL operations"}[
            top_kind
        ]
        what = f"{label} ({n}; the largest {top_stage['stage']} at {top_stage['share']:.0%})"
    step = _NEXT_STEP[top_kind]
    fns = records(a.get("worker_functions"))
    if top_kind == "code" and fns and "/dlwatch/demo/" in str(fns[0].get("file", "")).replace("\\", "/"):
        # `dlwatch demo`: "it is your own code" sent a new user to optimise
        # dlwatch's synthetic dataset.
        step = (
            "that is dlwatch's demo dataset, which spends CPU per sample on purpose; in a job of yours, "
            "this line names your dataset's function to optimise or cache"
        )
    return {
        "verdict": _VERDICT[top_kind],
        "reason": f"{what}: {kshare:.0%} of the workers' time inside fetches",
        "suggestion": step,
    }


def summary(pid: int, result: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """The ``dlwatch profile --workers --json`` document (docs/profiles.md)."""
    res = as_dict(result)
    a = analyse(res) if res and not error else {"samples": 0, "stages": [], "worker_functions": []}
    v = verdict(a) if not error else None
    workers = []
    cpu = []
    for w in records(res.get("workers")):
        row: dict[str, Any] = {
            "pid": as_int(w.get("pid")),
            "id": as_int(w.get("id")),
            "reported": w.get("reported") is True,
            "samples": as_int(w.get("samples")),
            "in_fetch": as_int(w.get("in_fetch")),
            "note": as_str(w.get("note")) or None,
        }
        wall, used = num(w.get("wall_s")), num(w.get("sampler_cpu_s"))
        row["sampler_cpu_percent"] = round(100 * used / wall, 2) if wall and used is not None else None
        if row["sampler_cpu_percent"] is not None:
            cpu.append(row["sampler_cpu_percent"])
        workers.append(row)
    lost = [w for w in workers if not w["reported"]]
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": "workers",
        "pid": pid,
        "loader": as_dict(res.get("loader")) or None,
        "loaders_followed": as_int(res.get("loaders_followed")),
        "seconds": num(res.get("seconds")),
        "hz": as_int(res.get("hz")),
        "samples": a["samples"],
        "workers": workers,
        "workers_lost": len(lost),
        "sampler_cpu_percent_max": max(cpu) if cpu else None,
        "stages": a["stages"],
        "worker_functions": a["worker_functions"],
        "verdict": v["verdict"] if v else None,
        "reason": v["reason"] if v else None,
        "suggestion": v["suggestion"] if v else None,
        "window_mono_ns": [as_int(x) for x in as_list(res.get("window_mono_ns"))] or None,
        "error": error,
    }


def summary_lines(doc: dict[str, Any]) -> list[str]:
    pid = doc.get("pid")
    if doc.get("error"):
        return [f"PID {pid}: worker profile failed: {doc['error']}"]
    workers = records(doc.get("workers"))
    seconds = num(doc.get("seconds")) or 0
    loader = as_dict(doc.get("loader")).get("name") or "the busiest loader"
    followed = as_int(doc.get("loaders_followed")) or 0
    if followed > 1:
        loader += f" and {followed - 1} newer DataLoaders like it (one built every pass)"
    lines = [
        f"PID {pid}: {as_int(doc.get('samples')) or 0} samples inside fetches from "
        f"{count_of(sum(1 for w in workers if w.get('reported')), 'worker')} of {loader} over {seconds:g} s"
    ]
    if doc.get("verdict"):
        lines.append(f"verdict: {doc['verdict']}: {doc.get('reason')}")
        lines.append(f"next step: {doc.get('suggestion')}")
    stages = records(doc.get("stages"))
    if stages:
        lines.append("stages (share of the workers' time inside fetches):")
        for s in stages[:10]:
            lines.append(f"  {num(s.get('share')) or 0:>6.1%}  {as_str(s.get('stage'))[:80]}")
    fns = records(doc.get("worker_functions"))
    if fns:
        lines.append("top functions (inclusive, self):")
        for f in fns[:10]:
            where = f"{as_str(f.get('file')).rsplit('/', 1)[-1]}:{as_int(f.get('line'))}"
            lines.append(
                f"  {num(f.get('share')) or 0:>6.1%} {num(f.get('self_share')) or 0:>6.1%}  "
                f"{as_str(f.get('function'))[:60]} ({where})"
            )
    for w in workers:
        if not w.get("reported"):
            lines.append(f"note: worker {w.get('id')} (PID {w.get('pid')}): {w.get('note')}")
    cpu = num(doc.get("sampler_cpu_percent_max"))
    if cpu is not None:
        lines.append(f"cost: the sampler used at most {cpu:.2f} % of a core in each worker")
    return lines


def brief(doc: dict[str, Any], t: float) -> dict[str, Any] | None:
    """What a hint quotes of a worker profile taken at time ``t``."""
    stages = records(doc.get("stages"))
    if doc.get("error") or not stages:
        return None
    top = next((s for s in stages if s.get("kind") != "other"), stages[0])
    return {
        "t": t,
        "loader_id": as_int(as_dict(doc.get("loader")).get("id")),
        "verdict": doc.get("verdict"),
        "top_stage": top.get("stage"),
        "top_share": top.get("share"),
        "samples": doc.get("samples"),
        "suggestion": doc.get("suggestion"),
        "stages": [{"stage": s.get("stage"), "share": s.get("share")} for s in stages[:6]],
    }
