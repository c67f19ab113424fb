"""``dlwatch snapshot``: one measurement of every job, as text or JSON, then
exit; or with ``--follow``, a JSON Lines stream of them."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import Any, cast

from dlwatch import rundir
from dlwatch.cli.common import (
    EXIT_ERROR,
    EXIT_OK,
    EXIT_USAGE,
    add_host_arguments,
    dir_problem,
    fail,
    hosts_of,
    no_jobs_message,
    number,
)
from dlwatch.cli.recording import MAX_INTERVAL_S, MIN_INTERVAL_S

NAME = "snapshot"
HELP = "one measurement of every job, then exit (--follow: a JSON Lines stream)"
ORDER = 20
PROG = "dlwatch snapshot"
DEFAULT_WINDOW_S = 3.0
# A consumer that misses a notification still gets its line this late.
WAKE_SLACK = 2.0
# --judge: a warm-up longer than this is the live view's to watch.
MAX_JUDGE_S = 120.0


def add_arguments(p) -> None:
    p.add_argument(
        "--json", action="store_true", help="print it as JSON (schema: docs/reference/snapshot-json.md)"
    )
    p.add_argument("--pid", type=int, help="only the job with this trainer PID")
    p.add_argument(
        "--window",
        type=number,
        metavar="S",
        help=f"seconds the rates cover (default {DEFAULT_WINDOW_S:g}; with --follow, the interval)",
    )
    p.add_argument(
        "--follow",
        action="store_true",
        help="print one snapshot per line as JSON (JSON Lines, as a recording's lines) every "
        "--interval seconds, until Ctrl-C, SIGTERM, --count, or the reader closes the pipe",
    )
    p.add_argument(
        "--interval",
        type=number,
        default=None,  # 1 s with --follow; given without it, a usage error
        metavar="S",
        help=f"with --follow: seconds between snapshots (default 1, {MIN_INTERVAL_S:g}-{MAX_INTERVAL_S:g})",
    )
    p.add_argument("--count", type=int, metavar="N", help="with --follow: stop after N snapshots")
    p.add_argument(
        "--judge",
        type=number,
        metavar="S",
        help="seconds at most to watch so that the hints are judged as the live view judges them "
        "(a condition shows once it held 3 s; default 7, collect.monitor.JUDGE_S; 0: one measurement, "
        "whose hints are not judged yet)",
        default=None,
    )
    add_host_arguments(p, sub=True)
    p.add_argument(
        "--uss",
        action="store_true",
        help="also read each worker's USS (/proc/PID/smaps_rollup: ~10 ms of CPU per GiB of the "
        "worker's RSS, under its memory-map lock); without it a one-shot snapshot leaves USS out",
    )


def run(args) -> int:
    from dlwatch.collect.monitor import take_snapshot

    problem = _usage_problem(args)
    if problem:
        return fail(problem, EXIT_USAGE, PROG)
    if hosts_of(args):
        if args.pid is not None:
            return fail("--pid names a process of one machine: not with --host", EXIT_USAGE, PROG)
        return over_hosts(args)
    problem = dir_problem()
    if problem:
        if args.json or args.follow:
            # A script reading the JSON gets the document, with the reason in
            # the schema's own field, rather than an empty stdout.
            print(json.dumps(empty_snapshot(problem), indent=None if args.follow else 2))
        return fail(problem, EXIT_ERROR)
    if args.follow:
        return follow(args)
    snap = take_snapshot(
        window_s=args.window or DEFAULT_WINDOW_S, only_pid=args.pid, uss=args.uss, judge_s=_judge_s(args)
    )
    if args.pid is not None and not snap["jobs"]:
        from dlwatch.collect import whose
        from dlwatch.collect.jobs import discover

        directory = rundir.runtime_dir()
        _, why = whose.explain(args.pid, {p for p, _ in discover(directory)}, directory)
        return fail(why)
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return EXIT_OK
    if not snap["jobs"]:
        print(no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_snapshot

    print(render_snapshot(cast(dict[str, Any], snap)))
    return EXIT_OK


def _judge_s(args) -> float:
    from dlwatch.collect.monitor import JUDGE_S

    return JUDGE_S if args.judge is None else args.judge


def _usage_problem(args) -> str | None:
    if args.window is not None and args.window <= 0:
        return "--window must be positive"
    if args.judge is not None and not 0 <= args.judge <= MAX_JUDGE_S:
        return f"--judge must be between 0 and {MAX_JUDGE_S:g} seconds"
    if args.judge is not None and args.follow:
        return "--judge is for one snapshot: --follow judges every line as the live view does"
    if not args.follow:
        if args.count is not None:
            return "--count needs --follow"
        if args.interval is not None:
            # One snapshot has no interval: --window is the span it covers.
            return "--interval needs --follow (one snapshot's span is --window)"
        return None
    if args.interval is None:
        args.interval = 1.0
    if not MIN_INTERVAL_S <= args.interval <= MAX_INTERVAL_S:
        return f"--interval must be between {MIN_INTERVAL_S:g} and {MAX_INTERVAL_S:g} seconds"
    if args.count is not None and args.count < 1:
        return "--count must be 1 or more"
    return None


def over_hosts(args) -> int:
    """``--host``: this machine's jobs and every host's, one document
    (docs/multinode.md); a host that cannot be read is a line in ``hosts``
    with its reason, and the exit status is 0 when any of them answered."""
    from dlwatch.collect.monitor import take_snapshot
    from dlwatch.collect.multihost import one_shot

    if args.follow:
        return follow(args)
    window = args.window or DEFAULT_WINDOW_S

    def local() -> dict[str, Any] | None:
        if dir_problem():
            return None
        return cast(dict[str, Any], take_snapshot(window_s=window, judge_s=_judge_s(args)))

    snap = one_shot(local, hosts_of(args), args.remote_dlwatch, window)
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        from dlwatch.cli.text import render_snapshot

        print(render_snapshot(snap))
    # 1 when no host given could be read: a script must not take that for "no jobs".
    return EXIT_OK if any(h.get("state") == "ok" for h in snap["hosts"] if not h.get("local")) else EXIT_ERROR


class _Stopped(Exception):
    """A signal ended the stream in the middle of a write."""


def follow(args) -> int:
    """Each snapshot the live collector builds, as one line of JSON: the
    document of ``snapshot --json`` as a recording stores it (no history
    series, the stream is the history; hints judged as in the live view), so
    the output is also a recording that ``replay`` and ``report`` read."""
    from dlwatch.collect.monitor import Monitor
    from dlwatch.record.fileformat import compact

    monitor: Any = Monitor(window_s=args.window or args.interval, interval=args.interval, only_pid=args.pid)
    if hosts_of(args):
        from dlwatch.collect.multihost import MultiHost

        monitor = MultiHost(
            monitor,
            hosts_of(args),
            args.remote_dlwatch,
            interval=args.interval,
            window=args.window or args.interval,
        )
    built, stop = threading.Event(), threading.Event()
    writing = [False]

    def on_signal(*_):
        stop.set()
        built.set()
        if writing[0]:
            # A reader that stopped reading holds the write on a full pipe,
            # and the interpreter retries a write a handler returns into: the
            # stream would outlive Ctrl-C and SIGTERM for as long as the
            # reader sleeps. Raised here, the write ends.
            raise _Stopped

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    monitor.subscribe(built.set)
    monitor.start()
    written, last = 0, None
    try:
        while not stop.is_set() and (args.count is None or written < args.count):
            built.wait(args.interval * WAKE_SLACK)
            built.clear()
            snap = monitor.latest()
            if snap is None or snap is last or stop.is_set():
                continue
            last = snap
            line = json.dumps(compact(snap), separators=(",", ":"), default=str) + "\n"
            writing[0] = True
            try:
                sys.stdout.write(line)
                sys.stdout.flush()
            finally:
                writing[0] = False
            written += 1
            if args.pid is not None and _ended(snap, args.pid):
                # Following one job: its end is the stream's (a QA run's
                # stream went on writing "exited" documents for as long as
                # it was left running).
                break
    except (BrokenPipeError, _Stopped):
        # The reader is gone (`| head -1`), or a signal ended a write it did
        # not read: the end of the stream, not an error. Point stdout at
        # /dev/null so the interpreter's own flush at exit does not hit the
        # closed pipe again, nor wait on the full one.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    finally:
        monitor.stop()
    return EXIT_OK


def _ended(snap: dict, pid: int) -> bool:
    """The followed job has exited (its last document is written)."""
    return any(j.get("pid") == pid and j.get("state") == "exited" for j in snap.get("jobs") or ())


def empty_snapshot(problem: str) -> dict:
    """The document when no job can be read at all: every figure missing and
    the reason in ``runtime_dir_error``."""
    import time

    from dlwatch.snapshot import SCHEMA_VERSION

    return {
        "schema_version": SCHEMA_VERSION,
        "time": time.time(),
        "window_s": None,
        "host": {"logical_cpus": None, "usable_cores": None, "cpu_percent": None, "shm_free_bytes": None},
        "gpu_status": "n/a: not sampled (no job can be read)",
        "gpus": [],
        "jobs": [],
        "hints": [],
        "runtime_dir": rundir.runtime_dir(),
        "runtime_dir_error": problem,
    }
