"""``dlwatch profile``: a torch.profiler burst of N steps of a running job, or
(``--workers``) a sampling burst of its DataLoader workers' fetches."""

from __future__ import annotations

import json
import os
import sys

from dlwatch import wire
from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, dir_problem, fail, no_jobs_message, number

NAME = "profile"
HELP = "profile a job: torch.profiler over a few steps, or (--workers) what its workers' fetches cost"
ORDER = 30
DESCRIPTION = (
    "Ask a running job for a torch.profiler burst of --steps training steps (counted at the "
    "DataLoader the training loop steps now: a new one each pass is followed), without stopping "
    "it. Prints why its steps are slow (data-bound, launch-bound, dispatch-bound, gpu-bound or "
    "cpu-bound), the numbers behind "
    "it and one next step, and writes a Chrome trace (Perfetto, chrome://tracing). With --workers: "
    "the loop's loader's worker processes sample their own stacks for --seconds and the answer "
    "splits their time inside fetches by stage (file read, image decode, each transform, "
    "tokenization, collate, your own functions) and by function."
)
EPILOG = (
    "The job writes the trace (mode 0600) in --out, by default this command's working "
    "directory, or in the runtime directory if it cannot write there (the output says so). "
    f"Bounds: at most {wire.PROFILE_MAX_STEPS} steps and {wire.PROFILE_MAX_SECONDS:g} s. "
    "Exit codes: 0 done, 1 the burst could not run, 2 usage."
)


