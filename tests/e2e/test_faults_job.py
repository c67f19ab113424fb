"""Faults around a real training job: abusive, stopped and killed monitors,
garbage on the socket, the runtime directory deleted under it.

Every case runs two identical instrumented jobs side by side (same seed,
sleep-based costs, each with its own runtime directory): job A is abused,
twin B is left alone, and both are stopped once the last fault is over. Then:

- A's batch checksums equal B's over every batch both trained, which spans
  every fault (the probe never changes what is trained);
- A's pace (batches/s from its own per-batch records, counted over the
  abuse window on the shared monotonic clock) is within PACE_TOL of B's over
  the same window;
- A's RSS grows by less than RSS_BOUND during the abuse;
- afterwards a well-behaved client still gets live frames from A.

Why PACE_TOL is 5 % and not the 2 % of docs/ARCHITECTURE.md §4: the jobs are loop-bound on a
20 ms sleep per step, so pace = 1 / (20 ms + wake-up latency + Python work).
On this shared 2-core box, with 6+ processes of the two jobs and the abusers
competing, wake-up latency differs between two *identical untouched* jobs:
measured over one 3 s window, up to ~4 % on a normally loaded box and up to
~15 % with three extra busy loops (the ``control`` window shows that noise
floor); over all 8 windows it averages out to within ~2 %. So the total
ratio must stay >= 1 - 5 %, and each window's >= 1 - 15 % (it catches any
stall of more than ~0.3 s in a 2 s window; a probe that waited for a
stopped client would stall the loop completely). The windows are 2 s: in
the timing tier, on a box with nothing else running, each window's ratio
read 0.989-1.014 (two runs, ~90 batches a window) and the total 0.999 and
1.002 over ~21 s. The bounds are one-sided:
the abused job running *faster* than its twin is noise, never harm. The
measured ratios are printed (run with -s); on a quiet box they are within
0.1 % of 1 in total.
"""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from dlwatch import wire
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.monitor import take_snapshot
from tests.e2e_util import Job

HERE = Path(__file__).resolve().parent.parent
MONITOR = HERE / "jobs" / "fault_monitor.py"

# A cap: the jobs are stopped once the faults are over (~21 s, ~950 batches
# of ~22 ms on a quiet box); a job that reaches it first fails the test.
N_BATCHES = 4000
STEP_MS = 20
JOB_ARGS = [
    "--workers",
    "2",
    "--batch-size",
    "4",
    "--sample-ms",
    "1",
    "--step-ms",
    str(STEP_MS),
    "--size",
    "8000",
    "--epochs",
    "1",
    "--batches-per-epoch",
    str(N_BATCHES),
    "--duration",
    "1000",
    "--shuffle",
    "--seed",
    "7",
    "--checksum",
]
ABUSE_S = 2.0
PACE_TOL = 0.05
PACE_TOL_WINDOW = 0.15
RSS_BOUND = 20 << 20
HELLO = wire.encode(wire.client_hello("dlwatch fault tests"))


# --- helpers -------------------------------------------------------------------------


