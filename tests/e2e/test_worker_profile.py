"""Worker profile bursts on real jobs: `dlwatch profile --workers` against a
loader whose samples cost two known stages (3/4 and 1/4 of each sample's
CPU), with real worker processes of every start method."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from dlwatch.collect import control
from tests.e2e_util import Job, dlwatch, short_tmpdir, snapshot_json, stop_sessions

STAGES = Path(__file__).resolve().parents[1] / "jobs" / "stages_job.py"


def start_job(*args: str) -> tuple[subprocess.Popen, str, str]:
    job, d, ready = launch(*args)
    wait_ready(job, ready)
    return job, d, ready


def launch(*args: str) -> tuple[subprocess.Popen, str, str]:
    d, out = short_tmpdir(), short_tmpdir("dlwout")
    ready = os.path.join(out, "job")
    job = subprocess.Popen(
        [sys.executable, str(STAGES), "--out", ready, *args],
        env=dict(os.environ, DLWATCH_DIR=d),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return job, d, ready


def wait_ready(job: subprocess.Popen, ready: str) -> None:
    end = time.monotonic() + 60
    while not os.path.exists(ready + ".ready"):
        assert job.poll() is None, job.stderr.read().decode()[-2000:]
        assert time.monotonic() < end, "the job never produced a batch"
        time.sleep(0.05)


# `dlwatch ARGS` in a process that has imported the CLI and waits for a line
# on stdin first: the command runs at once on cue, whatever the box's load.
_CLI_ON_CUE = (
    "import sys\n"
    "from dlwatch.cli.main import main\n"
    "import dlwatch.cli.commands.profile, dlwatch.collect.control, dlwatch.diagnose.worker_profile\n"
    "print('ready', file=sys.stderr, flush=True)\n"
    "sys.stdin.readline()\n"
    "raise SystemExit(main(sys.argv[1:]))\n"
)


def profile(d: str, pid: int, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "dlwatch", "profile", "--workers", "--pid", str(pid), *args],
        env=dict(os.environ, DLWATCH_DIR=d),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def assert_two_stages(doc: dict, truth: tuple[float, float] = (0.75, 0.25)) -> None:
    """The two stages' shares of ``__getitem__``'s samples within 10 points of
    ``truth`` (3/4 and 1/4 where each stage's time is its CPU time: the box
    does not crowd the workers), and ``__getitem__``'s inclusive share of
    the samples' time (the rest of a fetch is collate)."""
    assert doc["error"] is None and doc["samples"] >= 50, (doc["samples"], doc["workers"])
    fns = {f["function"]: f["share"] for f in doc["worker_functions"]}
    per_sample = fns["TwoStages.__getitem__"]
    assert per_sample >= 0.7, fns
    stages = {s["stage"]: s["share"] / per_sample for s in doc["stages"]}
    decode, augment = truth
    assert abs(stages.get("decode_like_stage", 0) - decode) <= 0.10, (stages, truth)
    assert abs(stages.get("augment_like_stage", 0) - augment) <= 0.10, (stages, truth)
    assert abs(fns["decode_like_stage"] / per_sample - decode) <= 0.10, (fns, truth)
    assert abs(fns["augment_like_stage"] / per_sample - augment) <= 0.10, (fns, truth)
    assert doc["verdict"] == "code-bound" and "decode_like_stage" in doc["reason"]


def wall_split(log_dir: str, window_ns: list[int]) -> tuple[float, float]:
    """The shares of ``__getitem__``'s wall-clock time that the two stages
    took inside the profile's window, from the workers' own clocks (the
    job's ``--stage-log``)."""
    lo, hi = window_ns
    total = [0, 0, 0]  # decode, augment, __getitem__
    for name in os.listdir(log_dir):
        for line in open(os.path.join(log_dir, name)):
            t = [int(x) for x in line.split()]
            for k, (a, b) in enumerate(((t[0], t[1]), (t[1], t[2]), (t[0], t[3]))):
                total[k] += max(0, min(b, hi) - max(a, lo))
    assert total[2] > 0, "no sample inside the profile's window"
    return total[0] / total[2], total[1] / total[2]


