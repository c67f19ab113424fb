"""Every key of the live view, once: the bindings of the screen and the app,
the footer, the help screen (``?``) and the command palette (ctrl+p) are all
made from these tables, so neither can list a key that does nothing or miss
one that exists."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.text import Text
from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma-separated
    action: str
    label: str  # the footer's and the command palette's word for it
    # Its place in the footer (0: not there). The footer (``footer_text``)
    # lists keys in this order and, when the width is short, drops the
    # highest first; ``?``, which lists them all, is always there.
    footer: int = 0
    help_keys: str = ""  # how the help screen writes the key ("" = folded into another row)
    help: str = ""
    replay_only: bool = False  # check_action hides these for a live source
    display: str | None = None
    command: str = ""  # its title in the command palette ("" = not there)
    priority: bool = False  # also on the help screen and in the command palette

    def binding(self) -> Binding:
        # Textual's own footer is not used (``footer_text`` draws ours).
        return Binding(
            self.keys, self.action, self.label, show=False, key_display=self.display, priority=self.priority
        )

    @property
    def method(self) -> str:
        """The app's method for the action (palette commands take no arguments)."""
        return "action_" + self.action.removeprefix("app.")

    @property
    def command_help(self) -> str:
        return f"{self.help[:1].upper()}{self.help[1:]} ({self.help_keys})"


# Bound on the main screen, not on the app, so that tab/j/k stay ordinary keys
# in the command palette and the help screen.
SCREEN_KEYS = [
    Key("tab", "app.next_job", "next job", 3, "tab / ↓ / j", "next job", command="Next job"),
    Key(
        "shift+tab",
        "app.prev_job",
        "prev job",
        0,
        "shift+tab / ↑ / k",
        "previous job",
        command="Previous job",
    ),
    Key("j,down", "app.next_job", "next job"),
    Key("k,up", "app.prev_job", "prev job"),
    Key("pagedown", "page(1)", "scroll", 0, "pgup / pgdn", "scroll the loader details"),
    Key("pageup", "page(-1)", "scroll"),
    # The hints pane has a few lines at 80×24: these scroll it, a page at a time.
    Key(
        "right_square_bracket",
        "hints_page(1)",
        "scroll",
        5,
        "[ / ]",
        "scroll the hints up / down",
        display="[ ]",
    ),
    Key("left_square_bracket", "hints_page(-1)", "scroll"),
]

APP_KEYS = [
    Key("q", "quit", "quit", 9, "q / ctrl+c", "quit"),
    # Ctrl-C quits wherever the view is: over SSH it is what people press, and
    # Textual's own binding of it only says "press ctrl+q" (a QA run typed on
    # into the view). q closes the help screen instead.
    Key("ctrl+c", "quit", "quit", priority=True),
    Key("question_mark", "help", "keys", 1, "?", "the keys and the legend", display="?", command="Keys"),
    Key(
        "p",
        "toggle_pause",
        "pause",
        10,
        "p",
        "pause / resume the display (sampling goes on)",
        command="Pause / resume",
    ),
    Key(
        "s",
        "screenshot",
        "screenshot",
        12,
        "s",
        "save an SVG screenshot in the current directory",
        command="Save screenshot",
    ),
    Key(
        "d",
        "dismiss_job",
        "dismiss",
        11,
        "d",
        "dismiss the selected exited job",
        command="Dismiss exited job",
    ),
    Key("left", "replay_seek(-10)", "±10 s", 1, "← / →", "10 s back / forward", True, "← →"),
    Key("right", "replay_seek(10)", "+10 s", 0, "", "", True, "→"),
    Key(
        "shift+left,less_than_sign",
        "replay_seek(-60)",
        "-1 min",
        0,
        "< / >",
        "1 min back / forward (also shift+← / →)",
        True,
    ),
    Key("shift+right,greater_than_sign", "replay_seek(60)", "+1 min", replay_only=True),
    Key("comma", "replay_step(-1)", "line back", 0, ", / .", "one recorded snapshot back / forward", True),
    Key("full_stop", "replay_step(1)", "line forward", replay_only=True),
    Key("home", "replay_edge(0)", "start", 0, "home / end", "the start / the end of the recording", True),
    Key("end", "replay_edge(1)", "end", replay_only=True),
    Key("n", "replay_hint(1)", "next hint", 2, "n / N", "jump to the next / previous hint", True),
    Key("N", "replay_hint(-1)", "previous hint", replay_only=True),
    Key("plus,equals_sign", "replay_speed(2)", "faster", 0, "+ / -", "play faster / slower", True),
    Key("minus", "replay_speed(0.5)", "slower", replay_only=True),
    Key(
        "P",
        "profile",
        "profile",
        6,
        "P",
        "profile 10 steps of the job: verdict and trace",
        display="P",
        command="Profile job",
    ),
    Key(
        "W",
        "worker_profile",
        "workers",
        7,
        "W",
        "profile the DataLoader workers for 5 s: which stage of __getitem__ costs what",
        display="W",
        command="Profile workers",
    ),
    Key(
        "e",
        "hint_detail",
        "hints",
        4,
        "e",
        "every hint of the job in full, all its evidence",
        command="Hints in full",
    ),
    Key(
        "S",
        "stacks",
        "stacks",
        8,
        "S",
        "where the job is stuck: every thread's and worker's stack, the blocking frame named",
        display="S",
        command="Stacks",
    ),
]

