"""Inside a DataLoader worker: answer the trainer's requests for our stacks.

A stuck worker is, by definition, inside a fetch that does not return, so
nothing that runs at the next fetch (the worker profile burst's trigger)
would ever run. This daemon thread, started once per worker process by the
worker hook, looks at the worker's row of the shared counters a few times a
second; when the trainer has written a new request id there, it reads every
thread's stack of this process (``thread_stacks.py``), writes them to a
0600 file in the runtime directory named for the request and our pid, and
acknowledges. The trainer gathers the files (``stack_request.py``).

Cost when nothing is asked: one wake-up and one shared-memory read every
``POLL_S``; the fetch path is untouched. A worker whose thread holds the GIL
in a C call cannot answer until it returns: the trainer then reports it as
silent and says so.
"""

from __future__ import annotations

import json
import os
import threading
import time

from dlwatch import own_threads, rundir
from dlwatch.probe import thread_stacks
from dlwatch.probe.worker_row import STACK_ACK, STACK_REQ, claim_tid

# A stall is declared after seconds (stall.py's floor), and the trainer
# waits STACK_GRACE_S for the answers: 0.25 s answers well within it at
# four wake-ups a second.
POLL_S = 0.25

_started: set[int] = set()  # pids whose watcher runs (a re-activated worker keeps its own)
_lock = threading.Lock()


def result_path(directory: str, gen: int, pid: int) -> str:
    return os.path.join(directory, f"wstacks-{gen:x}-{pid}.json")


def start(row, base: int) -> None:
    """Watch row ``base``'s STACK_REQ from a daemon thread; answer into its STACK_ACK."""
    pid = os.getpid()
    with _lock:
        if pid in _started:
            return
        _started.add(pid)
    own_threads.start(_watch, "dlwatch-stack-watch", (row, base))


def _watch(row, base: int) -> None:
    # Our own thread, listed in the row: the monitor leaves it out of the
    # worker's threads and CPU. It lives as long as the worker: never released.
    claim_tid(row, base)
    i_req, i_ack = base + STACK_REQ, base + STACK_ACK
    seen = row[i_ack]
    while True:
        time.sleep(POLL_S)
        try:
            gen = row[i_req]
            if gen and gen != seen:
                seen = gen
                answer(gen)
                row[i_ack] = gen
        except Exception:
            pass  # a request that cannot be answered costs its answer only


def answer(gen: int) -> str:
    doc = {"pid": os.getpid(), "t": time.time(), "threads": thread_stacks.capture()}
    path = result_path(rundir.runtime_dir(), gen, os.getpid())
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f, separators=(",", ":"))
    os.replace(tmp, path)
    return path
