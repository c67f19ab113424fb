"""Whatever feeds the loop (issue 41): the demo/ scripts, one per pipeline
kind, run unmodified under `dlwatch run`, each timing its own loop's next();
dlwatch's data wait for each must be the loop's own over the same window.

The jobs run side by side with a step that leaves the host thread idle (a
sleep standing in for a GPU step): that is where a feeder's figures used to
pass for the loop's, and it leaves the two cores to the pipelines."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e_util import short_tmpdir, snapshot_json, truth_in_window

pytestmark = pytest.mark.timing

DEMO = Path(__file__).resolve().parents[2] / "demo"
# DESIGN §5 asks 2 points of a DataLoader's wait; issue 41 asks 3 for every pipeline.
TOLERANCE = 0.03


class DemoJob:
    def __init__(self, script: str, *args: str, tmp: Path) -> None:
        self.dir = short_tmpdir()
        self.spans = tmp / f"{script}-{len(args)}.json"
        self.stop = tmp / f"{script}-{len(args)}.stop"
        env = dict(os.environ, DLWATCH_DIR=self.dir, PYTHONUNBUFFERED="1")
        env.pop("DLWATCH_DISABLE", None)
        cmd = [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, str(DEMO / script)]
        cmd += [*args, "--seconds", "120", "--spans", str(self.spans), "--stop-file", str(self.stop)]
        self.p = subprocess.Popen(
            cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        )
        self.pid: int | None = None

    def ready(self, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while self.pid is None:
            r, _, _ = select.select([self.p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            assert r, "no 'ready' line"
            line = self.p.stdout.readline()
            assert line, f"job ended: {self.p.stderr.read()[-3000:]}"
            if line.startswith("ready "):
                self.pid = json.loads(line[6:])["pid"]

    def finish(self) -> list:
        self.stop.touch()
        _, err = self.p.communicate(timeout=120)
        assert self.p.returncode == 0, err[-3000:]
        assert "Traceback" not in err, err[-3000:]
        return json.loads(self.spans.read_text())["spans"]

    def kill(self) -> None:
        if self.p.poll() is None:
            os.killpg(self.p.pid, signal.SIGKILL)
            self.p.wait()


CASES = {
    "dataloader behind a producer thread": ("dataloader_thread.py", "--step", "idle"),
    "torchdata.nodes, thread workers": ("nodes_pipeline.py", "--step", "idle"),
    "grain, thread prefetch": ("grain_pipeline.py", "--step", "idle"),
}


def test_every_pipeline_kind_reports_the_loops_own_wait(tmp_path):
    jobs = {name: DemoJob(*args, tmp=tmp_path) for name, args in CASES.items()}
    snaps, spans = {}, {}
    try:
        for j in jobs.values():
            j.ready()
        time.sleep(6.0)
        for name, j in jobs.items():
            snaps[name] = snapshot_json(j.dir, "--window", "3")
        for name, j in jobs.items():
            spans[name] = j.finish()
    finally:
        for j in jobs.values():
            j.kill()
    for name, j in jobs.items():
        (job,) = [x for x in snaps[name]["jobs"] if x["pid"] == j.pid]
        loops = [ld for ld in job["loaders"] if ld["loop_role"] == "loop" and ld["active"]]
        assert len(loops) == 1, (name, job["loaders"])
        ld = loops[0]
        own = truth_in_window(spans[name], *ld["window_mono_ns"])
        assert ld["data_wait_fraction"] is not None, (name, ld)
        assert abs(ld["data_wait_fraction"] - own["data_wait_fraction"]) <= TOLERANCE, (name, ld, own)
        hints = [h for h in snaps[name]["hints"] if h["job_pid"] == j.pid]
        # No hint reads a feeder's figure as the loop's, and advice names the pipeline's own knob.
        for h in hints:
            assert "num_workers=" not in h["suggestion"] or ld["library"] in ("torch", "monai"), (name, h)
    thread_fed = next(ld for ld in snaps["dataloader behind a producer thread"]["jobs"][0]["loaders"])
    assert thread_fed["consumer"]["thread"] == "MainThread" and thread_fed["feeder"]["thread"] == "producer"
    nodes = [ld for ld in snaps["torchdata.nodes, thread workers"]["jobs"][0]["loaders"] if ld["active"]][0]
    assert nodes["library"] == "torchdata.nodes" and nodes["knobs"]["ParallelMapper.num_workers"] == 2
    assert nodes["worker_kind"] == "thread" and len(nodes["pipeline_workers"]) == 2
    grain = [ld for ld in snaps["grain, thread prefetch"]["jobs"][0]["loaders"] if ld["active"]][0]
    assert grain["library"] == "grain" and grain["knobs"]["ReadOptions.num_threads"] == 2
