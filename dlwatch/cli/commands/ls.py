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
    from dlwatch.collect.listing import list_jobs

    doc = None if problem else list_jobs()
    jobs = doc["jobs"] if doc else []
    if hosts:
        return over_hosts(args, jobs, hosts, problem)
    if args.json:
        print(json.dumps(doc, indent=2))
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
    from dlwatch.collect.multihost import list_jobs as list_on_hosts

    jobs, lines = list_on_hosts(local, hosts, args.remote_dlwatch, local_problem=problem)
    if args.json:
        doc = {"schema_version": 1, "runtime_dir": rundir.runtime_dir(), "jobs": jobs, "hosts": lines}
        print(json.dumps(doc, indent=2))
    else:
        print(render_ls(jobs) if jobs else "no dlwatch jobs found on any host")
        print(render_hosts(lines))
    # 1 when no host given could be read: a script must not take that for "no jobs".
    return EXIT_OK if any(h["state"] == "ok" for h in lines if not h["local"]) else EXIT_ERROR
