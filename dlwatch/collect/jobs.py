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
from dlwatch.collect import job_end, oom
from dlwatch.collect.exit_clock import ExitClock
from dlwatch.collect.totals import Totals
from dlwatch.diagnose import hang, worker_profile

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


# Worker processes whose RSS the connection remembers (a job that re-spawns
# its workers every epoch makes new ones; the oldest go first).
MAX_RSS_TRACKED = 512


def stacks_doc(msg: dict) -> dict:
    """A ``stacks_result`` as the snapshot carries it: the job's document,
    its error, and one summary line per process (``diagnose.hang``)."""
    result = msg.get("result") or {}
    doc = dict(result)
    doc["error"] = msg.get("error")
    try:
        doc["summary"] = hang.summarize(result)
    except Exception as e:  # a malformed document costs its summary
        doc["summary"] = []
        doc["error"] = doc["error"] or f"unreadable stacks: {type(e).__name__}: {e}"
    return doc


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

    def __init__(
        self,
        pid: int,
        path: str,
        max_frames: int = MAX_FRAMES,
        every: int = FRAME_EVERY,
        exits: ExitClock | None = None,
    ) -> None:
        self.pid = pid
        # When the monitor last tried to connect (its monotonic clock).
        self.tried_at = 0.0
        # The monitor's exit clock (exit_clock.py): when the process ended, and
        # its wait status read before its parent reaped it.
        self.exits = exits
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
        # The job's last stacks (a stall's or a request's), as the snapshot
        # carries them (model.py), and its memory cgroup's OOM-kill counter
        # when first seen and when a worker died (oom.py).
        self.stacks: dict | None = None
        self.cgroup_dir: str | None = None
        self.cgroup_note = ""
        self.oom_kills_at_start: int | None = None
        self.oom: dict | None = None
        self._deaths_seen = 0
        # What the job's hello announced it can do (wire.FEATURE_*).
        self.features: list[str] = []
        # The history frames the job's hello said follow, and how many came:
        # a window built before they all came is from the past (a loaded job
        # sends them late: a --follow stream's first document was 17 s old).
        self.history_due = 0
        self.history_got = 0
        self.caught_up_once = False  # Monitor.catch_up waited for it once
        # Each worker's first and last RSS sample: (time, bytes, time, bytes).
        self.worker_rss: dict[int, tuple[float, int, float, int]] = {}

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
        if state == "exited" and self.frames:
            self.reason = self._how_it_ended()
        if self.ended_at is None:
            self.ended_at = time.time()

    def _how_it_ended(self) -> str:
        """What the last frame (probe/exit_cause.py, ``at_exit``), the
        wait status of a zombie and the cgroup's OOM counter say of the end."""
        main = self.frames[-1].get("main") or {}
        cause = main.get("exit_exception")
        call = main.get("exit_call")
        spoke = bool(main.get("at_exit")) if wire.FEATURE_LAST_FRAME in self.features else None
        now, _ = oom.oom_kills(self.cgroup_dir) if not cause else (None, "")
        at_start = self.oom_kills_at_start
        new = (
            now - at_start if isinstance(now, int) and isinstance(at_start, int) and now > at_start else None
        )
        why = job_end.reason(
            cause if isinstance(cause, str) else None,
            spoke,
            self._wait_status(),
            new,
            exit_call=call if isinstance(call, str) else None,
        )
        return job_end.after_worker_death(why, list(self.frames[-1].get("loaders") or ()))

    def _wait_status(self) -> int | None:
        status = job_end.zombie_status(self.pid)
        if status is None and self.exits is not None:
            status = self.exits.status(self.pid)
        return status

    @property
    def exit_clock_at(self) -> float | None:
        """When the process ended by the exit clock, when it saw it."""
        return None if self.exits is None else self.exits.ended_at(self.pid)

    @property
    def catching_up(self) -> bool:
        """Connected, and its hello or part of its history still to come."""
        return self.sock is not None and (self.job is None or self.history_got < self.history_due)

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
            self.features = [str(f) for f in msg.get("features") or ()]
            due = msg.get("history")
            self.history_due = due if isinstance(due, int) and not isinstance(due, bool) and due > 0 else 0
            self.history_got = 0
            self.state = "live"
            self.reason = ""
            if self.cgroup_dir is None:
                self.cgroup_dir, self.cgroup_note = oom.cgroup_dir(self.pid)
                self.oom_kills_at_start = oom.oom_kills(self.cgroup_dir)[0]
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
            if self.history_got < self.history_due:
                self.history_got += 1
            if self.frames and msg["mono_ns"] <= self.frames[-1]["mono_ns"]:
                return 0  # duplicates after a reconnect's history replay
            self.frames.append(msg)
            self.totals.add(msg)
            self._check_deaths(msg)
            return 1
        if kind == "worker_profile_result" and not msg.get("error"):
            doc = worker_profile.summary(self.pid, msg["result"], None)
            self.worker_profile = worker_profile.brief(doc, time.time())
        if kind == "stacks_result":
            self.stacks = stacks_doc(msg)
        return 0

    def _check_deaths(self, frame: dict) -> None:
        """A worker died since the last frame: read the OOM-kill counter now."""
        n = sum(len(ld.get("worker_deaths") or ()) for ld in frame["loaders"])
        if n == self._deaths_seen:
            return
        self._deaths_seen = n
        count, source = oom.oom_kills(self.cgroup_dir)
        self.oom = {
            "oom_kills": count,
            "oom_kills_at_start": self.oom_kills_at_start,
            "source": source if count is not None else None,
            "reason": None if count is not None else (self.cgroup_note or source),
            "cgroup": self.cgroup_dir,
        }

    def track_rss(self, pid: int, rss: int, now: float) -> None:
        # A killed worker lingers as a zombie until torch reaps it, and a
        # zombie's RSS reads 0: that is no figure of the worker's memory (a
        # death's "last RSS" came out 0 B on a loaded box).
        if rss <= 0:
            return
        first = self.worker_rss.get(pid)
        if first is None:
            self.worker_rss[pid] = (now, rss, now, rss)
        else:
            self.worker_rss[pid] = (first[0], first[1], now, rss)
        if len(self.worker_rss) > MAX_RSS_TRACKED:
            del self.worker_rss[next(iter(self.worker_rss))]

    @property
    def live(self) -> bool:
        return self.state in ("live", "connecting")
