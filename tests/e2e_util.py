"""Running real instrumented jobs and the real CLI for end-to-end tests."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Jobs are killed with their resource tracker last (it unlinks their
# loaders' semaphores): as `dlwatch demo` and `tune` stop theirs.
from dlwatch.collect import process_group

HERE = Path(__file__).resolve().parent
JOB = HERE / "jobs" / "timed_job.py"


# Every directory short_tmpdir made in this process: removed when the test
# session ends (conftest.py), whether or not its test cleaned up (a suite run
# left ~130 behind in /tmp).
MADE_DIRS: list[str] = []


def short_tmpdir(prefix: str = "dlw") -> str:
    # Unix socket paths are limited to 107 bytes: pytest's tmp_path is too long.
    d = tempfile.mkdtemp(prefix=prefix, dir="/tmp")
    os.chmod(d, 0o700)
    MADE_DIRS.append(d)
    return d


# A job's own process group, so Job.kill() reaches its DataLoader workers: a
# spawn worker whose job dies before the worker reads its parent's pid never
# sees it die (torch's watchdog then watches pid 1), and stayed idle for the
# rest of the suite. Not a new session: with the kernel's autogroup
# scheduling a session is its own CPU share, so a job in one of its own
# weighs as much as a whole test process tree beside it (the one fresh-clone
# run that did so, test_record's 95 s job missed its hint in the recording).
OWN_PROCESS_GROUP: dict = {"process_group": 0} if sys.version_info >= (3, 11) else {"preexec_fn": os.setpgrp}


class Job:
    """A timed_job.py subprocess with its own runtime dir."""

    def __init__(
        self, *args: str, runtime_dir: str | None = None, env: dict | None = None, disable: bool = False
    ) -> None:
        self.dir = runtime_dir or short_tmpdir()
        self.workdir = short_tmpdir("dlwout")
        self.out = os.path.join(self.workdir, "out.json")
        self.trace_dir = os.path.join(self.workdir, "trace")
        self.stop_file = os.path.join(self.workdir, "stop")
        os.mkdir(self.trace_dir)
        e = dict(os.environ)
        e["DLWATCH_DIR"] = self.dir
        e.pop("DLWATCH_DISABLE", None)
        if disable:
            e["DLWATCH_DISABLE"] = "1"
        e.update(env or {})
        self.env = e
        self.proc = subprocess.Popen(
            [sys.executable, str(JOB), "--out", self.out, "--trace-dir", self.trace_dir]
            + ["--stop-file", self.stop_file, *args],
            env=e,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=self.workdir,
            **OWN_PROCESS_GROUP,
        )

    @property
    def socket(self) -> str:
        return os.path.join(self.dir, f"{self.proc.pid}.sock")

    def wait_socket(self, timeout: float = 30.0) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if os.path.exists(self.socket):
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited early: {self.proc.stderr.read().decode()[-2000:]}")
            time.sleep(0.05)
        raise AssertionError("job socket never appeared")

    def wait_ready(self, settle: float, timeout: float = 60.0) -> None:
        """Wait for the first batch, then ``settle`` seconds of steady state."""
        self.wait_socket(timeout)
        end = time.monotonic() + timeout
        while not os.path.exists(self.out + ".ready"):
            if self.proc.poll() is not None:
                raise AssertionError(f"job exited early: {self.proc.stderr.read().decode()[-2000:]}")
            if time.monotonic() > end:
                raise AssertionError("job never produced a batch")
            time.sleep(0.05)
        time.sleep(settle)

    def stop(self) -> None:
        """End the run after its current batch (no need to train to --duration)."""
        open(self.stop_file, "w").close()

    def finish(self, timeout: float = 60.0) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            # Slow or hung: what each process of the job was doing says which
            # (fresh-clone run 36: a spawn job past 60 s, with nothing to read).
            where = stacks_of_tree(self.proc.pid)
            self.kill()
            out, err = self.proc.communicate()
            raise AssertionError(
                f"the job did not end within {timeout:.0f} s; its stderr ends: "
                f"{err.decode()[-2000:]}\nits processes then:\n{where}"
            ) from None
        self.stdout, self.stderr = out.decode(), err.decode()
        assert self.proc.returncode == 0, self.stderr[-3000:]
        with open(self.out) as f:
            result = json.load(f)
        result["traces"] = {}
        for name in os.listdir(self.trace_dir):
            with open(os.path.join(self.trace_dir, name)) as f:
                # "t0 t1": a sample's span; "c t": the end of a batch's collate
                spans = [tuple(int(v) for v in line.split() if v != "c") for line in f if line.strip()]
            result["traces"][int(name.split(".")[0])] = spans
        return result

    def kill(self) -> None:
        process_group.kill(self.proc.pid)
        self.proc.wait()

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.workdir, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)


def stacks_of_tree(pid: int, timeout: float = 20.0) -> str:
    """``py-spy dump`` of a process and its descendants (a test's evidence
    for a job that did not end: each process's Python stack, or why not)."""
    import psutil

    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error as e:
        return f"(process {pid}: {e})"
    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    out = []
    for p in procs:
        try:
            r = subprocess.run(
                [spy, "dump", "--pid", str(p.pid)], capture_output=True, text=True, timeout=timeout
            )
            text = (r.stdout or r.stderr)[-3000:]
        except (OSError, subprocess.TimeoutExpired) as e:
            text = f"py-spy: {e}"
        out.append(f"--- {p.pid}:\n{text}")
    return "\n".join(out)


def stop_sessions(procs: list, grace: float = 10.0) -> None:
    """SIGTERM each job (started with ``start_new_session=True``), wait up to
    ``grace`` seconds for all of them, then SIGKILL whatever is left in their
    sessions (DataLoader workers included)."""
    for p in procs:
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        process_group.kill(p.pid)
        if p.poll() is None:
            p.wait()


def dlwatch(*args: str, runtime_dir: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, DLWATCH_DIR=runtime_dir)
    return subprocess.run(
        [sys.executable, "-m", "dlwatch", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def snapshot_json(runtime_dir: str, *extra: str) -> dict:
    r = dlwatch("snapshot", "--json", *extra, runtime_dir=runtime_dir)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def snapshots_json(runtime_dirs: dict, *extra: str, timeout: float = 60.0) -> dict:
    """``dlwatch snapshot --json`` of each runtime dir, taken at the same time:
    each snapshot watches its jobs from scratch until they are judged, so
    one after the other they would take that warm-up once each."""
    procs = {
        key: subprocess.Popen(
            [sys.executable, "-m", "dlwatch", "snapshot", "--json", *extra],
            env=dict(os.environ, DLWATCH_DIR=d),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key, d in runtime_dirs.items()
    }
    out = {}
    try:
        for key, p in procs.items():
            stdout, stderr = p.communicate(timeout=timeout)
            assert p.returncode == 0, (key, stderr)
            out[key] = json.loads(stdout)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def overlap(a: int, b: int, s: int, e: int) -> int:
    return max(0, min(b, e) - max(a, s))


def truth_in_window(batches: list, start: int, end: int) -> dict:
    """What the loop measured itself over [start, end] (its own monotonic ns)."""
    wait = step = 0
    count = 0
    prev = None
    for epoch, t0, t1 in batches:
        wait += overlap(t0, t1, start, end)
        if prev is not None and prev[0] == epoch:
            step += overlap(prev[2], t0, start, end)
        if start < t1 <= end:
            count += 1
        prev = (epoch, t0, t1)
    total = wait + step
    return {
        "data_wait_fraction": wait / total if total else None,
        "batches_per_s": count / ((end - start) / 1e9),
    }


def worker_truth(spans: list, start: int, end: int, batch_size: int) -> dict:
    """A worker's own measure over the window: its batches (a worker fetches
    a batch's samples one after another, then collates them), the busy
    fraction as the batches' overlap with the window, and the mean batch time
    of the batches that ended inside it. A batch runs from its first sample's
    start to the end of its collate where the trace logs that (1-tuples),
    else to its last sample's end (``batch_size`` samples a batch)."""
    if any(len(s) == 1 for s in spans):
        batches, first = [], None
        for s in spans:
            if len(s) == 2:
                first = s[0] if first is None else first
            elif first is not None:
                batches.append((first, s[0]))
                first = None
    else:
        batches = [
            (spans[i][0], spans[i + batch_size - 1][1])
            for i in range(0, len(spans) - batch_size + 1, batch_size)
        ]
    busy = sum(overlap(a, b, start, end) for a, b in batches) / (end - start)
    inside = [b - a for a, b in batches if start < b <= end]
    return {"busy_fraction": busy, "fetch_ms": sum(inside) / len(inside) / 1e6 if inside else None}


def as_nobody(fn) -> int:
    """fn(sock) in a forked child running as uid/gid 65534 (another user); its
    exit code: fn's, 77 when the child cannot change user, 71 when fn raised."""
    pid = os.fork()
    if pid == 0:  # child
        code = 70
        try:
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.settimeout(3)
            try:
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            except OSError:
                os._exit(77)
            code = fn(s)
        except BaseException:
            code = 71
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def hello_and_drain(sock, hello: bytes) -> bytes | None:
    """Send ``hello`` (a refused send is fine) and read until the peer hangs up
    or resets: what it sent, or None when it neither sent nor hung up within
    the socket's timeout."""
    try:
        sock.sendall(hello)
    except OSError:
        pass
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                break
            data += chunk
    except (ConnectionResetError, BrokenPipeError):
        pass
    except TimeoutError:
        return None
    return data


def self_signed_cert(directory: str) -> tuple[str, str]:
    """(cert.pem, key.pem): a self-signed certificate for 127.0.0.1 and
    localhost, its own CA, made by the openssl command (pytest.skip without it)."""
    import pytest

    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a test certificate")
    cert, key = os.path.join(directory, "cert.pem"), os.path.join(directory, "key.pem")
    subprocess.run(
        [
            openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=dlwatch",
            "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", key, "-out", cert,
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@contextlib.contextmanager
def shell_and_child():
    """(shell PID, its child's PID): a wrapper and the process it started,
    both real, both killed on leaving."""
    import psutil

    sh = subprocess.Popen(["sh", "-c", "sleep 30; :"])
    try:
        end = time.monotonic() + 10
        while not psutil.Process(sh.pid).children() and time.monotonic() < end:
            time.sleep(0.01)
        (child,) = psutil.Process(sh.pid).children()
        yield sh.pid, child.pid
    finally:
        for p in psutil.Process(sh.pid).children(recursive=True):
            p.kill()
        sh.kill()
        sh.wait()
