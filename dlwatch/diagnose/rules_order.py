"""Head-of-line blocking of an in-order loader: head-of-line-blocking.

With ``in_order=True`` (the default) a DataLoader hands out batches in
sampler order: when the next batch in line is slow (one slow sample: a huge
image, a cold file), the loop waits for it while batches that finished after
it sit ready in the reorder buffer, and the other workers get no new indices
until it arrives. The probe samples, about ten times a second, whether the
loop is inside ``next()`` while that buffer holds a batch
(``head_of_line_fraction``: the share of the loop's time so spent). With
``in_order=False`` (torch >= 2.6) the loop would take a ready batch instead:
that time is what it would gain, as long as the workers keep up.
"""

from __future__ import annotations

from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT, WORKERS_SATURATED_BUSY

from .facts import Context, hint, ms, num, pct, r, window_phrase
from .registry import Rule
from .rules_workers import MIN_WORTHWHILE_SPEEDUP

# Share of the loop's time blocked behind the head of the line from which
# the hint shows: below it the gain is within the noise of a real job.
HOL_MIN_FRACTION = 0.05
# A fetch-time tail is "slow samples" when some worker's p99 is this many
# times its median: rare slow batches, not uniformly slow ones.
TAIL_RATIO = 3.0


def _tail(workers: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], float | None, Any]:
    """Each worker's p50/p95/p99, the largest p99/p50 ratio and whose it is
    (the message names that worker with that ratio, not another's)."""
    rows = []
    worst: float | None = None
    worst_id: Any = None
    for w in workers:
        p50, p95, p99 = (num(w.get(k)) for k in ("fetch_ms_p50", "fetch_ms_p95", "fetch_ms_p99"))
        if p50 is None or p99 is None or p50 <= 0:
            continue
        rows.append({"id": w.get("id"), "p50_ms": r(p50, 1), "p95_ms": r(p95, 1), "p99_ms": r(p99, 1)})
        ratio = p99 / p50
        if worst is None or ratio > worst:
            worst, worst_id = ratio, w.get("id")
    return rows, worst, worst_id


def predicted_speedup(hol: float, bps: float | None, worker_ms: float | None, nw: int) -> float:
    """Throughput with in_order=False over now: the blocked time goes, but
    the loop cannot run faster than the workers deliver."""
    after = 1.0 - hol
    if bps and bps > 0 and worker_ms and nw > 0:
        per_batch_now_ms = 1e3 / bps
        after = max(after, (worker_ms / nw) / per_batch_now_ms)
    return max(1.0, 1.0 / max(after, 1e-9))


def rule_head_of_line_blocking(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        nw = lv.num_workers or 0
        if not lv.steady or nw < 2 or lv.loader.get("in_order") is not True:
            continue
        hol = num(lv.loader.get("head_of_line_fraction"))
        if hol is None or hol < HOL_MIN_FRACTION:
            continue
        if lv.wait is None or lv.wait < DATA_BOUND_WAIT:
            continue
        # Saturated workers leave later batches ready for a plain lack of
        # throughput: that is the worker-count rules' case, not this one's.
        if lv.busy_mean is None or lv.busy_mean >= WORKERS_SATURATED_BUSY:
            continue
        rows, worst, worst_id = _tail(lv.workers)
        if worst is None or worst < TAIL_RATIO:
            continue
        bps = num(lv.loader.get("batches_per_s"))
        speedup = predicted_speedup(hol, bps, lv.worker_ms, nw)
        worth = speedup >= MIN_WORTHWHILE_SPEEDUP
        tail = "; ".join(
            f"worker {x['id']}: {ms(x['p50_ms'])} / {ms(x['p95_ms'])} / {ms(x['p99_ms'])}" for x in rows
        )
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the time{window_phrase(lv)}, and {pct(hol)} "
            f"of the time it waits "
            f"for the next batch in line while later batches sit ready: a rare slow sample holds up the "
            f"in-order delivery (fetch time p50 / p95 / p99 per batch: {tail}; worker "
            f"{worst_id}'s p99 is {worst:.0f}× its median). Its workers are busy only "
            f"{pct(lv.busy_mean)} of the time. With in_order=False: expected ≈ {speedup:.2f}× "
            f"throughput (the blocked time goes)."
        )
        if not worth:
            msg += f" Under {pct(MIN_WORTHWHILE_SPEEDUP - 1)} gain, so this is only worth knowing."
        sugg = (
            "DataLoader(..., in_order=False) if the order of batches within an epoch does not matter "
            "(the epoch still holds the same samples; a slow one just arrives later); or make the "
            "slow samples cheaper (pre-resize the outliers, cache them)"
        )
        ev = {
            "data_wait_fraction": r(lv.wait),
            "head_of_line_fraction": r(hol),
            "num_workers": nw,
            "in_order": True,
            "worker_busy_fraction": r(lv.busy_mean),
            "fetch_ms_tail": rows,
            "tail_ratio_p99_p50": r(worst, 1),
            "batches_per_s": r(bps),
            "worker_ms_per_batch": r(lv.worker_ms, 1),
            "expected_speedup": r(speedup, 2),
            "expected_batches_per_s": r(bps * speedup if bps else None, 2),
        }
        out.append(hint("head-of-line-blocking", "warn" if worth else "info", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (Rule("head-of-line-blocking", rule_head_of_line_blocking, "loader", rate=True),)
