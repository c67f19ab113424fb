"""``dlwatch snapshot``: one measurement of every job, as text or JSON, then exit."""

from __future__ import annotations

import json
from typing import Any, cast

from dlwatch import rundir
from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, dir_problem, fail, no_jobs_message

NAME = "snapshot"
HELP = "one measurement of every job, then exit"
ORDER = 20


def add_arguments(p) -> None:
    p.add_argument(
        "--json", action="store_true", help='print the snapshot as JSON (its schema: README, "Snapshot JSON")'
    )
    p.add_argument("--pid", type=int, help="only the job with this trainer PID")
    p.add_argument(
        "--window", type=float, default=3.0, metavar="S", help="seconds the rates cover (default 3)"
    )


def run(args) -> int:
    from dlwatch.collect.monitor import take_snapshot

    if args.window <= 0:
        return fail("--window must be positive", EXIT_USAGE, "dlwatch snapshot")
    problem = dir_problem()
    if problem:
        if args.json:
            # A script reading the JSON gets the document, with the reason in
            # the schema's own field, rather than an empty stdout.
            print(json.dumps(empty_snapshot(problem), indent=2))
        return fail(problem, EXIT_ERROR)
    snap = take_snapshot(window_s=args.window, only_pid=args.pid)
    if args.pid is not None and not snap["jobs"]:
        return fail(f"no dlwatch job with PID {args.pid} in {rundir.runtime_dir()}")
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return EXIT_OK
    if not snap["jobs"]:
        print(no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_snapshot

    print(render_snapshot(cast(dict[str, Any], snap)))
    return EXIT_OK


def empty_snapshot(problem: str) -> dict:
    """The document when no job can be read at all: every figure missing and
    the reason in ``runtime_dir_error``."""
    import time

    from dlwatch.snapshot import SCHEMA_VERSION

    return {
        "schema_version": SCHEMA_VERSION,
        "time": time.time(),
        "window_s": None,
        "host": {"logical_cpus": None, "usable_cores": None, "cpu_percent": None, "shm_free_bytes": None},
        "gpu_status": "n/a: not sampled (no job can be read)",
        "gpus": [],
        "jobs": [],
        "hints": [],
        "runtime_dir": rundir.runtime_dir(),
        "runtime_dir_error": problem,
    }
