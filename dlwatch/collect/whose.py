"""What a PID that is no dlwatch job is, in the words that name the PID to use.

A user who gives ``--pid`` usually gives a PID they saw: the ``dlwatch run``
wrapper's, a DataLoader worker's in ``top``, a job of another user in ``ps``.
"no dlwatch job with PID N" was true each time and helped none of them (a QA
run of snapshot, profile and stacks on each: ``stacks`` even printed the
wrapper's own stack, labelled "trainer"). ``record`` already named the job
under a wrapper; every command now says the same, from here.

Reads the process table (psutil) and nothing of the job: only PIDs that the
user can see anyway.
"""

from __future__ import annotations

import os

import psutil

# Kinds of answer: the PID is none of the user's jobs, but it leads to one.
WRAPPER, WORKER, OTHER_USER, NOT_HOOKED, GONE = "wrapper", "worker", "other-user", "not-hooked", "gone"


def _owner(p: psutil.Process) -> tuple[int | None, str]:
    try:
        uid = p.uids().real
    except (psutil.Error, AttributeError):
        return None, "?"
    try:
        return uid, p.username()
    except (psutil.Error, KeyError):
        return uid, str(uid)


def _not_python(p: psutil.Process) -> str | None:
    """The process's name when it is no Python interpreter (its executable
    and its command's first word are not ``python…``), else None (a new
    user's `--pid 1` read "a job started … without the hook")."""
    words = []
    for read in (p.name, p.exe, lambda: (p.cmdline() or [""])[0]):
        try:
            words.append(os.path.basename(read() or ""))
        except (psutil.Error, OSError):
            pass  # not ours to read (another user's exe): the others say
    words = [w for w in words if w]
    if not words or any(w.startswith(("python", "pypy")) for w in words):
        return None
    return words[0]


def _rank_of(pid: int) -> str:
    """ " (rank R)" for a job a launcher started with RANK in its environment
    (torchrun, a manual launch), else "": which --pid is which rank (a QA
    run: "use --pid 20587 or --pid 20588" and no more)."""
    try:
        rank = psutil.Process(pid).environ().get("RANK")
    except (psutil.Error, OSError):
        return ""
    return f" (rank {rank})" if rank is not None and rank.isdigit() else ""


def explain(pid: int, jobs: set[int], directory: str) -> tuple[str, str]:
    """(kind, sentence) for ``pid``, which is not in ``jobs`` (the PIDs with a
    socket in ``directory``)."""
    try:
        p = psutil.Process(pid)
        p.status()
    except psutil.Error:
        return GONE, f"no dlwatch job with PID {pid} in {directory}"
    if pid != 1:  # init has every process below it and starts no job itself
        try:
            below = sorted(c.pid for c in p.children(recursive=True) if c.pid in jobs)
        except psutil.Error:
            below = []
        if below:
            use = " or ".join(f"--pid {b}{_rank_of(b)}" for b in below)
            return WRAPPER, (
                f"PID {pid} is not a dlwatch job: it started the job{'s' if len(below) > 1 else ''} "
                f"{', '.join(map(str, below))} (a `dlwatch run` wrapper or a launcher); use {use} "
                "(`dlwatch ls` lists the jobs)"
            )
    try:
        above = [a.pid for a in p.parents() if a.pid in jobs]
    except psutil.Error:
        above = []
    if above:
        return WORKER, (
            f"PID {pid} is not a dlwatch job: it is a process of job {above[0]} (a DataLoader worker, or "
            f"another process the job started); use --pid {above[0]}"
        )
    uid, name = _owner(p)
    if uid is not None and uid != os.getuid():
        return OTHER_USER, (
            f"PID {pid} runs as user {name}, and dlwatch shows each user only their own jobs (yours are in "
            f"{directory}): run dlwatch as {name} to see it"
        )
    what = _not_python(p)
    if what is not None:
        return NOT_HOOKED, (
            f"PID {pid} ({what}) is not a Python process: dlwatch watches Python training jobs "
            "(`dlwatch ls` lists yours)"
        )
    return NOT_HOOKED, (
        f"PID {pid} is not instrumented by dlwatch (no socket in {directory}): a job started with "
        "DLWATCH_DISABLE=1 or without the hook cannot be asked for figures, profiles or stacks (not "
        "supported; `dlwatch attach` samples one from outside; `dlwatch ls` lists the jobs)"
    )
