"""The in-job publisher: a real Publisher thread on a real Unix socket.

Every test binds in a short directory under /tmp (sun_path is 107 bytes) and
talks to the server with plain sockets, the way any monitor would.
"""

from __future__ import annotations

import errno
import os
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from dlwatch import wire
from dlwatch.collect.jobs import JobConnection
from dlwatch.probe import publisher as pubmod
from dlwatch.probe.publisher import Publisher
from tests.e2e_util import as_nobody, hello_and_drain

HELLO = wire.encode(wire.client_hello("dlwatch tests"))


@pytest.fixture
def pub(short_tmpdir):
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()
    p.start()
    try:
        yield p
    finally:
        p.close()


class Client:
    """A minimal monitor-side client with a validating decoder."""

    def __init__(self, path: str, hello: bytes | None = HELLO, timeout: float = 5.0) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)  # blocking: waits out a full listen backlog
        self.sock.settimeout(timeout)
        self.dec = wire.FrameDecoder()
        self.queue: list = []
        self.eof = False
        if hello is not None:
            self.sock.sendall(hello)

    def _fill(self, deadline: float) -> bool:
        """Read once (until deadline); False on timeout or EOF."""
        if self.eof:
            return False
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        r, _, _ = select.select([self.sock], [], [], left)
        if not r:
            return False
        try:
            data = self.sock.recv(1 << 16)
        except ConnectionResetError:
            data = b""
        if not data:
            self.eof = True
            return False
        self.queue += self.dec.feed(data)
        return True

    def recv(self, timeout: float = 3.0):
        """Next message, or None on EOF / timeout."""
        deadline = time.monotonic() + timeout
        while not self.queue:
            if not self._fill(deadline):
                return None
        m = self.queue.pop(0)
        assert not isinstance(m, wire.WireError), m
        return m

    def collect(self, duration: float) -> list:
        """Every message that arrives within ``duration`` seconds."""
        deadline = time.monotonic() + duration
        while self._fill(deadline):
            pass
        out, self.queue = self.queue, []
        assert not any(isinstance(m, wire.WireError) for m in out)
        return out

    def until_eof(self, timeout: float = 3.0) -> list:
        deadline = time.monotonic() + timeout
        while self._fill(deadline):
            pass
        assert self.eof, "server did not hang up"
        out, self.queue = self.queue, []
        return out

    def close(self) -> None:
        self.sock.close()


