"""A small table drawn with Textual's line API: one cached line per row.

The display refreshes twice a second and, with a few jobs and a dozen
workers, most rows change a figure every time. Textual's DataTable renders
each cell through rich padding and style lookups and keeps its caches
table-wide; drawing it was most of the TUI's CPU. Here each row is one line:
built once from its cells when they change (the cells are compared, not
trusted), kept as a ready ``Strip``, and only the lines of changed rows are
repainted. Columns have fixed widths so figures never make the table jitter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.console import JustifyMethod
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

from dlwatch.tui.keyed import text_key

PAD = 1  # blank cells either side of every column, as DataTable draws them
CELL_CACHE_MAX = 4096  # rendered cells kept (a few screens' worth); then start afresh


# A cell is a rich Text, a plain string, or "runs": a tuple of (text, style)
# pieces. Strings and runs are what the live tables use: they compare and
# hash as they are and render straight to segments, with none of the cost of
# building, comparing and rendering a Text for every figure twice a second.
Runs = tuple[tuple[str, str], ...]
Cell = Text | str | Runs


def cell_sig(cell: Cell) -> object:
    return text_key(cell) if isinstance(cell, Text) else cell


def as_text(cell: Cell) -> Text:
    if isinstance(cell, Text):
        return cell
    if isinstance(cell, str):
        return Text(cell)
    return Text.assemble(*cell)


@dataclass
class Column:
    key: str
    label: str
    width: int
    justify: JustifyMethod = "left"  # for cells that do not say


@dataclass
class _Row:
    key: str
    cells: list[Cell]
    sig: tuple
    strip: Strip | None = None
    strip_key: tuple | None = None


def fit(text: Text, width: int, justify: JustifyMethod) -> Text:
    """``text`` on one line of exactly ``width`` cells: cut with an ellipsis
    when too long, padded on the side its justification says."""
    t = text.copy()
    t.plain = t.plain.replace("\n", " ")
    if t.cell_len > width:
        t.truncate(width, overflow="ellipsis")
    gap = width - t.cell_len
    if gap > 0:
        how = text.justify or justify
        if how == "right":
            t.pad_left(gap)
        elif how == "center":
            t.pad_left(gap // 2)
            t.pad_right(gap - gap // 2)
        else:
            t.pad_right(gap)
    return t


class LineTable(ScrollView, can_focus=False):
    """Rows of ``Text`` cells under a fixed header.

    ``set_rows`` takes the whole table each refresh and works out what
    changed; ``cursor_key`` highlights one row (kept in view) and ``zebra``
    stripes every other row.
    """

    COMPONENT_CLASSES = {"line-table--header", "line-table--stripe", "line-table--cursor"}

    DEFAULT_CSS = """
    LineTable {
        background: $surface;
        color: $foreground;
        height: auto;
        max-height: 100%;
        overflow-x: hidden;
        overflow-y: auto;
        & > .line-table--header {
            text-style: bold;
            background: $panel;
            color: $foreground;
        }
        &:ansi > .line-table--header {
            background: ansi_bright_blue;
            color: ansi_default;
        }
        & > .line-table--stripe {
            background: $surface-lighten-1 50%;
        }
        &:dark > .line-table--stripe {
            background: $surface-darken-1 40%;
        }
        & > .line-table--cursor {
            background: $block-cursor-blurred-background;
        }
    }
    """

    def __init__(
        self, columns: Sequence[Column], *, zebra: bool = False, cursor: bool = False, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.columns: list[Column] = list(columns)
        self.zebra = zebra
        self.show_cursor = cursor
        self._rows: list[_Row] = []
        self._index: dict[str, int] = {}
        self._cursor: int | None = None
        self._line_style_cache: tuple[Style, Style, Style, Style] | None = None
        self._header: tuple[tuple, Strip] | None = None
        self._cell_cache: dict[tuple, list[Segment]] = {}
        self.strips_built = 0  # how many row lines were rendered (tests, benchmarks)
        self._update_virtual_size()

    # ------------------------------------------------------------ the model

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def row_keys(self) -> list[str]:
        return [r.key for r in self._rows]

    @property
    def cursor_row(self) -> int | None:
        return self._cursor

    def get_row(self, key: str) -> list[Text]:
        return [as_text(c) for c in self._rows[self._index[key]].cells]

    def set_rows(
        self, rows: Sequence[tuple[str, Sequence[Cell]]], cursor_key: str | None = None
    ) -> list[int]:
        """Show ``rows`` (key, cells) in this order; returns the indexes of
        the rows that look different from before. Only the cells that
        changed are repainted (and sent to the terminal)."""
        old = self._rows
        new: list[_Row] = []
        changed: dict[int, list[int] | None] = {}  # row -> changed columns (None: all)
        for i, (key, cells) in enumerate(rows):
            cells = [c if isinstance(c, (Text, str, tuple)) else str(c) for c in cells]
            sig = tuple(cell_sig(c) for c in cells)
            prev = old[i] if i < len(old) else None
            if prev is not None and prev.key == key and prev.sig == sig:
                new.append(prev)
                continue
            row = _Row(key, cells, sig)
            if prev is not None and prev.sig == sig:
                row.strip, row.strip_key = prev.strip, prev.strip_key  # same look, another key
            elif prev is not None and len(prev.sig) == len(sig):
                changed[i] = [c for c, (a, b) in enumerate(zip(prev.sig, sig)) if a != b]
            else:
                changed[i] = None
            new.append(row)
        self._rows = new
        self._index = {r.key: i for i, r in enumerate(new)}
        cursor = self._index.get(cursor_key) if (self.show_cursor and cursor_key is not None) else None
        if cursor != self._cursor:
            for at in (self._cursor, cursor):
                if at is not None and at < len(new):
                    changed[at] = None
            self._cursor = cursor
        if len(new) != len(old):
            self._update_virtual_size()
            self.refresh(layout=True)
        else:
            self._refresh_cells(changed)
        if cursor is not None:
            self._scroll_into_view(cursor)
        return sorted(changed)

    def _refresh_cells(self, changed: dict[int, list[int] | None]) -> None:
        top = int(self.scroll_y)
        width = max(self.virtual_size.width, self.size.width)
        edges = [0]
        for column in self.columns:
            edges.append(edges[-1] + column.width + 2 * PAD)
        regions = []
        for i, columns in changed.items():
            y = i + 1 - top  # line 0 is the header
            if columns is None:
                regions.append(Region(0, y, width, 1))
            else:
                regions += [Region(edges[c], y, edges[c + 1] - edges[c], 1) for c in columns]
        if regions:
            self.refresh(*regions)

    def set_column_width(self, key: str, width: int) -> None:
        for column in self.columns:
            if column.key == key and column.width != width:
                column.width = width
                self._forget_lines()
                self._update_virtual_size()
                self.refresh(layout=True)

    def _update_virtual_size(self) -> None:
        width = sum(c.width + 2 * PAD for c in self.columns)
        self.virtual_size = Size(width, len(self._rows) + 1)

    def _scroll_into_view(self, index: int) -> None:
        visible = max(1, self.scrollable_content_region.height - 1)
        top = int(self.scroll_y)
        if index < top:
            self.scroll_to(y=index, animate=False, immediate=True)
        elif index >= top + visible:
            self.scroll_to(y=index - visible + 1, animate=False, immediate=True)

    # ------------------------------------------------------------ drawing

    def notify_style_update(self) -> None:
        # Theme or CSS changed: every cached line has stale colours.
        self._forget_lines()
        super().notify_style_update()

    def _forget_lines(self) -> None:
        self._line_style_cache = None
        self._cell_cache.clear()
        self._header = None
        for row in self._rows:
            row.strip = row.strip_key = None

    def _line_styles(self) -> tuple[Style, Style, Style, Style]:
        if self._line_style_cache is None:
            self._line_style_cache = (
                self.rich_style,
                self.get_component_rich_style("line-table--header"),
                # Only the background of these is used, blended over the table's as CSS says.
                Style(bgcolor=self.get_component_rich_style("line-table--stripe").bgcolor),
                Style(bgcolor=self.get_component_rich_style("line-table--cursor").bgcolor),
            )
        return self._line_style_cache

    def _line(
        self, cells: Sequence[Cell], pre: Style, post: Style | None, width: int, sig: tuple | None = None
    ) -> Strip:
        # Cells are rendered once per look and column: in a row that changed,
        # most cells (PID, RSS, state...) did not.
        cache = self._cell_cache
        if len(cache) > CELL_CACHE_MAX:
            cache.clear()
        segments: list[Segment] = []
        for i, (column, cell) in enumerate(zip(self.columns, cells)):
            key = (i, column.width, column.justify, sig[i] if sig is not None else cell_sig(cell))
            rendered = cache.get(key)
            if rendered is None:
                rendered = cache[key] = self._render_cell(cell, column)
            segments += rendered
        return Strip(list(Segment.apply_style(segments, pre, post))).crop_extend(0, width, pre)

    def _render_cell(self, cell: Cell, column: Column) -> list[Segment]:
        console = self.app.console
        blank = Segment(" " * PAD)
        if not isinstance(cell, Text):
            runs: Runs = ((cell, ""),) if isinstance(cell, str) else cell
            used = sum(cell_len(text) for text, _ in runs)
            if used <= column.width and "\n" not in "".join(text for text, _ in runs):
                gap = Segment(" " * (column.width - used))
                body = [
                    Segment(text, console.get_style(style) if style else None) for text, style in runs if text
                ]
                if column.justify == "right":
                    return [blank, gap, *body, blank]
                return [blank, *body, gap, blank]
            cell = as_text(cell)  # too wide: cut with an ellipsis like any Text
        line = Text(" " * PAD, no_wrap=True, end="")
        line.append_text(fit(cell, column.width, column.justify))
        line.append(" " * PAD)
        return list(line.render(console))

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        base, header, stripe, cursor = self._line_styles()
        if y == 0:
            key = (width, tuple((c.label, c.width) for c in self.columns))
            if self._header is None or self._header[0] != key:
                labels = [Text(c.label, justify=c.justify) for c in self.columns]
                self._header = (key, self._line(labels, base + header, None, width))
            return self._header[1]
        index = int(self.scroll_y) + y - 1
        if not 0 <= index < len(self._rows):
            return Strip.blank(width, base)
        row = self._rows[index]
        is_cursor = index == self._cursor
        striped = self.zebra and index % 2 == 0
        row_key = (width, is_cursor, striped)
        if row.strip is None or row.strip_key != row_key:
            pre = base + stripe if striped else base
            post = cursor if is_cursor else None
            row.strip = self._line(row.cells, pre, post, width, row.sig)
            row.strip_key = row_key
            self.strips_built += 1
        return row.strip
