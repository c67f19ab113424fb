"""The `?` screen: every key, since there is no mouse."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from dlwatch.tui.keys import help_rows
from dlwatch.tui.textmodal import TextModal

LEGEND = [
    ("data wait", "share of the loop's time spent inside next(loader)"),
    ("", "✓ OK < 10 %  ▲ WARN 10–30 %  ✖ BAD > 30 %"),
    ("history", "1 sample/s, newest right, fixed 0–100 % scale"),
    ("queue", "█ ready  ▒ in flight  ░ free prefetch slots"),
    ("CPU", "per worker, 100 % = one core"),
    ("busy", "share of a worker's time spent fetching batches"),
    ("USS", "memory unique to the worker (what it really costs)"),
]


def help_text(replay: bool = False) -> Text:
    common, replays = help_rows(replay)
    t = Text()
    t.append("dlwatch keys\n\n", "bold")
    for key, what in common:
        t.append(f"  {key:<18}", "bold")
        t.append(f"{what}\n")
    if replay:
        t.append("\nreplay\n\n", "bold")
        for key, what in replays:
            t.append(f"  {key:<18}", "bold")
            t.append(f"{what}\n")
    t.append("\nlegend\n\n", "bold")
    for key, what in LEGEND:
        t.append(f"  {key:<10}", "bold")
        t.append(f"{what}\n")
    return t


class HelpScreen(TextModal):
    BINDINGS = [Binding("question_mark", "dismiss", "close", show=False)]

    def __init__(self, replay: bool = False) -> None:
        super().__init__(help_text(replay), closes="escape, q or ? closes", body_id="help-text")
