"""Where a job is stuck: the Python stacks of its threads and workers.

``gather_stacks(pid)`` is the one entry point (``dlwatch stacks``, and any
other consumer: it returns a JSON-able dict). It asks the job over its own
socket first (``control.request_stacks``: the job reads its own threads and
asks each DataLoader worker through the worker's row of shared counters, no
ptrace). What the job cannot give — a worker whose Python is not running (a
C call holding the GIL), or a job started without the hook — is read from
outside with ``py-spy dump --nonblocking`` when py-spy is installed and the
kernel lets us read that process (the checks ``dlwatch attach`` makes,
``ptrace.py``); otherwise the answer says which permission is missing.
Never signals, pauses or slows the job.
"""

from __future__ import annotations

import json
import linecache
import subprocess
from typing import Any

from dlwatch.collect import ptrace, spy
from dlwatch.collect.control import ProfileError, request_stacks
from dlwatch.collect.jobs import pid_alive
from dlwatch.diagnose import hang

PY_SPY_TIMEOUT_S = 10.0


def gather_stacks(pid: int, directory: str | None = None, py_spy: bool = True) -> dict[str, Any]:
    """The stacks of job ``pid``: ``{"pid", "source": "job"|"py-spy"|None,
    "reason", "t", "processes": [{"role", "pid", "threads": [{"name",
    "main", "frames": [[function, file, line], ...] outermost first, "src"}]
    | "error"}], "summary": [{"line", "kind", "at", ...}], "error"}``."""
    try:
        doc = request_stacks(pid, directory=directory)
        doc["source"] = "job"
    except ProfileError as e:
        if e.kind == "unsupported" and py_spy and pid_alive(pid):
            doc = {"pid": pid, "reason": "request", "processes": [], "source": "py-spy", "error": None}
            doc["processes"].append(_from_outside(pid, "trainer", str(e)))
        else:
            return {
                "pid": pid,
                "source": None,
                "processes": [],
                "summary": [],
                "error": str(e),
                "kind": e.kind,
            }
    if py_spy:
        for p in doc.get("processes") or []:
            if p.get("error") and p.get("pid") and pid_alive(p["pid"]):
                outside = _from_outside(p["pid"], p.get("role") or "worker", p["error"])
                p.update({k: v for k, v in outside.items() if k not in ("role", "pid")})
    doc["summary"] = hang.summarize(doc)
    return doc


def _from_outside(pid: int, role: str, why_not_inside: str) -> dict[str, Any]:
    """One process's stacks by ``py-spy dump``, or why not."""
    out: dict[str, Any] = {"role": role, "pid": pid}
    binary = spy.find()
    if binary is None:
        out["error"] = f"{why_not_inside}; {spy.INSTALL_HINT}"
        return out
    access = ptrace.check(pid)
    if not access.allowed:
        out["error"] = f"{why_not_inside}; py-spy may not read it: {access.line()}"
        return out
    try:
        proc = subprocess.run(
            [binary, "dump", "--pid", str(pid), "--json", "--nonblocking"],
            capture_output=True,
            text=True,
            timeout=PY_SPY_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        out["error"] = f"{why_not_inside}; py-spy dump failed: {e}"
        return out
    if proc.returncode != 0:
        _code, line = spy.failure(proc.stderr, pid, access)
        out["error"] = f"{why_not_inside}; {line}"
        return out
    try:
        out["threads"] = threads_from_py_spy(json.loads(proc.stdout), pid)
        out["via"] = "py-spy"
    except (ValueError, TypeError, KeyError) as e:
        out["error"] = f"{why_not_inside}; unreadable py-spy output: {e}"
    return out


def threads_from_py_spy(dump: Any, pid: int | None = None) -> list[dict[str, Any]]:
    """``py-spy dump --json`` (threads, frames innermost first) in the
    job's own format (frames outermost first). The main thread is the one
    named so, or (py-spy often has no names) the one whose OS id is ``pid``."""
    threads = []
    for t in dump if isinstance(dump, list) else []:
        frames: list[list[Any]] = []
        leaf: tuple[str, int] | None = None
        for f in t.get("frames") or []:  # innermost first
            if isinstance(f, dict):
                frames.append([str(f.get("name")), str(f.get("filename")), int(f.get("line") or 0)])
                if leaf is None:
                    leaf = (str(f.get("filename")), int(f.get("line") or 0))
        frames.reverse()
        name = str(t.get("thread_name") or f"thread {t.get('thread_id')}")
        threads.append(
            {
                "name": name,
                "main": name == "MainThread" or (pid is not None and t.get("os_thread_id") == pid),
                "daemon": None,
                "frames": frames,
                "src": linecache.getline(leaf[0], leaf[1]).strip()[:160] if leaf else "",
            }
        )
    threads.sort(key=lambda th: (not th["main"], th["name"]))
    return threads
