"""``dlwatch run [--record FILE] [--] CMD [ARGS...]``: a command with the hook
in every Python process; with ``--record``, its jobs recorded for its lifetime."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from dlwatch.cli.common import (
    EXIT_ERROR,
    bootstrap_env,
    cannot_start,
    command_from,
    dir_problem,
    fail,
)
from dlwatch.cli.recording import add_record_arguments, check_interval, make_recorder, summary

NAME = "run"
HELP = "run a command with the hook active in every Python process it starts"
DESCRIPTION = (
    "Run CMD with dlwatch's hook active in every Python process it starts (torchrun ranks "
    "and DataLoader workers included), with no change to the training script: the hook is "
    "imported through a sitecustomize on PYTHONPATH. Then watch the job with `dlwatch` in "
    "another terminal. The command replaces this process (same PID, signals and exit code). "
    "With --record FILE, dlwatch instead starts CMD as its child, records every job CMD starts "
    "(as `dlwatch record` does) until CMD exits, passes SIGINT/SIGTERM on to it and exits "
    "with its status."
)
EPILOG = (
    "examples: dlwatch run -- torchrun --nproc-per-node 2 train.py --epochs 3; "
    "dlwatch run --record before.jsonl.gz -- python train.py"
)
ORDER = 30
PROG = "dlwatch run"


def add_arguments(p) -> None:
    p.add_argument(
        "--record",
        metavar="FILE",
        help="record the jobs CMD starts to FILE until CMD exits (.gz: compressed); "
        "read it with dlwatch replay/report",
    )
    add_record_arguments(p, output_flags=())
    p.add_argument(
        "--autotune",
        action="store_true",
        help="change num_workers and prefetch_factor between epochs of map-style loaders, "
        "by tune's search, without changing the batches or their order (docs/autotune.md)",
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")


def run(args) -> int:
    cmd = command_from(args.cmd, "run", PROG)
    if isinstance(cmd, int):
        return cmd
    if args.autotune:
        # Read by the hook inside the job (probe/autotune.py).
        os.environ["DLWATCH_AUTOTUNE"] = "1"
    if args.record:
        return run_recorded(cmd, args)
    try:
        os.execvpe(cmd[0], cmd, bootstrap_env())
    except (FileNotFoundError, PermissionError) as e:
        return cannot_start(cmd, e, PROG)
    return EXIT_ERROR  # not reached: exec replaced us


def run_recorded(cmd: list[str], args) -> int:
    from dlwatch import rundir

    bad = check_interval(args.record_interval, PROG)
    if bad is not None:
        return bad
    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR, PROG)
    ours = JobsOf()
    recorder = make_recorder(
        args.record,
        args.record_interval,
        args.force,
        PROG,
        keep_job=ours,
        until=ours.until_done,
        meta={"command": "run", "argv": cmd, "runtime_dir": rundir.runtime_dir()},
    )
    if isinstance(recorder, int):
        return recorder
    # The signals are ours before CMD starts: one that comes while it starts
    # (CMD may already run its first line) waits for it, instead of ending
    # this process with CMD left running and the recorder's thread alive.
    deliver = forward_signals()
    try:
        child = subprocess.Popen(cmd, env=bootstrap_env())
    except (FileNotFoundError, PermissionError) as e:
        recorder.discard()
        return cannot_start(cmd, e, PROG)
    ours.child = child
    deliver(child)
    print(f"{PROG}: recording pid {child.pid} and its jobs to {args.record}", file=sys.stderr)
    try:
        stats = recorder.run()
    finally:
        # The recorder ends when CMD does; if it ended otherwise (an error),
        # CMD is still waited for: its exit status is ours.
        rc = child.wait()
    print(summary(args.record, stats, PROG), file=sys.stderr)
    return 128 - rc if rc < 0 else rc


class JobsOf:
    """Which jobs belong to the command: its own process and every
    descendant (torchrun's ranks, a shell's python). A PID's answer is kept:
    a job that has exited is still ours, and a PID is looked up once."""

    # After CMD exits, at most this long for its jobs' last figures (the
    # collector sees the socket close within a build or two).
    FINAL_S = 3.0

    def __init__(self) -> None:
        self.child: subprocess.Popen[bytes] | None = None
        self._known: dict[int, bool] = {}
        self._exited_at: float | None = None

    def __call__(self, pid: int) -> bool:
        if self.child is None:
            return False
        known = self._known.get(pid)
        if known is None:
            known = self._known[pid] = pid == self.child.pid or self._descends(pid)
        return known

    def _descends(self, pid: int) -> bool:
        import psutil

        try:
            child = self.child.pid if self.child is not None else None
            return any(p.pid == child for p in psutil.Process(pid).parents())
        except (psutil.Error, OSError):
            return False

    def until_done(self, snap) -> str | None:
        """Once CMD has exited: stop when its jobs are shown as ended (their
        last figures are in the file), or after ``FINAL_S`` at most."""
        from dlwatch.snapshot import is_live, records

        if self.child is None or self.child.poll() is None:
            return None
        if self._exited_at is None:
            self._exited_at = time.monotonic()
        reason = exit_reason(self.child.returncode)
        if not any(is_live(j) for j in records(snap.get("jobs"))):
            return reason
        return reason if time.monotonic() - self._exited_at >= self.FINAL_S else None


def exit_reason(returncode: int) -> str:
    """How CMD ended, in words: a negative status is the signal that ended
    it (Popen's convention), and 130 / 143 are a shell's way of saying the
    same of SIGINT / SIGTERM."""
    sig = -returncode if returncode < 0 else returncode - 128 if returncode in (130, 143) else None
    if sig == signal.SIGINT:
        return "the command was interrupted (Ctrl-C, SIGINT); the recording is kept"
    if sig == signal.SIGTERM:
        return "the command was stopped (SIGTERM); the recording is kept"
    if sig is not None and returncode < 0:
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the command was killed by {name}; the recording is kept"
    return f"the command exited with status {returncode}"


def forward_signals():
    """SIGTERM goes on to CMD. So does SIGINT, except from the terminal:
    Ctrl-C reaches every process of the foreground group, CMD included, and
    a second SIGINT would cut its own clean-up short. The recording ends
    when CMD exits, whatever made it exit. Installed before CMD starts;
    returns the call that names CMD once it has, which passes on what came
    in between."""
    child: subprocess.Popen[bytes] | None = None
    pending: list[int] = []

    def send(signum: int) -> None:
        try:
            if child is not None:
                child.send_signal(signum)
        except ProcessLookupError:
            pass

    def handler(signum, _frame):
        if signum == signal.SIGINT and _terminal_sent_it():
            return
        if child is None:
            pending.append(signum)
        else:
            send(signum)

    def deliver(started: subprocess.Popen[bytes]) -> None:
        nonlocal child
        child = started
        while pending:
            send(pending.pop(0))

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return deliver


def _terminal_sent_it() -> bool:
    """Whether this process is in its terminal's foreground group (a Ctrl-C
    there went to CMD too)."""
    for fd in (0, 1, 2):
        try:
            return os.tcgetpgrp(fd) == os.getpgrp()
        except OSError:
            continue
    return False
