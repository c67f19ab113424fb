"""Small inline SVG charts for the HTML report: time on x, one or more lines.

Hand-written rather than a plotting library: the report must be one file
with no script and no network fetch, a few hundred points per line suffice,
and the monitor should not grow a plotting dependency for it. A gap in a
series (None) is a gap in the line, never a guessed value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from html import escape

# Colour-blind-safe (Okabe-Ito), then darker repeats for many workers.
COLORS = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
SEVERITY_COLORS = {"critical": "#C0392B", "warn": "#E69F00", "info": "#0072B2"}

W, H = 880, 200
LEFT, RIGHT, TOP, BOTTOM = 56, 12, 10, 26


def clock(t: float) -> str:
    t = int(round(t))
    return f"{t // 3600}:{t // 60 % 60:02d}:{t % 60:02d}" if t >= 3600 else f"{t // 60}:{t % 60:02d}"


def nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    for m in (1, 2, 2.5, 5, 10):
        if raw <= m * mag:
            return m * mag
    return 10 * mag


def time_step(span: float) -> float:
    for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600):
        if span / s <= 8:
            return float(s)
    return 43200.0


def _svg_open(height: int, label: str) -> str:
    return (
        f'<svg class="chart" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
        f'role="img" aria-label="{escape(label)}">'
    )


def _ticks(step: float, hi: float) -> Iterator[float]:
    """0, step, 2 step, ... up to ``hi`` (multiplied, not summed: no drift)."""
    k = 0
    while k * step <= hi + 1e-9:
        yield k * step
        k += 1


def _time_grid(x: Callable[[float], float], t_hi: float, height: int) -> list[str]:
    """The vertical grid lines over the plot area and their time labels."""
    out = []
    for v in _ticks(time_step(t_hi), t_hi):
        out.append(f'<line class="grid" x1="{x(v):.1f}" x2="{x(v):.1f}" y1="{TOP}" y2="{height - BOTTOM}"/>')
        out.append(f'<text class="xtick" x="{x(v):.1f}" y="{height - 8}">{clock(v)}</text>')
    return out


def line_chart(
    t: Sequence[float],
    lines: Sequence[tuple[str, Sequence[float | None]]],
    *,
    t_max: float | None = None,
    y_max: float | None = None,
    y_fmt: Callable[[float], str] = lambda v: f"{v:g}",
    y_label: str = "",
    height: int = H,
) -> str:
    """An SVG of ``lines`` (label, values aligned with ``t``) over ``t``."""
    t_hi = max(t_max if t_max is not None else 0.0, max(t) if t else 0.0, 1.0)
    finite = [v for _, vs in lines for v in vs if v is not None]
    top = y_max if y_max is not None else (max(finite) if finite else 1.0)
    if top <= 0:
        top = 1.0
    ystep = nice_step(top, 4)
    top = math.ceil(top / ystep - 1e-9) * ystep
    pw, ph = W - LEFT - RIGHT, height - TOP - BOTTOM

    def x(v: float) -> float:
        return LEFT + pw * v / t_hi

    def y(v: float) -> float:
        return TOP + ph * (1 - min(max(v, 0.0), top) / top)

    out = [_svg_open(height, y_label)]
    for v in _ticks(ystep, top):
        out.append(f'<line class="grid" x1="{LEFT}" x2="{W - RIGHT}" y1="{y(v):.1f}" y2="{y(v):.1f}"/>')
        out.append(f'<text class="ytick" x="{LEFT - 6}" y="{y(v) + 4:.1f}">{escape(y_fmt(v))}</text>')
    out += _time_grid(x, t_hi, height)
    for i, (label, values) in enumerate(lines):
        color = COLORS[i % len(COLORS)]
        dash = ' stroke-dasharray="5 3"' if i >= len(COLORS) else ""
        for run in _runs(t, values):
            if len(run) == 1:
                ((a, b),) = run
                out.append(f'<circle cx="{x(a):.1f}" cy="{y(b):.1f}" r="1.8" fill="{color}"/>')
                continue
            pts = " ".join(f"{x(a):.1f},{y(b):.1f}" for a, b in run)
            out.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.6"{dash} points="{pts}">'
                f"<title>{escape(label)}</title></polyline>"
            )
    out.append(f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}"/>')
    out.append("</svg>")
    return "".join(out)


def legend(labels: Sequence[str]) -> str:
    items = "".join(
        f'<span class="key"><span class="swatch" style="background:{COLORS[i % len(COLORS)]}"></span>'
        f"{escape(label)}</span>"
        for i, label in enumerate(labels)
    )
    return f'<div class="legend">{items}</div>'


def _runs(t: Sequence[float], values: Sequence[float | None]) -> list[list[tuple[float, float]]]:
    runs: list[list[tuple[float, float]]] = []
    cur: list[tuple[float, float]] = []
    for a, b in zip(t, values):
        if b is None:
            if cur:
                runs.append(cur)
            cur = []
        else:
            cur.append((a, b))
    if cur:
        runs.append(cur)
    return runs


def timeline(
    rows: Sequence[tuple[str, str, Sequence[tuple[float, float]]]], t_max: float, step: float
) -> str:
    """Hint bars: one row per (label, severity, spans of (start, end))."""
    t_hi = max(t_max, 1.0)
    row_h = 22
    height = TOP + row_h * max(1, len(rows)) + BOTTOM
    left = 230
    pw = W - left - RIGHT

    def x(v: float) -> float:
        return left + pw * min(max(v, 0.0), t_hi) / t_hi

    out = [_svg_open(height, "hints over time"), *_time_grid(x, t_hi, height)]
    for i, (label, severity, spans) in enumerate(rows):
        yy = TOP + i * row_h
        out.append(f'<text class="rowlabel" x="{left - 8}" y="{yy + 15}">{escape(label)}</text>')
        color = SEVERITY_COLORS.get(severity, "#777")
        for a, b in spans:
            w = max(2.0, x(b + step) - x(a))
            out.append(
                f'<rect x="{x(a):.1f}" y="{yy + 4}" width="{w:.1f}" height="{row_h - 8}" rx="3" '
                f'fill="{color}">'
                f"<title>{escape(label)} {clock(a)}–{clock(b + step)}</title></rect>"
            )
    out.append("</svg>")
    return "".join(out)
