"""Asking a job for a profiler burst or a worker profile, over a connection of its own.

The live collector's connections only read; a burst is a request and an
answer a minute later, so it gets its own socket to the job (the same uid
check on the job's side), asks for one frame in a hundred so the stream
costs nothing, and waits for the ``profile_result``. Every way this can go
wrong becomes a ``ProfileError`` with a readable message and a ``kind``
(``not-found``, ``unsupported``, ``busy``, ``rejected``, ``exited``,
``timeout``, ``connection``, ``cancelled``).
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypedDict

from dlwatch import __version__, rundir, wire
from dlwatch.collect import whose
from dlwatch.collect.jobs import discover, pid_alive
from dlwatch.diagnose import worker_profile
from dlwatch.diagnose.profile import summary

if TYPE_CHECKING:  # typed **kwargs (PEP 692); typing has it only from 3.11
    from typing_extensions import Unpack

HELLO_TIMEOUT_S = 5.0
# After the burst's own bound: reading Kineto's events and writing the trace
# (seconds for the largest bursts on a busy box).
PROCESSING_GRACE_S = 60.0
# The burst's stream of windows is not needed: one frame in this many.
QUIET_EVERY = 100


_REFUSALS = {"busy": "is busy", "unsupported": "does not support profiling", "rejected": "refused the burst"}


class Via(TypedDict, total=False):
    """How both requests reach the job and report back: the runtime
    directory (default: this user's), a callback for each ``profile_status``
    (progress), and a poll that, when true, hangs up (the job then drops the
    burst)."""

    directory: str | None
    on_status: Callable[[dict], None] | None
    cancelled: Callable[[], bool] | None


class ProfileError(Exception):
    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


def request_profile(
    pid: int,
    steps: int = wire.PROFILE_DEFAULT_STEPS,
    max_s: float = wire.PROFILE_MAX_SECONDS,
    out_dir: str | None = None,
    **via: Unpack[Via],
) -> dict:
    """Profile ``steps`` training steps of job ``pid``; the summary document
    (``dlwatch.diagnose.profile.summary``). ``out_dir``: where the job writes
    the trace (absolute; default this process's working directory)."""
    if not 1 <= steps <= wire.PROFILE_MAX_STEPS:
        raise ProfileError(f"--steps must be 1..{wire.PROFILE_MAX_STEPS}", "usage")
    if not 0 < max_s <= wire.PROFILE_MAX_SECONDS:
        raise ProfileError(f"the time bound must be in (0, {wire.PROFILE_MAX_SECONDS:g}] s", "usage")
    out_dir = os.path.abspath(out_dir or os.getcwd())
    request = wire.profile_request(steps, max_s, out_dir)
    ask = _Ask(request, wire.FEATURE_PROFILE, "profile_result", max_s + PROCESSING_GRACE_S, "profiler bursts")
    ask.unit = f"of {steps} steps collected"
    msg = _request(pid, ask, via)
    return summary(pid, msg["result"], msg.get("error"))


def request_worker_profile(
    pid: int,
    seconds: float = wire.WORKER_PROFILE_DEFAULT_SECONDS,
    hz: int | None = None,
    **via: Unpack[Via],
) -> dict:
    """Sample the fetches of job ``pid``'s busiest loader's workers for
    ``seconds``; the summary document (``dlwatch.diagnose.worker_profile``)."""
    if not 0 < seconds <= wire.WORKER_PROFILE_MAX_SECONDS:
        raise ProfileError(f"--seconds must be in (0, {wire.WORKER_PROFILE_MAX_SECONDS:g}]", "usage")
    if hz is not None and not 1 <= hz <= wire.WORKER_PROFILE_MAX_HZ:
        raise ProfileError(f"--hz must be 1..{wire.WORKER_PROFILE_MAX_HZ}", "usage")
    request = wire.worker_profile_request(seconds, hz)
    # The job waits up to a few seconds past the deadline for its workers' files.
    ask = _Ask(
        request, wire.FEATURE_WORKER_PROFILE, "worker_profile_result", seconds + 15.0, "worker profiles"
    )
    msg = _request(pid, ask, via)
    return worker_profile.summary(pid, msg["result"], msg.get("error"))


# The job answers within its gathering grace (probe/stack_request.py: 1.5 s).
STACKS_BOUND_S = 10.0


def request_stacks(pid: int, **via: Unpack[Via]) -> dict:
    """The Python stacks of job ``pid``'s threads and DataLoader workers:
    the job's document (``processes``, ``reason``, ``t``) and its error."""
    ask = _Ask(wire.stacks_request(), wire.FEATURE_STACKS, "stacks_result", STACKS_BOUND_S, "stack requests")
    msg = _request(pid, ask, via)
    return {**(msg.get("result") or {}), "error": msg.get("error")}


@dataclass
class _Ask:
    """One request: what to send, the feature the job must announce, the
    answer's type, how long after the request to wait for it."""

    request: dict
    feature: str
    result: str
    bound_s: float
    what: str
    unit: str = ""  # "of N steps collected": progress in the errors


def _request(pid: int, ask: _Ask, via: Via) -> dict:
    """Connect to job ``pid`` in ``via``'s directory, send ``ask`` once it
    has said hello, and return its answer."""
    directory = via.get("directory") or rundir.runtime_dir()
    sock = _connect(pid, rundir.socket_path(directory, pid), directory)
    try:
        return _converse(sock, pid, ask, via.get("on_status"), via.get("cancelled"))
    finally:
        sock.close()


def _connect(pid: int, path: str, directory: str) -> socket.socket:
    if not os.path.exists(path):
        # A wrapper's, a worker's or another user's PID: the sentence names the
        # PID to use; only a process without the hook is "unsupported" (stacks
        # then reads it from outside).
        kind, why = whose.explain(pid, {p for p, _ in discover(directory)}, directory)
        raise ProfileError(
            why, {whose.GONE: "not-found", whose.NOT_HOOKED: "unsupported"}.get(kind, "not-a-job")
        )
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(HELLO_TIMEOUT_S)
    try:
        s.connect(path)
        s.sendall(
            wire.encode(wire.client_hello(f"dlwatch {__version__} profile", QUIET_EVERY, history_frames=0))
        )
    except OSError as e:
        s.close()
        if not pid_alive(pid):
            raise ProfileError(f"the job with PID {pid} has exited", "exited") from None
        raise ProfileError(
            f"cannot connect to job {pid} at {path}: {e.strerror or e}", "connection"
        ) from None
    s.setblocking(False)
    return s


def _converse(sock, pid, ask: _Ask, on_status, cancelled) -> dict:
    decoder = wire.FrameDecoder()
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    hello_by = time.monotonic() + HELLO_TIMEOUT_S
    deadline = None
    progress = {"steps_done": 0}
    try:
        while True:
            if cancelled is not None and cancelled():
                raise ProfileError("cancelled", "cancelled")
            now = time.monotonic()
            limit = hello_by if deadline is None else deadline
            if now > limit:
                if deadline is None:
                    raise ProfileError(f"job {pid} sent no hello within {HELLO_TIMEOUT_S:g} s", "timeout")
                done = f" ({progress['steps_done']} {ask.unit})" if ask.unit else ""
                raise ProfileError(
                    f"job {pid} sent no result within {ask.bound_s:g} s{done}; is its loop stalled?",
                    "timeout",
                )
            if not sel.select(min(0.2, max(0.0, limit - now))):
                continue
            try:
                data = sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                continue
            except OSError:
                data = b""
            if not data:
                _hung_up(pid, deadline is not None, progress, ask)
            for msg in decoder.feed(data):
                if isinstance(msg, wire.WireError):
                    continue  # one bad frame costs that frame
                kind = msg.get("type")
                if kind == "error":
                    raise ProfileError(f"job {pid} refused the connection: {msg['message']}", "connection")
                if kind == "hello" and "job" in msg and deadline is None:
                    _check_hello(pid, msg, ask)
                    sock.setblocking(True)
                    sock.sendall(wire.encode(ask.request))
                    sock.setblocking(False)
                    deadline = time.monotonic() + ask.bound_s
                elif kind == "profile_status":
                    state = msg["state"]
                    if state in _REFUSALS:
                        raise ProfileError(
                            f"job {pid} {_REFUSALS[state]}: {msg.get('message') or state}", state
                        )
                    progress["steps_done"] = msg.get("steps_done") or 0
                    if on_status is not None:
                        on_status(msg)
                elif kind == ask.result and not msg.get("broadcast"):
                    return msg  # (a broadcast is an earlier burst's answer, for every monitor)
    finally:
        sel.close()


def _check_hello(pid: int, msg: dict, ask: _Ask) -> None:
    try:
        wire.check_protocol(msg)
    except wire.WireError as e:
        raise ProfileError(f"job {pid}: {e}", "unsupported") from None
    features = msg.get("features") or []
    if ask.feature in features:
        return
    version = msg["job"].get("dlwatch_version") or "unknown"
    profiling = {wire.FEATURE_PROFILE, wire.FEATURE_WORKER_PROFILE}
    if "features" in msg and ask.feature in profiling and not profiling & set(features):
        why = "profiling is disabled in that job (DLWATCH_PROFILE=0)"
    else:
        why = f"its dlwatch ({version}) predates {ask.what}; restart it with dlwatch {__version__}"
    what = "profiling" if ask.feature == wire.FEATURE_PROFILE else ask.what
    raise ProfileError(f"job {pid} does not support {what} (not supported): {why}", "unsupported")


def _hung_up(pid: int, requested: bool, progress: dict, ask: _Ask) -> None:
    # The job may be exiting: give it a moment to be reaped before deciding.
    for _ in range(60):
        if not pid_alive(pid):
            break
        time.sleep(0.05)
    if not pid_alive(pid):
        if requested:
            raise ProfileError(
                f"the job with PID {pid} exited during the burst"
                + (f" ({progress['steps_done']} {ask.unit}; no result)" if ask.unit else ""),
                "exited",
            )
        raise ProfileError(f"the job with PID {pid} has exited", "exited")
    raise ProfileError(f"job {pid} closed the connection", "connection")
