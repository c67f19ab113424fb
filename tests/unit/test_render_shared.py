"""One percent format and one evidence renderer for the text, the TUI and the
HTML report: the same figure reads the same everywhere."""

from __future__ import annotations

from dlwatch.cli.text import _pct
from dlwatch.diagnose import format_hints
from dlwatch.record import report
from dlwatch.record.compare import fmt_value
from dlwatch.record.reader import Recording
from dlwatch.record.series import HintSpan, RecordingSeries
from dlwatch.snapshot import percent
from dlwatch.tui import fmt
from dlwatch.tui.hints import hint_detail, hint_text

HINT = {
    "id": "shm-low",
    "severity": "critical",
    "job_pid": None,
    "loader_id": None,
    "message": "low",
    "suggestion": "grow /dev/shm",
    "evidence": {"shm_free_bytes": 10 << 20, "wait_share": 0.62137, "persistent": False, "gone": None},
}


def test_one_percent_format():
    assert percent(0.4213) == "42 %" and percent(0.4213, 1) == "42.1 %" and percent(None) == "n/a"
    assert percent(0.125, None) == "12.5 %"
    assert (
        fmt.pct(0.4213) == _pct(0.4213, 0) == "42 %" and fmt_value(0.4213, "frac") == _pct(0.4213) == "42.1 %"
    )
    assert fmt.pct100(103.0) == fmt_value(103.0, "pct") == report.pct(103.0) == "103 %"
    assert fmt.pct("x") == _pct(float("nan")) == "n/a"


def test_one_evidence_renderer():
    text = format_hints([HINT])
    tui = hint_text(HINT, fmt.DEFAULT_PALETTE, wide=True).plain
    detail = hint_detail(HINT, fmt.DEFAULT_PALETTE).plain
    series = RecordingSeries(Recording(path="r.jsonl"), t0=0.0, interval_s=1.0, times=[0.0, 1.0])
    series.hints.append(
        HintSpan("shm-low", "critical", None, None, 0.0, 1.0, "low", "grow", HINT["evidence"])
    )
    html = "".join(report._hints_section(series))
    for figure in ("shm_free_bytes=10 MiB", "wait_share=0.621", "persistent=no"):
        assert figure in text and figure in tui, figure
        k, v = figure.split("=")
        assert f"{k} = {v}" in detail and f"<dt>{k}</dt><dd>{v}</dd>" in html, figure
    # A figure the rule could not measure: only where every item is listed.
    assert "gone" not in text and "gone" not in tui
    assert "gone = n/a" in detail and "<dt>gone</dt><dd>n/a</dd>" in html
