"""The `P` and `W` screens: a profiler burst of the selected job (or, with
``workers``, a worker profile burst), progress then summary.

A modal over the live screen, which keeps updating underneath. The request
runs in a thread worker (it waits on the job's socket for up to a minute);
closing the screen before the result hangs up, and the job drops the burst.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from dlwatch.tui.textmodal import closing_frame

# (pid, on_status=, cancelled=) -> the summary document; raises on failure
# with a readable message (dlwatch.collect.control.request_profile).
Runner = Callable[..., dict]


class ProfileScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("q", "close", "close", show=False),
        Binding("P", "close", "close", show=False),
        Binding("W", "close", "close", show=False),
    ]

    DEFAULT_CSS = """
    ProfileScreen { align: center middle; background: $background 40%; }
    ProfileScreen > VerticalScroll {
        width: 100; max-width: 100%; height: auto; max-height: 90%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    ProfileScreen #profile-text { width: 100%; }
    """

    def __init__(self, pid: int, runner: Runner, steps: int = 10, workers: bool = False) -> None:
        super().__init__()
        self.pid = pid
        self.runner = runner
        self.steps = steps
        self.of_workers = workers
        self.what = "worker profile" if workers else "profile"
        self.doc: dict | None = None
        self.error: str | None = None
        self._cancel = threading.Event()

    def compose(self) -> ComposeResult:
        # escape cancels a burst still running; the text says so too.
        with closing_frame(
            f"escape, q or {'W' if self.of_workers else 'P'} closes", f"{self.what} · PID {self.pid}"
        ):
            yield Static(self._progress_text("asking the job…"), id="profile-text")

    def on_mount(self) -> None:
        self.run_worker(self._work, thread=True, exclusive=True, name="dlwatch-profile")

    def _work(self) -> None:
        def on_status(msg: dict) -> None:
            if not self._cancel.is_set():
                self.app.call_from_thread(self._on_status, msg)

        try:
            doc = self.runner(self.pid, on_status=on_status, cancelled=self._cancel.is_set)
        except Exception as e:
            if not self._cancel.is_set():
                self.app.call_from_thread(self._show_error, str(e) or type(e).__name__)
            return
        if not self._cancel.is_set():
            self.app.call_from_thread(self._show_summary, doc)

    def _on_status(self, msg: dict) -> None:
        if self.doc is not None or self.error is not None:
            return
        state = msg.get("state")
        if self.of_workers:
            self._text().update(self._progress_text(str(msg.get("message") or state)))
            return
        done, total = msg.get("steps_done") or 0, msg.get("steps") or self.steps
        if state == "armed":
            what = "waiting for the loop's next batch"
        elif state == "processing":
            what = f"{done} steps recorded; reading the profile and writing the trace…"
        else:
            bar = "█" * int(20 * done / max(1, total))
            what = f"{done}/{total} steps  {bar:<20}"
        self._text().update(self._progress_text(what, msg.get("message")))

    def _progress_text(self, what: str, note: str | None = None) -> Text:
        t = Text()
        t.append(f"{'worker profile of' if self.of_workers else 'profiling'} PID {self.pid}\n\n", "bold")
        t.append(f"{what}\n")
        if note:
            t.append(f"{note}\n", "dim")
        t.append("\nclosing cancels the burst", "dim")
        return t

    def _show_summary(self, doc: dict) -> None:
        from dlwatch.diagnose import profile, story, worker_profile

        self.doc = doc
        # One story: a next step that contradicts the hints on screen about
        # the worker count defers to them (diagnose/story.py).
        snap = getattr(self.app, "snapshot", None)
        step = story.next_step(doc, snap.get("hints") if isinstance(snap, dict) else None, self.pid)
        if step is not None and step != doc.get("suggestion"):
            doc = dict(doc, suggestion=step)
        t = Text()
        lines = (worker_profile if self.of_workers else profile).summary_lines(doc)
        t.append(f"{self.what} of PID {self.pid}\n\n", "bold")
        for line in lines[1:] if not doc.get("error") else lines:
            style = "bold" if line.startswith(("verdict:", "next step:")) else ""
            t.append(line + "\n", style)
        if not doc.get("error"):
            t.append(lines[0].split(": ", 1)[-1] + "\n", "dim")
        self._text().update(t)

    def _show_error(self, message: str) -> None:
        self.error = message
        t = Text()
        t.append(f"{self.what} of PID {self.pid}\n\n", "bold")
        t.append(f"✖ {message}\n", "red")
        self._text().update(t)

    def _text(self) -> Static:
        return self.query_one("#profile-text", Static)

    def action_close(self) -> None:
        self._cancel.set()
        self.dismiss(None)
