"""straggler-rank: one rank's input pipeline holds back every rank of its run.

In data-parallel training (torchrun, DDP) every rank meets the others at the
gradient all-reduce of each step. A rank whose loader is slow arrives last:
it shows data wait; the others arrive early and wait inside the collective,
which the probe counts as their step (the loop's time between batches), so
they show long "compute" and no data wait. Each rank's own figures then
point at nothing; side by side they name the rank to fix.

A monitor sees the ranks on its own machine, or, with ``dlwatch --host``,
the ranks of every host it reads (collect/merge.py judges this rule on the
merged snapshot, where each job carries its ``host``): a run whose other
ranks are out of sight is judged on the ranks seen.
"""

from __future__ import annotations

from typing import Any

from dlwatch.snapshot import run_key
from dlwatch.thresholds import WORKERS_SATURATED_BUSY

from .facts import Context, LoaderView, as_int, hint, median, ms, num, pct, r
from .registry import Rule

# The straggler waits for data at least this much of its loop: the threshold
# at which a single job's loader is data-bound (rules_workers.DATA_BOUND_WAIT).
STRAGGLER_MIN_WAIT = 0.10
# ... and each other rank waits at most this share of the straggler's wait:
# ranks that all wait alike are a shared problem (the same storage, too few
# cores), and their own hints say so.
OTHERS_MAX_WAIT_SHARE = 0.5
# Ranks in lockstep take batches at the same rate; more than 20 % apart they
# are not meeting at a collective every step (independent jobs, or one rank
# skipping steps), and their step times cannot be compared.
SAME_RATE_TOLERANCE = 0.20
# What the others lose (their step above the fastest rank's) must be a
# visible share of their time, and account for at least half of the
# straggler's wait per batch (the rest may be lost elsewhere: unequal
# batches, the collective's own cost).
MIN_LOST_SHARE = 0.10
MIN_LOSS_OF_WAIT = 0.5
# ... and the others' workers have headroom: busy under the saturation bar.
# Two ranks whose loaders are equally at capacity take turns at arriving last
# (the phase of two equal pipelines decides which one waits in next() and
# which in the collective): a QA run with 1 worker per rank, both 100 % busy,
# named rank 1, then rank 0, then rank 1 again, and making rank 1's samples
# 3x cheaper gained 5 %.
OTHERS_MAX_BUSY = WORKERS_SATURATED_BUSY


def _primary(views: list[LoaderView]) -> LoaderView | None:
    """The loader a rank trains from: the steady one moving the most batches."""
    steady = [lv for lv in views if lv.steady and num(lv.loader.get("batches_per_s")) is not None]
    if not steady:
        return None
    return max(steady, key=lambda lv: num(lv.loader.get("batches_per_s")) or 0.0)


def _runs(ctx: Context) -> dict[tuple[str, str], list[dict[str, Any]]]:
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for job in ctx.live_jobs:
        key = run_key(job)
        if key is not None and as_int(job.get("rank")) is not None:
            runs.setdefault(key, []).append(job)
    return runs


def _pipeline(lv: LoaderView) -> str:
    parts = [f"loader {lv.lid}", f"num_workers={lv.num_workers}"]
    if lv.busy_mean is not None:
        parts.append(f"workers {pct(lv.busy_mean)} busy")
    if lv.cpu_mean is not None and lv.workers:
        parts.append(f"{lv.cpu_sum:.1f} cores of worker CPU")
    return ", ".join(parts)


def _on(job: dict[str, Any]) -> str:
    """ " on HOST" for a job of a multi-host view; "" on one machine."""
    host = job.get("host")
    return f" on {host}" if isinstance(host, str) and host else ""


