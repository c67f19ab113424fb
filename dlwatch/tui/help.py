"""The `?` screen: every key, since there is no mouse."""

from __future__ import annotations

from rich.text import Text
from textual.binding import Binding

from dlwatch.tui.textmodal import TextModal

KEYS = [
    ("tab / ↓ / j", "next job"),
    ("shift+tab / ↑ / k", "previous job"),
    ("pgup / pgdn", "scroll the loader details"),
    ("e", "every hint of the job in full, all its evidence"),
    ("p", "pause / resume the display (sampling goes on)"),
    ("s", "save an SVG screenshot in the current directory"),
    ("d", "dismiss the selected exited job"),
    ("P", "profile 10 steps of the job: verdict and trace"),
    ("ctrl+p", "command palette (the same actions, by name)"),
    ("?", "this help"),
    ("q", "quit"),
]

REPLAY_KEYS = [
    ("p", "pause / play the recording"),
    ("← / →", "10 s back / forward"),
    ("< / >", "1 min back / forward (also shift+← / →)"),
    (", / .", "one recorded snapshot back / forward"),
    ("n / N", "jump to where the next / previous hint appears"),
    ("home / end", "the start / the end of the recording"),
    ("+ / -", "play faster / slower"),
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


def help_text(replay: bool = False) -> Text:
    t = Text()
    t.append("dlwatch keys\n\n", "bold")
    for key, what in KEYS:
        if replay and key == "p":
            continue  # the replay's own p is listed below
        t.append(f"  {key:<18}", "bold")
        t.append(f"{what}\n")
    if replay:
        t.append("\nreplay\n\n", "bold")
        for key, what in REPLAY_KEYS:
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
