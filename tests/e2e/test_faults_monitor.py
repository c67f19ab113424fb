"""Faults around the monitor: broken, hostile or vanished jobs, /proc and NVML failing.

Each fault must show up as a state in ``Monitor.build()`` / ``take_snapshot``
output (job ``state``/``state_reason``, ``bad_frames``, worker
``state``/``error``, ``gpu_status``), never as an exception.

The jobs here are fake servers (plain Python sockets in a thread) bound in a
real runtime directory, under the PID of a real ``sleep`` process so that
discovery treats them as alive until the test kills that process.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
from types import SimpleNamespace

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlwatch import wire
from dlwatch.collect import jobs as jobsmod
from dlwatch.collect.gpu import GpuSampler
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.model import job_dict
from dlwatch.collect.monitor import Monitor, take_snapshot
from dlwatch.collect.procs import ProcSampler
from tests.e2e_util import short_tmpdir

# --- fake jobs -----------------------------------------------------------------------------


def hello(pid: int, protocol: int = wire.PROTOCOL_VERSION) -> bytes:
    return wire.encode(
        {
            "type": "hello",
            "protocol": protocol,
            "history": 0,
            "job": {
                "pid": pid,
                "cmdline": "python fake_train.py",
                "rank": None,
                "torch_version": "2.13.0",
                "start_method": "fork",
                "started": time.time() - 10,
            },
        }
    )


def window(seq: int, worker_pids=(0,), batches: int | None = None) -> bytes:
    b = seq * 10 if batches is None else batches
    return wire.encode(
        {
            "type": "window",
            "seq": seq,
            "t": time.time(),
            "mono_ns": time.perf_counter_ns(),
            "loaders": [
                {
                    "id": 1,
                    "epoch": 1,
                    "batches": b,
                    "wait_ns": b * 1_000_000,
                    "step_ns": b * 3_000_000,
                    "num_workers": len(worker_pids),
                    "batch_size": 4,
                    "queue": {"ready": 1, "in_flight": 2, "capacity": 4},
                    "workers": [
                        {
                            "id": i,
                            "pid": p,
                            "batches": b // max(1, len(worker_pids)),
                            "fetch_ns": b * 2_000_000,
                            "busy_ns": seq * 50_000_000,
                        }
                        for i, p in enumerate(worker_pids)
                    ],
                }
            ],
        }
    )


class FakeJob:
    """A socket server standing in for a training job.

    ``script(conn, fake)`` runs for every accepted connection after the
    client's hello has been read; it sends whatever the test wants.
    """

    def __init__(self, directory: str, script, listen: bool = True) -> None:
        self.proc = subprocess.Popen(["sleep", "120"])
        self.pid = self.proc.pid
        self.path = os.path.join(directory, f"{self.pid}.sock")
        self.script = script
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        os.chmod(self.path, 0o600)
        self.conns: list[socket.socket] = []
        self.errors: list[BaseException] = []
        self.go = threading.Event()  # scripts may wait for the test's cue
        self.thread = None
        if listen:
            self.srv.listen(4)
            self.srv.settimeout(0.2)
            self._stop = False
            self.thread = threading.Thread(target=self._serve, daemon=True)
            self.thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.srv.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.conns.append(conn)
            try:
                conn.settimeout(2)
                got = b""
                while b"\n" not in got:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    got += chunk
                self.client_hello = json.loads(got.split(b"\n")[0])
                self.script(conn, self)
            except BaseException as e:  # the test asserts on these
                self.errors.append(e)

    def kill_process(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def close(self) -> None:
        self._stop = True
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass
        self.srv.close()
        if self.thread is not None:
            self.thread.join(2)
        if self.proc.poll() is None:
            self.kill_process()


@pytest.fixture
def rtdir():
    d = short_tmpdir()
    try:
        yield d
    finally:
        import shutil

        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fakes():
    made: list[FakeJob] = []
    yield made
    for f in made:
        f.close()


def bare_monitor(directory: str, **kw) -> Monitor:
    kw.setdefault("gpu", False)
    kw.setdefault("procs", False)
    kw.setdefault("host", False)
    kw.setdefault("diagnoser", False)
    return Monitor(directory=directory, **kw)


def pump(m: Monitor, seconds: float, until=None) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        m.poll(0.05)
        if until is not None and until():
            return


def only_job(snap: dict, pid: int) -> dict:
    found = [j for j in snap["jobs"] if j["pid"] == pid]
    assert len(found) == 1, snap["jobs"]
    return found[0]


# --- broken jobs -------------------------------------------------------------------------------


@pytest.mark.parametrize("process_dies", [True, False])
def test_hello_then_dies_mid_frame(rtdir, fakes, process_dies):
    def script(conn, fake):
        conn.sendall(hello(fake.pid) + window(1) + window(2))
        half = window(3)
        conn.sendall(half[: len(half) // 2])
        fake.go.wait(5)
        if process_dies:
            fake.kill_process()
        conn.close()

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        m.scan()
        pump(m, 3, until=lambda: len(m.conns[fake.pid].frames) == 2)
        snap = m.build()
        assert only_job(snap, fake.pid)["state"] == "live"
        fake.go.set()
        pump(m, 3, until=lambda: m.conns[fake.pid].sock is None)
        snap = m.build()
        j = only_job(snap, fake.pid)
        if process_dies:
            # Its wait status when the exit clock read it before the reap.
            why = j["state_reason"]
            assert j["state"] == "exited" and (
                "exited" in why or why == "the process was killed by SIGKILL"
            ), why
            m.scan()  # the next discovery removes the dead job's socket file
            assert not os.path.exists(fake.path), "socket of a dead job must be removed"
            assert m.conns[fake.pid].state == "exited"
        else:
            assert j["state"] == "unreachable"
            assert "closed the connection" in j["state_reason"]
        # The half frame is not a frame, and not a bad one either.
        assert j["bad_frames"] == 0
        assert j["loaders"] and j["loaders"][0]["batches_total"] == 20
        if not process_dies:
            # Still alive, its socket no longer answers: a readable reason, no exception.
            fake.srv.close()
            m._last_scan = 0
            pump(m, 1.2)
            j = only_job(m.build(), fake.pid)
            assert j["state"] in ("unreachable", "live"), j
            assert j["state_reason"], j
    finally:
        m.stop()
    assert not fake.errors, fake.errors


def test_malformed_frames_between_good_ones(rtdir, fakes):
    bad = [
        b"this is not json\n",
        b'{"type": "window"}\n',  # schema: no seq, t, loaders
        b"[1, 2, 3]\n",
        wire.encode({"type": "hello", "protocol": 1}),  # a client hello, from a job
        b"x" * (wire.MAX_FRAME_BYTES + 10) + b"\n",  # oversized
        b'{"type": "window", "seq": NaN}\n',
        b"\xff\xfe\x00\n",
        json.dumps({"type": "window", "seq": 1, "t": 1.0, "mono_ns": 1, "loaders": [{"id": "one"}]}).encode()
        + b"\n",
        b'{"type": "telemetry", "x": 1}\n',  # unknown type
    ]

    def script(conn, fake):
        conn.sendall(hello(fake.pid))
        for i, b in enumerate(bad, start=1):
            conn.sendall(window(i))
            time.sleep(0.01)
            conn.sendall(b)
        conn.sendall(window(len(bad) + 1))
        fake.go.wait(10)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        snap = take_snapshot(monitor=m, settle_s=0.3)
        pump(m, 3, until=lambda: len(m.conns[fake.pid].frames) == len(bad) + 1)
        snap = m.build()
    finally:
        fake.go.set()
        m.stop()
    j = only_job(snap, fake.pid)
    assert j["state"] == "live", j
    assert j["bad_frames"] == len(bad)
    assert j["last_wire_error"]
    assert j["loaders"][0]["batches_total"] == (len(bad) + 1) * 10
    assert not fake.errors, fake.errors


@pytest.mark.parametrize("how", ["server_hello_99", "error_reply"])
def test_protocol_99_is_a_state_not_an_exception(rtdir, fakes, how):
    def script(conn, fake):
        if how == "server_hello_99":
            conn.sendall(hello(fake.pid, protocol=99) + window(1))
        else:
            conn.sendall(
                wire.encode(
                    {
                        "type": "error",
                        "message": "protocol version mismatch: peer speaks 1, this dlwatch speaks 99",
                    }
                )
            )
        fake.go.wait(5)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        m.build()
        m.scan()
        pump(m, 3, until=lambda: m.conns[fake.pid].sock is None)
        c = m.conns[fake.pid]
        assert c.state == "incompatible", (c.state, c.reason)
        assert "protocol" in c.reason
        assert not c.frames
        m.build()  # no exception
        # A second scan does not hammer an incompatible job with reconnects.
        m._last_scan = 0
        pump(m, 1.2)
        assert m.conns[fake.pid].state == "incompatible"
    finally:
        fake.go.set()
        m.stop()


def test_incompatible_job_is_shown_with_its_reason(rtdir, fakes):
    def script(conn, fake):
        conn.sendall(hello(fake.pid, protocol=99))
        fake.go.wait(5)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        snap = take_snapshot(monitor=m, settle_s=0.3)
    finally:
        fake.go.set()
        m.stop()
    j = only_job(snap, fake.pid)
    assert j["state"] == "incompatible"
    assert "protocol version mismatch" in j["state_reason"]


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    assert not jobsmod.pid_alive(p.pid)
    return p.pid


def test_stale_socket_of_a_dead_process_is_removed(rtdir):
    pid = _dead_pid()
    path = os.path.join(rtdir, f"{pid}.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    s.listen(1)
    s.close()  # the file stays: a job killed with SIGKILL leaves exactly this
    assert os.path.exists(path)
    m = bare_monitor(rtdir)
    try:
        snap = take_snapshot(monitor=m, settle_s=0.1)
    finally:
        m.stop()
    assert not os.path.exists(path)
    assert snap["jobs"] == []
    assert pid not in m.conns


def test_socket_nobody_listens_on(rtdir, fakes):
    fake = FakeJob(rtdir, script=None, listen=False)  # bound, never listening; process alive
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        snap = take_snapshot(monitor=m, settle_s=0.1)
        c = m.conns[fake.pid]
        assert c.state == "unreachable"
        assert "cannot connect" in c.reason and "refused" in c.reason.lower()
        assert os.path.exists(fake.path), "a young socket may belong to a job still starting"
        assert all(j["pid"] != fake.pid or j["state"] != "live" for j in snap["jobs"])
        # Once older than the grace period it is stale: removed.
        old = time.time() - jobsmod.STALE_GRACE_S - 1
        os.utime(fake.path, (old, old), follow_symlinks=False)
        m._last_scan = m.conns[fake.pid].tried_at = 0
        pump(m, 0.2)
        assert not os.path.exists(fake.path)
        m.build()
    finally:
        m.stop()


class _Clock:
    """The monitor module's ``time``, its monotonic clock moved by hand."""

    def __init__(self) -> None:
        self.t = time.monotonic()

    def monotonic(self) -> float:
        return self.t

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_a_new_socket_is_seen_within_a_quarter_second_and_a_refusing_one_retried_each_second(
    rtdir, fakes, monkeypatch
):
    # At a 1 s rescan a new job waited 0.3-1.0 s to be listed, and its
    # judgement (warm-up, hold) started that much later. A socket that
    # refuses is retried at most once a second: a connect may block 0.5 s.
    from dlwatch.collect import monitor as monmod

    clock = _Clock()
    monkeypatch.setattr(monmod, "time", clock)
    tries: list[int] = []
    real_connect = JobConnection.connect

    def counted(self):
        tries.append(self.pid)
        return real_connect(self)

    monkeypatch.setattr(JobConnection, "connect", counted)
    m = bare_monitor(rtdir)
    try:
        m.poll(0)  # the first scan: nothing yet
        refusing = FakeJob(rtdir, script=None, listen=False)
        fake = FakeJob(rtdir, script=lambda conn, f: f.go.wait(5))
        fakes += [refusing, fake]
        clock.t += monmod.RESCAN_S * 0.8
        m.poll(0)
        assert fake.pid not in m.conns  # not due yet
        clock.t += monmod.RESCAN_S * 0.4
        m.poll(0)
        assert m.conns[fake.pid].sock is not None and m.conns[refusing.pid].state == "unreachable"
        assert tries.count(refusing.pid) == 1
        for _ in range(3):  # rescans within the second: no new try
            clock.t += monmod.RESCAN_S
            m.poll(0)
        assert tries.count(refusing.pid) == 1 and tries.count(fake.pid) == 1
        clock.t += monmod.RETRY_S
        m.poll(0)
        assert tries.count(refusing.pid) == 2 and tries.count(fake.pid) == 1
    finally:
        fake.go.set()
        m.stop()


