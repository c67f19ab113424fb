"""One story per loader, over every combination of what the worker-count and
core rules look at: the hints of one loader never recommend two counts, never
say "cannot help" beside a predicted gain, never warn about a gain under
10 %, and never advise "lower" to the current count or more. Then the
stability pieces: CPU over the loader's window, and severities that do not
blink."""

from __future__ import annotations

import itertools
import re

import pytest

from dlwatch.diagnose import Diagnoser, evaluate
from dlwatch.diagnose.smoothing import smooth_cpu
from tests.unit.test_diagnose_rules import T0, job, loader, snap, worker

WORKER_COUNT_HINTS = {
    "no-workers",
    "add-workers",
    "io-bound",
    "cpu-bound-preprocessing",
    "pipeline-has-headroom",
}
GAIN = re.compile(r"expected ≈ (\d+\.\d\d)×")

GRID = list(
    itertools.product(
        [0, 1, 2, 4],  # num_workers
        [0.01, 0.08, 0.3, 0.6],  # data wait
        [0.1, 0.95],  # worker busy
        [0.2, 1.0],  # worker CPU share of busy
        [10.0, 100.0, 190.0],  # trainer CPU (all threads), %
        [2.0, 8.0],  # usable cores
        [0.0, 1.0],  # other processes' cores
        [0.0, 30.0],  # run-queue wait of each process, %
    )
)


def case(nw, wait, busy, share, main_cpu, usable, others, rq):
    ws = [
        worker(i, cpu=100.0 * busy * share, busy=busy, fetch_ms=40.0, runqueue_percent=rq) for i in range(nw)
    ]
    ld = loader(nw=nw, wait=wait, step_ms=20.0, workers=ws, worker_ms=40.0 if nw else None, ready=nw * 2)
    j = job(loaders=[ld], main_cpu=main_cpu, main_thread_cpu=min(main_cpu, 90.0), main_runqueue_percent=rq)
    return snap([j], usable=usable, other_cpu_cores=others, gpus=[], gpu_status="n/a: no GPU")


def test_the_grid_covers_every_rule_it_is_about():
    seen = set()
    for c in GRID:
        seen |= {h["id"] for h in evaluate(case(*c))}
    assert WORKER_COUNT_HINTS | {"workers-oversubscribe-cores"} <= seen


@pytest.mark.parametrize("usable", [2.0, 8.0])
def test_one_story_per_loader(usable):
    for c in (c for c in GRID if c[5] == usable):
        nw = c[0]
        hints = evaluate(case(*c))
        mine = [h for h in hints if h["id"] in WORKER_COUNT_HINTS]
        where = f"case {c}: " + " | ".join(f"{h['id']}[{h['severity']}]: {h['message']}" for h in hints)
        # One count: every hint of the loader that names one names the same
        # (a hint that loses the precedence repeats the winner's).
        recs = {h["evidence"].get("recommended_num_workers") for h in mine} - {None}
        for h in hints:
            if h["id"] == "workers-oversubscribe-cores":
                for e in h["evidence"]["recommended_num_workers_by_loader"]:
                    # "Lower" is lower: never the current count or more.
                    assert e["recommended_num_workers"] < nw, where
                    recs.add(e["recommended_num_workers"])
                lowers = bool(h["evidence"]["recommended_num_workers_by_loader"])
                assert (h["severity"] == "warn") == lowers, where
        assert len(recs) <= 1, where
        gains = [h["evidence"].get("expected_speedup") for h in mine]
        helps = any(
            g is not None and g >= 1.10 and h["evidence"].get("recommended_num_workers", -1) > nw
            for g, h in zip(gains, mine)
        )
        for h in mine:
            ev = h["evidence"]
            # Never "cannot help" next to a predicted gain from more workers.
            if "cannot help" in h["message"]:
                assert not helps, where
            # A stated gain is the evidence's, and a warning needs >= 10 %
            # (cpu-bound-preprocessing warns about cheaper batches, its own upside).
            stated = GAIN.findall(h["message"])
            if stated:
                assert stated[0] == f"{ev['expected_speedup']:.2f}", where
            if h["id"] != "cpu-bound-preprocessing" and h["severity"] == "warn" and "defers_to" not in ev:
                assert ev.get("expected_speedup") is None or ev["expected_speedup"] >= 1.10, where
            # No number: says why, and is info (cpu-bound-preprocessing's
            # severity is its cheaper-batches upside, not the worker count).
            if ev.get("no_prediction_reason"):
                assert "cannot" in h["message"], where
                assert h["severity"] == "info" or h["id"] == "cpu-bound-preprocessing", where


def test_a_number_the_measurements_cannot_support_is_info_with_the_reason_and_the_tune_command():
    # Two workers taking 40 ms a batch should deliver one every 20 ms, yet a
    # batch takes 100 ms: what sets the pace is not in the figures (IPC, a lock?).
    ws = [worker(i, cpu=5.0, busy=0.95, fetch_ms=40.0) for i in range(2)]
    ld = loader(nw=2, wait=0.8, step_ms=20.0, wait_ms=80.0, workers=ws, worker_ms=40.0)
    s = snap([job(loaders=[ld], main_cpu=20.0)], usable=8.0, other_cpu_cores=0.0)
    (h,) = [h for h in evaluate(s) if h["id"] == "io-bound"]
    assert h["severity"] == "info" and h["evidence"]["expected_speedup"] is None
    assert "cannot predict the gain" in h["message"] and h["evidence"]["no_prediction_reason"]
    assert "dlwatch tune --workers 2,3 -- python train.py" in h["suggestion"]


