"""Pure formatting helpers for the TUI.

Every function here accepts whatever a snapshot might hold (a number, None, a
string where a number was expected, a missing key) and returns text: anything
that is not a real number becomes "n/a". The widgets can then format without
guarding each field, and a malformed snapshot renders instead of raising.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich.text import Text

from dlwatch.snapshot import as_dict, as_list, num, percent, severity_rank  # noqa: F401

NA = "n/a"

# Severity levels of a measured value (data wait) and of hints. Each carries a
# word and an icon so that meaning survives NO_COLOR and monochrome terminals.
GOOD, WARN, BAD, INFO = "good", "warn", "bad", "info"
LEVEL_LABEL = {GOOD: "✓ OK", WARN: "▲ WARN", BAD: "✖ BAD", INFO: "ℹ INFO"}
HINT_LEVEL = {"critical": BAD, "warn": WARN, "info": INFO}
HINT_LABEL = {"critical": "✖ CRITICAL", "warn": "▲ WARN", "info": "ℹ INFO"}

# Data-wait levels (docs/live-view.md): < 10 % good, 10–30 % warn, > 30 % bad.
WAIT_WARN = 0.10
WAIT_BAD = 0.30

BLOCKS = " ▁▂▃▄▅▆▇█"


@dataclass(frozen=True)
class Palette:
    """Rich styles for levels; the app fills it from the Textual theme."""

    good: str = "green"
    warn: str = "yellow"
    bad: str = "red"
    info: str = "cyan"
    dim: str = "dim"
    accent: str = "bold"

    def level(self, level: str) -> str:
        return getattr(self, level, "")


DEFAULT_PALETTE = Palette()


# ---------------------------------------------------------------- accessors
#
# The snapshot's own accessors (dlwatch.snapshot), under the short names the
# widgets use.

d = as_dict
lst = as_list


def intval(x: Any) -> int | None:
    v = num(x)
    return None if v is None else int(v)


def s(x: Any, default: str = "") -> str:
    return x if isinstance(x, str) else default


# ---------------------------------------------------------------- numbers


def pct(frac: Any, digits: int = 0) -> str:
    """A 0..1 fraction as a percentage (``dlwatch.snapshot.percent``)."""
    return percent(frac, digits)


def pct100(p: Any, digits: int = 0) -> str:
    """A value already in percent (CPU: 100 = one core)."""
    v = num(p)
    return percent(None if v is None else v / 100, digits)


def ms(v: Any) -> str:
    """Milliseconds with a unit that keeps 2–3 significant digits."""
    x = num(v)
    if x is None:
        return NA
    if abs(x) >= 10_000:
        return f"{x / 1000:.0f} s"
    if abs(x) >= 1000:
        return f"{x / 1000:.2f} s"
    if abs(x) >= 100:
        return f"{x:.0f} ms"
    if abs(x) >= 10:
        return f"{x:.1f} ms"
    return f"{x:.2f} ms"


def rate(v: Any) -> str:
    x = num(v)
    if x is None:
        return NA
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def count(v: Any) -> str:
    x = intval(v)
    return NA if x is None else str(x)


def size(v: Any) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 23 MiB, 1.2 GiB."""
    x = num(v)
    if x is None:
        return NA
    units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"]
    i = 0
    while abs(x) >= 1024 and i < len(units) - 1:
        x /= 1024
        i += 1
    if i == 0:
        return f"{x:.0f} B"
    return f"{x:.1f} {units[i]}" if abs(x) < 10 else f"{x:.0f} {units[i]}"


def duration(v: Any) -> str:
    """Seconds as a short age: 45s, 12m, 3h05m, 2d4h."""
    x = num(v)
    if x is None or x < 0:
        return NA
    x = int(x)
    if x < 60:
        return f"{x}s"
    if x < 3600:
        return f"{x // 60}m{x % 60:02d}s"
    if x < 86400:
        return f"{x // 3600}h{(x % 3600) // 60:02d}m"
    return f"{x // 86400}d{(x % 86400) // 3600}h"


