"""Replay a recorded JSON-lines stream of snapshots in the TUI:

    python -m dlwatch.tui RECORDING.jsonl [--period 1.0] [--interval 0.5] [--loop]

For looking at the TUI without a live job (bug reports, demos, development).
"""

from __future__ import annotations

import argparse
import sys

from dlwatch.tui.app import run_tui
from dlwatch.tui.sources import ReplaySource


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dlwatch.tui", description=__doc__.splitlines()[0])
    parser.add_argument("recording", help="JSON-lines file, one snapshot per line")
    parser.add_argument("--period", type=float, default=1.0, help="seconds between recorded snapshots")
    parser.add_argument("--interval", type=float, default=0.5, help="display refresh interval")
    parser.add_argument("--loop", action="store_true", help="start over at the end")
    args = parser.parse_args(argv)
    try:
        source = ReplaySource(args.recording, period=args.period, loop=args.loop)
    except OSError as e:
        print(f"dlwatch: cannot read {args.recording}: {e.strerror or e}", file=sys.stderr)
        return 1
    if not len(source):
        print(f"dlwatch: {args.recording} holds no snapshots", file=sys.stderr)
        return 1
    return run_tui(source, interval=args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