def test_a_multithreaded_trainer_gets_no_promise_from_workers():
    # The ImageNet-style figures: 56 % wait at num_workers=0, the step's
    # threads fill both cores: the CPU sum promised 1.40x, the sweep found 1.00x.
    ld = loader(nw=0, wait=0.56, step_ms=70.0, wait_ms=89.0)
    s = snap([job(loaders=[ld], main_cpu=143.0, main_thread_cpu=100.0)], usable=2.0, other_cpu_cores=0.0)
    (h,) = [h for h in evaluate(s) if h["id"] == "no-workers"]
    assert h["severity"] == "info"
    assert h["evidence"]["expected_speedup"] == pytest.approx(1.0, abs=0.05)
    assert "stretches its step" in h["message"]


# --- stability ---------------------------------------------------------------


def test_cpu_of_a_bursty_worker_is_its_mean_over_the_loader_window():
    # A worker that works 120 ms every 0.9 s, sampled once a second: 0, 40, 0, 40 %...
    hist: dict = {}
    seen = []
    for k, cpu in enumerate([0.0, 40.0, 0.0, 40.0, 0.0, 40.0]):
        ld = loader(nw=1, workers=[worker(0, pid=7000, cpu=cpu)], window_s=4.5)
        s = snap([job(loaders=[ld], main_cpu=180.0 + (20 if k % 2 else -20))], t=T0 + k)
        out, hist = smooth_cpu(s, hist, T0 + k)
        seen.append(out["jobs"][0]["loaders"][0]["workers"][0]["cpu_percent"])
        assert s["jobs"][0]["loaders"][0]["workers"][0]["cpu_percent"] == cpu  # input untouched
    # From the second sample on, the mean of the samples within 4.5 s.
    assert seen[0] == 0.0 and seen[1] == 20.0
    assert all(abs(v - 20.0) <= 4.0 for v in seen[3:])
    assert out["jobs"][0]["main_cpu_percent"] == pytest.approx(180.0, abs=5.0)


def _on_off(seq, hid="no-workers"):
    d = Diagnoser()
    shown = []
    for k, (wait, step) in enumerate(seq):
        ld = loader(nw=0, wait=wait, step_ms=step, batches=1000 + 10 * k, window_s=3.0)
        j = job(loaders=[ld], main_cpu=40.0, main_thread_cpu=40.0)
        hints = d.update(snap([j], t=T0 + k, usable=2.0, other_cpu_cores=0.0, gpus=[], gpu_status="n/a"))
        shown.append(next((h["severity"] for h in hints if h["id"] == hid), None))
    return shown


def test_a_warning_does_not_blink_to_info_on_one_window():
    # A free core and 40 % wait: warn. One window at 9 % wait (info) and back.
    steady = [(0.4, 60.0)] * 8
    shown = _on_off(steady + [(0.09, 60.0)] * 2 + steady)
    assert shown[3:] == ["warn"] * (len(shown) - 3)
    # Info ("under 10 % gain": nothing to change) turns the advice's
    # direction: shown once it has lasted past the direction's dwell (direction.py).
    shown = _on_off(steady + [(0.09, 60.0)] * 75)
    assert shown[-1] == "info" and shown[10] == "warn" and shown[50] == "warn"


def test_slow_jobs_hold_their_hints_for_two_of_their_windows():
    d = Diagnoser()
    shown = []
    for k in range(40):
        on = not (20 <= k < 27)  # the condition clears for 7 s: longer than 5 s, shorter than 2 x 4.5 s
        ld = loader(nw=0, wait=0.4 if on else 0.0, step_ms=900.0, batches=1000 + k, window_s=4.5)
        j = job(loaders=[ld], main_cpu=40.0, main_thread_cpu=40.0)
        hints = d.update(snap([j], t=T0 + k, usable=2.0, other_cpu_cores=0.0, gpus=[], gpu_status="n/a"))
        shown.append(any(h["id"] == "no-workers" for h in hints))
    assert all(shown[4:])


def test_a_new_worker_without_a_cpu_figure_takes_its_slots_over_the_window():
    # persistent_workers off, 0.4-0.8 s epochs: each epoch's workers are new
    # processes, n/a for their first 0.2 s. Their slot's predecessors within
    # the window speak for them, so a hint's 3 s hold can hold (a QA run: it
    # never did, and the job got no hint).
    def at(k, pid, cpu):
        ws = [worker(0, pid=pid, cpu=cpu, busy=0.99, runqueue_percent=None if cpu is None else 5.0)]
        return snap([job(loaders=[loader(nw=1, workers=ws, window_s=3.0)])], t=T0 + k)

    hist: dict = {}
    _, hist = smooth_cpu(at(0, 501, 90.0), hist, T0)
    _, hist = smooth_cpu(at(1, 502, 94.0), hist, T0 + 1)
    out, hist = smooth_cpu(at(2, 503, None), hist, T0 + 2)
    w = out["jobs"][0]["loaders"][0]["workers"][0]
    assert w["cpu_percent"] == pytest.approx(92.0) and w["runqueue_percent"] == pytest.approx(5.0)
    # Past the window, the slot's old samples say nothing.
    out, _ = smooth_cpu(at(9, 504, None), hist, T0 + 9)
    assert out["jobs"][0]["loaders"][0]["workers"][0]["cpu_percent"] is None
