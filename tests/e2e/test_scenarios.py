"""Every CPU-reproducible hint, proven on a real job: each demo scenario runs
as a real training process, the real Monitor (with the hysteresis the TUI
uses) watches it, and its hint must appear while no other warn-level hint
does. The healthy scenario raises none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from dlwatch.collect.monitor import Monitor
from dlwatch.demo.scenarios.catalog import SCENARIOS
from tests.e2e_util import short_tmpdir

# Hints a CPU-only machine can produce; the GPU rules have their own tests.
CPU_SCENARIOS = [
    n for n, s in SCENARIOS.items() if s.hint not in (None, "enable-pin-memory", "main-loop-cpu-bound")
]
# How long to watch before giving up: warm-up (3 s) + hold (3 s) + margin;
# the persistent-workers rule needs several epochs by design (the
# memory-growth rule's minute of USS samples: test_record.py).
PATIENCE_S = {"enable-persistent-workers": 60.0}
DEFAULT_PATIENCE_S = 45.0
# The healthy job has nothing to find: it is watched until its loader has
# been judged (the other scenarios' warnings show as theirs are, 11-14 s
# after start on a quiet box) and then for HEALTHY_AFTER_S more, past the
# hold any hint would take to show; at most HEALTHY_WATCH_S in all.
HEALTHY_WATCH_S = 30.0
HEALTHY_AFTER_S = 8.0


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


# How much longer than its patience a ``watch(from_training=True)`` waits
# for the job's training to start.
STARTUP_CAP_S = 30.0


def watch(
    d: str,
    pid: int | None,
    until_hint: str | None,
    patience: float,
    linger: float = 3.0,
    story: dict | None = None,
    from_training: bool = False,
):
    """Follow the job with the live Monitor (``pid`` None: the only job in
    ``d``); return (hints seen by id, last snapshot). ``story``, if given,
    gets ``found_s`` (seconds from the start of the watch to ``until_hint``,
    or with none to the loaders' judgement) and ``dropped`` (times after
    that when it was not shown: the screen must keep saying it).
    ``from_training``: ``patience`` counts from the first snapshot that lists
    the job's loader (its training started), not from the call: a job whose
    check needs a span of its own training gets it however long it took to
    start (up to ``STARTUP_CAP_S`` more)."""
    m = Monitor(directory=d, interval=0.5)
    m.start()
    seen: dict[str, dict] = {}
    snap = None
    found_at = None
    start = time.monotonic()
    dropped: list[float] = []
    end = start + patience + (STARTUP_CAP_S if from_training else 0.0)
    try:
        while time.monotonic() < end:
            time.sleep(0.5)
            snap = m.latest()
            if not snap:
                continue
            if from_training and any(j["loaders"] for j in snap["jobs"] if pid is None or j["pid"] == pid):
                from_training = False
                end = min(end, time.monotonic() + patience)
            mine = [h for h in snap["hints"] if pid is None or h.get("job_pid") in (pid, None)]
            now = {h["id"] for h in mine}
            for h in mine:
                seen.setdefault(h["id"], h)
            if until_hint and found_at is not None and until_hint not in now:
                dropped.append(time.monotonic() - start)
            if until_hint and until_hint in seen and found_at is None:
                found_at = time.monotonic()
                end = min(end, found_at + linger)
            if until_hint is None and found_at is None and judged(snap, pid):
                found_at = time.monotonic()
                end = min(end, found_at + HEALTHY_AFTER_S)
    finally:
        m.stop()
    if story is not None:
        story.update(found_s=None if found_at is None else found_at - start, dropped=dropped)
    return seen, snap


def judged(snap: dict, pid: int | None) -> bool:
    """The job's loaders are listed and none is still being judged."""
    jobs = [j for j in snap["jobs"] if pid is None or j["pid"] == pid]
    if not jobs or not all(j["loaders"] for j in jobs):
        return False
    return not any(pid is None or e.get("job_pid") == pid for e in snap.get("judging") or [])


def stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _figures(snaps: list[dict]) -> tuple[float, float]:
    """Median data wait and batch rate of the job's loader over ``snaps``."""
    lds = [s["jobs"][0]["loaders"][0] for s in snaps if s and s["jobs"] and s["jobs"][0]["loaders"]]
    waits = sorted(ld["data_wait_fraction"] for ld in lds if ld["data_wait_fraction"] is not None)
    rates = sorted(ld["batches_per_s"] for ld in lds)
    return waits[len(waits) // 2], rates[len(rates) // 2]


def steady_figures(d: str, *extra: str, settle_s: float = 6.0, span_s: float = 5.0) -> tuple[float, float]:
    """Run the add-workers scenario (with ``extra`` flags), let it settle, then
    take the median of a snapshot every 0.5 s for ``span_s``."""
    p = start_scenario("add-workers", d, *extra)
    m = Monitor(directory=d, interval=0.5)
    m.start()
    snaps = []
    try:
        time.sleep(settle_s)
        end = time.monotonic() + span_s
        while time.monotonic() < end:
            time.sleep(0.5)
            snaps.append(m.latest())
    finally:
        m.stop()
        stop(p)
    return _figures(snaps)


def _helps(before: tuple[float, float], after: tuple[float, float]) -> bool:
    (wait_before, rate_before), (wait_after, rate_after) = before, after
    return rate_after >= 1.3 * rate_before and wait_after < wait_before


# Hints judged on CPU shares (a worker's share of a core, a free core, threads
# waiting for one): their scenarios, and the healthy one that must raise no
# warning, show what they should only on a box they have to themselves.
# io-bound too: its workers are I/O-bound while their CPU and run-queue wait
# stay under half their busy time, and beside the parallel tier's spawn
# storms the sleeping workers waited for a core most of it (4 cores' worth
# of run-queue wait once: "other processes decide" was then the right story).
CPU_SHARE_HINTS = {
    "io-bound",
    "add-workers",
    "cpu-bound-preprocessing",
    "workers-oversubscribe-cores",
    "worker-thread-oversubscription",
    "pipeline-has-headroom",
    None,
}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.timing) if SCENARIOS[n].hint in CPU_SHARE_HINTS else n
        # add-workers: its own test below watches the same job and also
        # checks that the recommendation helps; worker-memory-growth: the
        # recording test (test_record.py) watches its job live as well, as
        # this test would, while the job records: one 100 s job for both.
        for n in [*(n for n in CPU_SCENARIOS if n not in ("add-workers", "worker-memory-growth")), "healthy"]
    ],
)
def test_scenario_raises_its_hint_and_no_other_warning(name):
    expected = SCENARIOS[name].hint
    d = short_tmpdir()
    p = start_scenario(name, d)
    try:
        patience = PATIENCE_S.get(name, DEFAULT_PATIENCE_S) if expected else HEALTHY_WATCH_S
        story: dict = {}
        seen, snap = watch(d, p.pid, expected, patience, story=story)
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
    finally:
        stop(p)
        shutil.rmtree(d, ignore_errors=True)
    assert_only_its_hint(seen, snap, expected)
    if expected:
        # The screen says it within 30 s of the job's start (the rules that
        # need a minute of samples or several epochs by design excepted) and
        # keeps saying it (issue 32).
        if name not in PATIENCE_S:
            assert story["found_s"] <= 30.0, story
        assert story["dropped"] == [], story
    else:
        assert story["found_s"] is not None, f"never judged in {HEALTHY_WATCH_S} s: {snap}"


