"""``dlwatch ls [--json]``: the instrumented jobs of this user on this box."""

from __future__ import annotations

import json

from dlwatch import rundir
from dlwatch.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    add_host_arguments,
    dir_problem,
    fail,
    hosts_of,
    no_jobs_message,
)

NAME = "ls"
HELP = "list instrumented jobs"
ORDER = 10


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")
    add_host_arguments(p, sub=True)


def run(args) -> int:
    hosts = hosts_of(args)
    problem = dir_problem()
    if problem and not hosts:
        return fail(problem, EXIT_ERROR)
    jobs = [] if problem else local_jobs()
    if hosts:
        return over_hosts(args, jobs, hosts, problem)
    if args.json:
        print(json.dumps({"schema_version": 1, "runtime_dir": rundir.runtime_dir(), "jobs": jobs}, indent=2))
        return EXIT_OK
    if not jobs:
        print(no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_ls

    print(render_ls(jobs))
    return EXIT_OK


def over_hosts(args, local: list[dict], hosts: list[str], problem: str | None) -> int:
    """Every host's jobs (``host`` on each) and one line per host: its state
    and, when it could not be read, why."""
    from dlwatch.cli.text import render_hosts, render_ls
    from dlwatch.collect.multihost import list_jobs

    jobs, lines = list_jobs(local, hosts, args.remote_dlwatch, local_problem=problem)
    if args.json:
        doc = {"schema_version": 1, "runtime_dir": rundir.runtime_dir(), "jobs": jobs, "hosts": lines}
        print(json.dumps(doc, indent=2))
    else:
        print(render_ls(jobs) if jobs else "no dlwatch jobs found on any host")
        print(render_hosts(lines))
    # 1 when no host given could be read: a script must not take that for "no jobs".
    return EXIT_OK if any(h["state"] == "ok" for h in lines if not h["local"]) else EXIT_ERROR


def local_jobs() -> list[dict]:
    """This machine's jobs: identity only."""
    from dlwatch.collect.monitor import Monitor

    # Identity only: no process, host or GPU figures, no diagnosis.
    m = Monitor(gpu=False, procs=False, host=False, diagnoser=False)
    try:
        snap = m.sample_now(settle_s=0.2)
    finally:
        m.stop()
    return [
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
