"""tune times the settled pace (issue 43): a trial whose pace still rises is
extended (bounded) with the slower start left out, or marked as not
settled, and the reported gain says so. Synthetic step series through the
real TrialMeter, pace() and the sweep's report."""

from __future__ import annotations

import time

import pytest

from dlwatch.tune import measure, report
from dlwatch.tune.measure import TrialMeter, pace
from dlwatch.tune.runner import TrialOutcome
from dlwatch.tune.sweep import Sweep, TuneOptions, speedup_notes

STEP_S = 0.25  # a snapshot every quarter second


def snap(t: float, batches: int, epoch: int, wait: float = 0.5) -> dict:
    ld = {
        "id": 0, "num_workers": 1, "batch_size": 16, "pin_memory": False, "persistent_workers": False,
        "prefetch_factor": 2, "dataset": "ImageFolder", "epoch": epoch, "batches_total": batches,
        "data_wait_fraction": wait, "wait_ms_mean": 200.0, "step_ms_mean": 200.0,
        "window_mono_ns": [None, int(t * 1e9)], "epoch_start_ms": [], "epoch_ms": [],
        "workers": [{"id": 0, "pid": 100, "cpu_percent": 90.0, "busy_fraction": 0.95, "state": "R"}],
    }  # fmt: skip
    job = {"pid": 9, "state": "live", "main_cpu_percent": 20.0, "cmdline": "python t.py", "loaders": [ld]}
    return {"time": 1000.0 + t, "host": {"usable_cores": 2.0}, "jobs": [job], "hints": []}


def run(meter: TrialMeter, rate_at, epoch_batches: int | None = None, until_s: float = 200.0) -> float:
    """Feed ``meter`` a job whose pace at time t is ``rate_at(t)`` batches/s
    (epochs of ``epoch_batches``) until it is done; the job time it took."""
    t, n = 0.0, 0.0
    meter.feed(snap(t, 0, 0))
    while not meter.done:
        t += STEP_S
        n += rate_at(t) * STEP_S
        epoch = int(n) // epoch_batches if epoch_batches else 0
        meter.feed(snap(t, int(n), epoch))
        assert t < until_s, "the trial never ended"
    return t


def cold_first_epoch(t: float) -> float:
    # The run: 2.1 batches/s while the first pass reads from storage,
    # 2.62 once the page cache holds the data (epochs of 60 batches).
    return 2.1 if t < 60 / 2.1 else 2.62


def test_a_baseline_caught_in_a_cold_first_epoch_is_timed_on_the_next():
    m = TrialMeter(trial_s=20.0, warmup_s=2.0, first_epoch=True)
    run(m, cold_first_epoch, epoch_batches=60)
    f = m.figures()
    assert f["batches_per_s"] == pytest.approx(2.62, rel=0.04), f
    assert f["settled"] is True and not f["first_epoch_only"]
    (left,) = f["left_out"]
    assert left["cause"] == "first-epoch" and left["rise"] == pytest.approx(2.62 / 2.1, rel=0.06)
    # Bounded: never more than twice the trial's steady state (and its warm-up).
    assert m.last_t - m.steady_began <= 2 * 20.0 + STEP_S
    assert "left out (the first epoch" in report.table(
        {"trials": [dict(f, index=0, status="ok", settings={})]}
    )


def test_a_trial_that_is_not_the_baseline_does_not_wait_for_its_first_epoch():
    # Later trials read the cache the baseline warmed: their first epoch is
    # no slower, and waiting for it would cost every trial.
    m = TrialMeter(trial_s=20.0, warmup_s=2.0)
    took = run(m, lambda t: 2.62, epoch_batches=60)
    assert took <= 2 + 20.0 + 2 * STEP_S and m.figures()["first_epoch_only"] is True
    assert m.figures()["left_out"] == [] and m.settled is True


