"""End to end in a real terminal: ``python -m dlwatch`` inside a detached tmux
session, watching a real instrumented job, read back with ``capture-pane``.

This is the user's path with nothing faked: the CLI entry point, the real
collector, Textual driving a real terminal (tmux's), keys sent as keystrokes.
Each test uses its own tmux server (``tmux -L <unique name> -f /dev/null``) so
tests never see each other's sessions or the user's configuration.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e_util import Job, short_tmpdir, snapshot_json

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

ROOT = str(Path(__file__).resolve().parents[2])
JOB_ARGS = ("--start-method", "fork", "--persistent", "--duration", "150")
WAIT_RE = re.compile(r"DATA WAIT\s+(\d{1,3}) %\s+(✓ OK|▲ WARN|✖ BAD)")
SGR_RE = re.compile(r"\x1b\[([0-9;:]*)m")
LIMIT_S = 30.0  # generous "eventually" on a loaded 2-core machine
# ... for a job to start with its workers: what the test checks comes after.
# Beside the parallel tier `dlwatch demo` with its job and 4 workers took over
# 30 s to list them (fresh-clone run 46: the screen showed them starting).
START_LIMIT_S = 90.0


class Tmux:
    """One private tmux server running one session with one pane."""

    def __init__(self, env: dict[str, str]) -> None:
        self.name = f"dlwtest-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.env = env

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-L", self.name, "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=20,
            check=check,
        )

    def start(self, width: int, height: int, command: list[str], env: dict[str, str]) -> None:
        extra = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
        self("new-session", "-d", "-s", "main", "-x", str(width), "-y", str(height), *extra, *command)

    def capture(self, escapes: bool = False) -> str:
        r = self("capture-pane", "-p", *(["-e"] if escapes else []), "-t", "main", check=False)
        return r.stdout if r.returncode == 0 else ""

    def pane(self, fmt: str) -> str | None:
        r = self("display-message", "-p", "-t", "main", fmt, check=False)
        return r.stdout.strip() if r.returncode == 0 else None

    def size(self) -> tuple[int, int]:
        w, h = self.pane("#{pane_width} #{pane_height}").split()
        return int(w), int(h)

    def kill(self) -> None:
        self("kill-server", check=False)


def real_worker_pids(pid: int) -> set[int]:
    import psutil

    out = set()
    for child in psutil.Process(pid).children():
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" not in cmd and "forkserver" not in cmd:
            out.add(child.pid)
    return out


def loader_of(snap: dict, pid: int) -> dict:
    jobs = [j for j in snap["jobs"] if j["pid"] == pid]
    assert jobs and jobs[0]["loaders"], snap
    return jobs[0]["loaders"][0]


@pytest.fixture(scope="module")
def job():
    j = Job(*JOB_ARGS)
    try:
        j.wait_ready(0.5)
        yield j
    finally:
        j.cleanup()


CASES = [
    pytest.param(100, 30, {}, id="100x30"),
    pytest.param(100, 30, {"NO_COLOR": "1"}, id="100x30-NO_COLOR"),
    pytest.param(80, 24, {}, id="80x24"),
]


@pytest.mark.parametrize("width,height,extra_env", CASES)
def test_dlwatch_in_tmux_shows_workers_and_wait_then_quits_on_q(job, width, height, extra_env, tmp_path):
    pid = job.proc.pid
    workers = real_worker_pids(pid)
    assert len(workers) == 2, workers

    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "NO_COLOR", "TMUX_PANE")}
    pane_env = {"DLWATCH_DIR": job.dir, "PYTHONPATH": ROOT, **extra_env}
    if "NO_COLOR" not in extra_env:
        pane_env["COLORTERM"] = "truecolor"
    tmux = Tmux(env)
    # A shell in the pane runs dlwatch and records its exit status: it reaps
    # dlwatch itself, so the status does not depend on when tmux gets to it.
    status_file = tmp_path / "exit-status"
    pane_env["DLW_STATUS"] = str(status_file)
    tmux.start(
        width,
        height,
        [
            "sh",
            "-c",
            'rc=0; "$@" || rc=$?; echo "$rc" > "$DLW_STATUS"',
            "sh",
            sys.executable,
            "-m",
            "dlwatch",
        ],
        pane_env,
    )
    try:
        assert tmux.size() == (width, height)

        # 1. The screen shows the job's real worker PIDs and a data-wait figure.
        screen = ""
        end = time.monotonic() + LIMIT_S
        while time.monotonic() < end:
            screen = tmux.capture()
            if all(str(p) in screen for p in workers) and str(pid) in screen and WAIT_RE.search(screen):
                break
            if status_file.exists() or tmux.pane("#{pane_pid}") is None:
                pytest.fail(f"dlwatch exited early; its screen:\n{screen}")
            time.sleep(0.25)
        else:
            pytest.fail(f"workers {sorted(workers)} and DATA WAIT NN % never shown:\n{screen}")
        shown = WAIT_RE.search(screen)
        # The level is spelled out next to the figure (it must survive NO_COLOR).
        assert shown.group(2) in _levels_for(int(shown.group(1))), shown.group(0)
        lines = screen.splitlines()
        assert len(lines) <= height and max(len(line) for line in lines) <= width
        assert "Traceback" not in screen and "could not draw" not in screen, screen

        # 2. The figure agrees with a `dlwatch snapshot --json` taken around
        # the same time (both cover the last 3 s; the two readings bracket it).
        before = int(WAIT_RE.search(tmux.capture() or screen).group(1))
        snap = snapshot_json(job.dir, "--window", "3", "--judge", "0")
        after_screen = tmux.capture()
        m = WAIT_RE.search(after_screen)
        assert m, after_screen
        after = int(m.group(1))
        ld = loader_of(snap, pid)
        truth = ld["data_wait_fraction"] * 100
        assert min(abs(before - truth), abs(after - truth)) <= 15, (before, after, truth)
        assert {w["pid"] for w in ld["workers"]} == workers

        # 3. NO_COLOR: Textual renders monochrome (shades of grey, no hue);
        # without it the levels are in colour.
        styled = tmux.capture(escapes=True)
        hues = sorted({c for c in SGR_RE.findall(styled) if _has_hue(c)})
        if "NO_COLOR" in extra_env:
            assert not hues, f"coloured SGR codes under NO_COLOR: {hues[:10]}"
        else:
            assert hues, "no colour at all without NO_COLOR"

        # 4. Every key is reachable at any size: the footer ends with `?`,
        # which lists them all, and names S; a modal says how to close it.
        footer = screen.rstrip("\n").splitlines()[-1]
        assert re.search(r"\? (more )?keys\s*$", footer) and "S stacks" in footer, footer
        tmux("send-keys", "-t", "main", "S")
        end = time.monotonic() + LIMIT_S
        while time.monotonic() < end and "escape, q or S closes" not in (shown_s := tmux.capture()):
            time.sleep(0.2)
        assert "escape, q or S closes" in shown_s, shown_s
        tmux("send-keys", "-t", "main", "Escape")
        end = time.monotonic() + LIMIT_S
        while time.monotonic() < end and "closes" in tmux.capture():
            time.sleep(0.2)

        # 5. q quits: dlwatch ends, with status 0, within 10 s.
        app_pid = _dlwatch_pid(int(tmux.pane("#{pane_pid}")))
        tmux("send-keys", "-t", "main", "q")
        end = time.monotonic() + 10.0
        while time.monotonic() < end and not status_file.exists():
            time.sleep(0.1)
        assert status_file.exists(), f"dlwatch still running 10 s after q: {_describe(app_pid)}"
        time.sleep(0.05)  # the shell's echo may still be writing
        assert status_file.read_text().strip() == "0", f"exit status {status_file.read_text()!r}"
        assert job.proc.poll() is None, "quitting the monitor must not touch the job"
    finally:
        tmux.kill()


def _dlwatch_pid(shell_pid: int) -> int:
    import psutil

    for child in psutil.Process(shell_pid).children():
        if "dlwatch" in " ".join(child.cmdline()):
            return child.pid
    raise AssertionError(f"no dlwatch process under the pane's shell {shell_pid}")


def _describe(pid: int) -> str:
    """What a process that should have exited is doing (for failure messages)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            status = {k: v.strip() for k, v in (line.split(":", 1) for line in f if ":" in line)}
        tasks = os.listdir(f"/proc/{pid}/task")
        wchan = []
        for t in tasks:
            try:
                with open(f"/proc/{pid}/task/{t}/wchan") as f:
                    w = f.read()
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    st = f.read().rsplit(")", 1)[1].split()[0]
                wchan.append(f"{t}:{st}:{w}")
            except OSError:
                pass
        fds = os.listdir(f"/proc/{pid}/fd")
        return (
            f"process {pid} {status.get('State')} threads={status.get('Threads')} "
            f"tasks={wchan} fds={len(fds)}"
        )
    except OSError as e:
        return f"process {pid}: {e}"


