"""``dlwatch compare --max-regression``: the gate's verdict (a pure function,
table-tested), its text and JSON, and the CLI's exit statuses on written
recordings. Real recordings of real jobs: tests/e2e/test_record.py."""

from __future__ import annotations

import gzip
import json

import pytest

from dlwatch.cli.main import main
from dlwatch.record.compare import gate, reasons
from tests.unit.test_record import stream, write


def fig(rate, wait=0.2, bs=32):
    return {"batches_per_s": rate, "data_wait_mean": wait, "batch_size": bs}


# (A, B, max_regression, max_wait_increase) -> (failed figures, problem or None)
CASES = [
    ("same speed", fig(10), fig(10), 10, None, [], None),
    ("9 % slower, 10 allowed", fig(10), fig(9.1), 10, None, [], None),
    ("exactly 10 % slower is not more than 10", fig(10), fig(9), 10, None, [], None),
    ("11 % slower", fig(10), fig(8.9), 10, None, ["batches/s", "samples/s"], None),
    ("faster", fig(10), fig(40), 10, None, [], None),
    ("0 allowed: any drop fails", fig(10), fig(9.99), 0, None, ["batches/s", "samples/s"], None),
    ("no batch size: batches/s only", fig(10, bs=None), fig(8, bs=None), 10, None, ["batches/s"], None),
    ("one batch size unknown", fig(10), fig(8, bs=None), 10, None, ["batches/s"], None),
    # Twice the batch at 60 % of the batches/s is 20 % more samples: no regression.
    ("bigger batches, fewer of them", fig(10, bs=32), fig(6, bs=64), 10, None, [], None),
    ("bigger batches, too slow", fig(10, bs=32), fig(4, bs=64), 10, None, ["samples/s"], None),
    ("wait rose 4 points, 5 allowed", fig(10, 0.20), fig(10, 0.24), None, 5, [], None),
    ("wait rose 6 points", fig(10, 0.20), fig(10, 0.26), None, 5, ["data wait"], None),
    ("wait fell", fig(10, 0.50), fig(10, 0.10), None, 0, [], None),
    ("both limits, only wait fails", fig(10, 0.1), fig(10, 0.9), 10, 5, ["data wait"], None),
    ("A without throughput", fig(None), fig(10), 10, None, [], "A has no throughput figure"),
    ("B without throughput", fig(10), fig(None), 10, None, [], "B has no throughput figure"),
    ("A moved nothing", fig(0.0), fig(10), 10, None, [], "A's main loader moved no batches"),
    ("B moved nothing", fig(10), fig(0.0), 10, None, ["batches/s", "samples/s"], None),
    ("no wait figure", fig(10, None), fig(10), 10, 5, [], "A has no data-wait figure"),
    ("garbage figures", {"batches_per_s": "x"}, fig(10), 10, None, [], "A has no throughput figure"),
]


@pytest.mark.parametrize("name,a,b,pct,points,failed,problem", CASES, ids=[c[0] for c in CASES])
def test_gate(name, a, b, pct, points, failed, problem):
    v = gate(a, b, pct, points)
    assert [c.figure for c in v.failed] == failed
    if problem is None:
        assert v.problem is None
        # Every judged figure says why, in a sentence naming both values.
        judged = [c for c in v.checks if not c.note]
        assert len(reasons(v)) == len(judged) > 0
        assert all(r.startswith("FAIL: " if i < len(failed) else "ok: ") for i, r in enumerate(reasons(v)))
    else:
        assert v.problem is not None and v.problem.startswith(problem)


def test_a_batch_size_change_shows_batches_per_s_but_judges_samples_per_s():
    v = gate(fig(10, bs=32), fig(6, bs=64), 10)
    bps, sps = v.checks
    assert bps.note == "not judged: batch_size differs (A 32, B 64)" and not bps.failed
    assert sps.a == 320 and sps.b == 384 and sps.change == pytest.approx(20.0)


@pytest.fixture
def pair(tmp_path):
    fast = write(tmp_path / "fast.jsonl", stream(10, workers=4, wait=0.1, rate=40.0))
    slow = write(tmp_path / "slow.jsonl.gz", stream(10, workers=1, wait=0.8, rate=10.0), gz=True)
    return fast, slow


def test_cli_exits_3_on_a_regression_and_says_why(pair, capsys):
    fast, slow = pair
    assert main(["compare", fast, slow, "--max-regression", "10"]) == 3
    out = capsys.readouterr().out
    # The comparison table, then the verdict with the loaders compared and the figures.
    assert "throughput (batches/s)" in out
    assert "gate: FAIL (B's job 4242 loader 0 against A's job 4242 loader 0)" in out
    assert "FAIL: B's batches/s is 75.0 % below A's (40.00 -> 10.00), more than the 10 % drop allowed" in out
    assert main(["compare", slow, fast, "--max-regression", "10"]) == 0
    out = capsys.readouterr().out
    assert "gate: pass" in out and "ok: B's batches/s is 300.0 % above A's" in out
    # The data wait alone.
    assert main(["compare", fast, slow, "--max-wait-increase", "5"]) == 3
    assert "FAIL: B's data wait rose 70.0 points" in capsys.readouterr().out
    assert main(["compare", fast, fast, "--max-regression", "0", "--max-wait-increase", "0"]) == 0


