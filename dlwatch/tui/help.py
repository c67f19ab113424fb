"""The `?` screen: every key, since there is no mouse."""

from __future__ import annotations

import textwrap

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


# The text's width inside the modal: TextModal's box is 76 columns, less a
# border and a column of padding on each side and the 2-column scrollbar that
# a 24-row terminal shows. A description longer than what is left beside its
# key is wrapped here, under itself: the Static would wrap it to the left
# edge, under the keys (at 80x24 the W and S rows did).
TEXT_WIDTH = 70


def _row(t: Text, key: str, what: str, key_width: int) -> None:
    indent = 2 + key_width
    t.append(f"  {key:<{key_width}}", "bold")
    lines = textwrap.wrap(what, TEXT_WIDTH - indent) or [""]
    t.append(("\n" + " " * indent).join(lines) + "\n")


def help_text(replay: bool = False) -> Text:
    common, replays = help_rows(replay)
    t = Text()
    t.append("dlwatch keys\n\n", "bold")
    for key, what in common:
        _row(t, key, what, 18)
    if replay:
        t.append("\nreplay\n\n", "bold")
        for key, what in replays:
            _row(t, key, what, 18)
    t.append("\nlegend\n\n", "bold")
    for key, what in LEGEND:
        _row(t, key, what, 10)
    return t


class HelpScreen(TextModal):
    BINDINGS = [Binding("question_mark", "dismiss", "close", show=False)]

    def __init__(self, replay: bool = False) -> None:
        super().__init__(help_text(replay), closes="escape, q or ? closes", body_id="help-text")