@pytest.mark.timing
@pytest.mark.parametrize("how", ["never_accepts", "accepts_but_never_answers"])
def test_hung_job_never_hangs_the_snapshot(rtdir, fakes, how):
    """A job stopped with Ctrl-Z (SIGSTOP) or whose publisher hangs: the kernel
    accepts the connection, nothing ever comes back."""
    if how == "never_accepts":
        fake = FakeJob(rtdir, script=None, listen=False)
        fake.srv.listen(1)
    else:
        fake = FakeJob(rtdir, lambda conn, fake: fake.go.wait(10))
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        t0 = time.monotonic()
        take_snapshot(monitor=m, settle_s=0.3)
        m._last_scan = 0
        pump(m, 1.2)  # rescans do not pile up connections either
        m.build()
        took = time.monotonic() - t0
    finally:
        fake.go.set()
        m.stop()
    assert took < 4.0, f"a hung job held the monitor for {took:.1f} s"
    c = m.conns[fake.pid]
    assert c.state in ("connecting", "unreachable"), (c.state, c.reason)
    assert c.job is None and not c.frames


def test_worker_pid_vanishes_between_frames(rtdir, fakes):
    worker = subprocess.Popen(["sleep", "120"])

    def script(conn, fake):
        conn.sendall(hello(fake.pid))
        seq = 1
        while not fake.go.is_set():
            conn.sendall(window(seq, worker_pids=(worker.pid,)))
            seq += 1
            time.sleep(0.05)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = Monitor(directory=rtdir, gpu=False, host=False, diagnoser=False, procs=ProcSampler(uss_every=1))
    try:
        m.scan()
        pump(m, 3, until=lambda: len(m.conns[fake.pid].frames) >= 3)
        w = only_job(m.build(), fake.pid)["loaders"][0]["workers"][0]
        assert w["pid"] == worker.pid and w["state"] not in ("gone", "n/a"), w
        worker.kill()
        worker.wait()
        pump(m, 0.3)
        j = only_job(m.build(), fake.pid)
        w = j["loaders"][0]["workers"][0]
        assert w["state"] == "gone", w
        assert f"process {worker.pid} exited" in w["error"]
        assert w["cpu_percent"] is None and w["rss_bytes"] is None
        assert j["state"] == "live"
    finally:
        fake.go.set()
        m.stop()
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_stopped_job_is_not_live_while_stopped_and_live_again_once_resumed(rtdir, fakes):
    # ctrl-Z in the job's terminal (SIGSTOP): its frames stop, the last ones
    # freeze, and beside /proc's fresh 0 % CPU they told a false story (a
    # worker "busy 99 %" on "0 % CPU" read io-bound). Stopped is not live.
    import signal

    def script(conn, fake):
        conn.sendall(hello(fake.pid))
        seq = 1
        while not fake.go.is_set():
            conn.sendall(window(seq))
            seq += 1
            time.sleep(0.05)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = Monitor(directory=rtdir, gpu=False, host=False, diagnoser=False, procs=ProcSampler())
    try:
        m.scan()
        pump(m, 3, until=lambda: len(m.conns[fake.pid].frames) >= 3)
        assert only_job(m.build(), fake.pid)["state"] == "live"

        def state_becomes(want: str) -> dict:
            end = time.monotonic() + 5
            while True:
                pump(m, 0.2)
                j = only_job(m.build(), fake.pid)
                if j["state"] == want or time.monotonic() > end:
                    return j

        os.kill(fake.pid, signal.SIGSTOP)
        j = state_becomes("unreachable")
        assert j["state"] == "unreachable", j
        assert "stopped" in j["state_reason"] and f"kill -CONT {fake.pid}" in j["state_reason"], j
        os.kill(fake.pid, signal.SIGCONT)
        j = state_becomes("live")
        assert j["state"] == "live" and j["state_reason"] == "", j
    finally:
        os.kill(fake.pid, signal.SIGCONT)
        fake.go.set()
        m.stop()


