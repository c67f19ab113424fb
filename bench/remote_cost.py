#!/usr/bin/env python
"""What ``dlwatch --host`` costs each node: the CPU of the remote side and the
bytes per second it sends back, at 8 ranks x 8 workers per node.

    python bench/remote_cost.py                  # 8 ranks x 8 workers, 20 s per interval
    python bench/remote_cost.py --quick          # 8 s per interval
    python bench/remote_cost.py --json out.json  # the table, plus every raw figure

The node's ranks are ``tests/jobs/many_workers_job.py`` (fork, persistent
workers, every cost a sleep), each with torchrun's environment (RANK,
LOCAL_RANK, WORLD_SIZE, TORCHELASTIC_RUN_ID) so that they are the ranks of
one run. The remote side is exactly what ``dlwatch --host`` runs over ssh on
the node: ``python -m dlwatch snapshot --follow --json --interval I
--window W``, here as a local subprocess whose stdout this script reads as
ssh would forward it. For each interval (the live view's default 0.5 s, and
1 s) after a warm-up it reports that process's CPU (psutil ``cpu_times()``,
user + system, all threads, over wall time; 100 % = one core), its peak RSS
(VmHWM), the bytes per second and lines per second on its stdout, and the
mean line size, and what ssh carries with the compression dlwatch asks it
for (``-o Compression=yes``: the stream through zlib at ssh's level 6,
flushed per read). What sshd adds to carry those bytes (encryption of a few
tens of KB/s) is not in these figures.

A last row is this side, the viewer: ``dlwatch snapshot --follow --json
--host node1 --host node2`` at the live view's 0.5 s (the live view without
its display), each "node" the same 8 ranks read through a stand-in for ssh
that runs the remote command here (16 ranks, one run, merged and judged
across nodes); its CPU is the viewer process's own, not the node sides'.

Exit status 0 whatever the numbers (timings on a shared box are not a verdict).
"""

from __future__ import annotations

import argparse
import os
import platform
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
import zlib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from common import text_table, write_json  # noqa: E402
from tui_footprint import JOB, _vm_hwm_kib, wait_all_visible, wait_jobs_ready  # noqa: E402

from tests.e2e_util import stop_sessions  # noqa: E402


