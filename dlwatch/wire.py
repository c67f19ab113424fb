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

A server that can sample its DataLoader workers lists ``"worker-profile"``::

    client -> {"type": "worker_profile", "seconds": 5, "hz": 100}
    server -> {"type": "profile_status", "state": "running", "message": ...}  (about once a second)
    server -> {"type": "worker_profile_result", "result": {...}}   (or with "error")

with the same single ``profile_status`` refusals. Every other monitor of the
job gets the answer too, marked ``"broadcast": true`` (and a monitor that
connects later gets the last one after its history).

Every server lists ``"stacks"``: the Python stacks of the job's threads and
of its DataLoader workers, asked for or sent on its own when a loader
stalls::

    client -> {"type": "stacks"}
    server -> {"type": "stacks_result", "result": {...}}   (or with "error")

Every other monitor gets the answer marked ``"broadcast": true``, and so does
every monitor when the job gathered them on a stall (``result.reason``:
``"stall"`` or ``"request"``); a monitor that connects later gets the last
one after its history.

A server that lists ``"last-frame"`` sends one more window as Python exits,
with ``"at_exit": true`` in its ``main``: a job that lists it and hangs up
without that frame did not exit through Python (killed by a signal, a
crash, ``os._exit``).

A version mismatch is answered with ``{"type": "error", ...}`` and the
connection is closed; so is a malformed or oversized frame.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

PROTOCOL_VERSION = 1
# A worker's fetch times travel as a histogram ("fetch_hist": [[bucket,
# count], ...], cumulative): log-spaced buckets, FETCH_HIST_PER_OCTAVE to a
# doubling (each 19 % wide) from FETCH_HIST_LO_S up; 64 reach 3.3 s, and the
# last also counts everything longer, the first everything shorter.
FETCH_HIST_PER_OCTAVE = 4
FETCH_HIST_BUCKETS = 64
FETCH_HIST_LO_S = 50e-6


def fetch_hist_bounds_ms(k: int) -> tuple[float, float]:
    """The fetch times (ms) that bucket ``k`` counts (its nominal edges)."""
    lo = FETCH_HIST_LO_S * 2 ** (k / FETCH_HIST_PER_OCTAVE) * 1e3
    return lo, lo * 2 ** (1 / FETCH_HIST_PER_OCTAVE)


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
FEATURE_WORKER_PROFILE = "worker-profile"
FEATURE_STACKS = "stacks"
# A server whose last frame, sent as Python exits, says so (``main.at_exit``):
# a job that ended with no such frame did not exit through Python (a signal,
# a crash, ``os._exit``).
FEATURE_LAST_FRAME = "last-frame"
# Worker profile bursts: seconds and samples per second per worker.
WORKER_PROFILE_DEFAULT_SECONDS = 5.0
WORKER_PROFILE_MAX_SECONDS = 60.0
WORKER_PROFILE_DEFAULT_HZ = 100
WORKER_PROFILE_MAX_HZ = 1000
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

_INT: tuple[type, ...] = (int,)
_NUM: tuple[type, ...] = (int, float)
_STR: tuple[type, ...] = (str,)
_BOOL: tuple[type, ...] = (bool,)
_LIST: tuple[type, ...] = (list,)
_DICT: tuple[type, ...] = (dict,)

Fields = Mapping[str, tuple[type, ...]]


def _of(types: tuple[type, ...], *names: str) -> dict[str, tuple[type, ...]]:
    """Fields that all take ``types``."""
    return dict.fromkeys(names, types)


