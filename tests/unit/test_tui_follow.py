"""Issue 43 in the live view: it follows the living (a job that starts while
the selected one has exited is selected; a job's hints end with it), and
80×24 is a first-class size (the next step of a hint in sight, every key
reachable from the footer, every modal saying how to close it)."""

from __future__ import annotations

import threading

import pytest
from rich.cells import cell_len

from dlwatch.tui.app import MonitorScreen
from dlwatch.tui.hints import HintsPanel, relevant_hints
from dlwatch.tui.jobs import follow_living, group_jobs
from dlwatch.tui.keys import APP_KEYS, SCREEN_KEYS, available, footer_entries, footer_text, help_rows
from dlwatch.tui.sources import StaticSource
from dlwatch.tui.textline import TextLine
from tests import tui_fixtures as F
from tests.tui_fixtures import make_app, plain, screen_lines
from tests.unit.test_tui import FAST, settle, sync, wait_until

# ------------------------------------------------------------------ the view follows the living


def _cores_hint(jobs: list[int]) -> dict:
    return F.hint(
        "workers-oversubscribe-cores",
        "warn",
        "The 2 usable cores are fully used: the trainer 1.2 cores, 2 busy DataLoader workers 0.8",
        "no lower num_workers is predicted faster",
        job_pid=None,
        loader_id=None,
        jobs=jobs,
    )


def _restarted(hints: list[dict] | None = None) -> dict:
    """Job 4242 has exited; job 4343, the same script started again, runs."""
    snap = F.with_exited(F.data_bound(hints=False), 4242)
    snap["jobs"].append(F.job(4343, loaders=[F.loader(0, workers=F.four_workers(4400))], age_s=3.0))
    snap["hints"] = hints or []
    return snap


def test_follow_living_picks_a_new_job_only_for_an_exited_selection_nobody_chose():
    old = group_jobs(F.data_bound()["jobs"])
    seen = {r.key for r in old}
    rows = group_jobs(_restarted()["jobs"])
    assert follow_living(rows, "job:4242", seen, chosen_exited=False) == "job:4343"
    assert follow_living(rows, "job:4242", seen, chosen_exited=True) == "job:4242"
    # Nothing new since: the exited job the view shows stays.
    assert follow_living(rows, "job:4242", {r.key for r in rows}, chosen_exited=False) == "job:4242"
    # A live selection is never moved; a first view starts on a live job.
    assert follow_living(rows, "job:4343", seen, chosen_exited=False) == "job:4343"
    assert follow_living(rows, None, None, chosen_exited=False) == "job:4343"
    assert follow_living([], "job:4242", seen, chosen_exited=False) is None


def test_a_box_wide_hint_naming_its_jobs_is_not_about_another():
    hints = [_cores_hint([4242]), F.add_workers_hint(4343)]
    mine, others = relevant_hints(hints, 4343)
    assert [h["id"] for h in mine] == ["add-workers"] and others == 1
    mine, _ = relevant_hints(hints, 4242)
    assert [h["id"] for h in mine] == ["workers-oversubscribe-cores"]
    # One without a `jobs` list is everyone's, as before.
    mine, _ = relevant_hints([F.hint("shm-low", "warn", "m", "s", job_pid=None, loader_id=None)], 4343)
    assert len(mine) == 1


@sync
async def test_the_view_moves_to_the_job_that_started_after_the_selected_one_exited():
    """Issue 43: the details said "■ EXITED …" while the hint below was about
    the new PID."""
    source = StaticSource([F.data_bound()])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.selected_key == "job:4242"
        source.push(F.with_exited(F.data_bound(hints=False), 4242))
        await wait_until(pilot, lambda: "EXITED" in plain(app.screen.query_one("#job-header", TextLine)))
        hints = plain(app.screen.query_one("#hints", HintsPanel))
        assert "the job has exited" in hints and "nothing to fix" not in hints
        source.push(_restarted([F.add_workers_hint(4343)]))
        await wait_until(pilot, lambda: app.selected_key == "job:4343")
        await settle(pilot)
        assert "pid 4343" in plain(app.screen.query_one("#job-header", TextLine))
        assert "add-workers" in plain(app.screen.query_one("#hints", HintsPanel))


@sync
async def test_an_exited_job_the_user_chose_stays_selected_when_another_starts():
    source = StaticSource([F.with_exited(F.several_jobs(), 4242)])
    app = make_app(source, interval=FAST)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("j", "j")  # onto 4242, exited already
        assert app.selected_key == "job:4242"
        snap = F.with_exited(F.several_jobs(), 4242)
        snap["jobs"].append(F.job(4343, loaders=[F.loader(0, workers=F.four_workers(4400))]))
        source.push(snap)
        await wait_until(pilot, lambda: "job:4343" in app.screen.query_one("#jobs").row_keys)
        await settle(pilot)
        assert app.selected_key == "job:4242"


