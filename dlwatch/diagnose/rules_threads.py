"""Which thread trains, and what it takes its batches from: thread-fed-loader,
loop-off-its-loaders.

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

from .facts import Context, LoaderView, as_dict, hint, ms, num, pct, r, window_phrase
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


# The training thread stepped this many times more often than its loaders
# delivered batches, all told: not gradient accumulation (fewer steps than
# batches), not a GAN's two optimizers (two steps a batch).
OFF_LOADER_STEP_RATIO = 3.0
OFF_LOADER_MIN_STEPS = 50


def _delivering(lv: LoaderView) -> bool:
    """Whether the loader has an iterator in an open epoch."""
    return lv.loader.get("active") is not False and lv.loader.get("epoch_open") is not False


def rule_loop_off_its_loaders(ctx: Context) -> list[dict[str, Any]]:
    """A training thread that keeps stepping the optimizer while none of the
    loaders it iterated has an iterator: it trains on batches that come from
    elsewhere, and those loaders' figures are from their last batches. The
    classic: ``itertools.cycle(loader)``, which replays the first epoch's
    batches from memory once it is exhausted (a QA run: 1201 steps on 16
    batches, the view still showing the first epoch's 54 % wait)."""
    out = []
    for job in ctx.live_jobs:
        views = [lv for lv in ctx.loaders if lv.job is job and lv.loader.get("loop_role", "loop") == "loop"]
        for t in job.get("train_threads") or []:
            if not isinstance(t, dict) or not isinstance(t.get("steps"), int):
                continue
            mine = [
                lv
                for lv in views
                if as_dict(lv.loader.get("iterated_on")).get("thread") == t.get("thread")
                and as_dict(lv.loader.get("iterated_on")).get("main") == t.get("main")
            ]
            # An iterator alive after its epoch ended (Grain's, nodes' after
            # StopIteration: active, epoch_open false) delivers nothing either
            # (a QA run: 3370 steps on 300 batches of Grain, no hint).
            if not mine or any(_delivering(lv) for lv in mine):
                continue
            batches = sum(int(num(lv.loader.get("batches_total")) or 0) for lv in mine)
            steps = t["steps"]
            if batches <= 0 or steps < OFF_LOADER_MIN_STEPS or steps < OFF_LOADER_STEP_RATIO * batches:
                continue
            lv = max(mine, key=lambda v: num(v.loader.get("batches_total")) or 0)
            ids = ", ".join(str(v.lid) for v in mine)
            which = f"loader {ids}" if len(mine) == 1 else f"loaders {ids}"
            it = "it" if len(mine) == 1 else "they"
            msg = (
                f"Thread '{t.get('thread')}' of PID {lv.pid} has stepped the optimizer {steps} times, while "
                f"{which} delivered {batches} batches in all, and none has an epoch open now: the loop "
                f"trains on batches that come from somewhere else, and the figures shown are from the last "
                f"batches {it} delivered. itertools.cycle(loader) does this: after the first pass it replays "
                f"that pass's batches from memory, in the same order, without a new shuffle or new "
                f"augmentation."
            )
            sugg = (
                "to go over a loader again, start a new epoch (`while True: for batch in loader: ...`, or a "
                "generator that does that), not itertools.cycle(loader); if the loop takes its batches from "
                "something else on purpose, wrap that with dlwatch.watch(...) so its wait is measured"
            )
            ev = {
                "thread": t.get("thread"),
                "optimizer_steps": steps,
                "loader_batches_total": batches,
                "loaders": [v.lid for v in mine],
                "steps_per_batch": r(steps / batches, 1),
            }
            out.append(hint("loop-off-its-loaders", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (
    Rule("thread-fed-loader", rule_feeder_not_the_loop, "loader"),
    Rule("loop-off-its-loaders", rule_loop_off_its_loaders, "loader"),
)
