"""The wire protocol shared by the probe (server) and the monitor (client).

Newline-delimited JSON over a Unix stream socket. Nothing but JSON is ever
decoded from the wire, every frame is size-limited, and every message is
checked against a small schema before anyone looks at it. This module is
stdlib-only because the probe imports it inside the training job.

Conversation::

    client -> {"type": "hello", "protocol": 1, "client": "dlwatch 0.1.0"}
    server -> {"type": "hello", "protocol": 1, "job": {...}, "history": N}
    server -> N x {"type": "window", ...}   (recent history, oldest first)
    server -> {"type": "window", ...}       (about 10 per second, live)

A server that can run a profiler burst lists ``"profile"`` in its hello's
``features`` (a job whose hello lacks it predates bursts, or was started with
``DLWATCH_PROFILE=0``). Then, on the same connection::

    client -> {"type": "profile", "steps": 10, "max_s": 60, "out_dir": "/abs/dir"}
    server -> {"type": "profile_status", "state": "armed" | "running" | "processing", ...}
    server -> {"type": "profile_result", "result": {...}}   (or with "error")

or a single ``profile_status`` with state ``busy`` / ``unsupported`` /
``rejected`` when the burst cannot start at all.

A version mismatch is answered with ``{"type": "error", ...}`` and the
connection is closed; so is a malformed or oversized frame.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

PROTOCOL_VERSION = 1
# Windows carry a handful of loaders with up to a few dozen workers each:
# a few KiB. 1 MiB leaves room for anything real and bounds what a peer can
# make the other side buffer.
MAX_FRAME_BYTES = 1 << 20
# What a client may send: a hello or a profile request (its out_dir is at
# most MAX_OUT_DIR_CHARS). Anything longer is an attack or a bug.
MAX_CLIENT_FRAME_BYTES = 4096
MAX_OUT_DIR_CHARS = 1024
# What a server that runs profiler bursts announces in its hello.
FEATURE_PROFILE = "profile"
# Profiler bursts: bounded so that a request can never make the job record
# (and hold in memory) more than a minute of events.
PROFILE_DEFAULT_STEPS = 10
PROFILE_MAX_STEPS = 200
PROFILE_MAX_SECONDS = 60.0
# The states of a burst as ``profile_status`` reports them; the last three
# are final answers to a request that will not run.
PROFILE_STATES = ("armed", "running", "processing", "busy", "unsupported", "rejected")


class WireError(ValueError):
    """A frame that cannot be accepted; the message says why, readably."""


def encode(msg: dict[str, Any], limit: int = MAX_FRAME_BYTES) -> bytes:
    data = json.dumps(msg, separators=(",", ":"), allow_nan=False).encode()
    if len(data) + 1 > limit:
        raise WireError(f"frame of {len(data) + 1} bytes exceeds the {limit}-byte limit")
    return data + b"\n"


class FrameDecoder:
    """Splits a byte stream into validated messages.

    ``feed`` returns what the bytes completed: dicts for good frames and
    ``WireError`` instances for bad ones (the caller decides whether a bad frame
    ends the conversation). A line longer than ``limit`` is reported once and
    skipped up to its newline without being buffered, so memory stays bounded
    whatever the peer sends.
    """

    def __init__(self, limit: int = MAX_FRAME_BYTES) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._skipping = False

    def feed(self, data: bytes) -> list[dict[str, Any] | WireError]:
        out: list[dict[str, Any] | WireError] = []
        start = 0
        while True:
            nl = data.find(b"\n", start)
            if nl < 0:
                break
            if self._skipping:
                self._skipping = False
            else:
                self._buf += data[start:nl]
                out.append(self._parse(bytes(self._buf)))
            self._buf.clear()
            start = nl + 1
        rest = data[start:]
        if not self._skipping and rest:
            if len(self._buf) + len(rest) > self.limit:
                out.append(WireError(f"frame exceeds the {self.limit}-byte limit"))
                self._buf.clear()
                self._skipping = True
            else:
                self._buf += rest
        return out

    @property
    def pending(self) -> int:
        """Bytes of an unfinished frame held in the buffer."""
        return len(self._buf)

    def _parse(self, line: bytes) -> dict[str, Any] | WireError:
        if len(line) + 1 > self.limit:
            return WireError(f"frame exceeds the {self.limit}-byte limit")
        try:
            msg = json.loads(line.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite_float)
        except (UnicodeDecodeError, ValueError, RecursionError) as e:
            return WireError(f"malformed frame: {_short(e)}")
        try:
            return validate(msg)
        except WireError as e:
            return e


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _finite_float(text: str) -> float:
    v = float(text)
    if v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"number {text[:40]} is out of range")
    return v


def _short(e: BaseException) -> str:
    s = str(e)
    return s if len(s) <= 120 else s[:117] + "..."


# --- schema -----------------------------------------------------------------
# A tiny structural checker: field -> accepted types. Optional fields may be
# absent or null. Extra fields are allowed (forward compatibility within a
# protocol version); wrong types are not.

_INT = (int,)
_NUM = (int, float)
_STR = (str,)
_BOOL = (bool,)
_LIST = (list,)
_DICT = (dict,)

HELLO_CLIENT = {"protocol": _INT}
HELLO_SERVER = {"protocol": _INT, "job": _DICT}
HELLO_SERVER_OPTIONAL = {"history": _INT, "features": _LIST}
JOB = {"pid": _INT, "cmdline": _STR}
JOB_OPTIONAL = {
    "rank": _INT,
    "local_rank": _INT,
    "world_size": _INT,
    "torch_version": _STR,
    "start_method": _STR,
    "run_id": _STR,
    "started": _NUM,
    "python": _STR,
    "hostname": _STR,
    "dlwatch_version": _STR,
}
WINDOW = {"seq": _INT, "t": _NUM, "mono_ns": _INT, "loaders": _LIST}
WINDOW_OPTIONAL = {"main": _DICT}
LOADER = {
    "id": _INT,
    "epoch": _INT,
    "batches": _INT,
    "wait_ns": _INT,
    "step_ns": _INT,
    "num_workers": _INT,
    "workers": _LIST,
    "queue": _DICT,
}
LOADER_OPTIONAL = {
    "batch_size": _INT,
    "pin_memory": _BOOL,
    "persistent_workers": _BOOL,
    "prefetch_factor": _INT,
    "start_method": _STR,
    "kind": _STR,
    "name": _STR,
    "active": _BOOL,
    "epoch_start_ms": _LIST,
    "epoch_ms": _LIST,
    "epoch_batches": _LIST,
    "teardown_ns": _INT,
    "iterator": _STR,
    "dataset": _STR,
    "autotune": _DICT,
}
QUEUE_OPTIONAL = {"ready": _INT, "in_flight": _INT, "capacity": _INT}
WORKER = {"id": _INT, "pid": _INT, "batches": _INT, "fetch_ns": _INT, "busy_ns": _INT}
WORKER_OPTIONAL = {"started_ns": _INT}
ERROR = {"message": _STR}
PROFILE = {"steps": _INT}
PROFILE_OPTIONAL = {"max_s": _NUM, "out_dir": _STR}
PROFILE_STATUS = {"state": _STR}
PROFILE_STATUS_OPTIONAL = {"steps": _INT, "steps_done": _INT, "message": _STR, "loader": _DICT}
PROFILE_RESULT = {"result": _DICT}
PROFILE_RESULT_OPTIONAL = {"error": _STR}


def _check(obj: Any, required: dict, optional: dict | None, what: str | Callable[[], str]) -> None:
    """Raise WireError unless ``obj`` is a dict with these fields. ``what``
    names it in the message; a callable is only called for a message (a
    frame holds dozens of objects, and good frames need no names)."""
    if not isinstance(obj, dict):
        raise WireError(f"{_name(what)} must be a JSON object, got {type(obj).__name__}")
    for key, types in required.items():
        if key not in obj:
            raise WireError(f"{_name(what)} lacks required field '{key}'")
        value = obj[key]
        # bool is an int subclass: never accept it where a number is meant.
        if not isinstance(value, types) or (value is True or value is False) and bool not in types:
            _check_type(value, types, f"{_name(what)}.{key}")
    if optional:
        for key, types in optional.items():
            value = obj.get(key)
            if value is not None and (
                not isinstance(value, types) or (value is True or value is False) and bool not in types
            ):
                _check_type(value, types, f"{_name(what)}.{key}")


def _name(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()


def _check_type(value: Any, types: tuple, where: str) -> None:
    if isinstance(value, bool) and bool not in types:
        raise WireError(f"{where} has the wrong type (bool)")
    if not isinstance(value, types):
        raise WireError(f"{where} has the wrong type ({type(value).__name__})")


def validate(msg: Any) -> dict[str, Any]:
    """Return ``msg`` if it is a well-formed message, else raise WireError."""
    if not isinstance(msg, dict):
        raise WireError(f"message must be a JSON object, got {type(msg).__name__}")
    kind = msg.get("type")
    if kind == "hello":
        if "job" in msg:
            _check(msg, HELLO_SERVER, HELLO_SERVER_OPTIONAL, "hello")
            _check(msg["job"], JOB, JOB_OPTIONAL, "hello.job")
        else:
            _check(msg, HELLO_CLIENT, None, "hello")
    elif kind == "window":
        _check(msg, WINDOW, WINDOW_OPTIONAL, "window")
        for i, ld in enumerate(msg["loaders"]):
            _check(ld, LOADER, LOADER_OPTIONAL, lambda i=i: f"window.loaders[{i}]")
            _check(ld["queue"], {}, QUEUE_OPTIONAL, lambda i=i: f"window.loaders[{i}].queue")
            for j, w in enumerate(ld["workers"]):
                _check(w, WORKER, WORKER_OPTIONAL, lambda i=i, j=j: f"window.loaders[{i}].workers[{j}]")
    elif kind == "error":
        _check(msg, ERROR, None, "error")
    elif kind == "profile":
        _check(msg, PROFILE, PROFILE_OPTIONAL, "profile")
        _check_profile_request(msg)
    elif kind == "profile_status":
        _check(msg, PROFILE_STATUS, PROFILE_STATUS_OPTIONAL, "profile_status")
        if msg["state"] not in PROFILE_STATES:
            raise WireError(f"profile_status.state {msg['state'][:40]!r} is not one of {PROFILE_STATES}")
    elif kind == "profile_result":
        _check(msg, PROFILE_RESULT, PROFILE_RESULT_OPTIONAL, "profile_result")
    else:
        raise WireError(f"unknown message type {kind!r}")
    return msg


def _check_profile_request(msg: dict[str, Any]) -> None:
    steps = msg["steps"]
    if not 1 <= steps <= PROFILE_MAX_STEPS:
        raise WireError(f"profile.steps must be 1..{PROFILE_MAX_STEPS}, got {steps}")
    max_s = msg.get("max_s")
    if max_s is not None and not 0 < max_s <= PROFILE_MAX_SECONDS:
        raise WireError(f"profile.max_s must be in (0, {PROFILE_MAX_SECONDS:g}], got {max_s}")
    out_dir = msg.get("out_dir")
    if out_dir is not None:
        if len(out_dir) > MAX_OUT_DIR_CHARS:
            raise WireError(f"profile.out_dir is longer than {MAX_OUT_DIR_CHARS} characters")
        if not out_dir.startswith("/") or "\x00" in out_dir:
            raise WireError("profile.out_dir must be an absolute path")


def profile_request(steps: int, max_s: float | None = None, out_dir: str | None = None) -> dict[str, Any]:
    """A monitor's request for a profiler burst of ``steps`` training steps."""
    msg: dict[str, Any] = {"type": "profile", "steps": steps}
    if max_s is not None:
        msg["max_s"] = max_s
    if out_dir is not None:
        msg["out_dir"] = out_dir
    return validate(msg)


def client_hello(client: str, every: int | None = None) -> dict[str, Any]:
    """A monitor's hello; ``every``: send only every Nth frame (the job
    publishes ten a second)."""
    hello: dict[str, Any] = {"type": "hello", "protocol": PROTOCOL_VERSION, "client": client}
    if every is not None:
        hello["every"] = every
    return hello


def check_protocol(hello: dict[str, Any]) -> None:
    """Raise WireError when the peer speaks another protocol version."""
    theirs = hello.get("protocol")
    if theirs != PROTOCOL_VERSION:
        raise WireError(
            f"protocol version mismatch: peer speaks {theirs}, this dlwatch speaks "
            f"{PROTOCOL_VERSION}; use the same dlwatch version in the job and the monitor"
        )
