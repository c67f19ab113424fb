"""`dlwatch run -- torchrun ...` instruments every rank with no code change."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlwatch.collect.monitor import Monitor
from tests.e2e_util import dlwatch, short_tmpdir

JOB = Path(__file__).parent.parent / "jobs" / "ranked_job.py"


def _torchrun(d: str, work: str, stop: str) -> subprocess.Popen:
    env = dict(os.environ, DLWATCH_DIR=d, OMP_NUM_THREADS="1")
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlwatch",
            "run",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(JOB),
            stop,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=work,
    )


def _both_ranks(d: str) -> list[dict]:
    jobs: list[dict] = []
    end = time.monotonic() + 60
    while time.monotonic() < end:
        r = dlwatch("snapshot", "--json", "--window", "1", "--judge", "0", runtime_dir=d)
        assert r.returncode == 0, r.stderr
        jobs = [j for j in json.loads(r.stdout)["jobs"] if j["loaders"]]
        if len(jobs) == 2 and all(j["loaders"][0]["batches_total"] > 0 for j in jobs):
            break
        time.sleep(0.5)
    assert len(jobs) == 2, jobs
    return jobs


def test_torchrun_ranks_are_instrumented_and_grouped():
    d = short_tmpdir()
    work = short_tmpdir("dlwtr")
    stop = os.path.join(work, "stop")
    p = _torchrun(d, work, stop)
    try:
        jobs = _both_ranks(d)
        assert sorted(j["rank"] for j in jobs) == [0, 1]
        assert {j["world_size"] for j in jobs} == {2}
        assert len({j["run_id"] for j in jobs}) == 1 and jobs[0]["run_id"]
        # The torchrun launcher itself runs no DataLoader: no socket of its own.
        socks = os.listdir(d)
        assert len(socks) == 2, socks
    finally:
        open(stop, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)
    assert p.returncode == 0, p.stderr.read().decode()[-2000:]
    assert os.listdir(d) == []


# Timing: which rank ended first is read to the exit clock's milliseconds.
@pytest.mark.timing
def test_the_rank_killed_first_is_named_first_though_torchrun_stops_the_other_within_a_frame():
    """torchrun stops the other ranks about 0.1 s after one dies: their last
    frames are closer than a frame's spacing on a busy box, and both ranks
    read "ended together". The monitor's exit clock (pidfds) names the
    killed rank first and the other a fraction of a second after it."""
    d = short_tmpdir()
    work = short_tmpdir("dlwtr")
    p = _torchrun(d, work, os.path.join(work, "stop"))
    m = Monitor(directory=d, interval=0.2, gpu=False, diagnoser=False)
    try:
        m.start()
        jobs = _both_ranks(d)
        victim = next(j for j in jobs if j["rank"] == 1)
        other = next(j for j in jobs if j["rank"] == 0)
        end = time.monotonic() + 20
        while not {victim["pid"], other["pid"]} <= {j["pid"] for j in (m.latest() or {}).get("jobs", [])}:
            assert time.monotonic() < end, "the monitor never listed both ranks"
            time.sleep(0.1)
        os.kill(victim["pid"], signal.SIGKILL)
        p.wait(timeout=60)
        by_pid: dict = {}
        while time.monotonic() < end + 30:
            by_pid = {j["pid"]: j for j in (m.latest() or {}).get("jobs", [])}
            if all(by_pid.get(j["pid"], {}).get("state") == "exited" for j in jobs):
                break
            time.sleep(0.1)
    finally:
        m.stop()
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)
    killed, stopped = by_pid[victim["pid"]]["state_reason"], by_pid[other["pid"]]["state_reason"]
    assert killed.endswith("; the first rank of its run to end"), (killed, stopped)
    assert f"after rank 1 (pid {victim['pid']}), the first of its run to end" in stopped, (killed, stopped)
    # Each wait status read while a zombie, before torchrun reaped it (within
    # its 0.1 s monitor interval; the clock reads it within milliseconds of
    # the end, so the fallback "without exiting through Python" is rare).
    assert "SIGTERM" not in killed.split(";")[0] and "SIGKILL" not in stopped.split(";")[0], (killed, stopped)
