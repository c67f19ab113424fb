"""One live panel: the collector child, the reader thread, the display.

The display is updated by id (``update_display_data``): every output that
shows this panel changes in place, whichever cell is running, and a saved
notebook keeps the last frame.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable

from dlwatch import own_threads

STOP_WAIT_S = 3.0
DEFAULT_INTERVAL_S = 1.0
DISABLED = "DLWATCH_DISABLE is set in this kernel: dlwatch.hook is a no-op, so there is nothing to show."


def _ipython_display() -> tuple[Callable[[dict], None], Callable[[dict], None]]:
    """(show, update) over IPython's display machinery."""
    from IPython.display import display

    handle = None

    def show(bundle: dict) -> None:
        nonlocal handle
        handle = display(bundle, raw=True, display_id=True)

    def update(bundle: dict) -> None:
        if handle is not None:
            handle.update(bundle, raw=True)

    return show, update


def _bundle(doc: dict) -> dict:
    return {"text/html": str(doc.get("html", "")), "text/plain": str(doc.get("text", ""))}


def _plain(text: str) -> dict:
    from html import escape

    return {"text/html": f"<div style='font-family:monospace'>{escape(text)}</div>", "text/plain": text}


def _hook_enabled() -> bool:
    return os.environ.get("DLWATCH_DISABLE", "").strip() in ("", "0", "false", "no")


class PanelSession:
    """The collector child and the thread that shows its frames.

    ``display``: (show, update) callables taking a MIME bundle; IPython's by
    default, injectable so the session runs (and is tested) outside a kernel.
    """

    def __init__(
        self,
        interval: float = DEFAULT_INTERVAL_S,
        display: tuple[Callable[[dict], None], Callable[[dict], None]] | None = None,
        pid: int | None = None,
    ) -> None:
        self.interval = interval
        self.pid = os.getpid() if pid is None else pid
        self._show, self._update = display or _ipython_display()
        self.proc: subprocess.Popen | None = None
        self.thread: threading.Thread | None = None
        self.frames = 0
        # Frames received per state ("live": 12, ...): what a test or a
        # curious user can check without reading the HTML.
        self.frames_by_state: dict[str, int] = {}
        self.state = "starting"
        self.last: dict | None = None
        self.error: str | None = None

    def start(self) -> None:
        if not _hook_enabled():
            self.state = "disabled"
            self._show(_plain(DISABLED))
            return
        import dlwatch.hook  # noqa: F401  (installs the patches in this kernel, idempotent)

        self._show(_plain(f"dlwatch · kernel pid {self.pid} · starting the collector…"))
        cmd = [
            sys.executable,
            "-m",
            "dlwatch.panel.feed",
            "--pid",
            str(self.pid),
            "--interval",
            str(self.interval),
        ]
        try:
            self.proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                bufsize=1,
            )
        except OSError as e:
            self.state = "error"
            self.error = f"could not start the collector ({sys.executable} -m dlwatch.panel.feed): {e}"
            self._update(_plain(self.error))
            return
        # A plain thread: ipykernel tags its messages with the cell running
        # now, so the saved notebook and nbclient see the updates in order.
        self.thread = own_threads.start(self._read, "dlwatch-panel")

    def _read(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        for line in proc.stdout:
            try:
                doc = json.loads(line)
            except ValueError:
                continue
            if not isinstance(doc, dict):
                continue
            self.last = doc
            self.state = str(doc.get("state", "?"))
            self.frames += 1
            self.frames_by_state[self.state] = self.frames_by_state.get(self.state, 0) + 1
            try:
                self._update(_bundle(doc))
            except Exception:  # a closed frontend must not kill the reader
                pass
        rc = proc.wait()
        if rc not in (0, None) and self.state not in ("stopped", "ended"):
            err = (proc.stderr.read() if proc.stderr else "").strip().splitlines()
            self.error = f"the panel's collector stopped (exit {rc}): {err[-1] if err else 'no message'}"
            self.state = "error"
            try:
                self._update(_plain(self.error))
            except Exception:
                pass

    def stop(self, timeout: float = STOP_WAIT_S) -> None:
        """Freeze the panel: the collector sends its last frame and exits."""
        proc = self.proc
        if proc is None:
            return
        try:
            if proc.stdin is not None:
                proc.stdin.write("stop\n")
                proc.stdin.flush()
                proc.stdin.close()
        except (OSError, ValueError):
            pass
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if self.thread is not None:
            self.thread.join(timeout)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


_current: PanelSession | None = None
_lock = threading.Lock()


def current() -> PanelSession | None:
    return _current


def show(interval: float = DEFAULT_INTERVAL_S) -> PanelSession:
    """Instrument this kernel and show the live panel in the running cell's
    output (a panel shown earlier is frozen first)."""
    global _current
    with _lock:
        if _current is not None:
            _current.stop()
        _current = PanelSession(interval=interval)
        _current.start()
        return _current


def stop() -> PanelSession | None:
    """Freeze the live panel with its final figures."""
    with _lock:
        if _current is not None:
            _current.stop()
        return _current