def rule_straggler_rank(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for (run_id, _master), jobs in _runs(ctx).items():
        if len(jobs) < 2:
            continue
        ranks = []
        for job in jobs:
            lv = _primary(ctx.loaders_of(int(job["pid"])))
            if lv is None or lv.wait is None or lv.step_ms is None:
                break
            rate = num(lv.loader.get("batches_per_s"))
            wait_ms = num(lv.loader.get("wait_ms_mean"))
            if rate is None or rate <= 0 or wait_ms is None:
                break
            ranks.append((as_int(job.get("rank")), lv, rate, wait_ms))
        else:
            hit = _judge(run_id, jobs, ranks)
            if hit is not None:
                out.append(hit)
    return out


def _judge(run_id: str, jobs: list[dict[str, Any]], ranks: list[tuple[Any, ...]]) -> dict[str, Any] | None:
    rates = [rate for _, _, rate, _ in ranks]
    if max(rates) > min(rates) * (1 + SAME_RATE_TOLERANCE):
        return None
    rank, slow, _, slow_wait_ms = max(ranks, key=lambda x: x[1].wait)
    others = [x for x in ranks if x[1] is not slow]
    if slow.wait < STRAGGLER_MIN_WAIT or any(o[1].wait > slow.wait * OTHERS_MAX_WAIT_SHARE for o in others):
        return None
    if any(o[1].busy_mean is not None and o[1].busy_mean >= OTHERS_MAX_BUSY for o in others):
        return None
    fastest = min(x[1].step_ms for x in ranks)
    other_step = median(o[1].step_ms for o in others)
    other_cycle = median(o[1].step_ms + o[3] for o in others)
    if other_step is None or other_cycle is None or other_cycle <= 0:
        return None
    lost = other_step - fastest
    if lost < MIN_LOSS_OF_WAIT * slow_wait_ms or lost / other_cycle < MIN_LOST_SHARE:
        return None
    names = ", ".join(f"rank {o[0]}{_on(o[1].job)}" for o in sorted(others, key=lambda o: o[0]))
    world = as_int(slow.job.get("world_size"))
    msg = (
        f"Rank {rank} (PID {slow.pid}{_on(slow.job)}) holds back run {run_id}: "
        f"its loop waits {pct(slow.wait)} of its time for data ({ms(slow_wait_ms)} a batch), while {names} "
        f"{'wait' if len(others) > 1 else 'waits'} only {pct(max(o[1].wait for o in others))} but "
        f"take{'' if len(others) > 1 else 's'} {ms(other_step)} a step against {ms(fastest)} of compute "
        f"on the fastest rank: {ms(lost)} a step ({pct(lost / other_cycle)} of their time) spent "
        f"waiting for rank {rank} at the collective."
    )
    if world is not None and world > len(jobs):
        where = "in sight" if any(_on(j) for j in jobs) else "on this machine"
        msg += f" Only the {len(jobs)} of {world} ranks {where} are compared."
    sugg = (
        f"speed up rank {rank}'s input pipeline first (PID {slow.pid}{_on(slow.job)}, {_pipeline(slow)}): "
        f"follow the hints of PID {slow.pid}; every rank of the run steps at its pace"
    )
    ev = {
        "run_id": run_id,
        "slow_rank": rank,
        "slow_pid": slow.pid,
        "slow_host": slow.job.get("host"),
        "data_wait_fraction": r(slow.wait),
        "wait_ms_mean": r(slow_wait_ms, 1),
        "step_ms_mean": r(slow.step_ms, 1),
        "fastest_compute_ms": r(fastest, 1),
        "others_step_ms_median": r(other_step, 1),
        "others_lost_ms_per_step": r(lost, 1),
        "others_lost_fraction": r(lost / other_cycle),
        "num_workers": slow.num_workers,
        "ranks": [
            {
                "rank": rk,
                "pid": lv.pid,
                "host": lv.job.get("host"),
                "loader_id": lv.lid,
                "data_wait_fraction": r(lv.wait),
                "step_ms_mean": r(lv.step_ms, 1),
                "batches_per_s": r(rate, 2),
            }
            for rk, lv, rate, _ in sorted(ranks, key=lambda x: x[0])
        ],
        "ranks_seen": len(jobs),
        "world_size": world,
    }
    return hint("straggler-rank", "warn", slow.pid, slow.lid, msg, sugg, ev)


RULES = (Rule("straggler-rank", rule_straggler_rank, "loader", rate=True),)
