"""``dlwatch replay FILE``: the live view, driven by a recording."""

from __future__ import annotations

import sys

from dlwatch.cli.common import EXIT_ERROR, EXIT_USAGE, fail

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
    p.add_argument("recording", help="a file written by `dlwatch record` (.jsonl or .jsonl.gz)")
    p.add_argument(
        "--speed", type=float, default=1.0, metavar="X", help="play X times as fast as recorded (default 1)"
    )
    p.add_argument("--loop", action="store_true", help="start over at the end")


def run(args) -> int:
    prog = "dlwatch replay"
    if not 1 / 16 <= args.speed <= 64:
        return fail("--speed must be between 1/16 and 64", EXIT_USAGE, prog)
    from dlwatch.tui.sources import ReplaySource

    try:
        source = ReplaySource.from_file(args.recording, speed=args.speed, loop=args.loop)
    except FileNotFoundError:
        return fail(f"{args.recording}: no such file", EXIT_ERROR, prog)
    except IsADirectoryError:
        return fail(f"{args.recording} is a directory, not a recording", EXIT_ERROR, prog)
    except OSError as e:
        return fail(f"cannot read {args.recording}: {e.strerror or e}", EXIT_ERROR, prog)
    for w in source.warnings:
        print(f"{prog}: {args.recording}: {w}", file=sys.stderr)
    if not len(source):
        return fail(f"{args.recording} holds no snapshots", EXIT_ERROR, prog)
    from dlwatch.tui.app import run_tui

    return run_tui(source, interval=0.5)
