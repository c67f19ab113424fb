"""Recordings without a job: the file format, the tolerant reader, series and
summaries, the HTML report and comparison, the replay source and its keys in
the live view, and the CLI's errors. Real recordings of real jobs:
tests/e2e/test_record.py."""

from __future__ import annotations

import asyncio
import copy
import gzip
import json
import re
import time

import pytest

from dlwatch.cli.main import main
from dlwatch.record import fileformat, reader
from dlwatch.record.compare import compare, text
from dlwatch.record.report import compare_html, report_html
from dlwatch.record.series import build, summary
from dlwatch.snapshot import problems
from dlwatch.tui.sources import ReplaySource
from dlwatch.tui.textline import TextLine
from tests import tui_fixtures as F
from tests.tui_fixtures import make_app, plain

T0 = F.T0


def stream(n: int = 12, workers: int = 4, hint_from: int = 5, wait: float = 0.6, rate: float = 20.0) -> list:
    """``n`` snapshots a second apart of one data-bound job whose batches
    move at ``rate``/s; its add-workers hint shows from line ``hint_from``."""
    out = []
    for i in range(n):
        snap = F.data_bound(hints=False)
        snap["time"] = T0 + i
        ld = snap["jobs"][0]["loaders"][0]
        ld["workers"] = ld["workers"][:workers]
        ld["num_workers"] = workers
        ld["batches_total"] = int(100 + rate * i)
        ld["batches_per_s"] = rate
        ld["data_wait_fraction"] = wait + 0.01 * (i % 3)
        for w in ld["workers"]:
            w["uss_bytes"] = (100 << 20) + i * (4 << 20)
        if i >= hint_from:
            snap["hints"] = [F.add_workers_hint()]
        out.append(snap)
    return out


def write(path, snaps, header=True, gz=False) -> str:
    f = fileformat.open_write(str(path), exclusive=True)
    with f:
        if header:
            f.write(json.dumps(fileformat.header(schema_version=1, interval_s=1.0, start_time=T0)) + "\n")
        for s in snaps:
            f.write(json.dumps(fileformat.compact(s)) + "\n")
    return str(path)


# ------------------------------------------------------------------ the file


def test_compact_keeps_the_contract_drops_history_and_rounds_without_touching_the_input():
    snap = F.data_bound(with_gpu=True)
    snap["jobs"][0]["loaders"][0]["batches_per_s"] = 12.3456789
    before = copy.deepcopy(snap)
    out = fileformat.compact(snap)
    assert snap == before
    assert problems(out) == []
    ld = out["jobs"][0]["loaders"][0]
    assert "history" not in ld and "history" not in out["gpus"][0]
    assert ld["batches_per_s"] == 12.3457
    assert fileformat.compact({"x": float("nan")}) == {"x": None}


@pytest.mark.parametrize("gz", [False, True])
def test_reader_reads_plain_and_gzip_and_skips_a_torn_last_line(tmp_path, gz):
    path = tmp_path / ("r.jsonl.gz" if gz else "r.jsonl")
    write(path, stream(5))
    rec = reader.read(str(path))
    assert rec.warnings == [] and len(rec.snapshots) == 5 and rec.header["interval_s"] == 1.0
    # A torn last line: the recorder died mid-write.
    with gzip.open(path, "at") if gz else open(path, "a") as f:
        f.write('{"schema_version": 1, "ti')
    rec = reader.read(str(path))
    assert len(rec.snapshots) == 5
    assert rec.warnings == ["the last line is torn (the recording was cut short): skipped"]


def test_reader_survives_a_gzip_stream_cut_mid_block_and_garbage_lines(tmp_path):
    path = tmp_path / "cut.jsonl.gz"
    write(path, stream(40))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # no trailer, a partial block
    rec = reader.read(str(path))
    assert 5 < len(rec.snapshots) < 40
    assert any("ends early" in w for w in rec.warnings), rec.warnings

    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(
        "\n".join(["[1, 2]", json.dumps(F.data_bound()), "not json", json.dumps(F.data_bound()), ""]),
        encoding="utf-8",
    )
    rec = reader.read(str(mixed))
    assert len(rec.snapshots) == 2
    assert "line 1 is not a JSON object: skipped" in rec.warnings
    assert any("no header line" in w for w in rec.warnings)

    garbage = tmp_path / "garbage.jsonl.gz"
    garbage.write_bytes(b"\x1f\x8b\x08\x00garbage that is not deflate")
    rec = reader.read(str(garbage))
    assert rec.snapshots == [] and any("corrupt" in w for w in rec.warnings)


def test_open_write_refuses_to_overwrite(tmp_path):
    path = write(tmp_path / "a.jsonl", stream(1))
    with pytest.raises(FileExistsError):
        fileformat.open_write(path, exclusive=True)