def _levels_for(n: int) -> set[str]:
    """Level labels consistent with a figure rounded to ``n`` % (the app
    classifies the unrounded fraction: < 10 % ok, 10-30 % warn, > 30 % bad)."""
    out = set()
    if n <= 10:
        out.add("✓ OK")
    if 9 <= n <= 30:
        out.add("▲ WARN")
    if n >= 30:
        out.add("✖ BAD")
    return out


_BASIC_GREY = {30, 37, 90, 97, 40, 47, 100, 107}


def _grey_256(i: int) -> bool:
    if i in (0, 7, 8, 15, 16, 231) or 232 <= i <= 255:
        return True
    if 16 <= i <= 231:
        i -= 16
        return i // 36 == (i // 6) % 6 == i % 6
    return False


def _has_hue(params: str) -> bool:
    """Whether an SGR parameter string sets a colour that is not a grey."""
    parts = [int(p) if p.isdigit() else -1 for p in re.split(r"[;:]", params) if p != ""]
    i = 0
    while i < len(parts):
        n = parts[i]
        if n in (38, 48, 58) and i + 1 < len(parts):
            if parts[i + 1] == 5 and i + 2 < len(parts):
                if not _grey_256(parts[i + 2]):
                    return True
                i += 3
                continue
            if parts[i + 1] == 2 and i + 4 < len(parts):
                r, g, b = parts[i + 2 : i + 5]
                if max(r, g, b) - min(r, g, b) > 8:
                    return True
                i += 5
                continue
        elif (30 <= n <= 37 or 40 <= n <= 47 or 90 <= n <= 97 or 100 <= n <= 107) and n not in _BASIC_GREY:
            return True
        i += 1
    return False


