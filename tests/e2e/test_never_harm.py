"""The hook must not change what the job computes, prints or leaves behind."""

from __future__ import annotations

import os

import pytest

from tests.e2e_util import Job


def _run(*args, disable):
    job = Job(*args, disable=disable)
    try:
        result = job.finish()
        return result, job.stdout, job.stderr, sorted(os.listdir(job.dir))
    finally:
        job.cleanup()


@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_batches_identical_with_and_without_the_hook(method):
    args = [
        "--start-method",
        method,
        "--shuffle",
        "--seed",
        "7",
        "--size",
        "96",
        "--epochs",
        "2",
        "--sample-ms",
        "0",
        "--step-ms",
        "0",
        "--checksum",
        "--duration",
        "60",
    ]
    plain, out0, err0, left0 = _run(*args, disable=True)
    hooked, out1, err1, left1 = _run(*args, disable=False)
    assert len(plain["digest"]) == 2 * 96 // 4
    assert hooked["digest"] == plain["digest"]
    # Nothing printed by the hook: the job's output is byte-for-byte the same.
    assert (out1, err1) == (out0, err0)
    assert left1 == [] and left0 == [], "no socket file may outlive the job"


@pytest.mark.parametrize("workers", [0, 2])
def test_dataset_exception_surfaces_unchanged(workers):
    args = [
        "--workers",
        str(workers),
        "--raise-at",
        "9",
        "--size",
        "40",
        "--sample-ms",
        "0",
        "--step-ms",
        "0",
        "--duration",
        "60",
    ]
    plain, _, err0, _ = _run(*args, disable=True)
    hooked, _, err1, left = _run(*args, disable=False)
    assert plain["error"] is not None and plain["error"][0] == "ValueError"
    assert hooked["error"] == plain["error"] and hooked["chained"] == plain["chained"]
    assert "corrupt sample 9" in hooked["error"][1]
    # No dlwatch file in what the user reads (the trainer's traceback and the
    # worker's, copied into the message): the wrappers read as torch's frames.
    assert hooked["traceback"]["probe_frames"] == 0, hooked["traceback"]
    assert hooked["traceback"]["frames"] <= plain["traceback"]["frames"] + (2 if workers else 1)
    assert err1 == err0
    assert left == []


def test_disable_env_means_no_socket_and_no_patch(tmp_path):
    job = Job("--size", "64", "--sample-ms", "0", "--step-ms", "0", "--duration", "60", disable=True)
    try:
        job.finish()
        assert os.listdir(job.dir) == []
    finally:
        job.cleanup()
