"""What ended the training process, as the process itself saw it: the
uncaught exception of its main thread, recorded by a ``sys.excepthook`` that
then calls the hook it replaced (Python's prints the traceback as ever). The
publisher's last frame, sent at exit (after the hook ran), carries it, so that
a rank that crashed reads "exited after an uncaught RuntimeError: …" rather
than "exited" like one that finished (a QA run of torchrun: both read the same).

``sys.exit`` is wrapped likewise: a ``sys.exit(3)`` on the main thread (the
script's, argparse's) is no exception to the excepthook, and once a shell has
reaped the job its code is gone: it read "exited" like a run that finished.
The wrapper records the call, then calls the ``sys.exit`` it replaced. A
``raise SystemExit(3)`` is not seen.

A SIGKILL leaves nothing to record; the monitor then says only that the
process exited.
"""

from __future__ import annotations

import functools
import sys
import threading

# Kept short: a message can hold a whole tensor's repr.
MAX_CHARS = 300

_lock = threading.Lock()
_installed = False
_text: str | None = None
_exit_call: str | None = None


def install() -> None:
    """Wrap ``sys.excepthook`` once per process (idempotent, never raises)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    prev = sys.excepthook

    def excepthook(etype, value, tb):
        try:
            record(etype, value)
        finally:
            prev(etype, value, tb)

    sys.excepthook = excepthook
    prev_exit = sys.exit

    @functools.wraps(prev_exit)
    def exit(status=None, /):
        try:
            if threading.current_thread() is threading.main_thread():
                record_exit(status)
        finally:
            prev_exit(status)

    sys.exit = exit


def record_exit(status: object) -> None:
    """A ``sys.exit(status)`` on the main thread: "sys.exit(3)", or
    "sys.exit('message')" (code 1); a success (None, 0) forgets any."""
    global _exit_call
    try:
        if status is None or status == 0:
            _exit_call = None
            return
        arg = repr(status)
        if len(arg) > MAX_CHARS:
            arg = arg[: MAX_CHARS - 2] + "…" + arg[-1]
        _exit_call = f"sys.exit({arg})"
    except Exception:
        _exit_call = "sys.exit(…)"


def exit_call() -> str | None:
    """The main thread's last failing ``sys.exit`` call, or None."""
    return _exit_call


def record(etype, value) -> None:
    global _text
    try:
        name = getattr(etype, "__qualname__", None) or str(etype)
        msg = str(value).strip().splitlines()[0] if str(value).strip() else ""
        text = f"{name}: {msg}" if msg else name
        _text = text if len(text) <= MAX_CHARS else text[: MAX_CHARS - 1] + "…"
    except Exception:
        _text = "an exception that could not be printed"


def last() -> str | None:
    """The main thread's uncaught exception, "Type: first line", or None."""
    return _text


def forget() -> None:
    """In a forked child: the parent's exception is not the child's."""
    global _text, _exit_call
    _text = None
    _exit_call = None
