"""Recordings of real jobs: record, replay, report, compare, and the ways a
recording ends (the job exits, Ctrl-C, SIGTERM, the recorder killed)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

from dlwatch.record import reader
from dlwatch.record.compare import compare
from dlwatch.record.series import build, summary
from dlwatch.record.svgchart import COLORS
from tests.e2e_util import JOB, Job, dlwatch, truth_in_window


def dlwatch_proc(*args: str, runtime_dir: str, cwd: str | None = None) -> subprocess.Popen:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    return subprocess.Popen(
        [sys.executable, "-m", "dlwatch", *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def lines_in(path: str) -> int:
    try:
        return len(reader.read(path).snapshots)
    except OSError:
        return 0


def wait_lines(path: str, n: int, timeout: float = 30.0) -> None:
    end = time.monotonic() + timeout
    while lines_in(path) < n:
        assert time.monotonic() < end, f"{path}: fewer than {n} snapshots after {timeout} s"
        time.sleep(0.2)


# Each recorded window's wait within 2 points of the loop's own, as the
# snapshot-accuracy tests hold in the timing tier: beside the parallel tier a
# preemption between the loop's clock reads and the probe's parted them (0.478
# against 0.500, fresh-clone run 47).
@pytest.mark.timing
def test_recording_of_a_real_job_matches_the_loop_and_replays_to_the_same_figures(short_tmpdir):
    path = os.path.join(short_tmpdir, "rec.jsonl")
    job = Job("--duration", "7", "--sample-ms", "5", "--step-ms", "5")
    try:
        job.wait_socket()
        rec = dlwatch_proc("record", "-o", path, "--pid", str(job.proc.pid), runtime_dir=job.dir)
        result = job.finish()
        _, err = rec.communicate(timeout=30)
    finally:
        job.cleanup()
    # --pid: the recording ends by itself when the job exits.
    assert rec.returncode == 0, err
    assert f"job {job.proc.pid} exited" in err
    r = reader.read(path)
    assert r.warnings == [] and r.header["dlwatch_recording"] == 1 and r.header["interval_s"] == 1.0
    live = []
    for snap in r.snapshots:
        assert snap["schema_version"] == 1
        for j in snap["jobs"]:
            assert j["pid"] == job.proc.pid
            if j["state"] == "live" and j["loaders"] and j["loaders"][0]["data_wait_fraction"] is not None:
                live.append(j["loaders"][0])
    assert len(live) >= 4, r.snapshots
    # Each line's figures are the loop's own over that line's window (the
    # snapshot's contract), after the recorder's rounding.
    batches = result["recs"]["train"]["batches"]
    checked = 0
    for ld in live:
        start, end = ld["window_mono_ns"]
        if start < batches[0][1] or end > batches[-1][2]:
            continue  # the first batch or the end of the job inside the window
        truth = truth_in_window(batches, start, end)
        assert ld["data_wait_fraction"] == pytest.approx(truth["data_wait_fraction"], abs=0.02)
        checked += 1
    assert checked >= 3

    # Replayed in the live view, each line shows its own figures.
    from dlwatch.tui import fmt
    from dlwatch.tui.app import DlwatchApp
    from dlwatch.tui.sources import ReplaySource
    from dlwatch.tui.textline import TextLine
    from tests.tui_fixtures import plain

    src = ReplaySource.from_file(path)
    # The first line whose job shows a loader (before its first iter() a live
    # job has none, and the view then has no loader panel to read).
    target = next(
        i
        for i, s in enumerate(r.snapshots)
        if s["jobs"] and s["jobs"][0]["state"] == "live" and s["jobs"][0]["loaders"]
    )

    async def play() -> list[tuple[dict, str]]:
        seen = []
        app = DlwatchApp(src, interval=0.1)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.press("p")  # pause: the keys move, not the clock
            await pilot.press("home")
            for _ in range(target):
                await pilot.press("full_stop")
            for _ in range(3):
                # The panel of a loader seen for the first time mounts a
                # moment after the snapshot that brings it.
                for _ in range(40):
                    await pilot.pause(0.05)
                    stats = app.screen.query("#loader-stats")
                    if stats:
                        break
                seen.append((app.snapshot, plain(stats.first(TextLine))))
                await pilot.press("full_stop")
        return seen

    shown = asyncio.run(play())
    for snap, text in shown:
        recorded = next(s for s in r.snapshots if s["time"] == snap["time"])
        ld_rec = recorded["jobs"][0]["loaders"][0] if recorded["jobs"][0]["loaders"] else None
        ld = snap["jobs"][0]["loaders"][0] if snap["jobs"][0]["loaders"] else None
        for key in ("data_wait_fraction", "batches_per_s", "wait_ms_mean", "step_ms_mean", "workers"):
            assert (ld or {}).get(key) == (ld_rec or {}).get(key)
        if ld is not None and ld["data_wait_fraction"] is not None:
            assert fmt.rate(ld["batches_per_s"]) in text


def test_record_pid_of_a_jobs_parent_says_it_is_no_job_and_names_the_job(short_tmpdir):
    # The job's parent (this test process, as a `dlwatch run` wrapper would
    # be) is no job: before, its recording ran to "0 jobs … has exited".
    job = Job("--duration", "20", "--sample-ms", "5", "--step-ms", "5")
    others = {}
    try:
        job.wait_ready(0.5)
        path = os.path.join(short_tmpdir, "parent.jsonl")
        rec = dlwatch_proc("record", "-o", path, "--pid", str(os.getpid()), runtime_dir=job.dir)
        _, err = rec.communicate(timeout=30)
        # Every command that takes --pid says the same of a wrapper's PID, and
        # of a worker's names its job (a QA run: "no dlwatch job with PID",
        # "not instrumented … without the hook", and stacks printed the
        # wrapper's own stack as the trainer's, exit 0).
        worker = psutil.Process(job.proc.pid).children()[0].pid
        for pid in (os.getpid(), worker):
            for cmd in ("snapshot", "stacks", "profile"):
                others[cmd, pid] = dlwatch(cmd, "--pid", str(pid), runtime_dir=job.dir, timeout=60)
    finally:
        job.kill()
    assert rec.returncode != 0, err
    assert f"PID {os.getpid()} is not a dlwatch job" in err
    assert f"use --pid {job.proc.pid}" in err and "dlwatch ls" in err
    assert not os.path.exists(path)
    for (cmd, pid), r in others.items():
        assert r.returncode == 1 and "Traceback" not in r.stderr, (cmd, pid, r.stdout[-500:], r.stderr[-500:])
        said = "it started the job" if pid == os.getpid() else f"it is a process of job {job.proc.pid}"
        assert f"PID {pid} is not a dlwatch job: {said}" in r.stderr, (cmd, r.stderr)
        assert f"use --pid {job.proc.pid}" in r.stderr and r.stdout == "", (cmd, r.stdout[-500:])


def test_ctrl_c_ends_a_recording_cleanly_and_a_killed_one_still_reads(short_tmpdir):
    job = Job("--duration", "30")
    try:
        job.wait_socket()
        gz = os.path.join(short_tmpdir, "a.jsonl.gz")
        rec = dlwatch_proc("record", "-o", gz, runtime_dir=job.dir)
        wait_lines(gz, 3)
        rec.send_signal(signal.SIGINT)
        _, err = rec.communicate(timeout=15)
        assert rec.returncode == 0, err
        assert "SIGINT received" in err and "Traceback" not in err
        r = reader.read(gz)
        assert r.warnings == [] and len(r.snapshots) >= 3
        assert any(j["pid"] == job.proc.pid for j in r.snapshots[-1]["jobs"])

        # SIGTERM too.
        plain = os.path.join(short_tmpdir, "b.jsonl")
        rec = dlwatch_proc("record", "-o", plain, runtime_dir=job.dir)
        wait_lines(plain, 2)
        rec.send_signal(signal.SIGTERM)
        _, err = rec.communicate(timeout=15)
        assert rec.returncode == 0 and "SIGTERM received" in err, err

        # Killed outright mid-recording: what was flushed reads; a torn last
        # line costs that line and a warning, never the file.
        killed = os.path.join(short_tmpdir, "c.jsonl.gz")
        rec = dlwatch_proc("record", "-o", killed, runtime_dir=job.dir)
        wait_lines(killed, 3)
        rec.kill()
        rec.communicate(timeout=15)
        assert len(reader.read(killed).snapshots) >= 3
        with open(plain, "a", encoding="utf-8") as f:
            f.write('{"schema_version": 1, "time": 12')  # a line the recorder never finished
        torn = reader.read(plain)
        assert len(torn.snapshots) >= 2
        assert [w for w in torn.warnings if "last line is torn" in w], torn.warnings
        out = os.path.join(short_tmpdir, "torn.html")
        r2 = subprocess.run(
            [sys.executable, "-m", "dlwatch", "report", plain, "-o", out], capture_output=True, text=True
        )
        assert r2.returncode == 0 and "torn" in r2.stderr and os.path.getsize(out) > 0, r2.stderr
    finally:
        job.cleanup()


def test_run_record_records_the_commands_jobs_and_passes_on_its_exit_status(short_tmpdir):
    path = os.path.join(short_tmpdir, "run.jsonl.gz")
    d = short_tmpdir
    code = (
        "import subprocess, sys\n"
        f"r = subprocess.run([sys.executable, {str(JOB)!r}, '--out', sys.argv[1], '--duration', '3'])\n"
        "sys.exit(r.returncode or 7)\n"
    )
    out = os.path.join(tempfile.mkdtemp(prefix="dlwo", dir="/tmp"), "o.json")
    try:
        p = dlwatch_proc(
            "run", "--record", path, "--", sys.executable, "-c", code, out, runtime_dir=os.path.join(d, "rt")
        )
        _, err = p.communicate(timeout=90)
    finally:
        shutil.rmtree(os.path.dirname(out), ignore_errors=True)
    # The command's status (7) is ours; the job is the command's grandchild.
    assert p.returncode == 7, err
    assert "the command exited with status 7" in err
    r = reader.read(path)
    assert r.warnings == [] and r.header["command"] == "run"
    pids = {j["pid"] for s in r.snapshots for j in s["jobs"]}
    assert len(pids) == 1, pids
    assert any(ld["batches_total"] > 0 for s in r.snapshots for j in s["jobs"] for ld in j["loaders"])
    assert r.snapshots[-1]["jobs"][0]["state"] != "live"


def test_run_record_of_an_interrupted_command_says_so_and_keeps_the_recording(short_tmpdir):
    path = os.path.join(short_tmpdir, "int.jsonl")
    code = "import sys, time; open(sys.argv[1], 'w').close(); time.sleep(60)"
    started = os.path.join(short_tmpdir, "started")
    # stdin too off any terminal: dlwatch passes on a SIGINT that did not come from one.
    p = subprocess.Popen(
        [sys.executable, "-m", "dlwatch", "run", "--record", path, "--", sys.executable, "-c", code, started],
        env=dict(os.environ, DLWATCH_DIR=os.path.join(short_tmpdir, "rt")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.monotonic() + 60
    while not os.path.exists(started):
        assert p.poll() is None and time.monotonic() < end, p.stderr.read() if p.stderr else ""
        time.sleep(0.05)
    p.send_signal(signal.SIGINT)
    _, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert "the command was interrupted (Ctrl-C, SIGINT); the recording is kept" in err
    assert "status -" not in err and os.path.exists(path)


def test_run_record_interrupted_as_the_command_starts_still_passes_it_on(short_tmpdir):
    # SIGINT the moment the command's process exists: dlwatch may not have
    # returned from starting it yet. The signal must still reach the command
    # (a lost one left it sleeping, and dlwatch waiting for it, 60 s).
    import psutil

    path = os.path.join(short_tmpdir, "early.jsonl")
    p = subprocess.Popen(
        [sys.executable, "-m", "dlwatch", "run", "--record", path, "--", "sleep", "60"],
        env=dict(os.environ, DLWATCH_DIR=os.path.join(short_tmpdir, "rt")),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    parent = psutil.Process(p.pid)
    end = time.monotonic() + 30
    while not parent.children():
        assert p.poll() is None and time.monotonic() < end, p.stderr.read() if p.stderr else ""
    # Held still where it is (starting the command, as a loaded box holds
    # it), interrupted there, then let go.
    p.send_signal(signal.SIGSTOP)
    p.send_signal(signal.SIGINT)
    p.send_signal(signal.SIGCONT)
    _, err = p.communicate(timeout=20)
    assert p.returncode == 130, err
    assert "the command was interrupted (Ctrl-C, SIGINT); the recording is kept" in err


def dlwatch_run(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "dlwatch", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def io_bound(d: str, path: str, workers: int) -> subprocess.Popen:
    return dlwatch_proc(
        "run",
        "--record",
        path,
        "--",
        sys.executable,
        "-m",
        "dlwatch.demo.train",
        "--scenario",
        "io-bound",
        "--num-workers",
        str(workers),
        "--quiet",
        "--device",
        "cpu",
        "--duration",
        "10",
        runtime_dir=d,
    )


@pytest.mark.timing
def test_compare_one_vs_four_workers_of_an_io_bound_job_and_the_html_report(short_tmpdir):
    a, b = os.path.join(short_tmpdir, "one.jsonl.gz"), os.path.join(short_tmpdir, "four.jsonl.gz")
    rt = short_tmpdir + "/rt"
    pa, pb = io_bound(rt, a, 1), io_bound(rt, b, 4)
    for p in (pa, pb):
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    r = dlwatch_run("compare", a, b, "-o", os.path.join(short_tmpdir, "c.html"))
    assert r.returncode == 0, r.stderr
    row = next(line for line in r.stdout.splitlines() if line.startswith("num_workers"))
    assert row.split()[1:] == ["1", "4", "differs"], r.stdout
    assert not [
        line for line in r.stdout.splitlines() if line.endswith("differs") and "num_workers" not in line
    ]
    tput = next(line for line in r.stdout.splitlines() if line.startswith("throughput"))
    # Sleep-bound loading: 4 workers overlap 4 reads, so throughput grows
    # ~4x (the step caps it); anything under 2.5x means the figures are off.
    c = compare(build(reader.read(a)), build(reader.read(b)))
    ta, tb = c.metrics[0][2], c.metrics[0][3]
    assert tb > 2.5 * ta, r.stdout
    assert re.search(r"\+\d+ % \(×[3-9]\.\d\d\)", tput), tput
    wait = next(m for m in c.metrics if m[0] == "data wait, mean")
    assert wait[3] < wait[2]
    html = open(os.path.join(short_tmpdir, "c.html"), encoding="utf-8").read()
    assert "num_workers" in html and 'class="differs"' in html and "<svg" in html

    # The same two runs as a CI gate: four workers is the baseline, one the regression.
    fast, slow = b, a
    r = dlwatch_run("compare", fast, slow, "--max-regression", "10")
    assert r.returncode == 3, r.stdout + r.stderr
    assert re.search(r"^FAIL: B's batches/s is \d+\.\d % below A's", r.stdout, re.M), r.stdout
    r = dlwatch_run("compare", slow, fast, "--max-regression", "10", "--json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert doc["gate"]["result"] == "pass" and doc["exit_status"] == 0
    assert doc["gate"]["checks"][0]["change"] > 150  # 4 workers: more than 2.5x the batches/s
    # A recording cut short before its first snapshot ended cannot be judged.
    torn = os.path.join(short_tmpdir, "torn.jsonl.gz")
    with open(slow, "rb") as src, open(torn, "wb") as dst:
        dst.write(src.read()[:400])
    r = dlwatch_run("compare", fast, torn, "--max-regression", "10")
    assert r.returncode == 1 and "holds no snapshots" in r.stderr and "Traceback" not in r.stderr

    # The single report, rendered by a real browser.
    out = os.path.join(short_tmpdir, "four.html")
    r = subprocess.run(
        [sys.executable, "-m", "dlwatch", "report", b, "-o", out], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    html = open(out, encoding="utf-8").read()
    assert not re.search(r"(https?:|//)[^ \"'<]*\.", _without_text(html)), "an external URL in the report"
    assert not re.search(r"<(script|link|img|iframe)\b", html)
    assert html.count("<svg") >= 6 and "io-bound" in html
    s = summary(build(reader.read(b)).main_loader())
    assert f"{s['batches_per_s']:.2f}" in html
    shot = screenshot(out, short_tmpdir)
    assert_chart_pixels(shot)


def _without_text(html: str) -> str:
    """The markup only: a command line shown as text may contain anything."""
    return re.sub(r">[^<]*<", "><", html)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def screenshot(html: str, workdir: str) -> str:
    if CHROMIUM is None:
        pytest.skip("no chromium on this machine (.ci/run installs it from the system packages)")
    png = os.path.join(workdir, "report.png")
    profile = os.path.join(workdir, "chromium-profile")
    subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            f"--screenshot={png}",
            "--window-size=1280,2000",
            "file://" + html,
        ],
        capture_output=True,
        timeout=120,
    )
    assert os.path.exists(png), "chromium wrote no screenshot"
    return png


def assert_chart_pixels(png: str) -> None:
    """The charts were drawn: the screenshot holds the series' colours (the
    first series' blue and at least one later series), not just text on white."""
    import zlib

    data = open(png, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    color_type = data[25]
    idat = b""
    pos = 8
    while pos < len(data):
        n = int.from_bytes(data[pos : pos + 4], "big")
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    raw = zlib.decompress(idat)
    bpp = 4 if color_type == 6 else 3
    stride = width * bpp
    rows = []
    prev = bytearray(stride)
    i = 0
    for _ in range(height):
        f, line = raw[i], bytearray(raw[i + 1 : i + 1 + stride])
        i += 1 + stride
        for x in range(stride):
            a = line[x - bpp] if x >= bpp else 0
            b, c = prev[x], prev[x - bpp] if x >= bpp else 0
            if f == 1:
                line[x] = (line[x] + a) & 255
            elif f == 2:
                line[x] = (line[x] + b) & 255
            elif f == 3:
                line[x] = (line[x] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        rows.append(bytes(line))
        prev = line
    # Which later series ends on top depends on the run: four workers with the
    # same load draw four coinciding lines, and the last one drawn hides the
    # others; the hint bar is amber only while a warning was up. So the check is
    # the first series plus any later one, never one particular colour.
    shown = COLORS[:4]  # the series of a four-worker report
    palette = [tuple(int(c[i : i + 2], 16) for i in (1, 3, 5)) for c in shown]
    counts = [0] * len(palette)
    for row in rows:
        for x in range(0, stride, bpp * 2):
            px = row[x : x + 3]
            for k, ref in enumerate(palette):
                if max(abs(px[0] - ref[0]), abs(px[1] - ref[1]), abs(px[2] - ref[2])) < 40:
                    counts[k] += 1
                    break
    named = dict(zip(shown, counts))
    assert counts[0] > 200 and sum(counts[1:]) > 100, named


@pytest.mark.timeout(240)
def test_copy_on_read_growth_is_shown_live_and_carried_by_the_recording(short_tmpdir):
    """The rule wants >= 60 s of USS samples after a worker's first 10 s: one
    job under ``dlwatch run --record`` serves the scenario's live check (the
    live Monitor, as test_scenarios watches every scenario: its hint, no other
    warning, kept once shown) and the recording's (it carries the hint the
    live view showed)."""
    from tests.e2e.test_scenarios import assert_only_its_hint, is_the_boxs_load, watch

    path = os.path.join(short_tmpdir, "mem.jsonl.gz")
    rt = short_tmpdir + "/rt"
    p = dlwatch_proc(
        "run",
        "--record",
        path,
        "--interval",
        "2",
        "--",
        sys.executable,
        "-m",
        "dlwatch.demo.train",
        "--scenario",
        "worker-memory-growth",
        "--quiet",
        "--device",
        "cpu",
        "--duration",
        "95",
        runtime_dir=rt,
    )
    try:
        # Live: the hint by 88 s of training and kept for the 3 s after, while
        # the job still runs (it ends on its own 95 s into its training: a
        # recording of a job that exits normally). Counted from the training's
        # start, not the test's: beside the parallel tier the job took 13 s to
        # start, and an 88 s watch from the test's start ended with its workers'
        # memory sampled for under the minute the rule needs (fresh-clone run 43).
        story: dict = {}
        seen, snap = watch(rt, None, "worker-memory-growth", 88.0, story=story, from_training=True)
        _, err = p.communicate(timeout=200)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    # Beside the parallel tier: the box's load may be told too, with its figures.
    assert_only_its_hint(seen, snap, "worker-memory-growth", beside_load=True)
    assert story["dropped"] == [], story
    assert p.returncode == 0, err
    s = build(reader.read(path))
    spans = [h for h in s.hints if h.id == "worker-memory-growth"]
    assert spans, f"no worker-memory-growth in {[h.id for h in s.hints]}"
    assert spans[0].start >= 60, "a minute of samples before the hint"
    assert spans[0].evidence and spans[0].suggestion
    warns = {
        h.id for h in s.hints if h.severity in ("warn", "critical") and not is_the_boxs_load(h.id, h.evidence)
    }
    # When (seconds into the recording) and what: the live watch ends at 88 s.
    # A string: pytest cuts a list's repr at 240 characters (it hid the span that mattered).
    spans_seen = "; ".join(
        f"{h.id} {h.severity} {h.start:.1f}-{h.end:.1f} s: {h.message[:160]}" for h in s.hints
    )
    assert warns == {"worker-memory-growth"}, spans_seen
    assert summary(s.main_loader())["worker_uss_growth_max"] > 32 * 2**20
