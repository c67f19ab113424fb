"""GPU-only checks (NVML figures, the pin-memory thread, CUDA copies).

They skip cleanly without a CUDA GPU (CI never has one); run them on a GPU
machine with `pytest -m gpu tests/test_gpu.py`.
"""

from __future__ import annotations

import pytest

from tests.e2e_util import Job, snapshot_json, truth_in_window

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _only_job(snap, pid):
    jobs = [j for j in snap["jobs"] if j["pid"] == pid]
    assert jobs, snap
    return jobs[0]


@pytest.mark.parametrize("pin", [True, False])
def test_cuda_job_with_and_without_pinned_memory(pin):
    args = ["--cuda", "--start-method", "fork", "--step-ms", "2"] + (["--pin-memory"] if pin else [])
    job = Job(*args)
    try:
        job.wait_ready(3.0)
        snap = snapshot_json(job.dir, "--window", "2")
        result = job.finish()
    finally:
        job.cleanup()
    assert snap["gpu_status"] == "ok", snap["gpu_status"]
    assert snap["gpus"] and snap["gpus"][0]["mem_total_bytes"] > 0
    assert snap["gpus"][0]["util_percent"] > 0
    j = _only_job(snap, job.proc.pid)
    assert j["cuda_initialized"] is True
    ld = j["loaders"][0]
    assert ld["pin_memory"] is pin
    # With pin_memory the data queue is the pin thread's output queue: still readable.
    assert ld["queue"]["capacity"] == 4 and ld["queue"]["ready"] is not None
    start, end = ld["window_mono_ns"]
    truth = truth_in_window(result["recs"]["train"]["batches"], start, end)
    assert ld["data_wait_fraction"] == pytest.approx(truth["data_wait_fraction"], abs=0.02)
    ids = {h["id"] for h in snap["hints"]}
    # Batches of 4 scalars: a pageable copy of 16 bytes cannot matter, pinned
    # or not, so no pin-memory hint (docs/gpu.md); bench/gpu_check.py has the
    # large-batch case.
    assert ld["batch_bytes"] is not None and ld["batch_bytes"] < 1024, ld.get("batch_bytes")
    assert "enable-pin-memory" not in ids, snap["hints"]
