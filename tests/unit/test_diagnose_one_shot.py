"""A one-shot snapshot judges its hints as the live view does (issue 43), and
a loader is in one state at a time: judging, or its hints (issue 42).

The recorded job stream of test_snapshot_contract is fed to a real Monitor
with the real diagnosis; only the clock is the test's, one second a build
(the live loop's diagnosis cadence), so no test waits for wall time."""

from __future__ import annotations

import itertools

import pytest

from dlwatch.cli.text import render_snapshot
from dlwatch.collect import monitor as M
from dlwatch.diagnose import HOLD_ON_S, Diagnoser, evaluate
from tests.unit.test_snapshot_contract import T_BUILD, recorded_monitor


@pytest.fixture
def ticking(monkeypatch):
    """A recorded monitor with the stateful diagnosis whose clock moves one
    second per build, and no wait between builds."""
    monkeypatch.setattr(M, "DIAGNOSE_EVERY_S", 0.0)

    def make(diagnoser=None):
        ticks = itertools.count()
        m = recorded_monitor(diagnoser=diagnoser or Diagnoser())
        m.clock = lambda: T_BUILD + next(ticks)
        return m

    return make


def test_a_one_shot_shows_no_hint_the_live_view_would_not(ticking):
    m = ticking()
    snap = m.judge_now(3.0, settle_s=0.0, judge_s=0.0)
    # The stateless judgement of this one measurement has a hint ...
    assert [h["id"] for h in evaluate(snap)] == ["io-bound"]
    # ... which the live view shows only once it held: not yet, and said so.
    assert snap["hints"] == []
    assert [(e["job_pid"], e["loader_id"]) for e in snap["judging"]] == [(2929, 0)]
    assert snap["judged_s"] is not None
    out = render_snapshot(dict(snap))
    assert "judged on" in out and "not long enough for these loaders: the live view too waits" in out
    assert "hints: none yet" in out and "io-bound" not in out


def test_a_one_shot_that_watches_long_enough_gives_the_live_views_hints(ticking):
    m = ticking()
    snap = m.judge_now(3.0, settle_s=0.0, judge_s=10.0)
    assert snap["judging"] == [] and "judged on" not in render_snapshot(dict(snap))
    # The live view over the same snapshots: the collector's loop, one build a second.
    live = ticking()
    seen = [live.build(3.0) for _ in range(int(snap["time"] - T_BUILD) + 1)]
    assert seen[-1]["time"] == snap["time"]
    assert snap["hints"] == seen[-1]["hints"] and [h["id"] for h in snap["hints"]] == ["io-bound"]
    # It stopped as soon as the loader was judged: the hold, not the cap.
    assert snap["time"] - T_BUILD <= HOLD_ON_S + 2


class CriticalWhileJudging:
    """A diagnosis that holds a loader as judging while it shows a critical
    hint of the same loader (the never-steady loader of a hang at start-up)."""

    def __init__(self, hint_loader):
        self.hint_loader = hint_loader

    def update(self, snapshot):
        return [
            {
                "id": "loader-stalled",
                "severity": "critical",
                "job_pid": 2929,
                "loader_id": self.hint_loader,
                "message": "stalled",
                "suggestion": "look",
                "evidence": {},
            }
        ]

    def judging(self):
        return [{"job_pid": 2929, "loader_id": 0, "judging_s": 4.0, "reason": "3 of the 20 batches"}]


@pytest.mark.parametrize("hint_loader", [0, None])
def test_judging_never_stands_beside_a_critical_hint_of_its_loader(ticking, hint_loader, monkeypatch):
    m = ticking(CriticalWhileJudging(hint_loader))
    snap = m.build(3.0)
    assert snap["hints"] and snap["judging"] == []
    # The collector's between-diagnoses path (hints reused) says the same.
    monkeypatch.setattr(M, "DIAGNOSE_EVERY_S", 60.0)
    again = m.build(3.0, reuse_procs=True)
    assert again["hints"] is snap["hints"]  # the reuse path indeed
    assert again["hints"] and again["judging"] == []
    assert "judging…" not in render_snapshot(dict(again))


def test_one_state_keeps_the_judging_of_loaders_no_hint_speaks_about():
    judging = [
        {"job_pid": 1, "loader_id": 0, "judging_s": 1.0, "reason": "r"},
        {"job_pid": 1, "loader_id": 1, "judging_s": 1.0, "reason": "r"},
        {"job_pid": 2, "loader_id": 0, "judging_s": 1.0, "reason": "r"},
    ]
    hints = [
        {"id": "worker-memory-growth", "severity": "warn", "job_pid": 1, "loader_id": 1},
        # A job-level warning does not judge its loaders' rates; a host hint neither.
        {"id": "main-loop-cpu-bound", "severity": "warn", "job_pid": 2, "loader_id": None},
        {"id": "shm-low", "severity": "warn", "job_pid": None, "loader_id": None},
    ]
    assert [(e["job_pid"], e["loader_id"]) for e in M.one_state(judging, hints)] == [(1, 0), (2, 0)]
    crit = [{"id": "x", "severity": "critical", "job_pid": 2, "loader_id": None}]
    assert [(e["job_pid"], e["loader_id"]) for e in M.one_state(judging, crit)] == [(1, 0), (1, 1)]
