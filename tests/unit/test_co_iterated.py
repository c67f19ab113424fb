"""Loaders one loop takes from together (zip, FixMatch): the loop's wait is
their sum, and advice on one is priced against the other's workers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dlwatch.collect.co_iterated import describe, loops
from dlwatch.diagnose import evaluate

DATA = Path(__file__).resolve().parent.parent / "data"


def _ld(lid, wait, rate, *, wait_ms=None, thread="MainThread", main=True, **extra):
    return {
        "id": lid,
        "loop_role": "loop",
        "data_wait_fraction": wait,
        # wait / (wait + step) per batch: over the loader's own cycles
        "wait_ms_mean": wait_ms if wait_ms is not None or wait is None else 1000.0 * wait / (rate or 1),
        "batches_per_s": rate,
        "iterated_on": {"thread": thread, "main": main},
        "active": True,
        "epoch_open": True,
        **extra,
    }


def test_loaders_taken_every_step_on_one_thread_are_one_loop():
    # zip(a, b) in a QA run: the loop's own meter read 80.4 %.
    (loop,) = loops([_ld(0, 0.0096, 12.333, wait_ms=0.781), _ld(1, 0.7938, 12.666, wait_ms=62.667)])
    assert loop == {
        "thread": "MainThread",
        "main": True,
        "loaders": [0, 1],
        "shares": [0.0096, 0.7937],
        "data_wait_fraction": 0.8034,
    }
    assert describe(loop) == (
        "loop on thread 'MainThread' takes from loaders 0 and 1: data wait 80.3 % (1.0 % + 79.4 %)"
    )


def test_a_validation_pass_inside_the_loop_counts_for_its_part_of_the_loop_only():
    # Ten validation batches every 30 steps (a QA run, the loop's meter:
    # 64.5 %): the validation loader waits 87 % of its own cycles, but those
    # cycles are a third of the loop's time.
    train = _ld(0, 0.4093, 19.924, wait_ms=20.53)
    val = _ld(1, 0.8656, 6.641, wait_ms=33.64)
    (loop,) = loops([train, val])
    assert loop["shares"] == [0.409, 0.2234] and loop["data_wait_fraction"] == 0.6324


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (_ld(1, 0.5, 12.0, thread="producer", main=False), "another thread"),
        (_ld(1, 0.5, 12.0, loop_role="feeder"), "a feeder's wait is not the loop's"),
        (_ld(1, 0.5, 12.0, active=False), "no iterator now (itertools.cycle's cache, a finished epoch)"),
        (_ld(1, 0.5, 12.0, epoch_open=False), "its epoch ended"),
        (_ld(1, None, 12.0), "no figure"),
        (_ld(1, 0.5, 0.0), "no batches in the window"),
        (_ld(1, 0.5, 12.0, consumer={"thread": "MainThread"}), "a queue's get(): the loop's side already"),
    ],
)
def test_what_the_loop_does_not_take_from_now_is_no_part_of_it(second, why):
    assert loops([_ld(0, 0.3, 10.0), second]) == [], why


def test_a_loader_the_loop_left_with_its_epoch_open_is_set_aside():
    # Lightning's sanity check: 2 validation batches, then training; a run
    # read "loop … takes from loaders 0 and 1" with the sanity loader idle
    # for 46 s (its window stretched back to its 2 batches).
    train = _ld(1, 0.2, 10.0, batches_total=400, last_batch_age_s=0.1)
    sanity = _ld(0, 0.6, 0.043, batches_total=2, last_batch_age_s=46.0, in_next=False)
    assert loops([sanity, train]) == []
    # Not while the loop waits on it, nor before the other has moved on, nor
    # once it has the batches of a window (a validation pass every N steps).
    for kept in (
        dict(sanity, in_next=True),
        dict(sanity, last_batch_age_s=3.0),
        dict(sanity, batches_total=12),
    ):
        assert [lp["loaders"] for lp in loops([kept, train])] == [[0, 1]], kept
    assert [lp["loaders"] for lp in loops([sanity, dict(train, last_batch_age_s=40.0)])] == [[0, 1]]


def test_three_loaders_of_a_multi_task_loop_and_a_cap_at_the_whole():
    (loop,) = loops([_ld(0, 0.5, 10.0), _ld(1, 0.4, 10.0), _ld(2, 0.3, 10.0)])
    assert loop["loaders"] == [0, 1, 2] and loop["data_wait_fraction"] == 1.0


def _real(name: str) -> dict:
    """A snapshot of a real FixMatch-style job (tests/data): a labeled loader
    (20 ms a sample, batch 4) and an unlabeled one (12 ms a sample, batch 8
    in the uneven job, 20 ms and 4 in the equal one), 2 workers each, a 15 ms
    step, next() of each every step; its loops as the collector finds them."""
    snap = json.loads((DATA / name).read_text())
    for j in snap["jobs"]:
        j["loops"] = loops(j["loaders"])
    return snap


@pytest.mark.parametrize(
    ("name", "measured", "gain_is_worth_it"),
    [
        # The QA run set the count the old hint named (6) and measured
        # 20.6 -> 24.2 batches/s: the other loader's workers set the pace.
        ("fixmatch_uneven.snap.json", 1.18, True),
        # Equal loaders: 24.67 -> 24.85 batches/s with 5 workers. The old
        # hint promised 2.40× "(the loop's own step then sets the pace)".
        ("fixmatch_equal.snap.json", 1.01, False),
    ],
)
def test_advice_on_one_loader_is_priced_against_the_other(name, measured, gain_is_worth_it):
    snap = _real(name)
    (job,) = snap["jobs"]
    (loop,) = job["loops"]
    assert sorted(loop["loaders"]) == [0, 1]
    slow = max(job["loaders"], key=lambda ld: ld["data_wait_fraction"])
    (h,) = [h for h in evaluate(snap) if h["loader_id"] == slow["id"] and "expected_speedup" in h["evidence"]]
    other = 1 - slow["id"]
    ev = h["evidence"]
    assert ev["expected_bound"] == f"loader {other}", ev
    assert ev["expected_speedup"] == pytest.approx(measured, abs=0.08), ev
    assert f"the same loop also takes from loader {other}, and waits" in h["message"]
    assert (h["severity"] == "warn") is gain_is_worth_it, h


def test_without_the_other_loader_the_promise_was_the_step_alone():
    # The same snapshot read as if each loader were alone in its loop: the
    # promise the QA run measured short (2.93× for 6 workers; 1.18×).
    snap = _real("fixmatch_uneven.snap.json")
    snap["jobs"][0]["loops"] = []
    slow = max(snap["jobs"][0]["loaders"], key=lambda ld: ld["data_wait_fraction"])
    (h,) = [h for h in evaluate(snap) if h["loader_id"] == slow["id"] and "expected_speedup" in h["evidence"]]
    assert h["evidence"]["expected_speedup"] > 2.5, h["evidence"]


def test_the_views_show_the_loops_wait_above_the_loaders():
    from dlwatch.cli.text import render_snapshot
    from dlwatch.tui import fmt
    from dlwatch.tui.status import job_header

    snap = _real("fixmatch_uneven.snap.json")
    (job,) = snap["jobs"]
    said = describe(job["loops"][0])
    assert said.startswith("loop on thread 'MainThread' takes from loaders 0 and 1: data wait 67.9 %"), said
    lines = render_snapshot(snap).splitlines()
    at = lines.index(f"  {said}")
    assert lines[at + 1].startswith("  loader 0 ("), lines[at : at + 2]
    for wide in (True, False):
        assert said in job_header(job, fmt.Palette(), wide).plain
    job["loops"] = []
    assert "loop on thread" not in render_snapshot(snap) + job_header(job, fmt.Palette(), True).plain


def test_the_job_list_shows_the_loops_wait_not_one_loaders():
    # A tmux run of the zip job: the list said "2 %" (the busier loader's
    # own), the loop waited 80 %.
    from dlwatch.tui.jobs import JobRow, job_wait

    (job,) = _real("fixmatch_uneven.snap.json")["jobs"]
    assert job_wait(job) == job["loops"][0]["data_wait_fraction"] == 0.6789
    assert JobRow("j", "job", [job]).data_wait == 0.6789
    alone = dict(job, loops=[])
    busiest = max(job["loaders"], key=lambda ld: ld["batches_per_s"])
    assert job_wait(alone) == busiest["data_wait_fraction"]
