"""Hints never promise more than the ceiling: the loop's pace with data for
free, estimated from the window (1 / (1 − data wait)) or measured by tune."""

from __future__ import annotations

import pytest

from dlwatch.diagnose import ceiling, evaluate
from tests.unit.test_diagnose_capacity import no_workers
from tests.unit.test_diagnose_rules import get


def promise(speedup: float, severity: str = "warn") -> dict:
    return {
        "id": "add-workers", "job_pid": 9, "loader_id": 0, "severity": severity,
        "message": f"Loader 0 waits. Changing it: expected ≈ {speedup:.2f}× throughput (the workers then "
                   "set the pace).",
        "evidence": {"expected_speedup": speedup, "recommended_num_workers": 8},
    }  # fmt: skip


@pytest.mark.parametrize(
    "promised,wait,measured,want,method",
    [
        (3.0, 0.5, None, 2.0, ceiling.ESTIMATE),  # over the estimate: bounded by it
        (1.5, 0.5, None, 1.5, ceiling.ESTIMATE),  # under it: unchanged, the ceiling stated
        (3.0, 0.8, 2.2, 2.2, ceiling.MEASURED),  # a measured ceiling wins over the estimate
        (3.0, None, None, 3.0, None),  # no wait figure: nothing to bound by
    ],
)
def test_expected_speedup_never_exceeds_the_ceiling(promised, wait, measured, want, method):
    h = ceiling.bound(promise(promised), wait, measured)
    ev = h["evidence"]
    assert ev["expected_speedup"] == pytest.approx(want)
    assert ev.get("speedup_ceiling_method") == method
    if want < promised:
        assert ev["expected_speedup_unbounded"] == promised
        assert f"expected ≈ {want:.2f}× throughput (the ceiling" in h["message"]
        assert f"{promised:.2f}×" not in h["message"]


def test_a_ceiling_under_the_worthwhile_gain_makes_the_hint_info():
    h = ceiling.bound(promise(1.5), 0.05)
    assert h["severity"] == "info" and h["evidence"]["expected_speedup"] == pytest.approx(1.05, abs=0.01)


def test_hints_without_a_promise_are_untouched():
    h = {"id": "x", "evidence": {"expected_speedup": None}}
    assert ceiling.bound(h, 0.5) is h


def test_the_engine_states_the_ceiling_of_every_promise():
    # 40 ms loading, 60 ms step, a free core: 1.67x, exactly the ceiling 1 / (1 - 0.4).
    s = no_workers(40.0, 40.0, wait_ms=40.0, step_ms=60.0, usable=2.0, other_cpu_cores=0.0)
    ev = get(evaluate(s), "no-workers")["evidence"]
    assert ev["speedup_ceiling"] == pytest.approx(1 / 0.6, abs=0.01)
    assert ev["speedup_ceiling_method"] == ceiling.ESTIMATE
    assert ev["expected_speedup"] <= ev["speedup_ceiling"]
