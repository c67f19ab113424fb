"""``dlwatch mcp [--allow-run]``: an MCP server on stdin/stdout for coding
agents (docs/mcp.md)."""

from __future__ import annotations

import sys
from typing import Any

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, bootstrap_env, dir_problem, fail

NAME = "mcp"
HELP = "serve this user's jobs to a coding agent over MCP (stdio; read-only unless --allow-run)"
ORDER = 55
PROG = "dlwatch mcp"
DESCRIPTION = (
    "A Model Context Protocol server on stdin/stdout, started by an agent (Claude Code, Codex, an IDE "
    "assistant): its tools list this user's dlwatch jobs, take a snapshot, give the hints with their "
    "evidence, and run a profiler burst or a worker profile of a job (bounded as `dlwatch profile`). "
    "It opens no network port and sees only your own jobs. Register it, e.g.: "
    "`claude mcp add dlwatch -- dlwatch mcp`."
)
EPILOG = (
    "Needs the MCP SDK: pip install 'dlwatch[mcp]'. Without --allow-run no tool starts a "
    "process. Exit codes: 0 the client closed the connection, 1 error."
)
INSTALL = "needs the MCP SDK (mcp>=2.3): pip install 'dlwatch[mcp]'"


def add_arguments(p) -> None:
    p.add_argument(
        "--allow-run",
        action="store_true",
        help="also offer the `tune` tool, which STARTS the command the agent names several times "
        "(as `dlwatch tune`); without it no tool starts anything",
    )


def run(args) -> int:
    try:
        from dlwatch.mcp import server
    except ModuleNotFoundError as e:  # the SDK, or its 2.x API, is not installed
        if (e.name or "").split(".")[0] not in ("mcp", "mcp_types"):
            raise
        return fail(INSTALL, EXIT_ERROR, PROG)
    problem = dir_problem()
    if problem:
        return fail(problem, EXIT_ERROR, PROG)
    if sys.stdin.isatty():
        print(
            f"{PROG}: serving MCP on stdin/stdout for an agent (docs/mcp.md); Ctrl-C stops it",
            file=sys.stderr,
        )
    if args.allow_run:  # (stderr is the client's log of this server)
        print(f"{PROG}: --allow-run: the tune tool may start the commands the agent names", file=sys.stderr)
    server.serve(tune_runner=run_tune if args.allow_run else None)
    return EXIT_OK


def run_tune(
    command: list[str], trial_s: float, max_trials: int, budget_s: float, workers: list[int] | None
) -> dict[str, Any]:
    """``dlwatch tune --json`` of ``command``, for the server's tune tool
    (``dlwatch.mcp.tools.TuneRunner``). The trials' output goes nowhere
    (tune's runner), so the protocol on stdout is untouched."""
    from dlwatch.tune import report
    from dlwatch.tune.sweep import Sweep, TuneOptions

    opts = TuneOptions(trial_s=trial_s, max_trials=max_trials, budget_s=budget_s, workers=workers)
    return report.annotate(Sweep(command, bootstrap_env(), opts).run())
