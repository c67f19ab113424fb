"""``dlwatch`` command line: the TUI, ls, snapshot, run, demo.

Exit codes: 0 ok, 1 error, 2 usage. Errors are one readable line on stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from dlwatch import __version__, rundir

EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse exits 2 on usage errors: keep that
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="dlwatch",
        description="Live monitor of PyTorch DataLoader input pipelines. Without a command, "
                    "opens the live view of every job of this user on this machine.",
        epilog="Instrument a job with `import dlwatch.hook` in the training script, or run it "
               "as `dlwatch run -- python train.py`. Environment: DLWATCH_DIR (runtime "
               "directory), DLWATCH_DISABLE=1 (the hook does nothing).",
    )
    p.add_argument("--version", action="version", version=f"dlwatch {__version__}")
    p.add_argument("--interval", type=float, default=0.5, metavar="S",
                   help="seconds between the live view's updates: the collector builds a model "
                        "and the screen draws it at once (default 0.5)")
    p.add_argument("--window", type=float, default=1.0, metavar="S",
                   help="seconds the live figures cover (default 1, so a change in the job "
                        "shows within a second; hints are judged over 3 s)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    ls = sub.add_parser("ls", help="list instrumented jobs")
    ls.add_argument("--json", action="store_true", help="print JSON")

    snap = sub.add_parser("snapshot", help="one measurement of every job, then exit")
    snap.add_argument("--json", action="store_true", help="print the JSON schema of the README")
    snap.add_argument("--pid", type=int, help="only the job with this trainer PID")
    snap.add_argument("--window", type=float, default=3.0, metavar="S",
                      help="seconds the rates cover (default 3)")

    run = sub.add_parser("run", help="run a command with the hook active in every Python process")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="CMD [ARGS...]")

    demo = sub.add_parser("demo", help="start the bundled demo training job and watch it")
    demo.add_argument("scenario", nargs="?", default="data-bound",
                      help="which pathology to show (default data-bound); `dlwatch demo --list`")
    demo.add_argument("--list", action="store_true", help="list the scenarios")
    demo.add_argument("--no-tui", action="store_true",
                      help="start the demo job only (in the foreground)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "ls":
            return cmd_ls(args)
        if args.command == "snapshot":
            return cmd_snapshot(args)
        if args.command == "run":
            return cmd_run(args)
        if args.command == "demo":
            from dlwatch.cli.demo import cmd_demo

            return cmd_demo(args)
        return cmd_tui(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


def _dir_problem() -> str | None:
    d = rundir.runtime_dir()
    try:
        rundir.check_dir(d)
    except rundir.RuntimeDirError as e:
        if "does not exist" in str(e):
            return None
        return str(e)
    return None


def _no_jobs_message() -> str:
    return (f"no dlwatch jobs found in {rundir.runtime_dir()}\n"
            "Start one with `import dlwatch.hook` in the training script, or "
            "`dlwatch run -- python train.py`.")


def cmd_ls(args) -> int:
    from dlwatch.collect.monitor import Monitor, take_snapshot

    problem = _dir_problem()
    if problem:
        print(f"dlwatch: {problem}", file=sys.stderr)
        return EXIT_ERROR
    m = Monitor(gpu=False, procs=False, host=False, diagnoser=False)
    snap = take_snapshot(settle_s=0.2, monitor=m)
    m.stop()
    jobs = [{"pid": j["pid"], "rank": j["rank"], "local_rank": j["local_rank"],
             "world_size": j["world_size"], "run_id": j["run_id"], "cmdline": j["cmdline"],
             "loaders": len(j["loaders"]), "age_s": j["age_s"], "state": j["state"]}
            for j in snap["jobs"]]
    if args.json:
        print(json.dumps({"schema_version": 1, "runtime_dir": rundir.runtime_dir(),
                          "jobs": jobs}, indent=2))
        return EXIT_OK
    if not jobs:
        print(_no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_ls

    print(render_ls(jobs))
    return EXIT_OK


def cmd_snapshot(args) -> int:
    from dlwatch.collect.monitor import take_snapshot

    problem = _dir_problem()
    if problem:
        print(f"dlwatch: {problem}", file=sys.stderr)
        return EXIT_ERROR
    if args.window <= 0:
        print("dlwatch snapshot: --window must be positive", file=sys.stderr)
        return EXIT_USAGE
    snap = take_snapshot(window_s=args.window, only_pid=args.pid)
    if args.pid is not None and not snap["jobs"]:
        print(f"dlwatch: no dlwatch job with PID {args.pid} in {rundir.runtime_dir()}",
              file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps(snap, indent=2, default=str))
        return EXIT_OK
    if not snap["jobs"]:
        print(_no_jobs_message())
        return EXIT_OK
    from dlwatch.cli.text import render_snapshot

    print(render_snapshot(snap))
    return EXIT_OK


def bootstrap_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment under which every Python process imports dlwatch.hook."""
    import dlwatch

    env = dict(os.environ if env is None else env)
    boot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bootstrap")
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = boot + (os.pathsep + old if old else "")
    env["DLWATCH_PKG_DIR"] = os.path.dirname(os.path.abspath(dlwatch.__file__))
    return env


def cmd_run(args) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        print("dlwatch run: give the command to run, e.g. `dlwatch run -- python train.py`",
              file=sys.stderr)
        return EXIT_USAGE
    env = bootstrap_env()
    try:
        os.execvpe(cmd[0], cmd, env)
    except FileNotFoundError:
        print(f"dlwatch run: command not found: {cmd[0]}", file=sys.stderr)
        return 127
    except PermissionError:
        print(f"dlwatch run: permission denied: {cmd[0]}", file=sys.stderr)
        return 126
    return EXIT_ERROR  # not reached: exec replaced us


def cmd_tui(args) -> int:
    problem = _dir_problem()
    if problem:
        print(f"dlwatch: {problem}", file=sys.stderr)
        return EXIT_ERROR
    if args.interval <= 0:
        print("dlwatch: --interval must be positive", file=sys.stderr)
        return EXIT_USAGE
    from dlwatch.collect.monitor import Monitor
    from dlwatch.tui.app import run_tui

    # The collector builds a snapshot every interval and the view draws each
    # one as it comes: one period from the job to the screen, not two.
    return run_tui(Monitor(window_s=args.window, interval=args.interval), interval=args.interval)
