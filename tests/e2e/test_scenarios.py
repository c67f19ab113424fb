"""Every CPU-reproducible hint, proven on a real job: each demo scenario runs
as a real training process, the real Monitor (with the hysteresis the TUI
uses) watches it, and its hint must appear while no other warn-level hint
does. The healthy scenario raises none."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from dlwatch.collect.monitor import Monitor
from dlwatch.demo.scenarios.catalog import SCENARIOS
from tests.e2e_util import short_tmpdir

pytestmark = pytest.mark.slow

# Hints a CPU-only machine can produce; the GPU rules have their own tests.
CPU_SCENARIOS = [
    n for n, s in SCENARIOS.items() if s.hint not in (None, "enable-pin-memory", "main-loop-cpu-bound")
]
# How long to watch before giving up: warm-up (3 s) + hold (3 s) + margin; the
# memory-growth rule needs a minute of USS samples by design.
PATIENCE_S = {"worker-memory-growth": 110.0, "enable-persistent-workers": 60.0}
DEFAULT_PATIENCE_S = 45.0


def start_scenario(name: str, d: str, *extra: str) -> subprocess.Popen:
    env = dict(os.environ, DLWATCH_DIR=d)
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlwatch.demo.train",
            "--scenario",
            name,
            "--quiet",
            "--hook",
            "--device",
            "cpu",
            "--duration",
            "300",
            *extra,
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def watch(d: str, pid: int, until_hint: str | None, patience: float, linger: float = 4.0):
    """Follow the job with the live Monitor; return (hints seen by id, last snapshot)."""
    m = Monitor(directory=d, interval=0.5)
    m.start()
    seen: dict[str, dict] = {}
    snap = None
    found_at = None
    end = time.monotonic() + patience
    try:
        while time.monotonic() < end:
            time.sleep(0.5)
            snap = m.latest()
            if not snap:
                continue
            for h in snap["hints"]:
                if h.get("job_pid") in (pid, None):
                    seen.setdefault(h["id"], h)
            if until_hint and until_hint in seen and found_at is None:
                found_at = time.monotonic()
                end = min(end, found_at + linger)
    finally:
        m.stop()
    return seen, snap


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


@pytest.mark.parametrize("name", CPU_SCENARIOS + ["healthy"])
def test_scenario_raises_its_hint_and_no_other_warning(name):
    expected = SCENARIOS[name].hint
    d = short_tmpdir()
    p = start_scenario(name, d)
    try:
        seen, snap = watch(
            d, p.pid, expected, PATIENCE_S.get(name, DEFAULT_PATIENCE_S), linger=4.0 if expected else 20.0
        )
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
    finally:
        stop(p)
        shutil.rmtree(d, ignore_errors=True)
    warns = {i for i, h in seen.items() if h["severity"] in ("warn", "critical")}
    if expected is None:
        assert warns == set(), {i: seen[i]["message"] for i in warns}
        return
    assert expected in seen, (
        f"{expected} never shown; seen {sorted(seen)}; last jobs: {snap and snap['jobs']}"
    )
    assert warns - {expected} == set(), {i: seen[i]["message"] for i in warns - {expected}}
    h = seen[expected]
    assert h["message"] and h["suggestion"] and h["evidence"]


def test_add_workers_recommendation_follows_littles_law_and_helps():
    """40 ms of worker time per batch against a 10 ms step: about 4 workers.
    Applying the recommendation must cut the data wait."""
    d = short_tmpdir()
    p = start_scenario("add-workers", d)
    try:
        seen, before = watch(d, p.pid, "add-workers", DEFAULT_PATIENCE_S)
    finally:
        stop(p)
    assert "add-workers" in seen, sorted(seen)
    ev = seen["add-workers"]["evidence"]
    n = ev["recommended_num_workers"]
    # Little's law on the measured figures: ~40 ms of worker time per batch
    # over a ~10 ms step; the loading is CPU-bound, so the recommendation is
    # capped by the free usable cores (2 on the reference box: 2 cores, an
    # idle trainer).
    assert 3 <= ev["little_law_workers"] <= 6, ev
    assert ev["cpu_bound"] is True
    assert 2 <= n <= ev["little_law_workers"], ev
    wait_before = before["jobs"][0]["loaders"][0]["data_wait_fraction"]
    p = start_scenario("add-workers", d, "--num-workers", str(n))
    try:
        _, after = watch(d, p.pid, None, 14.0)
    finally:
        stop(p)
        shutil.rmtree(d, ignore_errors=True)
    wait_after = after["jobs"][0]["loaders"][0]["data_wait_fraction"]
    assert wait_before > 0.4, wait_before
    # One worker per free core: the supply roughly doubles and the wait falls
    # by a large margin (the rest is what no core can give).
    assert wait_after < wait_before - 0.15, (wait_before, wait_after)
