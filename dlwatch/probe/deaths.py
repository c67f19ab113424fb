"""A DataLoader worker that died: how (signal, exit code, exception).

Read without disturbing torch: a worker's exit status is taken from the
``Process`` object's ``_popen.returncode`` once torch has reaped it, or with
``waitid(..., WNOWAIT)`` before, which reads a dead child's status and leaves
it for torch to reap (its SIGCHLD handler and ``is_alive`` checks see the
same process as without dlwatch). A worker that is not our child (forkserver:
the fork server's) has no status we may read: it is recorded dead, with the
signal torch names in the error it raises, when it does.

Called by the publisher thread a couple of times a second and, once, by the
patched ``__next__`` when it raises (the error torch raises names the worker).
"""

from __future__ import annotations

import os
import re
import signal
import time

MAX_DEATHS = 16
MAX_TEXT = 300

_SIGNAL_BY_TEXT = {}
for _s in signal.Signals:
    try:
        _SIGNAL_BY_TEXT[signal.strsignal(_s) or ""] = _s.name
    except (ValueError, OSError):
        pass

# torch's messages (torch/utils/data/dataloader.py, _utils/signal_handling.py)
_KILLED_BY = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")
_CAUGHT = re.compile(r"Caught (\w+) in DataLoader worker process (\d+)")
_WRAPPED = re.compile(r"Caught (\w+) in (.+?)\.?$", re.MULTILINE)


def _status(w) -> tuple[bool, str | None, int | None]:
    """(dead, signal name, exit code) of worker process ``w``; never reaps."""
    rc = getattr(getattr(w, "_popen", None), "returncode", None)
    if isinstance(rc, int):
        return (rc != 0, _signame(-rc) if rc < 0 else None, rc if rc >= 0 else None)
    pid = getattr(w, "pid", None)
    if not pid:
        return (False, None, None)
    try:
        res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return (_gone(pid), None, None)
    except OSError:
        return (False, None, None)
    if res is None:
        return (False, None, None)
    if res.si_code in (os.CLD_KILLED, os.CLD_DUMPED):
        return (True, _signame(res.si_status), None)
    return (res.si_status != 0, None, res.si_status)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")
    except (OSError, ValueError):
        return True


def _signame(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def scan(workers: list, deaths: list[dict]) -> None:
    """Add to ``deaths`` the worker processes (``it._workers``, in worker id
    order) that died since. Not while torch is shutting them down: exits then
    are its own."""
    known = {d.get("pid") for d in deaths}
    for wid, w in enumerate(workers):
        pid = int(getattr(w, "pid", 0) or 0)
        if not pid or pid in known:
            continue
        dead, sig, code = _status(w)
        if dead:
            _add(deaths, {"id": wid, "pid": pid, "signal": sig, "exit_code": code, "exception": None})


def from_error(it, e: BaseException, deaths: list[dict]) -> str:
    """The loader raised ``e``: record the worker it names; returns the
    error's one-line text."""
    text = str(e)
    first = f"{type(e).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}"[:MAX_TEXT]
    wrapped = _WRAPPED.match(text.strip())
    if wrapped and "Original Traceback" in text:
        # torch's ExceptionWrapper (its workers', torchdata.nodes' threads):
        # the original exception is the traceback's last line (a QA run kept
        # only "ValueError: Caught ValueError in _populate_queue.").
        lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
        first = f"{lines[-1]} (caught in {wrapped.group(2)})"[:MAX_TEXT]
    try:
        if not getattr(it, "_shutdown", False):
            scan(list(getattr(it, "_workers", ()) or ()), deaths)
    except Exception:
        pass
    pids = [int(getattr(w, "pid", 0) or 0) for w in list(getattr(it, "_workers", ()) or ())]
    m = _KILLED_BY.search(text)
    if m:
        pid = int(m.group(1))
        sig = _SIGNAL_BY_TEXT.get(m.group(2).strip())
        d = _find(deaths, pid)
        if d is None:
            wid = pids.index(pid) if pid in pids else None
            _add(deaths, {"id": wid, "pid": pid, "signal": sig, "exit_code": None, "exception": None})
        elif d.get("signal") is None and d.get("exit_code") is None:
            d["signal"] = sig
        return first
    m = _EXITED.search(text)
    if m:
        for p in (int(x) for x in m.group(1).replace(" ", "").split(",") if x):
            if _find(deaths, p) is None:
                wid = pids.index(p) if p in pids else None
                _add(deaths, {"id": wid, "pid": p, "signal": None, "exit_code": None, "exception": None})
        return first
    m = _CAUGHT.search(text)
    if m:
        wid = int(m.group(2))
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        last = lines[-1].strip() if lines else m.group(1)
        if "init_fn(worker_id)" in text:
            # torch's worker loop calls worker_init_fn so: no sample raised.
            last = f"{last} (in worker_init_fn)"
        pid = pids[wid] if wid < len(pids) else 0
        _add(deaths, {"id": wid, "pid": pid, "signal": None, "exit_code": None, "exception": last[:MAX_TEXT]})
    return first


def _find(deaths: list[dict], pid: int) -> dict | None:
    for d in deaths:
        if d.get("pid") == pid:
            return d
    return None


def _add(deaths: list[dict], d: dict) -> None:
    d["t"] = time.time()
    deaths.append(d)
    del deaths[: max(0, len(deaths) - MAX_DEATHS)]
