"""``dlwatch run [--] CMD [ARGS...]``: a command with the hook in every Python process."""

from __future__ import annotations

import argparse
import os

from dlwatch.cli.common import (
    EXIT_ERROR,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    EXIT_USAGE,
    bootstrap_env,
    fail,
)

NAME = "run"
HELP = "run a command with the hook active in every Python process it starts"
DESCRIPTION = (
    "Run CMD with dlwatch's hook active in every Python process it starts (torchrun ranks "
    "and DataLoader workers included), with no change to the training script: the hook is "
    "imported through a sitecustomize on PYTHONPATH. Then watch the job with `dlwatch` in "
    "another terminal. The command replaces this process (same PID, signals and exit code)."
)
EPILOG = "example: dlwatch run -- torchrun --nproc-per-node 2 train.py --epochs 3"
ORDER = 30


def add_arguments(p) -> None:
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")


def run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return fail(
            "give the command to run, e.g. `dlwatch run -- python train.py`", EXIT_USAGE, "dlwatch run"
        )
    try:
        os.execvpe(cmd[0], cmd, bootstrap_env())
    except FileNotFoundError:
        return fail(f"command not found: {cmd[0]}", EXIT_NOT_FOUND, "dlwatch run")
    except PermissionError:
        return fail(f"permission denied: {cmd[0]}", EXIT_NOT_EXECUTABLE, "dlwatch run")
    return EXIT_ERROR  # not reached: exec replaced us
