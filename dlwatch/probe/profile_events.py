"""Kineto's events as plain rows, on every torch dlwatch supports (2.1–2.14).

``torch._C._autograd._KinetoEvent`` is a pybind class whose methods come and
go between releases; reading one that a release lacks raised
``AttributeError`` and lost the whole burst (torch 2.11 has no
``activity_type``). So the methods are looked up once per burst on the first
event, and each figure has a fallback that older releases can give:

==================  ==========================  ===================================
figure              best (newest torch)         fallback
==================  ==========================  ===================================
category            ``activity_type()``         ``device_type()`` + ``is_user_annotation()``
                                                (else ``scope()`` == USER_SCOPE) + the name
start               ``start_ns()``              ``start_us()`` x 1000
end                 ``end_ns()``                start + ``duration_ns()`` / ``duration_us()``
thread              ``start_thread_id()``       (none: required)
==================  ==========================  ===================================

Three shapes are known, each read off the real class (``dir()`` of torch
2.1.2+cu121, 2.11.0+cu130 and 2.13.0): 2.1's, ``start_us``/``duration_us``,
``scope`` and ``device_type``, no ``end_ns`` or ``is_user_annotation``
(which came with 2.5); 2.11's (``start_ns``/``end_ns``,
``is_user_annotation``, no ``activity_type``); and 2.13/2.14's
(``activity_type`` as well). Which release first added each method matters
less than that each is looked up: ``tests/unit/test_profile_events.py``
reads an event of each shape, and a bare one without even ``device_type``
or ``scope``.

Without ``activity_type`` two kinds of event need more than the methods:

- a ``record_function`` span on the GPU timeline (``gpu_user_annotation``)
  has ``scope() == 0`` like every event Kineto adds, so before
  ``is_user_annotation`` only its name tells it from a kernel: it bears
  the name of its span on the CPU. Counted as a kernel, such a span covers
  the gaps between its kernels and a launch-bound step reads GPU-busy.
- CUPTI's own bookkeeping ("Activity Buffer Request", "Lazy Function
  Loading", ...) is a CPU event that is no operator of the job's; its
  names are Kineto's fixed list for the ``overhead`` type.

Stdlib only: the burst (``profiler.py``) hands us torch's objects.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

# torch._C._profiler.RecordScope.USER_SCOPE: a record_function span.
USER_SCOPE = 7
STEP_PREFIX = "ProfilerStep#"
# Host-side CUDA runtime/driver calls are CPU events named cudaXxx / cuXxx;
# no aten operator is named so.
_RUNTIME_NAME = re.compile(r"^cu(da)?[A-Z]")
# Kineto's names for CUPTI overhead events (libkineto's ActivityType OVERHEAD;
# the strings are in 2.11's libkineto), which activity_type() calls "overhead".
OVERHEAD_NAMES = frozenset(
    {
        "Unknown",
        "Driver Compiler",
        "Buffer Flush",
        "Instrumentation",
        "Resource",
        "Runtime Triggered Module Loading",
        "Lazy Function Loading",
        "Command Buffer Full",
        "Activity Buffer Request",
        "UVM Activity Init",
    }
)

REQUIRED = ("name", "start_thread_id")


class Unsupported(Exception):
    """This torch's events lack what a burst needs; the message is one line."""


Row = tuple  # (name, category, start_ns, end_ns, thread)


def reader(sample: Any, torch_version: str = "?") -> Callable[[Any], Row]:
    """A function from one event to its row, chosen from what ``sample``
    (an event of this torch) offers. Raises ``Unsupported`` when the event
    has no name, thread or start time at all."""
    have = {a for a in dir(sample) if not a.startswith("_")}
    missing = [a for a in REQUIRED if a not in have]
    if not ({"start_ns", "start_us"} & have):
        missing.append("start_ns/start_us")
    if not ({"end_ns", "duration_ns", "duration_us"} & have):
        missing.append("end_ns/duration_us")
    if missing:
        raise Unsupported(
            f"torch {torch_version}'s profiler events lack {', '.join(missing)}: "
            "profiler bursts need torch 2.1 or newer"
        )
    start = _start(have)
    end = _end(have, start)
    category = _category(have)

    def row(e: Any) -> Row:
        s = start(e)
        return (e.name(), category(e), s, end(e, s), e.start_thread_id())

    return row


def rows(events: Iterable[Any], torch_version: str = "?") -> list[Row]:
    """Every event as a row (``reader`` chosen on the first)."""
    out: list[Row] = []
    read: Callable[[Any], Row] | None = None
    for e in events:
        if read is None:
            read = reader(e, torch_version)
        out.append(read(e))
    # A device event named as a CPU annotation is that annotation's GPU span
    # (needed where neither activity_type nor is_user_annotation says so).
    marks = {r[0] for r in out if r[1] == "user_annotation"}
    return [(r[0], "gpu_user_annotation", *r[2:]) if r[1] == "kernel" and r[0] in marks else r for r in out]


def _start(have: set[str]) -> Callable[[Any], int]:
    if "start_ns" in have:
        return lambda e: int(e.start_ns())
    return lambda e: int(e.start_us()) * 1000


def _end(have: set[str], start: Callable[[Any], int]) -> Callable[[Any, int], int]:
    if "end_ns" in have:
        return lambda e, s: int(e.end_ns())
    if "duration_ns" in have:
        return lambda e, s: s + int(e.duration_ns())
    return lambda e, s: s + int(e.duration_us()) * 1000


def _category(have: set[str]) -> Callable[[Any], str]:
    fallback = _category_from_methods(have)
    if "activity_type" in have:

        def best(e: Any) -> str:
            # Kineto's own names: "cpu_op", "user_annotation", "kernel", ...;
            # should a release give its enum's number instead, the fallback.
            kind = e.activity_type()
            return kind if isinstance(kind, str) else fallback(e)

        return best
    return fallback


def _category_from_methods(have: set[str]) -> Callable[[Any], str]:
    if "is_user_annotation" in have:

        def annotation(e: Any) -> bool:
            return bool(e.is_user_annotation())
    elif "scope" in have:

        def annotation(e: Any) -> bool:
            return _scope_int(e.scope()) == USER_SCOPE
    else:

        def annotation(e: Any) -> bool:
            return False

    on_device = _device_test(have)

    def category(e: Any) -> str:
        name = e.name()
        if on_device(e):
            if annotation(e) or name.startswith(STEP_PREFIX):
                return "gpu_user_annotation"
            if name.startswith("Memcpy"):
                return "gpu_memcpy"
            if name.startswith("Memset"):
                return "gpu_memset"
            return "kernel"
        if annotation(e) or name.startswith(STEP_PREFIX):
            return "user_annotation"
        if name in OVERHEAD_NAMES:
            return "overhead"
        if _RUNTIME_NAME.match(name):
            return "cuda_runtime"
        return "cpu_op"

    return category


def _device_test(have: set[str]) -> Callable[[Any], bool]:
    if "device_type" not in have:
        return lambda e: False

    def on_device(e: Any) -> bool:
        d = e.device_type()
        name = getattr(d, "name", None) or str(d).rsplit(".", 1)[-1]
        return name.upper() != "CPU"

    return on_device


def _scope_int(scope: Any) -> int | None:
    try:
        return int(scope)
    except (TypeError, ValueError):
        return None
