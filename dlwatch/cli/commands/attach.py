"""``dlwatch attach``: measure a job started without the hook, from outside."""

from __future__ import annotations

import argparse
import json

from dlwatch.cli.common import EXIT_OK, EXIT_USAGE, fail, number

NAME = "attach"
HELP = "measure a PyTorch job started without the hook, by sampling it from outside (py-spy)"
DESCRIPTION = (
    "Sample a running PyTorch job that was started without the hook: its training thread's "
    "data wait and its DataLoader workers' busy shares, from py-spy stack samples (~100 a second, "
    "never pausing the job), with CPU, run-queue wait and memory from /proc. Figures that only the "
    "hook can measure say 'n/a (attached: sampled)'."
)
EPILOG = (
    "Exit codes: 0 ok, 1 error, 2 usage, 3 no such process, 4 not permitted to read the process "
    "(see --check), 5 not a Python/PyTorch process, 6 py-spy not installed "
    "(pip install 'dlwatch[attach]')."
)
ORDER = 25
PROG = "dlwatch attach"
MAX_SECONDS = 600.0


def add_arguments(p) -> None:
    # `dlwatch attach 1234` is a natural guess: caught here to say --pid,
    # rather than argparse's "unrecognized arguments" under the top-level usage.
    p.add_argument("bare", nargs="*", help=argparse.SUPPRESS)
    p.add_argument(
        "--pid",
        type=int,
        action="append",
        metavar="P",
        help="the job's trainer PID; repeat for several (the ranks of a torchrun run)",
    )
    p.add_argument("--seconds", type=number, default=3.0, metavar="S", help="how long to sample (default 3)")
    p.add_argument("--json", action="store_true", help="print the snapshot as JSON")
    check = "only say whether PID P can be sampled: which permission allows it, or what to do"
    p.add_argument("--check", type=int, metavar="P", help=check)


def run(args) -> int:
    if args.bare:
        given = args.bare[0]
        return fail(f"give the PID with --pid: `dlwatch attach --pid {given}`", EXIT_USAGE, PROG)
    if args.check is not None:
        return check(args.check)
    if not args.pid:
        return fail("give the job's PID: `dlwatch attach --pid P`", EXIT_USAGE, PROG)
    if not 1 <= args.seconds <= MAX_SECONDS:
        return fail(f"--seconds must be between 1 and {MAX_SECONDS:.0f}", EXIT_USAGE, PROG)
    from dlwatch.collect import attach

    pids = list(dict.fromkeys(args.pid))
    for pid in pids:
        problem = attach.preflight(pid)
        if problem is not None:
            return fail(problem[1], problem[0], PROG)
    snap, errors = attach.measure(pids, args.seconds)
    for code, line in errors:
        fail(line, code, PROG)
    if not snap["jobs"]:
        return errors[0][0] if errors else 1
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
    else:
        from dlwatch.cli.text import render_snapshot

        print(render_snapshot(snap, title="dlwatch attach"))
    return errors[0][0] if errors else EXIT_OK


def check(pid: int) -> int:
    """``--check``: which permission lets us read ``pid``, or what to do;
    and whether it is a PyTorch job (what ``--pid`` would refuse)."""
    from dlwatch.collect import attach, ptrace, spy

    access = ptrace.check(pid)
    if not access.allowed:
        return fail(f"cannot attach to PID {pid}: {access.line()}", access.code, PROG)
    scope = ptrace.read_scope()
    refused = attach.preflight(pid)
    if refused is not None:
        return fail(refused[1], refused[0], PROG)
    print(f"PID {pid} can be sampled: {access.condition}")
    print(f"  kernel.yama.ptrace_scope: {'not present (no Yama)' if scope is None else scope}")
    print(f"  sampler: {spy.find()}")
    return EXIT_OK
