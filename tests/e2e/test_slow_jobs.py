"""Diagnosis where the expensive jobs live: real jobs whose steps take seconds,
whose epochs are cut short with ``break``, and whose ranks wait for each
other at an all-reduce (issue 10)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlwatch.collect.monitor import Monitor
from tests.e2e_util import Job, short_tmpdir, snapshot_json, truth_in_window

RANKED_JOB = Path(__file__).parent.parent / "jobs" / "ranked_job.py"


def _hint(snap: dict, hid: str, pid: int | None = None) -> dict | None:
    return next(
        (h for h in snap["hints"] if h["id"] == hid and (pid is None or h["job_pid"] == pid)),
        None,
    )


def _loader(snap: dict, pid: int) -> dict | None:
    job = next((j for j in snap["jobs"] if j["pid"] == pid), None)
    return job["loaders"][0] if job and job["loaders"] else None


@pytest.mark.timing  # its severity follows the predicted gain, priced on the cores left free
def test_a_slow_step_job_without_workers_gets_no_workers_and_a_true_figure():
    """1.5 s steps, 0.5 s of loading in the loop (num_workers=0): 25 % wait.
    One batch every 2 s: the old 3 s window held one batch at most and the
    warm-up wanted 20 of them with batches in every second."""
    log = os.path.join(short_tmpdir("dlwlog"), "batches.txt")
    job = Job(
        "--workers", "0", "--batch-size", "4", "--sample-ms", "125", "--step-ms", "1500",
        "--duration", "60", "--batch-log", log,
    )  # fmt: skip
    started = time.monotonic()
    try:
        job.wait_socket()
        found = None
        while time.monotonic() - started < 35 and job.proc.poll() is None:
            # One snapshot watches until the loader is judged (the default
            # 7 s cap ended each call before a batch every 2 s could be:
            # found at the third call, 24 s, where one watch finds it at
            # 16 s); another only should one end without the hint (a job
            # with no loader yet is not being judged).
            snap = snapshot_json(job.dir, "--judge", "35")
            h = _hint(snap, "no-workers", job.proc.pid)
            if h is not None:
                found = (time.monotonic() - started, snap, h)
                break
            time.sleep(1.0)
        assert found is not None, "no-workers never came"
        took, snap, h = found
        ld = _loader(snap, job.proc.pid)
        assert ld is not None, snap["jobs"]
        start, end = ld["window_mono_ns"]
        # The loop's own record (its batch log), once it covers the window: no
        # need to train to the end.
        spans: list = []
        deadline = time.monotonic() + 10
        while not (spans and spans[-1][2] >= end) and time.monotonic() < deadline:
            time.sleep(0.25)
            with open(log) as f:
                spans = [tuple(map(int, line.split())) for line in f if line.count(" ") == 2]
        assert job.proc.poll() is None, job.proc.stderr.read().decode()[-2000:]
    finally:
        job.cleanup()
        shutil.rmtree(os.path.dirname(log), ignore_errors=True)
    assert took <= 30, f"no-workers after {took:.0f} s"
    print(f"no-workers {took:.1f} s after the job started")
    assert h["severity"] == "warn"
    # The window stretched to whole batches: >= 5 of them, about 10 s.
    assert ld["window_batches"] >= 5 and ld["window_s"] >= 8, ld
    assert spans and spans[-1][2] >= end, "the loop never logged past the window"
    truth = truth_in_window(spans, start, end)
    wait = ld["data_wait_fraction"]
    assert abs(wait - truth["data_wait_fraction"]) <= 0.03, (wait, truth)
    # ... and the loop's own figure over its whole run so far (25 % by construction).
    whole = truth_in_window(spans, spans[0][1], spans[-1][2])
    assert abs(wait - whole["data_wait_fraction"]) <= 0.03, (wait, whole)
    print(f"wait {wait:.4f}, the loop's own: {truth['data_wait_fraction']:.4f} in the window,", end=" ")
    print(f"{whole['data_wait_fraction']:.4f} over the run")


@pytest.mark.parametrize("persistent", [False, True])
@pytest.mark.timing  # spawn start-up times under load decide what is measured
def test_spawn_epochs_cut_at_five_batches(persistent):
    """Every 5-batch epoch leaves its loop with ``break``: no StopIteration.
    Re-spawned workers stall each epoch's start; persistent ones do not."""
    args = ["--workers", "2", "--start-method", "spawn", "--batches-per-epoch", "5"]
    args += ["--epochs", "1000", "--sample-ms", "2", "--step-ms", "10", "--duration", "40"]
    job = Job(*args, *(["--persistent"] if persistent else []))
    try:
        job.wait_ready(0)
        end = time.monotonic() + (30 if not persistent else 9)
        seen = None
        ld = None
        while time.monotonic() < end and job.proc.poll() is None:
            snap = snapshot_json(job.dir)
            ld = _loader(snap, job.proc.pid) or ld
            seen = seen or _hint(snap, "enable-persistent-workers", job.proc.pid)
            if seen and not persistent:
                break
            time.sleep(0.5)
        exited = job.proc.poll()
        err = job.proc.stderr.read().decode()[-2000:] if exited is not None else ""
    finally:
        job.cleanup()
    assert exited is None, err
    assert ld is not None
    # Cut epochs are epochs: their durations and batch counts are recorded.
    assert len(ld["epoch_ms"]) >= 1 and set(ld["epoch_batches"]) == {5}, ld
    if persistent:
        assert seen is None, seen["message"]
        return
    assert seen is not None, ld
    ev = seen["evidence"]
    assert ev["start_method"] == "spawn" and ev["stall_fraction_of_epoch"] >= 0.5, ev


