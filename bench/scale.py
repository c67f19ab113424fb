#!/usr/bin/env python
"""Scale: the monitor's cost with many jobs and workers, and at huge batch rates.

    python bench/scale.py                  # (a) 20 s, (b) 3+3 rounds, fake jobs 10 s each (~2.5 min)
    python bench/scale.py --quick          # shorter measurements (~1.5 min)
    python bench/scale.py --json out.json  # the tables, plus every raw figure

(a) Many processes: 8 jobs x 16 persistent fork workers
    (``tests/jobs/scale_job.py --mode sleepy``: every cost a sleep, 10 batches/s
    per job, ``torch.set_num_threads(1)``, so 136 processes barely load the
    box). Measured: wall time of ``dlwatch snapshot --json`` (the real CLI, a
    fresh process: interpreter start-up included) and of an in-process
    ``take_snapshot``; then a ``Monitor`` with the live view's defaults (0.5 s
    interval, process/host/GPU sampling and the diagnoser) follows them in a
    child process: its CPU (% of one core, user + system, all threads) and RSS.

(b) Huge batch rates. A real job (``scale_job.py --mode fast``:
    ``DataLoader(TensorDataset, batch_size=1, num_workers=0)`` as fast as it
    goes) with and without the hook (``DLWATCH_DISABLE=1``), rounds alternated:
    batches/s achieved and the probe's cost per batch at that rate. Then fake
    jobs: one process speaking the wire protocol (``dlwatch/wire.py``) on N
    sockets, 10 frames/s each, counters advancing at 50 000 batches/s; the same
    child ``Monitor`` follows 1, 8 and 32 of them (and 8 at 10 batches/s for
    comparison): the monitor only sees frames, so its cost depends on jobs x
    frames/s, not on the batch rate.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import text_table, write_json  # noqa: E402

from tests.e2e_util import stop_sessions  # noqa: E402

JOB = os.path.join(ROOT, "tests", "jobs", "scale_job.py")

TARGET_MONITOR_CPU = 2.0  # % of one core: the TUI footprint bar (bench/tui_footprint.py)
TARGET_SNAPSHOT_S = 1.5  # "within about a second" (README "Command line"), the CLI's start-up included


def _rundir(prefix: str) -> str:
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o700)
    return d


def _env(runtime_dir: str, disable: bool = False) -> dict:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    env.pop("DLWATCH_DISABLE", None)
    if disable:
        env["DLWATCH_DISABLE"] = "1"
    return env


def _cpu_times_all(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            total += t.user + t.system
            for c in p.children(recursive=True):
                try:
                    ct = c.cpu_times()
                    total += ct.user + ct.system
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
    return total


# ------------------------------------------------------------ child: a monitor


def child_monitor(a) -> int:
    """Follow the jobs in ``a.dir`` with the live view's Monitor; report its cost."""
    from dlwatch.collect.monitor import Monitor

    m = Monitor(directory=a.dir, interval=a.interval)
    builds = [0, 0.0]
    build = m.build

    def timed_build(*args, **kw):
        t = time.perf_counter()
        try:
            return build(*args, **kw)
        finally:
            builds[0] += 1
            builds[1] += time.perf_counter() - t

    m.build = timed_build  # type: ignore[method-assign]
    m.start()
    end = time.monotonic() + 90
    snap = None
    while time.monotonic() < end:
        snap = m.latest()
        if snap:
            jobs = [j for j in snap["jobs"] if j["state"] == "live" and j["loaders"]]
            nw = sum(len(j["loaders"][0]["workers"]) for j in jobs)
            if len(jobs) >= a.expect_jobs and nw >= a.expect_workers:
                break
        time.sleep(0.1)
    else:
        print(f"monitor saw {len((snap or {}).get('jobs', []))} jobs, not {a.expect_jobs}", file=sys.stderr)
        m.stop()
        return 1
    time.sleep(a.warmup)
    ru0, w0, b0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), list(builds)
    time.sleep(a.seconds)
    ru1, w1, b1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic(), list(builds)
    snap = m.latest() or {}
    m.stop()
    wall = w1 - w0
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    with open(f"/proc/{os.getpid()}/status") as f:
        status = {k: v for k, v in (line.split(":", 1) for line in f)}
    jobs = [j for j in snap.get("jobs", []) if j["state"] == "live"]
    rates = [ld["batches_per_s"] for j in jobs for ld in j["loaders"]]
    frames = sum(len(c.frames) for c in m.conns.values())
    out = {
        "seconds": wall,
        "cpu_s": cpu,
        "cpu_percent_of_core": 100 * cpu / wall,
        "cpu_user_s": ru1.ru_utime - ru0.ru_utime,
        "cpu_system_s": ru1.ru_stime - ru0.ru_stime,
        "rss_mib": int(status["VmRSS"].split()[0]) / 1024,
        "peak_rss_mib": int(status["VmHWM"].split()[0]) / 1024,
        "builds": b1[0] - b0[0],
        "build_ms_mean": 1000 * (b1[1] - b0[1]) / max(1, b1[0] - b0[0]),
        "jobs_seen": len(jobs),
        "workers_seen": sum(len(ld["workers"]) for j in jobs for ld in j["loaders"]),
        "batches_per_s_seen_median": statistics.median(rates) if rates else None,
        "frames_held": frames,
        "interval_s": a.interval,
    }
    with open(a.child_out, "w") as f:
        json.dump(out, f)
    return 0