def start_ranks(n: int, workers: int, runtime_dir: str, duration: float, workdir: str) -> list:
    procs = []
    for i in range(n):
        env = dict(os.environ, DLWATCH_DIR=runtime_dir, RANK=str(i), LOCAL_RANK=str(i), WORLD_SIZE=str(n))
        env.update(TORCHELASTIC_RUN_ID="bench-remote", OMP_NUM_THREADS="1")
        env.pop("DLWATCH_DISABLE", None)
        ready = os.path.join(workdir, f"job{i}.ready")
        with open(os.path.join(workdir, f"job{i}.log"), "wb") as log:
            p = subprocess.Popen(
                [
                    sys.executable,
                    JOB,
                    "--workers",
                    str(workers),
                    "--duration",
                    str(duration),
                    "--ready",
                    ready,
                ],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        p.ready = ready  # type: ignore[attr-defined]
        procs.append(p)
    return procs


def measure(runtime_dir: str, interval: float, window: float, seconds: float, warmup: float) -> dict:
    """The remote side: what ``--host`` runs on the node."""
    cmd = [sys.executable, "-m", "dlwatch", "snapshot", "--follow", "--json"]
    cmd += ["--interval", f"{interval:g}", "--window", f"{window:g}"]
    row = measure_process(cmd, dict(os.environ, DLWATCH_DIR=runtime_dir), seconds, warmup)
    return dict(row, side="node", interval_s=interval, window_s=window)


# ssh's stand-in for the viewer row: runs the remote command here, on the
# node's runtime directory (the cost of ssh's own crypto is not the question).
LOCAL_SSH = """
import os, sys
os.environ["DLWATCH_DIR"] = os.environ["BENCH_NODE_DIR"]
os.execvp("sh", ["sh", "-c", sys.argv[-1]])
"""


def measure_viewer(runtime_dir: str, nodes: int, seconds: float, warmup: float, workdir: str) -> dict:
    """This side of ``dlwatch --host`` at the live view's cadence (0.5 s),
    reading ``nodes`` nodes (each one the same 8 ranks, under another name):
    the merge and the cross-node diagnosis, without the display."""
    script = os.path.join(workdir, "local_ssh.py")
    with open(script, "w") as f:
        f.write(LOCAL_SSH)
    empty = tempfile.mkdtemp(prefix="dlwrcv", dir="/tmp")
    os.chmod(empty, 0o700)
    dlwatch = os.path.join(os.path.dirname(sys.executable), "dlwatch")
    cmd = [
        sys.executable,
        "-m",
        "dlwatch",
        "snapshot",
        "--follow",
        "--json",
        "--interval",
        "0.5",
        "--window",
        "1",
    ]
    cmd += ["--remote-dlwatch", dlwatch] + [a for i in range(nodes) for a in ("--host", f"node{i + 1}")]
    env = dict(os.environ, DLWATCH_DIR=empty, BENCH_NODE_DIR=runtime_dir)
    env["DLWATCH_SSH"] = f"{sys.executable} {script}"
    try:
        row = measure_process(cmd, env, seconds, warmup + 3)
    finally:
        shutil.rmtree(empty, ignore_errors=True)
    return dict(row, side=f"viewer of {nodes} nodes", interval_s=0.5, window_s=1.0)


def measure_process(cmd: list[str], env: dict[str, str], seconds: float, warmup: float) -> dict:
    """CPU of the process ``cmd`` (not its children), and what it prints."""
    import psutil

    p = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, start_new_session=True
    )
    assert p.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(p.stdout, selectors.EVENT_READ)
    fd = p.stdout.fileno()
    proc = psutil.Process(p.pid)

    # What ssh carries with Compression=yes: one zlib stream at level 6 (ssh's
    # compression), flushed with each chunk as ssh flushes each packet.
    z = zlib.compressobj(6)

    def drain(until: float) -> tuple[int, int, int]:
        nbytes = lines = zbytes = 0
        while (left := until - time.monotonic()) > 0:
            if sel.select(min(left, 0.5)):
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    raise SystemExit("the measured process exited")
                nbytes += len(chunk)
                lines += chunk.count(b"\n")
                zbytes += len(z.compress(chunk)) + len(z.flush(zlib.Z_SYNC_FLUSH))
        return nbytes, lines, zbytes

    try:
        drain(time.monotonic() + warmup)
        c0, t0 = proc.cpu_times(), time.monotonic()
        nbytes, lines, zbytes = drain(t0 + seconds)
        c1, t1 = proc.cpu_times(), time.monotonic()
        hwm = _vm_hwm_kib(p.pid)
    finally:
        stop_sessions([p])
    wall = t1 - t0
    cpu = (c1.user + c1.system) - (c0.user + c0.system)
    return {
        "wall_s": round(wall, 2),
        "cpu_percent": round(100 * cpu / wall, 2),
        "bytes_per_s": round(nbytes / wall),
        "compressed_bytes_per_s": round(zbytes / wall),
        "lines_per_s": round(lines / wall, 2),
        "bytes_per_line": round(nbytes / lines) if lines else None,
        "peak_rss_mib": round(hwm / 1024, 1) if hwm else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    a = ap.parse_args()
    seconds = 8.0 if a.quick else a.seconds
    warmup = 3.0
    plan = [(0.5, 1.0), (1.0, 1.0)]
    runtime_dir = tempfile.mkdtemp(prefix="dlwrc", dir="/tmp")
    workdir = tempfile.mkdtemp(prefix="dlwrcw", dir="/tmp")
    os.chmod(runtime_dir, 0o700)
    duration = 60 + (len(plan) + 1) * (seconds + warmup + 8)
    jobs = start_ranks(a.ranks, a.workers, runtime_dir, duration, workdir)
    try:
        wait_jobs_ready(jobs, workdir)
        wait_all_visible(runtime_dir, a.ranks, a.workers)
        rows = [measure(runtime_dir, i, w, seconds, warmup) for i, w in plan]
        rows.append(measure_viewer(runtime_dir, 2, seconds, warmup, workdir))
    finally:
        stop_sessions(jobs)
        shutil.rmtree(runtime_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"dlwatch --host, the remote side: {a.ranks} ranks x {a.workers} workers on one node, "
        f"{seconds:g} s per row ({platform.node()}, {os.cpu_count()} CPUs)"
    )
    print(
        text_table(
            (
                "side",
                "interval",
                "window",
                "CPU (% of one core)",
                "KB/s",
                "KB/s by ssh",
                "lines/s",
                "KB/line",
                "peak RSS MiB",
            ),
            [
                (
                    r["side"],
                    f"{r['interval_s']:g} s",
                    f"{r['window_s']:g} s",
                    f"{r['cpu_percent']:.1f}",
                    f"{r['bytes_per_s'] / 1000:.1f}",
                    f"{r['compressed_bytes_per_s'] / 1000:.1f}",
                    f"{r['lines_per_s']:.2f}",
                    f"{(r['bytes_per_line'] or 0) / 1000:.1f}",
                    f"{r['peak_rss_mib']}",
                )
                for r in rows
            ],
        )
    )
    if a.json:
        write_json(a.json, {"ranks": a.ranks, "workers": a.workers, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
