"""What ended the training process, as the process itself saw it: the
uncaught exception of its main thread, recorded by a ``sys.excepthook`` that
then calls the hook it replaced (Python's prints the traceback as ever). The
publisher's last frame, sent at exit (after the hook ran), carries it, so that
a rank that crashed reads "exited after an uncaught RuntimeError: …" rather
than "exited" like one that finished (a QA run of torchrun: both read the same).

A SIGKILL leaves nothing to record; the monitor then says only that the
process exited.
"""

from __future__ import annotations

import sys
import threading

# Kept short: a message can hold a whole tensor's repr.
MAX_CHARS = 300

_lock = threading.Lock()
_installed = False
_text: str | None = None


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
    global _text
    _text = None
