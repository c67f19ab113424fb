"""A history graph on a fixed scale.

Textual's Sparkline scales each graph to its own min/max, so a job stuck at
95 % data wait would draw as a flat line at the bottom. This one always maps
0..``top`` to the full height, so the height of a bar means the same thing
on every refresh and every job.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from rich.text import Text
from textual.widget import Widget

from dlwatch.tui import fmt


class FixedSparkline(Widget):
    DEFAULT_CSS = """
    FixedSparkline { height: 1; }
    """

    def __init__(self, *, top: float = 100.0, style_for: Callable[[float], str] | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.top = top
        # Colours each column by its own value (e.g. severity of data wait).
        self.style_for = style_for
        self._values: list[Any] = []

    @property
    def values(self) -> list[Any]:
        return list(self._values)

    def set_values(self, values: Sequence[Any] | None) -> None:
        values = fmt.lst(values)
        if values != self._values:
            self._values = values
            self.refresh()

    def render(self) -> Text:
        width, height = self.size.width, max(1, self.size.height)
        rows = fmt.sparkline_rows(self._values, width, height, self.top)
        text = Text(no_wrap=True, overflow="crop")
        for i, row in enumerate(rows):
            if i:
                text.append("\n")
            for ch, v in row:
                style = self.style_for(v) if (self.style_for and v is not None) else ""
                text.append(ch, style)
        return text
