"""Two recordings side by side: "before/after the fix".

Each recording is reduced to its main loader (the one that moved the most
batches: the training loader; README says so) and compared on its settings
and its summary figures (``series.summary``). ``compare`` returns plain data;
``text`` renders it for a terminal, ``report.compare_html`` for a file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dlwatch.record.series import SETTINGS, LoaderSeries, RecordingSeries, summary
from dlwatch.snapshot import percent

# (key, label, unit kind, which direction is better): "+" higher is better,
# "-" lower is better, "" neither.
METRICS = (
    ("batches_per_s", "throughput (batches/s)", "rate", "+"),
    ("data_wait_mean", "data wait, mean", "frac", "-"),
    ("data_wait_p90", "data wait, 90th percentile", "frac", "-"),
    ("step_ms_p50", "step time, median (ms)", "ms", ""),
    ("wait_ms_p50", "wait per batch, median (ms)", "ms", "-"),
    ("worker_busy_mean", "worker busy, mean", "frac", ""),
    ("worker_cpu_mean", "worker CPU, mean (% of a core)", "pct", ""),
    ("worker_uss_last_sum", "workers' USS at the end, sum", "bytes", ""),
    ("batches", "batches recorded", "count", ""),
    ("duration_s", "recorded (s)", "s", ""),
)


@dataclass
class Comparison:
    a: RecordingSeries
    b: RecordingSeries
    la: LoaderSeries | None
    lb: LoaderSeries | None
    settings: list[tuple[str, object, object, bool]]  # (name, A, B, differs)
    metrics: list[tuple[str, str, float | None, float | None, str]]  # (label, kind, A, B, change)
    hints_a_only: list[str]
    hints_b_only: list[str]
    hints_both: list[str]

    @property
    def differing(self) -> list[tuple[str, object, object, bool]]:
        return [s for s in self.settings if s[3]]


def compare(a: RecordingSeries, b: RecordingSeries) -> Comparison:
    la, lb = a.main_loader(), b.main_loader()
    sa, sb = (la.settings if la else {}), (lb.settings if lb else {})
    settings = [(k, sa.get(k), sb.get(k), sa.get(k) != sb.get(k)) for k in SETTINGS if k in sa or k in sb]
    ma = summary(la) if la else {}
    mb = summary(lb) if lb else {}
    metrics = []
    for key, label, kind, _better in METRICS:
        va, vb = ma.get(key), mb.get(key)
        metrics.append((label, kind, va, vb, change(va, vb, kind)))
    ids_a = {h.id for h in a.hints}
    ids_b = {h.id for h in b.hints}
    return Comparison(
        a,
        b,
        la,
        lb,
        settings,
        metrics,
        sorted(ids_a - ids_b),
        sorted(ids_b - ids_a),
        sorted(ids_a & ids_b),
    )


def change(va: float | None, vb: float | None, kind: str) -> str:
    """B relative to A: points for fractions, a ratio for everything else."""
    if va is None or vb is None:
        return "n/a"
    if kind == "frac":
        return f"{(vb - va) * 100:+.1f} points"
    if va == 0:
        return "n/a" if vb == 0 else "new"
    return f"{(vb - va) / abs(va) * 100:+.0f} % (×{vb / va:.2f})"


def fmt_value(v: Any, kind: str) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if not isinstance(v, (int, float)):
        return str(v)
    if kind == "frac":
        return percent(v, 1)
    if kind == "pct":
        return percent(v / 100)
    if kind == "bytes":
        return f"{v / 2**20:.0f} MiB"
    if kind == "rate":
        return f"{v:.2f}"
    if kind in ("ms", "s"):
        return f"{v:.1f}"
    return f"{v:g}"


def text(c: Comparison) -> str:
    lines = [
        f"A: {c.a.recording.path} ({_what(c.la)})",
        f"B: {c.b.recording.path} ({_what(c.lb)})",
        "",
    ]
    rows = [("setting", "A", "B", "")]
    rows += [(k, fmt_value(va, ""), fmt_value(vb, ""), "differs" if d else "") for k, va, vb, d in c.settings]
    lines += _table(rows) + [""]
    rows = [("figure", "A", "B", "change (B vs A)")]
    rows += [(label, fmt_value(va, kind), fmt_value(vb, kind), ch) for label, kind, va, vb, ch in c.metrics]
    lines += _table(rows) + [""]
    lines.append("hints only in A: " + (", ".join(c.hints_a_only) or "none"))
    lines.append("hints only in B: " + (", ".join(c.hints_b_only) or "none"))
    lines.append("hints in both: " + (", ".join(c.hints_both) or "none"))
    return "\n".join(lines)


def _what(ls: LoaderSeries | None) -> str:
    if ls is None:
        return "no loader recorded"
    return f"job {ls.job_pid}, loader {ls.loader_id}: {ls.cmdline[:80]}"


def _table(rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