HELLO_CLIENT: Fields = {"protocol": _INT}
# ``every``: send only every Nth frame; ``history_frames``: replay at most
# this many recent frames. A value out of range is ignored (the job's
# defaults), a value of the wrong type is a bad hello.
HELLO_CLIENT_OPTIONAL: Fields = {"client": _STR, "every": _INT, "history_frames": _INT}
HELLO_SERVER = {"protocol": _INT, "job": _DICT}
HELLO_SERVER_OPTIONAL = {"history": _INT, "features": _LIST}
JOB = {"pid": _INT, "cmdline": _STR}
JOB_OPTIONAL = (
    _of(_INT, "rank", "local_rank", "world_size")
    | _of(_STR, "torch_version", "start_method", "run_id", "python", "hostname", "dlwatch_version", "master")
    | _of(_STR, "cuda_visible_devices", "cuda_device_order")
    | _of(_NUM, "started")
)
WINDOW = {"seq": _INT, "t": _NUM, "mono_ns": _INT, "loaders": _LIST}
WINDOW_OPTIONAL = {"main": _DICT}
# own_tids: the native ids of dlwatch's own threads in the process (the
# monitor leaves them out of its thread count, CPU and run-queue wait).
MAIN_OPTIONAL = {
    "cuda_initialized": _BOOL,
    "py_threads": _INT,
    "train_threads": _LIST,
    "own_tids": _LIST,
    "exit_exception": _STR,  # the main thread's uncaught exception, in the last frame
    "exit_call": _STR,  # the main thread's failing sys.exit call ("sys.exit(3)")
    "at_exit": _BOOL,  # the frame sent as Python exits (FEATURE_LAST_FRAME)
}
LOADER = (
    _of(_INT, "id", "epoch", "batches", "wait_ns", "step_ns", "num_workers")
    | _of(_LIST, "workers")
    | _of(_DICT, "queue")
)
LOADER_OPTIONAL = (
    _of(_INT, "batch_size", "prefetch_factor", "teardown_ns", "batch_bytes", "batch_rows")
    | _of(_BOOL, "pin_memory", "persistent_workers", "active")
    | _of(_INT, "samples", "wait_samples", "hol_samples")
    | _of(_BOOL, "in_order")
    | _of(_STR, "start_method", "kind", "name", "iterator", "dataset")
    | _of(_LIST, "epoch_start_ms", "epoch_ms", "epoch_batches", "dataset_wrappers")
    | _of(_DICT, "autotune", "iterated_on", "replay")
    # A stall (probe/stall.py), and workers that died (probe/deaths.py).
    | _of(_NUM, "stalled_s", "stall_threshold_s")
    | _of(_INT, "awaited_worker")
    | _of(_BOOL, "in_next", "feeder_alive")
    | _of(_LIST, "worker_deaths")
    | _of(_STR, "last_error")
    | _of(_BOOL, "epoch_open")
    | _of(_STR, "framework", "role")
    # Pipelines other than a plain DataLoader (probe/adapters, docs/pipelines.md):
    # the library, its knobs under its own names, thread or process workers; a
    # loader fed to the loop through a queue (feeder: its own thread's figures,
    # consumer: the loop's thread); one nested in another's next().
    | _of(_STR, "library", "loader_class", "worker_kind")
    | _of(_DICT, "knobs", "feeder", "consumer")
    | _of(_LIST, "pipeline_workers")
    # An iterable dataset its library shards among workers (HF datasets, WebDataset):
    # the shard count caps the workers that get data (probe/stats.py).
    | _of(_INT, "shards")
    | _of(_STR, "shards_of")
    # The loop thread's CPU inside next() on the batches it was read for (one
    # in 16, probe/patches.py), and how many: the handover's cost per batch.
    | _of(_INT, "next_cpu_ns", "next_cpu_batches")
    | _of(_INT, "nested_in")
)
QUEUE_OPTIONAL = {"ready": _INT, "in_flight": _INT, "capacity": _INT}
WORKER = {"id": _INT, "pid": _INT, "batches": _INT, "fetch_ns": _INT, "busy_ns": _INT}
WORKER_OPTIONAL = (
    _of(_INT, "started_ns", "first_batch_digest", "second_batch_digest")
    | _of(_LIST, "fetch_hist", "own_tids")
    | _of(_NUM, "started_cpu_s")
)
ERROR = {"message": _STR}
PROFILE = {"steps": _INT}
PROFILE_OPTIONAL = {"max_s": _NUM, "out_dir": _STR}
PROFILE_STATUS = {"state": _STR}
PROFILE_STATUS_OPTIONAL = {"steps": _INT, "steps_done": _INT, "message": _STR, "loader": _DICT}
PROFILE_RESULT = {"result": _DICT}
PROFILE_RESULT_OPTIONAL = {"error": _STR}
WORKER_PROFILE = {"seconds": _NUM}
WORKER_PROFILE_OPTIONAL = {"hz": _INT}
# broadcast: the copy every other monitor of the job gets (not an answer to them)
WORKER_PROFILE_RESULT_OPTIONAL = {"error": _STR, "broadcast": _BOOL}
STACKS_RESULT_OPTIONAL = WORKER_PROFILE_RESULT_OPTIONAL


@dataclass(frozen=True)
class Schema:
    required: Fields
    optional: Fields = field(default_factory=dict)

    @property
    def fields(self) -> set[str]:
        return set(self.required) | set(self.optional)