def run_monitor_child(
    runtime_dir: str, jobs: int, workers: int, seconds: float, warmup: float, interval: float = 0.5
) -> dict:
    out = tempfile.mktemp(prefix="dlwscale", suffix=".json")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child-monitor",
        "--dir",
        runtime_dir,
        "--expect-jobs",
        str(jobs),
        "--expect-workers",
        str(workers),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup),
        "--interval",
        str(interval),
        "--child-out",
        out,
    ]
    r = subprocess.run(
        cmd, capture_output=True, text=True, timeout=seconds + warmup + 150, env=_env(runtime_dir)
    )
    if r.returncode != 0:
        raise SystemExit(f"monitor child failed ({r.returncode}):\n{r.stderr[-3000:]}")
    try:
        with open(out) as f:
            return json.load(f)
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass


# ------------------------------------------------------------ child: fake jobs


def child_fake(a) -> int:
    """N fake jobs in one process: wire protocol, 10 frames/s, ``a.rate`` batches/s."""
    from dlwatch import wire

    sleepers = [subprocess.Popen(["sleep", "100000"]) for _ in range(a.fake_jobs)]
    stop = [False]

    def on_signal(signum, frame):
        stop[0] = True

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    sel = selectors.DefaultSelector()
    jobs = []
    t0 = time.monotonic_ns()
    for i, s in enumerate(sleepers):
        path = os.path.join(a.dir, f"{s.pid}.sock")
        ls = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        ls.bind(path)
        os.chmod(path, 0o600)
        ls.listen(8)
        ls.setblocking(False)
        job = {
            "pid": s.pid,
            "path": path,
            "sock": ls,
            "clients": {},
            "history": deque(maxlen=600),
            "seq": 0,
            "batches": 0,
            "wait_ns": 0,
            "step_ns": 0,
            "last_ns": t0,
            "info": {
                "pid": s.pid,
                "cmdline": f"fake job {i} ({a.rate:g} batches/s)",
                "torch_version": "fake",
                "start_method": "fork",
                "started": time.time(),
                "rank": None,
                "python": "fake",
            },
        }
        sel.register(ls, selectors.EVENT_READ, ("listen", job))
        jobs.append(job)
    open(a.ready, "w").close()

    def drop(job, c):
        try:
            sel.unregister(c)
        except (KeyError, ValueError):
            pass
        c.close()
        job["clients"].pop(c, None)

    def send(job, c, data: bytes) -> None:
        try:
            n = c.send(data, socket.MSG_DONTWAIT)
            if n < len(data):  # a slow reader is dropped, never waited for
                drop(job, c)
        except OSError:
            drop(job, c)

    next_tick = time.monotonic()
    frames_sent = 0
    while not stop[0]:
        timeout = max(0.0, next_tick - time.monotonic())
        for key, _ in sel.select(timeout):
            kind, job = key.data
            if kind == "listen":
                try:
                    c, _ = job["sock"].accept()
                except OSError:
                    continue
                c.setblocking(False)
                job["clients"][c] = False
                sel.register(c, selectors.EVENT_READ, ("client", job))
            else:
                c = key.fileobj
                try:
                    data = c.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    drop(job, c)
                    continue
                if not job["clients"].get(c) and b"\n" in data:
                    job["clients"][c] = True
                    hist = list(job["history"])
                    send(
                        job,
                        c,
                        wire.encode(
                            {
                                "type": "hello",
                                "protocol": wire.PROTOCOL_VERSION,
                                "job": job["info"],
                                "history": len(hist),
                            }
                        )
                        + b"".join(hist),
                    )
        if time.monotonic() < next_tick:
            continue
        next_tick += 0.1
        now = time.monotonic_ns()
        for job in jobs:
            dt = now - job["last_ns"]
            job["last_ns"] = now
            job["seq"] += 1
            job["batches"] += round(a.rate * dt / 1e9)
            job["wait_ns"] += int(dt * 0.3)
            job["step_ns"] += dt - int(dt * 0.3)
            frame = {
                "type": "window",
                "seq": job["seq"],
                "t": time.time(),
                "mono_ns": now,
                "loaders": [
                    {
                        "id": 0,
                        "epoch": 0,
                        "batches": job["batches"],
                        "wait_ns": job["wait_ns"],
                        "step_ns": job["step_ns"],
                        "teardown_ns": 0,
                        "num_workers": 0,
                        "workers": [],
                        "queue": {"ready": None, "in_flight": None, "capacity": None},
                        "batch_size": 1,
                        "pin_memory": False,
                        "persistent_workers": False,
                        "kind": "map",
                        "active": True,
                        "start_method": "fork",
                        "epoch_start_ms": [],
                        "epoch_ms": [],
                        "dataset": "TensorDataset",
                    }
                ],
                "main": {"cuda_initialized": False, "py_threads": 2},
            }
            data = wire.encode(frame)
            job["history"].append(data)
            for c, greeted in list(job["clients"].items()):
                if greeted:
                    send(job, c, data)
                    frames_sent += 1
    for job in jobs:
        for c in list(job["clients"]):
            drop(job, c)
        job["sock"].close()
        try:
            os.unlink(job["path"])
        except OSError:
            pass
    for s in sleepers:
        s.kill()
        s.wait()
    return 0


