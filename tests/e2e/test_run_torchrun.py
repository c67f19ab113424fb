"""`dlwatch run -- torchrun ...` instruments every rank with no code change."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from tests.e2e_util import dlwatch, short_tmpdir


def test_torchrun_ranks_are_instrumented_and_grouped():
    d = short_tmpdir()
    work = short_tmpdir("dlwtr")
    stop = os.path.join(work, "stop")
    job = Path(__file__).parent.parent / "jobs" / "ranked_job.py"
    env = dict(os.environ, DLWATCH_DIR=d, OMP_NUM_THREADS="1")
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dlwatch",
            "run",
            "--",
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            str(job),
            stop,
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=work,
    )
    try:
        jobs = []
        end = time.monotonic() + 60
        while time.monotonic() < end:
            r = dlwatch("snapshot", "--json", "--window", "1", "--judge", "0", runtime_dir=d)
            assert r.returncode == 0, r.stderr
            jobs = [j for j in json.loads(r.stdout)["jobs"] if j["loaders"]]
            if len(jobs) == 2 and all(j["loaders"][0]["batches_total"] > 0 for j in jobs):
                break
            time.sleep(0.5)
        assert len(jobs) == 2, jobs
        assert sorted(j["rank"] for j in jobs) == [0, 1]
        assert {j["world_size"] for j in jobs} == {2}
        assert len({j["run_id"] for j in jobs}) == 1 and jobs[0]["run_id"]
        # The torchrun launcher itself runs no DataLoader: no socket of its own.
        socks = os.listdir(d)
        assert len(socks) == 2, socks
    finally:
        open(stop, "w").close()
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
        shutil.rmtree(work, ignore_errors=True)
    assert p.returncode == 0, p.stderr.read().decode()[-2000:]
    assert os.listdir(d) == []