# Textual's own, listed in the help all the same.
BUILT_IN = [("ctrl+p", "command palette (the same actions, by name)")]

# In a replay, p pauses the recording rather than the display.
REPLAY_PAUSE = "pause / play the recording"


# Textual's command palette, in the footer after the others.
PALETTE_FOOTER = ("^p", "palette", 13)

# Actions a replay has no job for (the app's check_action hides them).
LIVE_ONLY = frozenset({"profile", "worker_profile"})


def available(key: Key, replay: bool) -> bool:
    """Whether ``key`` does something for this source (live view or replay)."""
    if key.replay_only or key.action.startswith("replay_"):
        return replay
    return not (replay and key.action in LIVE_ONLY)


def footer_entries(replay: bool) -> list[tuple[str, str, int]]:
    """(key as shown, label, place) of every footer key of this source, in
    the footer's order (``?`` among them)."""
    out = [
        (k.display or k.keys.split(",")[0], k.label, k.footer)
        for k in SCREEN_KEYS + APP_KEYS
        if k.footer and available(k, replay)
    ]
    out.append(PALETTE_FOOTER)
    return sorted(out, key=lambda e: e[2])


def footer_text(width: int, replay: bool = False, key_style: str = "bold") -> Text:
    """The footer line for ``width`` cells: as many keys as fit, in their
    order, and always ``?`` (last), which lists them all: "more keys" when
    some did not fit, so that no key is out of reach at 80 columns."""
    entries = [e for e in footer_entries(replay) if e[0] != "?"]

    def line(n: int, sep: str) -> Text:
        items = [(key, label) for key, label, _ in entries[:n]]
        items.append(("?", "keys" if n == len(entries) else "more keys"))
        t = Text(no_wrap=True, overflow="ellipsis")
        for i, (key, label) in enumerate(items):
            t.append(sep if i else " ")
            t.append(key, key_style)
            t.append(" " + label)
        return t

    for n in range(len(entries), -1, -1):
        for sep in ("  ", " "):  # closer together before a key is left out
            t = line(n, sep)
            if cell_len(t.plain) <= width:
                return t
    return line(0, " ")


def palette_keys() -> list[Key]:
    """The keys the command palette offers, in the tables' order."""
    return [k for k in SCREEN_KEYS + APP_KEYS if k.command]


def help_rows(replay: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(rows for every source, rows for a replay only) of the help screen."""
    common, replays = [], []
    for k in SCREEN_KEYS + APP_KEYS:
        if not k.help_keys:
            continue
        if k.replay_only:
            replays.append((k.help_keys, k.help))
        elif not (replay and k.action == "toggle_pause"):
            common.append((k.help_keys, k.help))
    common += BUILT_IN
    if replay:
        replays.insert(0, ("p", REPLAY_PAUSE))
    return common, replays
