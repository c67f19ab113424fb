"""How a watched job ended, from what the monitor can see of it.

A job is not the monitor's child, so its exit status is not ours to read,
except for the moment it is a zombie (``/proc/PID/stat`` keeps the wait
status until its parent reaps it). What is always there: the job's last
frame. A job that exits through Python (the end of the script, ``sys.exit``,
an uncaught exception) sends one as it exits (``main.at_exit``, with the
exception when one ended it); a job that hung up without it was killed by a
signal (SIGKILL: the OOM killer, ``kill -9``; SIGTERM: a scheduler, or
torchrun stopping every rank when one fails), crashed, or called
``os._exit``. The cgroup's OOM-kill counter says whether the OOM killer
struck meanwhile. A QA run: a rank killed by SIGKILL read "the process has
exited", as a rank that finished did.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping
from typing import Any

from dlwatch.snapshot import as_int, run_key

EXITED = "the process has exited"


def zombie_status(pid: int) -> int | None:
    """The wait status /proc keeps for a process not yet reaped (a zombie:
    the exit_code field of /proc/PID/stat, Linux >= 3.5), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None
    # After the name: state is field 3, exit_code field 52.
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    try:
        return int(fields[49])
    except ValueError:
        return None


def zombie_reason(pid: int) -> str:
    """What a zombie's wait status says, for a worker's row: "killed by
    SIGKILL, not yet reaped by its parent" (a killed DataLoader worker stays
    one until torch reaps it, a nodes or Grain process worker until its pool
    does: a row that only read "zombie" left how it died to the hints)."""
    status = zombie_status(pid)
    if status is not None and os.WIFSIGNALED(status):
        how = f"was killed by {signal_name(os.WTERMSIG(status))}"
    elif status is not None and os.WIFEXITED(status):
        how = f"exited with code {os.WEXITSTATUS(status)}"
    else:
        how = "exited"
    return f"process {pid} {how}, not yet reaped by its parent (a zombie)"


def signal_name(n: int) -> str:
    try:
        return signal.Signals(n).name
    except ValueError:
        return f"signal {n}"


def reason(
    exception: str | None,
    spoke_at_exit: bool | None,
    status: int | None = None,
    oom_new: int | None = None,
    *,
    exit_call: str | None = None,
) -> str:
    """The ended job's state reason. ``exception``: the uncaught exception
    its last frame named; ``spoke_at_exit``: whether its last frame was sent
    as Python exited (None: the job predates that frame, or no frame came);
    ``status``: its wait status, when it was read as a zombie; ``oom_new``:
    OOM kills the cgroup counted since the monitor first saw the job;
    ``exit_call``: the failing ``sys.exit`` call its last frame named, what
    is left of its code once a shell has reaped it."""
    if exception:
        return f"{EXITED} after an uncaught {exception}"
    oom = (
        f"; the cgroup counted {oom_new} OOM kill{'s' if oom_new != 1 else ''} since dlwatch first saw "
        "the job: the OOM killer, most likely"
        if oom_new
        else ""
    )
    if status is not None and os.WIFSIGNALED(status):
        return f"the process was killed by {signal_name(os.WTERMSIG(status))}{oom}"
    code = os.WEXITSTATUS(status) if status is not None and os.WIFEXITED(status) else None
    if exit_call and spoke_at_exit is not False and (status is None or (code and f"({code})" in exit_call)):
        # The call names the code and where it came from; the monitor's exit
        # clock reads the status as well, most often before a shell reaps it.
        return f"{EXITED} after {exit_call}{oom}"
    if (
        status is not None
        and os.WIFEXITED(status)
        and (os.WEXITSTATUS(status) != 0 or spoke_at_exit is False)
    ):
        how = " without Python's shutdown (os._exit)" if spoke_at_exit is False else ""
        return f"{EXITED} with code {os.WEXITSTATUS(status)}{how}{oom}"
    if spoke_at_exit is False:
        # Short: the live view's header shows it. What each signal most
        # often is (the OOM killer, a scheduler, torchrun) is docs/hangs.md's.
        return (
            "the process ended without exiting through Python: a signal (SIGKILL, SIGTERM), a crash "
            f"or os._exit{oom}"
        )
    return f"{EXITED}{oom}"