@pytest.mark.parametrize("where", ["constructor", "every_call"])
def test_proc_unreadable(rtdir, fakes, monkeypatch, where):
    """/proc denied (hidepid=2, another user's workers): figures are n/a with a reason."""

    def script(conn, fake):
        conn.sendall(hello(fake.pid))
        seq = 1
        while not fake.go.is_set():
            conn.sendall(window(seq, worker_pids=(fake.pid,)))
            seq += 1
            time.sleep(0.05)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)

    def deny(self, *a, **k):
        raise psutil.AccessDenied(getattr(self, "pid", None))

    if where == "constructor":
        real_init = psutil.Process.__init__

        def init(self, pid=None):
            if pid == fake.pid:
                raise psutil.AccessDenied(pid)
            real_init(self, pid)

        monkeypatch.setattr(psutil.Process, "__init__", init)
    else:
        for name in (
            "create_time",
            "status",
            "cpu_times",
            "memory_info",
            "num_threads",
            "threads",
            "memory_full_info",
        ):
            monkeypatch.setattr(psutil.Process, name, deny)
    m = Monitor(directory=rtdir, gpu=False, host=False, diagnoser=False, procs=ProcSampler(uss_every=1))
    try:
        snap = take_snapshot(monitor=m, settle_s=0.3)
    finally:
        fake.go.set()
        m.stop()
    j = only_job(snap, fake.pid)
    assert j["state"] == "live"
    assert j["main_cpu_percent"] is None and j["rss_bytes"] is None
    w = j["loaders"][0]["workers"][0]
    assert w["cpu_percent"] is None and w["rss_bytes"] is None and w["uss_bytes"] is None
    assert "no permission" in (w["error"] or ""), w


