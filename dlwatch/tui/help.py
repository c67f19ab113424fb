"""The `?` screen: every key, since there is no mouse."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

KEYS = [
    ("tab / ↓ / j", "next job"),
    ("shift+tab / ↑ / k", "previous job"),
    ("pgup / pgdn", "scroll the loader details"),
    ("p", "pause / resume the display (sampling goes on)"),
    ("s", "save an SVG screenshot in the current directory"),
    ("d", "dismiss the selected exited job"),
    ("P", "profile 10 steps of the selected job (torch.profiler): verdict + trace"),
    ("ctrl+p", "command palette (the same actions, by name)"),
    ("?", "this help"),
    ("q", "quit"),
]

LEGEND = [
    ("data wait", "share of the loop's time spent inside next(loader)"),
    ("", "✓ OK < 10 %  ▲ WARN 10–30 %  ✖ BAD > 30 %"),
    ("history", "1 sample/s, newest right, fixed 0–100 % scale"),
    ("queue", "█ ready  ▒ in flight  ░ free prefetch slots"),
    ("CPU", "per worker, 100 % = one core"),
    ("busy", "share of a worker's time spent fetching batches"),
    ("USS", "memory unique to the worker (what it really costs)"),
]


def help_text() -> Text:
    t = Text()
    t.append("dlwatch keys\n\n", "bold")
    for key, what in KEYS:
        t.append(f"  {key:<18}", "bold")
        t.append(f"{what}\n")
    t.append("\nlegend\n\n", "bold")
    for key, what in LEGEND:
        t.append(f"  {key:<10}", "bold")
        t.append(f"{what}\n")
    t.append("\nescape, q or ? closes this screen", "dim")
    return t


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape", "dismiss", "close"),
        Binding("q", "dismiss", "close", show=False),
        Binding("question_mark", "dismiss", "close", show=False),
    ]

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 76; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; padding: 0 1; background: $surface;
    }
    HelpScreen #help-text { width: 100%; }
    """

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(help_text(), id="help-text")

    def action_dismiss(self) -> None:
        self.dismiss(None)