# Every message a peer may send, by type ("hello" is two: the client's and
# the job's), each with its builder below; and the records nested in them.
MESSAGES: dict[str, Schema] = {
    "hello/client": Schema(HELLO_CLIENT, HELLO_CLIENT_OPTIONAL),
    "hello/server": Schema(HELLO_SERVER, HELLO_SERVER_OPTIONAL),
    "window": Schema(WINDOW, WINDOW_OPTIONAL),
    "error": Schema(ERROR),
    "profile": Schema(PROFILE, PROFILE_OPTIONAL),
    "profile_status": Schema(PROFILE_STATUS, PROFILE_STATUS_OPTIONAL),
    "profile_result": Schema(PROFILE_RESULT, PROFILE_RESULT_OPTIONAL),
    "worker_profile": Schema(WORKER_PROFILE, WORKER_PROFILE_OPTIONAL),
    "worker_profile_result": Schema(PROFILE_RESULT, WORKER_PROFILE_RESULT_OPTIONAL),
    "stacks": Schema({}),
    "stacks_result": Schema(PROFILE_RESULT, STACKS_RESULT_OPTIONAL),
}
RECORDS: dict[str, Schema] = {
    "job": Schema(JOB, JOB_OPTIONAL),
    "main": Schema({}, MAIN_OPTIONAL),
    "loader": Schema(LOADER, LOADER_OPTIONAL),
    "queue": Schema({}, QUEUE_OPTIONAL),
    "worker": Schema(WORKER, WORKER_OPTIONAL),
}


def message_kind(msg: dict[str, Any]) -> str:
    """The key of ``msg``'s schema in ``MESSAGES``."""
    kind = str(msg.get("type"))
    return f"hello/{'server' if 'job' in msg else 'client'}" if kind == "hello" else kind


def _check(obj: Any, required: Fields, optional: Fields | None, what: str | Callable[[], str]) -> None:
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


def _check_type(value: Any, types: tuple[Any, ...], where: str) -> None:
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
            _check(msg, HELLO_CLIENT, HELLO_CLIENT_OPTIONAL, "hello")
    elif kind == "window":
        _check(msg, WINDOW, WINDOW_OPTIONAL, "window")
        if msg.get("main") is not None:
            _check(msg["main"], {}, MAIN_OPTIONAL, "window.main")
        for i, ld in enumerate(msg["loaders"]):
            _check(ld, LOADER, LOADER_OPTIONAL, partial("window.loaders[{}]".format, i))
            _check(ld["queue"], {}, QUEUE_OPTIONAL, partial("window.loaders[{}].queue".format, i))
            for j, w in enumerate(ld["workers"]):
                _check(w, WORKER, WORKER_OPTIONAL, partial("window.loaders[{}].workers[{}]".format, i, j))
    elif kind == "error":
        _check(msg, ERROR, None, "error")
    elif kind == "profile":
        _check(msg, PROFILE, PROFILE_OPTIONAL, "profile")
        _check_profile_request(msg)
    elif kind == "profile_status":
        _check(msg, PROFILE_STATUS, PROFILE_STATUS_OPTIONAL, "profile_status")
        if msg["state"] not in PROFILE_STATES:
            raise WireError(f"profile_status.state {msg['state'][:40]!r} is not one of {PROFILE_STATES}")
    elif kind in ("profile_result", "worker_profile_result"):
        _check(msg, PROFILE_RESULT, PROFILE_RESULT_OPTIONAL, kind)
    elif kind == "stacks":
        _check(msg, {}, None, kind)
    elif kind == "stacks_result":
        _check(msg, PROFILE_RESULT, STACKS_RESULT_OPTIONAL, kind)
    elif kind == "worker_profile":
        _check(msg, WORKER_PROFILE, WORKER_PROFILE_OPTIONAL, kind)
        if not 0 < msg["seconds"] <= WORKER_PROFILE_MAX_SECONDS:
            raise WireError(f"worker_profile.seconds must be in (0, {WORKER_PROFILE_MAX_SECONDS:g}]")
        hz = msg.get("hz")
        if hz is not None and not 1 <= hz <= WORKER_PROFILE_MAX_HZ:
            raise WireError(f"worker_profile.hz must be 1..{WORKER_PROFILE_MAX_HZ}")
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


def worker_profile_request(seconds: float, hz: int | None = None) -> dict[str, Any]:
    """A monitor's request for a worker profile burst of ``seconds``."""
    msg: dict[str, Any] = {"type": "worker_profile", "seconds": seconds}
    if hz is not None:
        msg["hz"] = hz
    return validate(msg)