def wait_for(cond, timeout: float, step: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def expect_server_hello(c: Client) -> dict:
    h = c.recv()
    assert h is not None, "no hello from the server"
    assert h["type"] == "hello" and "job" in h
    assert h["protocol"] == wire.PROTOCOL_VERSION
    assert h["job"]["pid"] == os.getpid()
    return h


# --- socket file ---------------------------------------------------------------------


def test_socket_file_is_private(pub):
    st = os.lstat(pub.path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(pub.directory).st_mode) == 0o700
    assert pub.path == os.path.join(pub.directory, f"{os.getpid()}.sock")


def test_stale_file_at_our_path_is_replaced(short_tmpdir):
    d = os.path.join(short_tmpdir, "rt")
    os.mkdir(d, 0o700)
    stale = os.path.join(d, f"{os.getpid()}.sock")
    with open(stale, "w") as f:
        f.write("stale")
    p = Publisher(directory=d)
    p.open()
    p.start()
    try:
        assert stat.S_ISSOCK(os.lstat(stale).st_mode)
        c = Client(p.path)
        expect_server_hello(c)
        c.close()
    finally:
        p.close()


def test_open_refuses_an_unsafe_directory(short_tmpdir):
    d = os.path.join(short_tmpdir, "rt")
    os.mkdir(d)
    os.chmod(d, 0o777)
    p = Publisher(directory=d)
    with pytest.raises(OSError, match="0777"):
        p.open()
    assert os.listdir(d) == []


# --- conversation ------------------------------------------------------------------------


@pytest.mark.timing
def test_hello_then_windows_at_ten_per_second(pub):
    c = Client(pub.path, hello=wire.encode({**wire.client_hello("t"), "history_frames": 0}))
    try:
        h = expect_server_hello(c)
        assert isinstance(h["job"]["cmdline"], str)
        first = c.recv()
        assert first["type"] == "window"
        frames = c.collect(1.0)
        assert 7 <= len(frames) <= 13, len(frames)
        seqs = [first["seq"]] + [f["seq"] for f in frames]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
        monos = [first["mono_ns"]] + [f["mono_ns"] for f in frames]
        gaps = [(b - a) / 1e6 for a, b in zip(monos, monos[1:])]
        assert all(30 < g < 400 for g in gaps), gaps
        for f in frames:
            assert f["type"] == "window" and isinstance(f["loaders"], list)
            wire.validate(f)
    finally:
        c.close()


def _freeze(monkeypatch, pub) -> int:
    """Stop new frames (the thread keeps serving); return how many were built."""
    monkeypatch.setattr(pub, "_tick", lambda: None)
    time.sleep(0.15)  # let a tick that was already running finish
    return pub.frames_built


@pytest.mark.timing
def test_history_on_attach(pub, monkeypatch):
    time.sleep(1.0)
    n = _freeze(monkeypatch, pub)
    assert n >= 8
    c = Client(pub.path)
    try:
        expect_server_hello(c)
        t0 = time.monotonic()
        first = c.recv(timeout=0.2)
        assert first is not None and time.monotonic() - t0 < 0.1  # immediately
        history = [first] + c.collect(0.3)
        assert [f["type"] for f in history] == ["window"] * n
        assert [f["seq"] for f in history] == list(range(1, n + 1))  # oldest first
        monos = [f["mono_ns"] for f in history]
        assert monos == sorted(set(monos))
        # Live frames resume after the history, without a gap.
        monkeypatch.undo()
        live = c.collect(0.35)
        assert live and [f["seq"] for f in live] == list(range(n + 1, n + 1 + len(live)))
    finally:
        c.close()


@pytest.mark.parametrize("want", [0, 3])
def test_history_frames_in_the_hello_limits_the_replay(pub, monkeypatch, want):
    time.sleep(0.8)
    n = _freeze(monkeypatch, pub)
    c = Client(pub.path, hello=wire.encode({**wire.client_hello("t"), "history_frames": want}))
    try:
        expect_server_hello(c)
        frames = c.collect(0.3)
        assert [f["seq"] for f in frames] == list(range(n - want + 1, n + 1))
    finally:
        c.close()


@pytest.mark.timing
def test_a_client_may_ask_for_every_nth_frame(pub, monkeypatch):
    """Replay and live frames alike are those whose seq is a multiple of N,
    so a client's stream has no hole and no double at the seam."""
    time.sleep(1.0)
    c = Client(pub.path, hello=wire.encode(wire.client_hello("t", every=3)))
    plain = Client(pub.path)
    try:
        expect_server_hello(c)
        expect_server_hello(plain)
        frames = [m for m in c.collect(1.0) if m["type"] == "window"]
        seqs = [f["seq"] for f in frames]
        assert len(seqs) >= 6 and all(q % 3 == 0 for q in seqs), seqs
        assert seqs == list(range(seqs[0], seqs[-1] + 1, 3)), seqs
        every = [m["seq"] for m in plain.collect(0.5) if m["type"] == "window"]
        assert every == list(range(every[0], every[-1] + 1))  # others still get them all
    finally:
        c.close()
        plain.close()


@pytest.mark.timing
@pytest.mark.parametrize("every", [0, -2, pubmod.MAX_EVERY + 1])
def test_a_nonsense_frame_pace_is_ignored(pub, every):
    time.sleep(0.4)
    c = Client(pub.path, hello=wire.encode({**wire.client_hello("t"), "every": every}))
    try:
        expect_server_hello(c)
        seqs = [m["seq"] for m in c.collect(0.6) if m["type"] == "window"]
        assert seqs == list(range(seqs[0], seqs[-1] + 1)) and len(seqs) >= 5
    finally:
        c.close()


def test_server_hello_announces_history_count(pub):
    time.sleep(0.5)
    c = Client(pub.path)
    try:
        h = expect_server_hello(c)
        assert isinstance(h.get("history"), int) and h["history"] >= 3
        # Everything the job sends is declared in the wire's schema.
        frames = c.collect(0.3)
        assert frames and [f for m in [h, *frames] for f in wire.undeclared(m)] == []
    finally:
        c.close()


# --- bad clients -------------------------------------------------------------------------


def error_then_eof(c: Client) -> str:
    msgs = c.until_eof()
    assert len(msgs) == 1, msgs
    m = msgs[0]
    assert not isinstance(m, wire.WireError), m
    assert m["type"] == "error"
    return m["message"]


def test_wrong_protocol_version(pub):
    c = Client(pub.path, hello=wire.encode({"type": "hello", "protocol": 999}))
    try:
        msg = error_then_eof(c)
        assert "protocol" in msg and "999" in msg
    finally:
        c.close()
    assert wait_for(lambda: pub.clients == 0, 2)


@pytest.mark.parametrize(
    "payload,fragment",
    [
        (b"\x00\xff\xfe garbage \x01\n", "malformed"),
        (b"{oops\n", "malformed"),
        (b"[1,2,3]\n", "JSON object"),
        (b'{"type":"hello","protocol":true}\n', "wrong type"),
        # Its optional fields are typed too (a value out of range is ignored).
        (b'{"type":"hello","protocol":1,"every":"2"}\n', "hello.every has the wrong type"),
        (b'{"type":"hello","protocol":1,"history_frames":2.0}\n', "hello.history_frames has the wrong type"),
        (b'{"type":"error","message":"hi"}\n', "expected a client hello"),
        (
            wire.encode({"type": "hello", "protocol": 1, "job": {"pid": 1, "cmdline": "x"}}),
            "expected a client hello",
        ),
    ],
)
def test_garbage_gets_an_error_and_eof(pub, payload, fragment):
    c = Client(pub.path, hello=payload)
    try:
        assert fragment in error_then_eof(c)
    finally:
        c.close()
    assert wait_for(lambda: pub.clients == 0, 2)


@pytest.mark.parametrize(
    "payload",
    [
        b"x" * 5000,  # no newline at all
        wire.encode({**wire.client_hello("t"), "pad": "p" * 5000}),  # a valid hello, too long
    ],
)
def test_oversized_client_frame(pub, payload):
    c = Client(pub.path, hello=payload)
    try:
        assert "exceeds the 4096-byte limit" in error_then_eof(c)
    finally:
        c.close()


@pytest.mark.timing
def test_client_without_hello_is_disconnected(pub, monkeypatch):
    monkeypatch.setattr(pubmod, "HELLO_TIMEOUT_S", 0.5)
    good = Client(pub.path)
    t0 = time.monotonic()
    silent = Client(pub.path, hello=None)
    try:
        expect_server_hello(good)
        msg = error_then_eof(silent)
        elapsed = time.monotonic() - t0
        assert "no hello" in msg
        assert 0.45 <= elapsed <= 2.0, elapsed
        # The greeted client is not subject to the hello timeout.
        assert len([m for m in good.collect(0.5) if m["type"] == "window"]) >= 3
        assert pub.clients == 1
    finally:
        good.close()
        silent.close()


def _pad_frames(monkeypatch, pub, size: int) -> None:
    orig = pub.build_frame

    def padded():
        f = orig()
        f["pad"] = "p" * size
        return f

    monkeypatch.setattr(pub, "build_frame", padded)


@pytest.mark.timing
def test_stalled_client_is_dropped_others_keep_full_rate(pub, monkeypatch):
    monkeypatch.setattr(pubmod, "MAX_CLIENT_BACKLOG", 64 << 10)
    no_history = wire.encode({**wire.client_hello("t"), "history_frames": 0})
    good = Client(pub.path, hello=no_history)
    stalled = Client(pub.path, hello=no_history)
    expect_server_hello(good)
    assert wait_for(lambda: pub.clients == 2, 2)
    # 32 KB frames: the stalled client's socket buffer fills within ~1 s.
    _pad_frames(monkeypatch, pub, 32_000)

    got = []
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            for m in good.collect(0.1):
                got.append((time.monotonic(), m))

    th = threading.Thread(target=reader, daemon=True)
    th.start()
    try:
        assert wait_for(lambda: pub.clients_dropped >= 1, 8), "stalled client never dropped"
        t_drop = time.monotonic()
        assert pub.clients == 1
        time.sleep(1.0)
        stop.set()
        th.join(5)
        windows = [(t, m) for t, m in got if m["type"] == "window"]
        seqs = [m["seq"] for _, m in windows]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), "the good client lost frames"
        after = [m for t, m in windows if t_drop <= t < t_drop + 1.0]
        assert 7 <= len(after) <= 13, len(after)
        # The stalled client was hung up on; what it can still read is bounded.
        total = 0
        stalled.sock.settimeout(2.0)
        while True:
            try:
                data = stalled.sock.recv(1 << 16)
            except ConnectionResetError:
                break
            if not data:
                break
            total += len(data)
        assert total < 2 << 20, total
    finally:
        stop.set()
        good.close()
        stalled.close()
    assert pub.clients_dropped == 1


