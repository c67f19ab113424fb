"""Loaders one training loop takes from together: ``zip(labeled, unlabeled)``,
FixMatch's two iterators, a multi-task round robin, a validation pass run
every N steps inside the loop.

Pure: from the job's loader dicts as collect/model.py builds them. Each such
loader's own figures are right (its ``next()``'s wait over its own cycles),
but none of them is the loop's: the thread waits for each in turn. So the
loop's wait is what each makes it wait per second of the window, summed:
``wait_ms_mean × batches_per_s``. A QA run of ``zip`` over two slow loaders:
1.0 % + 79.4 % of the loop, its own meter 80.4 %. A validation pass every 30
steps: 40.9 % + 22.3 %, the meter 64.5 %, where the validation loader's own
figure, 87.6 %, is of its own cycles, not of the loop's time.

A group is the loaders that the same thread iterates as the loop (role
``loop``), each with an open epoch and batches in its window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dlwatch.snapshot import num, set_aside


def _thread(ld: Mapping[str, Any]) -> tuple[str, bool] | None:
    on = ld.get("iterated_on")
    if not isinstance(on, Mapping) or not isinstance(on.get("main"), bool):
        return None
    return str(on.get("thread") or "?"), bool(on["main"])


def share(ld: Mapping[str, Any]) -> float | None:
    """The fraction of the window the loop spent in this loader's ``next()``."""
    wait, rate = num(ld.get("wait_ms_mean")), num(ld.get("batches_per_s"))
    if wait is None or rate is None:
        return None
    return min(1.0, max(0.0, wait) * max(0.0, rate) / 1000.0)


def _in_a_loop(ld: Mapping[str, Any]) -> bool:
    return (
        ld.get("loop_role", "loop") == "loop"
        and ld.get("consumer") is None  # a queue's get() is the loop's side already
        and num(ld.get("data_wait_fraction")) is not None
        and (num(ld.get("batches_per_s")) or 0.0) > 0
        and ld.get("active") is not False
        and ld.get("epoch_open") is not False
    )


def loops(loaders: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One entry per thread that takes from two loaders or more:
    ``{"thread", "main", "loaders": [ids], "shares": [each one's part of the
    loop's time], "data_wait_fraction"}``, the last their sum (capped at 1).
    Empty when every loop has one loader."""
    by_thread: dict[tuple[str, bool], list[tuple[Mapping[str, Any], float]]] = {}
    for ld in loaders:
        on, part = _thread(ld), share(ld)
        if on is not None and part is not None and _in_a_loop(ld) and not set_aside(ld, loaders):
            by_thread.setdefault(on, []).append((ld, part))
    out = []
    for (thread, main), group in by_thread.items():
        if len(group) < 2:
            continue
        out.append(
            {
                "thread": thread,
                "main": main,
                "loaders": [ld.get("id") for ld, _ in group],
                "shares": [round(part, 4) for _, part in group],
                "data_wait_fraction": round(min(1.0, sum(part for _, part in group)), 4),
            }
        )
    return out


def describe(loop: Mapping[str, Any]) -> str:
    """ "loop on thread 'MainThread' takes from loaders 0 and 1: data wait
    80.4 % (1.0 % + 79.4 %)": the line the views show above the loaders' own
    figures, each loader's part of the loop's time in brackets."""
    ids = [str(i) for i in loop.get("loaders") or []]
    parts = [f"{100 * x:.1f} %" for x in loop.get("shares") or [] if num(x) is not None]
    names = (", ".join(ids[:-1]) + f" and {ids[-1]}") if len(ids) > 1 else "".join(ids) or "?"
    total = num(loop.get("data_wait_fraction"))
    said = "n/a" if total is None else f"{100 * total:.1f} %"
    brackets = f" ({' + '.join(parts)})" if len(parts) == len(ids) else ""
    return (
        f"loop on thread '{loop.get('thread') or '?'}' takes from loaders {names}: data wait {said}{brackets}"
    )