# --- NVML failing ------------------------------------------------------------------------------


class _NvmlError(Exception):
    pass


class AlwaysFailingNvml:
    """A fake pynvml whose ``failing`` call raises ``exc``; others answer one GPU."""

    NVMLError = _NvmlError
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, failing: str, exc: BaseException) -> None:
        self.failing, self.exc = failing, exc

    def _maybe(self, name):
        if name == self.failing or self.failing == "*":
            raise self.exc

    def nvmlInit(self):
        self._maybe("nvmlInit")

    def nvmlShutdown(self):
        self._maybe("nvmlShutdown")

    def nvmlDeviceGetCount(self):
        self._maybe("nvmlDeviceGetCount")
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        self._maybe("nvmlDeviceGetHandleByIndex")
        return SimpleNamespace(i=i)

    def nvmlDeviceGetName(self, h):
        self._maybe("nvmlDeviceGetName")
        return b"Fake GPU"

    def nvmlDeviceGetUUID(self, h):
        self._maybe("nvmlDeviceGetUUID")
        return "GPU-fake"

    def nvmlDeviceGetUtilizationRates(self, h):
        self._maybe("nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=50, memory=10)

    def nvmlDeviceGetMemoryInfo(self, h):
        self._maybe("nvmlDeviceGetMemoryInfo")
        return SimpleNamespace(used=1 << 30, total=8 << 30, free=7 << 30)

    def nvmlDeviceGetTemperature(self, h, sensor):
        self._maybe("nvmlDeviceGetTemperature")
        return 50

    def nvmlDeviceGetPowerUsage(self, h):
        self._maybe("nvmlDeviceGetPowerUsage")
        return 100_000

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        self._maybe("nvmlDeviceGetComputeRunningProcesses")
        return []


NVML_CALLS = [
    "nvmlInit",
    "nvmlDeviceGetCount",
    "nvmlDeviceGetHandleByIndex",
    "nvmlDeviceGetName",
    "nvmlDeviceGetUUID",
    "nvmlDeviceGetUtilizationRates",
    "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetTemperature",
    "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetComputeRunningProcesses",
    "*",
]


@pytest.mark.parametrize(
    "exc",
    [_NvmlError("Unknown Error"), RuntimeError("driver went away"), OSError(5, "Input/output error")],
    ids=["NVMLError", "RuntimeError", "OSError"],
)
@pytest.mark.parametrize("call", NVML_CALLS)
def test_nvml_raising_at_any_call(rtdir, call, exc):
    m = bare_monitor(rtdir, gpu=GpuSampler(nvml=AlwaysFailingNvml(call, exc)))
    try:
        snap = m.build()
        m._last_gpu = 0.0
        snap = m.build()  # and again: retries must not raise either
    finally:
        m.stop()
    status, gpus = snap["gpu_status"], snap["gpus"]
    assert isinstance(status, str) and status
    if status == "ok":
        assert len(gpus) == 1
        # One failing field degrades that field, with the reason on the device.
        if call not in ("nvmlInit", "nvmlDeviceGetCount", "nvmlShutdown"):
            assert gpus[0]["error"], gpus
    else:
        assert status.startswith("n/a"), status
        assert gpus == []
    json.dumps(snap)  # the snapshot stays JSON-serialisable


# --- fuzzing the monitor's input path ---------------------------------------------------------


def _fresh_conn() -> JobConnection:
    c = JobConnection(os.getpid(), "/nonexistent/fuzz.sock")
    return c


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.binary(max_size=300), max_size=12))
def test_fuzz_bytes_through_decoder_and_on_message(chunks):
    c = _fresh_conn()
    for data in [hello(os.getpid()), *chunks, window(1)]:
        for msg in c.decoder.feed(data):
            c._on_message(msg)
    json.dumps(job_dict(c, 3.0, {}, time.time()), allow_nan=False)
    assert c.decoder.pending <= wire.MAX_FRAME_BYTES


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(JSON, max_size=6))
def test_fuzz_json_values_through_decoder_and_on_message(values):
    c = _fresh_conn()
    for data in [hello(os.getpid())] + [json.dumps(v).encode() + b"\n" for v in values]:
        for msg in c.decoder.feed(data):
            c._on_message(msg)
    # The model stays valid JSON for `dlwatch snapshot --json` (no NaN/Infinity).
    json.dumps(job_dict(c, 3.0, {}, time.time()), allow_nan=False)


