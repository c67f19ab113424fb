"""Loaders as they are in the wild, run for real (tests/jobs/wild_loaders.py):
a producer thread feeding a queue, iterable datasets shared out badly, well
or not at all, and rare slow samples behind in-order delivery."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.e2e.test_interpreter import Proc, job_in
from tests.e2e_util import snapshot_json, truth_in_window

pytestmark = [pytest.mark.slow, pytest.mark.timing]

JOBS = Path(__file__).resolve().parent.parent / "jobs" / "wild_loaders.py"


def _start(mode: str, out: Path, *args: str) -> Proc:
    return Proc(JOBS, mode, str(out), *args)


def _finish(job: Proc, out: Path) -> dict:
    rc, _, err = job.finish(timeout=120)
    assert rc == 0, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    return json.loads(out.read_text())


def _the_loader(snap: dict, pid: int) -> tuple[dict, list[dict]]:
    j = job_in(snap, pid)
    (ld,) = j["loaders"]
    return ld, [h for h in snap["hints"] if h["job_pid"] == pid]


def test_thread_fed_and_iterable_loaders(tmp_path):
    """Four jobs side by side (their datasets sleep: they do not compete for
    the CPU much), one snapshot of each after a few seconds of steady state."""
    modes = ("thread", "unsharded", "sharded", "duplicated")
    # Long enough for the four snapshots, taken one after the other.
    jobs = {m: _start(m, tmp_path / f"{m}.json", "--train-s", "12") for m in modes}
    snaps = {}
    try:
        for m in modes:
            jobs[m].json_line("ready", timeout=120)
        time.sleep(3.5)
        for m in modes:
            snaps[m] = snapshot_json(jobs[m].dir, "--window", "2")
        own = {m: _finish(jobs[m], tmp_path / f"{m}.json") for m in modes}
    finally:
        for j in jobs.values():
            j.cleanup()

    # A producer thread waits on a num_workers=0 loader most of its time; the
    # training loop, fed from the queue, hardly ever waits.
    ld, hints = _the_loader(snaps["thread"], jobs["thread"].pid)
    assert ld["iterated_on"] == {"thread": "producer", "main": False}
    assert ld["num_workers"] == 0 and ld["data_wait_fraction"] > 0.3
    loop = truth_in_window(own["thread"]["spans"], *ld["window_mono_ns"])
    assert loop["data_wait_fraction"] < 0.1, loop
    assert [h["id"] for h in hints] == ["thread-fed-loader"], hints
    assert hints[0]["severity"] == "info"
    assert "producer" in hints[0]["message"] and "cannot see" in hints[0]["message"]

    # One "file" shared out by worker id among 3 workers: workers 1 and 2
    # get nothing (they exit at once), worker 0 loads everything.
    ld, hints = _the_loader(snaps["unsharded"], jobs["unsharded"].pid)
    assert ld["kind"] == "iterable" and ld["dataset"] == "Files"
    assert ld["data_wait_fraction"] > 0.3
    by_id = {h["id"]: h for h in hints}
    assert "idle-workers" in by_id, hints
    idle = by_id["idle-workers"]
    assert [w["id"] for w in idle["evidence"]["idle_workers"]] == [1, 2]
    assert all(w["window_batches"] == 0 for w in idle["evidence"]["idle_workers"])
    assert "worker 1: 0" in idle["message"] and "get_worker_info()" in idle["suggestion"]
    assert not set(by_id) & {"add-workers", "io-bound", "duplicated-samples", "head-of-line-blocking"}

    # Three files, one a worker: every worker delivers its share.
    ld, hints = _the_loader(snaps["sharded"], jobs["sharded"].pid)
    assert all(w["window_batches"] > 0 for w in ld["workers"]), ld["workers"]
    assert not {h["id"] for h in hints} & {"idle-workers", "duplicated-samples"}, hints

    # No sharding at all: every worker yields the same stream.
    ld, hints = _the_loader(snaps["duplicated"], jobs["duplicated"].pid)
    by_id = {h["id"]: h for h in hints}
    assert "duplicated-samples" in by_id, hints
    assert by_id["duplicated-samples"]["evidence"]["duplicated_workers"] == [[0, 1, 2]]
    assert not set(by_id) & {"idle-workers", "add-workers", "io-bound"}
