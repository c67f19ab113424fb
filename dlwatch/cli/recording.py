"""What the recording subcommands share (``record``, ``run --record``,
``replay``, ``report``, ``compare``): options, the recorder's set-up, loading
a recording with its warnings, writing the HTML. Stdlib imports only at the
top, so ``dlwatch run`` stays fast."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Protocol, TypeVar

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, fail, number
from dlwatch.snapshot import count_of

# Each line's figures cover its own interval: below half a second a window
# holds too few of the job's frames (10/s) to be a rate; above a minute, more
# than the collector keeps of a job's stream.
MIN_INTERVAL_S, MAX_INTERVAL_S = 0.5, 60.0


class _Read(Protocol):
    warnings: list[str]


T = TypeVar("T", bound=_Read)


def add_record_arguments(p, output_flags: tuple[str, ...]) -> None:
    """The options ``record`` shares with ``run --record``."""
    if output_flags:
        p.add_argument(
            *output_flags,
            dest="output",
            metavar="FILE",
            help="where to write (default dlwatch-DATE-TIME.jsonl.gz in the current directory)",
        )
    p.add_argument(
        "--interval",
        dest="record_interval",
        type=number,
        default=1.0,
        metavar="S",
        help="seconds between recorded snapshots; each covers the S seconds before it (default 1)",
    )
    p.add_argument("--force", action="store_true", help="overwrite FILE if it exists")


def check_interval(value: float, prog: str) -> int | None:
    if not MIN_INTERVAL_S <= value <= MAX_INTERVAL_S:
        return fail(
            f"--interval must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds", EXIT_USAGE, prog
        )
    return None


def make_recorder(path: str, interval: float, force: bool, prog: str, **kwargs):
    """A Recorder on a fresh live Monitor, or an exit code and its message."""
    from dlwatch.collect.monitor import Monitor
    from dlwatch.record.recorder import Recorder

    monitor = Monitor(window_s=interval, interval=interval, only_pid=kwargs.pop("only_pid", None))
    try:
        return Recorder(path, monitor, interval=interval, window_s=interval, overwrite=force, **kwargs)
    except FileExistsError:
        monitor.stop()
        return fail(f"{path} exists: choose another name or give --force to overwrite it", EXIT_ERROR, prog)
    except OSError as e:
        monitor.stop()
        return fail(f"cannot write {path}: {e.strerror or e}", EXIT_ERROR, prog)


def stop_on_signals(recorder) -> None:
    """SIGINT and SIGTERM end the recording cleanly (the loop sees the stop,
    writes nothing torn and closes the file) instead of raising mid-write."""

    def handler(signum, _frame):
        recorder.stop(f"{signal.Signals(signum).name} received")

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def summary(path: str, stats, prog: str = "dlwatch record") -> str:
    try:
        size = os.path.getsize(path)
    except OSError:
        size = stats.bytes
    jobs = len(stats.jobs)
    # A command that failed before its job published records nothing worth a
    # report: said here, where the user looks (a QA run: "1 snapshots of 0 jobs").
    none = " (no dlwatch job was seen: it holds no figures)" if not jobs else ""
    return (
        f"{prog}: {count_of(stats.lines, 'snapshot')} of {count_of(jobs, 'job')} over "
        f"{stats.elapsed_s:.0f} s in {path} ({size / 1024:.1f} KiB){none}; {stats.reason}"
    )


def open_recording(path: str, prog: str, read: Callable[[str], T], count: Callable[[T], int]) -> T | int:
    """``read(path)``, its warnings on stderr; or an exit code after a
    one-line error, when it cannot be read or ``count`` of it is 0."""
    try:
        rec = read(path)
    except FileNotFoundError:
        return fail(f"{path}: no such file", EXIT_ERROR, prog)
    except IsADirectoryError:
        return fail(f"{path} is a directory, not a recording", EXIT_ERROR, prog)
    except OSError as e:
        return fail(f"cannot read {path}: {e.strerror or e}", EXIT_ERROR, prog)
    for w in rec.warnings:
        print(f"{prog}: {path}: {w}", file=sys.stderr)
    if not count(rec):
        return fail(f"{path} holds no snapshots", EXIT_ERROR, prog)
    return rec


def load(path: str, prog: str):
    """The recording's series, or an exit code after a one-line error."""
    from dlwatch.record import reader, series

    rec = open_recording(path, prog, reader.read, lambda r: len(r.snapshots))
    if isinstance(rec, int):
        return rec
    if not any(s.get("jobs") for s in rec.snapshots):
        return fail(
            f"{path} holds {count_of(len(rec.snapshots), 'snapshot')} but no job's figures", EXIT_ERROR, prog
        )
    return series.build(rec)


def add_recording_argument(p) -> None:
    p.add_argument("recording", help="a file written by `dlwatch record` (.jsonl or .jsonl.gz)")


def stem(path: str) -> str:
    name = os.path.basename(path)
    for suffix in (".gz", ".jsonl", ".json"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name or "recording"


def write_html(path: str, html: str, prog: str) -> int:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(html)
    except OSError as e:
        return fail(f"cannot write {path}: {e.strerror or e}", EXIT_ERROR, prog)
    print(f"{prog}: wrote {path} ({len(html.encode()) / 1024:.0f} KiB)", file=sys.stderr)
    return EXIT_OK