def _window_dict(loader_extra: dict, worker_extra: dict, ints: list[int]) -> dict:
    a, b, c_, d = (ints + [0, 0, 0, 0])[:4]
    # mono_ns within about a day: far-future stamps have their own test below.
    mono = abs(b) % (86_400 * 10**9)
    return {
        "type": "window",
        "seq": a,
        "t": float(b),
        "mono_ns": mono,
        "loaders": [
            {
                "id": 1,
                "epoch": a,
                "batches": b,
                "wait_ns": c_,
                "step_ns": d,
                "num_workers": 1,
                "queue": {},
                **loader_extra,
                "workers": [{"id": 0, "pid": 1, "batches": a, "fetch_ns": c_, "busy_ns": d, **worker_extra}],
            }
        ],
    }


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.dictionaries(
                st.sampled_from(
                    ["epoch_start_ms", "epoch_ms", "active", "kind", "teardown_ns", "name", "queue"]
                ),
                JSON,
                max_size=3,
            ),
            st.dictionaries(st.sampled_from(["extra", "state", "started_ns"]), JSON, max_size=2),
            st.lists(st.integers(min_value=-(2**63), max_value=2**63), min_size=4, max_size=4),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_fuzz_schema_valid_windows_never_break_the_model(frames):
    """Windows the schema accepts, with hostile values wherever it allows them
    (counters going backwards, huge ints, odd optional fields)."""
    c = _fresh_conn()
    for data in [hello(os.getpid())] + [
        json.dumps(_window_dict(le, we, ints)).encode() + b"\n" for le, we, ints in frames
    ]:
        for msg in c.decoder.feed(data):
            c._on_message(msg)
    # The model stays valid JSON for `dlwatch snapshot --json` (no NaN/Infinity).
    json.dumps(job_dict(c, 3.0, {}, time.time()), allow_nan=False)


