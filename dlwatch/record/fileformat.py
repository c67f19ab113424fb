"""The recording file: a header line, then one snapshot document per line.

A name ending in ``.gz`` is gzip, read and written transparently. The writer
flushes every line (a gzip sync flush: the stream up to that line is
readable even if the recorder is killed), so a recording that was cut short
ends in at most one torn line, which the reader skips with a warning.

What a line holds is the snapshot of ``dlwatch snapshot --json`` (docs/reference/snapshot-json.md,
the same ``schema_version``), with two exceptions that keep
the size linear in time and small: the 120-point ``history`` series of each
loader and GPU are left out (the recording *is* the history; replay rebuilds
them from the preceding lines), and figures are rounded to 4 decimals.
"""

from __future__ import annotations

import gzip
from typing import IO, Any

# The key that tells a header line from a snapshot line, and its version: a
# change to the header's meaning gets a new number, keys are only added.
HEADER_KEY = "dlwatch_recording"
FORMAT_VERSION = 1

# Series every snapshot repeats in full (120 points each): redundant in a file
# that holds every snapshot.
DROPPED_LOADER_KEYS = ("history",)
DROPPED_GPU_KEYS = ("history", "mem_history")
DECIMALS = 4


def is_gzip(path: str) -> bool:
    return path.endswith(".gz")


def open_write(path: str, exclusive: bool) -> IO[str]:
    """A text stream to ``path`` (gzip by suffix). ``exclusive``: fail with
    FileExistsError rather than overwrite."""
    if is_gzip(path):
        # Flushing the text stream sync-flushes the compressor: each line
        # is decompressible from the file as soon as it is written.
        return gzip.open(path, "xt" if exclusive else "wt", encoding="utf-8")
    return open(path, "x" if exclusive else "w", encoding="utf-8")


def header(**fields: Any) -> dict[str, Any]:
    return {HEADER_KEY: FORMAT_VERSION, **fields}


def is_header(obj: Any) -> bool:
    return isinstance(obj, dict) and HEADER_KEY in obj


def compact(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The snapshot as a recording stores it (see the module docstring)."""
    out: dict[str, Any] = _rounded(snapshot)
    for job in out.get("jobs") or ():
        for ld in (job.get("loaders") or ()) if isinstance(job, dict) else ():
            if isinstance(ld, dict):
                for k in DROPPED_LOADER_KEYS:
                    ld.pop(k, None)
    for g in out.get("gpus") or ():
        if isinstance(g, dict):
            for k in DROPPED_GPU_KEYS:
                g.pop(k, None)
    return out


def _rounded(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, DECIMALS) if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(v, dict):
        return {k: _rounded(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_rounded(x) for x in v]
    return v
