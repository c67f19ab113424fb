#!/usr/bin/env python
"""The live TUI's own footprint: CPU (% of one core) and peak RSS while it
watches several jobs with many workers, at the default refresh (0.5 s).

    python bench/tui_footprint.py                  # 4 jobs x 8 workers, 30 s per mode
    python bench/tui_footprint.py --quick          # 10 s per mode
    python bench/tui_footprint.py --json out.json  # the table, plus every raw figure
    python bench/tui_footprint.py --profile        # + where the time goes (cProfile, both threads)

docs/ARCHITECTURE.md §4: "the TUI uses a few percent of one core at its default refresh";
the target checked here is <= 2 % of one core. Exit status 0 whatever the
numbers (timings on a shared box are not a verdict) unless --strict.

The jobs are ``tests/jobs/many_workers_job.py``: fork, persistent workers,
every cost a sleep, so 4 x (1 + 8) processes barely load a 2-core machine.
Once every job and worker is visible to the collector, the app is measured
in up to two ways, each after a warm-up (start-up and first attach excluded):

- ``tmux``: the real thing, ``python -m dlwatch`` in a detached tmux session
  (a real terminal: Textual renders escape sequences and writes them). CPU
  is psutil ``cpu_times()`` of that process (all threads, user + system)
  over the measured interval divided by wall time; peak RSS is its VmHWM.
  The tmux server's own CPU (the terminal emulator's cost, not ours) is
  reported beside it.
- ``headless``: ``DlwatchApp(Monitor(...)).run_test(size=(120, 40))`` in a
  child process, CPU from ``getrusage(RUSAGE_SELF)``, split per thread (the
  collector thread vs the UI thread). Textual's headless driver skips
  turning the screen into escape sequences, so this is a lower bound; its
  value is the split.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import write_json  # noqa: E402

from tests.e2e_util import stop_sessions  # noqa: E402

JOB = os.path.join(ROOT, "tests", "jobs", "many_workers_job.py")

TARGET_CPU_PERCENT = 2.0
SIZE = (120, 40)


# --------------------------------------------------------------------- jobs


def start_jobs(n: int, workers: int, runtime_dir: str, duration: float, workdir: str) -> list:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    env.pop("DLWATCH_DISABLE", None)
    procs = []
    for i in range(n):
        ready = os.path.join(workdir, f"job{i}.ready")
        log = open(os.path.join(workdir, f"job{i}.log"), "wb")
        p = subprocess.Popen(
            [sys.executable, JOB, "--workers", str(workers), "--duration", str(duration), "--ready", ready],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        p.ready = ready  # type: ignore[attr-defined]
        procs.append(p)
    return procs


def wait_jobs_ready(procs: list, workdir: str, timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    for i, p in enumerate(procs):
        while not os.path.exists(p.ready):
            if p.poll() is not None:
                with open(os.path.join(workdir, f"job{i}.log"), errors="replace") as f:
                    raise SystemExit(f"job {i} exited early:\n{f.read()[-2000:]}")
            if time.monotonic() > end:
                raise SystemExit("jobs did not start in time")
            time.sleep(0.1)


def wait_all_visible(runtime_dir: str, n: int, workers: int, timeout: float = 60.0) -> dict:
    """Until the collector sees n live jobs with ``workers`` workers each."""
    from dlwatch.collect.monitor import take_snapshot

    end = time.monotonic() + timeout
    snap: dict = {}
    while time.monotonic() < end:
        snap = take_snapshot(directory=runtime_dir, settle_s=0.3)
        jobs = [j for j in snap["jobs"] if j["state"] == "live" and j["loaders"]]
        if len(jobs) == n and all(len(j["loaders"][0]["workers"]) == workers for j in jobs):
            return snap
        time.sleep(0.5)
    raise SystemExit(
        f"the collector never saw {n} jobs x {workers} workers: "
        f"{[(j['pid'], len(j['loaders'])) for j in snap.get('jobs', [])]}"
    )


# --------------------------------------------------------------------- tmux mode


def _vm_hwm_kib(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def measure_tmux(
    runtime_dir: str, job_pids: list[int], seconds: float, warmup: float, refresh: float
) -> dict:
    import psutil

    name = f"dlwfoot-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE", "NO_COLOR")}

    def tmux(*a: str, check: bool = True) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["tmux", "-L", name, "-f", "/dev/null", *a],
            env=env,
            capture_output=True,
            text=True,
            timeout=20,
            check=check,
        )

    tmux(
        "new-session",
        "-d",
        "-s",
        "main",
        "-x",
        str(SIZE[0]),
        "-y",
        str(SIZE[1]),
        "-e",
        f"DLWATCH_DIR={runtime_dir}",
        "-e",
        f"PYTHONPATH={ROOT}",
        "-e",
        "COLORTERM=truecolor",
        sys.executable,
        "-m",
        "dlwatch",
        "--interval",
        str(refresh),
    )
    try:
        pane_pid = int(tmux("display-message", "-p", "-t", "main", "#{pane_pid}").stdout)
        server_pid = int(tmux("display-message", "-p", "-t", "main", "#{pid}").stdout)
        proc = psutil.Process(pane_pid)
        if "dlwatch" not in " ".join(proc.cmdline()):  # run through a shell
            proc = next(c for c in proc.children(recursive=True) if "dlwatch" in " ".join(c.cmdline()))
        end = time.monotonic() + 60
        screen = ""
        while time.monotonic() < end:
            screen = tmux("capture-pane", "-p", "-t", "main", check=False).stdout
            if all(str(p) in screen for p in job_pids):
                break
            time.sleep(0.25)
        else:
            raise SystemExit(f"dlwatch under tmux never showed every job:\n{screen}")
        time.sleep(warmup)
        server = psutil.Process(server_pid)
        c0, s0, w0 = proc.cpu_times(), server.cpu_times(), time.monotonic()
        time.sleep(seconds)
        c1, s1, w1 = proc.cpu_times(), server.cpu_times(), time.monotonic()
        screen = tmux("capture-pane", "-p", "-t", "main", check=False).stdout
        wall = w1 - w0
        cpu = (c1.user - c0.user) + (c1.system - c0.system)
        srv = (s1.user - s0.user) + (s1.system - s0.system)
        hwm = _vm_hwm_kib(proc.pid)
        rss_now = proc.memory_info().rss
        threads = proc.num_threads()
        tmux("send-keys", "-t", "main", "q")
        try:
            proc.wait(timeout=10)
            quit_ok = True
        except psutil.TimeoutExpired:
            quit_ok = False
        return {
            "mode": "tmux",
            "pid": proc.pid,
            "seconds": wall,
            "cpu_s": cpu,
            "cpu_user_s": c1.user - c0.user,
            "cpu_system_s": c1.system - c0.system,
            "cpu_percent_of_core": 100 * cpu / wall,
            "peak_rss_mib": hwm / 1024 if hwm else rss_now / 2**20,
            "rss_end_mib": rss_now / 2**20,
            "threads": threads,
            "tmux_server_cpu_percent_of_core": 100 * srv / wall,
            "jobs_on_screen": sum(str(p) in screen for p in job_pids),
            "quit_on_q": quit_ok,
        }
    finally:
        tmux("kill-server", check=False)


# --------------------------------------------------------------------- headless mode


def measure_headless(
    runtime_dir: str, n_jobs: int, seconds: float, warmup: float, refresh: float, profile: bool
) -> dict:
    out = tempfile.mktemp(prefix="dlwfoot", suffix=".json")
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child-headless",
        "--dir",
        runtime_dir,
        "--jobs",
        str(n_jobs),
        "--seconds",
        str(seconds),
        "--warmup",
        str(warmup),
        "--refresh",
        str(refresh),
        "--child-out",
        out,
    ]
    if profile:
        cmd.append("--profile")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + warmup + 180)
    if r.returncode != 0:
        raise SystemExit(f"headless child failed ({r.returncode}):\n{r.stderr[-3000:]}")
    try:
        with open(out) as f:
            result = json.load(f)
    finally:
        try:
            os.unlink(out)
        except OSError:
            pass
    if r.stdout.strip():
        result["profile_text"] = r.stdout
    return result


def child_headless(a) -> int:
    import psutil

    from dlwatch.collect.monitor import Monitor
    from dlwatch.tui.app import DlwatchApp
    from dlwatch.tui.jobs import JobList

    profiles: dict = {}

    measuring = threading.Event()

    class ProfiledMonitor(Monitor):
        """The collector thread's work (reading sockets, building snapshots)
        profiled while the measurement runs, on request."""

        def _profiled(self, fn, *args, **kwargs):
            if not (a.profile and measuring.is_set()):
                return fn(*args, **kwargs)
            import cProfile

            prof = profiles.setdefault("collector thread", cProfile.Profile())
            prof.enable()
            try:
                return fn(*args, **kwargs)
            finally:
                prof.disable()

        def poll(self, timeout: float) -> None:
            return self._profiled(super().poll, timeout)

        def build(self, *args, **kwargs) -> dict:
            return self._profiled(super().build, *args, **kwargs)

    redraws = [0]

    def thread_times(proc) -> dict[int, float]:
        return {t.id: t.user_time + t.system_time for t in proc.threads()}

    async def run() -> dict:
        # As the CLI builds it (cmd_tui): the live window and the refresh as the build period.
        monitor = ProfiledMonitor(directory=a.dir, window_s=1.0, interval=a.refresh)
        app = DlwatchApp(monitor, interval=a.refresh, runtime_dir=a.dir)
        draw = app.redraw

        def counting_redraw(full: bool = False) -> None:  # an instance attribute: the class as is
            redraws[0] += 1
            draw(full)

        app.redraw = counting_redraw
        proc = psutil.Process()
        async with app.run_test(size=SIZE) as pilot:
            table = app.screen.query_one(JobList)
            end = time.monotonic() + 60
            while table.row_count < a.jobs and time.monotonic() < end:
                await pilot.pause(0.1)
            if table.row_count < a.jobs:
                raise SystemExit(f"only {table.row_count} of {a.jobs} jobs on screen")
            await asyncio.sleep(a.warmup)
            ui_tid = threading.main_thread().native_id
            mon_tid = monitor._thread.native_id
            prof = None
            if a.profile:
                import cProfile

                prof = cProfile.Profile()
                prof.enable()
            measuring.set()
            ru0, th0, w0, r0 = (
                resource.getrusage(resource.RUSAGE_SELF),
                thread_times(proc),
                time.monotonic(),
                redraws[0],
            )
            await asyncio.sleep(a.seconds)
            ru1, th1, w1, r1 = (
                resource.getrusage(resource.RUSAGE_SELF),
                thread_times(proc),
                time.monotonic(),
                redraws[0],
            )
            measuring.clear()
            if prof is not None:
                prof.disable()
                profiles["UI thread (event loop)"] = prof
            rows = table.row_count
            workers_seen = sum(
                len(j["loaders"][0]["workers"]) for j in app.snapshot["jobs"] if j.get("loaders")
            )
            await pilot.press("q")
        wall = w1 - w0
        cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

        def tcpu(tid: int) -> float:
            return th1.get(tid, 0.0) - th0.get(tid, 0.0)

        other = cpu - tcpu(ui_tid) - tcpu(mon_tid)
        return {
            "mode": "headless",
            "pid": os.getpid(),
            "seconds": wall,
            "cpu_s": cpu,
            "cpu_user_s": ru1.ru_utime - ru0.ru_utime,
            "cpu_system_s": ru1.ru_stime - ru0.ru_stime,
            "cpu_percent_of_core": 100 * cpu / wall,
            "ui_thread_cpu_percent_of_core": 100 * tcpu(ui_tid) / wall,
            "collector_thread_cpu_percent_of_core": 100 * tcpu(mon_tid) / wall,
            "other_threads_cpu_percent_of_core": 100 * max(0.0, other) / wall,
            # ru_maxrss is in KiB on Linux
            "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "redraws": r1 - r0,
            "jobs_on_screen": rows,
            "workers_in_model": workers_seen,
            "threads": proc.num_threads(),
        }

    result = asyncio.run(run())
    with open(a.child_out, "w") as f:
        json.dump(result, f)
    if profiles:
        import io
        import pstats

        for title, prof in profiles.items():
            buf = io.StringIO()
            st = pstats.Stats(prof, stream=buf)
            st.sort_stats("cumulative").print_stats(30)
            st.sort_stats("tottime").print_stats(20)
            print(f"=== {title} ===\n{buf.getvalue()}")
    return 0


# --------------------------------------------------------------------- main


def table(rows: list[dict], n_jobs: int, workers: int, refresh: float) -> str:
    head = ("mode", "jobs", "workers", "refresh", "seconds", "cpu % of one core", "RSS MiB (peak)", "target")
    lines = [head]
    for r in rows:
        ok = "ok" if r["cpu_percent_of_core"] <= TARGET_CPU_PERCENT else "OVER"
        lines.append(
            (
                r["mode"],
                str(n_jobs),
                f"{n_jobs}x{workers}",
                f"{refresh:g} s",
                f"{r['seconds']:.1f}",
                f"{r['cpu_percent_of_core']:.2f}",
                f"{r['peak_rss_mib']:.0f}",
                f"<= {TARGET_CPU_PERCENT:g} % {ok}",
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    extra = []
    for r in rows:
        if r["mode"] == "headless":
            extra.append(
                f"headless split: UI thread {r['ui_thread_cpu_percent_of_core']:.2f} %, "
                f"collector thread {r['collector_thread_cpu_percent_of_core']:.2f} %, "
                f"other {r['other_threads_cpu_percent_of_core']:.2f} % "
                f"({r['redraws']} redraws, {r['workers_in_model']} workers in the model)"
            )
        if r["mode"] == "tmux":
            extra.append(
                f"tmux: user {r['cpu_user_s']:.2f} s + system {r['cpu_system_s']:.2f} s "
                f"of CPU; the tmux server itself used "
                f"{r['tmux_server_cpu_percent_of_core']:.2f} % of a core; "
                f"{r['jobs_on_screen']}/{n_jobs} jobs on screen; quit on q: {r['quit_on_q']}"
            )
    return "\n".join(out + [""] + extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="10 s per mode instead of 30")
    p.add_argument("--seconds", type=float, help="measured seconds per mode (default 30, --quick 10)")
    p.add_argument("--warmup", type=float, help="seconds after every job is on screen (default 5, --quick 3)")
    p.add_argument("--jobs", type=int, default=4)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--refresh", type=float, default=0.5, help="the TUI's refresh (default 0.5 s)")
    p.add_argument("--mode", choices=("both", "tmux", "headless"), default="both")
    p.add_argument("--profile", action="store_true", help="cProfile the headless run's two threads")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--strict", action="store_true", help="exit 1 when over the target")
    # internal: the headless measurement runs in its own process
    p.add_argument("--child-headless", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dir", help=argparse.SUPPRESS)
    p.add_argument("--child-out", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child_headless:
        return child_headless(a)

    seconds = a.seconds or (10.0 if a.quick else 30.0)
    warmup = a.warmup if a.warmup is not None else (3.0 if a.quick else 5.0)
    modes = ["tmux", "headless"] if a.mode == "both" else [a.mode]
    if "tmux" in modes and shutil.which("tmux") is None:
        print("tmux not found: measuring headless only", file=sys.stderr)
        modes = [m for m in modes if m != "tmux"] or ["headless"]

    runtime_dir = tempfile.mkdtemp(prefix="dlwf", dir="/tmp")
    os.chmod(runtime_dir, 0o700)
    workdir = tempfile.mkdtemp(prefix="dlwfw", dir="/tmp")
    budget = 60 + len(modes) * (seconds + warmup + 60)
    load_before = os.getloadavg()
    procs = start_jobs(a.jobs, a.workers, runtime_dir, budget, workdir)
    rows: list[dict] = []
    try:
        t = time.monotonic()
        wait_jobs_ready(procs, workdir)
        snap = wait_all_visible(runtime_dir, a.jobs, a.workers)
        print(
            f"{a.jobs} jobs x {a.workers} workers visible after {time.monotonic() - t:.1f} s; "
            f"measuring {seconds:g} s per mode ({', '.join(modes)}) after {warmup:g} s warm-up",
            file=sys.stderr,
        )
        job_pids = [j["pid"] for j in snap["jobs"]]
        for mode in modes:
            if mode == "tmux":
                rows.append(measure_tmux(runtime_dir, job_pids, seconds, warmup, a.refresh))
            else:
                rows.append(measure_headless(runtime_dir, a.jobs, seconds, warmup, a.refresh, a.profile))
        host_cpu = snap["host"].get("cpu_percent")
    finally:
        stop_sessions(procs)
        shutil.rmtree(runtime_dir, ignore_errors=True)
        shutil.rmtree(workdir, ignore_errors=True)

    print(table(rows, a.jobs, a.workers, a.refresh))
    print(
        f"machine: {os.cpu_count()} CPUs, load average {load_before[0]:.1f} before / "
        f"{os.getloadavg()[0]:.1f} after; host CPU busy {host_cpu}% when the jobs were up"
    )
    for r in rows:
        if r.get("profile_text"):
            print(r["profile_text"])
    if a.json:
        import textual

        doc = {
            "target_cpu_percent_of_core": TARGET_CPU_PERCENT,
            "jobs": a.jobs,
            "workers_per_job": a.workers,
            "refresh_s": a.refresh,
            "size": list(SIZE),
            "python": platform.python_version(),
            "textual": textual.__version__,
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(),
            "host_cpu_percent_with_jobs": host_cpu,
            "results": [{k: v for k, v in r.items() if k != "profile_text"} for r in rows],
        }
        write_json(a.json, doc)
    over = any(r["cpu_percent_of_core"] > TARGET_CPU_PERCENT for r in rows)
    return 1 if (a.strict and over) else 0


if __name__ == "__main__":
    sys.exit(main())