_HUGE_GAP = """
import json, os, time
from dlwatch import wire
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.model import job_dict
c = JobConnection(os.getpid(), "/nonexistent/x.sock")
def w(seq, mono):
    return wire.encode({"type": "window", "seq": seq, "t": time.time(), "mono_ns": mono,
        "loaders": [{"id": 1, "epoch": 1, "batches": seq, "wait_ns": 1, "step_ns": 1,
                     "num_workers": 0, "workers": [], "queue": {}}]})
hello = wire.encode({"type": "hello", "protocol": 1, "job": {"pid": os.getpid(), "cmdline": "x"}})
for data in (hello, w(1, 10**9), w(2, 11**9), w(3, 2**62)):
    for m in c.decoder.feed(data):
        c._on_message(m)
job_dict(c, 3.0, {}, time.time())
print("built")
"""


def test_one_far_future_frame_does_not_freeze_the_model():
    import sys

    try:
        r = subprocess.run([sys.executable, "-c", _HUGE_GAP], capture_output=True, text=True, timeout=5)
    except subprocess.TimeoutExpired:
        pytest.fail("job_dict() still running after 5 s on 3 frames")
    assert r.returncode == 0 and "built" in r.stdout, r.stderr


def test_listeners_hear_of_every_snapshot_and_a_failing_one_stops_nothing(rtdir):
    m = Monitor(directory=rtdir, interval=0.05, gpu=False, procs=False, host=False, diagnoser=False)
    heard = []

    def broken() -> None:
        raise RuntimeError("a view that cannot draw")

    m.subscribe(broken)
    m.subscribe(lambda: heard.append(m.latest()))
    m.start()
    try:
        deadline = time.monotonic() + 5
        while len(heard) < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        m.stop()
    assert len(heard) >= 5 and all(isinstance(s, dict) for s in heard)
    assert len({id(s) for s in heard}) == len(heard)  # a new snapshot each time
    assert any("a view that cannot draw" in e for e in m.errors)