# ------------------------------------------------------------ parts


def part_many(n_jobs: int, workers: int, seconds: float, warmup: float, n_snap: int) -> dict:
    from dlwatch.collect.monitor import take_snapshot

    rd = _rundir("dlwsc")
    work = _rundir("dlwscw")
    procs = []
    res: dict = {"jobs": n_jobs, "workers_per_job": workers}
    try:
        t = time.monotonic()
        for i in range(n_jobs):
            ready = os.path.join(work, f"{i}.ready")
            log = open(os.path.join(work, f"{i}.log"), "wb")
            p = subprocess.Popen(
                [
                    sys.executable,
                    JOB,
                    "--mode",
                    "sleepy",
                    "--workers",
                    str(workers),
                    "--batch-size",
                    "2",
                    "--sample-ms",
                    "40",
                    "--step-ms",
                    "100",
                    "--duration",
                    "600",
                    "--ready",
                    ready,
                ],
                env=_env(rd),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            p.ready = ready  # type: ignore[attr-defined]
            procs.append(p)
        end = time.monotonic() + 180
        for i, p in enumerate(procs):
            while not os.path.exists(p.ready):
                if p.poll() is not None or time.monotonic() > end:
                    with open(os.path.join(work, f"{i}.log"), errors="replace") as f:
                        raise SystemExit(f"job {i} did not start:\n{f.read()[-2000:]}")
                time.sleep(0.1)
        while time.monotonic() < end:
            snap = take_snapshot(directory=rd, settle_s=0.3)
            live = [j for j in snap["jobs"] if j["state"] == "live" and j["loaders"]]
            if len(live) == n_jobs and all(len(j["loaders"][0]["workers"]) == workers for j in live):
                break
            time.sleep(0.5)
        else:
            raise SystemExit("the collector never saw every job and worker")
        res["start_s"] = time.monotonic() - t
        print(
            f"  (a) {n_jobs} jobs x {workers} workers visible after {res['start_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(2.0)
        # The jobs' own load, to show the box is not saturated.
        import psutil

        pids = [p.pid for p in procs]
        c0, w0 = _cpu_times_all(pids), time.monotonic()
        host0 = psutil.cpu_times()
        time.sleep(2.0)
        c1, w1 = _cpu_times_all(pids), time.monotonic()
        host1 = psutil.cpu_times()
        res["jobs_cpu_percent_of_core"] = 100 * (c1 - c0) / (w1 - w0)
        busy = lambda ct: ct.user + ct.system + ct.nice + getattr(ct, "irq", 0) + getattr(ct, "softirq", 0)  # noqa: E731
        total = sum(host1) - sum(host0)
        res["host_busy_percent"] = 100 * (busy(host1) - busy(host0)) / total if total else None
        res["load_avg"] = os.getloadavg()

        cli = []
        sizes = []
        for _ in range(n_snap):
            t = time.monotonic()
            r = subprocess.run(
                [sys.executable, "-m", "dlwatch", "snapshot", "--json"],
                capture_output=True,
                text=True,
                timeout=60,
                env=_env(rd),
            )
            cli.append(time.monotonic() - t)
            if r.returncode != 0:
                raise SystemExit(f"dlwatch snapshot failed: {r.stderr[-2000:]}")
            snap = json.loads(r.stdout)
            sizes.append(len(r.stdout))
            time.sleep(0.3)
        res["cli_snapshot_s"] = cli
        res["cli_snapshot_s_median"] = statistics.median(cli)
        res["cli_json_bytes"] = statistics.median(sizes)
        res["cli_jobs_seen"] = len(snap["jobs"])
        res["cli_workers_seen"] = sum(len(ld["workers"]) for j in snap["jobs"] for ld in j["loaders"])
        inproc = []
        for _ in range(n_snap):
            t = time.monotonic()
            take_snapshot(directory=rd)
            inproc.append(time.monotonic() - t)
        res["inprocess_snapshot_s_median"] = statistics.median(inproc)
        t = time.monotonic()
        r = subprocess.run(
            [
                sys.executable,
                "-c",
                "import dlwatch.cli.main, dlwatch.collect.monitor, dlwatch.diagnose, psutil",
            ],
            capture_output=True,
            timeout=60,
            env=_env(rd),
        )
        res["cli_import_s"] = time.monotonic() - t
        res["monitor"] = run_monitor_child(rd, n_jobs, n_jobs * workers, seconds, warmup)
    finally:
        stop_sessions(procs)
        shutil.rmtree(rd, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    return res


def part_fast(rounds: int, seconds: float) -> dict:
    rd = _rundir("dlwsf")
    work = _rundir("dlwsfw")
    arms: dict = {"with": [], "without": []}
    cpu: dict = {"with": [], "without": []}
    seen = None
    try:
        order = []
        for i in range(rounds):
            order += ["without", "with"] if i % 2 == 0 else ["with", "without"]
        order.append("with+monitor")
        for k, arm in enumerate(order):
            result = os.path.join(work, f"{k}.json")
            ready = os.path.join(work, f"{k}.ready")
            p = subprocess.Popen(
                [
                    sys.executable,
                    JOB,
                    "--mode",
                    "fast",
                    "--duration",
                    str(seconds),
                    "--result",
                    result,
                    "--ready",
                    ready,
                    "--size",
                    "2000000",
                ],
                env=_env(rd, disable=arm == "without"),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
            if arm == "with+monitor":
                # One more hook round with the collector attached: does it see the rate?
                from dlwatch.collect.monitor import take_snapshot

                while not os.path.exists(ready) and p.poll() is None:
                    time.sleep(0.05)
                time.sleep(min(2.0, seconds / 2))
                snap = take_snapshot(directory=rd, window_s=1.0)
                lds = [ld for j in snap["jobs"] if j["pid"] == p.pid for ld in j["loaders"]]
                seen = lds[0]["batches_per_s"] if lds else None
            _, err = p.communicate(timeout=seconds + 120)
            if p.returncode != 0:
                raise SystemExit(f"fast job failed: {err.decode()[-2000:]}")
            with open(result) as f:
                rr = json.load(f)
            arms.setdefault(arm, []).append(rr["batches_per_s"])
            cpu.setdefault(arm, []).append(rr["cpu_ns_per_batch"])
    finally:
        shutil.rmtree(rd, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    w, wo = statistics.median(arms["with"]), statistics.median(arms["without"])
    # Paired by round (each round ran both arms back to back).
    pairs = list(zip(arms["without"], arms["with"]))
    added = [1e9 / b - 1e9 / a for a, b in pairs]
    cpu_added = [b - a for a, b in zip(cpu["without"], cpu["with"])]
    return {
        "rounds": rounds,
        "seconds_per_round": seconds,
        "batches_per_s_without": arms["without"],
        "batches_per_s_with": arms["with"],
        "batches_per_s_without_median": wo,
        "batches_per_s_with_median": w,
        "ratio_time_per_batch": wo / w,
        "added_ns_per_batch_median": statistics.median(added),
        "added_ns_per_batch": added,
        "cpu_ns_per_batch_without": cpu["without"],
        "cpu_ns_per_batch_with": cpu["with"],
        "cpu_ns_per_batch_without_median": statistics.median(cpu["without"]),
        "cpu_ns_per_batch_with_median": statistics.median(cpu["with"]),
        "cpu_added_ns_per_batch_median": statistics.median(cpu_added),
        "monitor_round_batches_per_s_job": arms.get("with+monitor", [None])[0],
        "monitor_round_batches_per_s_seen": seen,
    }


def part_fake(n: int, rate: float, seconds: float, warmup: float) -> dict:
    rd = _rundir("dlwsk")
    ready = os.path.join(rd, ".ready")
    p = subprocess.Popen(
        [
            sys.executable,
            os.path.abspath(__file__),
            "--child-fake",
            "--dir",
            rd,
            "--fake-jobs",
            str(n),
            "--rate",
            str(rate),
            "--ready",
            ready,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        end = time.monotonic() + 30
        while not os.path.exists(ready):
            if p.poll() is not None or time.monotonic() > end:
                raise SystemExit(f"fake server failed: {p.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        m = run_monitor_child(rd, n, 0, seconds, warmup)
        m.update(fake_jobs=n, rate=rate)
        import psutil

        try:
            m["fake_server_cpu_s"] = sum(psutil.Process(p.pid).cpu_times()[:2])
        except psutil.Error:
            pass
        return m
    finally:
        stop_sessions([p])
        shutil.rmtree(rd, ignore_errors=True)


# ------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="shorter measurements")
    p.add_argument("--jobs", type=int, default=8)
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--seconds", type=float, help="monitor measurement for (a) (default 20, quick 6)")
    p.add_argument("--parts", default="many,fast,fake", help="comma-separated: many, fast, fake")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    # internal
    p.add_argument("--child-monitor", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-fake", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    p.add_argument("--expect-jobs", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--expect-workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--warmup", type=float, default=3.0, help=argparse.SUPPRESS)
    p.add_argument("--interval", type=float, default=0.5, help=argparse.SUPPRESS)
    p.add_argument("--fake-jobs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=50_000, help=argparse.SUPPRESS)
    p.add_argument("--ready", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_monitor:
        a.seconds = a.seconds or 10.0
        return child_monitor(a)
    if a.child_fake:
        return child_fake(a)

    parts = set(a.parts.split(","))
    t_start = time.monotonic()
    seconds = a.seconds or (6.0 if a.quick else 20.0)
    warmup = 1.5 if a.quick else 3.0
    out: dict = {"mode": "quick" if a.quick else "full", "loadavg_start": os.getloadavg()}
    if "many" in parts:
        out["many"] = part_many(a.jobs, a.workers, seconds, warmup, 2 if a.quick else 5)
    if "fast" in parts:
        print("  (b) fast job, with/without the hook", file=sys.stderr, flush=True)
        out["fast"] = part_fast(2 if a.quick else 6, 1.5 if a.quick else 3.0)
    if "fake" in parts:
        fs = 2.5 if a.quick else 10.0
        out["fake"] = []
        for n, rate in ((1, 50_000), (8, 50_000), (32, 50_000), (8, 10)):
            print(f"  (b) {n} fake jobs at {rate:g} batches/s", file=sys.stderr, flush=True)
            out["fake"].append(part_fake(n, rate, fs, 1.0 if a.quick else 2.0))

    checks = {}
    print(
        f"dlwatch scale ({out['mode']}); load average at start "
        f"{', '.join(f'{x:.1f}' for x in out['loadavg_start'])}\n"
    )
    if "many" in out:
        r = out["many"]
        m = r["monitor"]
        print(
            f"(a) {r['jobs']} jobs x {r['workers_per_job']} workers "
            f"({r['jobs'] * (r['workers_per_job'] + 1)} processes; the jobs use "
            f"{r['jobs_cpu_percent_of_core']:.0f} % of a core, host {r['host_busy_percent']:.0f} % busy)"
        )
        print(
            text_table(
                ("metric", "value", "target"),
                [
                    (
                        "dlwatch snapshot --json (CLI, median)",
                        f"{r['cli_snapshot_s_median']:.2f} s",
                        f"<= {TARGET_SNAPSHOT_S:g} s",
                    ),
                    ("  of which interpreter + imports", f"{r['cli_import_s']:.2f} s", ""),
                    ("take_snapshot in process (median)", f"{r['inprocess_snapshot_s_median']:.2f} s", ""),
                    ("snapshot JSON size", f"{r['cli_json_bytes'] / 1024:.0f} KiB", ""),
                    ("jobs / workers in the snapshot", f"{r['cli_jobs_seen']} / {r['cli_workers_seen']}", ""),
                    (
                        f"Monitor CPU ({m['seconds']:.0f} s, interval {m['interval_s']:g} s)",
                        f"{m['cpu_percent_of_core']:.2f} % of a core",
                        f"<= {TARGET_MONITOR_CPU:g} %",
                    ),
                    ("Monitor build (mean)", f"{m['build_ms_mean']:.1f} ms x {m['builds']}", ""),
                    ("Monitor RSS (now / peak)", f"{m['rss_mib']:.0f} / {m['peak_rss_mib']:.0f} MiB", ""),
                ],
            )
        )
        checks["many_snapshot_cli_within_1_5s"] = r["cli_snapshot_s_median"] <= TARGET_SNAPSHOT_S
        checks["many_monitor_cpu_le_2pct"] = m["cpu_percent_of_core"] <= TARGET_MONITOR_CPU
        print()
    if "fast" in out:
        r = out["fast"]
        print(
            f"(b) one real job, DataLoader(TensorDataset, batch_size=1, num_workers=0) as fast as it"
            f" goes, {r['rounds']} x {r['seconds_per_round']:g} s rounds per arm (separate processes)"
        )
        print(
            text_table(
                ("metric", "value"),
                [
                    ("batches/s without the hook (median)", f"{r['batches_per_s_without_median']:,.0f}"),
                    ("batches/s with the hook (median)", f"{r['batches_per_s_with_median']:,.0f}"),
                    ("time per batch with / without", f"{r['ratio_time_per_batch']:.3f}"),
                    (
                        "added wall per batch (median of paired rounds)",
                        f"{r['added_ns_per_batch_median']:+.0f} ns",
                    ),
                    (
                        "loop thread CPU per batch without / with (median)",
                        f"{r['cpu_ns_per_batch_without_median']:,.0f} / "
                        f"{r['cpu_ns_per_batch_with_median']:,.0f} ns",
                    ),
                    (
                        "added loop CPU per batch (median of paired rounds)",
                        f"{r['cpu_added_ns_per_batch_median']:+.0f} ns",
                    ),
                    (
                        "monitor attached: job's run average / monitor's 1 s window",
                        f"{r['monitor_round_batches_per_s_job'] or 0:,.0f} / "
                        f"{r['monitor_round_batches_per_s_seen'] or 0:,.0f}",
                    ),
                ],
            )
        )
        print(
            "  whole-process rates from separate runs: noisier than bench/overhead.py's"
            " paired in-process rows"
        )
        print()
    if "fake" in out:
        print("(b) fake jobs (wire protocol, 10 frames/s each), the live view's Monitor following them")
        rows = []
        for r in out["fake"]:
            rows.append(
                (
                    str(r["fake_jobs"]),
                    f"{r['rate']:,.0f}",
                    f"{r['batches_per_s_seen_median'] or 0:,.0f}",
                    f"{r['cpu_percent_of_core']:.2f}",
                    f"{r['build_ms_mean']:.1f}",
                    f"{r['rss_mib']:.0f} / {r['peak_rss_mib']:.0f}",
                )
            )
        print(
            text_table(
                (
                    "jobs",
                    "batches/s each",
                    "monitor sees",
                    "monitor CPU % core",
                    "build ms",
                    "RSS MiB now/peak",
                ),
                rows,
            )
        )
        f8 = {r["rate"]: r for r in out["fake"] if r["fake_jobs"] == 8}
        if 10 in f8 and 50_000 in f8:
            ratio = f8[50_000]["cpu_percent_of_core"] / max(1e-9, f8[10]["cpu_percent_of_core"])
            out["fake_rate_cpu_ratio_8_jobs"] = ratio
            print(
                f"  8 jobs: monitor CPU at 50k batches/s / at 10 batches/s = {ratio:.2f}"
                " (the batch rate does not reach the monitor: only frames do)"
            )
        for r in out["fake"]:
            if r["fake_jobs"] == 8 and r["rate"] == 50_000:
                checks["fake_8_jobs_monitor_cpu_le_2pct"] = r["cpu_percent_of_core"] <= TARGET_MONITOR_CPU
    out["checks"] = checks
    print()
    for k, v in checks.items():
        print(f"  {'PASS' if v else 'MISS'}  {k}")
    out["seconds"] = time.monotonic() - t_start
    print(f"\ntotal {out['seconds']:.1f} s")
    if a.json:
        write_json(a.json, out)
    return 1 if a.strict and not all(checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