@pytest.mark.timing  # reads 640 KB/s against a 64 KB backlog: a starved reader is dropped, rightly
def test_reading_client_attaching_to_a_large_history_is_not_dropped(pub, monkeypatch):
    monkeypatch.setattr(pubmod, "MAX_CLIENT_BACKLOG", 64 << 10)
    _pad_frames(monkeypatch, pub, 64_000)
    time.sleep(1.5)  # ~15 frames of 64 KB: ~1 MB of history
    c = Client(pub.path)
    try:
        expect_server_hello(c)
        msgs = c.collect(1.0)
        assert not c.eof, f"dropped after {len(msgs)} frames"
        assert pub.clients_dropped == 0
    finally:
        c.close()


@pytest.mark.timing
def test_connect_disconnect_churn(pub):
    for i in range(200):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(pub.path)
        try:
            if i % 3 == 1:
                s.sendall(HELLO)
            elif i % 3 == 2:
                s.sendall(HELLO[:5])
        except OSError:
            pass  # over MAX_CLIENTS for a moment: the server hung up first
        s.close()
    assert wait_for(lambda: pub.clients == 0, 3), pub.clients
    assert pub._thread.is_alive()
    c = Client(pub.path, hello=wire.encode({**wire.client_hello("t"), "history_frames": 0}))
    try:
        expect_server_hello(c)
        frames = c.collect(1.0)
        assert 7 <= len(frames) <= 13, len(frames)
    finally:
        c.close()
    assert wait_for(lambda: pub.clients == 0, 2)


