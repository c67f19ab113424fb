"""The `S` screen: where the selected job's threads and workers are stuck.

Shows the stacks the snapshot already carries (the job gathered them when a
loader stalled), then, in the live view, asks the job for fresh ones in a
thread worker (the runner the CLI hands over: ``collect.hang.gather_stacks``)
and shows those. In a replay the recorded ones are all there is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.screen import ModalScreen
from textual.widgets import Static

from dlwatch.diagnose import hang
from dlwatch.tui.textmodal import closing_frame

# pid -> the stacks document (dlwatch.collect.hang.gather_stacks)
StacksRunner = Callable[[int], dict]


class StacksScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "close", "close"),
        Binding("q", "close", "close", show=False),
        Binding("S", "close", "close", show=False),
    ]

    DEFAULT_CSS = """
    StacksScreen { align: center middle; background: $background 40%; }
    StacksScreen > VerticalScroll {
        width: 100%; height: 90%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    StacksScreen #stacks-text { width: 100%; }
    """

    def __init__(self, pid: int, doc: dict | None, runner: StacksRunner | None) -> None:
        super().__init__()
        self.pid = pid
        self.doc = doc
        self.runner = runner
        self.asking = runner is not None
        self._gone = threading.Event()

    def compose(self) -> ComposeResult:
        with closing_frame("escape, q or S closes", f"stacks · PID {self.pid}"):
            yield Static(self._text(), id="stacks-text")

    def on_mount(self) -> None:
        if self.runner is not None:
            self.run_worker(self._work, thread=True, exclusive=True, name="dlwatch-stacks")

    def _work(self) -> None:
        runner = self.runner
        if runner is None:
            return
        try:
            doc = runner(self.pid)
        except Exception as e:
            doc = {"error": str(e) or type(e).__name__, "processes": []}
        if not self._gone.is_set():
            self.app.call_from_thread(self._show, doc)

    def _show(self, doc: dict) -> None:
        self.asking = False
        if doc.get("processes") or not self.doc:
            self.doc = doc
        elif doc.get("error"):
            self.doc = {**self.doc, "error": f"asking again failed: {doc['error']}"}
        self.query_one("#stacks-text", Static).update(self._text())

    def _text(self) -> Text:
        t = Text()
        t.append(f"stacks of PID {self.pid}\n", "bold")
        doc = self.doc or {}
        when = doc.get("t")
        if isinstance(when, (int, float)):
            age = max(0.0, time.time() - when)
            t.append(f"taken {age:.0f} s ago ({doc.get('reason') or 'request'})\n", "dim")
        if self.asking:
            t.append("asking the job for fresh stacks…\n", "dim")
        if doc.get("error"):
            t.append(f"✖ {doc['error']}\n", "red")
        if not doc.get("processes") and not self.asking:
            t.append("no stacks\n", "dim")
        t.append("\n")
        summary = doc.get("summary")
        if not isinstance(summary, list):
            summary = hang.summarize(doc)
        for e in summary:
            if isinstance(e, dict):
                style = "bold red" if e.get("kind") not in (None, "idle", "running") else "bold"
                t.append(str(e.get("line")) + "\n", style)
        for line in hang.render(doc)[len(summary) :]:
            t.append(line + "\n", "bold" if line.startswith("==") else "")
        return t

    def action_close(self) -> None:
        self._gone.set()
        self.dismiss(None)
