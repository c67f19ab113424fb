"""The ceiling on any loader fix: how fast the loop runs when data is free.

A loop that waits for data a fraction ``w`` of its time runs at most
``1 / (1 − w)`` times faster if the wait disappears: its own work per batch
is unchanged. Whatever model predicts a worker-count hint's
``expected_speedup``, the promise is bounded by that, or by the ceiling
``dlwatch tune`` measured by replaying cached batches when one is at hand.

``bound`` is applied once to every hint after the rules ran (engine), so the
rules' own models stay as they are; a hint that promised more says what it
was bounded by.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .facts import r

# The step as measured now: on a CPU box where the step shares the cores
# with loading, data for free also speeds the step, and tune's measured
# ceiling can be well above this (rules_workers._loading_free_phrase).
ESTIMATE = "estimate: 1 / (1 − data wait), the step at its present pace"
MEASURED = "measured: dlwatch tune, batches replayed"
# The wording of capacity.Prediction.phrase() (and of every rule that states a
# gain: the parenthesis is optional), rewritten when bounded.
_PHRASE = re.compile(r"expected ≈ [0-9.]+× throughput( \([^)]*\))?")
# Under this a promise is not worth a warning (rules_workers.MIN_WORTHWHILE_SPEEDUP).
_WORTHWHILE = 1.10


def estimate(wait: float | None) -> float | None:
    """The ceiling from a window's data-wait fraction (None when unknown)."""
    if wait is None or not 0.0 <= wait < 1.0:
        return None
    return 1.0 / (1.0 - wait)


def bound(h: dict[str, Any], wait: float | None, measured: float | None = None) -> dict[str, Any]:
    """``h`` with its ``expected_speedup`` at most the ceiling: ``measured``
    (a tune result's ceiling speed-up) if given, else the estimate from
    ``wait``. Hints without a promise come back as they are."""
    ev = h.get("evidence")
    if not isinstance(ev, Mapping):
        return h
    promised = ev.get("expected_speedup")
    if isinstance(promised, bool) or not isinstance(promised, (int, float)):
        return h
    ceiling, method = (measured, MEASURED) if measured else (estimate(wait), ESTIMATE)
    if ceiling is None:
        return h
    out = dict(h)
    out["evidence"] = dict(ev, speedup_ceiling=r(ceiling, 2), speedup_ceiling_method=method)
    if promised <= ceiling:
        return out
    out["evidence"].update(expected_speedup=r(ceiling, 2), expected_speedup_unbounded=promised)
    said = f"expected ≈ {ceiling:.2f}× throughput (the ceiling: the loop's pace if data were free, {method})"
    msg = str(out.get("message", ""))
    out["message"] = _PHRASE.sub(said, msg) if _PHRASE.search(msg) else msg
    if ceiling < _WORTHWHILE and out.get("severity") == "warn":
        out["severity"] = "info"
    return out


def bound_in(
    h: dict[str, Any], loaders: Mapping[Any, float | None], measured: Mapping[Any, float] | None = None
) -> dict[str, Any]:
    """``bound`` for a hint of the engine: its loader's wait (``loaders``:
    (job_pid, loader_id) -> data-wait fraction) and, if any, a measured
    ceiling for that loader (same keys)."""
    key = (h.get("job_pid"), h.get("loader_id"))
    return bound(h, loaders.get(key), (measured or {}).get(key))
