"""Hints for attached jobs (``dlwatch attach``): no-workers and
sampled-worker-count, from shares of stack samples instead of per-batch times.

An attached job has no batch clock: its loader carries the share of the
training thread's samples inside ``__next__`` (the data wait ``w``) and, with
workers, the pooled share of the workers' samples inside the dataset fetch
(``b``), each with a 95 % interval. Little's law still holds in shares: per
batch the loop computes ``(1 - w)`` of a period and the ``n`` workers spend
``n·b`` periods fetching, so keeping up needs ``n·b / (1 - w)`` workers
(``w / (1 - w)`` with no workers: the loop's own loading is the work).
Evaluated at both ends of the intervals, that gives the estimate's range.

Only the rules whose inputs exist speak for an attached job
(``SAMPLED_RULE_IDS``); the engine silences the rest.
"""

from __future__ import annotations

import math
from typing import Any

from dlwatch.thresholds import (
    CPU_BOUND_MIN_SHARE,
    DATA_BOUND_WAIT,
    IO_MAX_RECOMMENDED_WORKERS,
    WORKERS_SATURATED_BUSY,
)

from . import capacity
from .facts import (
    Context,
    LoaderView,
    as_dict,
    as_list,
    cores,
    count_of,
    hint,
    num,
    pct,
    plural,
    r,
    setting,
    whole_cores,
)
from .registry import Rule

# Rules whose inputs an attached job has: the two here, and those that read
# only /proc and host figures (cores, threads, memory, /dev/shm).
SAMPLED_RULE_IDS = frozenset(
    {
        "no-workers",
        "sampled-worker-count",
        "workers-oversubscribe-cores",
        "worker-thread-oversubscription",
        "worker-memory-growth",
        "shm-low",
    }
)


def is_sampled(lv: LoaderView) -> bool:
    return lv.loader.get("sampled") is True


def _bounds(fraction: float | None, ci: Any) -> tuple[float, float, float] | None:
    ci = as_list(ci)
    lo, hi = (num(ci[0]), num(ci[1])) if len(ci) == 2 else (None, None)
    if fraction is None or lo is None or hi is None:
        return None
    return fraction, lo, hi


def _needed(work: float, wait: float) -> float:
    """Workers to keep up: work per batch over the loop's compute per batch."""
    compute = 1.0 - wait
    if compute <= 0:
        return float(IO_MAX_RECOMMENDED_WORKERS)
    return min(work / compute, float(IO_MAX_RECOMMENDED_WORKERS))


# A tenth of a worker is within the shares' noise: 2.04 workers needed is
# a recommendation of 2, not 3 (the job of docs/attach.md's example needs exactly 2).
SLACK_WORKERS = 0.1


def _count(ratio: float) -> int:
    return max(1, math.ceil(ratio - SLACK_WORKERS))


def estimate(nw: int, busy: Any, wait: Any) -> dict[str, Any]:
    """Workers needed, from (share, low, high) of the workers' busy share
    (ignored when ``nw`` is 0) and of the data wait."""

    def work(b: float, w: float) -> float:
        return nw * b if nw else w

    ratio = _needed(work(busy[0] if nw else 0.0, wait[0]), wait[0])
    low = _needed(work(busy[1] if nw else 0.0, wait[1]), wait[1])
    high = _needed(work(busy[2] if nw else 0.0, wait[2]), wait[2])
    return {
        "workers_needed": round(ratio, 2),
        "recommended_num_workers": _count(ratio),
        "range": [_count(low), _count(high)],
    }


def span(est: dict[str, Any]) -> str:
    """The estimate's range of worker counts, "3–5"."""
    lo, hi = est["range"]
    return f"{lo}–{hi}"


def capped(est: dict[str, Any], cap: int | None, rec: int, why: str) -> str:
    """The end of a sampled hint's message: ``why`` when the free cores cut
    the estimate down to ``rec``, and the full stop."""
    return (why if cap is not None and rec < est["recommended_num_workers"] else "") + "."


def _wait(lv: LoaderView) -> tuple[float, float, float] | None:
    return _bounds(lv.wait, lv.loader.get("data_wait_ci95"))


def _sampling_evidence(lv: LoaderView) -> dict[str, Any]:
    return {
        "sampled": True,
        "data_wait_fraction": r(lv.wait),
        "data_wait_pm": r(num(lv.loader.get("data_wait_pm"))),
        "data_wait_samples": lv.loader.get("data_wait_samples"),
    }


def _pm(lv: LoaderView) -> str:
    pm = num(lv.loader.get("data_wait_pm"))
    return "" if pm is None else f" ± {pm * 100:.0f} points"


def _cap(ctx: Context, lv: LoaderView, released: float = 0.0) -> int | None:
    got = capacity.free_cores_for(ctx, lv, released)
    return None if got is None else max(1, whole_cores(got[0]))


def rule_sampled_worker_count(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not is_sampled(lv) or not lv.num_workers or not lv.steady:
            continue
        wait = _wait(lv)
        pooled = as_dict(lv.loader.get("workers_busy"))
        busy = _bounds(num(pooled.get("fraction")), pooled.get("ci95"))
        if wait is None or busy is None or wait[0] < DATA_BOUND_WAIT or busy[0] < WORKERS_SATURATED_BUSY:
            continue
        nw = lv.num_workers
        est = estimate(nw, busy, wait)
        rec = est["recommended_num_workers"]
        if rec <= nw:
            continue
        share = lv.cpu_share_of_busy
        cpu_bound = share is not None and share >= CPU_BOUND_MIN_SHARE
        cap = _cap(ctx, lv) if cpu_bound else None
        if cap is not None:
            rec = max(nw, min(rec, cap))
        if rec <= nw:
            continue  # CPU-bound with no core free: more workers cannot help
        samples = f"{lv.loader.get('data_wait_samples')} and {count_of(pooled.get('samples'), 'sample')}"
        msg = (
            f"{lv.title} waits for data {pct(wait[0])}{_pm(lv)} of the time and its "
            f"{count_of(nw, 'worker')} {plural(nw, 'is')} busy {pct(busy[0])} inside the dataset fetch "
            f"(sampled from outside: {samples}): keeping up needs about {est['workers_needed']:.1f} "
            f"workers ({span(est)} within the sampling's 95 % intervals)"
        )
        msg += capped(est, cap, rec, f", and the free cores ({cores(cap)}) allow {rec}")
        sugg = f"set {setting(lv.loader, 'num_workers', rec)}"
        ev = (
            _sampling_evidence(lv)
            | est
            | {
                "num_workers": nw,
                "worker_busy_fraction": r(busy[0]),
                "worker_busy_samples": pooled.get("samples"),
                "cpu_bound": cpu_bound,
                "core_cap": cap,
                "usable_cores": ctx.usable_cores,
            }
        )
        ev["recommended_num_workers"] = rec
        out.append(hint("sampled-worker-count", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (
    # Between add-workers and io-bound.
    Rule("sampled-worker-count", rule_sampled_worker_count, "loader", rate=True, worker_count_rank=3),
)
