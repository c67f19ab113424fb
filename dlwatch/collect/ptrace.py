"""May this process read another one's memory (what py-spy needs)?

Linux lets a process read another's memory (``process_vm_readv``, the same
check as ``ptrace`` attach) when:

1. it has CAP_SYS_PTRACE (root, ``sudo``, a container started with
   ``--cap-add SYS_PTRACE``), unless Yama's ``ptrace_scope`` is 3; or
2. it runs as the same user (real, effective and saved uid and gid all
   match) and Yama allows it: ``ptrace_scope`` 0 (or no Yama at all), or 1
   and the target is one of the reader's descendants. The reader here is
   py-spy, started by dlwatch for the purpose, so under scope 1 it never is:
   same-user attaching then needs scope 0 or CAP_SYS_PTRACE. Scope 2 is
   CAP_SYS_PTRACE only, scope 3 nobody.

``decide`` is that table as a pure function; ``check`` reads its inputs from
/proc. Every verdict says which condition holds, or what to do, in one line.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

YAMA_PATH = "/proc/sys/kernel/yama/ptrace_scope"
CAP_SYS_PTRACE = 19

# Exit codes of ``dlwatch attach`` and ``attach --check`` (docs/attach.md).
EXIT_NO_PROCESS = 3
EXIT_NOT_PERMITTED = 4
EXIT_NOT_PYTHON = 5
EXIT_NO_SAMPLER = 6


@dataclass(frozen=True)
class Access:
    allowed: bool
    condition: str  # which rule lets us in, or why not
    advice: str = ""  # what to do when refused
    code: int = 0

    def line(self) -> str:
        return self.condition + (f": {self.advice}" if self.advice else "")


def decide(
    *,
    caller_uid: int,
    caller_gid: int,
    has_cap: bool,
    target_uids: tuple[int, ...],
    target_gids: tuple[int, ...],
    scope: int | None,
    descendant: bool,
    pid: int,
) -> Access:
    """The kernel's rule for reading ``pid``'s memory, given its inputs."""
    if scope is not None and scope >= 3:
        return Access(
            False,
            f"kernel.yama.ptrace_scope is {scope}: nobody may read another process's memory, root included",
            "it can only be lowered by rebooting; restart the job with the hook "
            "(`dlwatch run -- python train.py`)",
            EXIT_NOT_PERMITTED,
        )
    if has_cap:
        return Access(True, "this process has CAP_SYS_PTRACE (root, sudo or --cap-add SYS_PTRACE)")
    if scope == 2:
        return Access(
            False,
            "kernel.yama.ptrace_scope is 2: only CAP_SYS_PTRACE may read another process",
            f"run `sudo dlwatch attach --pid {pid}` (in a container: --cap-add SYS_PTRACE)",
            EXIT_NOT_PERMITTED,
        )
    same_user = all(u == caller_uid for u in target_uids) and all(g == caller_gid for g in target_gids)
    if not same_user:
        owner = target_uids[0] if target_uids else "?"
        return Access(
            False,
            f"PID {pid} runs as uid {owner} and you are uid {caller_uid}, without CAP_SYS_PTRACE",
            f"run as that user, or `sudo dlwatch attach --pid {pid}`",
            EXIT_NOT_PERMITTED,
        )
    if scope == 1 and not descendant:
        return Access(
            False,
            f"kernel.yama.ptrace_scope is 1: a process may only read its own descendants, "
            f"and PID {pid} does not descend from the sampler",
            f"run `sudo dlwatch attach --pid {pid}`, or allow same-user reads with "
            "`sudo sysctl kernel.yama.ptrace_scope=0`",
            EXIT_NOT_PERMITTED,
        )
    if scope == 1:
        return Access(True, "same user, and the job descends from the reader (ptrace_scope 1)")
    how = "no Yama module" if scope is None else "ptrace_scope 0"
    return Access(True, f"same user ({how})")


def read_scope(path: str = YAMA_PATH) -> int | None:
    """Yama's ptrace_scope, None where the kernel has no Yama (classic rules)."""
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def status_ids(pid: int, proc: str = "/proc") -> tuple[tuple[int, ...], tuple[int, ...], int | None]:
    """(real, effective, saved uids), (… gids) and the parent PID of ``pid``
    from /proc/PID/status. Raises OSError when it cannot be read."""
    uids: tuple[int, ...] = ()
    gids: tuple[int, ...] = ()
    ppid = None
    with open(f"{proc}/{pid}/status") as f:
        for line in f:
            key, _, val = line.partition(":")
            if key == "Uid":
                uids = tuple(int(x) for x in val.split()[:3])
            elif key == "Gid":
                gids = tuple(int(x) for x in val.split()[:3])
            elif key == "PPid":
                ppid = int(val.split()[0])
    return uids, gids, ppid


def has_cap_sys_ptrace(proc: str = "/proc") -> bool:
    try:
        with open(f"{proc}/self/status") as f:
            for line in f:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> CAP_SYS_PTRACE & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def check(pid: int, proc: str = "/proc") -> Access:
    """Whether this process may sample ``pid``, from /proc."""
    try:
        uids, gids, _ppid = status_ids(pid, proc)
    except (OSError, ValueError):
        return Access(False, f"no process with PID {pid}", "check the PID (`ps -ef`)", EXIT_NO_PROCESS)
    access = decide(
        caller_uid=os.geteuid(),
        caller_gid=os.getegid(),
        has_cap=has_cap_sys_ptrace(proc),
        target_uids=uids,
        target_gids=gids,
        scope=read_scope(),
        # The reader is py-spy, a fresh child of this process: under scope 1
        # it is never the job's ancestor, however the job was started.
        descendant=False,
        pid=pid,
    )
    if access.allowed and not maps_readable(pid, proc):
        # The table above is the usual rule; the kernel may still say no (a
        # process of another user namespace, a VM's or container's init, a
        # security module). /proc/PID/maps takes the same check as reading
        # the memory, so it tells the truth before py-spy tries.
        return Access(
            False,
            f"the kernel refuses to let you read its memory (/proc/{pid}/maps: permission denied)",
            "it may run in another container or user namespace; restart the job with the hook "
            "(`dlwatch run -- python train.py`)",
            EXIT_NOT_PERMITTED,
        )
    return access


def maps_readable(pid: int, proc: str = "/proc") -> bool:
    """False only where reading /proc/PID/maps is refused outright."""
    try:
        with open(f"{proc}/{pid}/maps", "rb") as f:
            f.read(1)
    except PermissionError:
        return False
    except OSError:
        pass
    return True


def looks_like_python(pid: int, proc: str = "/proc") -> bool:
    """The process runs a Python interpreter: its executable is one, or it
    has libpython mapped. True when /proc cannot tell (py-spy will)."""
    try:
        exe = os.path.basename(os.readlink(f"{proc}/{pid}/exe"))
    except OSError:
        return True
    if exe.startswith(("python", "pypy")):
        return True
    try:
        with open(f"{proc}/{pid}/maps") as f:
            return any("libpython" in line for line in f)
    except OSError:
        return True
