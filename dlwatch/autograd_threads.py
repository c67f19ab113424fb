"""The CPU time of torch's autograd device threads, read from /proc/self/task.

On CUDA (and every other accelerator) ``loss.backward()`` hands the backward
pass to the autograd engine's thread for that device, named
``pt_autograd_<device>``, which launches the backward kernels while the
training thread waits for it off the CPU. A host-bound CUDA step therefore
keeps two threads busy in turn, and the training thread's own CPU share
counts only the forward pass and the optimizer: an H100's MLP at batch 1
read its training thread 70 % busy in its plain steps and in its profiled
ones, with nothing else running. CPU torch runs backward on the calling
thread and starts no such thread.

Both sides use it: a profiler burst inside the job reads these threads'
CPU at each window's edges (/proc/self/task, a few small reads, nothing of
torch's imported), and the monitor finds them in the trainer's task list
(/proc/PID/task). Nothing here raises: a thread that ended or a /proc that
cannot be read is left out.
"""

from __future__ import annotations

import os

from dlwatch import own_threads

PREFIX = "pt_autograd_"
TASKS = "/proc/self/task"


def find(tasks: str = TASKS) -> tuple[int, ...]:
    """The thread ids of the autograd device threads in ``tasks`` (this
    process's by default; none on CPU torch, or before the first backward
    on a device)."""
    return own_threads.named(tasks, PREFIX)


def cpu_ns(tids: tuple[int, ...], tasks: str = TASKS) -> dict[int, int]:
    """Each thread's CPU time so far (schedstat's first field, in ns); a
    thread that cannot be read is left out."""
    out: dict[int, int] = {}
    for tid in tids:
        try:
            with open(os.path.join(tasks, str(tid), "schedstat")) as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return out


def spent(before: dict[int, int], after: dict[int, int]) -> int:
    """CPU time between two readings, over the threads read both times."""
    return sum(max(0, after[t] - before[t]) for t in after if t in before)
