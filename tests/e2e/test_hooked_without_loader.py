"""Say what the hook saw (issue 41): a hooked process that trains on
something dlwatch does not recognise is listed, says so with the one line
that fixes it, and its CPU is the job's, never "other processes"."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import psutil

from tests.e2e_util import dlwatch, short_tmpdir, snapshot_json

JOB = Path(__file__).resolve().parents[1] / "jobs" / "unrecognised_loop.py"


def test_a_job_that_trains_on_an_unrecognised_iterable_is_listed_with_the_fix(tmp_path):
    rt = short_tmpdir()
    stop = tmp_path / "stop"
    env = dict(os.environ, DLWATCH_DIR=rt, PYTHONUNBUFFERED="1")
    env.pop("DLWATCH_DISABLE", None)
    cmd = [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, str(JOB), "--seconds", "60"]
    p = subprocess.Popen(
        [*cmd, "--stop-file", str(stop)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        r, _, _ = select.select([p.stdout], [], [], 60)
        assert r, "no ready line"
        line = p.stdout.readline()
        assert line.startswith("ready "), (line, p.stderr.read() if p.poll() is not None else "")
        pid = json.loads(line[6:])["pid"]
        time.sleep(2.5)
        # The job's own CPU over the snapshot (its main thread burns what
        # the box gives it: a loaded box gives it less than a core).
        proc = psutil.Process(pid)
        c0, t0 = proc.cpu_times(), time.monotonic()
        snap = snapshot_json(rt, "--judge", "0")  # figures only
        c1, t1 = proc.cpu_times(), time.monotonic()
        truth = 100 * (c1.user + c1.system - c0.user - c0.system) / (t1 - t0)
        ls = dlwatch("ls", runtime_dir=rt)
        text = dlwatch("snapshot", runtime_dir=rt).stdout
    finally:
        stop.touch()
        p.communicate(timeout=60)
    (job,) = [j for j in snap["jobs"] if j["pid"] == pid]
    assert job["loaders"] == [] and job["state"] == "live"
    (t,) = job["train_threads"]
    assert t["thread"] == "MainThread" and t["main"] is True and t["steps"] > 10
    assert ls.returncode == 0 and str(pid) in ls.stdout and "no dlwatch jobs found" not in ls.stdout
    assert "hooked; training (thread 'MainThread' has stepped the optimizer" in text
    assert "wrap what the loop iterates with dlwatch.watch(...)" in text
    # The job's CPU is the job's: it trains a CPU-heavy step on one thread.
    # (against the job's own figure: a bar of 40 % failed when the box gave it 32 %)
    assert truth > 10, truth
    assert job["main_cpu_percent"] is not None and job["main_cpu_percent"] > truth / 2, (job, truth)
    host = snap["host"]
    assert host["jobs_cpu_cores"] is not None and host["jobs_cpu_cores"] > truth / 200, (host, truth)