def test_max_clients(pub):
    clients = [Client(pub.path) for _ in range(pubmod.MAX_CLIENTS)]
    try:
        for c in clients:
            expect_server_hello(c)
        extra = Client(pub.path, hello=None)
        try:
            extra.sock.sendall(HELLO)
        except OSError:
            pass  # already hung up on
        assert extra.until_eof() == []  # refused: hung up without a word
        extra.close()
    finally:
        for c in clients:
            c.close()
    assert wait_for(lambda: pub.clients == 0, 2)


# --- lifecycle ---------------------------------------------------------------------------


def test_close_removes_the_socket_and_ends_connections(short_tmpdir):
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()
    p.start()
    c = Client(p.path)
    expect_server_hello(c)
    path = p.path
    p.close()
    assert not os.path.lexists(path)
    assert not p._thread.is_alive()
    c.until_eof()
    c.close()
    with pytest.raises(OSError) as e:
        Client(path)
    assert e.value.errno in (errno.ENOENT, errno.ECONNREFUSED)


def test_a_monitor_that_connects_as_the_job_exits_gets_the_hello_and_the_last_frame(short_tmpdir):
    """The job exits before its thread has read a new monitor's hello (a
    worker died a moment after the monitor connected): the exit still greets
    it and sends the last frame, which carries what ended the job."""
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()
    p.start()
    p._stop.set()  # the thread ends, as the interpreter's exit stops it
    p._thread.join(5.0)
    assert not p._thread.is_alive()
    c = Client(p.path)  # connected and said hello; nobody has read it yet
    p.close()
    got = c.until_eof()
    c.close()
    assert [m["type"] for m in got][:1] == ["hello"] and got[0]["job"]["pid"] == os.getpid()
    assert got[-1]["type"] == "window", got


