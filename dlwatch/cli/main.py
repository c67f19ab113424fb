"""``dlwatch`` command line: the live view, and one subcommand per module of
``dlwatch/cli/commands/``.

Exit codes (``dlwatch.cli.common``): 0 ok, 1 error, 2 usage. Errors are one
readable line on stderr.
"""

from __future__ import annotations

import argparse
import difflib
import sys

from dlwatch import __version__
from dlwatch.cli import commands
from dlwatch.cli.common import (
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    add_host_arguments,
    dir_problem,
    fail,
    hosts_of,
    number,
    open_live_view,
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors: keep that
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with ``command`` (a command's name), only that
    command's subparser, when there is such a command."""
    p = _Parser(
        prog="dlwatch",
        description="Live monitor of PyTorch DataLoader input pipelines. Without a command, "
        "opens the live view of every job of this user on this machine.",
        epilog="Instrument a job with `import dlwatch.hook` in the training script, or run it "
        "as `dlwatch run -- python train.py`. Environment: DLWATCH_DIR (runtime "
        "directory), DLWATCH_DISABLE=1 (the hook does nothing), DLWATCH_SSH (the ssh "
        "command line of --host).",
    )
    p.add_argument("--version", action="version", version=f"dlwatch {__version__}")
    add_view_arguments(p)
    p.add_argument(
        "--attach",
        type=int,
        action="append",
        metavar="P",
        help="also show PID P, a job started without the hook, sampled from outside with py-spy "
        "(marked 'sampled'; repeat for several; see `dlwatch attach --check P`)",
    )
    add_host_arguments(p)
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    only = commands.module(command) if command else None
    for mod in [only] if only is not None else commands.modules():
        sp = sub.add_parser(
            mod.NAME,
            help=mod.HELP,
            description=getattr(mod, "DESCRIPTION", mod.HELP[:1].upper() + mod.HELP[1:] + "."),
            epilog=getattr(mod, "EPILOG", None),
        )
        mod.add_arguments(sp)
        sp.set_defaults(handler=mod.run, command_parser=sp)
    return p


def add_view_arguments(p: argparse.ArgumentParser) -> None:
    """``--interval`` and ``--window`` of the live view (``demo`` and others
    that open it inherit them from the top level)."""
    p.add_argument(
        "--interval",
        type=number,
        default=0.5,
        metavar="S",
        help="seconds between the live view's updates: the collector builds a model "
        "and the screen draws it at once (default 0.5)",
    )
    p.add_argument(
        "--window",
        type=number,
        default=1.0,
        metavar="S",
        help="seconds the live figures cover (default 1, so a change in the job "
        "shows within a second; hints are judged over 3 s)",
    )


def _check_leading_options(parser: argparse.ArgumentParser, argv: list[str], first: str | None) -> None:
    """An unknown option before the command (``dlwatch --intervl 1``): its
    value was taken for the command ("invalid choice: '1'"); name the option
    instead, with the one it most likely meant."""
    known = parser._option_string_actions  # argparse's own table of the options it takes
    for tok in argv[: argv.index(first)] if first is not None else argv:
        name = tok.split("=", 1)[0]
        if not name.startswith("-") or name in ("-", "--") or name in known:
            continue
        close = difflib.get_close_matches(name, [o for o in known if o.startswith("--")], n=1, cutoff=0.75)
        parser.error(f"unrecognized arguments: {name}" + (f" (did you mean {close[0]}?)" if close else ""))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The first word that is not an option names the command: only its parser is built.
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first)
    _check_leading_options(parser, argv, first)
    args, extras = parser.parse_known_args(argv)
    if extras:
        # argparse leaves a command's unknown options to the top level, whose
        # usage does not name the command: its own parser reports them.
        where = getattr(args, "command_parser", None) or parser
        where.error(f"unrecognized arguments: {' '.join(extras)}")
    try:
        handler = getattr(args, "handler", None)
        if handler is not None:
            return handler(args)
        return cmd_live(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return EXIT_OK


def cmd_live(args) -> int:
    attach = list(dict.fromkeys(args.attach or []))
    for pid in attach:
        from dlwatch.collect.attach import preflight

        refused = preflight(pid)
        if refused is not None:
            return fail(refused[1], refused[0])
    problem = dir_problem()
    if problem and not attach and not hosts_of(args):
        return fail(problem)
    if attach:
        # Open on the first attached job, whatever else runs (a QA run: the
        # view opened on another, stalled, job each time).
        args.follow_pid = attach[0]
    return open_live_view(args)