def test_cli_json_carries_the_verdict_and_the_exit_status(pair, capsys):
    fast, slow = pair
    assert main(["compare", fast, slow, "--max-regression", "10", "--json"]) == 3
    doc = json.loads(capsys.readouterr().out)
    assert doc["exit_status"] == 3 and doc["gate"]["result"] == "fail"
    assert doc["a"]["loader"]["job_pid"] == 4242 and doc["a"]["settings"]["num_workers"] == 4
    assert doc["a"]["figures"]["batches_per_s"] == pytest.approx(40.0)
    assert doc["settings_differing"] == ["num_workers"]
    bps = doc["gate"]["checks"][0]
    assert (bps["figure"], bps["unit"], bps["failed"]) == ("batches/s", "%", True)
    assert bps["change"] == pytest.approx(-75.0)
    assert main(["compare", slow, fast, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["gate"] is None and doc["exit_status"] == 0


def test_cli_exits_1_when_a_recording_cannot_say(pair, tmp_path, capsys):
    fast, slow = pair
    # Empty, and torn before its first snapshot ended.
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    torn = tmp_path / "torn.jsonl.gz"
    with open(slow, "rb") as f:
        whole = gzip.decompress(f.read())
    # The header, then a first line cut mid-way: a recorder killed at once.
    torn.write_bytes(gzip.compress(whole[: whole.index(b"\n") + 200]))
    for bad, why in ((str(empty), "holds no snapshots"), (str(torn), "holds no snapshots")):
        assert main(["compare", fast, bad, "--max-regression", "10"]) == 1
        err = capsys.readouterr().err
        assert why in err and "Traceback" not in err
    assert "torn" in err  # the reader's warning, then the error
    # Snapshots, but a loader seen once: no throughput to judge, not a pass.
    once = write(tmp_path / "once.jsonl", stream(1))
    assert main(["compare", fast, once, "--max-regression", "10"]) == 1
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert last.startswith("dlwatch compare: cannot judge: B has no throughput figure"), err
    # Usage.
    assert main(["compare", fast, slow, "--max-regression", "-1"]) == 2
    err = capsys.readouterr().err
    assert "--max-regression must be between 0 and 100" in err
    with pytest.raises(SystemExit) as e:
        main(["compare", fast, slow, "--max-wait-increase", "nan"])
    assert e.value.code == 2
    assert "argument --max-wait-increase: must be a finite number, not 'nan'" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["compare", fast, slow, "--max-regression", "abc"])
    assert e.value.code == 2


def test_the_recording_and_the_main_loaders_span_are_named_apart(tmp_path, capsys):
    # The job's first 3 s have no loader yet: `run --record` said "over 9 s".
    snaps = stream(10)
    for s in snaps[:3]:
        s["jobs"][0]["loaders"] = []
    path = write(tmp_path / "a.jsonl", snaps)
    assert main(["compare", path, path]) == 0
    out = capsys.readouterr().out
    assert "recording (s)  " in out and "main loader seen (s)" in out and "recorded (s)" not in out
    rows = {ln.split("  ")[0]: ln.split()[-4] for ln in out.splitlines() if "(s)" in ln}
    assert rows == {"recording (s)": "9.0", "main loader seen (s)": "6.0"}, out


def test_compare_sets_workers_memory_like_with_like_and_fills_its_settings_table(tmp_path, capsys):
    """Workers re-created every epoch end a recording newly born: their USS
    "at the end" (16 MiB beside 198) compares a fresh worker with a grown one.
    The largest sum at one time compares the grown workers of both runs."""
    a = stream(12, workers=2)
    for snap in a:
        snap["jobs"][0]["loaders"][0]["persistent_workers"] = True
    b = stream(12, workers=2)
    for i, snap in enumerate(b):
        ld = snap["jobs"][0]["loaders"][0]
        ld["persistent_workers"] = False
        for w in ld["workers"]:
            # Epochs of 4 lines: the workers grow from 16 MiB, then restart.
            w["uss_bytes"] = (16 << 20) + (i % 4) * (60 << 20)
    pa, pb = write(tmp_path / "a.jsonl", a), write(tmp_path / "b.jsonl", b)
    assert main(["compare", pa, pb]) == 0
    out = capsys.readouterr().out
    assert "at the end" not in out
    row = next(line for line in out.splitlines() if line.startswith("workers' USS"))
    # A: 2 x (100 + 11 x 4) MiB = 288 MiB; B: 2 x (16 + 3 x 60) MiB = 392 MiB.
    assert "288 MiB  392 MiB" in row, row
    settings = out.split("\n\n")[1].splitlines()
    assert settings[0].split() == ["setting", "A", "B", "B", "vs", "A"]
    assert all(line.split()[-1] in ("same", "differs") for line in settings[1:]), settings
    assert any(line.startswith("persistent_workers") and line.endswith("differs") for line in settings)
