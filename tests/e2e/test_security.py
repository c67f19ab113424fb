"""Transport security (docs/ARCHITECTURE.md §3): a private directory, a private socket, the
peer's uid checked, no TCP, and nothing but JSON ever decoded from the wire.
"""

from __future__ import annotations

import ast
import os
import pickle
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dlwatch import wire
from dlwatch.probe.publisher import Publisher
from tests.e2e_util import JOB, Job, as_nobody, hello_and_drain, short_tmpdir

ROOT = Path(__file__).resolve().parents[2]
HELLO = wire.encode(wire.client_hello("dlwatch security tests"))
SHORT_JOB = [
    "--shuffle",
    "--seed",
    "5",
    "--size",
    "96",
    "--epochs",
    "2",
    "--sample-ms",
    "0",
    "--step-ms",
    "0",
    "--checksum",
    "--duration",
    "60",
]


def _run_job(runtime_dir: str, *args: str, disable: bool = False) -> subprocess.Popen:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    env.pop("DLWATCH_DISABLE", None)
    if disable:
        env["DLWATCH_DISABLE"] = "1"
    work = short_tmpdir("dlwsec")
    out = os.path.join(work, "out.json")
    p = subprocess.Popen(
        [sys.executable, str(JOB), "--out", out, *args],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    p.out_path, p.work = out, work
    return p


def _result(p: subprocess.Popen) -> tuple[dict, str]:
    import json

    _, err = p.communicate(timeout=90)
    assert p.returncode == 0, err[-3000:]
    with open(p.out_path) as f:
        res = json.load(f)
    shutil.rmtree(p.work, ignore_errors=True)
    return res, err


# --- the socket and its directory ---------------------------------------------------------------


def test_job_creates_a_0700_dir_and_a_0600_socket_whatever_the_umask():
    base = short_tmpdir()
    rt = os.path.join(base, "rt")  # does not exist yet: the job creates it
    env = dict(os.environ, DLWATCH_DIR=rt)
    env.pop("DLWATCH_DISABLE", None)
    work = short_tmpdir("dlwsec")
    p = subprocess.Popen(
        [
            sys.executable,
            str(JOB),
            "--out",
            os.path.join(work, "o.json"),
            "--duration",
            "4",
            "--size",
            "100000",
        ],
        env=env,
        cwd=work,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: os.umask(0),
    )  # the loosest umask possible
    try:
        path = os.path.join(rt, f"{p.pid}.sock")
        end = time.monotonic() + 60
        while not os.path.exists(path):
            assert p.poll() is None and time.monotonic() < end, "no socket"
            time.sleep(0.05)
        d, s = os.lstat(rt), os.lstat(path)
        assert stat.S_ISDIR(d.st_mode) and stat.S_IMODE(d.st_mode) == 0o700
        assert stat.S_ISSOCK(s.st_mode) and stat.S_IMODE(s.st_mode) == 0o600
        assert d.st_uid == s.st_uid == os.getuid()
        # Nothing else is created there.
        assert os.listdir(rt) == [f"{p.pid}.sock"]
        # No TCP/UDP listener in the trainer or its workers; the Unix socket is ours.
        procs = [psutil.Process(p.pid)] + psutil.Process(p.pid).children(recursive=True)
        for pr in procs:
            assert pr.net_connections(kind="inet") == [], pr.pid
        unix = [c.laddr for c in psutil.Process(p.pid).net_connections(kind="unix")]
        assert path in unix, unix
        p.wait(60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def _make_world_writable(base: str) -> str:
    d = os.path.join(base, "rt")
    os.mkdir(d)
    os.chmod(d, 0o777)
    return d


def _make_foreign(base: str) -> str:
    d = os.path.join(base, "rt")
    os.mkdir(d, 0o700)
    os.chown(d, 65534, 65534)
    return d


def _make_symlink(base: str) -> str:
    target = os.path.join(base, "real")
    os.mkdir(target, 0o700)  # a perfectly private directory, reached through a link
    d = os.path.join(base, "rt")
    os.symlink(target, d)
    return d


UNSAFE = {
    "world_writable": (_make_world_writable, "mode 0777"),
    "other_owner": (_make_foreign, "owned by uid 65534"),
    "symlink": (_make_symlink, "symlink"),
}


def test_unsafe_runtime_dirs_are_refused_and_the_job_trains_on():
    if os.getuid() != 0:
        pytest.skip("chown to another uid needs root")
    base = {k: short_tmpdir() for k in UNSAFE}
    dirs = {k: make(base[k]) for k, (make, _) in UNSAFE.items()}
    ref_dir = short_tmpdir()
    try:
        # All four side by side: the undisturbed twin (hook disabled) and the refused ones.
        ref = _run_job(ref_dir, *SHORT_JOB, disable=True)
        jobs = {k: _run_job(d, *SHORT_JOB) for k, d in dirs.items()}
        want, ref_err = _result(ref)
        assert len(want["digest"]) == 2 * 96 // 4
        for k, p in jobs.items():
            got, err = _result(p)
            assert got["digest"] == want["digest"], k
            assert got["error"] is None
            extra = [ln for ln in err.splitlines() if ln not in ref_err.splitlines()]
            assert len(extra) == 1, (k, err)
            line = extra[0]
            assert line.startswith("dlwatch: not monitoring this job"), line
            assert UNSAFE[k][1] in line, (k, line)
            # No socket anywhere: not in the refused dir, not behind the symlink.
            for root, _dirs, files in os.walk(base[k]):
                assert not [f for f in files if f.endswith(".sock")], (k, root, files)
            # The refused directory is left exactly as it was.
            st = os.lstat(dirs[k])
            if k == "world_writable":
                assert stat.S_IMODE(st.st_mode) == 0o777
            if k == "other_owner":
                assert st.st_uid == 65534
            if k == "symlink":
                assert stat.S_ISLNK(st.st_mode)
    finally:
        for d in [*base.values(), ref_dir]:
            shutil.rmtree(d, ignore_errors=True)


# --- the peer's uid --------------------------------------------------------------------------------


@pytest.fixture
def open_publisher():
    base = short_tmpdir()
    p = Publisher(directory=os.path.join(base, "rt"))
    p.open()
    p.start()
    try:
        yield p
    finally:
        p.close()
        shutil.rmtree(base, ignore_errors=True)


def test_other_uid_cannot_even_reach_the_socket(open_publisher):
    if os.getuid() != 0:
        pytest.skip("needs root to switch users")

    def attempt(s):
        try:
            s.connect(open_publisher.path)
        except PermissionError:
            return 0
        return 1

    code = as_nobody(attempt)
    if code == 77:
        pytest.skip("cannot setuid here")
    assert code == 0


def test_other_uid_is_hung_up_on_without_any_data(open_publisher):
    """Loosen the file modes for this test only: SO_PEERCRED must still refuse."""
    if os.getuid() != 0:
        pytest.skip("needs root to switch users")
    pub = open_publisher
    parent = os.path.dirname(pub.directory)
    os.chmod(parent, 0o755)
    os.chmod(pub.directory, 0o755)
    os.chmod(pub.path, 0o666)
    try:

        def attempt(s):
            try:
                s.connect(pub.path)
            except OSError:
                return 3  # set-up failed: the loosened modes did not let us in
            data = hello_and_drain(s, HELLO)
            if data is None:
                return 4  # neither data nor a hang-up
            return 0 if data == b"" else 1

        code = as_nobody(attempt)
        if code == 77:
            pytest.skip("cannot setuid here")
        assert code == 0, {
            1: "the server sent data to another uid",
            3: "could not connect",
            4: "the server neither answered nor hung up",
        }.get(code, code)
        time.sleep(0.2)
        assert pub.clients == 0
        # Our own uid still gets served on the same socket.
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(3)
        s.connect(pub.path)
        s.sendall(HELLO)
        first = s.recv(4096)
        s.close()
        assert first.startswith(b'{"type":"hello"')
    finally:
        os.chmod(parent, 0o700)
        os.chmod(pub.directory, 0o700)
        os.chmod(pub.path, 0o600)


# --- nothing but JSON from the wire --------------------------------------------------------------

WIRE_MODULES = ["dlwatch/wire.py", "dlwatch/probe/publisher.py", "dlwatch/collect/jobs.py"]
BANNED_MODULES = {
    "pickle",
    "cPickle",
    "_pickle",
    "marshal",
    "shelve",
    "dill",
    "cloudpickle",
    "yaml",
    "importlib",
    "runpy",
    "code",
    "codeop",
}
BANNED_CALLS = {"eval", "exec", "compile", "__import__", "execfile", "input"}


@pytest.mark.parametrize("rel", WIRE_MODULES)
def test_wire_path_never_unpickles_or_evaluates(rel):
    src = (ROOT / rel).read_text()
    tree = ast.parse(src)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in BANNED_MODULES:
                    problems.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            if (node.module or "").split(".")[0] in BANNED_MODULES:
                problems.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Name) and node.id in BANNED_CALLS | BANNED_MODULES:
            problems.append(f"line {node.lineno}: name {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in BANNED_CALLS | {"loads", "load"}:
            # The only decoder allowed is json's.
            base = node.value
            if not (isinstance(base, ast.Name) and base.id == "json" and node.attr in ("loads",)):
                problems.append(f"line {node.lineno}: .{node.attr}")
    assert not problems, f"{rel}: {problems}"
    # And the plain-text grep for them, outside comments and docstrings.
    code_tokens = _code_words(src)
    for word in ("pickle", "eval", "exec", "marshal"):
        assert word not in code_tokens, f"{rel} uses {word}"


def _code_words(src: str) -> set[str]:
    import io
    import tokenize

    words = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.NAME:
            words.add(tok.string)
    return words


def test_a_pickle_on_the_wire_is_just_a_malformed_frame(open_publisher, tmp_path):
    canary = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {canary}",))

    payload = pickle.dumps(Evil(), protocol=0)  # protocol 0: newline-terminated text
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(3)
    s.connect(open_publisher.path)
    s.sendall(payload.replace(b"\n", b" ") + b"\n")
    data = b""
    while True:
        try:
            chunk = s.recv(4096)
        except ConnectionResetError:
            break
        if not chunk:
            break
        data += chunk
    s.close()
    msgs = wire.FrameDecoder().feed(data)
    assert len(msgs) == 1 and msgs[0]["type"] == "error", msgs
    assert "malformed" in msgs[0]["message"]
    time.sleep(0.2)
    assert not canary.exists()


def test_no_tcp_listener_in_a_monitored_job_with_a_client_attached():
    job = Job("--duration", "3", "--size", "100000")
    try:
        job.wait_ready(0.3)
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(job.socket)
        s.sendall(HELLO)
        assert s.recv(100).startswith(b'{"type":"hello"')
        pr = psutil.Process(job.proc.pid)
        for p in [pr] + pr.children(recursive=True):
            assert p.net_connections(kind="inet") == [], p
        s.close()
        job.finish()
    finally:
        job.cleanup()


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.binary(max_size=600)
        | st.sampled_from(
            [
                HELLO,
                b"\n",
                b'{"type":"hello","protocol":99}\n',
                b'{"type":"hello","protocol":1,"history_frames":-5}\n',
                b'{"type":"hello","protocol":1,"history_frames":1e309}\n',
                b'{"type":"hello","protocol":true}\n',
                b'{"type":"error","message":"x"}\n',
            ]
        ),
        max_size=10,
    )
)
def test_hostile_client_bytes_never_raise_in_the_publisher(chunks):
    """The publisher's per-client input path, fed directly (no thread, no socket file)."""
    import selectors

    from dlwatch.probe.publisher import _Client

    pub = Publisher(directory="/nonexistent")
    pub._hello = wire.encode({"type": "hello", "protocol": 1, "job": {"pid": os.getpid(), "cmdline": "x"}})
    pub._history.extend(
        wire.encode({"type": "window", "seq": i, "t": 0.0, "mono_ns": i, "loaders": []}) for i in range(5)
    )
    pub._sel = selectors.DefaultSelector()
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    a.setblocking(False)
    c = _Client(a)
    pub._clients[a.fileno()] = c
    pub._sel.register(a, selectors.EVENT_READ, c)
    try:
        for data in chunks:
            if c.closing or a.fileno() < 0:
                break
            for msg in c.decoder.feed(data):
                pub._on_message(c, msg)
                if c.closing:
                    break
        assert c.decoder.pending <= wire.MAX_CLIENT_FRAME_BYTES
        assert len(c.out) <= 8 << 20
    finally:
        a.close()
        b.close()
        pub._sel.close()