def undeclared(msg: dict[str, Any]) -> list[str]:
    """Fields of a valid ``msg`` (and of the records in it) that no schema
    declares: accepted, for forward compatibility, but a field this dlwatch
    sends must be declared (the tests hold every builder to that)."""
    out = [
        f"{message_kind(msg)}.{k}" for k in msg if k != "type" and k not in MESSAGES[message_kind(msg)].fields
    ]

    def nested(obj: Any, record: str, where: str) -> None:
        if isinstance(obj, dict):
            out.extend(f"{where}.{k}" for k in obj if k not in RECORDS[record].fields)

    nested(msg.get("job"), "job", "hello.job")
    nested(msg.get("main"), "main", "window.main")
    for i, ld in enumerate(msg.get("loaders") or ()) if msg.get("type") == "window" else ():
        nested(ld, "loader", f"window.loaders[{i}]")
        nested(ld.get("queue"), "queue", f"window.loaders[{i}].queue")
        for j, w in enumerate(ld.get("workers") or ()):
            nested(w, "worker", f"window.loaders[{i}].workers[{j}]")
    return out


# --- builders ---------------------------------------------------------------
# One per message in MESSAGES: no side builds a message by hand. The job's
# builders do not validate (a window goes out ten times a second); the tests
# check that every builder's output is valid and fully declared.


def client_hello(client: str, every: int | None = None, history_frames: int | None = None) -> dict[str, Any]:
    """A monitor's hello; ``every``: send only every Nth frame (the job
    publishes ten a second); ``history_frames``: replay at most this many
    recent frames (0: none, for a client that only asks for a profile)."""
    hello: dict[str, Any] = {"type": "hello", "protocol": PROTOCOL_VERSION, "client": client}
    if every is not None:
        hello["every"] = every
    if history_frames is not None:
        hello["history_frames"] = history_frames
    return hello


def server_hello(job: dict[str, Any], history: int, features: list[str]) -> dict[str, Any]:
    """The job's answer: who it is, how many history frames follow, and what
    it can do beyond windows (``FEATURE_PROFILE``)."""
    return {
        "type": "hello",
        "protocol": PROTOCOL_VERSION,
        "job": job,
        "history": history,
        "features": features,
    }


def window(
    seq: int, t: float, mono_ns: int, loaders: list[dict[str, Any]], main: dict[str, Any] | None = None
) -> dict[str, Any]:
    """One frame of the job's figures: its loaders (``LOADER``) and its main
    process (``MAIN_OPTIONAL``)."""
    msg: dict[str, Any] = {"type": "window", "seq": seq, "t": t, "mono_ns": mono_ns, "loaders": loaders}
    if main is not None:
        msg["main"] = main
    return msg


def error(message: str) -> dict[str, Any]:
    """Why the peer is about to hang up."""
    return {"type": "error", "message": message}


def profile_status(
    state: str,
    message: str | None = None,
    *,
    steps: int | None = None,
    steps_done: int | None = None,
    loader: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Where a profiler burst is (``PROFILE_STATES``)."""
    msg: dict[str, Any] = {"type": "profile_status", "state": state}
    for key, value in (
        ("steps", steps),
        ("steps_done", steps_done),
        ("loader", loader),
        ("message", message),
    ):
        if value is not None:
            msg[key] = value
    return msg


def profile_result(result: dict[str, Any], error: str | None = None) -> dict[str, Any]:
    """A burst's figures (``diagnose.profile``), or why there are none."""
    msg: dict[str, Any] = {"type": "profile_result", "result": result}
    if error is not None:
        msg["error"] = error
    return msg


def worker_profile_result(
    result: dict[str, Any], error: str | None = None, broadcast: bool = False
) -> dict[str, Any]:
    """A worker profile burst's stacks (``diagnose.worker_profile``), or why
    there are none; ``broadcast``: the copy for the job's other monitors."""
    msg: dict[str, Any] = {"type": "worker_profile_result", "result": result}
    if error is not None:
        msg["error"] = error
    if broadcast:
        msg["broadcast"] = True
    return msg


def stacks_request() -> dict[str, Any]:
    """A monitor's request for the job's stacks (threads and workers)."""
    return validate({"type": "stacks"})


def stacks_result(
    result: dict[str, Any], error: str | None = None, broadcast: bool = False
) -> dict[str, Any]:
    """The job's stacks (``probe/stack_request.py``), or why there are none;
    ``broadcast``: the copy for monitors that did not ask. The fields of a
    worker profile's answer."""
    return {**worker_profile_result(result, error, broadcast), "type": "stacks_result"}


def check_protocol(hello: dict[str, Any]) -> None:
    """Raise WireError when the peer speaks another protocol version."""
    theirs = hello.get("protocol")
    if theirs != PROTOCOL_VERSION:
        raise WireError(
            f"protocol version mismatch: peer speaks {theirs}, this dlwatch speaks "
            f"{PROTOCOL_VERSION}; use the same dlwatch version in the job and the monitor"
        )
