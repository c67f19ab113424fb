"""A loader fed to the loop by another thread: thread-fed-loader.

The wait that matters is the training thread's ``next()``. When a loader is
iterated on a feeder thread and its batches reach the loop through a
``queue.Queue``, the probe times the loop's side of the queue and the
loader's figures are the loop's (collect/loop_role.py: ``loop``); the feeder's
own are kept apart and no rule reads them. When the hand-over is not seen
(``feeder``: a deque, a future, a custom buffer), the loop's wait is n/a: this
info hint says so, with the feeder's figures for what they are, and the one
line that fixes it (``dlwatch.watch``).
"""

from __future__ import annotations

from typing import Any

from .facts import Context, as_dict, hint, ms, num, pct, r, window_phrase
from .registry import Rule


def rule_feeder_not_the_loop(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if lv.loader.get("loop_role") != "feeder":
            continue
        fd = as_dict(lv.loader.get("feeder"))
        thread = str(fd.get("thread") or "?")
        wait = num(fd.get("wait_fraction"))
        wait_ms, hand_ms = num(fd.get("wait_ms_mean")), num(fd.get("handover_ms_mean"))
        figures = ""
        if wait is not None:
            figures = f" That thread waits for data {pct(wait)} of its time{window_phrase(lv)}"
            if wait_ms is not None and hand_ms is not None:
                figures += f" ({ms(wait_ms)} per batch, then {ms(hand_ms)} handing it on)"
            figures += ": the feeder's figure, not the loop's."
        msg = (
            f"{lv.title} is iterated on thread '{thread}', not the training thread, and its batches "
            f"reach the loop some way dlwatch does not see, so the loop's own wait is not known.{figures}"
        )
        sugg = (
            "wrap what the training loop iterates with dlwatch.watch(...) (one line) so the loop's wait "
            "is measured where it takes each batch; a queue.Queue between the threads is found without it"
        )
        ev = {
            "feeder_thread": thread,
            "feeder_wait_fraction": r(wait),
            "feeder_wait_ms_mean": r(wait_ms, 1),
            "feeder_handover_ms_mean": r(hand_ms, 1),
            "loop_wait": "n/a: the consumer's next() is not visible to the probe",
            "train_threads": [
                t.get("thread") for t in lv.job.get("train_threads") or [] if isinstance(t, dict)
            ],
        }
        out.append(hint("thread-fed-loader", "info", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (Rule("thread-fed-loader", rule_feeder_not_the_loop, "loader"),)
