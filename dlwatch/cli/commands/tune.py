"""``dlwatch tune [options] -- CMD [ARGS...]``: run the command several times
with other DataLoader settings, measure each, recommend the fastest."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import textwrap
from typing import Any

from dlwatch.cli.common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_USAGE,
    bootstrap_env,
    fail,
)

NAME = "tune"
HELP = "run a command with several DataLoader settings, measure each, recommend the fastest"
DESCRIPTION = (
    "Run CMD several times, each time with the DataLoader settings (num_workers, prefetch_factor, "
    "persistent_workers, pin_memory) overridden by dlwatch's hook (no change to the script), measure "
    "each trial's steady-state throughput, data wait, CPU and worker memory, and recommend the "
    "setting with the fewest workers among the fastest. The first trial is the script's own "
    "settings; the next ones follow its diagnosis (CPU- or I/O-bound, Little's-law worker count). "
    "When the loop waits for data, one more trial measures the ceiling: the script's own settings "
    "with the loader replaying about 20 batches it already made, i.e. the loop's pace when data is "
    "free; the search stops once a setting is within noise of it. "
    "Only the loader the training loop waits on is changed unless --loader all. Each trial runs "
    "until --trial-seconds of steady state at a settled pace (a slower start, such as a first epoch "
    "read from a cold page cache, is left out; at most twice as long, else the trial is marked as not "
    "settled), then the command's whole process group is stopped "
    "(SIGINT, then SIGTERM, then SIGKILL). Ctrl-C stops the running trial and prints what was measured."
)
EPILOG = (
    "examples:\n"
    "  dlwatch tune -- python train.py --epochs 100\n"
    "  dlwatch tune --workers 2,4,8 --trial-seconds 30 -- python train.py\n"
    "  dlwatch tune --json --budget 300 -- torchrun --nproc-per-node 1 train.py\n"
    "  dlwatch tune -- python main.py --name tune{trial}\n"
    "The script must run longer than a trial (warm-up + up to twice --trial-seconds);\n"
    "it is stopped after it. {trial} in the command is replaced by the run's number\n"
    "(1 for the baseline), for a script that refuses to run twice with the same name."
)
ORDER = 35
PROG = "dlwatch tune"


def _workers_list(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of integers, got {text!r}"
        ) from None
    if not vals or any(v < 0 or v > 256 for v in vals):
        raise argparse.ArgumentTypeError(f"expected worker counts within 0..256, got {text!r}")
    return list(dict.fromkeys(vals))


def _positive(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return v


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def _size(text: str) -> int:
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    unit = t[-1:] if t[-1:] in _UNITS and not t[-1:].isdigit() else ""
    try:
        v = float(t[: len(t) - len(unit)]) * _UNITS[unit]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 512M or 2G, got {text!r}") from None
    if not v >= 1:
        raise argparse.ArgumentTypeError(f"must be at least one byte, got {text!r}")
    return int(v)


def _count(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def add_arguments(p) -> None:
    from dlwatch.tune.sweep import CEILING_BATCHES, DEFAULT_MAX_TRIALS, DEFAULT_TRIAL_S

    # Raw, for the epilog's examples; the description is then wrapped here,
    # to the width argparse gives everything else (the terminal's, less 2).
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.description = textwrap.fill(DESCRIPTION, max(40, shutil.get_terminal_size().columns - 2))
    p.add_argument(
        "--trial-seconds",
        type=_positive,
        default=DEFAULT_TRIAL_S,
        metavar="S",
        help=f"steady-state seconds measured per trial, after warm-up (default {DEFAULT_TRIAL_S:g}); "
        "a trial whose figures are stable ends after half of it, one whose pace still rises runs on "
        "(at most twice as long) and the baseline waits there for its first epoch to end",
    )
    p.add_argument(
        "--max-trials",
        type=_count,
        default=DEFAULT_MAX_TRIALS,
        metavar="N",
        help=f"at most N trials, the baseline included (default {DEFAULT_MAX_TRIALS})",
    )
    p.add_argument(
        "--budget",
        type=_positive,
        default=None,
        metavar="SECONDS",
        help="start no trial that would end past this many seconds from the start",
    )
    p.add_argument(
        "--workers",
        type=_workers_list,
        default=None,
        metavar="LIST",
        help="try exactly these num_workers values (e.g. 0,2,4,8) instead of the guided search",
    )
    p.add_argument(
        "--loader",
        choices=("busiest", "all"),
        default="busiest",
        help="which DataLoaders a trial changes: the one the loop waits on most (default), or every one",
    )
    p.add_argument(
        "--ceiling-bytes",
        type=_size,
        default=None,
        metavar="SIZE",
        help=f"memory the ceiling trial may hold in replayed batches (default 1G; it keeps up to "
        f"{CEILING_BATCHES} batches, fewer when they do not fit, and says so)",
    )
    p.add_argument(
        "--no-ceiling",
        action="store_true",
        help="skip the ceiling trial (the loop's pace with data for free)",
    )
    p.add_argument(
        "--json", action="store_true", help="print the result document as JSON (docs/reference/tune-json.md)"
    )
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")


def run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        return fail("give the command to tune, e.g. `dlwatch tune -- python train.py`", EXIT_USAGE, PROG)
    if shutil.which(cmd[0]) is None:
        return fail(f"command not found: {cmd[0]}", EXIT_NOT_FOUND, PROG)
    from dlwatch.tune import report
    from dlwatch.tune.sweep import Sweep, TuneOptions

    opts = TuneOptions(
        trial_s=args.trial_seconds,
        max_trials=args.max_trials,
        budget_s=args.budget,
        workers=args.workers,
        all_loaders=args.loader == "all",
        ceiling=not args.no_ceiling,
    )
    if args.ceiling_bytes is not None:
        opts.ceiling_bytes = args.ceiling_bytes
    tty = sys.stderr.isatty()
    state: dict[str, Any] = {"index": 0, "config": {}, "drawn": False}
    last = {"t": -1.0}

    def on_trial_start(index: int, config: dict, why: str) -> None:
        state.update(index=index, config=config)
        last["t"] = -1.0  # each trial's clock starts at 0
        _end_line(state)
        name = "ceiling trial" if index < 0 else f"trial {index + 1}"
        print(f"{name}: {report.config_text(config)} ({why})", file=sys.stderr, flush=True)

    def on_progress(meter, trial_elapsed: float) -> None:
        # A line every 2 s on a pipe or log; one line redrawn in place on a terminal.
        if not tty and trial_elapsed - last["t"] < 2.0:
            return
        last["t"] = trial_elapsed
        line = "  " + report.progress_line(
            state["index"], opts.max_trials, state["config"], meter, trial_elapsed, sweep
        )
        if tty:
            width = shutil.get_terminal_size().columns
            print("\r" + line[: width - 1].ljust(width - 1), end="", file=sys.stderr, flush=True)
            state["drawn"] = True
        else:
            print(line, file=sys.stderr, flush=True)

    sweep = Sweep(cmd, bootstrap_env(), opts, on_trial_start=on_trial_start, on_progress=on_progress)
    doc = sweep.run()
    _end_line(state)
    report.annotate(doc)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        print(report.summary(doc))
    if sweep.interrupted:
        return EXIT_INTERRUPTED
    base = doc.get("baseline") or {}
    # --max-trials 1 or a --budget that fits the baseline alone: the user's
    # own limit (measuring the baseline alone is a use), not a failure.
    only_baseline = not [t for t in doc.get("trials") or [] if t.get("index") != 0]
    limited = only_baseline and str(doc.get("stopped_because") or "").startswith(("--max-trials", "--budget"))
    if base.get("status") != "ok" or (doc.get("no_recommendation") and not limited):
        return EXIT_ERROR  # no answer, as when the baseline fails: a script must not read "keep"
    return EXIT_OK


def _end_line(state: dict) -> None:
    """Finish a progress line redrawn in place, if one is on screen."""
    if state["drawn"]:
        print(file=sys.stderr, flush=True)
        state["drawn"] = False
