"""A history graph on a fixed scale.

Textual's Sparkline scales each graph to its own min/max, so a job stuck at
95 % data wait would draw as a flat line at the bottom. This one always maps
0..``top`` to the full height, so the height of a bar means the same thing
on every refresh and every job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual.strip import Strip
from textual.widget import Widget

from dlwatch.tui import fmt


class FixedSparkline(Widget):
    """Drawn with the line API: a graph is a few lines of block characters
    whose colour changes by runs, so each line is built once per change of
    the values (or size, or theme) as a handful of segments."""

    DEFAULT_CSS = """
    FixedSparkline { height: 1; }
    """

    def __init__(
        self,
        *,
        top: float = 100.0,
        style_for: Callable[[float], str] | None = None,
        id: str | None = None,
        classes: str | None = None,
    ) -> None:
        super().__init__(id=id, classes=classes)
        self.top = top
        # Colours each column by its own value (e.g. severity of data wait).
        self.style_for = style_for
        self._values: list[Any] = []
        self._style_key: Any = None
        self._lines: tuple[tuple, list[Strip]] | None = None
        self._base: Style | None = None

    @property
    def values(self) -> list[Any]:
        return list(self._values)

    def set_values(
        self,
        values: Sequence[Any] | None,
        style_for: Callable[[float], str] | None = None,
        style_key: Any = None,
    ) -> None:
        """New values and, optionally, colours: ``style_key`` says when a new
        ``style_for`` colours differently (e.g. the palette it closes over)."""
        values = fmt.lst(values)
        if style_for is not None and style_key != self._style_key:
            self.style_for, self._style_key = style_for, style_key
            self._lines = None
            self.refresh()
        if values != self._values:
            self._values = values
            self._lines = None
            self.refresh()

    def notify_style_update(self) -> None:
        self._lines = None
        self._base = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width, height = self.size.width, max(1, self.size.height)
        key = (width, height, self.style_for)
        if self._lines is None or self._lines[0] != key:
            self._lines = (key, self._build(width, height))
        lines = self._lines[1]
        return lines[y] if 0 <= y < len(lines) else Strip.blank(width, self.rich_style)

    def _build(self, width: int, height: int) -> list[Strip]:
        if self._base is None:
            self._base = self.rich_style
        base = self._base
        styles: dict[str, Style] = {}
        out = []
        for row in fmt.sparkline_rows(self._values, width, height, self.top):
            segments: list[Segment] = []
            run: list[str] = []
            run_style = ""
            for ch, v in row:
                style = self.style_for(v) if (self.style_for and v is not None) else ""
                if style != run_style and run:
                    segments.append(self._segment(run, run_style, base, styles))
                    run = []
                run_style = style
                run.append(ch)
            if run:
                segments.append(self._segment(run, run_style, base, styles))
            out.append(Strip(segments).crop_extend(0, width, base))
        return out

    @staticmethod
    def _segment(chars: list[str], style: str, base: Style, styles: dict[str, Style]) -> Segment:
        if style not in styles:
            try:
                styles[style] = base + Style.parse(style) if style else base
            except Exception:  # a colour the terminal theme does not know: plain
                styles[style] = base
        return Segment("".join(chars), styles[style])
