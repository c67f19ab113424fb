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

Three shapes are known (torch's own stub ``torch/_C/_autograd.pyi`` in
public copies, and the classes themselves where we could run them): the
2.0/2.1 kind, ``start_us``/``duration_us`` with ``start_ns``/``duration_ns``
beside them and no ``end_ns`` or ``is_user_annotation``; the kind that
2.11 has (``start_ns``/``end_ns``, ``is_user_annotation``, no
``activity_type``; field report from a 2.11.0+cu130 box); and 2.13/2.14.1's
(``activity_type`` as well; run here on real bursts). Which release first
added each method matters less than that each is looked up:
``tests/unit/test_profile_events.py`` reads an event of each shape, and a
bare one without even ``device_type`` or ``scope``.

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
    return out


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
    if "activity_type" in have:
        # Kineto's own names: "cpu_op", "user_annotation", "kernel", ...
        return lambda e: str(e.activity_type())
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