def _connect(path: str, timeout: float = 3.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(path)
    return s


def _read_until_eof(s: socket.socket, timeout: float = 3.0) -> tuple[bytes, bool]:
    """Everything the server sends until it hangs up: (data, hung_up)."""
    data = b""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r, _, _ = select.select([s], [], [], max(0.0, deadline - time.monotonic()))
        if not r:
            break
        try:
            chunk = s.recv(65536)
        except (ConnectionResetError, BrokenPipeError):
            return data, True
        if not chunk:
            return data, True
        data += chunk
    return data, False


def _error_frames(data: bytes) -> list[str]:
    out = []
    for m in wire.FrameDecoder().feed(data):
        if isinstance(m, dict) and m.get("type") == "error":
            out.append(m["message"])
    return out


def _pace(batches: list, start: int, end: int) -> float:
    n = sum(1 for _, _, t1 in batches if start < t1 <= end)
    return n / ((end - start) / 1e9)


def _rss(pid: int) -> int:
    return psutil.Process(pid).memory_info().rss


def assert_live_frames(job: Job, after_ns: int, n: int = 3, timeout: float = 5.0) -> None:
    """A well-behaved client attaches and receives fresh frames (made after ``after_ns``)."""
    c = JobConnection(job.proc.pid, job.socket)
    assert c.connect(), c.reason
    try:
        deadline = time.monotonic() + timeout
        fresh = 0
        while time.monotonic() < deadline and fresh < n:
            select.select([c.sock], [], [], 0.2)
            c.read()
            assert c.sock is not None, f"job hung up on a good client: {c.state} {c.reason}"
            fresh = sum(1 for f in c.frames if f["mono_ns"] > after_ns)
        assert c.state == "live", (c.state, c.reason)
        assert c.bad_frames == 0, c.last_error
        assert fresh >= n, f"only {fresh} fresh frames in {timeout} s"
        seqs = [f["seq"] for f in c.frames]
        assert seqs == sorted(seqs)
        assert any(ld["batches"] > 0 for ld in c.frames[-1]["loaders"])
    finally:
        c.close()


def _monitor_proc(job: Job) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(MONITOR), str(job.proc.pid), job.socket],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_line(p: subprocess.Popen, want: str, timeout: float = 15.0) -> None:
    r, _, _ = select.select([p.stdout], [], [], timeout)
    assert r, f"monitor printed nothing in {timeout} s"
    line = p.stdout.readline().strip()
    assert line == want, (line, p.stderr.read() if p.poll() is not None else "")