def add_arguments(p) -> None:
    p.add_argument("--pid", type=int, help="the trainer PID (default: the only job there is)")
    # (flag, type, default, metavar, help): the bounds each burst kind takes
    for flag, kind, default, metavar, text in (
        (
            "--steps",
            int,
            wire.PROFILE_DEFAULT_STEPS,
            "N",
            f"training steps to profile (default {wire.PROFILE_DEFAULT_STEPS}, "
            f"at most {wire.PROFILE_MAX_STEPS})",
        ),
        (
            "--max-seconds",
            number,
            wire.PROFILE_MAX_SECONDS,
            "S",
            "stop after this long even if fewer steps ran "
            f"(default and at most {wire.PROFILE_MAX_SECONDS:g})",
        ),
    ):
        p.add_argument(flag, type=kind, default=default, metavar=metavar, help=text)
    p.add_argument("--out", metavar="DIR", help="directory for the trace (default: the current directory)")
    p.add_argument(
        "--workers",
        action="store_true",
        help="profile the DataLoader workers' fetches instead (docs/profiles.md)",
    )
    p.add_argument(
        "--seconds",
        type=number,
        default=wire.WORKER_PROFILE_DEFAULT_SECONDS,
        metavar="S",
        help=f"with --workers: how long to sample (default {wire.WORKER_PROFILE_DEFAULT_SECONDS:g}, "
        f"at most {wire.WORKER_PROFILE_MAX_SECONDS:g})",
    )
    hz = wire.WORKER_PROFILE_DEFAULT_HZ
    p.add_argument(
        "--hz", type=int, default=hz, metavar="N", help=f"with --workers: samples/s per worker (default {hz})"
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON (docs/profiles.md)")


def run(args) -> int:
    from dlwatch.collect.control import ProfileError, request_profile
    from dlwatch.diagnose.profile import summary_lines

    prog = "dlwatch profile"
    if args.workers:
        return _run_workers(args, prog)
    if not 1 <= args.steps <= wire.PROFILE_MAX_STEPS:
        return fail(f"--steps must be between 1 and {wire.PROFILE_MAX_STEPS}", EXIT_USAGE, prog)
    if not 0 < args.max_seconds <= wire.PROFILE_MAX_SECONDS:
        return fail(f"--max-seconds must be in (0, {wire.PROFILE_MAX_SECONDS:g}]", EXIT_USAGE, prog)
    out_dir = None
    if args.out is not None:
        out_dir = os.path.abspath(args.out)
        if not os.path.isdir(out_dir):
            return fail(f"--out {args.out}: not a directory", EXIT_USAGE, prog)
    pid = _target(args, prog)
    if pid < 0:
        return -pid

    def progress(msg: dict) -> None:
        if args.json:
            return
        done, total = msg.get("steps_done") or 0, msg.get("steps") or args.steps
        state = msg.get("state")
        what = "waiting for the loop's next batch" if state == "armed" else f"{done}/{total} steps"
        if state == "processing":
            what = "reading the profile and writing the trace"
        print(f"\rprofiling PID {pid}: {what}".ljust(60), end="", file=sys.stderr, flush=True)

    try:
        doc = request_profile(pid, args.steps, args.max_seconds, out_dir, on_status=progress)
    except ProfileError as e:
        from dlwatch.diagnose.profile import summary

        return _failed(e, summary(pid, None, str(e)), args, prog)
    return _report(doc, summary_lines, pid, args, prog)


def _run_workers(args, prog: str) -> int:
    from dlwatch.collect.control import ProfileError, request_worker_profile
    from dlwatch.diagnose.worker_profile import summary, summary_lines

    if not 0 < args.seconds <= wire.WORKER_PROFILE_MAX_SECONDS:
        return fail(f"--seconds must be in (0, {wire.WORKER_PROFILE_MAX_SECONDS:g}]", EXIT_USAGE, prog)
    if not 1 <= args.hz <= wire.WORKER_PROFILE_MAX_HZ:
        return fail(f"--hz must be between 1 and {wire.WORKER_PROFILE_MAX_HZ}", EXIT_USAGE, prog)
    pid = _target(args, prog)
    if pid < 0:
        return -pid

    def progress(msg: dict) -> None:
        if not args.json:
            text = f"worker profile of PID {pid}: {msg.get('message') or msg.get('state')}"
            print("\r" + text.ljust(70), end="", file=sys.stderr, flush=True)

    try:
        doc = request_worker_profile(pid, args.seconds, args.hz, on_status=progress)
    except ProfileError as e:
        return _failed(e, summary(pid, None, str(e)), args, prog)
    return _report(doc, summary_lines, pid, args, prog)


def _target(args, prog: str) -> int:
    """The job's PID (--pid, or the only job), or minus the exit status."""
    problem = dir_problem()
    if problem:
        return -fail(problem, EXIT_ERROR, prog)
    if args.pid is not None:
        return args.pid
    pid, message = _only_job()
    if pid is None:
        return -fail(message, EXIT_ERROR if "no dlwatch jobs" in message else EXIT_USAGE, prog)
    return pid


def _failed(e, summary_doc: dict, args, prog: str) -> int:
    """A burst that could not run: its summary as JSON, or a line on stderr."""
    if args.json:
        print(json.dumps(summary_doc, indent=2))
    else:
        print(file=sys.stderr)
    return fail(str(e), EXIT_USAGE if e.kind == "usage" else EXIT_ERROR, prog)


def _report(doc: dict, summary_lines, pid: int, args, prog: str) -> int:
    """The burst's answer: JSON, or the progress line cleared and the verdict."""
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print("\r" + " " * 70 + "\r", end="", file=sys.stderr, flush=True)
        if not doc.get("error"):
            print("\n".join(summary_lines(doc)))
    if doc.get("error"):
        return fail(f"PID {pid}: {doc['error']}", EXIT_ERROR, prog)
    return EXIT_OK


def _only_job() -> tuple[int | None, str]:
    from dlwatch import rundir
    from dlwatch.collect.jobs import discover

    jobs = discover(rundir.runtime_dir())
    if not jobs:
        return None, no_jobs_message()
    if len(jobs) > 1:
        pids = ", ".join(str(p) for p, _ in sorted(jobs))
        return None, f"{len(jobs)} jobs are running ({pids}): name one with --pid"
    return jobs[0][0], ""
