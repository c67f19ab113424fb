"""Pilot tests of the TUI: what is on screen matches the snapshot, and every
key does what the help screen says."""

from __future__ import annotations

import asyncio
import copy
import functools
import json
import threading
import time

import pytest
from textual.widgets import Digits, Static

from dlwatch.diagnose.render import evidence_value, hint_reference
from dlwatch.snapshot import SnapshotSource
from dlwatch.tui import app as tui_app
from dlwatch.tui import fmt
from dlwatch.tui.app import DlwatchApp, run_tui
from dlwatch.tui.help import HelpScreen
from dlwatch.tui.hints import HintDetailScreen, HintsPanel
from dlwatch.tui.host import HostLine
from dlwatch.tui.jobs import JobList, group_jobs
from dlwatch.tui.keys import palette_keys
from dlwatch.tui.loader import LoaderPanel
from dlwatch.tui.sources import ReplayControls, ReplaySource, StaticSource
from dlwatch.tui.sparkline import FixedSparkline
from dlwatch.tui.textline import TextLine
from dlwatch.tui.workers import WorkersTable
from tests import tui_fixtures as F
from tests.tui_fixtures import make_app, plain, row_text, screen_lines

FAST = 0.05  # refresh interval for tests that wait for the timer


def sync(fn):
    """Run an async test body with asyncio.run (no pytest-asyncio here)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


async def settle(pilot, times: int = 3) -> None:
    for _ in range(times):
        await pilot.pause()


async def wait_until(pilot, cond, timeout: float = 3.0) -> None:
    for _ in range(int(timeout / 0.02)):
        if cond():
            return
        await pilot.pause(0.02)
    assert cond(), "condition not reached"


def status(app) -> str:
    return plain(app.screen.query_one("#status", TextLine))


async def open_profile(pilot, app, key: str = "P"):
    """Press ``key`` on the live view (P: a profiler burst, W: a worker
    profile), wait for the profile screen; returns a reader of its text."""
    from dlwatch.tui.profile import ProfileScreen

    await settle(pilot)
    await pilot.press(key)
    await wait_until(pilot, lambda: isinstance(app.screen, ProfileScreen))
    return lambda: plain(app.screen.query_one("#profile-text", Static))


# ------------------------------------------------------------------ figures


@sync
async def test_headline_figures_and_workers_match_snapshot():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        label = plain(app.screen.query_one("#wait-label", TextLine))
        assert "DATA WAIT" in label and "62 %" in label and "BAD" in label
        stats = plain(app.screen.query_one("#loader-stats", TextLine))
        assert "12.3 batch/s" in stats and "wait 50.4 ms" in stats and "step 81.2 ms" in stats
        epochs = plain(app.screen.query_one("#loader-epochs", TextLine))
        assert "epoch 3" in epochs and "start 1.84 s" in epochs and "epoch" not in stats
        queue = plain(app.screen.query_one("#loader-queue", TextLine))
        assert "0 ready" in queue and "8 in flight" in queue and "/ 8" in queue

        table = app.screen.query_one(WorkersTable)
        assert table.row_count == 4
        pids = [row_text(table, key)[1] for key in table.row_keys]
        assert pids == ["4301", "4302", "4303", "4304"]
        first = row_text(table, table.row_keys[0])
        assert first[2].endswith("97 %") and first[3] == "98 %" and first[4] == "176 ms"
        assert first[5] == "610 MiB" and first[6] == "240 MiB" and first[7] == "3" and first[8] == "running"
        assert row_text(table, table.row_keys[2])[6] == "n/a"  # uss None

        history = app.screen.query_one("#wait-history", FixedSparkline)
        assert history.values[-1] == pytest.approx(62.0)


@sync
async def test_a_pipelines_own_workers_and_a_feeder_thread_are_listed_not_none_yet():
    # A QA run: a torchdata.nodes loader read "workers: none yet" after 1519
    # batches while the snapshot text listed both its threads.
    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(workers=[], num_workers=2, worker_kind="thread")
    ld["pipeline_workers"] = [
        {"kind": "thread", "tid": 19081, "cpu_percent": 20.4},
        {"kind": "thread", "tid": 19082, "cpu_percent": None},
    ]
    app = make_app([snap])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        line = plain(app.screen.query_one("#no-workers", TextLine))
        assert line == "2 thread workers (CPU): tid 19081 20 %, tid 19082 n/a", line
    # num_workers=0 behind a producer thread: the thread loads, not the loop.
    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(workers=[], num_workers=0, feeder={"thread": "producer"}, consumer={"thread": "MainThread"})
    app = make_app([snap])
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        line = plain(app.screen.query_one("#no-workers", TextLine))
        assert line == "num_workers=0: thread 'producer' loads every batch, the loop takes them", line


@sync
async def test_a_window_without_a_batch_is_never_zero_or_ok():
    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    reason = "no batch completed in the last 62 s: the loop is busy outside the loader"
    ld.update(data_wait_fraction=None, no_batch_reason=reason, window_s=62.0, window_batches=0)
    ld["history"]["data_wait_fraction"][-1] = None
    app = make_app([snap])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        label = plain(app.screen.query_one("#wait-label", TextLine))
        assert "n/a" in label and "OK" not in label and "0 %" not in label
        assert app.screen.query_one("#wait-digits", Digits).value == "--"
        stats = plain(app.screen.query_one("#loader-stats", TextLine))
        assert reason in stats and "over 62 s · 0 batches" in stats
        history = app.screen.query_one("#wait-history", FixedSparkline)
        assert history.values[-1] is None  # a gap, not a zero
        row = row_text(app.screen.query_one(JobList), "job:4242")
        assert "n/a" in row[3] and "0 %" not in row[3]


@sync
async def test_compact_layout_shows_gauge_workers_and_hints_at_80x24():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        screen = "\n".join(screen_lines(app))
        assert "DATA WAIT  62 % ✖ BAD" in screen
        for pid in ("4301", "4302", "4303", "4304"):
            assert pid in screen
        assert "add-workers" in screen and "▲ WARN" in screen
        assert "GPU: n/a: NVML not found" in screen
        assert "host 4 cores (cgroup v2 quota 4 cores)" in screen and "/dev/shm free 31 GiB" in screen
        assert not app.screen.has_class("-wide")


@sync
async def test_at_80x24_every_worker_row_can_be_paged_to():
    # A new user's 80x24 view beside 4 jobs and a hint drew one of its two
    # workers and hid the other, with pgdn doing nothing: the loaders'
    # container clipped what did not fit instead of letting the view scroll.
    app = make_app([F.several_jobs()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        pids = [str(w["pid"]) for w in F.several_jobs()["jobs"][0]["loaders"][0]["workers"]]
        seen = set()
        for _ in range(6):
            screen = "\n".join(screen_lines(app))
            seen |= {p for p in pids if p in screen}
            await pilot.press("pagedown")
            await settle(pilot)
        assert seen == set(pids), (seen, pids)


@sync
async def test_wide_layout_uses_big_digits_and_gpu_history():
    app = make_app([F.data_bound(with_gpu=True)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert app.screen.has_class("-wide")
        digits = app.screen.query_one("#wait-digits", Digits)
        assert digits.value == "62" and digits.display and digits.has_class("-bad")
        rows = [plain(s) for s in app.screen.query(".gpu-summary").results(TextLine)]
        assert len(rows) == 2
        assert "GPU0" in rows[0] and "util  23 %" in rows[0] and "9.0 GiB/80 GiB" in rows[0]
        assert "util  71 %" in rows[1]
        graphs = list(app.screen.query(".gpu-history").results(FixedSparkline))
        assert graphs[1].values[-1] == F.fake_gpus()[1]["history"][-1]


@sync
async def test_compact_gpu_is_one_line():
    app = make_app([F.data_bound(with_gpu=True)])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        line = plain(app.screen.query_one("#gpu-line", TextLine))
        assert line == "GPU0 util 23 % mem 11 % · GPU1 util 71 % mem 51 %"
        assert not app.screen.query_one("#gpu-rows").display


@sync
async def test_no_gpu_is_one_line_with_reason_and_host_line():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert plain(app.screen.query_one("#gpu-line", TextLine)) == "GPU: n/a: NVML not found"
        host = plain(app.screen.query_one(HostLine))
        assert "4 usable cores (cgroup v2 quota 4 cores)" in host
        assert "load 103 % of usable" in host and "/dev/shm free 31 GiB" in host


@sync
async def test_hints_panel_shows_message_suggestion_and_evidence():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        text = plain(app.screen.query_one(HintsPanel))
        assert text.index("add-workers") < text.index("enable-persistent-workers")  # warn before info
        assert "▲ WARN" in text and "ℹ INFO" in text
        assert "→ set num_workers=6" in text
        assert "recommended_num_workers=6" in text


@sync
async def test_no_hints_and_waiting_states():
    source = StaticSource([None])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "waiting for data" in status(app)
        assert "waiting for data" in plain(app.screen.query_one(HintsPanel))
        source.push(F.data_bound(hints=False))
        await wait_until(pilot, lambda: "no hints" in plain(app.screen.query_one(HintsPanel)))


@sync
async def test_a_loader_not_judged_yet_says_judging_never_nothing_to_fix():
    # The first screen of issue 32: a red wait gauge beside "nothing to fix".
    snap = F.data_bound(hints=False)
    pid = snap["jobs"][0]["pid"]
    snap["judging"] = [{"job_pid": pid, "loader_id": 0, "judging_s": 4.2, "reason": "12 of the 20 batches"}]
    app = make_app([snap])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        hints = plain(app.screen.query_one(HintsPanel))
        assert "judging… (4 s) loader 0" in hints and "12 of the 20 batches" in hints
        assert "nothing to fix" not in hints


@sync
async def test_a_job_with_no_loader_measured_is_not_told_nothing_to_fix():
    # nanoGPT's get_batch() loop: "no loader seen yet" beside "✓ no hints —
    # nothing to fix in the input pipeline right now".
    snap = F.data_bound(hints=False)
    job = snap["jobs"][0]
    job["loaders"] = []
    job["train_threads"] = [{"thread": "MainThread", "steps": 178}]
    app = make_app([snap])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        hints = plain(app.screen.query_one(HintsPanel))
        assert f"no hints: no loader of job {job['pid']} measured yet" in hints, hints
        assert "nothing to fix" not in hints and "✓" not in hints


@sync
async def test_a_failed_diagnosis_and_collector_faults_are_shown():
    snap = F.data_bound(hints=False)
    snap["hints_error"] = "diagnosis failed: KeyError: 'loaders'"
    snap["errors"] = ["host: PermissionError: /proc/stat", "diagnosis: KeyError: 'loaders'"]
    app = make_app([snap])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        hints = plain(app.screen.query_one(HintsPanel))
        assert "no hints: diagnosis failed: KeyError: 'loaders'" in hints
        assert "nothing to fix" not in hints
        assert "collector: diagnosis: KeyError: 'loaders' (+1)" in status(app)


@sync
async def test_no_jobs_message_names_runtime_dir_and_how_to_start():
    app = make_app([F.empty()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        msg = plain(app.screen.query_one("#message", Static))
        assert "no jobs found in /run/user/1000/dlwatch" in msg
        assert "import dlwatch.hook" in msg and "dlwatch run -- python train.py" in msg
        assert "0 jobs" in status(app)


@sync
async def test_status_line_version_jobs_interval_and_time():
    app = make_app([F.several_jobs()])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        s = status(app)
        assert s.startswith("dlwatch 0.1.0")
        assert "4 jobs" in s and "every 0.5 s" in s and "updated 12:00:00" in s
        assert "STALE" not in s


@sync
async def test_stale_snapshot_is_flagged():
    app = make_app([F.data_bound()], clock_at=F.T0 + 30)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "STALE 30s old" in status(app)


# ------------------------------------------------------------------ jobs


@sync
async def test_job_appears_then_shows_exited_with_last_figures():
    source = StaticSource([F.empty()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        jobs = app.screen.query_one(JobList)
        assert jobs.row_count == 0
        source.push(F.data_bound())
        await wait_until(pilot, lambda: jobs.row_count == 1)
        assert row_text(jobs, "job:4242")[2] == "live"
        source.push(F.with_exited(F.data_bound()))
        await wait_until(pilot, lambda: row_text(jobs, "job:4242")[2] == "exited")
        assert "EXITED (exit code 0)" in plain(app.screen.query_one("#job-header", TextLine))
        assert "62 %" in plain(app.screen.query_one("#wait-label", TextLine))  # last figures kept
        assert "1 exited" in status(app)


@sync
async def test_ranks_of_one_run_are_grouped_under_an_aggregate_row():
    app = make_app([F.several_jobs()])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        jobs = app.screen.query_one(JobList)
        keys = jobs.row_keys
        assert keys == ["run:a1b2c3:2", "job:5001", "job:5002", "job:4242", "job:6001"]
        agg = row_text(jobs, "run:a1b2c3:2")
        assert agg[0].startswith("▾ run ×2")
        assert agg[3].startswith("r0 40 %")  # the slowest rank (40 % vs 20 %), named
        assert agg[4].strip() == "21.0"  # 10 + 11 batches/s
        assert row_text(jobs, "job:5002")[0].strip() == "r1 5002"


@sync
async def test_a_high_terminal_lists_more_jobs_whatever_its_width():
    # A QA run: 4 rows of the job list at 100x30 and at 100x70 alike.
    snap = F.snapshot([F.job(7000 + i, loaders=[F.loader(0)]) for i in range(10)])
    for size, rows in (((100, 30), 4), ((100, 45), 8), ((130, 45), 8)):
        app = make_app([snap])
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            jobs = app.screen.query_one(JobList)
            assert jobs.size.height - 1 == rows, (size, jobs.size)


@sync
async def test_switching_jobs_with_tab_j_k_and_arrows():
    app = make_app([F.several_jobs()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(WorkersTable)

        def pids():
            return [row_text(table, key)[1] for key in table.row_keys]

        assert app.selected_key == "job:5001"  # the aggregate row is not selectable
        assert pids()[0] == "5101"
        await pilot.press("tab")
        assert app.selected_key == "job:5002"
        await settle(pilot)
        assert pids()[0] == "5201"
        assert "rank 1/2" in plain(app.screen.query_one("#job-header", TextLine))
        await pilot.press("j")
        assert app.selected_key == "job:4242"
        await pilot.press("down")
        assert app.selected_key == "job:6001"
        await settle(pilot)
        assert pids() == ["6101", "6102"]
        await pilot.press("j")  # wraps
        assert app.selected_key == "job:5001"
        await pilot.press("k")
        assert app.selected_key == "job:6001"
        await pilot.press("up", "shift+tab")
        assert app.selected_key == "job:5002"
        jobs = app.screen.query_one(JobList)
        assert jobs.cursor_row == 2  # the list's cursor follows the selection


@sync
async def test_selection_survives_refresh_and_falls_back_when_job_goes():
    source = StaticSource([F.several_jobs()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("j", "j")
        assert app.selected_key == "job:4242"
        snap = F.several_jobs()
        snap["jobs"][2]["loaders"][0]["batches_per_s"] = 99.0
        source.push(snap)
        await wait_until(
            pilot, lambda: row_text(app.screen.query_one(JobList), "job:4242")[4].strip() == "99.0"
        )
        assert app.selected_key == "job:4242"
        gone = F.several_jobs()
        del gone["jobs"][2]
        source.push(gone)
        await wait_until(pilot, lambda: app.selected_key == "job:5001")


@sync
async def test_dismiss_exited_job_only():
    source = StaticSource([F.with_exited(F.several_jobs(), 4242)])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("d")  # 5001 is live
        assert source.dismissed == set()
        await pilot.press("j", "j")
        assert app.selected_key == "job:4242"
        await pilot.press("d")
        await settle(pilot)
        assert source.dismissed == {4242}
        jobs = app.screen.query_one(JobList)
        assert "job:4242" not in jobs.row_keys
        assert app.selected_key == "job:5001"


# ------------------------------------------------------------------ in-place updates


@sync
async def test_workers_table_is_updated_in_place_by_key():
    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        table = app.screen.query_one(WorkersTable)
        keys_before = table.row_keys

        def no_clear(*a, **k):
            raise AssertionError("the workers table must not be cleared")

        table.clear = no_clear
        snap = F.data_bound()
        workers = snap["jobs"][0]["loaders"][0]["workers"]
        workers[0]["cpu_percent"] = 12.0
        workers[3]["pid"] = 4399  # respawned worker 3
        workers.append(F.worker(4, 4305))
        source.push(snap)
        await wait_until(pilot, lambda: table.row_count == 5)
        keys_after = table.row_keys
        assert keys_after[:3] == keys_before[:3]
        assert row_text(table, keys_after[0])[2].endswith("12 %")
        assert [row_text(table, k)[1] for k in keys_after] == ["4301", "4302", "4303", "4399", "4305"]
        loaders = app.screen.query(LoaderPanel)
        assert len(loaders) == 1


def _changed_figures() -> dict:
    snap = F.several_jobs()
    for job in snap["jobs"]:
        for ld in job.get("loaders", []):
            ld["data_wait_fraction"] = 0.07
            ld["batches_per_s"] = 123.4
            for i, w in enumerate(ld.get("workers", [])):
                w["cpu_percent"] = 11.0 + i
                w["busy_fraction"] = 0.5 - i / 100
                w["fetch_ms_mean"] = 7.25 + i
                w["uss_bytes"] = (300 + i) << 20
    return snap


@sync
async def test_tables_updated_in_place_render_like_fresh_ones():
    """Cells updated in place (only their own render caches dropped) draw
    exactly what a table built from the new figures draws: text and styles."""
    source = StaticSource([F.several_jobs()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        source.push(_changed_figures())
        workers = app.screen.query_one(WorkersTable)
        await wait_until(pilot, lambda: row_text(workers, workers.row_keys[0])[2].endswith("11 %"))
        await settle(pilot)
        updated = [list(s) for s in app.screen._compositor.render_strips()]
    fresh_app = make_app(StaticSource([_changed_figures()]), interval=FAST)
    async with fresh_app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        fresh = [list(s) for s in fresh_app.screen._compositor.render_strips()]
    assert [plain_segments(s) for s in updated] == [plain_segments(s) for s in fresh]
    assert updated == fresh


@sync
async def test_line_table_repaints_only_the_rows_that_changed():
    """Update a table in place: its lines are those of a table built with the
    new values (text and styles), and only the changed row was rendered again."""
    from rich.text import Text
    from textual.app import App

    from dlwatch.tui.linetable import Column, LineTable

    cols = [Column("a", "a", 5, "right"), Column("b", "b", 5), Column("c", "c", 5)]
    old = [
        ("r0", [Text("1"), Text("x", style="red"), Text("10 %")]),
        ("r1", [Text("2"), Text("y"), Text("20 %")]),
    ]
    new = [
        ("r0", [Text("1"), Text("x", style="green"), Text("11 %")]),
        ("r1", [Text("2"), Text("y"), Text("20 %")]),
    ]

    class TwoTables(App):
        def compose(self):
            yield LineTable(cols, zebra=True, id="patched")
            yield LineTable(cols, zebra=True, id="fresh")

    def lines(table):
        return [list(table.render_line(y)) for y in range(3)]

    app = TwoTables()
    async with app.run_test(size=(40, 10)) as pilot:
        patched, fresh = app.query_one("#patched", LineTable), app.query_one("#fresh", LineTable)
        patched.set_rows(old)
        fresh.set_rows(new)
        await pilot.pause()
        first = lines(patched)
        assert plain_segments(first[0]).split() == ["a", "b", "c"]  # the header
        assert plain_segments(first[1]).startswith("     1  x ")  # fixed widths, justified
        built = patched.strips_built
        assert patched.set_rows(new) == [0]
        got = lines(patched)
        assert [plain_segments(s) for s in got] == [plain_segments(s) for s in lines(fresh)]
        assert got == lines(fresh)
        assert patched.strips_built == built + 1  # row 1 and the header came from the cache
        assert patched.set_rows(new) == []  # the same figures: nothing to repaint
        assert patched.get_row("r0")[2].plain == "11 %"


@sync
async def test_set_static_updates_only_changes_and_lays_out_only_for_a_new_size():
    from rich.text import Text
    from textual.app import App

    from dlwatch.tui.keyed import set_static

    class Lines(App):
        CSS = "#fixed { height: 1; } #hidden { display: none; }"

        def compose(self):
            yield Static(id="fixed")
            yield Static(id="auto")
            yield Static(id="hidden")

    app = Lines()
    async with app.run_test(size=(40, 10)) as pilot:
        fixed, auto, hidden = (app.query_one(f"#{n}", Static) for n in ("fixed", "auto", "hidden"))
        for w in (fixed, auto, hidden):
            set_static(w, Text("12 %"))
        await pilot.pause()
        layouts = []
        for w in (fixed, auto, hidden):
            real = w.refresh
            w.refresh = lambda *a, _w=w, _real=real, **k: (
                layouts.append(_w.id) if k.get("layout") else None,
                _real(*a, **k),
            )[1]
        assert not set_static(fixed, Text("12 %"))  # the same: nothing to do
        assert set_static(fixed, Text("12 %", style="red"))  # restyled: rich's == would miss it
        assert set_static(auto, Text("13 %"))
        assert set_static(hidden, Text("13 %"))
        assert layouts == []  # same sizes, or not shown: a repaint is enough
        assert set_static(auto, Text("13 %\nand a second line"))
        assert layouts == ["auto"]
        await pilot.pause()
        assert auto.size.height == 2


def plain_segments(segments) -> str:
    return "".join(seg.text for seg in segments)


@sync
async def test_unchanged_figures_do_not_touch_the_widgets():
    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        calls = []
        table = app.screen.query_one(WorkersTable)
        jobs = app.screen.query_one(JobList)
        for t in (table, jobs):
            real = t.set_rows

            def spy(*a, _real=real, **k):
                changed = _real(*a, **k)
                calls.extend(changed)
                return changed

            t.set_rows = spy
        hints = app.screen.query_one(HintsPanel)
        real_update = hints.update
        hints.update = lambda *a, **k: (calls.append(("hints",)), real_update(*a, **k))[1]
        for _ in range(3):
            source.push(F.data_bound())  # the same figures in a new snapshot
            await pilot.pause(FAST * 2)
        assert calls == []
        snap = F.data_bound()
        snap["jobs"][0]["loaders"][0]["workers"][1]["cpu_percent"] = 3.0
        source.push(snap)
        await wait_until(pilot, lambda: len(calls) == 1)
        assert calls == [1]  # worker 1's row, and only it, is repainted
        assert row_text(table, table.row_keys[1])[2].endswith("3 %")


@sync
async def test_a_headline_given_while_the_panel_mounts_is_the_figure_it_shows():
    """The app counts a snapshot drawn once a panel has its headline; a panel
    still mounting then draws its full draw later, and that must carry the
    newer headline (a live run once showed 55 % for a snapshot of 54 %)."""
    from textual.app import App, ComposeResult

    panel = LoaderPanel(classes="loader")
    pal = fmt.Palette()
    panel.show(F.loader(0, wait=0.30, bps=5.0), pal, False)  # the full draw, before mounting
    panel.show_headline(F.loader(0, wait=0.54, bps=7.5), pal, False)  # a newer snapshot's headline

    class One(App):
        def compose(self) -> ComposeResult:
            yield panel

    async with One().run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: panel.query_one("#wait-label", TextLine).content.plain.strip() != "")
        await settle(pilot)
        label = plain(panel.query_one("#wait-label", TextLine))
        assert "54 %" in label, label
        assert "7.5" in plain(panel.query_one("#loader-stats", TextLine))
        # The full draw's other parts are still drawn (its workers table).
        assert panel.query_one(WorkersTable).row_count == len(F.loader(0)["workers"])


@sync
async def test_loader_panels_follow_the_number_of_loaders():
    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        snap = F.data_bound()
        snap["jobs"][0]["loaders"].append(F.loader(1, workers=[], wait=0.0, bps=0.0, active=False))
        source.push(snap)
        await wait_until(pilot, lambda: len(app.screen.query(LoaderPanel)) == 2)
        await settle(pilot)
        second = list(app.screen.query(LoaderPanel))[1]
        assert "loader 1" in plain(second.query_one("#loader-title", TextLine))
        assert "num_workers=0" in plain(second.query_one("#no-workers", TextLine))
        assert "n/a" in plain(second.query_one("#loader-queue", TextLine))
        source.push(F.data_bound())
        await wait_until(pilot, lambda: len(app.screen.query(LoaderPanel)) == 1)


# ------------------------------------------------------------------ keys


@sync
async def test_pause_stops_display_updates_and_resume_catches_up():
    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("p")
        assert app.paused and "PAUSED" in status(app)
        changed = F.data_bound()
        changed["jobs"][0]["loaders"][0]["data_wait_fraction"] = 0.05
        source.push(changed)
        calls = source.calls
        await pilot.pause(0.3)
        assert source.calls == calls  # the app stopped asking
        assert "62 %" in plain(app.screen.query_one("#wait-label", TextLine))
        await pilot.press("j")  # switching jobs still works while paused
        await pilot.press("p")
        await settle(pilot)
        assert not app.paused and "PAUSED" not in status(app)
        assert "5 %" in plain(app.screen.query_one("#wait-label", TextLine))


@sync
async def test_s_saves_svg_screenshot_in_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("s")
        await settle(pilot)
        files = list(tmp_path.glob("*.svg"))
        assert len(files) == 1
        assert "<svg" in files[0].read_text(encoding="utf-8")
        assert any(str(files[0].name) in n.message for n in app._notifications)


@sync
async def test_question_mark_opens_help_and_escape_closes():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await settle(pilot)
        assert isinstance(app.screen, HelpScreen)
        text = plain(app.screen.query_one("#help-text", Static))
        for key in ("tab", "j", "k", "p", "s", "d", "q", "ctrl+p"):
            assert key in text
        await pilot.press("q")  # closes help, does not quit
        await settle(pilot)
        assert not isinstance(app.screen, HelpScreen)
        assert app.is_running


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        (("q",), "the footer's key"),
        # Over SSH Ctrl-C is what people press; Textual's own binding only
        # said "press ctrl+q", and a QA run typed on into the view.
        (("ctrl+c",), "Ctrl-C"),
        (("question_mark", "ctrl+c"), "Ctrl-C on the help screen"),
    ],
)
@sync
async def test_q_and_ctrl_c_quit(keys, why):
    source = StaticSource([F.data_bound()])
    app = make_app(source)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert source.started
        for key in keys:
            await pilot.press(key)
            await settle(pilot)
        assert not app.is_running, why
    assert source.stopped


@sync
async def test_command_palette_offers_the_same_actions():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in (
            "Pause / resume",
            "Save screenshot",
            "Next job",
            "Previous job",
            "Dismiss exited job",
            "Keys",
            "Quit",
        ):
            assert title in titles
        assert titles.count("Keys") == 1
        # Made from the key table: each command names its key and runs its action.
        commands = {c.title: c for c in app.get_system_commands(app.screen)}
        for key in palette_keys():
            assert commands[key.command].help.endswith(f"({key.help_keys})")
            assert commands[key.command].callback == getattr(app, key.method)
        assert {"Hints in full", "Profile job"} <= set(commands)
        command = next(c for c in app.get_system_commands(app.screen) if c.title == "Pause / resume")
        command.callback()
        assert app.paused


@sync
async def test_keys_are_plain_text_in_the_command_palette():
    app = make_app([F.several_jobs()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await settle(pilot)
        await pilot.press("j", "k")
        assert app.selected_key == "job:5001"  # typed into the palette, not job switching
        await pilot.press("escape")


# ------------------------------------------------------------------ robustness


@sync
async def test_malformed_snapshot_renders_na_and_never_raises():
    app = make_app([F.malformed()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.errors == {}
        for _ in range(6):
            await pilot.press("tab")
            await settle(pilot, 1)
        assert app.errors == {}
        assert "updated n/a" in status(app)
        assert "GPU: n/a" in plain(app.screen.query_one("#gpu-line", TextLine))
        assert "host n/a cores" in plain(app.screen.query_one(HostLine))
    async with make_app([F.malformed()]).run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        assert pilot.app.errors == {}


@pytest.mark.parametrize(
    "snap",
    [
        {},
        {"jobs": None},
        {"jobs": "x"},
        {"jobs": [{"pid": 1, "loaders": [{"workers": [{}]}]}]},
        {
            "jobs": [
                {
                    "pid": 1,
                    "loaders": [
                        {
                            "history": {"data_wait_fraction": [None, "x", 2.0, -1]},
                            "queue": {"ready": "a", "in_flight": None, "capacity": 0},
                        }
                    ],
                }
            ],
            "gpu_status": "ok",
            "gpus": [{"util_percent": "x", "mem_total_bytes": 0, "history": None}],
            "host": None,
            "hints": "nope",
        },
    ],
)
@sync
async def test_partial_snapshots_render(snap):
    for size in ((80, 24), (120, 40)):
        app = make_app([snap])
        async with app.run_test(size=size) as pilot:
            await settle(pilot)
            assert app.errors == {}


@sync
async def test_formatting_error_becomes_a_status_line_not_a_traceback(monkeypatch):
    def boom(*args, **kwargs):
        raise ValueError("bad figure")

    monkeypatch.setattr(HintsPanel, "show", boom)
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        error = plain(app.screen.query_one("#error", Static))
        assert "could not draw hints: ValueError: bad figure" in error
        assert "62 %" in plain(app.screen.query_one("#wait-label", TextLine))  # the rest still drawn
        assert app.is_running


@sync
async def test_source_errors_are_shown_and_not_raised():
    class Broken(StaticSource):
        def latest(self):
            raise RuntimeError("socket gone")

        def start(self):
            raise OSError("no runtime dir")

    app = make_app(Broken())
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "socket gone" in status(app)
        assert app.is_running


@sync
async def test_non_dict_snapshot_is_ignored():
    app = make_app(StaticSource([["not", "a", "dict"]]))
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "not a snapshot" in status(app)


# ------------------------------------------------------------------ pure parts


def test_fixed_scale_sparkline_draws_constant_high_value_high():
    rows = fmt.sparkline_rows([95.0] * 10, width=10, height=1)
    assert "".join(ch for ch, _ in rows[0]) == "█" * 10
    rows = fmt.sparkline_rows([0.0, 50.0, 100.0], width=5, height=1)
    assert "".join(ch for ch, _ in rows[0]) == "  ▁▄█"
    rows = fmt.sparkline_rows([100.0, 50.0], width=2, height=2)
    assert ["".join(c for c, _ in r) for r in rows] == ["█ ", "██"]
    assert fmt.sparkline_rows([None, "x"], width=2)[0] == [(" ", None), (" ", None)]


def test_formatters_return_na_for_missing_numbers():
    for f in (fmt.pct, fmt.pct100, fmt.ms, fmt.rate, fmt.count, fmt.size, fmt.duration):
        assert f(None) == "n/a"
        assert f("12") == "n/a"
        assert f(float("nan")) == "n/a"
    assert fmt.pct(0.621) == "62 %"
    assert fmt.size(1536) == "1.5 KiB" and fmt.size(31 * F.GIB) == "31 GiB"
    assert fmt.ms(0.7) == "0.70 ms" and fmt.ms(1840) == "1.84 s"
    assert fmt.wait_level(0.05) == fmt.GOOD and fmt.wait_level(0.2) == fmt.WARN
    assert fmt.wait_level(0.31) == fmt.BAD and fmt.wait_level(None) is None
    assert str(fmt.bar(0.5, 4)) == "██░░" and str(fmt.bar(3.0, 2)) == "██"
    assert str(fmt.queue_bar(2, 1, 4, 4)) == "██▒░"
    assert str(fmt.queue_bar(None, None, None, 4)) == "n/a"


def test_group_jobs_keeps_incomplete_runs_and_ignores_garbage():
    jobs = F.several_jobs()["jobs"]
    rows = group_jobs([None, "x"] + jobs[1:])  # rank 0 missing
    assert [r.key for r in rows] == ["run:a1b2c3:2", "job:5002", "job:4242", "job:6001"]
    assert rows[0].kind == "run" and len(rows[0].jobs) == 1


def test_static_source_serves_in_order_and_hides_dismissed():
    a, b = F.data_bound(), F.several_jobs()
    src = StaticSource([a, b], advance=True)
    assert isinstance(src, SnapshotSource) and not isinstance(src, ReplayControls)
    assert isinstance(ReplaySource([a]), ReplayControls)
    assert src.latest() is a
    assert src.latest() is b
    assert src.latest() is b
    src.dismiss(4242)
    assert 4242 not in [j["pid"] for j in src.latest()["jobs"]]
    assert StaticSource().latest() is None


def test_replay_source_plays_jsonl_and_skips_bad_lines(tmp_path):
    path = tmp_path / "rec.jsonl"
    first, second = F.data_bound(), F.with_exited(F.data_bound())
    second["time"] = first["time"] + 0.01
    path.write_text(json.dumps(first) + "\n{truncated\n\n[1]\n" + json.dumps(second) + "\n", encoding="utf-8")
    src = ReplaySource.from_file(str(path))
    assert len(src) == 2 and len(src.warnings) == 3  # two bad lines, no header
    assert src.latest() is None
    src.start()
    try:
        assert src.latest() is not None
        deadline = time.monotonic() + 2
        while src.latest()["jobs"][0]["state"] != "exited" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.latest()["jobs"][0]["state"] == "exited"
        src.dismiss(4242)
        assert src.latest()["jobs"] == []
    finally:
        src.stop()


def test_run_tui_returns_exit_code(monkeypatch):
    ran = {}

    def fake_run(self, *args, **kwargs):
        ran["interval"] = self.interval

    monkeypatch.setattr(DlwatchApp, "run", fake_run)
    # pytest's stdout is no terminal: the view refuses to draw into it.
    assert run_tui(StaticSource([F.data_bound()]), interval=0.25) == 2
    assert ran == {}
    monkeypatch.setattr(tui_app, "terminal_problem", lambda: None)
    assert run_tui(StaticSource([F.data_bound()]), interval=0.25) == 0
    assert ran["interval"] == 0.25


def test_fixtures_are_fresh_copies():
    a = F.data_bound()
    a["jobs"].clear()
    assert F.data_bound()["jobs"]
    assert copy.deepcopy(F.several_jobs()) == F.several_jobs()


# ------------------------------------------------------------------ drawing cadence


class PushSource(StaticSource):
    """A StaticSource that announces new snapshots, as the collector does."""

    def __init__(self, snapshots) -> None:
        super().__init__(snapshots)
        self.listeners = []

    def subscribe(self, callback) -> None:
        self.listeners.append(callback)

    def push_from_thread(self, snapshot) -> None:
        import threading

        def announce():
            self.push(snapshot)
            for cb in self.listeners:
                cb()

        t = threading.Thread(target=announce)
        t.start()
        t.join()


@pytest.mark.timing  # drawn within a bound of time: a loaded box misses it
@sync
async def test_a_snapshot_announced_from_another_thread_is_drawn_without_waiting_for_the_timer():
    source = PushSource([F.empty()])
    app = make_app(source, interval=60.0)  # the timer would not fire during the test
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        jobs = app.screen.query_one(JobList)
        assert jobs.row_count == 0 and len(source.listeners) == 1
        source.push_from_thread(F.data_bound())
        # Any bound far below the 60 s timer proves the push: 1 s failed once
        # beside a loaded parallel tier (the first draw of a loader's panels).
        await wait_until(pilot, lambda: jobs.row_count == 1, timeout=10.0)
        assert "62 %" in plain(app.screen.query_one("#wait-label", TextLine))


@sync
async def test_between_full_redraws_only_the_headline_moves_and_the_rest_follows_within_a_second():
    source = PushSource([F.data_bound()])
    app = make_app(source, interval=0.2)
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        app._full_at = time.monotonic()  # a full redraw just happened
        snap = F.data_bound()
        ld = snap["jobs"][0]["loaders"][0]
        ld["batches_per_s"] = 99.9
        ld["workers"][0]["cpu_percent"] = 11.0
        source.push_from_thread(snap)
        stats = app.screen.query_one("#loader-stats", TextLine)
        table = app.screen.query_one(WorkersTable)
        await wait_until(pilot, lambda: "99.9 batch/s" in plain(stats), timeout=0.5)
        assert not row_text(table, table.row_keys[0])[2].endswith("11 %")  # a once-a-second panel
        # No newer snapshot comes: the partial redraw is finished by the timer.
        await wait_until(pilot, lambda: row_text(table, table.row_keys[0])[2].endswith("11 %"), timeout=2.0)


@sync
async def test_wide_layout_cuts_no_figure_and_gives_spare_rows_to_the_history():
    """At 120×40 the rates and the epoch figures each get a whole line (the
    single line used to end in "…"), and the history takes the rows that stood
    empty under one loader."""
    app = make_app([F.data_bound(with_gpu=True)])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        lines = screen_lines(app)
        rates = next(line for line in lines if "batch/s · wait" in line)
        epochs = next(line for line in lines if line.lstrip().startswith("epoch 3 ·"))
        assert "…" not in rates and "worker 180 ms/batch" in rates
        assert "…" not in epochs and "last epoch 98 s" in epochs and "1234 batches" in epochs
        assert app.screen.has_class("-tall")
        assert app.screen.query_one("#wait-history", FixedSparkline).size.height == 6
    app = make_app([F.data_bound(with_gpu=True)])
    async with app.run_test(size=(120, 36)) as pilot:
        await settle(pilot)
        assert app.screen.has_class("-wide") and not app.screen.has_class("-tall")
        assert app.screen.query_one("#wait-history", FixedSparkline).size.height == 2


@sync
async def test_help_at_80x24_always_says_how_to_close_it():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("question_mark")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HelpScreen)
        assert "escape, q or ? closes" in screen_lines(app)[-1]
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HelpScreen)


@sync
async def test_e_opens_every_hint_in_full_with_all_its_evidence():
    """The panel cuts evidence to a few items ("…"); ``e`` shows all of it."""
    snap = F.data_bound()
    snap["hints"][0]["evidence"].update(free_cores=1.5, usable_cores=4.0, worker_cpu_cores_mean=0.93)
    app = make_app([snap])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert "…]" in "\n".join(screen_lines(app))
        await pilot.press("e")
        await pilot.pause(0.1)
        assert isinstance(app.screen, HintDetailScreen)
        text = app.screen.query_one("#hint-detail", Static).content
        for key, value in snap["hints"][0]["evidence"].items():
            assert f"{key} = {evidence_value(key, value)}" in str(text)
        assert "epoch_start_ms = 1840" in str(text)
        # Its page, two keys from the view: `e`, then the command it names.
        hid = snap["hints"][0]["id"]
        assert f"about this hint: {hint_reference(hid)}" in str(text) and "docs/" not in str(text)
        await pilot.press("escape")
        await pilot.pause(0.1)
        assert not isinstance(app.screen, HintDetailScreen)


# ------------------------------------------------------------------ profiler burst (P)


@sync
async def test_profile_key_shows_progress_then_summary_while_the_view_stays_live():
    from dlwatch.tui.profile import ProfileScreen

    go = threading.Event()
    calls = []

    def runner(pid, on_status, cancelled):
        calls.append(pid)
        on_status({"type": "profile_status", "state": "running", "steps": 10, "steps_done": 4})
        go.wait(5)
        return {
            "pid": pid,
            "steps": 10,
            "step_ms_mean": 12.5,
            "data_wait_fraction": 0.02,
            "verdict": "dispatch-bound",
            "reason": "4000 torch operators per step at 3.0 µs each",
            "suggestion": "batch the work",
            "top_ops": [{"name": "aten::add", "calls": 40000, "self_cpu_ms": 90.0}],
            "cuda": None,
            "trace_path": "/tmp/t.json",
            "trace_bytes": 1000,
            "error": None,
        }

    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST, profiler=runner)
    async with app.run_test(size=(100, 30)) as pilot:
        text = await open_profile(pilot, app)
        await wait_until(pilot, lambda: "4/10 steps" in text())
        # the live screen underneath keeps taking snapshots
        before = source.calls
        await wait_until(pilot, lambda: source.calls > before + 2)
        go.set()
        await wait_until(pilot, lambda: "dispatch-bound" in text())
        assert "aten::add" in text() and "/tmp/t.json" in text() and "batch the work" in text()
        assert calls == [4242]
        await pilot.press("escape")
        await wait_until(pilot, lambda: not isinstance(app.screen, ProfileScreen))


@sync
async def test_the_profilers_next_step_defers_to_the_hint_on_screen_about_the_worker_count():
    from dlwatch.diagnose import profile

    snap = F.data_bound(hints=False)
    snap["hints"] = [
        F.hint(
            "no-workers",
            "info",
            "Loader 0 of PID 4242 spends 50 % of the loop waiting for data with num_workers=0",
            "keep num_workers=0 in DataLoader(...): 1 would gain under 10 %, expected ≈ 1.00× throughput",
            job_pid=4242,
            num_workers=0,
            recommended_num_workers=None,
        )
    ]
    fig = {"steps": 10, "step_ms_mean": 40.0, "data_wait_fraction": 0.5, "loader": {"id": 0}}
    app = make_app(
        StaticSource([snap]), interval=FAST, profiler=lambda pid, **_: profile.summary(pid, fig, None)
    )
    async with app.run_test(size=(100, 30)) as pilot:
        text = await open_profile(pilot, app)
        await wait_until(pilot, lambda: "data-bound" in text())
        assert "next step: fix the input pipeline first, as the live view's no-workers hint says" in text()
        assert "more DataLoader workers" not in text()


@sync
async def test_profile_key_reports_a_failure_and_escape_cancels():

    seen_cancel = threading.Event()

    def failing(pid, on_status, cancelled):
        raise RuntimeError("job 4242 does not support profiling: its dlwatch predates profiler bursts")

    app = make_app(StaticSource([F.data_bound()]), interval=FAST, profiler=failing)
    async with app.run_test(size=(100, 30)) as pilot:
        text = await open_profile(pilot, app)
        await wait_until(pilot, lambda: "predates" in text())
        await pilot.press("escape")

    def slow(pid, on_status, cancelled):
        while not cancelled():
            time.sleep(0.01)
        seen_cancel.set()
        raise RuntimeError("cancelled")

    app = make_app(StaticSource([F.data_bound()]), interval=FAST, profiler=slow)
    async with app.run_test(size=(100, 30)) as pilot:
        await open_profile(pilot, app)
        await pilot.press("escape")
        await wait_until(pilot, seen_cancel.is_set)


@sync
async def test_profile_key_needs_a_live_job():
    from dlwatch.tui.profile import ProfileScreen

    app = make_app(
        StaticSource([F.with_exited(F.data_bound(), 4242)]), interval=FAST, profiler=lambda *a, **k: {}
    )
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        await settle(pilot)
        assert not isinstance(app.screen, ProfileScreen)


@sync
async def test_profile_key_without_a_profiler_says_so():
    """A view built without a profile runner (a replay) never reaches for a
    job itself: P warns and opens nothing."""
    from dlwatch.tui.profile import ProfileScreen

    app = make_app(StaticSource([F.data_bound()]), interval=FAST)
    async with app.run_test(size=(100, 30)) as pilot:
        await settle(pilot)
        await pilot.press("P")
        await settle(pilot)
        assert not isinstance(app.screen, ProfileScreen)
        assert any("live view" in str(n.message) for n in app._notifications)


def test_every_key_has_an_action_and_a_line_in_the_help():
    """The bindings and the help come from one table (tui/keys.py): each
    entry names an action that exists, and each action is in the help."""
    from dlwatch.tui.app import MonitorScreen
    from dlwatch.tui.help import help_text
    from dlwatch.tui.keys import APP_KEYS, SCREEN_KEYS

    for table, owner in ((SCREEN_KEYS, MonitorScreen), (APP_KEYS, DlwatchApp)):
        for k in table:
            target, _, name = k.action.split("(")[0].rpartition(".")
            cls = DlwatchApp if target == "app" else owner
            assert callable(getattr(cls, "action_" + name, None)), k
    texts = help_text(replay=False).plain, help_text(replay=True).plain
    # A long description is wrapped under itself: compared as words.
    live, replay = (" ".join(t.split()) for t in texts)
    for k in SCREEN_KEYS + APP_KEYS:
        if k.help_keys:
            assert k.help in (replay if k.replay_only else live), k
    assert "10 s back / forward" not in live and "pause / play the recording" in replay
    # Within the modal's text width, each wrapped line under its own column
    # (the Static wrapped the W and S rows to the left edge at 80x24).
    from dlwatch.tui.help import TEXT_WIDTH

    lines = texts[1].splitlines()
    assert max(map(len, lines)) <= TEXT_WIDTH, [x for x in lines if len(x) > TEXT_WIDTH]
    w = next(i for i, x in enumerate(lines) if x.lstrip().startswith("W "))
    assert lines[w + 1].startswith(" " * 20) and "__getitem__" in lines[w + 1], lines[w : w + 2]


@sync
async def test_footer_lists_the_profile_and_hint_keys():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        footer = screen_lines(app)[-1]
        for key in ("P profile", "W workers", "e hints"):
            assert key in footer, footer


@sync
async def test_job_row_names_the_interpreter_not_its_path():
    snap = F.data_bound()
    snap["jobs"][0]["cmdline"] = "/home/u/proj/.venv/bin/python -m dlwatch.demo.train --scenario data-bound"
    app = make_app([snap])
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(pilot)
        jobs = app.screen.query_one(JobList)
        row = " ".join(row_text(jobs, jobs.row_keys[0]))
        assert "python -m dlwatch.demo.train" in row and ".venv" not in row, row
    assert fmt.short_command("python train.py") == "python train.py"
    assert fmt.short_command(None) == fmt.NA


def test_every_missing_loader_figure_says_why():
    # Issue 32: "worker n/a/batch", an exited job's "queue n/a", "workers: n/a",
    # "last epoch n/a" with no reason.
    from dlwatch.tui.loader import _no_workers_why, epoch_stats, queue_line, worker_time

    pal = fmt.Palette()
    gone = {"num_workers": 2, "active": False, "queue": {}, "worker_ms_per_batch": None}
    assert worker_time(gone) == "worker time n/a (no fetch timed in the window)"
    assert worker_time({"num_workers": 0}) == "worker time n/a (num_workers=0)"
    assert worker_time({"worker_ms_per_batch": 42.0}) == "worker 42.0 ms/batch"
    assert "n/a (no iterator" in queue_line(gone, pal).plain
    assert _no_workers_why(gone, 2).startswith("workers: none now (num_workers=2")
    epochs = epoch_stats({"epoch": 1}, pal).plain
    assert (
        "epoch start still under way (no first batch yet)" in epochs
        and "last epoch n/a (no epoch finished yet)" in epochs
    )
    for text in (worker_time(gone), queue_line(gone, pal).plain, epochs, _no_workers_why({}, None)):
        assert "n/a/" not in text and ("n/a" not in text or "n/a (" in text), text