def test_close_leaves_a_file_that_is_not_ours(short_tmpdir):
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()
    p.start()
    path = p.path
    # Past the first rebind check (at the first tick); the next is 2 s away.
    assert wait_for(lambda: p.frames_built >= 2, 2)
    os.unlink(path)
    with open(path, "w") as f:
        f.write("someone else's")
    p.close()
    with open(path) as f:
        assert f.read() == "someone else's"


def test_a_thread_that_outlives_close_never_binds_again(short_tmpdir):
    # close() waits 1 s at most for the thread; one that is still running
    # (a loaded box) reaches its rebind check with the socket unlinked and
    # its directory removed, as a test runner removes it: it must not
    # recreate either.
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()  # no thread: its rebind check is called by hand below
    p.close()
    shutil.rmtree(p.directory)
    p._check_socket_file()
    assert not os.path.exists(p.directory)


def _wait_for_socket(path: str, timeout: float) -> bool:
    def ok():
        try:
            return stat.S_ISSOCK(os.lstat(path).st_mode)
        except OSError:
            return False

    return wait_for(ok, timeout)


@pytest.mark.timing
def test_deleted_socket_is_rebound(pub):
    old = Client(pub.path, hello=wire.encode({**wire.client_hello("t"), "history_frames": 0}))
    expect_server_hello(old)
    os.unlink(pub.path)
    t0 = time.monotonic()
    assert _wait_for_socket(pub.path, pubmod.REBIND_CHECK_S + 1.5), "socket not re-created"
    assert time.monotonic() - t0 <= pubmod.REBIND_CHECK_S + 1.0
    assert stat.S_IMODE(os.lstat(pub.path).st_mode) == 0o600
    try:
        c = Client(pub.path)
        expect_server_hello(c)
        assert any(m["type"] == "window" for m in c.collect(0.3))
        c.close()
        # A client connected before the rebind keeps its stream.
        assert len(old.collect(0.5)) >= 3
    finally:
        old.close()


def test_deleted_runtime_directory_is_recreated(pub):
    # Gone at once (renamed away, then removed): removed file by file, the
    # publisher could rebind its socket between the last file and the
    # directory, and rmtree then failed with "Directory not empty".
    gone = pub.directory + ".gone"
    os.rename(pub.directory, gone)
    shutil.rmtree(gone)
    assert _wait_for_socket(pub.path, pubmod.REBIND_CHECK_S + 1.5)
    assert stat.S_IMODE(os.lstat(pub.directory).st_mode) == 0o700
    c = Client(pub.path)
    try:
        expect_server_hello(c)
    finally:
        c.close()


