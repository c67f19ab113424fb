"""One or a few lines of rich Text, drawn with the line API.

Most of the screen is single lines whose figures change on every refresh
(rates, the status bar, the job header). Textual's Static turns each new
text into its own Content and lays it out through its wrapping machinery,
a few tenths of a millisecond a line, twice a second. These lines never
wrap: each ``\\n``-separated line is cut with an ellipsis to the width and
rendered once into a Strip, kept until the text, the width or the theme
changes.
"""

from __future__ import annotations

from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Size
from textual.strip import Strip
from textual.widget import Widget


class TextLine(Widget):
    DEFAULT_CSS = """
    TextLine { height: auto; }
    """

    def __init__(self, content: Any = "", **kwargs) -> None:
        super().__init__(**kwargs)
        self._content = self._as_text(content)
        self._strips: tuple[int, list[Strip]] | None = None
        self._base: Style | None = None  # the widget's own style: a walk up the DOM to compute

    @staticmethod
    def _as_text(content: Any) -> Text:
        return content if isinstance(content, Text) else Text(str(content))

    @property
    def content(self) -> Text:
        return self._content

    def update(self, content: Any = "", *, layout: bool = True) -> None:
        """Show ``content`` (like ``Static.update``)."""
        self._content = self._as_text(content)
        self._strips = None
        self.refresh(layout=layout)

    def _plain_lines(self) -> list[str]:
        return self._content.plain.split("\n")

    def get_content_width(self, container: Size, viewport: Size) -> int:
        return max((cell_len(line) for line in self._plain_lines()), default=0)

    def get_content_height(self, container: Size, viewport: Size, width: int) -> int:
        return len(self._plain_lines())

    def notify_style_update(self) -> None:
        self._strips = None
        self._base = None
        super().notify_style_update()

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if self._strips is None or self._strips[0] != width:
            self._strips = (width, self._layout(width))
        strips = self._strips[1]
        if 0 <= y < len(strips):
            return strips[y]
        return Strip.blank(width, self._base_style())

    def _base_style(self) -> Style:
        if self._base is None:
            self._base = self.rich_style
        return self._base

    def _layout(self, width: int) -> list[Strip]:
        base = self._base_style()
        console = self.app.console
        strips = []
        for line in self._content.split("\n", allow_blank=True):
            if line.cell_len > width:
                line.truncate(width, overflow="ellipsis")
            segments = list(Segment.apply_style(line.render(console), base))
            strips.append(Strip(segments).crop_extend(0, width, base))
        return strips
