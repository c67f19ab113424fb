"""Running py-spy: the thin, impure part of ``dlwatch attach``.

``py-spy record --nonblocking`` reads the job's memory from outside without
ever pausing it (``process_vm_readv``; without ``--nonblocking`` py-spy
stops the process for each sample). ``--idle`` keeps the samples of threads
that are blocked (a training thread waiting on the worker queue is exactly
what we want to count); ``--threads`` names the thread of each stack;
``--subprocesses`` follows the DataLoader workers. The output (``--format
raw``) is parsed by ``stacks.py``; the failures py-spy reports are mapped to
one readable line and an exit code here (``failure``), a pure function.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from dlwatch.collect import ptrace
from dlwatch.collect.jobs import pid_alive

RATE_HZ = 100
INSTALL_HINT = "py-spy is not installed: `pip install 'dlwatch[attach]'` (or `pip install py-spy`)"
EXITED_MARK = "process exited"


def find() -> str | None:
    """The py-spy binary: on PATH, or beside this interpreter (a venv's bin)."""
    found = shutil.which("py-spy")
    if found:
        return found
    beside = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return beside if os.access(beside, os.X_OK) else None


def record_command(binary: str, pid: int, seconds: float, out: str, rate: int = RATE_HZ) -> list[str]:
    return [
        binary,
        "record",
        "--pid",
        str(pid),
        "--nonblocking",
        "--idle",
        "--threads",
        "--subprocesses",
        "--format",
        "raw",
        "--rate",
        str(rate),
        # py-spy takes whole seconds.
        "--duration",
        str(max(1, round(seconds))),
        "--output",
        out,
    ]


def missed_the_version(stderr: str) -> bool:
    """py-spy could not tell the target's Python version: on a Python
    process that is worth one more try (see ``failure``)."""
    return "failed to find python version" in stderr.lower()


def failure(stderr: str, pid: int, access: ptrace.Access | None = None) -> tuple[int, str]:
    """(exit code, one line) for a py-spy run that produced no recording;
    ``access``: the permission check's verdict, which explains a refusal
    better than py-spy (which may report one as "no Python found")."""
    if access is not None and not access.allowed:
        return access.code, f"cannot attach to PID {pid}: {access.line()}"
    text = stderr.lower()
    if "permission denied" in text or "operation not permitted" in text:
        return ptrace.EXIT_NOT_PERMITTED, (
            f"not permitted to read PID {pid}'s memory; `dlwatch attach --check {pid}` says why"
        )
    if "failed to get process executable name" in text or "no such process" in text:
        return ptrace.EXIT_NO_PROCESS, f"no process with PID {pid} (it may have exited)"
    if missed_the_version(text) or "no python processes found" in text:
        if not ptrace.looks_like_python(pid):
            return ptrace.EXIT_NOT_PYTHON, f"PID {pid} is not a Python process: nothing to attach to"
        # A Python process all the same: py-spy reads the version from the
        # interpreter's memory by a heuristic that now and then misses (seen
        # with pyenv's static 3.10 builds, uv's and other standalone builds).
        return 1, (
            f"py-spy did not find the Python version in PID {pid}'s memory, though it runs Python "
            "(py-spy's known limit with some interpreter builds): try again; a job started under "
            "`dlwatch run` or with `import dlwatch.hook` needs no py-spy"
        )
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip().startswith("Error")), "")
    return 1, f"py-spy could not sample PID {pid}: {last or 'no output'}"


@dataclass
class Result:
    text: str  # the raw stacks ("" on failure)
    exited: bool  # py-spy stopped because the job exited
    error: tuple[int, str] | None  # (exit code, line) when nothing was recorded


class Recording:
    """One ``py-spy record`` run in the background; ``wait()`` collects it."""

    def __init__(self, binary: str, pid: int, seconds: float, rate: int = RATE_HZ) -> None:
        self.pid = pid
        self.seconds = max(1, round(seconds))  # what py-spy's --duration gets
        self._dir = tempfile.mkdtemp(prefix="dlwatch-attach-")
        self._out = os.path.join(self._dir, "stacks.txt")
        self.proc = subprocess.Popen(
            record_command(binary, pid, seconds, self._out, rate),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # a Ctrl-C meant for dlwatch is ours to pass on
        )

    def stop(self) -> None:
        """Ask py-spy to finish early: on SIGINT it writes what it has."""
        if self.proc.poll() is None:
            try:
                self.proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    def wait(self, timeout: float) -> Result:
        try:
            err, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            err, _ = self.proc.communicate()
        err = err or ""
        try:
            with open(self._out) as f:
                text = f.read()
        except OSError:
            text = ""
        finally:
            shutil.rmtree(self._dir, ignore_errors=True)
        # py-spy says so when the job ends mid-recording; a job that ended
        # before py-spy could look is gone (or a zombie) now.
        exited = EXITED_MARK in err or not pid_alive(self.pid)
        if not text and not exited and self.proc.returncode != 0:
            return Result("", False, failure(err, self.pid, ptrace.check(self.pid)))
        return Result(text, exited, None)
