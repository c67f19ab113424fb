"""The monitor never perturbs what it measures (issue 43): whatever dlwatch
starts inside a job — W's sampler thread in each worker, the stacks channel
the view's S uses, a profiler burst (P) — is left out of what the rules read.

Pressing W on a 1-worker job once brought "1 workers run 5 threads each"
(worker-thread-oversubscription) for ~20 s: the burst's sampler was counted as
a fifth thread of the worker. One real job (1 worker, CPU-bound samples) is
watched by a real Monitor: first untouched, then while each of those is
started through the same calls the live view makes
(``cli.common.profile_runner``, ``stacks_runner``), and a few seconds after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import pytest

from dlwatch.collect import control
from dlwatch.collect.hang import gather_stacks
from dlwatch.collect.monitor import Monitor
from tests.e2e_util import short_tmpdir

# Seconds of each phase: long enough for a hint to pass its 3 s hold.
QUIET_S = 8.0
AFTER_S = 4.0
# Judged on the box's load (other processes' CPU), not on the job: the same
# loader's want of workers is add-workers while cores are free and
# cores-shared-with-others while other processes use them, and that comes and
# goes with whatever else the test machine runs.
BOX_HINTS = {"cores-shared-with-others", "add-workers"}


def _worker(snap: dict | None, pid: int) -> dict | None:
    for job in (snap or {}).get("jobs") or []:
        if job.get("pid") == pid:
            for ld in job.get("loaders") or []:
                if ld.get("workers"):
                    return ld["workers"][0]
    return None


def _proc_threads(pid: int) -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return None


@pytest.fixture(scope="module")
def watched():
    """{phase: [(threads the snapshot reports, threads /proc lists, hint ids)]}
    every half second, for the untouched job and each thing that starts
    something inside it."""
    d = short_tmpdir()
    job = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlwatch.demo.train",
            "--quiet",
            "--hook",
            "--device",
            "cpu",
            "--epochs",
            "0",
            "--duration",
            "150",
            "--num-workers",
            "1",
            "--persistent-workers",
            "--batch-size",
            "16",
            "--sample-ms",
            "3",
            "--cost-kind",
            "cpu",
            "--step-ms",
            "10",
        ],
        env=dict(os.environ, DLWATCH_DIR=d),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    m = Monitor(directory=d, interval=0.5, gpu=False)
    m.start()
    phases: dict[str, list[tuple[int | None, int | None, set[str]]]] = {}
    errors: dict[str, str | None] = {}

    def watch(phase: str, seconds: float = 0.0, until: threading.Thread | None = None) -> None:
        rows = phases.setdefault(phase, [])
        end = time.monotonic() + seconds
        while time.monotonic() < end or (until is not None and until.is_alive()):
            time.sleep(0.5)
            snap = m.latest()
            w = _worker(snap, job.pid)
            if w is None:
                continue
            hints = {h["id"] for h in snap["hints"] if h.get("job_pid") in (job.pid, None)}
            rows.append((w.get("threads"), _proc_threads(w["pid"]), hints))

    def during(phase: str, fn) -> None:
        def run() -> None:
            try:
                errors[phase] = fn()
            except Exception as e:  # the trace says what failed
                errors[phase] = f"{type(e).__name__}: {e}"

        t = threading.Thread(target=run)
        t.start()
        watch(phase, until=t)
        t.join()
        watch(phase + " after", AFTER_S)

    try:
        # The job judged: its loader no longer listed as judging.
        end = time.monotonic() + 60
        while True:
            snap = m.latest()
            judging = any(e.get("job_pid") == job.pid for e in (snap or {}).get("judging") or [])
            if _worker(snap, job.pid) is not None and not judging:
                break
            assert job.poll() is None, job.stderr.read().decode()[-2000:]
            assert time.monotonic() < end, "the job was never judged"
            time.sleep(0.5)
        watch("quiet", QUIET_S)
        during("W", lambda: control.request_worker_profile(job.pid, 4.0, directory=d).get("error"))
        during("S", lambda: gather_stacks(job.pid, directory=d, py_spy=False).get("error"))
        # The trace in the test's own directory: by default it lands in this
        # process's working directory, the checkout (a file left in every run).
        during(
            "P",
            lambda: control.request_profile(job.pid, steps=10, max_s=10.0, out_dir=d, directory=d).get(
                "error"
            ),
        )
        assert job.poll() is None, job.stderr.read().decode()[-2000:]
    finally:
        m.stop()
        job.kill()
        job.wait()
        shutil.rmtree(d, ignore_errors=True)
    return phases, errors


def _trace(phases) -> str:
    return "\n".join(f"{ph}: {rows}" for ph, rows in phases.items())


# One test, not one per phase: under xdist each worker that runs a test of
# this module sets the module's job up again (40 s each; four times in one
# parallel run), so the checks of every phase share one test and one job.
def test_nothing_started_inside_the_job_is_counted_as_the_jobs(watched):
    phases, errors = watched
    failed = []
    baseline = {n for n, *_ in phases["quiet"]}
    if len(baseline) != 1:
        failed.append(f"the untouched job's thread count moved: {baseline}")
    quiet = set().union(*(h for *_, h in phases["quiet"]))
    for phase in ("W", "S", "P"):
        if errors[phase] is not None:
            failed.append(f"{phase} failed: {errors[phase]}")
        rows = phases[phase] + phases[phase + " after"]
        # No hint appears that the untouched job did not have.
        new = set().union(*(h for *_, h in rows)) - quiet - BOX_HINTS
        if new:
            failed.append(f"{phase}: new hints {sorted(new)}")
        # The worker's thread count is unchanged.
        if not rows or {n for n, *_ in rows} != baseline:
            failed.append(f"{phase}: the worker's thread count {sorted({n for n, *_ in rows})} != {baseline}")
    # The check can fail: during W the worker really ran one more thread
    # (/proc lists it) than the snapshot reports.
    if not any(seen is not None and n is not None and seen > n + 1 for n, seen, _ in phases["W"]):
        failed.append("W started no thread that /proc lists")
    assert not failed, "\n".join(failed) + "\n" + _trace(phases)
