"""Finding jobs in the runtime directory and talking to each one's socket.

Every failure here becomes a state with a readable reason on the job
("exited", "unreachable: connection refused", "incompatible: protocol
version mismatch…"), never an exception for the views to catch.
"""

from __future__ import annotations

import errno
import os
import socket
import time
from collections import deque

from dlwatch import __version__, rundir, wire
from dlwatch.collect.totals import Totals
from dlwatch.diagnose import worker_profile

# Jobs publish ten frames a second. A monitor may ask for every Nth only
# (half the decoding at N=2), but each frame skipped delays what the screen
# shows: a step in the job reaches a 1 s window's midpoint ~0.05 s later at
# 5 frames/s, and freshness (on screen within 1 s, ~0.9 s measured) has
# little room. The live view takes them all.
FRAME_EVERY = 1
# A one-shot snapshot (`dlwatch snapshot`) is not in a hurry: every 3rd frame.
# Its figures are differences of the frames' cumulative counters, exact at any
# pace; only the queue mean averages 10 frames of a 3 s window instead of 30.
# Decoding the job's one-minute replay (600 frames, ~45 us each with 8 workers
# here) was a third of a snapshot's CPU (bench/snapshot_cost.py).
ONE_SHOT_EVERY = 3
# 2+ minutes of frames at 10 Hz: enough for the history graphs and any window.
MAX_FRAMES = 1300
RECV_BYTES = 1 << 16
CONNECT_TIMEOUT_S = 0.5
# A socket file that refuses connections may belong to a job that has bound
# but not yet listened: only call it stale once it is this old.
STALE_GRACE_S = 5.0


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    except OSError:
        return False
    # A zombie is dead for our purposes (our own demo child, not yet reaped).
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
        return state not in (b"Z", b"X")
    except (OSError, IndexError):
        return True


def discover(directory: str) -> list[tuple[int, str]]:
    """Job sockets in ``directory``; removes those of processes that are gone."""
    found = []
    for pid, path in rundir.list_sockets(directory):
        if pid_alive(pid):
            found.append((pid, path))
        else:
            _unlink_quietly(path)
    return found


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


class JobConnection:
    """One job's stream: its identity, its recent frames and its state."""

    def __init__(self, pid: int, path: str, max_frames: int = MAX_FRAMES, every: int = FRAME_EVERY) -> None:
        self.pid = pid
        self.path = path
        self.every = every  # ask the job for every Nth frame (its hello's "every")
        self.sock: socket.socket | None = None
        self.decoder = wire.FrameDecoder()
        self.job: dict | None = None
        self.frames: deque[dict] = deque(maxlen=max_frames)
        # loader id -> (newest frame's mono_ns when computed, 1 s history series)
        self.history_cache: dict[int, tuple[int, dict]] = {}
        # Lifetime counters kept monotonic across epochs (the exporter's).
        self.totals = Totals()
        self.state = "connecting"
        self.reason = ""
        self.bad_frames = 0
        self.last_error = ""
        self.first_seen = time.time()
        self.ended_at: float | None = None
        # The job's last worker profile, as the hints quote it (model.py).
        self.worker_profile: dict | None = None

    # --- connection -------------------------------------------------------------

    def connect(self) -> bool:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(CONNECT_TIMEOUT_S)
        try:
            s.connect(self.path)
            s.sendall(wire.encode(wire.client_hello(f"dlwatch {__version__}", every=self.every)))
        except OSError as e:
            s.close()
            self._connect_failed(e)
            return False
        s.setblocking(False)
        self.sock = s
        self.state = "connecting"
        self.reason = ""
        return True

    def _connect_failed(self, e: OSError) -> None:
        if not pid_alive(self.pid):
            self._set_ended("exited", "the process has exited")
            _unlink_quietly(self.path)
            return
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            try:
                age = time.time() - os.stat(self.path).st_mtime
            except OSError:
                age = STALE_GRACE_S
            if age >= STALE_GRACE_S and e.errno == errno.ECONNREFUSED:
                _unlink_quietly(self.path)  # nobody listens: a stale file
        self.state = "unreachable"
        self.reason = f"cannot connect to {self.path}: {e.strerror or e}"

    def fileno(self) -> int:
        return self.sock.fileno() if self.sock is not None else -1

    def close(self) -> None:
        if self.sock is not None:
            try:
                self.sock.close()
            except OSError:
                pass
            self.sock = None

    def _set_ended(self, state: str, reason: str) -> None:
        self.close()
        self.state = state
        self.reason = reason
        if self.ended_at is None:
            self.ended_at = time.time()

    def on_hangup(self) -> None:
        if pid_alive(self.pid):
            self.close()
            self.state = "unreachable"
            self.reason = "the job closed the connection"
        else:
            self._set_ended("exited", "the process has exited")

    # --- reading ------------------------------------------------------------------

    def read(self) -> int:
        """Drain what the socket has; return the number of frames received."""
        if self.sock is None:
            return 0
        got = 0
        while True:
            try:
                data = self.sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.on_hangup()
                break
            if not data:
                self.on_hangup()
                break
            for msg in self.decoder.feed(data):
                got += self._on_message(msg)
            if self.sock is None:
                break
        return got

    def _on_message(self, msg) -> int:
        if isinstance(msg, wire.WireError):
            # One bad frame costs that frame, not the job's whole stream.
            self.bad_frames += 1
            self.last_error = str(msg)
            return 0
        kind = msg.get("type")
        if kind == "hello":
            if "job" not in msg:
                self.bad_frames += 1
                self.last_error = "client hello received from a job"
                return 0
            try:
                wire.check_protocol(msg)
            except wire.WireError as e:
                self._set_ended("incompatible", str(e))
                return 0
            self.job = msg["job"]
            self.state = "live"
            self.reason = ""
            return 0
        if kind == "error":
            self._set_ended(
                "incompatible" if "protocol" in msg["message"] else "unreachable",
                f"job refused the connection: {msg['message']}",
            )
            return 0
        if kind == "window":
            if self.job is None:
                self.bad_frames += 1
                self.last_error = "window before hello"
                return 0
            if self.frames and msg["mono_ns"] <= self.frames[-1]["mono_ns"]:
                return 0  # duplicates after a reconnect's history replay
            self.frames.append(msg)
            self.totals.add(msg)
            return 1
        if kind == "worker_profile_result" and not msg.get("error"):
            doc = worker_profile.summary(self.pid, msg["result"], None)
            self.worker_profile = worker_profile.brief(doc, time.time())
        return 0

    @property
    def live(self) -> bool:
        return self.state in ("live", "connecting")
