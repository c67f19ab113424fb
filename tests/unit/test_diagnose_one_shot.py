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
from tests.unit.test_diagnose_rules import T0, job, loader, snap
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


def _stalled_at_start_up(t):
    """A job whose loader stalled on its second batch: its rates never
    settle, so the diagnosis would hold it as judging forever."""
    from tests.unit.test_hang import IO_WORKER, _stalled_job

    return snap([_stalled_job([IO_WORKER], batches=2, epoch=1, steady_history=False)], t=t)


def test_a_loader_stalled_at_start_up_is_judged_by_its_critical_hint():
    """One state per loader (issue 42): never "judging…" beside the critical
    loader-stalled of the same loader, in the diagnosis itself."""
    diag = Diagnoser()
    for k in range(4):
        hints = diag.update(_stalled_at_start_up(T0 + k))
        assert [h["id"] for h in hints] == ["loader-stalled"], k
        assert diag.judging() == [], k


def test_a_box_warning_does_not_judge_a_warming_loader():
    # A loader in its warm-up (5 of its 20 batches) on a box short of
    # /dev/shm: the box's warning says nothing about the loader's rates.
    diag = Diagnoser()
    for k in range(8):
        ld = loader(nw=2, wait=0.05, step_ms=60.0, batches=5, epoch=1, steady_history=False)
        ld["batch_bytes"] = 100 << 20
        j = job(loaders=[ld])
        hints = diag.update(snap([j], t=T0 + k, shm_free=64 << 20))
    assert [(h["id"], h["loader_id"]) for h in hints] == [("shm-low", None)]
    assert [(e["job_pid"], e["loader_id"]) for e in diag.judging()] == [(j["pid"], 0)]


def test_the_collectors_reuse_path_keeps_the_diagnosis_one_state(ticking, monkeypatch):
    m = ticking()
    snap0 = m.build(3.0)
    monkeypatch.setattr(M, "DIAGNOSE_EVERY_S", 60.0)
    again = m.build(3.0, reuse_procs=True)
    assert again["hints"] is snap0["hints"]  # the reuse path indeed
    assert again["judging"] == snap0["judging"]


def test_a_job_that_ends_while_a_snapshot_watches_it_says_so():
    """A QA run killed a worker during `dlwatch snapshot`'s watch: it printed
    the job "[live]", "judging…" and nothing of the death. The last live
    figures stay; the state, its reason and the reported deaths come along."""
    from dlwatch.collect.monitor import ended_while_watched

    death = {"id": 0, "pid": 16607, "signal": 9, "exit_code": None, "exception": None, "t": 1.0}
    snap = {
        "jobs": [
            {
                "pid": 1,
                "state": "live",
                "state_reason": "",
                "loaders": [{"id": 0, "data_wait_fraction": 0.49}],
            },
            {
                "pid": 2,
                "state": "live",
                "state_reason": "",
                "loaders": [{"id": 0, "data_wait_fraction": 0.1}],
            },
        ],
        "judging": [{"job_pid": 1, "loader_id": 0}, {"job_pid": 2, "loader_id": 0}],
    }
    later = {
        "jobs": [
            {
                "pid": 1,
                "state": "exited",
                "state_reason": "the process has exited",
                "loaders": [{"id": 0, "data_wait_fraction": None, "worker_deaths": [death]}],
            },
            {"pid": 2, "state": "live", "state_reason": "", "loaders": [{"id": 0}]},
        ]
    }
    ended_while_watched(snap, later, {1})
    one, two = snap["jobs"]
    assert one["state"] == "exited" and one["state_reason"] == "the process has exited while it was watched"
    assert one["loaders"][0]["data_wait_fraction"] == 0.49 and one["loaders"][0]["worker_deaths"] == [death]
    assert two["state"] == "live" and "worker_deaths" not in two["loaders"][0]
    assert snap["judging"] == [{"job_pid": 2, "loader_id": 0}]


def test_an_ended_job_is_kept_as_last_seen_while_the_others_are_judged_on():
    from dlwatch.collect.monitor import with_frozen

    last = {"pid": 1, "state": "exited", "state_reason": "the process has exited while it was watched"}
    hint = {"id": "io-bound", "job_pid": 1, "loader_id": 0}
    later = {
        "jobs": [{"pid": 1, "state": "exited", "loaders": []}, {"pid": 2, "state": "live", "loaders": []}],
        "hints": [{"id": "add-workers", "job_pid": 2, "loader_id": 0}, {"id": "x", "job_pid": 1}],
        "judging": [{"job_pid": 1, "loader_id": 0}, {"job_pid": 2, "loader_id": 1}],
    }
    out = with_frozen(later, {1: (last, [hint])})
    assert out["jobs"][0] is last and out["jobs"][1]["pid"] == 2
    assert [h["id"] for h in out["hints"]] == ["add-workers", "io-bound"]
    assert out["judging"] == [{"job_pid": 2, "loader_id": 1}]
    # A job gone from the listing altogether is kept too.
    gone = with_frozen({"jobs": [{"pid": 2}], "hints": [], "judging": []}, {1: (last, [])})
    assert [j["pid"] for j in gone["jobs"]] == [2, 1]


def test_between_epochs_names_re_spawned_workers_only_for_a_dataloader_with_them():
    from dlwatch.diagnose.engine import between_epochs

    def why(**ld):
        snap = {"jobs": [{"pid": 7, "state": "live", "loaders": [dict(id=0, epoch_open=False, **ld)]}]}
        (e,) = between_epochs(snap, frozenset(), set())
        return e["reason"]

    assert "persistent_workers off" in why(num_workers=2, persistent_workers=False)
    # Grain's, nodes' or WebDataset's loaders say no persistent_workers (a QA run).
    assert "persistent_workers" not in why(num_workers=2, persistent_workers=None)
    assert "persistent_workers" not in why(num_workers=0, persistent_workers=False)
