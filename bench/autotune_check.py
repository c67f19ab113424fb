"""Autotune against the untouched job and against `dlwatch tune`.

Runs tests/jobs/autotune_job.py (an I/O-bound and a CPU-bound loader, 1 worker
to start with) three ways: untouched, under ``DLWATCH_AUTOTUNE=1``, and under
``dlwatch tune``; then times the setting autotune ended on against tune's
recommendation, alternated (ABAB), and prints a table: pace of each, the
setting each chose, the most workers autotune ever ran, and whether the
batches were the same as untouched (digest).

    .venv/bin/python bench/autotune_check.py            # both loaders, about 6 minutes
    .venv/bin/python bench/autotune_check.py --kind cpu
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = str(ROOT / "tests" / "jobs" / "autotune_job.py")
SHAPES = {
    # the I/O-bound job: 40 ms of sleep a batch, a 5 ms step
    "io": ["--kind", "io", "--batches", "100", "--sample-ms", "10", "--step-ms", "5"],
    # CPU-bound: 20 ms of Python a batch, a 5 ms step (2 cores: 4 workers cannot all run)
    "cpu": ["--kind", "cpu", "--batches", "60", "--sample-ms", "5", "--step-ms", "5"],
}


def job(args: list[str], env_extra: dict, rundir: str) -> dict:
    env = dict(os.environ, DLWATCH_DIR=rundir, AUTOTUNE_JOB_HOOK="1", **env_extra)
    p = subprocess.run([sys.executable, JOB, *args], env=env, capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise SystemExit(p.stderr[-2000:])
    out = json.loads(p.stdout.strip().splitlines()[-1])
    out["stderr"] = [ln for ln in p.stderr.splitlines() if ln.startswith("dlwatch autotune:")]
    return out


def tune(args: list[str], rundir: str) -> dict:
    env = dict(os.environ, DLWATCH_DIR=rundir)
    cmd = [
        sys.executable,
        "-m",
        "dlwatch",
        "tune",
        "--json",
        "--trial-seconds",
        "8",
        "--",
        sys.executable,
        JOB,
    ]
    p = subprocess.run(
        [*cmd, *args, "--epochs", "1000"], env=env, capture_output=True, text=True, timeout=900
    )
    return json.loads(p.stdout)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=[*SHAPES, "both"], default="both")
    ap.add_argument("--epochs", type=int, default=12)
    a = ap.parse_args()
    rows = []
    for kind in SHAPES if a.kind == "both" else [a.kind]:
        base = [*SHAPES[kind], "--epochs", str(a.epochs), "--workers", "1"]
        with tempfile.TemporaryDirectory(prefix="dlwat") as rd:
            untouched = job(base, {}, rd)
            tuned = job(base, {"DLWATCH_AUTOTUNE": "1"}, rd)
            doc = tune(base[:-4], rd)
            rec = (doc.get("best") or {}).get("settings") or {}
            nw_tune = rec.get("num_workers")
            nw_auto = tuned["num_workers"]
            short = [*SHAPES[kind], "--epochs", "3"]
            paces = {nw_auto: [], nw_tune: []}
            for _ in range(2):
                for nw in dict.fromkeys((nw_auto, nw_tune)):
                    r = job([*short, "--workers", str(nw)], {}, rd)
                    paces[nw].append(statistics.median(r["epoch_s"][1:]))
        u = statistics.median(untouched["epoch_s"])
        t_last = statistics.median(tuned["epoch_s"][-3:])
        ratio = statistics.median(paces[nw_tune]) / statistics.median(paces[nw_auto])
        rows.append(
            {
                "loader": kind,
                "untouched s/epoch": f"{u:.2f}",
                "autotuned last epochs": f"{t_last:.2f} ({u / t_last:.2f}×)",
                "autotune's setting": nw_auto,
                "most workers tried": max(tuned.get("workers_seen") or [0]),
                "tune's pick": nw_tune,
                "autotune's pace / tune's": f"{ratio:.2f}",
                "same batches": tuned["digest"] == untouched["digest"],
            }
        )
        print(tuned["stderr"][0] if tuned["stderr"] else "(no autotune line)")
    keys = list(rows[0])
    widths = [max(len(k), *(len(str(r[k])) for r in rows)) for k in keys]
    print(" | ".join(k.ljust(w) for k, w in zip(keys, widths)))
    for r in rows:
        print(" | ".join(str(r[k]).ljust(w) for k, w in zip(keys, widths)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
