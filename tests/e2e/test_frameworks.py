"""Each framework's own training loop, with the real package: the data wait
dlwatch reports against the wait the framework's loop sees (measured in its
callbacks/hooks), the workers found, the hints, and the user's dataset named
beneath the framework's wrappers. One job per framework (their imports are slow).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from tests.e2e.test_interpreter import Proc, job_in
from tests.e2e_util import snapshot_json, truth_in_window

pytestmark = pytest.mark.timing

JOBS = Path(__file__).resolve().parent.parent / "jobs" / "framework_jobs.py"
# Points of data-wait fraction between dlwatch and the framework's own view.
WAIT_TOLERANCE = 0.03


def _run(name: str, tmp: Path, settle_s: float = 3.0) -> tuple[dict, dict, dict, dict]:
    """Run one framework job; snapshot it ``settle_s`` after its first batch.
    Returns (ready info, the job's loader in the snapshot, the snapshot's
    hints on it, the job's own measurements)."""
    out, stop = tmp / "spans.json", tmp / "stop"
    # It trains until the snapshot is taken (at most 5 minutes).
    job = Proc(JOBS, name, str(out), env={"TRAIN_S": "300", "STOP_FILE": str(stop)})
    try:
        info = job.json_line("ready", timeout=180)
        time.sleep(settle_s)
        snap = snapshot_json(job.dir, "--window", "2")
        stop.touch()
        rc, stdout, err = job.finish(timeout=120)
        assert rc == 0, err[-3000:]
        assert "fit-done" in stdout
        own = json.loads(out.read_text())
    finally:
        job.cleanup()
    j = job_in(snap, job.pid)
    train = [ld for ld in j["loaders"] if ld["num_workers"] == 2 and ld.get("active")]
    assert len(train) == 1, j["loaders"]
    ld = train[0]
    hints = [h for h in snap["hints"] if h["job_pid"] == job.pid and h["loader_id"] == ld["id"]]
    return info, ld, hints, own


def _check(ld: dict, hints: list[dict], own: dict, dataset: str, batch_ms: float = 48) -> None:
    start, end = ld["window_mono_ns"]
    truth = truth_in_window(own["spans"], start, end)
    assert ld["data_wait_fraction"] == pytest.approx(truth["data_wait_fraction"], abs=WAIT_TOLERANCE), (
        ld["data_wait_fraction"],
        truth,
    )
    # The workers, each delivering; the user's dataset, not a wrapper.
    assert len(ld["workers"]) == 2
    assert all(w["pid"] > 0 and w["batches"] > 0 for w in ld["workers"]), ld["workers"]
    assert ld["dataset"] == dataset
    assert ld["iterated_on"] == {"thread": "MainThread", "main": True}
    # Sleeping workers, busy all the time, a loop that waits about half of
    # its time: more workers, and I/O the reason; nothing else.
    assert [h["id"] for h in hints] == ["io-bound"], hints
    # The fetch-time tail: sleeps of 8 samples, a little late on a busy box.
    assert all(w["fetch_ms_p50"] == pytest.approx(batch_ms, rel=0.25) for w in ld["workers"]), ld["workers"]


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


@pytest.mark.skipif(not _has("lightning"), reason="lightning not installed (the test extra has it)")
def test_lightning_trainer_fit_with_a_datamodule(tmp_path):
    _, ld, hints, own = _run("lightning", tmp_path)
    _check(ld, hints, own, "SleepyVectors")
    # In Lightning's terms: its fit loop's loader, advice about the DataModule's.
    assert (ld["framework"], ld["role"]) == ("lightning", "train")
    assert "LightningDataModule's train_dataloader()" in hints[0]["suggestion"], hints


@pytest.mark.skipif(not _has("transformers"), reason="transformers not installed (the test extra has it)")
def test_transformers_trainer_with_a_tokenizing_collate(tmp_path):
    _, ld, hints, own = _run("hf", tmp_path)
    _check(ld, hints, own, "SleepyText", batch_ms=96)
    # In the Trainer's terms: its training loop's loader, its TrainingArguments knob.
    assert (ld["framework"], ld["role"]) == ("transformers", "train")
    assert "set dataloader_num_workers=" in hints[0]["suggestion"], hints


@pytest.mark.skipif(not _has("accelerate"), reason="accelerate not installed (the test extra has it)")
def test_accelerate_prepared_loader_wait_matches_the_loop(tmp_path):
    info, ld, hints, own = _run("accelerate", tmp_path)
    assert info["loader_type"] == "DataLoaderShard"
    _check(ld, hints, own, "SleepyVectors")
    assert ld["framework"] == "accelerate"
    assert "the DataLoader you pass to accelerator.prepare()" in hints[0]["suggestion"], hints


@pytest.mark.skipif(not _has("torchdata"), reason="torchdata not installed (the test extra has it)")
def test_stateful_dataloader_resumed_from_its_state_dict(tmp_path):
    _, ld, hints, own = _run("stateful", tmp_path)
    facts = own["facts"]
    # torchdata resumed where the state was taken; dlwatch counts the resumed
    # loader's own batches only (its fast-forward is not the loop's).
    assert facts["first_after_resume"] == facts["expected_first_after_resume"]
    assert ld["id"] == 1
    assert ld["batches_total"] <= facts["batches_after_resume"] + 1
    _check(ld, hints, own, "SleepyVectors")