def test_a_first_epoch_that_outlasts_the_bound_is_said_so():
    m = TrialMeter(trial_s=10.0, warmup_s=2.0, first_epoch=True)
    run(m, lambda t: 3.0, epoch_batches=10_000)
    f = m.figures()
    assert m.last_t - m.steady_began == pytest.approx(20.0, abs=STEP_S)
    assert f["settled"] is True and f["first_epoch_only"] is True
    assert f["batches_per_s"] == pytest.approx(3.0, rel=0.03)


def test_a_loop_that_does_not_wait_for_data_never_waits_for_its_first_epoch():
    m = TrialMeter(trial_s=10.0, warmup_s=2.0, first_epoch=True)
    t, n = 0.0, 0
    m.feed(snap(t, 0, 0, wait=0.02))
    while not m.done:
        t += STEP_S
        n += 1
        m.feed(snap(t, n, 0, wait=0.02))
    assert t <= 2 + 10.0 + 2 * STEP_S


def test_a_pace_that_climbs_then_holds_is_timed_where_it_holds():
    # 4 -> 10 batches/s over the first 12 s (a cache filling, a JIT warming).
    def ramp(t: float) -> float:
        return 4.0 + 6.0 * min(t, 12.0) / 12.0

    m = TrialMeter(trial_s=10.0, warmup_s=2.0)
    run(m, ramp)
    f = m.figures()
    assert f["settled"] is True and f["left_out"] and f["left_out"][0]["cause"] == "trend"
    assert f["batches_per_s"] == pytest.approx(10.0, rel=0.05), f


def test_a_pace_that_never_stops_rising_ends_at_the_bound_marked_not_settled():
    m = TrialMeter(trial_s=10.0, warmup_s=2.0)
    run(m, lambda t: 6.0 * 1.08**t)  # 8 % faster every second
    f = m.figures()
    assert m.last_t - m.steady_began == pytest.approx(20.0, abs=STEP_S)
    assert f["settled"] is False and f["pace_rise"] > 1 + measure.RISE_TOLERANCE
    assert "not settled" in report.table({"trials": [dict(f, index=0, status="ok", settings={})]})


def test_an_even_pace_with_noise_is_not_extended():
    jitter = [1.0, 1.06, 0.94, 1.03, 0.97]

    def noisy(t: float) -> float:
        return 8.0 * jitter[int(t) % len(jitter)]

    m = TrialMeter(trial_s=10.0, warmup_s=2.0)
    took = run(m, noisy)
    assert took <= 2 + 10.0 + 2 * STEP_S
    assert m.figures()["left_out"] == [] and m.settled is True


def test_an_epoch_start_in_one_half_only_is_the_pace_not_a_rise():
    # A non-persistent loader's epoch start stalls the loop for a second (what
    # persistent_workers saves): a window with one in its first half only
    # must not leave that half out as "slower".
    pts, n = [], 0.0
    for i in range(41):  # 10 s at 10 batches/s, a snapshot every 0.25 s
        t = i * 0.25
        n += 0.0 if 2.0 < t <= 3.0 else 2.5  # the second epoch starts at 2 s, with its stall
        pts.append(point(t, int(n), 0 if t <= 2.0 else 1))
    assert pace(pts).state == "settled"
    # The same window without the epoch start: a rise.
    flat = [point(p.t, p.batches, 0) for p in pts]
    assert pace(flat).state == "rising"


def point(t: float, batches: int, epoch: int) -> measure._Point:
    return measure._Point(t, None, batches, epoch, None, None, None, None, None, None, 0.0)


def test_pace_does_not_compare_parts_too_short_to_tell_from_noise():
    pts = [
        measure._Point(float(i), None, i, 0, None, None, None, None, None, None, 0.0) for i in range(0, 12)
    ]
    pts[-1].batches = 30  # a jump, but the parts hold under PART_MIN_BATCHES each
    assert pace(pts).state == "short"


