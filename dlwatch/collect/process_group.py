"""A job dlwatch started itself (``dlwatch demo``'s, a ``tune`` trial) as
its own process group: who is in it, the CPU it used, and stopping it.

A job that uses a spawn or forkserver DataLoader keeps its queues' locks as
named POSIX semaphores (/dev/shm/sem.mp-*) until its exit, and
multiprocessing's resource tracker, a member of the group, unlinks those a
killed process leaves once every other member is gone. SIGKILL sent to the
whole group at once kills the tracker with them: 14 such files stayed
behind a 2-worker loader, for good. So a group that must be killed loses
every other member first, and the tracker a moment later, after its
clean-up. Reads /proc only: no psutil, no privileges beyond signalling
one's own processes.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

# How long the resource tracker gets to unlink what the killed processes
# left (it needs milliseconds; a loaded box, more).
TRACKER_GRACE_S = 2.0
_TRACKER = b"resource_tracker"
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _proc_stats() -> Iterator[tuple[int, list[bytes]]]:
    """(pid, fields from 3 on) of every readable /proc/PID/stat."""
    for name in _listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        yield int(name), stat[stat.rfind(b")") + 2 :].split()


def cpu_s(pgid: int) -> float | None:
    """Cumulative CPU seconds of the process group ``pgid``: each member's
    own and that of the children it has reaped (``cutime``, ``cstime``),
    zombies their own; None when the group has no member."""
    total = 0
    found = False
    for _pid, rest in _proc_stats():
        # rest[0] is field 3 (state); utime..cstime are fields 14-17.
        if len(rest) > 14 and int(rest[2]) == pgid:
            total += sum(int(x) for x in rest[11:15])
            found = True
    return total / _TICKS if found else None


def read_bytes(pgid: int) -> dict[int, int]:
    """Bytes each live member of group ``pgid`` has had read from storage
    (``read_bytes`` of /proc/PID/io: page-cache hits not counted), by PID;
    a member whose file cannot be read is left out."""
    out: dict[int, int] = {}
    for pid in members(pgid):
        try:
            with open(f"/proc/{pid}/io", "rb") as f:
                for line in f:
                    if line.startswith(b"read_bytes:"):
                        out[pid] = int(line.split()[1])
                        break
        except (OSError, ValueError, IndexError):
            continue
    return out


def members(pgid: int) -> set[int]:
    """PIDs whose process group is ``pgid`` (zombies not counted: the kernel
    reaps them with their parent)."""
    return {pid for pid, rest in _proc_stats() if len(rest) > 2 and rest[0] != b"Z" and int(rest[2]) == pgid}


def _is_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return _TRACKER in f.read()
    except OSError:
        return False


def kill(pgid: int, tracker_grace_s: float = TRACKER_GRACE_S) -> None:
    """SIGKILL every member of group ``pgid``, multiprocessing's resource
    tracker last: it unlinks the semaphores the others held once they are
    gone, then exits by itself (waited for up to ``tracker_grace_s``)."""
    trackers = []
    for pid in members(pgid):
        if _is_tracker(pid):
            trackers.append(pid)
            continue
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    end = time.monotonic() + tracker_grace_s
    while trackers and time.monotonic() < end and members(pgid) & set(trackers):
        time.sleep(0.02)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