def after_worker_death(why: str, loaders: list[Any]) -> str:
    """``why`` (an ended job's reason), with the last worker death its
    loaders recorded when it did not end cleanly: the error a job dies of
    after a worker's death is often not the death's own (a QA run of a
    grain.DataLoader whose worker was SIGKILLed: the job died of
    "ConnectionRefusedError", rebuilding a tensor the dead worker had
    shared, and read only "exited with code 1")."""
    if why == EXITED or "is killed by signal" in why:  # torch's own error already names it
        return why
    last: tuple[float, int, dict[str, Any]] | None = None
    for ld in loaders:
        if not isinstance(ld, dict):
            continue
        for d in ld.get("worker_deaths") or ():
            if not isinstance(d, dict):
                continue
            # A worker whose fetch raised lives on (torch re-raises it in the
            # loop, and the job's reason names it): no death to add.
            raised = d.get("exception") and not d.get("signal") and d.get("exit_code") in (None, 0)
            if not raised:
                t = float(d["t"]) if isinstance(d.get("t"), (int, float)) else 0.0
                if last is None or t >= last[0]:
                    last = (t, as_int(ld.get("id")) or 0, d)
    if last is None:
        return why
    _, lid, d = last
    how = d.get("signal") or (f"exit code {d.get('exit_code')}" if d.get("exit_code") is not None else None)
    how = how or d.get("exception") or "how is not known"
    return f"{why}; before it, worker {d.get('id')} (pid {d.get('pid')}) of loader {lid} died ({how})"


# Ranks of a run that end within this long of its first are taken to have
# ended with it (torchrun stops every rank when one fails, at once).
ENDS_TOGETHER_S = 30.0
# A job's last frame is at most one publishing interval (0.1 s) before its
# end, later on a busy box: ends closer than this are not told apart.
ORDER_MARGIN_S = 0.25
# Ends the monitor's exit clock saw (exit_clock.py) are stamped in the order
# its one thread woke for them, so a later end never reads earlier: only
# ends seen in one wake (stamped alike) are not told apart.
EXACT_MARGIN_S = 0.001


def order_of_ends(
    jobs: list[dict[str, Any]],
    last_seen: Mapping[int, float | None],
    exact: Mapping[int, float | None] | None = None,
) -> None:
    """The ranks of one run that have ended, in the order they ended: by
    the monitor's exit clock where it saw every one of them end (``exact``:
    pid -> time, within milliseconds), else by each one's last frame (the
    job's clock; a frame every 0.1 s, so ends closer than ``ORDER_MARGIN_S``
    read alike). The first is said to be (torchrun calls it the root cause),
    each later one how long after it, when the order is clear; else that they
    ended together. In place, on the jobs' ``state_reason``. A QA run: a rank
    SIGKILLed and the rank torchrun stopped 0.13 s later read alike by their
    frames; the exit clock told them apart."""
    exact = exact or {}
    runs: dict[tuple[str, str], list[tuple[float | None, float | None, dict[str, Any]]]] = {}
    for j in jobs:
        pid = as_int(j.get("pid")) or 0
        key = run_key(j)
        if j.get("state") == "exited" and key is not None:
            runs.setdefault(key, []).append((exact.get(pid), last_seen.get(pid), j))
    for members in runs.values():
        clocked = all(e is not None for e, _, _ in members)
        margin = EXACT_MARGIN_S if clocked else ORDER_MARGIN_S
        # Every end by one clock: the exit clock's where it saw them all,
        # else the frames' (a rank without a last frame is then left out).
        timed = [(t, j) for e, f, j in members if (t := e if clocked else f) is not None]
        if len(timed) < 2:
            continue
        timed.sort(key=lambda m: m[0])
        t0 = timed[0][0]
        ended = [(t, j) for t, j in timed if t - t0 <= ENDS_TOGETHER_S]
        if len(ended) < 2:
            continue
        # Which of those came first is within the clock's own spacing.
        firsts = [j for t, j in ended if t - t0 < margin]
        for t, j in ended:
            if any(j is f for f in firsts):
                others = [f for f in firsts if f is not j]
                alike = "seen ending at the same moment" if clocked else f"within {margin:g} s"
                note = (
                    f"it ended with {_names(others)} ({alike}), the first of its run to end"
                    if others
                    else "the first rank of its run to end"
                )
            else:
                # Hundredths only where the clock has them.
                gap = f"{t - t0:.2f}" if clocked and t - t0 < 1 else f"{t - t0:.1f}"
                note = f"{gap} s after {_names(firsts)}, the first of its run to end"
            j["state_reason"] = f"{j.get('state_reason') or EXITED}; {note}"


def _names(jobs: list[dict[str, Any]]) -> str:
    return " and ".join(_rank_name(j) for j in jobs)


def _rank_name(j: Mapping[str, Any]) -> str:
    rank = as_int(j.get("rank"))
    return f"rank {rank} (pid {j.get('pid')})" if rank is not None else f"pid {j.get('pid')}"
