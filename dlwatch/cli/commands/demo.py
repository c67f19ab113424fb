"""``dlwatch demo [SCENARIO]``: the bundled demo job in the background, the TUI on it.

The job runs under the same bootstrap as ``dlwatch run`` (no code change in
the demo) in its own session, so quitting the TUI stops it and its workers.
A monitor that dies without quitting (its terminal closed: SIGHUP; killed)
takes the demo with it: the job is started with the kernel's parent-death
signal, and its workers follow their parent as torch's always do. Without
that, closing the SSH window left the demo spinning on the cores. Nor does it
leave a file: the job's output goes to a file without a name, saved under
one only when the job failed.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from typing import IO

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_USAGE, bootstrap_env, fail, open_live_view
from dlwatch.collect import process_group

NAME = "demo"
HELP = "start the bundled demo training job and watch it"
ORDER = 40


def add_arguments(p) -> None:
    p.add_argument(
        "scenario",
        nargs="?",
        default="data-bound",
        help="which pathology to show (default data-bound); `dlwatch demo --list`",
    )
    p.add_argument("--list", action="store_true", help="list the scenarios")
    p.add_argument("--no-tui", action="store_true", help="start the demo job only (in the foreground)")


def scenario_table(scenarios) -> str:
    width = max(len(n) for n in scenarios)
    return "\n".join(f"{n.ljust(width)}  {s.description}" for n, s in scenarios.items())


def demo_command(name: str) -> list[str]:
    return [sys.executable, "-m", "dlwatch.demo.train", "--scenario", name, "--quiet"]


def _die_with_parent(parent: int):
    """A ``preexec_fn``: SIGTERM this child when ``parent`` exits (Linux's
    PR_SET_PDEATHSIG; kept across exec). None where prctl is missing. libc is
    looked up here, in the parent: after fork the child only calls it (no
    import or loading between fork and exec)."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def arm() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # it died before the signal was armed
            os._exit(1)

    return arm


def start_demo(name: str, log: IO[bytes]) -> subprocess.Popen:
    """The demo job, its output into ``log`` (an open file)."""
    return subprocess.Popen(
        demo_command(name),
        env=bootstrap_env(),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_die_with_parent(os.getpid()),
    )


# How a demo that was stopped ends (not one that failed).
STOPPED = (0, None, -signal.SIGINT, -signal.SIGTERM, -signal.SIGKILL, 130)


def keep_log(proc: subprocess.Popen, log: IO[bytes]) -> str:
    """Save a failed job's output under a name and return it; "" when the
    job did not fail. The output goes to a file without a name until then, so
    a monitor killed before it could clean up (its terminal closed) leaves
    nothing behind: a named log was left in /tmp every such time."""
    if proc.returncode in STOPPED:
        return ""
    try:
        fd, path = tempfile.mkstemp(prefix=f"dlwatch-demo-{os.getpid()}-", suffix=".log")
        with os.fdopen(fd, "wb") as out:
            log.flush()
            log.seek(0)
            shutil.copyfileobj(log, out)
    except OSError as e:
        return f"(not saved: {e})"
    return path


def stop_demo(proc: subprocess.Popen, grace_s: float = 5.0, term_s: float = 2.0) -> None:
    """SIGINT the demo's process group (workers included), then SIGTERM;
    whatever is left of the group is killed, its resource tracker last (it
    unlinks the semaphores of a spawn loader's queues)."""
    if proc.poll() is not None:
        return
    for sig, wait in ((signal.SIGINT, grace_s), (signal.SIGTERM, term_s)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    # Workers left behind, or a job that ignored both signals.
    process_group.kill(proc.pid)
    try:
        proc.wait(timeout=2.0)
    except subprocess.TimeoutExpired:
        pass


def run(args) -> int:
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return fail(
            "the demo trains with PyTorch, which is not installed here: pip install torch",
            EXIT_ERROR,
            "dlwatch demo",
        )
    from dlwatch.demo.scenarios.catalog import SCENARIOS

    if args.list:
        print(scenario_table(SCENARIOS))
        return EXIT_OK
    if args.scenario not in SCENARIOS:
        print(
            f"dlwatch demo: unknown scenario {args.scenario!r}; choose one of:\n" + scenario_table(SCENARIOS),
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.no_tui:
        os.execvpe(sys.executable, demo_command(args.scenario), bootstrap_env())
    with tempfile.TemporaryFile(prefix="dlwatch-demo-") as log:  # no name (O_TMPFILE)
        proc = start_demo(args.scenario, log)
        # The view is for this demo: it selects the demo's job as soon as it is
        # listed, not whichever other job of this user's happens to run too.
        args.follow_pid = proc.pid
        try:
            rc = open_live_view(args)
        finally:
            stop_demo(proc)
        saved = keep_log(proc, log)
    if saved:
        print(
            f"dlwatch demo: the demo job exited with status {proc.returncode}; its log: {saved}",
            file=sys.stderr,
        )
    return rc
