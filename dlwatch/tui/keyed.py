"""Keyed, in-place updates of a DataTable.

Rebuilding a table on every refresh makes it flicker and loses its scroll
position; here rows are matched by key, unchanged cells are left alone, and
only rows that appeared, vanished or moved are added or removed.
"""

from __future__ import annotations

from typing import Any, Sequence

from textual.widgets import DataTable


def sync_rows(table: DataTable, columns: Sequence[str], rows: Sequence[tuple[str, Sequence[Any]]]) -> None:
    """Make ``table`` show ``rows`` (key, cells) in that order.

    Rows whose key is already at the right position are updated cell by cell.
    From the first position where the order differs, the remaining rows are
    removed and re-added; in practice that is the tail (a new worker, a new
    job), so the top of the table never moves.
    """
    wanted = [key for key, _ in rows]
    current = [row.key.value for row in table.ordered_rows]
    keep = 0
    while keep < min(len(wanted), len(current)) and wanted[keep] == current[keep]:
        keep += 1
    for key in current[keep:]:
        table.remove_row(key)
    for i, (key, cells) in enumerate(rows):
        if i < keep:
            old = table.get_row(key)
            for col, new, prev in zip(columns, cells, old):
                if new != prev:
                    table.update_cell(key, col, new)
        else:
            table.add_row(*cells, key=key)
