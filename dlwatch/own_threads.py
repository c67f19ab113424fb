"""dlwatch's own threads inside a job, named so that /proc tells them apart.

Every thread dlwatch starts in a job (the publisher, the profiler's
processing thread, a notebook's reader; in a worker, the stack watcher and
a burst's sampler) must be left out of the job's thread count, CPU and
run-queue wait. The frames list their native ids (``own_tids``), but a frame
is sent after the thread starts: a monitor that samples the worker between
the two counted a burst's sampler as the worker's own thread (a 1-worker
job's worker read "4 threads" for two snapshots where it runs 3).

So each of them also carries its name in the kernel (``comm``, what
``top -H`` and ``ps -L`` show): the monitor finds them in
/proc/PID/task/*/comm from the first sample on, before any frame says so.
Python before 3.14 does not give a thread's name to the kernel; a thread
may write its own in /proc/self/task/TID/comm, in at most 15 bytes.

Both sides use this module; it imports nothing of either, and nothing here
raises: a name that cannot be set leaves the frames' ids to tell.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

# The start of every such thread's name, in Python and in the kernel.
PREFIX = "dlwatch-"
# Linux keeps a thread's name in 16 bytes with the final NUL.
COMM_BYTES = 15


def set_native_name(name: str) -> bool:
    """Give the calling thread ``name`` in the kernel (truncated to 15
    bytes). Never the main thread's: its name is the process's. False
    where it could not be set (not Linux, a read-only /proc)."""
    tid = threading.get_native_id()
    if not sys.platform.startswith("linux") or tid == os.getpid():
        return False
    # A thread may write its own name here (what prctl(PR_SET_NAME) sets):
    # a plain write, where ctypes' prctl would take the dynamic loader's
    # lock in a thread that starts while the job forks its workers.
    try:
        with open(f"/proc/self/task/{tid}/comm", "wb") as f:
            f.write(name.encode("utf-8", "replace")[:COMM_BYTES])
        return True
    except OSError:
        return False


def start(target: Callable[..., object], name: str, args: tuple = ()) -> threading.Thread:
    """Start a daemon thread named ``name`` (``PREFIX``…) that names itself
    in the kernel before it runs ``target(*args)``."""

    def run() -> None:
        set_native_name(name)
        target(*args)

    t = threading.Thread(target=run, name=name, daemon=True)
    t.start()
    return t


def named(tasks: str, prefix: str) -> tuple[int, ...]:
    """The ids, sorted, of the threads in the task list ``tasks``
    (/proc/PID/task) whose kernel name starts with ``prefix``: ours, or
    torch's autograd threads (autograd_threads.py). Empty when /proc cannot
    tell; a thread that ends meanwhile is left out."""
    try:
        names = os.listdir(tasks)
    except OSError:
        return ()
    found = []
    want = prefix.encode()
    for name in names:
        try:
            with open(os.path.join(tasks, name, "comm"), "rb") as f:
                if f.read().startswith(want):
                    found.append(int(name))
        except (OSError, ValueError):
            continue
    return tuple(sorted(found))


def find(pid: int | str = "self", proc: str = "/proc") -> frozenset[int]:
    """dlwatch's threads in process ``pid``; the main thread never (its name
    is the process's, which a user may have chosen)."""
    main = os.getpid() if pid == "self" else int(pid)
    return frozenset(named(f"{proc}/{pid}/task", PREFIX)) - {main}