def short_command(cmdline: Any) -> str:
    """A command line for a narrow column: the program by its name, not its
    path (`/home/u/proj/.venv/bin/python -m x` reads `python -m x`; the
    header keeps the full line)."""
    if not isinstance(cmdline, str) or not cmdline:
        return NA
    prog, sep, rest = cmdline.partition(" ")
    if "/" in prog:
        prog = prog.rsplit("/", 1)[1] or prog
    return prog + sep + rest


def truncate(text: str, width: int) -> str:
    if width <= 0:
        return ""
    return text if len(text) <= width else text[: max(0, width - 1)] + "…"


# ---------------------------------------------------------------- levels


def wait_level(frac: Any) -> str | None:
    v = num(frac)
    if v is None:
        return None
    if v > WAIT_BAD:
        return BAD
    if v >= WAIT_WARN:
        return WARN
    return GOOD


# ---------------------------------------------------------------- bars


def bar_runs(
    frac: Any, width: int, style: str = "", pal: Palette = DEFAULT_PALETTE
) -> tuple[tuple[str, str], ...]:
    """A horizontal bar ``█████░░░`` for a 0..1 fraction, as (text, style)
    runs; over 1 is drawn full. The filled part is solid and the empty part
    shaded so that the value reads without colour."""
    v = num(frac)
    if v is None:
        return (("·" * width, pal.dim),)
    # Eighth-blocks give 8 steps per cell, so 80 % and 85 % look different.
    eighths = round(max(0.0, min(1.0, v)) * width * 8)
    full, rest = divmod(eighths, 8)
    partial = "▏▎▍▌▋▊▉"[rest - 1] if rest else ""
    return (("█" * full + partial, style), ("░" * (width - full - len(partial)), pal.dim))


def bar(frac: Any, width: int, style: str = "", pal: Palette = DEFAULT_PALETTE) -> Text:
    """``bar_runs`` as a Text."""
    t = Text()
    for text, st in bar_runs(frac, width, style, pal):
        t.append(text, st)
    return t


def queue_bar(ready: Any, in_flight: Any, capacity: Any, width: int, pal: Palette = DEFAULT_PALETTE) -> Text:
    """Prefetch queue: █ ready batches, ▒ requested and being made, ░ free slots."""
    cap = intval(capacity)
    r = intval(ready)
    f = intval(in_flight)
    t = Text()
    if not cap or cap <= 0:
        t.append(NA, pal.dim)
        return t
    scale = width / cap
    nr = round((r or 0) * scale)
    nf = min(width - nr, round((f or 0) * scale))
    t.append("█" * nr, pal.good)
    t.append("▒" * nf, pal.warn)
    t.append("░" * (width - nr - nf), pal.dim)
    return t


def sparkline_rows(
    values: Sequence[Any], width: int, height: int = 1, top: float = 100.0
) -> list[list[tuple[str, float | None]]]:
    """Block characters for the newest ``width`` values on a FIXED 0..top scale.

    Returns ``height`` rows (top row first) of ``(char, value)`` per column so
    the caller can colour by value. Columns without data are blank; a value of
    0 still draws the lowest block so that "measured, zero" differs from "no
    data". Right-aligned: the newest sample is in the rightmost column.
    """
    width = max(0, width)
    height = max(1, height)
    vals = [num(v) for v in lst(values)][-width:] if width else []
    cols: list[float | None] = [None] * (width - len(vals))
    cols += vals
    rows: list[list[tuple[str, float | None]]] = [[] for _ in range(height)]
    levels = 8 * height
    for v in cols:
        if v is None:
            for r in range(height):
                rows[r].append((" ", None))
            continue
        frac = max(0.0, min(1.0, v / top)) if top > 0 else 0.0
        level = max(1, round(frac * levels))
        for r in range(height):
            # Row r (from the top) covers levels (height-1-r)*8 .. +8.
            fill = max(0, min(8, level - (height - 1 - r) * 8))
            rows[r].append((BLOCKS[fill], v))
    return rows


def join(parts: Iterable[Text | str], sep: str = " · ", pal: Palette = DEFAULT_PALETTE) -> Text:
    out = Text()
    first = True
    for p in parts:
        if not first:
            out.append(sep, pal.dim)
        first = False
        out.append(p if isinstance(p, Text) else str(p))
    return out
