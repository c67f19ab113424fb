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
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dlwatch.collect import process_group
from tests.e2e_util import short_tmpdir, snapshots_json, truth_in_window

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
            process_group.kill(self.p.pid)
            self.p.wait()


# Two groups of three jobs side by side (more would starve each other on 2 cores).
GROUPS = {
    "queue, nodes, grain": {
        "dataloader behind a producer thread": ("dataloader_thread.py", "--step", "idle"),
        # One long epoch: ParallelMapper restarts its threads at every epoch, and a
        # snapshot taken across that restart lists none.
        "torchdata.nodes, thread workers": (
            "nodes_pipeline.py",
            "--step",
            "idle",
            "--epoch-samples",
            "100000",
        ),
        "grain, thread prefetch": ("grain_pipeline.py", "--step", "idle"),
    },
    "monai, webdataset, watch": {
        "monai ThreadDataLoader": ("monai_thread.py", "--step", "idle"),
        "webdataset iterated directly": ("webdataset_shards.py", "--step", "idle"),
        "a watched generator": ("watched_generator.py", "--step", "idle"),
    },
}


def _run(cases: dict, tmp: Path) -> dict[str, tuple[dict, list, dict]]:
    """Each case's loop loader in one snapshot, the hints on its job, and what
    a hint weighed besides the loader: the host's cores, the trainer's CPU."""
    jobs = {name: DemoJob(*args, tmp=tmp) for name, args in cases.items()}
    snaps, spans = {}, {}
    try:
        for j in jobs.values():
            j.ready()
        # Each snapshot watches until its loaders are judged (warm-up and
        # hold: ~7 s from the first batch), as the live view would; the
        # jobs' snapshots are taken side by side.
        snaps = snapshots_json({name: j.dir for name, j in jobs.items()}, "--window", "3", "--judge", "20")
        for name in jobs:
            assert not snaps[name].get("judging"), (name, snaps[name].get("judging"))
        for name, j in jobs.items():
            spans[name] = j.finish()
    finally:
        for j in jobs.values():
            j.kill()
    out = {}
    for name, j in jobs.items():
        (job,) = [x for x in snaps[name]["jobs"] if x["pid"] == j.pid]
        loops = [ld for ld in job["loaders"] if ld["loop_role"] == "loop" and ld["active"]]
        assert len(loops) == 1, (name, job["loaders"])
        ld = loops[0]
        own = truth_in_window(spans[name], *ld["window_mono_ns"])
        assert ld["data_wait_fraction"] is not None, (name, ld)
        assert abs(ld["data_wait_fraction"] - own["data_wait_fraction"]) <= TOLERANCE, (name, ld, own)
        hints = [h for h in snaps[name]["hints"] if h["job_pid"] == j.pid]
        for h in hints:
            # Worker advice only in a knob the pipeline has.
            if "num_workers=" in h["suggestion"] and h["id"] != "no-worker-knob":
                assert ld["library"] in ("torch", "monai") or ld["knobs"], (name, h)
        weighed = {"host": snaps[name]["host"], "trainer_cpu_percent": job.get("main_cpu_percent")}
        out[name] = (ld, hints, weighed)
    return out


def test_a_queue_nodes_and_grain_report_the_loops_own_wait(tmp_path):
    got = _run(GROUPS["queue, nodes, grain"], tmp_path)
    fed = got["dataloader behind a producer thread"][0]
    assert fed["consumer"]["thread"] == "MainThread" and fed["feeder"]["thread"] == "producer"
    nodes = got["torchdata.nodes, thread workers"][0]
    assert nodes["library"] == "torchdata.nodes" and nodes["knobs"]["ParallelMapper.num_workers"] == 2
    assert nodes["worker_kind"] == "thread" and len(nodes["pipeline_workers"]) == 2
    grain = got["grain, thread prefetch"][0]
    assert grain["library"] == "grain" and grain["knobs"]["ReadOptions.num_threads"] == 2
    assert grain["epoch"] >= 2  # every epoch is measured, not only the first iter()


def test_monai_webdataset_and_a_watched_generator_report_the_loops_own_wait(tmp_path):
    got = _run(GROUPS["monai, webdataset, watch"], tmp_path)
    monai = got["monai ThreadDataLoader"][0]
    assert monai["library"] == "monai" and monai["consumer"]["via"] == "ThreadDataLoader"
    assert monai["knobs"]["ThreadDataLoader.num_workers"] == 2
    # The two without a worker knob wait a third of the loop: said, with no num_workers= for them.
    for name in ("webdataset iterated directly", "a watched generator"):
        ld, hints, _ = got[name]
        assert ld["data_wait_fraction"] > 0.2, (name, ld)
        assert [h["id"] for h in hints] == ["no-worker-knob"], (name, hints)
    assert got["a watched generator"][0]["dataset"] == "generator"
    # Its 4 tar files bound the count it would take in a DataLoader's workers.
    ld, (h,) = got["webdataset iterated directly"][:2]
    assert (ld["shards"], ld["shards_of"]) == (4, "webdataset")
    assert "N at most 4, its tar files" in h["suggestion"], h["suggestion"]


def test_a_data_bound_nodes_pipeline_is_advised_in_its_own_knob(tmp_path):
    """Alone on the box (a second worker needs a free core): one ParallelMapper
    thread, a short step, a long epoch. The loop waits most of its time on one
    saturated thread, and the advice is a second thread, in ParallelMapper's
    words, as an upper bound (threads share the GIL). Batches of 64: at 16
    the loop's and the graph's own threads took 0.3 core beside the worker's
    0.95, leaving 0.69-0.73 core free on 2 cores against the 0.7 a second
    worker needs (fresh-clone run 22 reran it); at 64 they take 0.2 and
    0.82-0.86 is free. The worker thread shares one GIL with them: on a
    slower box it read 0.63-0.93 core with its process at the GIL's one-core
    ceiling, the case the rule now reads as GIL-capped (run 30 reran it)."""
    args = [
        "--step",
        "idle",
        "--workers",
        "1",
        "--step-ms",
        "3",
        "--batch-size",
        "64",
        "--epoch-samples",
        "100000",
    ]
    ld, hints, weighed = _run({"nodes, one thread worker": ("nodes_pipeline.py", *args)}, tmp_path)[
        "nodes, one thread worker"
    ]
    assert ld["knobs"]["ParallelMapper.num_workers"] == 1 and len(ld["pipeline_workers"]) == 1
    assert ld["data_wait_fraction"] > 0.4, ld
    # What the rule weighed, in the failure: the worker thread's CPU against
    # the 0.8 core it calls saturated (half a core with the trainer at the
    # GIL's ceiling), the host's busy and other cores.
    workers = [w.get("cpu_percent") for w in ld["pipeline_workers"]]
    found = [h for h in hints if h["id"] == "add-pipeline-workers"]
    assert len(found) == 1, (hints, workers, weighed)
    (h,) = found
    assert "num_workers=2 in ParallelMapper(...)" in h["suggestion"], h
    assert h["evidence"]["speedup_bound"].startswith("upper")
    assert not {x["id"] for x in hints} & {"no-workers", "add-workers", "no-worker-knob"}, hints