def test_job_connection_against_a_live_publisher(short_tmpdir):
    p = Publisher(directory=os.path.join(short_tmpdir, "rt"))
    p.open()
    p.start()
    jc = JobConnection(os.getpid(), p.path)
    try:
        time.sleep(0.3)
        assert jc.connect()
        assert jc.state == "connecting"

        def pump():
            select.select([jc.sock], [], [], 0.05)
            jc.read()
            return jc.state == "live" and len(jc.frames) >= 5

        assert wait_for(pump, 3, step=0), (jc.state, jc.reason, len(jc.frames))
        assert jc.job["pid"] == os.getpid()
        assert jc.bad_frames == 0, jc.last_error
        monos = [f["mono_ns"] for f in jc.frames]
        assert monos == sorted(set(monos))
        p.close()

        def ended():
            if jc.sock is not None:
                select.select([jc.sock], [], [], 0.05)
                jc.read()
            return jc.state not in ("live", "connecting")

        assert wait_for(ended, 3, step=0)
        assert jc.state == "unreachable"  # our pid is alive
        assert "closed" in jc.reason
        assert jc.sock is None
        # Reconnecting to a closed publisher: still unreachable, with the reason.
        assert not jc.connect()
        assert jc.state == "unreachable" and "cannot connect" in jc.reason
    finally:
        jc.close()
        p.close()


def test_job_connection_to_an_exited_process(short_tmpdir):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    path = os.path.join(short_tmpdir, f"{child.pid}.sock")
    open(path, "w").close()
    jc = JobConnection(child.pid, path)
    assert not jc.connect()
    assert jc.state == "exited"
    assert not os.path.exists(path)  # a dead job's leftover is cleaned up


# --- peer credentials --------------------------------------------------------------------


def test_peer_allowed_for_our_own_uid():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        assert Publisher._peer_allowed(a) is True
        assert Publisher._peer_allowed(b) is True
    finally:
        a.close()
        b.close()


def test_other_user_cannot_connect(pub):
    if os.getuid() != 0:
        pytest.skip("needs root to switch users")

    def attempt(s):
        try:
            s.connect(pub.path)
        except PermissionError:
            return 0
        except OSError:
            return 2
        return 1  # connected: the private directory did not protect us

    code = as_nobody(attempt)
    if code == 77:
        pytest.skip("cannot setuid here")
    assert code == 0, code


def test_other_user_is_hung_up_on_even_with_loose_file_modes(pub):
    """Defence in depth: SO_PEERCRED is checked on accept."""
    if os.getuid() != 0:
        pytest.skip("needs root to switch users")
    parent = os.path.dirname(pub.directory)
    os.chmod(parent, 0o711)
    os.chmod(pub.directory, 0o711)
    os.chmod(pub.path, 0o666)
    try:

        def attempt(s):
            try:
                s.connect(pub.path)
            except OSError:
                return 3  # could not even connect: test set-up failed
            data = hello_and_drain(s, HELLO)
            if data is None:
                return 4  # neither data nor a hang-up
            return 1 if b"hello" in data or b"window" in data else 0

        code = as_nobody(attempt)
        if code == 77:
            pytest.skip("cannot setuid here")
        assert code == 0, code
        # The same path works for us.
        c = Client(pub.path)
        expect_server_hello(c)
        c.close()
    finally:
        os.chmod(parent, 0o700)
        os.chmod(pub.directory, 0o700)
        os.chmod(pub.path, 0o600)


# --- never harm the job ------------------------------------------------------------------

_SIGPIPE_JOB = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # as many CLI-style scripts do
    from dlwatch.probe.publisher import Publisher
    p = Publisher(directory=sys.argv[1]); p.open(); p.start()
    print(p.path, flush=True)
    time.sleep(1.5)
    p.close()
    print("trained", flush=True)
""")


def test_monitor_hanging_up_never_kills_the_job(short_tmpdir):
    job = subprocess.Popen(
        [sys.executable, "-c", _SIGPIPE_JOB, os.path.join(short_tmpdir, "rt")],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        path = job.stdout.readline().strip()
        assert path
        for _ in range(5):
            try:
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(path)
                s.sendall(HELLO)
                s.close()  # hang up before reading the hello
            except OSError:
                break
            time.sleep(0.05)
        rc = job.wait(10)
        assert rc == 0, f"job died with {signal.Signals(-rc).name if rc < 0 else rc}"
        assert job.stdout.read().strip() == "trained"
    finally:
        if job.poll() is None:
            job.kill()
            job.wait()
