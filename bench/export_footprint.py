#!/usr/bin/env python
"""The Prometheus exporter's own footprint: CPU (% of one core), peak RSS and
scrape latency while it follows 4 jobs x 8 workers and is scraped every 1 s.

    python bench/export_footprint.py                  # 4 jobs x 8 workers, 30 s per phase
    python bench/export_footprint.py --quick          # 10 s per phase
    python bench/export_footprint.py --json out.json  # the table, plus every raw figure

The goal (issue 15) is <= 2 % of one core at a 1 s scrape. Exit status 0
whatever the numbers (timings on a shared box are not a verdict) unless
--strict.

The jobs are ``tests/jobs/many_workers_job.py`` (fork, persistent workers,
every cost a sleep), as in bench/tui_footprint.py. The exporter is the real
``python -m dlwatch export`` (its default 1 s collector interval) in a
subprocess. Once every job and worker is in its /metrics, and after a
warm-up, it is measured in two phases, alternated (ABAB) so that a drift of
the box hits both alike:

- ``scraped``: a client GETs /metrics every second, as Prometheus would at
  ``scrape_interval: 1s``; the latency of each GET (request to last byte,
  measured by the client) is kept;
- ``idle``: nobody scrapes: the collector alone, so the difference is what
  serving the scrapes costs.

CPU is psutil ``cpu_times()`` of the exporter (all threads, user + system)
over the phase divided by wall time; peak RSS is its VmHWM at the end.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from common import write_json  # noqa: E402
from tui_footprint import _vm_hwm_kib, start_jobs, wait_all_visible, wait_jobs_ready  # noqa: E402

from tests.e2e_util import stop_sessions  # noqa: E402

TARGET_CPU_PERCENT = 2.0
SCRAPE_EVERY_S = 1.0


def start_exporter(runtime_dir: str) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    p = subprocess.Popen(
        [sys.executable, "-m", "dlwatch", "export", "--port", "0"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    line = p.stdout.readline()
    if not line.startswith("dlwatch export: serving "):
        p.kill()
        raise SystemExit(f"dlwatch export did not start: {line!r}")
    return p, line.split()[3]


def get(url: str) -> tuple[float, bytes]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return time.perf_counter() - t0, body


def wait_metrics(url: str, n_jobs: int, workers: int, timeout: float = 60.0) -> bytes:
    """Until /metrics shows every job's every worker."""
    end = time.monotonic() + timeout
    body = b""
    while time.monotonic() < end:
        _, body = get(url)
        lines = [ln for ln in body.split(b"\n") if ln.startswith(b"dlwatch_worker_busy_seconds_total{")]
        if len(lines) >= n_jobs * workers:
            return body
        time.sleep(0.5)
    raise SystemExit(f"the exporter never showed {n_jobs} x {workers} workers")


def measure(proc, url: str, seconds: float, scrape: bool) -> dict:
    import psutil

    ps = psutil.Process(proc.pid)
    latencies: list[float] = []
    sizes: list[int] = []
    c0 = ps.cpu_times()
    t0 = time.monotonic()
    next_at = t0
    while (now := time.monotonic()) < t0 + seconds:
        if scrape and now >= next_at:
            dt, body = get(url)
            latencies.append(dt)
            sizes.append(len(body))
            next_at += SCRAPE_EVERY_S
        time.sleep(max(0.0, min(next_at, t0 + seconds) - time.monotonic()) if scrape else 0.2)
    wall = time.monotonic() - t0
    c1 = ps.cpu_times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    out = {"seconds": round(wall, 2), "cpu_percent": round(100 * cpu / wall, 3)}
    if latencies:
        lat = sorted(latencies)
        out.update(
            scrapes=len(lat),
            latency_ms_median=round(1000 * statistics.median(lat), 2),
            latency_ms_p95=round(1000 * lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2),
            latency_ms_max=round(1000 * lat[-1], 2),
            bytes=sizes[-1],
        )
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0, help="per phase (two of each)")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--quick", action="store_true", help="10 s per phase")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--strict", action="store_true", help="exit 1 when the CPU goal is missed")
    a = ap.parse_args()
    if a.quick:
        a.seconds = 10.0
    per_phase = a.seconds / 2
    work = tempfile.mkdtemp(prefix="dlwexp")
    rt = os.path.join(work, "rt")
    os.mkdir(rt, 0o700)
    duration = a.warmup + 4 * per_phase + 120
    procs = start_jobs(a.jobs, a.workers, rt, duration, work)
    exporter = None
    try:
        wait_jobs_ready(procs, work)
        wait_all_visible(rt, a.jobs, a.workers)
        exporter, url = start_exporter(rt)
        body = wait_metrics(url, a.jobs, a.workers)
        time.sleep(a.warmup)
        phases: dict[str, list[dict]] = {"scraped": [], "idle": []}
        for name in ("scraped", "idle", "scraped", "idle"):
            phases[name].append(measure(exporter, url, per_phase, scrape=name == "scraped"))
        _, body = get(url)
        rss_mib = round((_vm_hwm_kib(exporter.pid) or 0) / 1024, 1)
    finally:
        if exporter is not None:
            stop_sessions([exporter])
        stop_sessions(procs)
    samples = [ln for ln in body.decode().split("\n") if ln.startswith("dlwatch_")]
    rows = []
    for name, runs in phases.items():
        row = {
            "phase": name,
            "seconds": round(sum(r["seconds"] for r in runs), 1),
            "cpu_percent": round(
                sum(r["cpu_percent"] * r["seconds"] for r in runs) / sum(r["seconds"] for r in runs), 2
            ),
            "runs": runs,
        }
        if name == "scraped":
            lat = [r for r in runs if "scrapes" in r]
            row["scrapes"] = sum(r["scrapes"] for r in lat)
            row["latency_ms_median"] = statistics.median(r["latency_ms_median"] for r in lat)
            row["latency_ms_p95"] = max(r["latency_ms_p95"] for r in lat)
            row["latency_ms_max"] = max(r["latency_ms_max"] for r in lat)
        rows.append(row)
    print(f"dlwatch export, {a.jobs} jobs x {a.workers} workers, scraped every {SCRAPE_EVERY_S:g} s")
    print(f"{'phase':<8} {'seconds':>8} {'cpu % of one core':>18} {'scrape latency ms (median/p95/max)':>36}")
    for r in rows:
        lat = (
            f"{r['latency_ms_median']:.1f} / {r['latency_ms_p95']:.1f} / {r['latency_ms_max']:.1f}"
            if r["phase"] == "scraped"
            else "-"
        )
        print(f"{r['phase']:<8} {r['seconds']:>8} {r['cpu_percent']:>18.2f} {lat:>36}")
    scraped = rows[0]["cpu_percent"]
    print(
        f"peak RSS {rss_mib} MiB; /metrics {len(body)} bytes, {len(samples)} dlwatch samples; "
        f"goal <= {TARGET_CPU_PERCENT:g} % of a core at a 1 s scrape: "
        + ("met" if scraped <= TARGET_CPU_PERCENT else "MISSED")
    )
    if a.json:
        write_json(
            a.json,
            {
                "jobs": a.jobs,
                "workers": a.workers,
                "target_cpu_percent_of_core": TARGET_CPU_PERCENT,
                "rows": rows,
                "rss_mib": rss_mib,
                "metrics_bytes": len(body),
                "dlwatch_samples": len(samples),
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            },
        )
    return 1 if a.strict and scraped > TARGET_CPU_PERCENT else 0


if __name__ == "__main__":
    sys.exit(main())
