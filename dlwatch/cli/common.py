"""What every ``dlwatch`` subcommand shares: exit codes, the runtime-directory
guard, the "no jobs" message, the bootstrap environment of ``dlwatch run`` and
opening the live view on a source.

Subcommands import from here, never from ``main`` or from each other, so the
CLI has no import cycles and a new subcommand is one module in
``dlwatch/cli/commands/``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from dlwatch import rundir

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2
# `dlwatch compare --max-regression`: B regressed against A (a CI gate's "fail").
EXIT_REGRESSION = 3
# As shells report them: 126 not executable, 127 not found, 130 interrupted.
EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, EXIT_INTERRUPTED = 126, 127, 130


def number(text: str) -> float:
    """argparse's ``type`` for a figure in seconds, a speed, a percentage:
    ``float()`` reads "nan" and "inf" too, and NaN passes every ``<= 0``
    check after it (a QA run: ``--window nan`` ended in a traceback, ``record
    --duration nan`` never stopped), so neither gets past the parser."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not math.isfinite(v):
        raise argparse.ArgumentTypeError(f"must be a finite number, not {text!r}")
    return v


def fail(message: str, code: int = EXIT_ERROR, prog: str = "dlwatch") -> int:
    """One readable line on stderr; the exit code to return."""
    print(f"{prog}: {message}", file=sys.stderr)
    return code


def command_from(remainder: list[str], verb: str, prog: str) -> list[str] | int:
    """CMD from an ``argparse.REMAINDER`` (which keeps a leading ``--``), or
    the usage exit code when there is none."""
    cmd = list(remainder)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return fail(f"give the command to {verb}, e.g. `dlwatch {verb} -- python train.py`", EXIT_USAGE, prog)
    return cmd


def cannot_start(cmd: list[str], error: OSError, prog: str) -> int:
    """The exit code a shell gives when CMD cannot be started (``error`` from
    exec or Popen), after a one-line message."""
    if isinstance(error, FileNotFoundError):
        return fail(f"command not found: {cmd[0]}", EXIT_NOT_FOUND, prog)
    if os.path.isdir(cmd[0]):
        # exec says EACCES for a directory, as for a file without its x bit (bash: "Is a directory").
        return fail(f"{cmd[0]} is a directory, not a command", EXIT_NOT_EXECUTABLE, prog)
    if isinstance(error, PermissionError):
        return fail(f"permission denied: {cmd[0]}", EXIT_NOT_EXECUTABLE, prog)
    return fail(f"cannot run {cmd[0]}: {error.strerror or error}", EXIT_NOT_EXECUTABLE, prog)


def dir_problem(directory: str | None = None) -> str | None:
    """Why the runtime directory cannot be used, or None (``rundir.problem``)."""
    return rundir.problem(directory or rundir.runtime_dir())


def no_jobs_message() -> str:
    return (
        f"no dlwatch jobs found in {rundir.runtime_dir()}\n"
        "Start one with `import dlwatch.hook` in the training script, or "
        "`dlwatch run -- python train.py`."
    )


def bootstrap_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment under which every Python process imports dlwatch.hook
    (``dlwatch run``, ``dlwatch demo`` and any command that starts a job).

    The bootstrap is probe code that runs in the job's interpreters; this side
    only names its folder, it never imports it (nor the probe)."""
    import dlwatch

    env = dict(os.environ if env is None else env)
    boot = os.path.join(os.path.dirname(os.path.abspath(dlwatch.__file__)), "probe", "bootstrap")
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
    env["DLWATCH_PKG_DIR"] = os.path.dirname(os.path.abspath(dlwatch.__file__))
    return env


def add_host_arguments(p, sub: bool = False) -> None:
    """``--host`` and ``--remote-dlwatch``: other nodes' jobs through ssh
    (docs/multinode.md). ``sub``: a subcommand's, which leave what was given
    before the subcommand (``dlwatch --host n1 ls``) as it is."""
    keep = {"default": argparse.SUPPRESS} if sub else {}
    p.add_argument(
        "--host",
        action="append",
        metavar="DEST",
        **keep,
        help="also show the jobs of DEST, anything ssh accepts (an alias of your ssh config, user@node), "
        "read over ssh with `dlwatch snapshot --follow --json` there; repeat for several nodes "
        "(DLWATCH_SSH replaces the ssh command line)",
    )
    p.add_argument(
        "--remote-dlwatch",
        **(keep or {"default": "dlwatch"}),
        metavar="PATH",
        help="with --host: dlwatch's path on the hosts when it is not on their PATH "
        "(e.g. '~/venv/bin/dlwatch', quoted so that the node expands ~; default: dlwatch)",
    )


def hosts_of(args) -> list[str]:
    """The ``--host`` destinations, each once, in the order given."""
    return list(dict.fromkeys(getattr(args, "host", None) or []))


def open_live_view(args, source=None) -> int:
    """The live view on ``source`` (default: a live collector of this
    user's jobs, built every ``--interval`` over ``--window`` seconds)."""
    if args.interval <= 0:
        return fail("--interval must be positive", EXIT_USAGE)
    if args.window <= 0:
        return fail("--window must be positive", EXIT_USAGE)
    from dlwatch.tui.app import run_tui

    if source is None:
        from dlwatch.collect.monitor import Monitor

        # The collector builds a snapshot every interval and the view draws
        # each one as it comes: one period from the job to the screen, not two.
        source = Monitor(
            window_s=args.window, interval=args.interval, attach=getattr(args, "attach", None) or ()
        )
        hosts = hosts_of(args)
        if hosts:
            from dlwatch.collect.multihost import MultiHost

            source = MultiHost(
                source,
                hosts,
                dlwatch=getattr(args, "remote_dlwatch", "dlwatch"),
                interval=args.interval,
                window=args.window,
            )
    return run_tui(
        source,
        interval=args.interval,
        profiler=profile_runner(source),
        worker_profiler=profile_runner(source, workers=True),
        stacker=stacks_runner(source),
        follow_pid=getattr(args, "follow_pid", None),
    )


def stacks_runner(source):
    """How the live view's ``S`` asks a job for its stacks (``profile_runner``'s reason)."""
    import functools

    from dlwatch.collect.hang import gather_stacks

    return functools.partial(gather_stacks, directory=getattr(source, "directory", None))


def profile_runner(source, workers: bool = False):
    """How the live view runs a profiler burst (or, ``workers``, a worker
    profile): over the socket of the job in ``source``'s runtime dir. The view
    gets it from here so that the TUI never talks to a job itself."""
    import functools

    from dlwatch.collect.control import request_profile, request_worker_profile

    request = request_worker_profile if workers else request_profile
    return functools.partial(request, directory=getattr(source, "directory", None))
