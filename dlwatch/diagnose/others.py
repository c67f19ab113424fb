"""When other processes decide the best worker count, said once and held.

On a box that other work keeps busy, the cores a loader's CPU-bound workers
get depend on what those processes do from one second to the next: the
kernel shares a core among runnable threads, so one more worker takes more
of the cores from the others, and the cycle model's "cores the job can have"
moves with their load. Field case (issue 32: the demo's data-bound scenario
on a 2-core box at load 3.5–7): the oversubscription hint said "nothing to
lower" (≈ 1.06×), "lower num_workers=0" (≈ 1.11×…1.65×), then "nothing to
change" (0.82×) within two minutes, each figure right for its window. The
honest advice there is that the best count depends on the others and is
measured, not predicted.

The state is host-wide and kept by the stateful diagnosis (``OthersTrack``,
the snapshot's time the only clock): it starts after the condition held
``ENTER_S`` and ends only after the others have been light for
``RELEASE_S``. One-shot ``evaluate`` judges the condition of its snapshot
alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from dlwatch.thresholds import CPU_BOUND_MIN_SHARE

from . import capacity
from .facts import Context, LoaderView

# Other processes must use at least half a core, and a tenth of the usable
# cores, before their load is worth a sentence: a monitor, a shell and an
# editor stay well under that (the collector's own cost is about 1 % of a
# core with 8 busy jobs, README "Performance").
OTHERS_MIN_CORES = 0.5
OTHERS_MIN_FRACTION = 0.10
# ... and the jobs' processes must measurably wait for a CPU (run-queue wait,
# /proc/PID/schedstat). Processes at nice 19 use the idle time but yield to
# the workers (CFS weight 15 against 1024 at nice 0: about 1.5 % of a
# contested core each), so the workers hardly wait; two at nice 0 take about
# half of 2 cores from 2 workers. The demo beside the other agents' work on
# the shared 2-core box (load 5–7) waited 1.7–2.4 cores' worth. 0.2 cores is
# well under any such contest and above a quiet box's scheduling noise
# (not measured on a quiet box here: the one at hand never was).
STARVED_MIN_CORES = 0.2
# Seconds the condition must hold before the state starts: as long as a hint
# must hold before it shows (engine.HOLD_ON_S), over CPU figures already
# averaged over the loader's window (smoothing.py).
ENTER_S = 3.0
# Seconds the others must stay light (under RELEASE_FACTOR of both bars)
# before the state ends: the field case's load came and went within a
# minute, and advice that changes with it is no advice.
RELEASE_S = 60.0
RELEASE_FACTOR = 0.6


@dataclass(frozen=True)
class OthersTrack:
    on: bool = False
    # When off: the condition has held since; when on: the others have been light since.
    since: float | None = None
    # While on: the most cores the others used (a held story keeps its figure
    # honest: "up to 1.5 … in the last minute" when they have gone quiet).
    peak: float = 0.0


def others_threshold(ctx: Context) -> float:
    return max(OTHERS_MIN_CORES, OTHERS_MIN_FRACTION * (ctx.usable_cores or 0.0))


def starved_cores(ctx: Context) -> float:
    """Cores' worth of time the jobs' trainers and workers waited for a CPU."""
    return sum(lv.rq_sum for lv in ctx.loaders) + sum(capacity.trainer_runqueue(j) for j in ctx.live_jobs)


def heavy(ctx: Context, factor: float = 1.0) -> bool:
    """Other processes use the cores and the jobs wait for them (``factor``
    scales both bars: the release test uses lower ones)."""
    others = capacity.others_cpu(ctx)
    if others is None or ctx.usable_cores is None:
        return False
    return others >= factor * others_threshold(ctx) and starved_cores(ctx) >= factor * STARVED_MIN_CORES


def step(track: OthersTrack, ctx: Context, t: float, restart: bool) -> OthersTrack:
    """The state after this snapshot."""
    now = capacity.others_cpu(ctx) or 0.0
    if not track.on:
        if not heavy(ctx):
            return OthersTrack()
        since = t if restart or track.since is None else track.since
        if t - since >= ENTER_S:
            return OthersTrack(True, None, now)
        return OthersTrack(False, since)
    peak = max(track.peak, now)
    if heavy(ctx, RELEASE_FACTOR):
        return OthersTrack(True, None, peak)
    since = t if track.since is None else track.since
    if t - since >= RELEASE_S:
        return OthersTrack()
    return OthersTrack(True, since, peak)


# Workers busier than this are the loader's limit (rules_workers.WORKERS_SATURATED_BUSY).
SATURATED_BUSY = 0.80


def workers_short_of_cpu(lv: LoaderView) -> bool:
    """Whether the loader's workers are its limit and load on a CPU (so the
    cores the others leave decide how many help). A loader without workers
    keeps its own story: with num_workers=0 the loop loads every batch
    itself, whatever the others do (no-workers)."""
    if not lv.num_workers or lv.busy_mean is None or lv.busy_mean < SATURATED_BUSY:
        return False
    share = lv.cpu_share_of_busy
    return share is not None and share >= CPU_BOUND_MIN_SHARE


def _on(ctx: Context) -> bool:
    return heavy(ctx) if ctx.others_decide is None else ctx.others_decide


def decide(ctx: Context, lv: LoaderView) -> float | None:
    """Other processes' cores when they decide this loader's best worker
    count (its loading is on a CPU and the state holds), else None."""
    if not _on(ctx) or not workers_short_of_cpu(lv):
        return None
    return capacity.others_cpu(ctx)


def starve(ctx: Context, lv: LoaderView) -> float | None:
    """Other processes' cores when the state holds and this loader's workers
    are not its limit (busy under ``SATURATED_BUSY``: they idle between
    batches), else None. A loop that waits then waits for cores, not for
    workers: a worker waits for one to start its next batch, the trainer to
    send the next index and to take the batch in. Measured beside six
    CPU burners on 2 cores (the module test job of tests/e2e/test_mcp.py: 2
    sleeping workers, a 5 ms step): the loop waited 53-65 % with its workers
    busy 63-89 %, workers 13-29 % and trainer 40-43 % runnable without a core,
    and no hint spoke ("nothing in the input pipeline needs attention"); with
    two to four burners the workers stayed busy 92-99 % (io-bound's case)."""
    if not _on(ctx) or not lv.num_workers or lv.busy_mean is None or lv.busy_mean >= SATURATED_BUSY:
        return None
    return capacity.others_cpu(ctx)
