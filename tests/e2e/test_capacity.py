"""Worker-count advice that adds up on a real 2-core box (issue 11).

Each scenario runs the demo as a real training process, watched by the real
Monitor (hysteresis included); where a hint predicts a speed-up, the job is
rerun with the recommended num_workers and its own measured throughput
(the demo's --report, steady part only: the first seconds are cut) must land
within 25 % of before × expected_speedup.

(a) num_workers=0, CPU loading in the loop, a CPU step on 2 intra-op threads:
    the trainer fills the cores itself, so no warn may promise more than 1.3x.
(b) num_workers=0, CPU loading in the loop, a sleeping step: a core is free,
    the prediction is >= 1.5x.
(c) a job beside an unrelated CPU burner: the burner's core is nobody's
    free core.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import psutil
import pytest

from dlwatch.collect.monitor import Monitor
from tests.e2e_util import short_tmpdir

# Each asserts on throughput and free cores: they need the box to themselves.
pytestmark = pytest.mark.timing


# Throughput is measured after this much of a run (worker start-up, the
# first batches and the monitor's warm-up are not the steady state).
SKIP_S = 4.0
RUN_S = 16.0
# The rerun with the recommended count is only timed (no monitor to warm
# up): 7 s of steady state, 100+ batches of the 60 ms steps.
AFTER_S = 11.0
# A watched run whose hint is the check ends this long after the hint first
# showed (it was shown 10.6-12.8 s after the start, a run's 16 s then
# trained on for nothing), with at least MIN_STEADY_S of steady state timed.
HINT_KEPT_S = 2.0
MIN_STEADY_S = 6.0
TOLERANCE = 0.25
A_ARGS = (
    "--num-workers 0 --batch-size 30 --sample-ms 1 --cost-kind cpu "
    "--step-ms 60 --step-kind cpu --step-threads 2"
).split()
B_ARGS = (
    "--num-workers 0 --batch-size 30 --sample-ms 1.3 --cost-kind cpu --step-ms 60 --step-kind sleep".split()
)
C_ARGS = (
    "--num-workers 1 --batch-size 20 --sample-ms 2 --cost-kind cpu --step-ms 10 --step-kind sleep".split()
)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_demo(
    args: list[str], seconds: float = RUN_S, watch: bool = True, until_hint: str | None = None
) -> dict:
    """Run the demo; return its steady throughput, the hints the live
    Monitor showed (last version of each) and the last live snapshot.
    ``until_hint``: stop the run (SIGTERM: the demo ends after its step and
    writes its report) ``HINT_KEPT_S`` after that hint first showed."""
    d = short_tmpdir("dlwcap")
    report = os.path.join(d, "r.json")
    env = dict(os.environ, DLWATCH_DIR=d)
    cmd = [sys.executable, "-m", "dlwatch.demo.train", "--quiet", "--hook", "--device", "cpu"]
    cmd += ["--epochs", "0", "--dataset-size", "1000000", "--duration", str(seconds)]
    cmd += ["--report", report, "--report-interval", "0.5", *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    m = Monitor(directory=d, interval=0.5) if watch else None
    if m is not None:
        m.start()
    hints: dict[str, dict] = {}
    last = None
    # other_cpu_cores over the run: a snapshot taken while a worker exits
    # has none (its CPU over that interval is unknown), so the last one alone
    # may say nothing.
    others: list[float] = []
    early = None
    shown_at = None
    t0 = time.monotonic()
    try:
        while proc.poll() is None:
            time.sleep(0.25)
            now = time.monotonic()
            if shown_at is not None and now - shown_at >= HINT_KEPT_S and now - t0 >= SKIP_S + MIN_STEADY_S:
                proc.terminate()
                proc.wait(timeout=30)
                break
            if early is None and time.monotonic() - t0 >= SKIP_S:
                early = _read(report)
            s = m.latest() if m is not None else None
            if s and s["jobs"] and s["jobs"][0].get("state") == "live":
                last = s
                v = s["host"].get("other_cpu_cores")
                if v is not None:
                    others.append(v)
                for h in s["hints"]:
                    hints[h["id"]] = h
                if shown_at is None and until_hint in hints:
                    shown_at = time.monotonic()
        err = proc.stderr.read().decode()
        assert proc.returncode == 0, err[-2000:]
    finally:
        if m is not None:
            m.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    final = _read(report)
    shutil.rmtree(d, ignore_errors=True)
    assert early is not None and final is not None
    busy = (final["wait_s"] + final["compute_s"]) - (early["wait_s"] + early["compute_s"])
    batches = final["batches"] - early["batches"]
    assert batches >= 10 and busy > 0, (early, final)
    return {"bps": batches / busy, "hints": hints, "snapshot": last, "report": final, "others": others}


def check_prediction(before: dict, hint: dict, args: list[str]) -> tuple[float, float]:
    ev = hint["evidence"]
    # Under the 10 % bar a hint advises no count; the one it weighed is what it priced.
    rec = ev["recommended_num_workers"]
    if rec is None:
        rec = ev.get("considered_num_workers")
    assert rec is not None and ev["expected_speedup"] is not None
    after = run_demo([*args, "--num-workers", str(rec)], seconds=AFTER_S, watch=False)
    measured = after["bps"] / before["bps"]
    predicted = ev["expected_speedup"]
    assert abs(measured / predicted - 1) <= TOLERANCE, (
        f"predicted {predicted:.2f}x, measured {measured:.2f}x "
        f"({before['bps']:.2f} -> {after['bps']:.2f} batches/s with num_workers={rec})"
    )
    return predicted, measured


def _others(run: dict) -> float | None:
    """Other processes' CPU on our cores, the median of the run's live
    snapshots that have the figure."""
    vals = sorted(run["others"])
    return vals[len(vals) // 2] if vals else None


# Scenarios (a) and (b) are about the job's own use of the cores: with other
# work on the box taking more than this, their premise (the trainer fills
# the cores / a core is free) does not hold, and the scheduler's sharing with
# that work, not the job, decides the rerun's speed.
QUIET_OTHERS_CORES = 0.5


def _need_quiet_box(run: dict) -> None:
    others = _others(run)
    if others is None or others > QUIET_OTHERS_CORES:
        pytest.skip(f"needs a quiet box: other processes use {others} cores here (measured by dlwatch)")


@pytest.mark.timeout(180)
def test_a_loop_that_fills_the_cores_gets_no_promise_it_cannot_keep():
    before = run_demo(A_ARGS, until_hint="no-workers")
    _need_quiet_box(before)
    h = before["hints"].get("no-workers")
    assert h is not None, sorted(before["hints"])
    ev = h["evidence"]
    if h["severity"] == "warn":
        assert ev["expected_speedup"] <= 1.3, h["message"]
    # The trainer's threads are counted in full: it wants more than one core
    # (what it got, plus what it waited for on a loaded box).
    acc = ev["cpu_accounting"]
    assert acc["trainer_cpu_cores"] + acc["trainer_runqueue_cores"] > 1.0, acc
    check_prediction(before, h, A_ARGS)


@pytest.mark.timeout(180)
def test_b_a_free_core_gives_the_predicted_gain():
    before = run_demo(B_ARGS, until_hint="no-workers")
    _need_quiet_box(before)
    h = before["hints"].get("no-workers")
    assert h is not None, sorted(before["hints"])
    assert h["evidence"]["expected_speedup"] >= 1.5, h["message"]
    assert h["severity"] == "warn"
    check_prediction(before, h, B_ARGS)


@pytest.mark.timeout(120)
def test_c_a_cpu_burner_core_is_nobodys_free_core():
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        bp = psutil.Process(burner.pid)
        bp.cpu_percent()
        before = run_demo(C_ARGS, seconds=14.0)
        burner_cores = bp.cpu_percent() / 100.0
    finally:
        burner.kill()
        burner.wait()
    snap = before["snapshot"]
    usable = snap["host"]["usable_cores"]
    # The burner shows up as other processes' CPU, not as free.
    others = _others(before)
    assert others is not None and others >= 0.6 * burner_cores, (before["others"], snap["host"], burner_cores)
    for h in before["hints"].values():
        free = h["evidence"].get("free_cores")
        if free is not None:
            assert free <= usable - 0.6 * burner_cores, (h["id"], h["message"])
        assert "the free cores allow 2" not in h["message"]
        if h["id"] == "add-workers":
            ev = h["evidence"]
            n = (
                ev["recommended_num_workers"]
                if ev["recommended_num_workers"] is not None
                else ev["considered_num_workers"]
            )
            assert n <= 1 + round(usable - burner_cores)
