"""The TUI on the real collector and real jobs: pilot tests with ``Monitor``
as the source, pointed at the runtime directory of instrumented
``tests/jobs/timed_job.py`` subprocesses.

What the fake-snapshot tests in test_tui.py cannot show: that the real model
reaches the screen (worker PIDs are the job's real worker processes, the
data-wait figure is the one the model holds for that refresh), that job
lifecycle (a job exiting, a job starting while the app runs) flows through,
and that quitting the app stops the collector thread.

Costs are sleeps so the jobs barely use CPU on a busy machine; nothing here
asserts a wall-clock duration, only "eventually, within a generous limit".
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import threading
from pathlib import Path

import psutil
import pytest

from dlwatch.collect.monitor import Monitor
from dlwatch.tui import fmt
from dlwatch.tui.app import DlwatchApp
from dlwatch.tui.hints import HintsPanel
from dlwatch.tui.jobs import JobList
from dlwatch.tui.textline import TextLine
from dlwatch.tui.workers import WorkersTable
from tests.e2e_util import Job, truth_in_window
from tests.tui_fixtures import plain, row_text, screen_lines

SIZE = (100, 30)
# A data-bound job: 2 fork workers x (4 samples x 5 ms) = a batch every ~10 ms,
# the loop eats one every 5 ms. Persistent workers keep their PIDs for the run.
JOB_ARGS = ("--start-method", "fork", "--persistent", "--duration", "120")
LIMIT_S = 20.0  # generous "eventually" for a loaded 2-core machine


def sync(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def wait_for(pilot, cond, what: str, timeout: float = LIMIT_S, detail=None):
    """``cond()`` once truthy, within ``timeout``; else fail, saying what was
    awaited and (``detail()``) what there was instead."""
    for _ in range(int(timeout / 0.05)):
        value = cond()
        if value:
            return value
        await pilot.pause(0.05)
    value = cond()
    assert value, f"timed out waiting for: {what}" + (f"; {detail()}" if detail else "")
    return value


def real_worker_pids(pid: int) -> set[int]:
    """The job's DataLoader workers as the OS sees them: its child processes
    (fork start method), minus any multiprocessing helper process."""
    out = set()
    for child in psutil.Process(pid).children():
        try:
            cmd = " ".join(child.cmdline())
        except psutil.Error:
            continue
        if "resource_tracker" in cmd or "forkserver" in cmd:
            continue
        out.add(child.pid)
    return out


def job_row(app, pid: int) -> list[str] | None:
    table = app.screen.query_one(JobList)
    key = f"job:{pid}"
    if key not in set(table.row_keys):
        return None
    return row_text(table, key)


def shown_worker_pids(app) -> list[int]:
    tables = list(app.screen.query(WorkersTable).results(WorkersTable))
    if not tables:  # no loader panel yet
        return []
    table = tables[0]
    return [int(row_text(table, key)[1]) for key in table.row_keys]


def model_job(snap: dict | None, pid: int) -> dict | None:
    for j in (snap or {}).get("jobs", []):
        if j.get("pid") == pid:
            return j
    return None


def model_loader(snap: dict | None, pid: int) -> dict | None:
    j = model_job(snap, pid)
    return j["loaders"][0] if j and j.get("loaders") else None


def wait_label(app) -> str:
    return plain(app.screen.query_one("#wait-label", TextLine))


async def select(pilot, app, pid: int) -> None:
    for _ in range(10):
        if app.selected_key == f"job:{pid}":
            return
        await pilot.press("tab")
    assert app.selected_key == f"job:{pid}"


@pytest.fixture(scope="module")
def job():
    j = Job(*JOB_ARGS)
    try:
        j.wait_ready(0.5)
        yield j
    finally:
        j.cleanup()


def make_app(job: Job) -> tuple[DlwatchApp, Monitor]:
    monitor = Monitor(directory=job.dir)
    return DlwatchApp(monitor, interval=0.5, runtime_dir=job.dir), monitor


@sync
async def test_real_job_workers_and_data_wait_reach_the_screen(job):
    pid = job.proc.pid
    app, monitor = make_app(job)
    async with app.run_test(size=SIZE) as pilot:
        row = await wait_for(pilot, lambda: job_row(app, pid), "the job in the job list")
        assert row[2] == "live"
        assert app.selected_key == f"job:{pid}"

        # Worker PIDs: on screen == the job's real child processes == the model.
        real = real_worker_pids(pid)
        assert len(real) == 2, real
        await wait_for(
            pilot,
            lambda: set(shown_worker_pids(app)) == real,
            f"worker PIDs {sorted(real)} in the workers table",
        )
        assert len(shown_worker_pids(app)) == 2
        model = {w["pid"] for w in model_loader(app.snapshot, pid)["workers"]}
        assert model == real
        await pilot.pause(0.2)
        text = "\n".join(screen_lines(app))
        for p in real:
            assert str(p) in text, f"worker {p} not visible on the 100x30 screen:\n{text}"

        # The figure on screen is the model's figure for the refresh it drew:
        # read both with no await between them (the app cannot tick), and
        # retry while the collector thread swaps in a newer snapshot.
        def same_refresh():
            drawn = app.snapshot
            if drawn is None or monitor.latest() is not drawn:
                return None
            ld = model_loader(drawn, pid)
            if ld is None or ld.get("data_wait_fraction") is None:
                return None
            return ld, wait_label(app), job_row(app, pid)

        checked = 0
        for _ in range(3):  # three different refreshes, each drawn faithfully
            before = app.snapshot
            ld, label, row = await wait_for(pilot, same_refresh, "a drawn snapshot == latest()")
            expected = fmt.pct(ld["data_wait_fraction"])
            assert expected.endswith("%") and expected != fmt.NA
            assert expected in label, (expected, label)
            assert row[3].strip().startswith(expected + " ") or row[3].strip() == expected, (expected, row)
            checked += 1
            await wait_for(
                pilot,
                lambda before=before: app.snapshot is not before and monitor.latest() is not before,
                "the next refresh",
            )
        assert checked == 3
        # Sanity: the loop really is data-bound (~50 % on a quiet box), so the
        # figure is not a constant 0 % or 100 % that would match by accident.
        # Under the parallel tier its workers can fall far behind (97 % once):
        # a figure short of 100 % on screen still tells the two apart.
        frac = ld["data_wait_fraction"]
        assert frac > 0.05 and fmt.pct(frac) != fmt.pct(1.0), frac
        # And the header names the real process.
        assert str(pid) in plain(app.screen.query_one("#job-header", TextLine))


@sync
async def test_second_job_appears_live_and_a_killed_job_shows_exited_with_last_figures(job):
    pid_a = job.proc.pid
    app, monitor = make_app(job)
    second = None
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(pilot, lambda: job_row(app, pid_a), "the first job")
        # A job started after the app: same runtime dir, no restart.
        batch_log = os.path.join(job.workdir, "second-job-batches.txt")
        second = Job(*JOB_ARGS, "--batch-log", batch_log, runtime_dir=job.dir)
        try:
            pid_b = second.proc.pid
            row = await wait_for(pilot, lambda: job_row(app, pid_b), "the second job", timeout=40)
            assert row[2] == "live"
            await wait_for(
                pilot,
                lambda: (
                    (model_loader(app.snapshot, pid_b) or {}).get("data_wait_fraction") is not None
                    and job_row(app, pid_b)[3].strip() != fmt.NA
                ),
                "the second job's figures",
            )
            await select(pilot, app, pid_b)
            real_b = real_worker_pids(pid_b)
            await wait_for(pilot, lambda: set(shown_worker_pids(app)) == real_b, "the second job's workers")

            second.kill()  # SIGKILL: no atexit, the socket file stays behind
            await wait_for(
                pilot,
                lambda: (job_row(app, pid_b) or [""] * 5)[2] == "exited",
                "the killed job's row to show exited",
            )
        finally:
            second.kill()
            shutil.rmtree(second.workdir, ignore_errors=True)

        row_b = job_row(app, pid_b)
        assert row_b[2] == "exited"
        assert row_b[3].strip() != fmt.NA and "%" in row_b[3], row_b
        assert app.selected_key == f"job:{pid_b}", "selection stays on the exited job"
        assert "EXITED" in plain(app.screen.query_one("#job-header", TextLine)).upper()
        label = wait_label(app)
        assert "%" in label and fmt.NA not in label, label
        ld = model_loader(app.snapshot, pid_b)
        assert ld is not None, "the exited job keeps its loader"
        # The figures kept are the job's last: the window of its last frames,
        # and over that window the loop's own figure. (A figure read just
        # before the kill is no yardstick: on a loaded box a young job's wait
        # moved 0.79 -> 0.60 between it and the last frame.)
        with open(batch_log) as f:
            batches = [tuple(map(int, line.split())) for line in f if line.count(" ") == 2]
        start, end = ld["window_mono_ns"]
        assert abs(batches[-1][2] - end) < 2e9, "the window kept is not the job's last"
        truth = truth_in_window(batches, start, end)["data_wait_fraction"]
        assert abs(ld["data_wait_fraction"] - truth) <= 0.05, (ld["data_wait_fraction"], truth, ld)
        assert set(shown_worker_pids(app)) == real_b, "the exited job keeps its worker rows"
        # The figures stay: a few refreshes later nothing about it changed.
        frozen = (row_b[3], label)
        later = app.snapshot
        await wait_for(pilot, lambda: app.snapshot is not later, "a later refresh")
        await wait_for(
            pilot,
            lambda: app.snapshot is not later and monitor.latest() is app.snapshot,
            "another later refresh",
        )
        assert (job_row(app, pid_b)[3], wait_label(app)) == frozen
        assert job_row(app, pid_b)[2] == "exited"
        # The other job is untouched.
        assert job_row(app, pid_a)[2] == "live"
        assert "1 exited" in plain(app.screen.query_one("#status", TextLine))

        # The script started again (issue 43): the view moves from the job
        # that exited, chosen while it ran, to the new one.
        third = Job(*JOB_ARGS, runtime_dir=job.dir)
        try:
            pid_c = third.proc.pid
            await wait_for(
                pilot, lambda: app.selected_key == f"job:{pid_c}", "the new job selected", timeout=40
            )
            await wait_for(
                pilot,
                lambda: f"pid {pid_c}" in plain(app.screen.query_one("#job-header", TextLine)),
                "the new job's details",
            )
        finally:
            third.kill()
            shutil.rmtree(third.workdir, ignore_errors=True)


@pytest.mark.timing  # the hint in the screenshot must have shown in time
@sync
async def test_s_writes_an_svg_in_cwd_and_q_stops_the_monitor_thread(job, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pid = job.proc.pid
    app, monitor = make_app(job)
    async with app.run_test(size=SIZE) as pilot:
        await wait_for(
            pilot, lambda: set(shown_worker_pids(app)) == real_worker_pids(pid), "the job's workers on screen"
        )
        thread = monitor._thread
        assert isinstance(thread, threading.Thread) and thread.is_alive()
        assert thread.name == "dlwatch-monitor"

        # The real diagnoser's verdict reaches the hints panel (after its
        # warm-up and hold time). Which verdict is the diagnosis tests' concern
        # (workers busy but sleeping: io-bound on a quiet box, the box's load
        # beside other work: fresh-clone run 37 saw no io-bound in 30 s here).
        last: dict = {}

        def hint_on_screen():
            text = plain(app.screen.query_one(HintsPanel))
            ids = [h["id"] for h in (app.snapshot or {}).get("hints", []) if h.get("job_pid") == pid]
            last.update(ids=ids, panel=text[-600:], judging=(app.snapshot or {}).get("judging"))
            return [i for i in ids if i in text]

        shown = await wait_for(
            pilot, hint_on_screen, "a hint about the job on screen", timeout=30, detail=lambda: last
        )

        await pilot.press("s")
        files = await wait_for(pilot, lambda: list(Path(tmp_path).glob("*.svg")), "an SVG file")
        assert len(files) == 1
        svg = files[0].read_text(encoding="utf-8")
        assert svg.lstrip().startswith("<svg") or "<svg" in svg[:2000]
        assert str(pid) in svg, "the screenshot shows the job"
        assert shown[0] in svg, "the screenshot shows the hint"

        socks = [c.sock for c in monitor.conns.values() if c.sock is not None]
        assert socks, "the monitor is connected to the job"
        await pilot.press("q")
    # run_test returns once the app has exited.
    assert app.return_code in (None, 0)
    thread.join(timeout=5)
    assert not thread.is_alive(), "the collector thread outlives the app"
    assert monitor._thread is None
    assert all(c.sock is None for c in monitor.conns.values()), "sockets left open after quit"
    assert all(s.fileno() == -1 for s in socks)
    assert not [t for t in threading.enumerate() if t.name == "dlwatch-monitor"]
    # The job does not care that the monitor went away.
    assert job.proc.poll() is None
