"""``dlwatch record``: the live collector without a screen, writing every
snapshot to a JSON Lines file (``dlwatch replay``/``report`` read it)."""

from __future__ import annotations

import sys

from dlwatch import rundir
from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, dir_problem, fail, number
from dlwatch.cli.recording import (
    add_record_arguments,
    check_interval,
    make_recorder,
    stop_on_signals,
    summary,
)

NAME = "record"
HELP = "record every job's snapshots to a file (replay, report and compare it later)"
DESCRIPTION = (
    "Run the collector without a screen and write one snapshot per interval to a JSON Lines file: "
    "a header line, then the snapshot document of `dlwatch snapshot --json` on each line, with "
    "hints judged as in the live view (so history-based hints such as worker-memory-growth are "
    "in it). A name ending in .gz is gzip (the default name is). Ctrl-C or SIGTERM ends the "
    "recording cleanly; a recording cut short anyway still reads, minus its last line."
)
EPILOG = "example: dlwatch record -o night.jsonl.gz --interval 2; later: dlwatch report night.jsonl.gz"
ORDER = 50


def add_arguments(p) -> None:
    add_record_arguments(p, output_flags=("-o", "--output"))
    p.add_argument(
        "--duration", type=number, metavar="S", help="stop after S seconds (default: until Ctrl-C)"
    )
    p.add_argument(
        "--pid", type=int, help="only the job with this trainer PID; the recording ends when it exits"
    )


def run(args) -> int:
    prog = "dlwatch record"
    from dlwatch.record.recorder import default_path

    bad = check_interval(args.record_interval, prog)
    if bad is not None:
        return bad
    if args.duration is not None and args.duration <= 0:
        return fail("--duration must be positive", EXIT_USAGE, prog)
    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR, prog)
    until = None
    if args.pid is not None:
        from dlwatch.collect.jobs import pid_alive

        if not pid_alive(args.pid):
            return fail(f"no process with PID {args.pid}", EXIT_ERROR, prog)
        not_a_job = not_a_job_problem(args.pid, rundir.runtime_dir(), JOB_START_WAIT_S)
        if not_a_job:
            return fail(not_a_job, EXIT_ERROR, prog)
        until = _until_exited(args.pid)
    path = args.output or default_path()
    recorder = make_recorder(
        path,
        args.record_interval,
        args.force,
        prog,
        duration_s=args.duration,
        until=until,
        only_pid=args.pid,
        meta={"command": "record", "pid": args.pid, "runtime_dir": rundir.runtime_dir()},
    )
    if isinstance(recorder, int):
        return recorder
    stop_on_signals(recorder)
    print(
        f"dlwatch record: writing {path} every {args.record_interval:g} s"
        f"{'' if args.pid is None else f' (job {args.pid})'}; Ctrl-C ends it",
        file=sys.stderr,
    )
    stats = recorder.run()
    print(summary(path, stats), file=sys.stderr)
    return EXIT_OK


# A job started a moment ago has not published yet (Python and torch are
# still importing): this long for its socket before saying it is no job.
JOB_START_WAIT_S = 10.0


def not_a_job_problem(pid: int, directory: str, wait_s: float) -> str | None:
    """Why ``pid`` is not a dlwatch job (with the PID to use instead), or None
    when it is one. Recording a PID that never publishes would only end with
    "0 jobs" once it exits (the ``dlwatch run`` wrapper's PID was given). A
    process younger than ``wait_s`` may be a job still importing torch: it
    gets the rest of that time to publish; an older one is answered at once
    (a QA run waited 10 s in silence for a worker's PID)."""
    import time

    import psutil

    from dlwatch.collect import whose
    from dlwatch.collect.jobs import discover, pid_alive

    try:
        end = psutil.Process(pid).create_time() + wait_s
    except psutil.Error:
        end = 0.0
    told = False
    while True:
        jobs = {p for p, _ in discover(directory)}
        if pid in jobs:
            return None
        kind, why = whose.explain(pid, jobs, directory)
        if kind != whose.NOT_HOOKED or time.time() >= end or not pid_alive(pid):
            return why
        if not told:
            print(
                f"dlwatch record: PID {pid} started {time.time() - end + wait_s:.0f} s ago and has no "
                f"dlwatch socket yet; waiting up to {end - time.time():.0f} s for it",
                file=sys.stderr,
            )
            told = True
        time.sleep(0.2)


def _until_exited(pid: int):
    """Stop once the job is in the snapshot and no longer live, or its
    process is gone without ever having said hello."""
    from dlwatch.collect.jobs import pid_alive
    from dlwatch.snapshot import find_job

    def until(snap) -> str | None:
        job = find_job(snap, pid)
        if job is not None and job.get("state") == "exited":
            return f"job {pid} exited"
        if job is None and not pid_alive(pid):
            return f"process {pid} has exited"
        return None

    return until
