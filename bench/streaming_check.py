#!/usr/bin/env python
"""litdata and Mosaic streaming, unmodified under `dlwatch run`: data wait against the loop's own meter.

    python bench/streaming_check.py --python /path/to/venv/bin/python [--json PATH]

Two libraries that stream pre-written chunks into a torch DataLoader's workers:
litdata (``optimize()`` then ``StreamingDataset`` in its ``StreamingDataLoader``)
and Mosaic's ``streaming`` (``MDSWriter`` then ``StreamingDataset``, in a plain
``DataLoader`` and in its own ``StreamingDataLoader``). Each case is a training
script, bench/streaming_jobs.py: it writes demo/'s 512 JPEG samples with the
library's own writer, subclasses the library's dataset to decode them (as the
libraries' docs show for transforms) and trains with demo/_common.py's loop,
whose own meter times every ``next()`` and writes its spans. The script never
imports dlwatch: it runs under ``dlwatch run``.

Both libraries' loaders are generators around ``DataLoader.__iter__``: the
loop's first ``next()`` of an epoch makes the epoch's iterator (starts the
workers), which a plain DataLoader does in ``iter()``, outside the loop's
``next()``. dlwatch counts that as the loop's wait too (probe/iter_in_next.py).

Needs litdata and mosaicml-streaming in --python's environment, with a
torchvision that loads beside its torch (Mosaic imports torchvision.datasets;
PyPI's torchvision does not load beside the CPU torch build).
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
JOBS = os.path.join(HERE, "streaming_jobs.py")

# The loop's wait against dlwatch's, as tests/e2e/test_pipelines.py asks of every pipeline.
TOLERANCE = 0.03
CASES = {
    "litdata StreamingDataLoader": ["litdata"],
    "streaming StreamingDataset in a DataLoader": ["mosaic"],
    "streaming StreamingDataLoader": ["mosaic", "--streaming-loader"],
}


# ------------------------------------------------------------------ the bench


def truth_in_window(spans: list, start: int, end: int) -> float | None:
    """The loop's own wait over [start, end] (as tests/e2e_util.py's)."""
    wait = step = 0
    prev = None
    for epoch, t0, t1 in spans:
        wait += max(0, min(t1, end) - max(t0, start))
        if prev is not None and prev[0] == epoch:
            step += max(0, min(t0, end) - max(prev[2], start))
        prev = (epoch, t0, t1)
    return wait / (wait + step) if wait + step else None


def run_case(python: str, name: str, workers: int, seconds: float, settle: float) -> dict:
    runtime = tempfile.mkdtemp(prefix="dlws", dir="/tmp")
    os.chmod(runtime, 0o700)
    spans, stop = os.path.join(runtime, "spans.json"), os.path.join(runtime, "stop")
    env = dict(os.environ, DLWATCH_DIR=runtime, PYTHONUNBUFFERED="1")
    env.pop("DLWATCH_DISABLE", None)
    cmd = [python, "-m", "dlwatch", "run", "--", python, JOBS, *CASES[name]]
    cmd += ["--workers", str(workers), "--step", "idle", "--seconds", str(seconds)]
    cmd += ["--spans", spans, "--stop-file", stop]
    p = subprocess.Popen(
        cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    row: dict = {"case": name, "workers": workers}
    try:
        pid = None
        deadline = time.monotonic() + 180
        while pid is None:
            r, _, _ = select.select([p.stdout], [], [], max(0.0, deadline - time.monotonic()))
            line = p.stdout.readline() if r else ""
            if not line:
                row["error"] = (
                    f"no 'ready' line: {p.stderr.read()[-2000:] if p.poll() is not None else 'timed out'}"
                )
                return row
            if line.startswith("ready "):
                pid = json.loads(line[6:])["pid"]
        time.sleep(settle)  # a few epochs past the first: the epoch-start advice needs them
        snap = subprocess.run(
            [python, "-m", "dlwatch", "snapshot", "--json", "--window", "3", "--judge", "20"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        open(stop, "w").close()
        _, err = p.communicate(timeout=120)
        if snap.returncode != 0:
            row["error"] = snap.stderr.strip()[-500:]
            return row
        doc = json.loads(snap.stdout)
        (j,) = [x for x in doc["jobs"] if x["pid"] == pid]
        loops = [ld for ld in j["loaders"] if ld.get("loop_role") == "loop" and ld.get("active")]
        if len(loops) != 1:
            row["error"] = f"{len(loops)} active loop loaders: {[ld.get('dataset') for ld in j['loaders']]}"
            return row
        ld = loops[0]
        with open(spans) as f:
            loop = json.load(f)["spans"]
        own = truth_in_window(loop, *ld["window_mono_ns"])
        pids = [w.get("pid") for w in ld.get("workers") or []]
        row.update(
            dlwatch=ld.get("data_wait_fraction"),
            own=own,
            epoch_start_ms=ld.get("epoch_start_ms_last"),
            workers_found=len(pids),
            worker_pids_distinct=len(set(pids)) == len(pids) and pid not in pids,
            dataset=ld.get("dataset"),
            wrappers=ld.get("dataset_wrappers"),
            num_workers=ld.get("num_workers"),
            hints=[h["id"] for h in doc.get("hints", []) if h.get("job_pid") == pid],
            advice=[h.get("suggestion") for h in doc.get("hints", []) if h.get("job_pid") == pid],
            traceback="Traceback" in err,
        )
        d = row["dlwatch"]
        row["within"] = d is not None and own is not None and abs(d - own) <= TOLERANCE
        return row
    finally:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        shutil.rmtree(runtime, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument(
        "--python", default=sys.executable, help="an interpreter with litdata, streaming, dlwatch"
    )
    parser.add_argument(
        "--seconds", type=float, default=60.0, help="each job's cap (it stops after the snapshot)"
    )
    parser.add_argument("--workers", default="1,2", help="num_workers to run each case at")
    parser.add_argument(
        "--settle", type=float, default=8.0, help="seconds from the first batch to the snapshot"
    )
    parser.add_argument("--json", metavar="PATH", help="write the rows here")
    args = parser.parse_args()
    rows = []
    for workers in [int(w) for w in args.workers.split(",")]:
        for name in CASES:
            row = run_case(args.python, name, workers, args.seconds, args.settle)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    bad = [
        r for r in rows if r.get("error") or not r.get("within") or r.get("workers_found") != r.get("workers")
    ]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
