"""``dlwatch ls [--json]``: the instrumented jobs of this user on this box."""

from __future__ import annotations

import json

from dlwatch import rundir
from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, dir_problem, fail, no_jobs_message

NAME = "ls"
HELP = "list instrumented jobs"
ORDER = 10


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def run(args) -> int:
    from dlwatch.collect.monitor import Monitor

    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR)
    # Identity only: no process, host or GPU figures, no diagnosis.
    m = Monitor(gpu=False, procs=False, host=False, diagnoser=False)
    try:
        snap = m.sample_now(settle_s=0.2)
    finally:
        m.stop()
    jobs = [
        {
            "pid": j["pid"],
            "rank": j["rank"],
            "local_rank": j["local_rank"],
            "world_size": j["world_size"],
            "run_id": j.get("run_id"),
            "cmdline": j["cmdline"],
            "loaders": len(j["loaders"]),
            "age_s": j.get("age_s"),
            "state": j.get("state"),
        }
        for j in snap["jobs"]
    ]
    if args.json:
        print(json.dumps({"schema_version": 1, "runtime_dir": rundir.runtime_dir(), "jobs": jobs}, indent=2))
        return EXIT_OK
    if not jobs:
        print(no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_ls

    print(render_ls(jobs))
    return EXIT_OK
