"""Two recordings side by side: "before/after the fix".

Each recording is reduced to its main loader (the one that moved the most
batches: the training loader; docs/recordings.md says so) and compared on its settings
and its summary figures (``series.summary``). ``compare`` returns plain data;
``text`` renders it for a terminal, ``report.compare_html`` for a file.

``gate`` is the CI verdict on a comparison (``dlwatch compare
--max-regression``): a pure function of the two loaders' figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from dlwatch.record.series import SETTINGS, LoaderSeries, RecordingSeries, summary
from dlwatch.snapshot import as_int, num, percent

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
    ("worker_uss_peak_sum", "workers' USS, largest sum at one time", "bytes", ""),
    ("batches", "batches recorded", "count", ""),
    # The whole recording (what `dlwatch run --record` says it covered, "over
    # N s"), and the part of it in which the main loader was seen: the job's
    # start-up before its first batch is in the first only.
    ("recording_s", "recording (s)", "s", ""),
    ("duration_s", "main loader seen (s)", "s", ""),
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
    figures_a: dict[str, Any] = field(default_factory=dict)  # series.summary of each main loader
    figures_b: dict[str, Any] = field(default_factory=dict)

    @property
    def differing(self) -> list[tuple[str, object, object, bool]]:
        return [s for s in self.settings if s[3]]


def compare(a: RecordingSeries, b: RecordingSeries) -> Comparison:
    la, lb = a.main_loader(), b.main_loader()
    sa, sb = (la.settings if la else {}), (lb.settings if lb else {})
    settings = [(k, sa.get(k), sb.get(k), sa.get(k) != sb.get(k)) for k in SETTINGS if k in sa or k in sb]
    ma = {**(summary(la) if la else {}), "recording_s": round(a.duration_s, 3)}
    mb = {**(summary(lb) if lb else {}), "recording_s": round(b.duration_s, 3)}
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
        ma,
        mb,
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
    rows = [("setting", "A", "B", "B vs A")]
    rows += [
        (k, fmt_value(va, ""), fmt_value(vb, ""), "differs" if d else "same") for k, va, vb, d in c.settings
    ]
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


# ---------------------------------------------------------------- the CI gate


@dataclass(frozen=True)
class Check:
    """One figure of the gate. ``change`` is B relative to A: % of A for a
    throughput (negative: B is slower), points for the data wait."""

    figure: str  # "batches/s", "samples/s", "data wait"
    a: float | None
    b: float | None
    change: float | None
    limit: float  # the largest drop (%) or rise (points) allowed
    failed: bool
    note: str = ""  # why the figure is shown but not judged


@dataclass(frozen=True)
class Verdict:
    checks: tuple[Check, ...]
    problem: str | None = None  # why it cannot judge: the recordings cannot say

    @property
    def failed(self) -> list[Check]:
        return [c for c in self.checks if c.failed]


def gate(
    a: dict[str, Any], b: dict[str, Any], max_regression: float | None, max_wait_increase: float | None = None
) -> Verdict:
    """Did B regress against A? ``a`` and ``b`` are the main loaders' figures
    (``batches_per_s``, ``batch_size``, ``data_wait_mean``).

    Throughput fails when it is more than ``max_regression`` % below A's:
    batches/s, and samples/s (batches/s × batch_size) where both batch sizes
    are known. When the batch sizes differ a batch is not the same work, so
    only samples/s is judged. The data wait fails when its mean rose by more
    than ``max_wait_increase`` points. A figure missing from either side is a
    problem (the gate cannot say), never a pass."""
    checks: list[Check] = []
    if max_regression is not None:
        ra, rb = num(a.get("batches_per_s")), num(b.get("batches_per_s"))
        if ra is None or rb is None:
            side = "A" if ra is None else "B"
            return Verdict(
                (), f"{side} has no throughput figure (its main loader's batch count was not recorded twice)"
            )
        if ra <= 0:
            return Verdict((), "A's main loader moved no batches: it is no baseline")
        ba, bb = _batch_size(a), _batch_size(b)
        differs = ba is not None and bb is not None and ba != bb
        note = f"not judged: batch_size differs (A {ba}, B {bb})" if differs else ""
        checks.append(_drop("batches/s", ra, rb, max_regression, note))
        if ba is not None and bb is not None:
            checks.append(_drop("samples/s", ra * ba, rb * bb, max_regression, ""))
    if max_wait_increase is not None:
        wa, wb = num(a.get("data_wait_mean")), num(b.get("data_wait_mean"))
        if wa is None or wb is None:
            side = "A" if wa is None else "B"
            return Verdict(tuple(checks), f"{side} has no data-wait figure (no batch completed in its lines)")
        rise = (wb - wa) * 100
        checks.append(Check("data wait", wa, wb, rise, max_wait_increase, rise > max_wait_increase))
    return Verdict(tuple(checks))


def _drop(figure: str, va: float, vb: float, limit: float, note: str) -> Check:
    change = (vb - va) / va * 100
    return Check(figure, va, vb, change, limit, not note and change < -limit, note)


def _batch_size(figures: dict[str, Any]) -> int | None:
    bs = as_int(figures.get("batch_size"))
    return bs if bs is not None and bs > 0 else None


def _check_values(c: Check) -> tuple[str, str, str, str]:
    if c.figure == "data wait":
        return (
            fmt_value(c.a, "frac"),
            fmt_value(c.b, "frac"),
            f"{c.change:+.1f} points",
            f"+{c.limit:g} points",
        )
    return (fmt_value(c.a, "rate"), fmt_value(c.b, "rate"), f"{c.change:+.1f} %", f"-{c.limit:g} %")


def reasons(v: Verdict) -> list[str]:
    """Why the gate failed or passed: one sentence per judged figure, the
    failed ones first, each starting FAIL or ok."""
    out = []
    for c in sorted(v.checks, key=lambda c: not c.failed):
        if c.note or c.change is None:  # shown, not judged
            continue
        a, b, _change, _limit = _check_values(c)
        if c.figure == "data wait":
            moved = f"rose {c.change:.1f} points" if c.change >= 0 else f"fell {-c.change:.1f} points"
            allowed = f"{c.limit:g} points allowed"
        else:
            moved = f"is {abs(c.change):.1f} % {'below' if c.change < 0 else 'above'} A's"
            allowed = f"{c.limit:g} % drop allowed"
        if c.failed:
            out.append(f"FAIL: B's {c.figure} {moved} ({a} -> {b}), more than the {allowed}")
        else:
            out.append(f"ok: B's {c.figure} {moved} ({a} -> {b}), within the {allowed}")
    return out


def verdict_text(v: Verdict, c: Comparison) -> str:
    if v.problem:
        return f"gate: cannot judge: {v.problem}"
    lines = [f"gate: {'FAIL' if v.failed else 'pass'} (B's {_key(c.lb)} against A's {_key(c.la)})"]
    rows = [("figure", "A", "B", "change", "limit", "")]
    for ch in v.checks:
        a, b, change, limit = _check_values(ch)
        rows.append((ch.figure, a, b, change, limit, "FAIL" if ch.failed else (ch.note or "ok")))
    lines += ["  " + r for r in _table(rows)]
    return "\n".join(lines + reasons(v))


def as_json(c: Comparison, v: Verdict | None, exit_status: int) -> dict[str, Any]:
    """The comparison (and the gate's verdict, if one was asked for) as one
    JSON document: ``dlwatch compare --json``."""

    def side(rec: RecordingSeries, ls: LoaderSeries | None, figures: dict[str, Any]) -> dict[str, Any]:
        loader = None
        if ls is not None:
            loader = {
                "job_pid": ls.job_pid,
                "loader_id": ls.loader_id,
                "rank": ls.rank,
                "cmdline": ls.cmdline,
            }
        return {
            "path": rec.recording.path,
            "loader": loader,
            "settings": ls.settings if ls else {},
            "figures": figures,
        }

    doc: dict[str, Any] = {
        "a": side(c.a, c.la, c.figures_a),
        "b": side(c.b, c.lb, c.figures_b),
        "settings_differing": [k for k, *_ in c.differing],
        "hints": {"a_only": c.hints_a_only, "b_only": c.hints_b_only, "both": c.hints_both},
        "gate": None,
        "exit_status": exit_status,
    }
    if v is not None:
        doc["gate"] = {
            "result": "error" if v.problem else ("fail" if v.failed else "pass"),
            "problem": v.problem,
            "reasons": reasons(v),
            "checks": [
                {
                    "figure": ch.figure,
                    "a": ch.a,
                    "b": ch.b,
                    "change": ch.change,
                    "unit": "points" if ch.figure == "data wait" else "%",
                    "limit": ch.limit,
                    "failed": ch.failed,
                    "note": ch.note or None,
                }
                for ch in v.checks
            ],
        }
    return doc


def _key(ls: LoaderSeries | None) -> str:
    return ls.key if ls is not None else "no loader"


def judge(c: Comparison, max_regression: float | None, max_wait_increase: float | None) -> Verdict:
    """``gate`` on the comparison's main loaders."""
    fa = dict(c.figures_a, batch_size=c.la.settings.get("batch_size") if c.la else None)
    fb = dict(c.figures_b, batch_size=c.lb.settings.get("batch_size") if c.lb else None)
    return gate(fa, fb, max_regression, max_wait_increase)
