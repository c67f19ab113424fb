"""``dlwatch replay FILE``: the live view, driven by a recording."""

from __future__ import annotations

from dlwatch.cli.common import EXIT_USAGE, fail, number
from dlwatch.cli.recording import add_recording_argument, open_recording

NAME = "replay"
HELP = "open the live view on a recording (pause, seek, jump to the next hint)"
DESCRIPTION = (
    "Open the live view on a file written by `dlwatch record`: everything on screen behaves as "
    "live, at the pace it was recorded (--speed), except that no job is reachable. Keys: p "
    "pause/play, ←/→ 10 s back/forward, </> a minute, ,/. one snapshot, n/N next/previous hint, "
    "home/end, +/- speed, ? all keys."
)
EPILOG = "example: dlwatch replay overnight.jsonl.gz --speed 10"
ORDER = 60


def add_arguments(p) -> None:
    add_recording_argument(p)
    p.add_argument(
        "--speed", type=number, default=1.0, metavar="X", help="play X times as fast as recorded (default 1)"
    )
    p.add_argument("--loop", action="store_true", help="start over at the end")


def run(args) -> int:
    prog = "dlwatch replay"
    if not 1 / 16 <= args.speed <= 64:
        return fail("--speed must be between 1/16 and 64", EXIT_USAGE, prog)
    from dlwatch.tui.app import terminal_problem
    from dlwatch.tui.sources import ReplaySource

    source = open_recording(
        args.recording, prog, lambda path: ReplaySource.from_file(path, speed=args.speed, loop=args.loop), len
    )
    if isinstance(source, int):
        return source
    problem = terminal_problem(instead=f"`dlwatch report {args.recording}` writes it as one HTML page")
    if problem is not None:
        return fail(problem, EXIT_USAGE, prog)
    from dlwatch.tui.app import run_tui

    return run_tui(source, interval=0.5)
