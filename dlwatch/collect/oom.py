"""How many times the kernel's OOM killer struck a job's memory cgroup.

A DataLoader worker killed with SIGKILL was, most of the time, killed by the
OOM killer, but only the cgroup's counter says so. cgroup v2 keeps it in
``memory.events`` (``oom_kill``, the cgroup and its descendants); v1 in
``memory.oom_control`` (``oom_kill``, Linux >= 4.13). Read from the
monitor, as the same user: both files are world-readable. Every answer is a
count or None with the reason.
"""

from __future__ import annotations

import os

CGROUP_ROOT = "/sys/fs/cgroup"


def cgroup_dir(pid: int, root: str = CGROUP_ROOT) -> tuple[str | None, str]:
    """The memory cgroup folder of ``pid``, or None and why."""
    try:
        with open(f"/proc/{pid}/cgroup") as f:
            lines = f.read().splitlines()
    except OSError as e:
        return None, f"cannot read /proc/{pid}/cgroup: {e.strerror or e}"
    v1: str | None = None
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2 = os.path.join(root, path.lstrip("/"))
            if os.path.exists(os.path.join(v2, "memory.events")):
                return v2, "cgroup v2"
        if "memory" in ctrls.split(","):
            v1 = os.path.join(root, "memory", path.lstrip("/"))
    # In a container the hierarchy is often mounted at its own cgroup: the
    # path /proc names is then not below the mount, the mount's root is it.
    for cand in (v1, os.path.join(root, "memory") if v1 is not None else None):
        if cand is not None and os.path.exists(os.path.join(cand, "memory.oom_control")):
            return cand, "cgroup v1"
    return None, "no memory cgroup with an OOM counter is visible from here"


def oom_kills(directory: str | None) -> tuple[int | None, str]:
    """The ``oom_kill`` count of a cgroup folder (v2, else v1)."""
    if directory is None:
        return None, "the job's memory cgroup is unknown"
    for name in ("memory.events", "memory.oom_control"):
        try:
            with open(os.path.join(directory, name)) as f:
                text = f.read()
        except FileNotFoundError:
            continue
        except OSError as e:
            return None, f"cannot read {name}: {e.strerror or e}"
        n = parse_oom_kill(text)
        if n is None:
            return None, f"{name} has no oom_kill line (kernel older than 4.13?)"
        return n, name
    return None, f"no memory.events or memory.oom_control in {directory}"


def parse_oom_kill(text: str) -> int | None:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill":
            try:
                return int(value.strip())
            except ValueError:
                return None
    return None