def test_persistent_fork_workers_two_stages_one_burst_at_a_time_and_every_monitor_hears_of_it():
    # The truth is the workers' own clocks over the burst's window: beside the
    # parallel tier the wall-clock split drifts from the CPU's 3:1 (fresh-clone
    # runs read 0.65 for the 3/4 stage).
    log = short_tmpdir("stages")
    job, d, ready = start_job("--workers", "2", "--persistent", "--duration", "60", "--stage-log", log)
    rec = ready + ".jsonl"
    recorder = subprocess.Popen(
        [sys.executable, "-m", "dlwatch", "record", "-o", rec, "--pid", str(job.pid), "--duration", "9"],
        env=dict(os.environ, DLWATCH_DIR=d),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # The first burst is asked for from here, 4 s; the second, `dlwatch
        # profile`, once the job says the first runs. The second's interpreter
        # is started and its modules imported beforehand: a command started
        # then took over 8 s to reach the job on a loaded box, and asked once a
        # worker's thread count had risen the two ran one after the other
        # beside the parallel tier (fresh-clone run 66).
        second = subprocess.Popen(
            [sys.executable, "-c", _CLI_ON_CUE, "profile", "--workers", "--pid", str(job.pid)]
            + ["--seconds", "3", "--json"],
            env=dict(os.environ, DLWATCH_DIR=d),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert second.stderr.readline() == "ready\n"  # type: ignore[union-attr]
        first: dict = {}
        running = threading.Event()

        def on_status(msg: dict) -> None:
            if msg.get("state") == "running":
                running.set()

        def ask_first() -> None:
            try:
                first["doc"] = control.request_worker_profile(job.pid, 4.0, directory=d, on_status=on_status)
            except Exception as e:  # the assertion below says what failed
                first["error"] = f"{type(e).__name__}: {e}"
                running.set()

        asking = threading.Thread(target=ask_first)
        asking.start()
        assert running.wait(30) and "error" not in first, first or "the first burst never ran"
        _, err = second.communicate("go\n", timeout=60)
        asking.join(60)
        assert second.returncode == 1 and "busy" in err and "Traceback" not in err, (second.returncode, err)
        doc = first["doc"]
        assert_two_stages(doc, truth=wall_split(log, doc["window_mono_ns"]))
        assert len(doc["workers"]) == 2 and all(w["reported"] for w in doc["workers"])
        assert doc["seconds"] == 4
        assert doc["hz"] == 100 and doc["loader"]["name"].startswith("loader 0")
        # A monitor that connects later is told the last profile (hints, recordings).
        snap = snapshot_json(d, "--judge", "0")  # figures, not hints: one measurement
        wp = snap["jobs"][0]["worker_profile"]
        shares = {s["stage"]: s["share"] for s in doc["stages"]}  # that burst's, as it was told
        assert wp["top_stage"] == "decode_like_stage"
        assert abs(wp["top_share"] - shares["decode_like_stage"]) < 1e-9
        # Text output, and the job trains on.
        r = dlwatch("profile", "--workers", "--pid", str(job.pid), "--seconds", "1", runtime_dir=d)
        assert r.returncode == 0 and "verdict: code-bound" in r.stdout and "decode_like_stage" in r.stdout
        assert "over 1 s" in r.stdout  # its own answer, not the last one that is replayed to new monitors
        assert job.poll() is None
        assert not [f for f in os.listdir(d) if f.startswith("wprof-")]  # the workers' files are gone
        # A recording that spans the burst: the report shows the profile.
        assert recorder.wait(timeout=30) == 0, recorder.stderr.read()
        r = dlwatch("report", rec, "-o", ready + ".html", runtime_dir=d)
        assert r.returncode == 0, r.stderr
        html = open(ready + ".html").read()
        assert "Worker profile (loader 0" in html and "decode_like_stage" in html
    finally:
        recorder.kill()
        stop_sessions([job])


# Timing tier, as the fork workers' line shares below: beside the parallel
# tier (fresh-clone run 61, a slow one) the 1/4 stage read 0.18 of the
# samples where the workers' own clocks gave 0.29 over the same window.
@pytest.mark.timing
def test_spawn_and_forkserver_workers():
    # Both jobs at once: their start-up (torch imported in every worker) overlaps.
    methods = ("spawn", "forkserver")
    logs = [short_tmpdir("stages") for _ in methods]
    jobs = [
        launch("--workers", "2", "--start-method", m, "--duration", "60", "--stage-log", log)
        for m, log in zip(methods, logs)
    ]
    try:
        for job, _, ready in jobs:
            wait_ready(job, ready)
        time.sleep(1.0)  # past the new workers' first batches
        # 5 s: beside the parallel tier's spawn storms a 3 s burst once
        # caught 43 samples in fetches, under the 50 the shares are read from.
        asks = [profile(d, job.pid, "--seconds", "5", "--json") for job, d, _ in jobs]
        for ask, log in zip(asks, logs):
            out, err = ask.communicate(timeout=60)
            assert ask.returncode == 0, err
            doc = json.loads(out)
            assert_two_stages(doc, truth=wall_split(log, doc["window_mono_ns"]))
    finally:
        stop_sessions([job for job, _, _ in jobs])


# Sixteen workers, new every epoch, share 2 cores with the trainer. The
# profile samples wall-clock time, and here the wall-clock split is not the
# CPU split: a worker is preempted inside its first, longer stage and given a
# fresh slice before the second, so 16 fetches in one wave spent 86 % of
# __getitem__'s wall time in the 3 ms stage and 14 % in the 1 ms one (the
# workers' own clocks, five runs alike). The truth is the workers' own clocks
# over the profile's window. Timing tier: beside the parallel tier
# __getitem__'s own lines took 14 % of the samples (4-6 % alone).
@pytest.mark.timing
def test_sixteen_non_persistent_workers_replaced_during_the_burst_are_followed():
    # 16 workers, an epoch of 16 batches of 2: each epoch starts 16 new workers.
    log = short_tmpdir("stages")
    args = ("--workers", "16", "--epoch-batches", "16", "--batch-size", "2", "--duration", "60")
    job, d, _ = start_job(*args, "--stage-log", log)
    try:
        r = dlwatch(
            "profile",
            "--workers",
            "--pid",
            str(job.pid),
            "--seconds",
            "5",
            "--json",
            runtime_dir=d,
            timeout=60,
        )
        assert r.returncode == 0, r.stderr
        doc = json.loads(r.stdout)
        assert_two_stages(doc, truth=wall_split(log, doc["window_mono_ns"]))
        reported = [w for w in doc["workers"] if w["reported"]]
        assert len({w["pid"] for w in reported}) > 16, doc["workers"]  # later epochs' workers too
    finally:
        stop_sessions([job])


# Timing tier: the job's new workers (after the kill) must start inside the
# 3 s burst to take part; beside the parallel tier they did not once
# (fresh-clone run 62: 1 reported and the victim noted, against 3).
@pytest.mark.timing
def test_a_worker_killed_mid_burst_is_reported_and_the_answer_comes():
    job, d, ready = start_job("--workers", "2", "--duration", "60")
    try:
        victim = int(open(ready + ".pids").read().split()[0])
        t0 = time.monotonic()
        ask = profile(d, job.pid, "--seconds", "3")
        # Kill once both workers sample (the progress line on stderr says so).
        seen, fd = b"", ask.stderr.fileno()
        while b"2 workers sampling" not in seen:
            chunk = os.read(fd, 4096)
            assert chunk and time.monotonic() - t0 < 60, seen
            seen += chunk
        os.kill(victim, signal.SIGKILL)
        out, err = ask.communicate(timeout=60)
        took = time.monotonic() - t0
        if job.poll() is not None:  # the job's own account, should it have died
            err += job.stderr.read().decode()[-3000:]
        assert ask.returncode == 0, err
        assert f"PID {victim}): killed or exited before it could report" in out, out
        assert took < 60 and "samples inside fetches" in out
        # The job's new iterator's workers joined the burst too: more than the
        # first two took part. (Whether the first iterator's survivor reports
        # is torch's shutdown's to decide: it may end it before it can, and it
        # is then noted as the victim is.)
        reported = int(re.search(r"from (\d+) workers? of", out).group(1))
        noted = len(re.findall(r"^note: worker \d+ \(PID \d+\)", out, re.M))
        assert reported >= 1 and reported + noted >= 3, out
    finally:
        stop_sessions([job])


def test_a_loader_without_workers_is_refused():
    d = short_tmpdir()
    job = Job("--workers", "0", "--duration", "20", runtime_dir=d)
    try:
        job.wait_ready(settle=1.2)
        r = dlwatch("profile", "--workers", "--pid", str(job.proc.pid), "--seconds", "1", runtime_dir=d)
        assert r.returncode == 1 and "no worker processes" in r.stderr and "Traceback" not in r.stderr
    finally:
        job.cleanup()
