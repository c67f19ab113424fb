"""Every key of the live view, once: the bindings of the screen and the app,
the footer labels, the help screen (``?``) and the command palette (ctrl+p)
are all made from these tables, so neither can list a key that does nothing
or miss one that exists."""

from __future__ import annotations

from dataclasses import dataclass

from textual.binding import Binding


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma-separated
    action: str
    label: str  # the footer's and the command palette's word for it
    footer: bool = False
    help_keys: str = ""  # how the help screen writes the key ("" = folded into another row)
    help: str = ""
    replay_only: bool = False  # check_action hides these for a live source
    display: str | None = None
    command: str = ""  # its title in the command palette ("" = not there)

    def binding(self) -> Binding:
        return Binding(self.keys, self.action, self.label, show=self.footer, key_display=self.display)

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
    Key("tab", "app.next_job", "next job", True, "tab / ↓ / j", "next job", command="Next job"),
    Key(
        "shift+tab",
        "app.prev_job",
        "prev job",
        False,
        "shift+tab / ↑ / k",
        "previous job",
        command="Previous job",
    ),
    Key("j,down", "app.next_job", "next job"),
    Key("k,up", "app.prev_job", "prev job"),
    Key("pagedown", "page(1)", "scroll", False, "pgup / pgdn", "scroll the loader details"),
    Key("pageup", "page(-1)", "scroll"),
]

APP_KEYS = [
    Key("q", "quit", "quit", True, "q", "quit"),
    Key("question_mark", "help", "help", True, "?", "the keys and the legend", display="?", command="Keys"),
    Key(
        "p",
        "toggle_pause",
        "pause",
        True,
        "p",
        "pause / resume the display (sampling goes on)",
        command="Pause / resume",
    ),
    Key(
        "s",
        "screenshot",
        "screenshot",
        True,
        "s",
        "save an SVG screenshot in the current directory",
        command="Save screenshot",
    ),
    Key(
        "d",
        "dismiss_job",
        "dismiss",
        True,
        "d",
        "dismiss the selected exited job",
        command="Dismiss exited job",
    ),
    Key("left", "replay_seek(-10)", "-10 s", True, "← / →", "10 s back / forward", True, "←"),
    Key("right", "replay_seek(10)", "+10 s", True, "", "", True, "→"),
    Key(
        "shift+left,less_than_sign",
        "replay_seek(-60)",
        "-1 min",
        False,
        "< / >",
        "1 min back / forward (also shift+← / →)",
        True,
    ),
    Key("shift+right,greater_than_sign", "replay_seek(60)", "+1 min", replay_only=True),
    Key(
        "comma", "replay_step(-1)", "line back", False, ", / .", "one recorded snapshot back / forward", True
    ),
    Key("full_stop", "replay_step(1)", "line forward", replay_only=True),
    Key("home", "replay_edge(0)", "start", False, "home / end", "the start / the end of the recording", True),
    Key("end", "replay_edge(1)", "end", replay_only=True),
    Key("n", "replay_hint(1)", "next hint", True, "n / N", "jump to the next / previous hint", True),
    Key("N", "replay_hint(-1)", "previous hint", replay_only=True),
    Key("plus,equals_sign", "replay_speed(2)", "faster", False, "+ / -", "play faster / slower", True),
    Key("minus", "replay_speed(0.5)", "slower", replay_only=True),
    Key(
        "P",
        "profile",
        "profile",
        True,
        "P",
        "profile 10 steps of the job: verdict and trace",
        display="P",
        command="Profile job",
    ),
    Key(
        "W",
        "worker_profile",
        "workers",
        True,
        "W",
        "profile the DataLoader workers for 5 s: which stage of __getitem__ costs what",
        display="W",
        command="Profile workers",
    ),
    Key(
        "e",
        "hint_detail",
        "hints",
        True,
        "e",
        "every hint of the job in full, all its evidence",
        command="Hints in full",
    ),
    Key(
        "S",
        "stacks",
        "stacks",
        False,
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