def test_a_job_that_sends_its_history_late_is_shown_once_it_has_come(rtdir, fakes):
    """A --follow beside a loaded Lightning job: its first document held
    only the history's first frames (4 batches, 17 s old; the job had run
    29 s), the next one the rest. The first build waits for the history the
    hello announced, a bounded while, and only once per connection."""

    def script(conn, fake):
        announced = dict(json.loads(hello(fake.pid)), history=3)
        conn.sendall(wire.encode(announced) + window(1))
        time.sleep(0.6)  # a publisher thread starved of the GIL
        conn.sendall(window(2) + window(5))
        fake.go.wait(10)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = Monitor(directory=rtdir, interval=0.1, gpu=False, procs=False, host=False, diagnoser=False)
    firsts: list[dict] = []
    m.subscribe(lambda: firsts.append(m.latest()) if not firsts else None)
    m.start()
    try:
        deadline = time.monotonic() + 5
        while not firsts and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        fake.go.set()
        m.stop()
    assert firsts, "no snapshot built"
    (ld,) = only_job(firsts[0], fake.pid)["loaders"]
    assert ld["batches_total"] == 50, ld["batches_total"]  # window(5): the history's newest
    (c,) = m.conns.values()
    assert (c.history_due, c.history_got, c.caught_up_once) == (3, 3, True)


def test_a_history_that_never_comes_costs_one_bounded_wait(rtdir, fakes):
    from dlwatch.collect.monitor import CATCH_UP_S

    def script(conn, fake):
        conn.sendall(wire.encode(dict(json.loads(hello(fake.pid)), history=5)) + window(1))
        fake.go.wait(10)

    fake = FakeJob(rtdir, script)
    fakes.append(fake)
    m = bare_monitor(rtdir)
    try:
        m.scan()
        t0 = time.monotonic()
        m.catch_up()
        first = time.monotonic() - t0
        t0 = time.monotonic()
        m.catch_up()
        again = time.monotonic() - t0
        (ld,) = only_job(m.build(), fake.pid)["loaders"]
    finally:
        fake.go.set()
    assert CATCH_UP_S - 0.1 <= first <= CATCH_UP_S + 1.5 and again < 0.05, (first, again)
    assert ld["batches_total"] == 10  # what came is shown
