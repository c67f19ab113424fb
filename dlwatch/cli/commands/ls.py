"""``dlwatch ls [--json]``: the instrumented jobs of this user on this box."""

from __future__ import annotations

import json

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, dir_problem, fail, no_jobs_message

NAME = "ls"
HELP = "list instrumented jobs"
ORDER = 10


def add_arguments(p) -> None:
    p.add_argument("--json", action="store_true", help="print the list as JSON")


def run(args) -> int:
    from dlwatch.collect.listing import list_jobs

    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR)
    doc = list_jobs()
    if args.json:
        print(json.dumps(doc, indent=2))
        return EXIT_OK
    if not doc["jobs"]:
        print(no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_ls

    print(render_ls(doc["jobs"]))
    return EXIT_OK