def fake_runner(rates: dict, baseline: dict):
    def run_(cmd, env, override, trial_s, loader_id=None, warmup_s=None, on_progress=None, first_epoch=False):
        nw = (override or {}).get("num_workers", 1)
        loader = {"dataset": "DS", "batch_size": 8, "num_workers": nw, "prefetch_factor": 2,
                  "pin_memory": False, "persistent_workers": False}  # fmt: skip
        fig = {
            "loader_id": 0, "loader": loader, "batches_per_s": rates[nw], "samples_per_s": rates[nw] * 8,
            "data_wait_fraction": 0.4, "worker_cpu_share_of_busy": 0.9, "worker_ms_per_batch": 400.0,
            "step_ms_mean": 200.0, "wait_ms_mean": 150.0, "usable_cores": 2.0, "cpu_cores": 1.5,
            "loaders_seen": [{"id": 0, "dataset": "DS", "batch_size": 8, "num_workers": nw}],
            "hint_speedups": {}, "replay": None, "settled": True, "first_epoch_only": False, "left_out": [],
        }  # fmt: skip
        if first_epoch:
            fig.update(baseline)
        return TrialOutcome("ok", fig, elapsed_s=1.0)

    return run_


@pytest.mark.parametrize(
    "baseline, said",
    [
        ({"settled": False, "pace_rise": 1.2}, "the baseline's pace was still rising"),
        ({"first_epoch_only": True}, "part of the gain is the cache"),
        ({}, None),
    ],
)
def test_the_reported_gain_says_when_the_baseline_had_not_settled(baseline, said):
    sweep = Sweep(
        ["python", "t.py"],
        {},
        TuneOptions(max_trials=2, ceiling=False),
        runner=fake_runner({1: 2.1, 2: 2.6}, baseline),
    )
    doc = sweep.run()
    assert doc["speedup"] == pytest.approx(2.6 / 2.1, rel=0.01)
    text = report.summary(doc)
    if said is None:
        assert doc["speedup_notes"] == [] and "gain" not in text
    else:
        assert any(said in n for n in doc["speedup_notes"]) and said in text


def test_a_baseline_repeated_past_its_first_epoch_answers_the_cold_cache_doubt():
    """A QA run of timm's train.py: the baseline's settings measured again
    later (warm) at the same pace, and the cold-cache note still stood."""
    base = {"settings": {"num_workers": 1}, "first_epoch_only": True, "status": "ok"}
    warm = {"settings": {"num_workers": 1}, "first_epoch_only": False, "status": "ok"}
    assert speedup_notes(base, None, [base]) and "the cache" in speedup_notes(base, None, [base])[0]
    assert speedup_notes(base, None, [base, warm]) == []


def test_a_baseline_that_read_nothing_from_storage_paid_no_cold_cache():
    """A QA run: the cold-cache note beside a dataset generated in memory.
    The trial's storage reads (/proc/PID/io of the job's processes) say."""
    base = {"settings": {"num_workers": 0}, "first_epoch_only": True, "status": "ok"}
    assert speedup_notes(dict(base, storage_read_bytes=4096), None, [base]) == []
    said = speedup_notes(dict(base, storage_read_bytes=300 << 20), None, [base])
    assert said and "a cold page cache (it read 300 MiB from storage)" in said[0], said
    assert "cold page cache, later" in speedup_notes(dict(base, storage_read_bytes=None), None, [base])[0]


def test_a_trials_process_group_storage_reads_are_measured():
    import subprocess
    import sys

    from dlwatch.tune.runner import _GroupCpu

    # A child that reads a file it wrote with O_DIRECT-free I/O would hit the
    # page cache; what is checked is that the figure is read and is a delta.
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"], start_new_session=True)
    try:
        g = _GroupCpu()
        g.sample(p.pid)
        time.sleep(0.6)
        g.sample(p.pid)
        assert g.storage_read_bytes is not None and 0 <= g.storage_read_bytes < (1 << 20)
    finally:
        p.kill()
        p.wait()
