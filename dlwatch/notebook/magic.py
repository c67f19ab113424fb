"""The ``%dlwatch`` line magic (``%load_ext dlwatch`` registers it)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys

from dlwatch.notebook import session

USAGE = """\
%dlwatch [--interval S]     instrument this kernel and show the live panel in this cell
%dlwatch stop               freeze the panel with its final figures
%dlwatch tune SCRIPT [ARGS] run `dlwatch tune` on a training script: the tuner re-runs
                            a command several times with other DataLoader settings, so it
                            needs a script (the notebook's own loop cannot be re-run)"""

TUNE_NEEDS_SCRIPT = (
    "%dlwatch tune needs a training script: the tuner re-runs a command several times with other "
    "DataLoader settings, and a notebook's cells cannot be re-run that way. "
    "Save the training loop as a script and run: %dlwatch tune train.py [ARGS]"
)


def dlwatch_magic(line: str) -> None:
    try:
        words = shlex.split(line)
    except ValueError as e:
        print(f"%dlwatch: {e}\n{USAGE}")
        return
    if not words:
        session.show()
        return
    if words[0] in ("-h", "--help", "help"):
        print(USAGE)
    elif words[0] == "stop":
        if session.stop() is None:
            print("%dlwatch stop: no panel is running in this kernel")
    elif words[0] == "tune":
        tune(words[1:])
    elif words[0] == "--interval" and len(words) == 2:
        try:
            interval = float(words[1])
        except ValueError:
            interval = 0.0
        if interval <= 0:
            print(f"%dlwatch: --interval takes a number of seconds > 0, not {words[1]!r}")
            return
        session.show(interval=interval)
    else:
        print(f"%dlwatch: unknown arguments {line.strip()!r}\n{USAGE}")


def tune_command(args: list[str]) -> list[str] | None:
    """The ``dlwatch tune`` command for ``%dlwatch tune ARGS`` (None: no script).
    Options before the script go to the tuner; a ``.py`` script runs under
    this kernel's Python."""
    opts: list[str] = []
    rest = list(args)
    while rest and rest[0].startswith("-"):
        opts.append(rest.pop(0))
        if opts[-1] in ("--trial-seconds", "--max-trials", "--budget", "--workers", "--loader") and rest:
            opts.append(rest.pop(0))
    if not rest:
        return None
    target = [sys.executable, *rest] if rest[0].endswith(".py") else rest
    return [sys.executable, "-m", "dlwatch", "tune", *opts, "--", *target]


def tune(args: list[str]) -> int | None:
    cmd = tune_command(args)
    if cmd is None:
        print(TUNE_NEEDS_SCRIPT)
        return None
    print("running:", shlex.join(cmd[2:]), flush=True)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1) as p:
        assert p.stdout is not None
        try:
            for line in p.stdout:
                print(line, end="", flush=True)
        except KeyboardInterrupt:
            # The tuner prints what it measured when interrupted.
            p.send_signal(signal.SIGINT)
            for line in p.stdout:
                print(line, end="", flush=True)
        return p.wait()


def register(ipython) -> None:  # noqa: ANN001 (IPython's shell)
    ipython.register_magic_function(dlwatch_magic, magic_kind="line", magic_name="dlwatch")