# ------------------------------------------------------------------ series, report, compare


def test_series_summary_and_hint_spans(tmp_path):
    s = build(reader.read(write(tmp_path / "a.jsonl", stream(12, hint_from=5))))
    assert s.times == list(range(12))
    ls = s.main_loader()
    assert ls is not None and len(ls.workers) == 4 and ls.settings["num_workers"] == 4
    m = summary(ls)
    assert m["batches_per_s"] == pytest.approx(20.0)
    assert m["batches"] == 220
    assert m["data_wait_mean"] == pytest.approx(0.61, abs=0.005)
    assert m["worker_uss_growth_max"] == 11 * (4 << 20)
    [span] = s.hints
    assert (span.id, span.start, span.end) == ("add-workers", 5.0, 11.0)
    assert span.evidence and span.suggestion


def test_report_is_self_contained_html_with_charts(tmp_path):
    html = report_html(build(reader.read(write(tmp_path / "a.jsonl", stream(12)))))
    assert html.startswith("<!doctype html>")
    assert not re.search(r"https?:|<script|<link|<img|@import|url\(", html)
    assert html.count("<svg") == 7  # hints, wait, rate, busy, CPU, memory, host
    assert "<polyline" in html and "add-workers" in html and "Next step:" in html
    assert "20.00" in html  # batches/s in the summary table


def test_compare_shows_settings_that_differ_and_the_change(tmp_path):
    a = build(reader.read(write(tmp_path / "a.jsonl", stream(10, workers=1, wait=0.8, rate=10.0))))
    b = build(
        reader.read(write(tmp_path / "b.jsonl", stream(10, workers=4, wait=0.1, rate=40.0, hint_from=99)))
    )
    c = compare(a, b)
    assert [(k, va, vb) for k, va, vb, _ in c.differing] == [("num_workers", 1, 4)]
    out = text(c)
    assert re.search(r"throughput \(batches/s\)\s+10\.00\s+40\.00\s+\+300 % \(×4\.00\)", out), out
    assert re.search(r"data wait, mean\s+80\.9 %\s+10\.9 %\s+-70\.0 points", out), out
    assert "hints only in A: add-workers" in out
    html = compare_html(c)
    assert 'class="differs"' in html and not re.search(r"https?:", html)


# ------------------------------------------------------------------ replay


def test_replay_source_plays_in_recorded_time_and_rebuilds_history():
    snaps = [fileformat.compact(s) for s in stream(5)]
    src = ReplaySource(snaps, speed=50)
    assert src.latest() is None
    src.start()
    try:
        assert src.latest()["time"] == T0
        deadline = time.monotonic() + 2
        while src.index < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert src.index == 4 and "ended" in src.status()
        history = src.latest()["jobs"][0]["loaders"][0]["history"]["data_wait_fraction"]
        assert history == [s["jobs"][0]["loaders"][0]["data_wait_fraction"] for s in snaps]
        src.dismiss(4242)
        assert src.latest()["jobs"] == []
    finally:
        src.stop()


def replay_app(snaps):
    src = ReplaySource([fileformat.compact(s) for s in snaps], name="rec.jsonl")
    return src, make_app(src, interval=0.1)


# A replay runs on the wall clock: under load it is past line 1 before the first check.
@pytest.mark.timing
def test_replay_keys_pause_seek_step_and_jump_to_the_next_hint():
    snaps = stream(40, hint_from=25)

    async def go():
        src, app = replay_app(snaps)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause(0.05)
            status = plain(app.screen.query_one("#status", TextLine))
            assert "▶ replay rec.jsonl 0:00 / 0:39 (line 1/40)" in status and "STALE" not in status
            await pilot.press("p")
            assert src.paused and "replay paused" in plain(app.screen.query_one("#status", TextLine))
            await pilot.press("right")
            assert src.index == 10 and app.snapshot["time"] == T0 + 10
            await pilot.press("left", "full_stop", "full_stop", "comma")
            assert src.index == 1
            await pilot.press("n")
            assert src.index == 25 and app.snapshot["hints"][0]["id"] == "add-workers"
            await pilot.press("n")  # no later hint: stays, says so
            assert src.index == 25
            await pilot.press("N")
            assert src.index == 25
            await pilot.press("greater_than_sign")
            assert src.index == 39
            await pilot.press("home")
            assert src.index == 0
            await pilot.press("end")
            assert src.index == 39
            await pilot.press("plus")
            assert src.speed == 2 and "×2" in plain(app.screen.query_one("#status", TextLine))
            await pilot.press("p")
            assert not src.paused

    asyncio.run(go())


