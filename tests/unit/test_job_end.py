"""How a watched job ended (collect/job_end.py): the reason its state gives,
and the order in which the ranks of a run ended."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from dlwatch.collect import job_end

KILLED = signal.SIGKILL  # a wait status of a process killed by SIGKILL is the signal number
EXIT_3 = 3 << 8


@pytest.mark.parametrize(
    "args, want",
    [
        (
            ("RuntimeError: boom", False, KILLED, 1),
            "the process has exited after an uncaught RuntimeError: boom",
        ),
        ((None, False, KILLED, None), "the process was killed by SIGKILL"),
        (
            (None, None, KILLED, 2),
            "the process was killed by SIGKILL; the cgroup counted 2 OOM kills since dlwatch first saw the "
            "job: the OOM killer, most likely",
        ),
        ((None, True, EXIT_3, None), "the process has exited with code 3"),
        ((None, False, 0, None), "the process has exited with code 0 without Python's shutdown (os._exit)"),
        ((None, True, 0, None), "the process has exited"),
        ((None, True, None, None), "the process has exited"),
        ((None, None, None, None), "the process has exited"),  # a job that predates the last frame
    ],
)
def test_the_reason_says_what_the_evidence_shows(args, want):
    assert job_end.reason(*args) == want


def test_a_failing_sys_exit_names_the_code_a_reaped_job_lost():
    assert job_end.reason(None, True, None, None, exit_call="sys.exit(3)") == (
        "the process has exited after sys.exit(3)"
    )
    # The wait status, when read (the monitor's exit clock reads it before
    # a shell reaps), agrees: the call says where the code came from; a code
    # of another is the status's; without a last frame at exit the call is
    # not what ended it.
    assert job_end.reason(None, True, EXIT_3, None, exit_call="sys.exit(3)") == (
        "the process has exited after sys.exit(3)"
    )
    assert job_end.reason(None, True, EXIT_3, None, exit_call="sys.exit(1)") == (
        "the process has exited with code 3"
    )
    assert job_end.reason(None, False, None, None, exit_call="sys.exit(3)").startswith(
        "the process ended without exiting through Python"
    )


def test_a_job_that_did_not_speak_at_exit_was_killed_crashed_or_called_os_exit():
    got = job_end.reason(None, False, None, 1)
    assert got.startswith(
        "the process ended without exiting through Python: a signal (SIGKILL, SIGTERM), a crash or os._exit; "
    )
    assert got.endswith("the OOM killer, most likely")


def test_a_zombies_reason_says_how_it_ended():
    p = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    assert job_end.zombie_reason(p.pid) == (
        f"process {p.pid} exited with code 7, not yet reaped by its parent (a zombie)"
    )
    p.wait()
    assert job_end.zombie_reason(p.pid).startswith(f"process {p.pid} exited, not yet reaped")


def test_the_wait_status_of_a_zombie_and_none_once_reaped():
    p = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)  # dead, left unreaped
    status = job_end.zombie_status(p.pid)
    assert status is not None and os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    p.wait()
    assert job_end.zombie_status(p.pid) is None
    assert job_end.zombie_status(os.getpid()) is None  # alive: no status


def _rank(pid: int, rank: int, run: str = "r1", state: str = "exited") -> dict:
    return {"pid": pid, "rank": rank, "run_id": run, "master": "h:1", "state": state, "state_reason": "x"}


def test_the_first_rank_of_a_run_to_end_is_named_and_the_others_after_it():
    jobs = [_rank(10, 0), _rank(11, 1), _rank(12, 0, run="other")]
    job_end.order_of_ends(jobs, {10: 100.9, 11: 100.0, 12: 50.0})
    assert jobs[1]["state_reason"] == "x; the first rank of its run to end"
    assert jobs[0]["state_reason"] == "x; 0.9 s after rank 1 (pid 11), the first of its run to end"
    assert jobs[2]["state_reason"] == "x"  # a run of one


def test_ends_within_the_frames_spacing_are_together_and_a_late_or_live_rank_is_left_alone():
    jobs = [_rank(10, 0), _rank(11, 1), _rank(12, 2), _rank(13, 3, state="live"), _rank(14, 4)]
    job_end.order_of_ends(jobs, {10: 100.1, 11: 100.0, 12: 101.0, 13: 100.0, 14: 400.0})
    assert jobs[1]["state_reason"] == (
        "x; it ended with rank 0 (pid 10) (within 0.25 s), the first of its run to end"
    )
    assert jobs[0]["state_reason"].startswith("x; it ended with rank 1 (pid 11) (within")
    assert jobs[2]["state_reason"] == (
        "x; 1.0 s after rank 1 (pid 11) and rank 0 (pid 10), the first of its run to end"
    )
    assert jobs[3]["state_reason"] == jobs[4]["state_reason"] == "x"


def test_the_exit_clock_tells_apart_ends_the_frames_cannot_and_falls_back_when_one_is_missing():
    jobs = [_rank(10, 0), _rank(11, 1)]
    # Frames 0.05 s apart in the wrong order; the exit clock saw rank 1 end 0.13 s first.
    job_end.order_of_ends(jobs, {10: 100.0, 11: 100.05}, {10: 100.25, 11: 100.12})
    assert jobs[1]["state_reason"] == "x; the first rank of its run to end"
    assert jobs[0]["state_reason"] == "x; 0.13 s after rank 1 (pid 11), the first of its run to end"
    # Seen in one wake of the clock's thread (stamped alike), they read together.
    jobs = [_rank(10, 0), _rank(11, 1)]
    job_end.order_of_ends(jobs, {10: 100.0, 11: 100.0}, {10: 100.2, 11: 100.2})
    assert jobs[0]["state_reason"] == (
        "x; it ended with rank 1 (pid 11) (seen ending at the same moment), the first of its run to end"
    )
    # One rank the clock did not see end: the frames order all of them.
    jobs = [_rank(10, 0), _rank(11, 1)]
    job_end.order_of_ends(jobs, {10: 100.0, 11: 100.05}, {10: 100.25, 11: None})
    assert "(within 0.25 s)" in jobs[0]["state_reason"]


def test_a_job_that_died_after_a_worker_death_says_so():
    loaders = [
        {"id": 0, "worker_deaths": []},
        {"id": 1, "worker_deaths": [{"id": 0, "pid": 26399, "signal": "SIGKILL", "t": 5.0}]},
    ]
    why = job_end.reason("ConnectionRefusedError: [Errno 111] Connection refused", True)
    assert job_end.after_worker_death(why, loaders) == (
        f"{why}; before it, worker 0 (pid 26399) of loader 1 died (SIGKILL)"
    )
    assert job_end.after_worker_death("the process has exited with code 1", loaders).endswith(
        "died (SIGKILL)"
    )
    # A clean end, and torch's own error, which names the death already, stay as they are.
    assert job_end.after_worker_death(job_end.EXITED, loaders) == job_end.EXITED
    torch_says = (
        "the process has exited after an uncaught RuntimeError: "
        "DataLoader worker (pid 7) is killed by signal: Killed. "
    )
    assert job_end.after_worker_death(torch_says, loaders) == torch_says
    assert job_end.after_worker_death("x", [{"id": 0}]) == "x"
    raised = [
        {"id": 0, "worker_deaths": [{"id": 1, "pid": 8, "exception": "ValueError: bad", "exit_code": None}]}
    ]
    assert job_end.after_worker_death("x", raised) == "x"


def test_a_rank_without_a_last_frame_is_ordered_only_by_the_exit_clock():
    # Not clocked: the rank with no frame is left out, not placed first at t=0.
    jobs = [_rank(10, 0), _rank(11, 1), _rank(12, 2)]
    job_end.order_of_ends(jobs, {10: 100.0, 11: 100.9, 12: None}, {10: 100.1, 11: None, 12: 100.2})
    assert jobs[0]["state_reason"] == "x; the first rank of its run to end"
    assert jobs[2]["state_reason"] == "x"
    # Clocked: every rank by the exit clock, frame or not.
    jobs = [_rank(10, 0), _rank(11, 1)]
    job_end.order_of_ends(jobs, {10: 100.0, 11: None}, {10: 100.3, 11: 100.1})
    assert jobs[1]["state_reason"] == "x; the first rank of its run to end"