# The story of a box whose other processes hold the cores the job waits for.
LOAD_STORY = "cores-shared-with-others"


def is_the_boxs_load(hint_id: str, evidence: dict | None) -> bool:
    """A warning that is the box's load, as its figures say: other processes
    used at least half a core and the job waited at least 0.2 cores' worth
    for a CPU (others.py's bars). Beside the parallel tier that is the truth
    about the box, not about the scenario's pipeline."""
    ev = evidence or {}
    return (
        hint_id == LOAD_STORY
        and ev.get("others_decide") is True
        and (ev.get("other_cpu_cores_peak") or 0) >= 0.5
        and (ev.get("jobs_runqueue_cores") or 0) >= 0.2
    )


def assert_only_its_hint(
    seen: dict[str, dict], snap: dict | None, expected: str | None, beside_load: bool = False
) -> None:
    """``expected`` was shown, with a message, a next step and evidence, and
    no other warning was (none at all when ``expected`` is None). A test in
    the parallel tier (``beside_load``) also lets the box's load be told,
    when the figures of that warning say the box was loaded."""
    warns = {i for i, h in seen.items() if h["severity"] in ("warn", "critical")}
    if beside_load:
        warns = {i for i in warns if not is_the_boxs_load(i, seen[i].get("evidence"))}
    if expected is None:
        assert warns == set(), _said(seen, warns)
        return
    why = {k: (snap or {}).get(k) for k in ("hints_error", "judging", "errors", "host")}
    assert expected in seen, (
        f"{expected} never shown; seen {sorted(seen)}; last snapshot's {why};"
        f" last jobs: {snap and snap['jobs']}"
    )
    assert warns - {expected} == set(), _said(seen, warns - {expected})
    h = seen[expected]
    assert h["message"] and h["suggestion"] and h["evidence"]


def _said(seen: dict[str, dict], ids: set[str]) -> str:
    """The hints in full, their figures too (a str: pytest would cut a dict's repr)."""
    return "\n".join(
        f"{i}: {seen[i]['message']}\n  evidence: {json.dumps(seen[i].get('evidence'))}" for i in sorted(ids)
    )


@pytest.mark.timing
def test_add_workers_recommendation_follows_littles_law_and_helps():
    """40 ms of worker time per batch against a 10 ms step: about 4 workers,
    and no other warning. Applying the recommendation must cut the data wait."""
    d = short_tmpdir()
    p = start_scenario("add-workers", d)
    try:
        seen, before = watch(d, p.pid, "add-workers", DEFAULT_PATIENCE_S)
        assert p.poll() is None, p.stderr.read().decode()[-2000:]
    finally:
        stop(p)
    assert_only_its_hint(seen, before, "add-workers")
    ev = seen["add-workers"]["evidence"]
    n = ev["recommended_num_workers"]
    # Little's law on the measured figures: ~40 ms of worker time per batch
    # over a ~10 ms step; the loading is CPU-bound, so the recommendation is
    # capped by the free usable cores (2 on the reference box: 2 cores, an
    # idle trainer).
    assert 3 <= ev["little_law_workers"] <= 6, ev
    assert ev["cpu_bound"] is True
    assert 2 <= n <= ev["little_law_workers"], ev
    # Before and after, each a median over several snapshots of its own run.
    # Two runs a minute apart on a shared box see different loads (the CPU
    # the workers get is the whole effect), so a pair that misses is measured
    # again, alternated (A, B), up to three pairs; a recommendation that does
    # not help misses every time.
    pairs = []
    for attempt in range(3):
        before_fig = steady_figures(d) if attempt else _figures([before])
        after_fig = steady_figures(d, "--num-workers", str(n))
        pairs.append((before_fig, after_fig))
        if _helps(before_fig, after_fig):
            break
    shutil.rmtree(d, ignore_errors=True)
    assert pairs[-1][0][0] > 0.4, pairs  # data-bound before
    # One worker per free core: the supply roughly doubles on an idle box;
    # the batch rate must rise by at least 30 % and the wait fall.
    assert _helps(pairs[-1][0], pairs[-1][1]), pairs
