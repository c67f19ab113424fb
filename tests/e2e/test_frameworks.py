"""Each framework's own training loop, with the real package: the data wait
dlwatch reports against the wait the framework's loop sees (measured in its
callbacks/hooks), the workers found, the hints, and the user's dataset named
beneath the framework's wrappers. One job per framework, all side by side.
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path

import pytest

from tests.e2e.test_interpreter import Proc, job_in
from tests.e2e_util import snapshots_json, truth_in_window

pytestmark = pytest.mark.timing

JOBS = Path(__file__).resolve().parent.parent / "jobs" / "framework_jobs.py"
# Points of data-wait fraction between dlwatch and the framework's own view.
WAIT_TOLERANCE = 0.03


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


# Each framework job and the package it needs; the installed ones run side by
# side (their workers sleep: the loops leave the cores to each other).
FRAMEWORKS = {
    "lightning": "lightning",
    "hf": "transformers",
    "accelerate": "accelerate",
    "stateful": "torchdata",
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[dict, dict, list, dict]]:
    """Every installed framework's job, snapshotted ``SETTLE_S`` after the
    last one's first batch, the snapshots taken side by side. For each:
    (ready info, the job's loader in the snapshot, the snapshot's hints on
    it, the job's own measurements)."""
    tmp = tmp_path_factory.mktemp("frameworks")
    names = [n for n, mod in FRAMEWORKS.items() if _has(mod)]
    stop = tmp / "stop"
    # They train until the snapshots are taken (at most 5 minutes).
    env = {"TRAIN_S": "300", "STOP_FILE": str(stop)}
    jobs = {n: Proc(JOBS, n, str(tmp / f"{n}.json"), env=env) for n in names}
    try:
        infos = {n: job.json_line("ready", timeout=180) for n, job in jobs.items()}
        time.sleep(SETTLE_S)
        snaps = snapshots_json({n: job.dir for n, job in jobs.items()}, "--window", "2")
        stop.touch()
        for n, job in jobs.items():
            rc, stdout, err = job.finish(timeout=120)
            assert rc == 0, (n, err[-3000:])
            assert "fit-done" in stdout, n
        owns = {n: json.loads((tmp / f"{n}.json").read_text()) for n in names}
    finally:
        for job in jobs.values():
            job.cleanup()
    out = {}
    for n, job in jobs.items():
        j = job_in(snaps[n], job.pid)
        train = [ld for ld in j["loaders"] if ld["num_workers"] == 2 and ld.get("active")]
        assert len(train) == 1, (n, j["loaders"])
        ld = train[0]
        hints = [h for h in snaps[n]["hints"] if h["job_pid"] == job.pid and h["loader_id"] == ld["id"]]
        out[n] = (infos[n], ld, hints, owns[n])
    return out


SETTLE_S = 3.0


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


@pytest.mark.skipif(not _has("lightning"), reason="lightning not installed (the test extra has it)")
def test_lightning_trainer_fit_with_a_datamodule(runs):
    _, ld, hints, own = runs["lightning"]
    _check(ld, hints, own, "SleepyVectors")
    # In Lightning's terms: its fit loop's loader, advice about the DataModule's.
    assert (ld["framework"], ld["role"]) == ("lightning", "train")
    assert (
        "your train_dataloader() returns (in your LightningModule or LightningDataModule)"
        in hints[0]["suggestion"]
    ), hints


@pytest.mark.skipif(not _has("transformers"), reason="transformers not installed (the test extra has it)")
def test_transformers_trainer_with_a_tokenizing_collate(runs):
    _, ld, hints, own = runs["hf"]
    _check(ld, hints, own, "SleepyText", batch_ms=96)
    # In the Trainer's terms: its training loop's loader, its TrainingArguments knob.
    assert (ld["framework"], ld["role"]) == ("transformers", "train")
    assert "set dataloader_num_workers=" in hints[0]["suggestion"], hints


@pytest.mark.skipif(not _has("accelerate"), reason="accelerate not installed (the test extra has it)")
def test_accelerate_prepared_loader_wait_matches_the_loop(runs):
    info, ld, hints, own = runs["accelerate"]
    assert info["loader_type"] == "DataLoaderShard"
    _check(ld, hints, own, "SleepyVectors")
    assert ld["framework"] == "accelerate"
    assert "the DataLoader you pass to accelerator.prepare()" in hints[0]["suggestion"], hints


@pytest.mark.skipif(not _has("torchdata"), reason="torchdata not installed (the test extra has it)")
def test_stateful_dataloader_resumed_from_its_state_dict(runs):
    _, ld, hints, own = runs["stateful"]
    facts = own["facts"]
    # torchdata resumed where the state was taken; dlwatch counts the resumed
    # loader's own batches only (its fast-forward is not the loop's).
    assert facts["first_after_resume"] == facts["expected_first_after_resume"]
    assert ld["id"] == 1
    assert ld["batches_total"] <= facts["batches_after_resume"] + 1
    _check(ld, hints, own, "SleepyVectors")


@pytest.mark.skipif(not _has("lightning"), reason="lightning not installed (the test extra has it)")
def test_a_lightning_validation_pauses_the_train_loader_and_is_never_its_stall(tmp_path):
    """A QA run of Lightning's imagenet example: at every switch to
    validation the train loader read "no batch for 25 s" (a critical
    loader-stalled), and the eval loader's step counted the training between
    validations. A monitor watches the whole run here, the stall threshold
    at 2 s and each validation's first batch taking 5 s."""
    from dlwatch.collect.monitor import Monitor

    job = Proc(JOBS, "lightning_validation", str(tmp_path / "v.json"), env={"DLWATCH_STALL_FLOOR_S": "2"})
    m = Monitor(directory=job.dir, interval=0.5, gpu=False)
    seen: list[dict] = []
    try:
        job.line("ready", timeout=180)
        m.start()
        end = time.monotonic() + 120
        while job.p.poll() is None and time.monotonic() < end:
            snap = m.latest()
            if snap:
                seen.append(snap)
            time.sleep(0.5)
        rc, stdout, err = job.finish(timeout=60)
    finally:
        m.stop()
        job.cleanup()
    assert rc == 0 and "fit-done" in stdout, err[-3000:]
    loaders = [ld for s in seen for j in s["jobs"] if j["pid"] == job.pid for ld in j["loaders"]]
    roles = {ld.get("role") for ld in loaders}
    assert {"train", "eval"} <= roles, roles
    # Two validations of over 5 s each were watched, and not one stall said.
    evals = [ld for ld in loaders if ld.get("role") == "eval"]
    assert max(ld["epoch"] for ld in evals) >= 2, evals[-1]
    assert not [ld["stalled_s"] for ld in loaders if ld.get("stalled_s")], "a loader read as stalled"
    assert not [h for s in seen for h in s["hints"] if h["id"] == "loader-stalled"]
    # The eval loader's step is its own loop's (milliseconds), never the
    # training between validations (seconds).
    steps = [ld["step_ms_mean"] for ld in evals if ld.get("step_ms_mean") is not None]
    assert steps and max(steps) < 1000, steps


@pytest.mark.skipif(not _has("lightning"), reason="lightning not installed (the test extra has it)")
def test_lightnings_sanity_loader_left_open_is_set_aside_not_part_of_the_loop(tmp_path):
    """A run of Lightning's imagenet example: the sanity check stops its
    validation loader at 2 batches with the epoch open, and every snapshot
    read "loop on thread 'MainThread' takes from loaders 0 and 1" (its share
    from a window stretched over 46 s), priced the train loader's advice
    against it, and listed it as judging "(2 of the 5 batches …)"."""
    from dlwatch.cli.text import render_snapshot
    from dlwatch.snapshot import SET_ASIDE_S

    stop = tmp_path / "stop"
    job = Proc(
        JOBS, "lightning_sanity", str(tmp_path / "s.json"), env={"TRAIN_S": "120", "STOP_FILE": str(stop)}
    )
    try:
        job.json_line("ready", timeout=180)
        end = time.monotonic() + 90
        while True:
            snap = snapshots_json({"s": job.dir}, "--window", "2")["s"]
            j = job_in(snap, job.pid)
            (val,) = [ld for ld in j["loaders"] if ld.get("role") == "eval"]
            if (val.get("last_batch_age_s") or 0) > SET_ASIDE_S + 1 or time.monotonic() > end:
                break
            time.sleep(1)
        stop.touch()
        rc, stdout, err = job.finish(timeout=120)
    finally:
        job.cleanup()
    assert rc == 0 and "fit-done" in stdout, err[-3000:]
    # The premise: two batches, the epoch left open, training going on.
    assert (val["batches_total"], val["epoch_open"], val["active"]) == (2, True, True), val
    (train,) = [ld for ld in j["loaders"] if ld.get("role") == "train"]
    assert train["last_batch_age_s"] < 1.0 and train["batches_per_s"] > 0, train
    assert j["loops"] == [], j["loops"]
    assert not [e for e in snap["judging"] if e["loader_id"] == val["id"]], snap["judging"]
    assert not [h for h in snap["hints"] if "also takes from loader" in h["message"]], snap["hints"]
    assert f"  loader {val['id']} (" in (text := render_snapshot(snap))
    assert "set aside: no batch for" in text and "loop on thread" not in text, text