# ------------------------------------------------------------------ 80×24: every key, every close


@pytest.mark.parametrize("replay", [False, True])
def test_the_footer_fits_any_width_and_always_offers_the_list_of_every_key(replay):
    entries = [k for k, _, _ in footer_entries(replay) if k != "?"]
    for width in range(40, 201):
        line = footer_text(width, replay).plain
        assert cell_len(line) <= width, (width, line)
        listed = [k for k in entries if f" {k} " in f"{line} "]
        assert line.endswith(" ? keys" if len(listed) == len(entries) else " ? more keys"), line
    # Issue 43: at 80 columns W, e and S were cut off; S was missing at 120 too.
    at80 = footer_text(80, replay).plain
    for key in ("e hints", "[ ] scroll", "S stacks") + (() if replay else ("P profile", "W workers")):
        assert key in at80, at80
    if not replay:
        assert footer_text(120).plain.endswith("? keys")  # all of them
    # The ones left out are in the help (`?`), like every key.
    rows = " ".join(k for k, _ in help_rows(replay)[0] + help_rows(replay)[1])
    for k in SCREEN_KEYS + APP_KEYS:
        if k.footer and available(k, replay) and k.display not in ("← →", "[ ]"):
            assert (k.display or k.keys) in rows, k


@sync
async def test_at_80x24_the_first_hints_next_step_shows_and_brackets_scroll_the_pane():
    snap = F.data_bound()
    snap["hints"][0]["message"] = (
        "The 2 usable cores are fully used over the last 15 s: the trainer 1.2 cores of CPU (all "
        "threads), 2 busy DataLoader workers 0.8 and other processes 0.1; besides, their threads "
        "waited 0.4 cores' worth for a CPU (20 % of the cores). Loader 0 of PID 4242 with "
        "num_workers=1: ≈ 1.12× faster (predicted); the step would take 80 ms."
    )
    app = make_app([snap])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, 5)
        lines = screen_lines(app)
        assert lines[-1].startswith(" tab next job") and "? more keys" in lines[-1]
        assert any("→ set num_workers=6" in line for line in lines), "\n".join(lines)
        box = app.screen.query_one("#hints-box")
        assert box.max_scroll_y > 0 and box.scroll_y == 0
        assert "more below: [ ] scroll" in "\n".join(lines)
        await pilot.press("pagedown")  # the loader details, not the hints
        assert box.scroll_y == 0
        await pilot.press("right_square_bracket")
        await settle(pilot)
        assert box.scroll_y > 0
        assert any("→ pass persistent_workers=True" in line for line in screen_lines(app))
        assert "more above" in str(box.border_title)
        await pilot.press("left_square_bracket")
        await settle(pilot)
        assert box.scroll_y == 0


def _stuck_runner(started: threading.Event, stop: threading.Event):
    def run(pid, on_status=None, cancelled=lambda: False):
        started.set()
        stop.wait(5)
        return {"error": "cancelled"}

    return run


@sync
async def test_every_modal_says_how_to_close_it_at_80x24():
    started, stop = threading.Event(), threading.Event()
    runner = _stuck_runner(started, stop)
    snap = F.data_bound()
    # Enough stacks to fill more than the window.
    frames = [{"file": "train.py", "line": i, "function": f"step_{i}"} for i in range(60)]
    snap["jobs"][0]["stacks"] = {
        "t": F.T0,
        "reason": "stall",
        "processes": [
            {"pid": 4242, "role": "trainer", "threads": [{"name": "MainThread", "frames": frames}]}
        ],
    }
    app = make_app([snap], profiler=runner, worker_profiler=runner, stacker=None)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot)
            for key, closes in (
                ("question_mark", "escape, q or ? closes"),
                ("e", "escape, q or e closes"),
                ("P", "escape, q or P closes"),
                ("W", "escape, q or W closes"),
                ("S", "escape, q or S closes"),
                # Textual's palette, where q is a letter of the search.
                ("ctrl+p", "escape or ctrl+p closes"),
            ):
                await pilot.press(key)
                await settle(pilot)
                assert not isinstance(app.screen, MonitorScreen), key
                screen = "\n".join(screen_lines(app))
                assert closes in screen, (key, screen)
                await pilot.press("escape")
                await settle(pilot)
                assert isinstance(app.screen, MonitorScreen), key
    finally:
        stop.set()


# ------------------------------------------------------------------ header states; the demo's job


def _stalled(snap: dict, pid: int) -> dict:
    for j in snap["jobs"]:
        if j["pid"] == pid:
            for ld in j["loaders"]:
                ld["stalled_s"] = 42.0
    return snap


