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


def test_the_live_bound_on_cheaper_batches_says_what_it_assumes():
    """Issue 43: live "up to ≈ 1.20×" beside tune's data-free ceiling 5.51×.
    The live figure keeps the step as measured; on a CPU box the step shares
    the cores with the loading, so it says the gain can be larger and what
    measures it. A GPU step's bound is the same kind of figure as tune's."""
    from dlwatch.diagnose import evaluate
    from tests.unit.test_diagnose_rules import cpu_bound_loader, one

    def bound(gpus):
        s = one(cpu_bound_loader(), usable=3.0, gpus=gpus)
        s["jobs"][0]["main_cpu_percent"] = 90.0  # a step computed on the CPU
        (h,) = [h for h in evaluate(s) if h["id"] == "cpu-bound-preprocessing"]
        return h["message"], h["evidence"]

    msg, ev = bound([])
    assert "Cheaper batches could give up to ≈ 2.00× throughput with the step at its present 10 ms" in msg
    assert "share the 3 usable cores" in msg
    assert "dlwatch tune` measures the ceiling with data for free" in msg
    assert "shares the cores" in ev["speedup_if_loading_free_assumes"]
    msg, ev = bound(None)  # the fixture's GPU
    assert "the kind of figure tune's ceiling measures" in msg and "share the" not in msg
    assert ev["speedup_if_loading_free_assumes"].startswith("the step keeps its present time")