def _torchrun(d: str, work: str, *job_args: str) -> subprocess.Popen:
    env = dict(os.environ, DLWATCH_DIR=d, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, "-m", "torch.distributed.run"]
    cmd += ["--standalone", "--nproc-per-node", "2", str(RANKED_JOB), *job_args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=work)


def _watch_run(d: str, stop: str, p: subprocess.Popen, until: float, want_hint: bool):
    """The live view's snapshots (a Monitor, every half second) until
    straggler-rank shows (want_hint) or ``until`` passes; returns (hint or
    None, last snapshot with both ranks steady or None). Balanced ranks are
    watched for 16 snapshots (8 s) once steady: past the hold a hint needs.
    (A one-shot ``dlwatch snapshot`` a turn judged for up to 7 s each.)"""
    last = None
    steady = 0
    m = Monitor(directory=d, interval=0.5)
    m.start()
    try:
        while time.monotonic() < until and p.poll() is None:
            time.sleep(0.5)
            snap = m.latest()
            if not snap:
                continue
            ranked = [j for j in snap["jobs"] if j["loaders"] and j["rank"] is not None]
            if len(ranked) == 2 and all(j["loaders"][0]["batches_total"] >= 40 for j in ranked):
                last = snap
                steady += 1
            h = _hint(snap, "straggler-rank")
            if h is not None and want_hint:
                return h, snap
            assert h is None, h["message"]
            if not want_hint and steady >= 16:
                break
        return None, last
    finally:
        m.stop()
        open(stop, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_torchrun_straggler_rank_is_named():
    d, work = short_tmpdir(), short_tmpdir("dlwtr")
    stop = os.path.join(work, "stop")
    # Rank 1 loads 4 x 25 ms a batch in its loop; rank 0 loads nothing and
    # waits for rank 1 at the all-reduce after its 50 ms step.
    p = _torchrun(d, work, stop, "--allreduce", "--slow-rank", "1", "--sample-ms", "25", "--step-ms", "50")
    try:
        h, snap = _watch_run(d, stop, p, time.monotonic() + 75, want_hint=True)
        assert h is not None, p.stderr.read().decode()[-2000:] if p.poll() is not None else "no hint"
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
    ev = h["evidence"]
    assert ev["slow_rank"] == 1 and "Rank 1 " in h["message"], h["message"]
    rank1 = next(j for j in snap["jobs"] if j["rank"] == 1)
    assert h["job_pid"] == rank1["pid"] and h["severity"] == "warn"
    assert ev["data_wait_fraction"] >= 0.3 and ev["others_lost_ms_per_step"] >= 50, ev


def test_torchrun_balanced_ranks_get_no_straggler():
    d, work = short_tmpdir(), short_tmpdir("dlwtr")
    stop = os.path.join(work, "stop")
    p = _torchrun(d, work, stop, "--allreduce", "--sample-ms", "10", "--step-ms", "50")
    try:
        # The hint never shows (asserted on every snapshot), over 16 snapshots of both ranks steady.
        _, snap = _watch_run(d, stop, p, time.monotonic() + 60, want_hint=False)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(d, ignore_errors=True)
    assert snap is not None, "the ranks never became steady"