def _status_line(snap: dict) -> str:
    from dlwatch.tui import fmt
    from dlwatch.tui.status import status_text

    return status_text(
        version="0.1.0",
        snapshot=snap,
        rows=group_jobs(snap["jobs"]),
        interval=0.5,
        paused=False,
        now=F.T0,
        time_format=lambda t: "12:00:00",
        pal=fmt.DEFAULT_PALETTE,
    ).plain


def test_the_header_counts_stalled_and_unreachable_jobs_as_such_not_as_exited():
    """A verifier saw "2 jobs (1 exited)" with one job STALLED and one live."""
    snap = _stalled(_restarted(), 4343)
    snap["jobs"][0]["state"] = "live"  # 4242 runs again: one live, one stalled
    line = _status_line(snap)
    assert "2 jobs (1 stalled)" in line and "exited" not in line, line
    snap = _restarted()
    snap["jobs"][1]["state"], snap["jobs"][1]["state_reason"] = "unreachable", "connection refused"
    line = _status_line(snap)
    assert "2 jobs (1 unreachable, 1 exited)" in line, line
    assert "(" not in _status_line(F.data_bound()).split("every")[0]


def test_follow_living_leaves_a_stalled_or_unreachable_selection_and_prefers_the_views_own_job():
    old = group_jobs(F.data_bound()["jobs"])
    seen = {r.key for r in old}
    snap = _restarted()
    snap["jobs"][0]["state"] = "unreachable"  # 4242: out of reach for now, not gone
    rows = group_jobs(snap["jobs"])
    assert follow_living(rows, "job:4242", seen, chosen_exited=False) == "job:4242"
    # The job the view was opened for, whenever it is listed.
    rows = group_jobs(_restarted()["jobs"])
    assert follow_living(rows, "job:4242", seen, False, prefer="job:4343") == "job:4343"
    assert follow_living(rows, None, None, False, prefer="job:4343") == "job:4343"
    assert follow_living(rows, "job:4343", seen, False, prefer="job:9999") == "job:4343"


@sync
async def test_the_demos_view_selects_the_demos_job_though_another_job_ran_first_and_one_starts_after():
    """`dlwatch demo` showed another process's job: the demo's job (4343)
    comes up after another user job (4242) is already listed."""
    other = F.data_bound(hints=False)
    source = StaticSource([other])
    app = make_app(source, interval=FAST, follow_pid=4343)
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        assert app.selected_key == "job:4242"  # nothing else to show yet
        both = F.data_bound(hints=False)
        both["jobs"].append(F.job(4343, loaders=[F.loader(0, workers=F.four_workers(4400))], age_s=3.0))
        source.push(both)
        await wait_until(pilot, lambda: app.selected_key == "job:4343")
        # A newer job does not take the selection from a live one.
        three = F.data_bound(hints=False)
        three["jobs"] += [
            F.job(4343, loaders=[F.loader(0, workers=F.four_workers(4400))], age_s=4.0),
            F.job(4444, loaders=[F.loader(0, workers=F.four_workers(4500))], age_s=1.0),
        ]
        source.push(three)
        await wait_until(pilot, lambda: "job:4444" in app.screen.query_one("#jobs").row_keys)
        await settle(pilot)
        assert app.selected_key == "job:4343"
        assert "pid 4343" in plain(app.screen.query_one("#job-header", TextLine))
        # The user's choice wins from then on.
        await pilot.press("j")
        await settle(pilot)
        assert app.selected_key == "job:4444"
        source.push(three)
        await settle(pilot)
        assert app.selected_key == "job:4444"


@sync
async def test_ctrl_p_closes_the_palette_it_opened():
    app = make_app([F.data_bound()])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot)
        await pilot.press("ctrl+p")
        await settle(pilot)
        assert not isinstance(app.screen, MonitorScreen)
        await pilot.press("ctrl+p")
        await settle(pilot)
        assert isinstance(app.screen, MonitorScreen)


@sync
async def test_at_80x24_the_epoch_figures_show_in_full_last_epoch_and_its_batches_included():
    """A verifier saw "· epoch 6 (s…" at 80 columns: the rates line ended
    with the epoch and was cut before the last epoch's figures."""
    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(
        epoch=6,
        epoch_start_ms_last=1234.0,
        epoch_ms_last=26000.0,
        epoch_batches=[46, 46],
        batches_total=144,
        # A long window note on the rates line, as a slow job has.
        window_s=10.0,
        window_batches=5,
    )
    app = make_app([snap])
    async with app.run_test(size=(80, 24)) as pilot:
        await settle(pilot, 5)
        lines = screen_lines(app)
        epoch = [line for line in lines if line.lstrip().startswith("epoch 6")]
        assert epoch, "\n".join(lines)
        assert "start 1.23 s" in epoch[0] and "last 26 s, 46 batches" in epoch[0], epoch[0]
        assert "144 batches in all" in epoch[0] and "…" not in epoch[0], epoch[0]