@pytest.mark.parametrize("how", ["q", "terminal closed"])
def test_the_demo_job_ends_with_the_monitor_whether_it_quits_or_its_terminal_closes(how):
    """`dlwatch demo` in a terminal: `q`, or the terminal going away (tmux
    killed: SIGHUP, as when an SSH window closes), stops the demo job and its
    workers; none is left spinning on the cores."""
    import psutil

    d = short_tmpdir()
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "NO_COLOR", "TMUX_PANE")}
    tmux = Tmux(env)
    # The io-bound scenario: its workers sleep, so the test leaves the cores
    # to the tests beside it (the default one keeps both busy).
    cmd = [sys.executable, "-m", "dlwatch", "demo", "io-bound"]
    tmux.start(100, 30, cmd, {"DLWATCH_DIR": d, "PYTHONPATH": ROOT})
    procs: list = []
    try:
        end = time.monotonic() + START_LIMIT_S
        while not procs:
            assert time.monotonic() < end, tmux.capture()
            time.sleep(0.5)
            jobs = [
                j
                for j in snapshot_json(d, "--judge", "0")["jobs"]
                if j.get("state") == "live" and j["loaders"]
            ]
            if jobs:
                job = psutil.Process(jobs[0]["pid"])
                procs = [job, *job.children(recursive=True)]
        assert len(procs) >= 5, procs  # the trainer and its 4 workers
        monitor = job.ppid()  # `dlwatch demo`: the job's parent
        if how == "q":
            tmux("send-keys", "-t", "main", "q")
        else:
            tmux.kill()
        _gone, alive = psutil.wait_procs(procs, timeout=20)
        assert alive == [], [(p.pid, p.status()) for p in alive]
        # Nor its log: a killed monitor left /tmp/dlwatch-demo-PID.log behind.
        named = (f"dlwatch-demo-{monitor}.log", f"dlwatch-demo-{monitor}-")
        left = [f for f in os.listdir(tempfile.gettempdir()) if f == named[0] or f.startswith(named[1])]
        assert left == [], left
    finally:
        tmux.kill()
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
