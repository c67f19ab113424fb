"""Per-worker table of one loader, updated in place by key."""

from __future__ import annotations

from typing import Any

from dlwatch.tui import fmt
from dlwatch.tui.linetable import Column, LineTable

CPU_BAR = 5


def worker_key(w: dict, index: int) -> str:
    # id alone would keep a respawned worker's row; pid makes the new process
    # a new row in the same (sorted-by-id) place.
    return f"w:{w.get('id', '?')}:{w.get('pid', index)}"


def worker_sort_key(item: tuple[int, dict]) -> tuple:
    index, w = item
    wid = fmt.intval(w.get("id"))
    return (wid is None, wid if wid is not None else index, index)


class WorkersTable(LineTable):
    # Fixed widths: the table fits 80 columns and never jitters as figures change.
    COLUMNS = (
        ("id", "id", 2),
        ("pid", "PID", 7),
        ("cpu", "CPU", CPU_BAR + 6),
        ("busy", "busy", 5),
        ("fetch", "fetch", 7),
        ("rss", "RSS", 7),
        ("uss", "USS", 7),
        ("threads", "thr", 3),
        ("state", "state", 9),
    )

    def __init__(self, **kwargs) -> None:
        super().__init__(
            [
                Column(key, label, width, "left" if key in ("cpu", "state") else "right")
                for key, label, width in self.COLUMNS
            ],
            zebra=True,
            **kwargs,
        )

    def show(self, workers: Any, pal: fmt.Palette) -> None:
        items = sorted(
            ((i, w) for i, w in enumerate(fmt.lst(workers)) if isinstance(w, dict)), key=worker_sort_key
        )
        self.set_rows([(worker_key(w, i), self._cells(w, pal)) for i, w in items])

    @staticmethod
    def _cells(w: dict, pal: fmt.Palette) -> list:
        # Plain strings and (text, style) runs: see linetable.Cell.
        cpu = fmt.num(w.get("cpu_percent"))
        cpu_cell = fmt.bar_runs(None if cpu is None else cpu / 100, CPU_BAR, pal.accent, pal) + (
            (f"{fmt.pct100(cpu):>6}", ""),
        )
        state = fmt.s(w.get("state"), fmt.NA)
        error = fmt.s(w.get("error"))
        state_style = pal.dim if state == "gone" else (pal.warn if error else "")
        return [
            fmt.count(w.get("id")),
            fmt.count(w.get("pid")),
            cpu_cell,
            fmt.pct(w.get("busy_fraction")),
            fmt.ms(w.get("fetch_ms_mean")),
            fmt.size(w.get("rss_bytes")),
            fmt.size(w.get("uss_bytes")),
            fmt.count(w.get("threads")),
            ((("! " if error else "") + state, state_style),),
        ]
