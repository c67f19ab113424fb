"""Trainer side of a stack request: this process's threads and its workers'.

Asked by a monitor (``stacks`` on the socket) or by the publisher itself
when a loader stalls (``stall.py``). The trainer's own threads are read at
once from the publisher's thread (``thread_stacks.py``); every live loader's
workers are asked through their rows of the shared counters (a request id
in ``STACK_REQ``, read by each worker's stack watcher, ``worker_watch.py``),
and their files are gathered for up to ``GRACE_S``. A worker that does not
answer in time is listed with why (dead, or its Python is not running: a C
call that holds the GIL). Runs on the publisher's thread (``poll``).
"""

from __future__ import annotations

import os
import secrets
import time
from time import perf_counter as _clock

from dlwatch import rundir
from dlwatch.probe import patches, thread_stacks, worker_burst, worker_watch
from dlwatch.probe.worker_row import CUR_START_S, NFIELDS, PID, STACK_ACK, STACK_REQ

# Workers look for a request four times a second (worker_watch.POLL_S);
# a worker busy in Python answers within one look, one blocked in a C call
# that holds the GIL only once it returns.
GRACE_S = 1.5
MAX_FILE_BYTES = 2 << 20
MAX_WORKERS = 256
RUNNING, DONE = "running", "done"


def gone_text(proc: object) -> str:
    """What a worker that is gone did, as far as its Process object says
    without reaping it (the return code torch's own check already read):
    exit code 0 is a worker whose share was done (a barrier hang with uneven
    shares), not a crash."""
    rc = getattr(getattr(proc, "_popen", None), "returncode", None)
    if rc == 0:
        return "exited (its share done): exit code 0"
    return "the worker has exited or died"


class StackGather:
    def __init__(self, reason: str, loaders: list[dict] | None = None) -> None:
        self.reason = reason
        self.gen = secrets.randbits(62) | 1
        self.t0 = _clock()
        self.state = RUNNING
        self.loaders = loaders or []  # what the frames say of the stalled loaders
        self.trainer = {
            "role": "trainer",
            "pid": os.getpid(),
            "threads": thread_stacks.capture(),
        }
        self.asked: list[dict] = []  # loader id, worker id, pid, the row's views
        worker_burst.remove_stale(rundir.runtime_dir(), "wstacks-")
        self._ask()

    def _ask(self) -> None:
        now = _clock()
        for st in patches.registry.snapshot():
            if st.pipeline_procs is not None:
                self._ask_pipeline(st)
                continue
            it = st.iter_ref() if st.iter_ref is not None else None
            view, fview = st.slots_view, st.slots_fview
            if it is None or view is None or fview is None:
                continue
            procs = list(getattr(it, "_workers", ()) or ())
            pids = [int(getattr(w, "pid", 0) or 0) for w in procs]
            for i in range(st.num_workers):
                if len(self.asked) >= MAX_WORKERS:
                    return
                b = i * NFIELDS
                pid = int(view[b + PID]) or (pids[i] if i < len(pids) else 0)
                cur = fview[b + CUR_START_S]
                in_fetch = round(now - cur, 3) if 0 < cur <= now else None
                view[b + STACK_REQ] = self.gen
                self.asked.append(
                    {
                        "loader_id": st.id,
                        "worker_id": i,
                        "pid": pid,
                        "in_fetch_s": in_fetch,
                        "view": view,
                        "b": b,
                        "proc": procs[i] if i < len(procs) else None,
                    }
                )

    def _ask_pipeline(self, st) -> None:
        """A pipeline's process workers (torchdata.nodes', Grain's) run no
        stack watcher: listed for the monitor to read from outside (py-spy,
        ``collect/hang.complete``)."""
        try:
            procs = list(st.pipeline_procs())
        except Exception:
            return
        for i, w in enumerate(procs):
            if len(self.asked) >= MAX_WORKERS:
                return
            self.asked.append(
                {
                    "loader_id": st.id,
                    "worker_id": i,
                    "pid": int(getattr(w, "pid", 0) or 0),
                    "in_fetch_s": None,
                    "view": None,
                    "b": 0,
                    "proc": w,
                    "library": str(st.config.get("library") or "pipeline"),
                }
            )

    def poll(self) -> dict | None:
        """The result once every worker answered or the grace is over."""
        if self.state == DONE:
            return None
        alive = worker_burst.running
        waiting = [
            a
            for a in self.asked
            if a["view"] is not None and a["view"][a["b"] + STACK_ACK] != self.gen and alive(a["pid"])
        ]
        if waiting and _clock() - self.t0 < GRACE_S:
            return None
        self.state = DONE
        return self.result()

    def result(self) -> dict:
        directory = rundir.runtime_dir()
        procs: list[dict] = [self.trainer]
        for a in self.asked:
            p = {
                "role": "worker",
                "pid": a["pid"],
                "loader_id": a["loader_id"],
                "worker_id": a["worker_id"],
                "in_fetch_s": a["in_fetch_s"],
            }
            if a["view"] is None:
                p["error"] = (
                    gone_text(a.get("proc"))
                    if not worker_burst.running(a["pid"])
                    else f"a {a['library']} worker process runs no stack watcher: py-spy dump "
                    "reads it from outside"
                )
                procs.append(p)
                continue
            path = worker_watch.result_path(directory, self.gen, a["pid"])
            doc = worker_burst.read_result(path, MAX_FILE_BYTES)
            for f in (path, path + ".tmp"):
                try:
                    os.unlink(f)
                except OSError:
                    pass
            if doc is not None:
                p["threads"] = doc.get("threads") or []
            elif not worker_burst.running(a["pid"]):
                p["error"] = gone_text(a.get("proc"))
            else:
                p["error"] = (
                    f"no answer within {GRACE_S:g} s: its Python is not running (a C call holding "
                    "the GIL), or the job predates stack watching; py-spy dump can read it from outside"
                )
            procs.append(p)
        return {
            "reason": self.reason,
            "t": time.time(),
            "pid": os.getpid(),
            "gather_ms": round((_clock() - self.t0) * 1e3, 1),
            "loaders": self.loaders,
            "processes": procs,
        }
