"""The MCP server of ``dlwatch mcp``: the tools of ``dlwatch.mcp.tools`` over
stdio, with the official SDK (the optional ``mcp`` package, 2.x).

stdio only: the agent starts this process and talks on its stdin/stdout, so
there is no listener for anyone else to reach. Nothing here may print to
stdout (it is the protocol); the SDK's log goes to stderr at WARNING.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from dlwatch import __version__
from dlwatch.mcp.tools import ToolFailure, Tools, TuneRunner, available

INSTRUCTIONS = (
    "dlwatch measures live why a PyTorch training job on this machine is slow on its input pipeline "
    "(DataLoader). To answer 'why is this job slow?': list_jobs for its pid, then hints (the diagnosis, "
    "with evidence and a next step) and snapshot (the figures: the loop's data wait, batches/s, workers, "
    "cores); explain gives a hint's page (what it means, what to do). When the loop is slow without "
    "waiting for data, profile; when the workers are CPU-bound, "
    "worker_profile (both cost seconds of the job's time); when a job has gone silent, stacks (where "
    "each thread and worker is blocked). Only this user's jobs are visible."
)


def build(directory: str | None = None, tune_runner: TuneRunner | None = None) -> MCPServer:
    """The server with every tool this start allows: ``tune`` only with a
    ``tune_runner`` (``dlwatch mcp --allow-run``)."""
    tools = Tools(directory=directory, tune_runner=tune_runner)
    server: MCPServer = MCPServer(
        "dlwatch", instructions=INSTRUCTIONS, version=__version__, log_level="WARNING"
    )
    for spec in available(allow_run=tune_runner is not None):
        server.add_tool(
            _answering(getattr(tools, spec.name)),
            name=spec.name,
            description=spec.description,
            annotations=ToolAnnotations(
                read_only_hint=not spec.runs_commands,
                destructive_hint=False,
                open_world_hint=False,
            ),
        )
    return server


def _answering(fn: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """``fn`` with its failures as the SDK's tool errors: the call returns
    ``isError`` and the message, and the server logs no traceback. (The
    SDK reads the parameters through ``__wrapped__``.)"""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            return fn(*args, **kwargs)
        except ToolFailure as e:
            raise ToolError(str(e)) from None

    return call


def serve(directory: str | None = None, tune_runner: TuneRunner | None = None) -> None:
    """Answer on stdin/stdout until the client closes stdin."""
    build(directory, tune_runner).run("stdio")
