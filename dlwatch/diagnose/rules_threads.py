"""A DataLoader iterated on a producer thread: thread-fed-loader.

Some jobs iterate the DataLoader on a background thread that feeds a queue,
and train on the main thread from the queue. The probe sees the producer:
its time inside ``next()`` (``data_wait_fraction``) and between batches (the
hand-over, e.g. blocked on a full queue). It cannot see the thread that takes
from the queue, so the loader's wait is not the training loop's: the rules
that judge the loop's wait ignore it (facts.fed_by_thread), and this info
hint says what is and is not known. A main thread that is idle (a launcher
or an actor waiting, not training) makes the iterating thread the training
loop, judged like any other.
"""

from __future__ import annotations

from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT

from .facts import Context, fed_by_thread, hint, ms, num, pct, r
from .registry import Rule


def rule_thread_fed_loader(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not lv.steady or not fed_by_thread(lv.loader, lv.job):
            continue
        wait = num(lv.loader.get("data_wait_fraction"))
        if wait is None or wait < DATA_BOUND_WAIT:
            continue
        thread = str(lv.loader["iterated_on"].get("thread") or "?")
        wait_ms, step_ms = num(lv.loader.get("wait_ms_mean")), num(lv.loader.get("step_ms_mean"))
        per_batch = ""
        if wait_ms is not None and step_ms is not None:
            per_batch = f" ({ms(wait_ms)} waiting and {ms(step_ms)} handing on per batch)"
        msg = (
            f"{lv.title} is iterated on thread '{thread}', not the main thread: its figures are that "
            f"producer's. The producer waits for data {pct(wait)} of its time and spends "
            f"{pct(1 - wait)} between batches{per_batch}. Whether the training loop waits depends on "
            f"the queue between them, which dlwatch cannot see: a producer that spends long between "
            f"batches is held up by a full queue (the loop is not waiting); one that waits almost "
            f"always and hands on at once leaves the loop waiting too."
        )
        sugg = (
            "time the training loop's get() from the queue to see its own wait; or iterate the "
            "DataLoader in the training loop (with num_workers > 0 for background loading) so "
            "dlwatch measures the loop's wait itself"
        )
        ev = {
            "iterated_on_thread": thread,
            "producer_wait_fraction": r(wait),
            "producer_wait_ms_mean": r(wait_ms, 1),
            "producer_between_batches_ms_mean": r(step_ms, 1),
            "num_workers": lv.num_workers,
            "training_loop_wait": "unknown: the consuming thread is not visible to the probe",
            "main_thread_cpu_percent": r(num(lv.job.get("main_thread_cpu_percent")), 1),
        }
        out.append(hint("thread-fed-loader", "info", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (Rule("thread-fed-loader", rule_thread_fed_loader, "loader", rate=True),)
