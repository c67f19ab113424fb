"""The notebook panel's pure parts: the HTML, the loop tracker, the magic's
arguments. The kernel-side session runs for real in tests/e2e/test_notebook.py."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from dlwatch.diagnose.render import tune_command, with_tune_command
from dlwatch.notebook import magic
from dlwatch.panel import html
from dlwatch.panel.feed import Tracker, frame

GOLDEN = json.loads((Path(__file__).parent.parent / "data" / "snapshot_golden.json").read_text())
PID = GOLDEN["jobs"][0]["pid"]


def _text(h: str) -> str:
    return re.sub(r"<[^>]+>", "", h)


def test_live_panel_shows_the_figures_of_the_terminal_view():
    out = _text(html.render(GOLDEN, PID, html.LIVE, now=0))
    ld = GOLDEN["jobs"][0]["loaders"][0]
    assert f"kernel pid {PID} · live" in out
    assert "data wait" in out and "74 %" in out  # 0.7377
    assert "16.5 batches/s" in out
    assert "num_workers=2" in out and "SyntheticImages" in out
    assert "2 ready" not in out and "0 ready · 4 in flight · capacity 4" in out
    for w in ld["workers"]:
        assert str(w["pid"]) in out
    # the history sparkline: one block per point
    hist = ld["history"]["data_wait_fraction"]
    assert html.sparkline(hist) in out and len(html.sparkline(hist)) == len(hist)
    for h in GOLDEN["hints"]:
        assert h["id"] in out


def test_no_javascript_and_everything_escaped():
    snap = copy.deepcopy(GOLDEN)
    snap["jobs"][0]["loaders"][0]["dataset"] = "<script>alert(1)</script>"
    snap["hints"] = (
        [dict(snap["hints"][0], message="<img src=x onerror=alert(1)>")]
        if snap["hints"]
        else [
            {
                "id": "x",
                "severity": "warn",
                "job_pid": PID,
                "loader_id": 0,
                "message": "<img src=x>",
                "suggestion": "s",
                "evidence": {},
            }
        ]
    )
    out = html.render(snap, PID, html.LIVE)
    assert "<script" not in out and "<img" not in out
    assert "&lt;script&gt;" in out


@pytest.mark.parametrize("snapshot", [None, {}, {"jobs": "garbage"}, {"jobs": [{"pid": 1}]}, []])
def test_malformed_or_empty_snapshots_render(snapshot):
    out = html.render(snapshot, 1, html.WAITING)
    assert "waiting for the first DataLoader iterator" in out
    html.render_text(snapshot, 1, html.WAITING)


def test_gauge_and_sparkline_edges():
    assert html.gauge(None) == "·" * html.GAUGE_CELLS
    assert html.gauge(0.5).count("█") == html.GAUGE_CELLS // 2
    assert html.gauge(7) == "█" * html.GAUGE_CELLS
    assert html.sparkline([0.0, None, 1.0, "x"]) == "▁ █ "
    assert html.level(0.05) == "ok" and html.level(0.2) == "warn" and html.level(0.5) == "bad"


def _snap(batches: int, wait_s: float, step_s: float, epoch: int = 0, hints=None) -> dict:
    return {
        "jobs": [
            {
                "pid": 7,
                "loaders": [
                    {
                        "id": 0,
                        "dataset": "DS",
                        "epoch": epoch,
                        "batches_total": batches,
                        "batches_per_s": 10.0,
                        "data_wait_fraction": 0.4,
                        "wait_s_total": wait_s,
                        "step_s_total": step_s,
                    }
                ],
            }
        ],
        "hints": hints or [],
    }


def test_tracker_waits_goes_live_freezes_and_resumes():
    t = Tracker(7)
    assert t.update(None, 0.0) == html.WAITING
    assert t.update(_snap(0, 0, 0), 1.0) == html.WAITING
    hint = {
        "id": "io-bound",
        "severity": "info",
        "job_pid": 7,
        "loader_id": 0,
        "message": "m",
        "suggestion": "s",
    }
    assert t.update(_snap(10, 0.4, 0.6, hints=[hint]), 2.0) == html.LIVE
    assert t.update(_snap(20, 0.8, 1.2, hints=[hint]), 3.0) == html.LIVE
    # the loop stopped: idle time keeps counting as a step in later snapshots
    assert t.update(_snap(20, 0.8, 3.0), 4.0) == html.LIVE
    assert t.update(_snap(20, 0.8, 5.0), 6.5) == html.FINISHED
    s = t.summary
    assert s is not None and len(s.loaders) == 1
    ls = s.loaders[0]
    assert ls.batches == 20 and ls.wait_fraction == pytest.approx(0.4)  # as of the last batch
    assert ls.batches_per_s == pytest.approx(20 / 2.0)
    # a frozen frame shows the last live figures and the hints seen while it ran
    doc = frame(t, _snap(20, 0.8, 5.0), 6.5)
    assert doc["state"] == html.FINISHED and "io-bound" in doc["html"] and "Final summary" in doc["html"]
    # a new loop in a later cell: live again, counted from where it was
    assert t.update(_snap(25, 1.0, 5.5, epoch=1), 10.0) == html.LIVE
    assert t.update(_snap(30, 1.2, 6.0, epoch=1), 11.0) == html.LIVE
    assert t.update(_snap(30, 1.2, 9.0, epoch=1), 14.5) == html.FINISHED
    ls = t.summary.loaders[0]
    assert ls.batches == 10 and ls.epochs == 1  # one new iterator in this cell
    assert ls.wait_fraction == pytest.approx((1.2 - 0.8) / ((1.2 - 0.8) + (6.0 - 5.0)))


def test_a_first_fetch_in_progress_when_the_loader_is_first_seen_is_the_loops_wait():
    # The first snapshot caught the loader before its first batch, its
    # workers starting (0.3 s of wait in progress): that wait is the loop's,
    # as its own clock counts it.
    t = Tracker(7)
    assert t.update(_snap(0, 0.3, 0.0), 1.0) == html.WAITING
    assert t.update(_snap(10, 0.7, 0.6), 2.0) == html.LIVE
    t.update(_snap(20, 1.0, 1.2), 3.0)
    assert t.update(_snap(20, 1.0, 5.0), 6.5) == html.FINISHED
    assert t.summary.loaders[0].wait_fraction == pytest.approx(1.0 / (1.0 + 1.2))
    # a later loop caught in its first fetch: that wait is the new loop's,
    # the idle steps before it are not
    t.update(_snap(20, 1.5, 5.2), 10.0)
    assert t.update(_snap(30, 1.9, 6.0, epoch=1), 11.0) == html.LIVE
    assert t.update(_snap(30, 1.9, 9.0, epoch=1), 14.5) == html.FINISHED
    assert t.summary.loaders[0].wait_fraction == pytest.approx((1.9 - 1.0) / ((1.9 - 1.0) + (6.0 - 5.2)))


def test_the_idle_tail_after_the_last_batch_is_not_a_step():
    # The frame that saw the last 5 batches came 0.9 s after them: its step
    # total holds the loop standing idle. In a kernel that read 39 % wait
    # against the loop's own 42 % in 2 runs of 5.
    t = Tracker(7)
    t.update(_snap(50, 2.0, 3.0), 1.0)
    t.update(_snap(100, 4.0, 6.0), 2.0)
    t.update(_snap(105, 4.2, 6.3 + 0.9), 3.0)
    t.update(_snap(105, 4.2, 8.2), 4.0)
    assert t.update(_snap(105, 4.2, 11.2), 7.0) == html.FINISHED
    ls = t.summary.loaders[0]
    assert ls.batches == 105
    assert ls.wait_fraction == pytest.approx(4.2 / (4.2 + 6.3))
    # the pace on the job's clock: 105 batches in 10.5 s of the loop's time
    # (the panel first saw it 50 batches in)
    assert ls.batches_per_s == pytest.approx(10.0)


def test_a_slow_step_is_not_the_end_of_the_loop():
    t = Tracker(7)
    slow = _snap(1, 0.1, 0.1)
    slow["jobs"][0]["loaders"][0]["batches_per_s"] = 0.2  # a 5 s step
    t.update(slow, 0.0)
    assert t.update(slow, 10.0) == html.LIVE  # 10 s < 3 steps of 5 s
    assert t.update(slow, 16.0) == html.FINISHED


@pytest.mark.parametrize(
    "line, expected",
    [
        (["train.py", "--epochs", "1"], ["--", "PY", "train.py", "--epochs", "1"]),
        (["--workers", "2,4", "train.py"], ["--workers", "2,4", "--", "PY", "train.py"]),
        (["--json", "torchrun", "t.py"], ["--json", "--", "torchrun", "t.py"]),
        ([], None),
        (["--workers", "2,4"], None),
    ],
)
def test_tune_magic_needs_a_script(line, expected, monkeypatch):
    monkeypatch.setattr(magic.sys, "executable", "PY")
    cmd = magic.tune_command(line)
    if expected is None:
        assert cmd is None
    else:
        assert cmd == ["PY", "-m", "dlwatch", "tune", *expected]


def test_tune_magic_without_a_script_says_why(capsys):
    magic.dlwatch_magic("tune")
    assert "needs a training script" in capsys.readouterr().out
    magic.dlwatch_magic("--interval nope")
    assert "--interval takes a number" in capsys.readouterr().out
    magic.dlwatch_magic('"unclosed')
    assert "%dlwatch:" in capsys.readouterr().out


def test_a_kernels_hints_name_the_magic_not_the_kernel_command():
    job = {
        "pid": 7,
        "cmdline": "/x/python -m ipykernel_launcher -f /tmp/k.json",
        "loaders": [{"id": 0, "num_workers": 2}],
    }
    assert tune_command(job, {"num_workers": 3, "current": 2}) == "%dlwatch tune --workers 2,3 train.py"
    h = {
        "id": "add-workers",
        "job_pid": 7,
        "loader_id": 0,
        "suggestion": "set num_workers=3",
        "evidence": {"recommended_num_workers": 3},
    }
    out = with_tune_command(h, {"jobs": [job]})["suggestion"]
    assert "ipykernel_launcher" not in out and "%dlwatch tune --workers 2,3 train.py" in out


def test_a_loader_not_judged_yet_reads_judging_not_nothing_to_fix():
    snap = copy.deepcopy(GOLDEN)
    snap["hints"] = []
    snap["judging"] = [{"job_pid": PID, "loader_id": 0, "judging_s": 3.0, "reason": "9 of the 20 batches"}]
    out = _text(html.render(snap, PID, html.LIVE, now=0, hints=[]))
    assert f"judging… (3 s) loader 0 of PID {PID}" in out and "nothing in the input pipeline" not in out
    snap["judging"] = []
    assert "nothing in the input pipeline" in _text(html.render(snap, PID, html.LIVE, now=0, hints=[]))
    # A kernel that trains on something dlwatch does not see (or has not
    # iterated its loader yet) is not judged either.
    snap["jobs"][0]["loaders"] = []
    out = _text(html.render(snap, PID, html.LIVE, now=0, hints=[]))
    assert "no loader of this kernel measured yet" in out and "nothing in the input pipeline" not in out


def test_an_idle_loop_keeps_the_trainings_figures_until_its_next_batch():
    # 40 % wait over the loop; the window's figures once it idles fall (the
    # idle time counts as a step): a frame with no batch for a second shows
    # the training's, and says since when, before the loop counts as stopped.
    t = Tracker(7)
    t.update(_snap(10, 0.4, 0.6), 1.0)
    t.update(_snap(20, 0.8, 1.2), 2.0)
    idle = _snap(20, 0.8, 2.2)
    idle["jobs"][0]["loaders"][0].update(data_wait_fraction=0.14, batches_per_s=2.0, step_ms_mean=167.0)
    assert t.update(idle, 2.5) == html.LIVE and t.summary is None  # not yet: half a second
    assert t.update(idle, 3.1) == html.LIVE and t.summary is not None
    doc = frame(t, idle, 3.1)
    out = _text(doc["html"])
    assert "loop idle since" in out and "figures from its last 1 s of training" in out
    assert "40 % of the loop (its last 1 s of training)" in out and "14 %" not in out
    assert "step 60.0 ms" in out and "wait 40.0 ms" in out and "167" not in out
    assert "Final summary" not in out  # live still: the summary block is for a stopped loop
    assert "loop idle since" in doc["text"] and "40 %" in doc["text"]
    # the next batch: live figures again
    assert t.update(_snap(21, 0.85, 2.3), 4.0) == html.LIVE and t.summary is None
    assert "loop idle since" not in frame(t, _snap(21, 0.85, 2.3), 4.0)["html"]
    # stopped: the same figures, with the summary block
    t.update(_snap(21, 0.85, 6.0), 8.0)
    assert t.state == html.FINISHED
    out = _text(frame(t, idle, 8.0)["html"])
    assert "Final summary" in out and "loop idle since" in out and "(last " not in out


def test_the_epochs_of_a_cell_are_those_it_iterated():
    # One iterator, first seen in this cell (a QA run: "2 epoch(s)", the
    # loader line saying epoch 1).
    t = Tracker(7)
    t.update(_snap(0, 0, 0), 0.0)
    for k, (b, w, s) in enumerate([(10, 0.4, 0.6), (20, 0.8, 1.2), (20, 0.8, 5.0)]):
        snap = _snap(b, w, s, epoch=1)
        t.update(snap, 1.0 + k * 2.5)
    assert t.summary is not None and t.summary.loaders[0].epochs == 1
    # A cell that goes on with an epoch already open, then starts two more: 3.
    t = Tracker(7)
    start = _snap(10, 0.4, 0.6, epoch=1)
    start["jobs"][0]["loaders"][0]["epoch_open"] = True
    t.update(start, 0.0)
    t.update(_snap(20, 0.8, 1.2, epoch=2), 1.0)
    t.update(_snap(30, 1.2, 1.8, epoch=3), 2.0)
    t.update(_snap(30, 1.2, 5.0, epoch=3), 5.0)
    assert t.summary is not None and t.summary.loaders[0].epochs == 3, t.summary