def test_replay_keys_are_off_for_a_live_source_and_in_the_help_for_a_replay():
    from dlwatch.tui.help import HelpScreen

    async def go():
        app = make_app([F.data_bound()])
        async with app.run_test(size=(120, 40)) as pilot:
            assert app.check_action("replay_seek", (10,)) is False
            await pilot.press("right", "n")  # nothing happens, nothing breaks
            assert "every 0.5 s" in plain(app.screen.query_one("#status", TextLine))
        _, app = replay_app(stream(3))
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("question_mark")
            assert isinstance(app.screen, HelpScreen)
            assert "jump to the next / previous hint" in str(app.screen.query_one("#help-text").content)

    asyncio.run(go())


# ------------------------------------------------------------------ the CLI


def test_cli_errors_are_one_line(tmp_path, capsys, monkeypatch):
    missing = str(tmp_path / "missing.jsonl")
    for argv in (["replay", missing], ["report", missing], ["compare", missing, missing]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.strip().endswith("no such file") and "Traceback" not in err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n", encoding="utf-8")
    assert main(["report", str(empty)]) == 1
    assert "holds no snapshots" in capsys.readouterr().err
    assert main(["replay", str(tmp_path)]) == 1
    assert "is a directory" in capsys.readouterr().err
    rec = write(tmp_path / "a.jsonl.gz", stream(3))
    assert main(["record", "-o", rec, "--duration", "1"]) == 1
    assert "exists" in capsys.readouterr().err
    assert main(["record", "--interval", "0.01"]) == 2
    assert main(["replay", rec, "--speed", "0"]) == 2

    from dlwatch.tui import app as tui_app

    seen = {}
    monkeypatch.setattr(tui_app, "run_tui", lambda source, interval: seen.update(n=len(source)) or 0)
    monkeypatch.setattr(tui_app, "terminal_problem", lambda **kw: None)  # pytest's stdout is no terminal
    assert main(["replay", rec]) == 0 and seen == {"n": 3}
    assert main(["report", rec, "-o", str(tmp_path / "r.html")]) == 0
    html = (tmp_path / "r.html").read_text(encoding="utf-8")
    assert html.count("<svg") == 6 and "No hint was shown" in html  # no hint: no timeline


def test_what_is_no_recording_is_said_so_and_not_reported(tmp_path, capsys):
    """A QA run: `report` of `{"a": 1}` wrote an empty report (exit 0), a
    line of text was "torn (the recording was cut short)", an empty file was
    "not written by `dlwatch record`", a recording of no job reported."""
    cases = {
        "object.jsonl": ('{"a": 1}\n', 'line 1 is a JSON object but no snapshot (no "jobs" list): skipped'),
        "text.jsonl": ("hello, not json\n", "the last line is not a JSON object: skipped"),
        "empty.jsonl": ("", "the file is empty"),
    }
    for name, (content, said) in cases.items():
        path = tmp_path / name
        path.write_text(content, encoding="utf-8")
        assert main(["report", str(path), "-o", str(tmp_path / "r.html")]) == 1
        err = capsys.readouterr().err
        assert said in err and err.strip().endswith("holds no snapshots"), (name, err)
        assert "torn" not in err and ("no header" in err) is (name != "empty.jsonl"), (name, err)
    # Snapshots of no job (a command that failed before its job published).
    nothing = [dict(s, jobs=[]) for s in stream(2)]
    path = write(tmp_path / "none.jsonl", nothing)
    assert main(["report", path, "-o", str(tmp_path / "r.html")]) == 1
    assert capsys.readouterr().err.strip().endswith("holds 2 snapshots but no job's figures")
    assert not (tmp_path / "r.html").exists()
    # A torn last line after real snapshots is still a cut recording.
    whole = tmp_path / "cut.jsonl"
    whole.write_text("".join(json.dumps(s) + "\n" for s in stream(2)) + '{"time": 1', encoding="utf-8")
    assert main(["report", str(whole), "-o", str(tmp_path / "r.html")]) == 0
    assert "the last line is torn (the recording was cut short): skipped" in capsys.readouterr().err


def test_the_recorders_summary_counts_in_words():
    from types import SimpleNamespace

    from dlwatch.cli.recording import summary

    one = SimpleNamespace(
        jobs=set(), lines=1, elapsed_s=1.2, bytes=300, reason="the command exited with status 2"
    )
    said = summary("/nonexistent/x.jsonl", one, "dlwatch run")
    assert said.startswith("dlwatch run: 1 snapshot of 0 jobs over 1 s in /nonexistent/x.jsonl (0.3 KiB)")
    assert "(no dlwatch job was seen: it holds no figures); the command exited with status 2" in said
    two = SimpleNamespace(jobs={1}, lines=7, elapsed_s=3.0, bytes=2048, reason="Ctrl-C")
    assert summary("/nonexistent/y", two).startswith("dlwatch record: 7 snapshots of 1 job over 3 s")
