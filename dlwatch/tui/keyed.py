"""Keyed, in-place updates of a DataTable, and updates of a Static only when
what it shows changed.

Rebuilding a table on every refresh makes it flicker and loses its scroll
position; here rows are matched by key, unchanged cells are left alone, and
only rows that appeared, vanished or moved are added or removed.

Footprint: the display refreshes every 0.5 s while most of what it shows
stays the same. ``DataTable.update_cell`` throws away the render cache of the
whole table and ``Static.update`` lays out the whole screen again, so both are
called only for content that really changed (text *and* styles: rich's own
``Text ==`` ignores the base style, so a recoloured value would be missed).
"""

from __future__ import annotations

from typing import Any, Sequence

from rich.text import Text
from textual.geometry import Size
from textual.widgets import DataTable, Static
from textual.widgets.data_table import ColumnKey, RowKey


def text_key(value: Any) -> Any:
    """What a cell or line looks like, as a comparable value."""
    if isinstance(value, Text):
        return ("Text", value.plain, str(value.style), value.justify, value.overflow,
                value.no_wrap, value.end, tuple((s.start, s.end, str(s.style)) for s in value.spans))
    return value


def same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(text_key(a) == text_key(b))
    except Exception:
        return False


class KeyedTable(DataTable):
    """A DataTable whose ``update_cell`` repaints only the row it changes.

    Textual's ``update_cell`` bumps a table-wide counter that is part of
    every render cache key, so changing one figure renders every cell of the
    table again (most of the display's CPU with a few dozen workers on
    screen). Here the caches that hold the changed cell are trimmed instead:
    the cell, its row's renderables and rendered lines; every other cell
    stays cached. Where the table's internals are not as expected (another
    Textual), it falls back to the stock method.
    """

    _PATCHABLE: bool | None = None

    def _patchable(self) -> bool:
        cls = type(self)
        if cls._PATCHABLE is None:
            need = ("_data", "_row_locations", "_column_locations", "_update_count",
                    "_row_renderable_cache", "_cell_render_cache", "_row_render_cache",
                    "_line_cache")
            cls._PATCHABLE = all(hasattr(self, n) for n in need) and all(
                hasattr(getattr(self, n), m) for n in need[4:] for m in ("keys", "discard", "clear"))
        return bool(cls._PATCHABLE)

    def update_cell(self, row_key: RowKey | str, column_key: ColumnKey | str, value: Any, *,
                    update_width: bool = False) -> None:
        if update_width:
            super().update_cell(row_key, column_key, value, update_width=True)
        else:
            self.update_cells([(row_key, column_key, value)])

    def update_cells(self, changes: Sequence[tuple[RowKey | str, ColumnKey | str, Any]]) -> None:
        """Set several cells, then drop the renders that showed them in one pass."""
        keyed = [(RowKey(r) if isinstance(r, str) else r, ColumnKey(c) if isinstance(c, str) else c, v)
                 for r, c, v in changes]
        if not keyed:
            return
        if not self._patchable() or any(r not in self._row_locations or c not in self._column_locations
                                         for r, c, _ in keyed):
            for r, c, v in keyed:
                DataTable.update_cell(self, r, c, v)
            return
        try:
            rows: dict[RowKey, int] = {}
            cells: set[tuple[RowKey, ColumnKey]] = set()
            for r, c, v in keyed:
                self._data[r][c] = v
                rows[r] = self._row_locations.get(r)
                cells.add((r, c))
            for index in rows.values():
                self._row_renderable_cache.discard((self._update_count, index))
            for key in [k for k in self._cell_render_cache.keys() if (k[0], k[1]) in cells]:
                self._cell_render_cache.discard(key)
            for key in [k for k in self._row_render_cache.keys() if k[0] in rows]:
                self._row_render_cache.discard(key)
            # Lines are keyed by screen row; rebuilding them from cached cells is cheap.
            self._line_cache.clear()
        except Exception:
            type(self)._PATCHABLE = False
            for r, c, v in keyed:
                DataTable.update_cell(self, r, c, v)
            return
        for index in rows.values():
            if index is not None:
                self.refresh_row(index)


def sync_rows(table: DataTable, columns: Sequence[str], rows: Sequence[tuple[str, Sequence[Any]]]) -> None:
    """Make ``table`` show ``rows`` (key, cells) in that order.

    Rows whose key is already at the right position are updated cell by cell,
    and only the cells that look different. From the first position where the
    order differs, the remaining rows are removed and re-added; in practice
    that is the tail (a new worker, a new job), so the top of the table never
    moves.
    """
    wanted = [key for key, _ in rows]
    current = [row.key.value for row in table.ordered_rows]
    keep = 0
    while keep < min(len(wanted), len(current)) and wanted[keep] == current[keep]:
        keep += 1
    for key in current[keep:]:
        table.remove_row(key)
    changes = []
    for i, (key, cells) in enumerate(rows):
        if i < keep:
            old = table.get_row(key)
            changes += [(key, col, new) for col, new, prev in zip(columns, cells, old)
                        if not same(new, prev)]
    if isinstance(table, KeyedTable):
        table.update_cells(changes)
    else:
        for key, col, new in changes:
            table.update_cell(key, col, new)
    for key, cells in rows[keep:]:
        table.add_row(*cells, key=key)


_SHOWN = "_dlwatch_shown"
_ANY = Size(0, 0)


def set_static(widget: Static, content: Any) -> bool:
    """``widget.update(content)`` unless it already shows exactly that.

    A changed content is repainted; a new layout of the screen (which
    repaints much more) is asked for only when the widget's size depends on
    its content and the new content needs another size (more wrapped lines,
    a wider auto-width label). Returns whether it updated.
    """
    key = text_key(content)
    if getattr(widget, _SHOWN, None) == key:
        return False
    widget.update(content, layout=False)
    setattr(widget, _SHOWN, key)
    if _needs_layout(widget):
        widget.refresh(layout=True)
    return True


def _needs_layout(widget: Static) -> bool:
    try:
        if any(not node.display for node in widget.ancestors_with_self):
            # Hidden (by CSS, e.g. the compact layout, or with its panel):
            # showing it again lays it out anyway.
            return False
        size = widget.content_size
        if not widget.is_mounted or size.width <= 0 or size.height <= 0:
            return True  # not laid out yet, or empty until now
        styles = widget.styles
        width, height = styles.width, styles.height
        if width is not None and width.is_auto:
            if widget.get_content_width(_ANY, _ANY) != size.width:
                return True
        if height is None or height.is_auto:
            if widget.get_content_height(_ANY, _ANY, size.width) != size.height:
                return True
        return False
    except Exception:
        return True