def _reap(p: subprocess.Popen) -> None:
    if p.poll() is None:
        try:
            os.kill(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait(5)
    for f in (p.stdout, p.stderr):
        if f:
            f.close()


# --- the abuses (each runs for about ABUSE_S against job A) ----------------------------


def abuse_none(job: Job, notes: dict) -> None:
    time.sleep(ABUSE_S)


def abuse_silent_clients(job: Job, notes: dict) -> None:
    """Clients that connect, say hello and never read a byte."""
    socks = []
    for _ in range(8):
        s = _connect(job.socket)
        s.sendall(HELLO)
        socks.append(s)
    time.sleep(ABUSE_S)
    for s in socks:
        s.close()


def abuse_stopped_monitor(job: Job, notes: dict) -> None:
    """A monitor process attached and reading, then frozen with SIGSTOP."""
    p = _monitor_proc(job)
    try:
        _wait_line(p, "live")
        os.kill(p.pid, signal.SIGSTOP)
        time.sleep(ABUSE_S)
        notes["stopped_monitor_state"] = psutil.Process(p.pid).status()
    finally:
        _reap(p)
    assert notes["stopped_monitor_state"] == psutil.STATUS_STOPPED


def abuse_killed_monitors(job: Job, notes: dict) -> None:
    """Monitors killed with SIGKILL mid-stream, one after another."""
    end = time.monotonic() + ABUSE_S
    killed = 0
    while time.monotonic() < end:
        p = _monitor_proc(job)
        try:
            _wait_line(p, "live")
            time.sleep(0.1)  # mid-stream: frames are flowing
        finally:
            _reap(p)
        killed += 1
    notes["monitors_killed"] = killed
    assert killed >= 2


def abuse_churn(job: Job, notes: dict) -> None:
    """300 connect/disconnect cycles: bare, after hello, and mid-history."""
    end = time.monotonic() + ABUSE_S
    for i in range(300):
        s = _connect(job.socket)
        if i % 3:
            s.sendall(HELLO)
        if i % 3 == 2:
            s.recv(100)  # hang up in the middle of the history replay
        s.close()
    notes["churn_s"] = round(ABUSE_S - (end - time.monotonic()), 2)
    time.sleep(max(0.0, end - time.monotonic()))


def abuse_bad_bytes(job: Job, notes: dict) -> None:
    """Garbage, invalid JSON, protocol 99, a window frame from a client, and a
    slow drip of bytes (1 byte per 50 ms), all at once."""
    end = time.monotonic() + ABUSE_S
    rnd = random.Random(3)
    drip = _connect(job.socket)
    dripped = [0]
    drip_err: list = []

    def dripper():
        try:
            while time.monotonic() < end:
                drip.send(bytes([rnd.choice(b'{}[]":abcdef0123 ')]))
                dripped[0] += 1
                time.sleep(0.05)
        except OSError as e:  # hung up on: fine, it is not a hello
            drip_err.append(e)

    t = threading.Thread(target=dripper)
    t.start()
    payloads = {
        "garbage": bytes(rnd.getrandbits(8) for _ in range(2000)).replace(b"\n", b"") + b"\n",
        "binary_nul": b"\x00" * 100 + b"\n",
        "invalid_json": b'{"type": hello, protocol: 1}\n',
        "not_an_object": b"[1, 2, 3]\n",
        "wrong_version": wire.encode({"type": "hello", "protocol": 99, "client": "from the future"}),
        "server_hello_from_client": wire.encode(
            {"type": "hello", "protocol": 1, "job": {"pid": 1, "cmdline": "x"}}
        ),
        "nan": b'{"type": "hello", "protocol": NaN}\n',
    }
    replies = {}
    rounds = 0
    while time.monotonic() < end - 0.3:
        for name, data in payloads.items():
            s = _connect(job.socket)
            try:
                s.sendall(data)
            except OSError:
                pass
            got, hung_up = _read_until_eof(s)
            s.close()
            replies[name] = (_error_frames(got), hung_up, b'"window"' in got)
        rounds += 1
        time.sleep(0.1)
    t.join()
    drip.close()
    notes["bad_bytes_rounds"] = rounds
    notes["dripped_bytes"] = dripped[0]
    for name, (errors, hung_up, windows) in replies.items():
        assert hung_up, f"{name}: the job kept the connection open"
        assert len(errors) == 1, f"{name}: expected one error frame, got {errors}"
        assert not windows, f"{name}: the job streamed frames to a bad client"
    assert "protocol version mismatch" in replies["wrong_version"][0][0]


def abuse_oversize(job: Job, notes: dict) -> None:
    """10 MB without a newline, before and after a valid hello."""
    end = time.monotonic() + ABUSE_S
    blob = b"x" * (10 << 20)
    results = []
    while time.monotonic() < end - 0.5:
        for greet in (False, True):
            s = _connect(job.socket, timeout=5.0)
            sent = 0
            if greet:
                s.sendall(HELLO)
            try:
                view = memoryview(blob)
                while sent < len(blob):
                    sent += s.send(view[sent : sent + (1 << 20)])
            except (TimeoutError, BrokenPipeError, ConnectionResetError):
                pass
            got, hung_up = _read_until_eof(s)
            s.close()
            results.append((greet, sent, hung_up, _error_frames(got)))
            time.sleep(0.2)
    notes["oversize_attempts"] = len(results)
    notes["oversize_max_accepted_bytes"] = max(r[1] for r in results)
    for greet, sent, hung_up, errors in results:
        assert hung_up
        assert sent < len(blob), "the job swallowed 10 MB without hanging up"
        if not greet:
            # After a hello the client's buffer is full of history it does not
            # read, so the error frame is best effort; before it, it must arrive.
            assert any("exceeds" in e for e in errors), (greet, errors)


def abuse_rmtree(job: Job, notes: dict) -> None:
    """The runtime directory deleted under the running job."""
    t0 = time.monotonic()
    shutil.rmtree(job.dir)
    assert not os.path.exists(job.socket)
    while not os.path.exists(job.socket):
        assert time.monotonic() - t0 < 6.0, "the socket did not reappear within 6 s"
        time.sleep(0.02)
    notes["rebind_s"] = round(time.monotonic() - t0, 2)
    st = os.stat(job.dir)
    assert st.st_mode & 0o777 == 0o700
    assert os.stat(job.socket).st_mode & 0o777 == 0o600
    snap = take_snapshot(directory=job.dir, settle_s=0.3)  # the code path of `dlwatch snapshot`
    jobs = [j for j in snap["jobs"] if j["pid"] == job.proc.pid]
    assert jobs and jobs[0]["state"] == "live", snap["jobs"]
    assert jobs[0]["loaders"] and jobs[0]["loaders"][0]["batches_total"] > 0
    left = ABUSE_S - (time.monotonic() - t0)
    if left > 0:
        time.sleep(left)


ABUSES = {
    "control": abuse_none,
    "silent_clients": abuse_silent_clients,
    "stopped_monitor": abuse_stopped_monitor,
    "killed_monitors": abuse_killed_monitors,
    "churn_300": abuse_churn,
    "bad_bytes": abuse_bad_bytes,
    "oversize_10MB": abuse_oversize,
    "rmtree_runtime_dir": abuse_rmtree,  # last: it replaces the directory
}


@pytest.mark.timing
def test_job_survives_every_fault():
    """One abused job and its twin, side by side, through every fault in turn."""
    a, b = Job(*JOB_ARGS), Job(*JOB_ARGS)
    windows = []
    try:
        a.wait_ready(0.5)
        b.wait_ready(0.0)
        rss_a0, rss_b0 = _rss(a.proc.pid), _rss(b.proc.pid)
        for case, abuse in ABUSES.items():
            notes: dict = {}
            r0 = _rss(a.proc.pid)
            w0 = time.perf_counter_ns()
            abuse(a, notes)
            w1 = time.perf_counter_ns()
            r1 = _rss(a.proc.pid)
            assert a.proc.poll() is None and b.proc.poll() is None, (
                f"a job finished during {case}: raise N_BATCHES"
            )
            windows.append((case, w0, w1, r1 - r0, notes))
            assert_live_frames(a, after_ns=w1)
        rss_a1, rss_b1 = _rss(a.proc.pid), _rss(b.proc.pid)
        a.stop()
        b.stop()
        ra, rb = a.finish(), b.finish()
    finally:
        a.cleanup()
        b.cleanup()

    # Same batches, in the same order, as the undisturbed twin, over every
    # batch both trained (the twins start and stop a few batches apart),
    # through every fault; not a word from the probe.
    assert ra["error"] is None and rb["error"] is None
    assert (a.stdout, a.stderr) == (b.stdout, b.stderr)
    ba, bb = ra["recs"]["train"]["batches"], rb["recs"]["train"]["batches"]
    first, last = windows[0][1], windows[-1][2]
    assert ba[-1][2] > last and bb[-1][2] > last, "both jobs must train through every window"
    common = min(len(ra["digest"]), len(rb["digest"]))
    assert len(ra["digest"]) == len(ba) and len(rb["digest"]) == len(bb)
    assert common < N_BATCHES
    assert ra["digest"][:common] == rb["digest"][:common]
    failures = []
    print()
    for case, w0, w1, growth, notes in windows:
        pa, pb = _pace(ba, w0, w1), _pace(bb, w0, w1)
        print(
            f"[{case}] pace abused {pa:.1f}/s twin {pb:.1f}/s ratio {pa / pb:.4f}; "
            f"RSS growth {growth / 1e6:+.2f} MB; {notes}"
        )
        if pa / pb < 1 - PACE_TOL_WINDOW:
            failures.append(f"{case}: pace ratio {pa / pb:.4f} ({pa:.1f} vs {pb:.1f} batches/s)")
    pa, pb = _pace(ba, first, last), _pace(bb, first, last)
    ratio = pa / pb
    growth = rss_a1 - rss_a0
    print(
        f"[all faults, {(last - first) / 1e9:.1f} s] pace abused {pa:.1f}/s twin {pb:.1f}/s "
        f"ratio {ratio:.4f}; RSS growth abused {growth / 1e6:.2f} MB, "
        f"twin {(rss_b1 - rss_b0) / 1e6:.2f} MB"
    )
    assert not failures, failures
    assert ratio >= 1 - PACE_TOL, f"pace ratio {ratio:.4f} ({pa:.1f} vs {pb:.1f} batches/s)"
    assert growth < RSS_BOUND, f"RSS grew {growth / 1e6:.1f} MB under the faults"
