"""GPU utilization and memory, or one line saying why there are no figures."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches

from dlwatch.tui import fmt
from dlwatch.tui.keyed import set_static
from dlwatch.tui.sparkline import FixedSparkline
from dlwatch.tui.textline import TextLine

MEM_BAR = 10


def gpu_status_line(snapshot: dict, pal: fmt.Palette) -> Text | None:
    """The single "GPU: n/a: …" line, or None when there are figures to show."""
    status = snapshot.get("gpu_status")
    gpus = [g for g in fmt.lst(snapshot.get("gpus")) if isinstance(g, dict)]
    if status == "ok" and gpus:
        return None
    if status == "ok":
        why = "no GPUs found"
    elif isinstance(status, str) and status:
        why = status
    else:
        why = "n/a"
    return Text.assemble(("GPU: ", "bold"), (why, pal.dim))


def window_util(g: dict) -> float | None:
    """The window's mean utilization (what the hints quote), else the last figure."""
    util = fmt.num(g.get("util_window_percent"))
    return util if util is not None else fmt.num(g.get("util_percent"))


def gpu_summary(g: dict, pal: fmt.Palette, wide: bool) -> Text:
    util = window_util(g)
    used, total = fmt.num(g.get("mem_used_bytes")), fmt.num(g.get("mem_total_bytes"))
    frac = used / total if used is not None and total else None
    t = Text()
    t.append(f"GPU{fmt.count(g.get('index'))} ", "bold")
    if wide:
        t.append(fmt.truncate(fmt.s(g.get("name"), "?"), 24) + " ", pal.dim)
    t.append(f"util {fmt.pct100(util):>5} ")
    lo, hi = fmt.num(g.get("util_window_min_percent")), fmt.num(g.get("util_window_max_percent"))
    if wide and lo is not None and hi is not None and hi - lo >= 10:
        t.append(f"({lo:.0f}-{hi:.0f}) ", pal.dim)
    t.append("mem ")
    t.append_text(fmt.bar(frac, MEM_BAR if wide else 5, pal.accent, pal))
    t.append(f" {fmt.size(used)}/{fmt.size(total)} ")
    return t


class GpuRow(Horizontal):
    def compose(self) -> ComposeResult:
        yield TextLine(classes="gpu-summary")
        yield FixedSparkline(top=100.0, classes="gpu-history")

    def show(self, g: dict, pal: fmt.Palette, wide: bool) -> None:
        set_static(self.query_one(".gpu-summary", TextLine), gpu_summary(g, pal, wide))
        spark = self.query_one(".gpu-history", FixedSparkline)
        spark.set_values(g.get("history"), lambda v: pal.accent, pal)


class GpuPanel(Vertical):
    """One row per GPU (summary + utilization history on a fixed 0–100 %
    scale). Compact layout: all GPUs on one line, no history."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._pending: tuple[dict, fmt.Palette, bool] | None = None
        self._composed = False

    def compose(self) -> ComposeResult:
        yield TextLine(id="gpu-line", classes="line")
        yield Vertical(id="gpu-rows")

    def on_mount(self) -> None:
        self._composed = True
        if self._pending:
            self.show(*self._pending)

    def show(self, snapshot: dict, pal: fmt.Palette, wide: bool) -> None:
        self._pending = (snapshot, pal, wide)
        if not self._composed:
            return
        line = self.query_one("#gpu-line", TextLine)
        rows = self.query_one("#gpu-rows", Vertical)
        status = gpu_status_line(snapshot, pal)
        gpus = [g for g in fmt.lst(snapshot.get("gpus")) if isinstance(g, dict)]
        if status is not None or not wide:
            line.display = True
            rows.display = False
            set_static(line, status if status is not None else self._one_line(gpus, pal))
            return
        line.display = False
        rows.display = True
        existing = list(rows.query_children(GpuRow))
        if len(existing) != len(gpus):
            # GPUs appear or vanish only when NVML comes or goes: rare enough
            # to rebuild; the rows redraw themselves once mounted.
            rows.remove_children()
            new = [GpuRow() for _ in gpus]
            rows.mount_all(new)
            self.call_after_refresh(self._fill, new, gpus, pal, wide)
            return
        self._fill(existing, gpus, pal, wide)

    def _fill(self, rows: list[GpuRow], gpus: list[dict], pal: fmt.Palette, wide: bool) -> None:
        for row, g in zip(rows, gpus):
            try:
                row.show(g, pal, wide)
            except NoMatches:
                # Still mounting: the next call draws it.
                self.call_after_refresh(self._retry)
                return

    def _retry(self) -> None:
        if self._pending and self.is_attached:
            self.show(*self._pending)

    @staticmethod
    def _one_line(gpus: list[Any], pal: fmt.Palette) -> Text:
        parts = []
        for g in gpus:
            util = window_util(g)
            used, total = fmt.num(g.get("mem_used_bytes")), fmt.num(g.get("mem_total_bytes"))
            mem = fmt.pct(used / total) if used is not None and total else fmt.NA
            parts.append(
                Text.assemble(
                    (f"GPU{fmt.count(g.get('index'))} ", "bold"), f"util {fmt.pct100(util)} mem {mem}"
                )
            )
        return fmt.join(parts, pal=pal)
