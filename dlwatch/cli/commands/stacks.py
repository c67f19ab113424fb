"""``dlwatch stacks``: where a job is stuck, now (docs/hangs.md)."""

from __future__ import annotations

import json

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, dir_problem, fail, no_jobs_message

NAME = "stacks"
HELP = "the Python stacks of a job's threads and DataLoader workers, and where each is blocked"
ORDER = 35
DESCRIPTION = (
    "Ask a running job for the Python stacks of every thread of the trainer (the pin-memory "
    "thread included) and of every DataLoader worker, and print first one line per process "
    "naming the frame it is blocked in, then the stacks. The job reads its own threads and "
    "asks each worker through the worker's own channel: no ptrace, no signal, nothing paused. "
    "A process that cannot answer (a C call holding the GIL, a job started without the hook) "
    "is read with `py-spy dump --nonblocking` when py-spy is installed and the kernel allows "
    "it; otherwise the output says which permission is missing."
)
EPILOG = "Exit codes: 0 stacks printed, 1 the job could not be asked and no process could be read, 2 usage."


def add_arguments(p) -> None:
    p.add_argument("--pid", type=int, help="the trainer PID (default: the only job there is)")
    p.add_argument("--json", action="store_true", help="print the whole document as JSON")
    p.add_argument("--brief", action="store_true", help="only the one line per process")
    p.add_argument("--no-py-spy", action="store_true", help="never read a process from outside")


def run(args) -> int:
    from dlwatch.collect.hang import gather_stacks
    from dlwatch.diagnose.hang import render

    prog = "dlwatch stacks"
    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR, prog)
    pid = args.pid
    if pid is None:
        pid, message = _only_job()
        if pid is None:
            return fail(message, EXIT_ERROR if "no dlwatch jobs" in message else EXIT_USAGE, prog)
    doc = gather_stacks(pid, py_spy=not args.no_py_spy)
    if args.json:
        print(json.dumps(doc, indent=2))
    elif doc.get("processes"):
        print("\n".join(render(doc, full=not args.brief)))
    if doc.get("error") and not doc.get("processes"):
        return fail(str(doc["error"]), EXIT_ERROR, prog)
    if not any(p.get("threads") for p in doc.get("processes") or [] if isinstance(p, dict)):
        # Each process's line says why it could not be read; none was: a failure.
        return EXIT_ERROR
    return EXIT_OK


def _only_job() -> tuple[int | None, str]:
    from dlwatch import rundir
    from dlwatch.collect.jobs import discover

    jobs = sorted(discover(rundir.runtime_dir()))
    if len(jobs) == 1:
        return jobs[0][0], ""
    if not jobs:
        return None, no_jobs_message()
    return None, f"{len(jobs)} jobs are running ({', '.join(str(p) for p, _ in jobs)}): name one with --pid"
