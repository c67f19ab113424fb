"""How many workers a loader needs: no-workers, add-workers, io-bound,
cpu-bound-preprocessing, pipeline-has-headroom.

The arithmetic is Little's law for a producer pool feeding one consumer: a
worker delivers one batch per ``worker_ms_per_batch`` (its dataset fetch time,
collate included), the loop takes one per ``step_ms_mean`` (its compute time
between ``__next__`` calls, data wait excluded — docs/ARCHITECTURE.md §2 "compute = between
calls"), so keeping up needs ``ceil(worker_ms / step_ms)`` workers.

Whether extra workers can run in parallel depends on what a worker does while
busy: on a CPU (decode, augmentation) each needs a core, so the count is capped
by the cores nobody else uses; off a CPU (storage, network) cores are not the
limit and the same arithmetic holds past the core count.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from dlwatch.snapshot import numbers

# Shared with `dlwatch tune`'s search and the probe's autotune (dlwatch/thresholds.py).
from dlwatch.thresholds import (  # noqa: F401 (re-exported for the rules' readers)
    CPU_BOUND_MIN_SHARE,
    DATA_BOUND_WAIT,
    IO_MAX_RECOMMENDED_WORKERS,
    LITTLE_SAFETY,
    WORKERS_SATURATED_BUSY,
    little_workers,
)

from . import capacity, direction, story
from .facts import (
    Context,
    LoaderView,
    as_dict,
    as_list,
    ceil_ratio,
    cores,
    cores_to_try,
    count_of,
    hint,
    knob,
    median,
    ms,
    num,
    others_cores,
    partner_phrase,
    pct,
    plural,
    r,
    setting,
    whole_cores,
    window_phrase,
    worker_values,
)
from .registry import Rule
from .rules_sharding import capped_by_shards

# num_workers == 0 with wait between this and DATA_BOUND_WAIT: an info hint —
# worth knowing, not worth a warning (the lower edge of the catalog's 5–10 %, docs/hints/index.md).
NO_WORKERS_INFO_WAIT = 0.05
# Cores counted as saturated when worker CPU + main loops reach this fraction
# of the usable cores (psutil never reads exactly 100 % of a quota).
CORES_SATURATED_FRACTION = 0.90
# Cores nobody uses (beyond the loader's own workers) that are room to try one
# more CPU-bound worker: half a core. Less is cpu-bound-preprocessing's case.
SPARE_FOR_ONE_MORE = 0.5
# Expected speed-up below which a worker-count hint is info at most: under
# ~10 % the change is within run-to-run noise of a real job and not worth a
# warning (the bar).
MIN_WORTHWHILE_SPEEDUP = 1.10
# pipeline-has-headroom: workers busier than this are not "mostly idle".
HEADROOM_MAX_BUSY = 0.30
# ... and the loop must not be data-bound (its wait under DATA_BOUND_WAIT,
# so no worker-count rule of the other direction fires beside it). Not 0, and
# not a few %: taking a ready batch from the queue costs the loop IPC and
# unpickling however fast the workers are: 1-2 ms on the reference box, 4-5 ms
# a batch (32 images of 3x32x32) on a slower 2-core box, where the loop read
# 6-10 % of a 50 ms step with its queue 7-8 of 8 full and its 4 workers 4 %
# busy, and the old 5 % bar kept the hint off for 40 s of 40 (fresh-clone run
# 37 reran its test).
HEADROOM_MAX_WAIT = DATA_BOUND_WAIT
# ... and the prefetch queue mostly full (mean over the window; the loop
# takes one out at every step, so exactly full is never seen).
HEADROOM_QUEUE_FULL = 0.75
# Margin kept when recommending fewer workers: 50 % more than Little's law,
# so a slower batch or a busy host does not starve the loop right away.
HEADROOM_SAFETY = 1.5
# Without per-batch times, size the pool so each worker would be ~70 % busy.
HEADROOM_TARGET_BUSY = 0.70


def _bound_kind(lv: LoaderView) -> tuple[bool, str] | None:
    share = lv.cpu_share_of_busy
    if share is None:
        return None
    cpu_bound = share >= CPU_BOUND_MIN_SHARE
    if share > 1.0:
        why = (
            f"workers on a CPU all their busy time, with several threads: "
            f"{share:.1f} cores each while busy (≥ {pct(CPU_BOUND_MIN_SHARE)})"
        )
    else:
        why = f"worker CPU {pct(share)} of busy time ({'≥' if cpu_bound else '<'} {pct(CPU_BOUND_MIN_SHARE)})"
    return cpu_bound, why


def _data_bound_workers(lv: LoaderView) -> bool:
    """The shared premise of add-workers / io-bound / cpu-bound-preprocessing."""
    return (
        lv.steady
        and lv.num_workers is not None
        and lv.num_workers >= 1
        and lv.wait is not None
        and lv.wait >= DATA_BOUND_WAIT
        and lv.busy_mean is not None
        and lv.busy_mean >= WORKERS_SATURATED_BUSY
    )


def waits_on_io(lv: LoaderView) -> bool:
    """io-bound's premise: data-bound workers off a CPU most of their busy
    time. Run-queue wait counts as CPU, so workers starved of cores are not
    such workers: other processes filling the cores cost these nothing."""
    if not _data_bound_workers(lv):
        return False
    kind = _bound_kind(lv)
    return kind is not None and not kind[0]


def _common_evidence(lv: LoaderView) -> dict[str, Any]:
    share = lv.cpu_share_of_busy
    ev = {
        "data_wait_fraction": r(lv.wait),
        "num_workers": lv.num_workers,
        "worker_busy_fraction": r(lv.busy_mean),
        "worker_cpu_cores_mean": r(lv.cpu_mean),
        # A fraction: CPU time (plus run-queue wait) per busy second, at most 1.
        "worker_cpu_share_of_busy": r(None if share is None else min(share, 1.0)),
        "worker_ms_per_batch": r(lv.worker_ms, 1),
        "step_ms_mean": r(lv.step_ms, 1),
    }
    if share is not None and share > 1.0:
        # More CPU than busy time: several threads per worker, said as such.
        ev["threads_cores_while_busy"] = r(share, 2)
    return ev


def _gain(pred: capacity.Prediction | capacity.NoPrediction | None) -> tuple[bool, str]:
    """Whether the predicted gain is worth a warning, and the sentence saying it.
    No number the measurements support: info, and why (the suggestion ends
    with the `dlwatch tune` command that measures it)."""
    if pred is None:
        return True, ""
    if isinstance(pred, capacity.NoPrediction):
        return False, f" dlwatch cannot predict the gain: {pred.reason}; measure it instead."
    text = f" Changing it: {pred.phrase()}"
    if pred.speedup < MIN_WORTHWHILE_SPEEDUP:
        text += f"; under {pct(MIN_WORTHWHILE_SPEEDUP - 1)} gain, so this is only worth knowing"
    return pred.speedup >= MIN_WORTHWHILE_SPEEDUP, text + "."


# Epochs shorter than this (median) are short for workers started anew at
# each one: fork start-up and shutdown measured 70-93 ms for 2-3 workers on
# the 2-core box (enable-persistent-workers' QA runs), 10 % of a 0.7-0.9 s
# epoch; a spawn start re-imports the script, seconds (litdata: 3.5 s of a
# 5.2 s epoch). A QA run of MONAI's ThreadDataLoader, 16-batch epochs of
# 0.6 s: num_workers=3 without persistent workers measured 0.47-0.75x.
SHORT_EPOCH_MS = {"fork": 1000.0, "spawn": 30000.0, "forkserver": 30000.0}


def short_epoch_ms(lv: LoaderView) -> float | None:
    """The median epoch of a loader whose epochs are short for workers
    re-created at each (``SHORT_EPOCH_MS`` by the job's start method), else
    None; a loader whose workers persist never."""
    if lv.loader.get("persistent_workers") is True:
        return None
    epochs = [v for v in numbers(as_list(lv.loader.get("epoch_ms"))) if v > 0]
    epoch = median(epochs) if epochs else None
    method = str(lv.loader.get("start_method") or lv.job.get("start_method") or "fork")
    if epoch is None or epoch >= SHORT_EPOCH_MS.get(method, SHORT_EPOCH_MS["fork"]):
        return None
    return epoch


def _nothing_to_gain(h: dict[str, Any], pred: Any, lv: LoaderView) -> dict[str, Any]:
    """A count hint whose predicted gain is under the bar advises no setting
    (issue 32: "set num_workers=6" beside ≈ 1.00×): it keeps the count it
    weighed as ``considered_num_workers`` and says to keep the current one."""
    if not isinstance(pred, capacity.Prediction) or pred.speedup >= MIN_WORTHWHILE_SPEEDUP:
        return h
    nw = lv.num_workers or 0
    ev = h["evidence"]
    rec = ev.get("recommended_num_workers")
    if rec is None or rec == nw:
        return h
    ev["considered_num_workers"] = rec
    ev["recommended_num_workers"] = None
    h["suggestion"] = (
        f"keep {setting(lv.loader, 'num_workers', nw)}: {rec} would gain under "
        f"{pct(MIN_WORTHWHILE_SPEEDUP - 1)}, {pred.phrase()}"
    )
    return h


def _prediction_evidence(pred: capacity.Prediction | capacity.NoPrediction | None) -> dict[str, Any]:
    if pred is None:
        return {"expected_speedup": None}
    return pred.evidence()


def _loading_cpu(lv: LoaderView, job_cpu_main_thread: float | None) -> tuple[float, str]:
    """CPU the trainer spends loading with num_workers=0 (cores), and how it
    was found: the main thread loads during the wait, so it is at most the
    wait fraction and at most the main thread's measured CPU."""
    wait = lv.wait or 0.0
    if job_cpu_main_thread is None:
        return wait, "assumed: the main thread is on a CPU for the whole wait"
    return (
        min(wait, job_cpu_main_thread),
        "measured bound: min(data wait fraction, main thread CPU)",
    )


def _no_workers_sampled(ctx: Context, lv: LoaderView) -> dict[str, Any] | None:
    """no-workers for an attached job (``dlwatch attach``): from shares of
    stack samples instead of per-batch times (rules_sampled.py)."""
    from .rules_sampled import _cap, _pm, _sampling_evidence, _wait, capped, estimate, span

    wait = _wait(lv)
    if wait is None or wait[0] < NO_WORKERS_INFO_WAIT:
        return None
    est = estimate(0, None, wait)
    rec = est["recommended_num_workers"]
    # The loop loads on its own CPU: each worker taking that over needs a core.
    cap = _cap(ctx, lv, released=wait[0])
    if cap is not None:
        rec = min(rec, cap)
    msg = (
        f"{lv.title} spends {pct(wait[0])}{_pm(lv)} of the loop waiting for data with "
        f"num_workers=0 (sampled from outside: {lv.loader.get('data_wait_samples')} samples): "
        f"the training loop loads every batch itself. Loading vs computing per batch says "
        f"about {est['workers_needed']:.1f} workers keep up ({span(est)} within the sampling's 95 % interval)"
    ) + capped(est, cap, rec, f"; the free cores allow {rec}")
    ev = _sampling_evidence(lv) | est | {"num_workers": 0, "core_cap": cap, "usable_cores": ctx.usable_cores}
    ev["recommended_num_workers"] = rec
    sugg = f"set {setting(lv.loader, 'num_workers', rec)} so batches load while the loop computes"
    severity = "warn" if wait[0] >= DATA_BOUND_WAIT else "info"
    return hint("no-workers", severity, lv.pid, lv.lid, msg, sugg, ev)


def rule_no_workers(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not lv.steady or lv.num_workers != 0 or lv.wait is None:
            continue
        if lv.loader.get("sampled") is True:
            # Attached: shares of samples, no per-batch times.
            h = _no_workers_sampled(ctx, lv)
            if h is not None:
                out.append(h)
            continue
        if lv.wait < NO_WORKERS_INFO_WAIT:
            continue
        # With num_workers=0 the loop loads inside __next__: the wait per batch
        # is what one worker would spend per batch.
        wait_ms = num(lv.loader.get("wait_ms_mean"))
        main_thread = num(lv.job.get("main_thread_cpu_percent"))
        load_cpu, load_how = _loading_cpu(lv, None if main_thread is None else main_thread / 100.0)
        # Behind a feeder thread the loading is that thread's, off the loop:
        # one worker process would only move it (a QA run: "num_workers=1,
        # ≈ 1.30×" measured 1.0×). Sized on the feeder's time per batch.
        fed_ms = capacity.thread_fed_load(lv)
        feeder = str((lv.loader.get("iterated_on") or {}).get("thread") or "?")
        if fed_ms is not None:
            load_cpu, load_how = 0.0, "the feeder thread's, off the loop's thread"
        # Loading that keeps the main thread on a CPU needs a core per worker.
        cpu_loading = load_cpu >= CPU_BOUND_MIN_SHARE * lv.wait
        rec = cap = free = little = None
        acc = None
        pred = None
        if wait_ms is not None and wait_ms > 0 and lv.step_ms is not None and lv.step_ms > 0:
            rec = little = little_workers(fed_ms if fed_ms is not None else wait_ms, lv.step_ms)
            got = capacity.free_cores_for(ctx, lv, released=load_cpu)
            if got is not None:
                free, acc = got
                if cpu_loading:
                    cap = max(1, cores_to_try(free))
                    rec = min(rec, cap)
            best = capacity.best_count(ctx, lv, rec)
            if best is not None:
                rec = best
            pred = capacity.predict(ctx, lv, rec)
        worth, gain_text = _gain(pred)
        severity = "warn" if lv.wait >= DATA_BOUND_WAIT and worth else "info"
        # In the library's own words: a grain.DataLoader's worker_count=0.
        own = knob(lv.loader, "num_workers")
        zero = f"{own.split('.', 1)[1] if own else 'num_workers'}=0"
        msg = (
            f"{lv.title} spends {pct(lv.wait)} of the loop waiting for data{window_phrase(lv)} "
            f"with {zero}: the training loop loads every batch itself"
        )
        if fed_ms is not None and lv.step_ms is not None:
            msg = (
                f"{lv.title} spends {pct(lv.wait)} of the loop waiting for data{window_phrase(lv)} "
                f"with {zero}: thread '{feeder}' loads every batch itself ({ms(fed_ms)} a batch, "
                f"vs {ms(lv.step_ms)} the loop computes), one at a time, and the loop takes them from its "
                "queue; one worker process would only move that work"
            )
        elif wait_ms is not None and lv.step_ms is not None:
            rest = "for the rest of the loop" if lv.partners else "computing"
            msg += f" ({ms(wait_ms)} loading vs {ms(lv.step_ms)} {rest} per batch{partner_phrase(lv)})"
        msg += "."
        if free is not None and rec is not None and little is not None and rec < little and rec == cap:
            # Only when the cores are what caps the count (a QA run: "The free
            # cores (0) allow 2.", the 2 being the cycle model's best).
            theirs = ""
            if acc is not None and acc.others_measured and acc.others >= 0.1:
                # More workers would win more of the others' cores, a share
                # the advice does not take from them (a QA box with two CPU
                # burners read "free cores (0.1)" with no reason).
                theirs = f"; other processes use {cores(round(acc.others, 1))}"
            msg += f" The free cores ({cores(round(max(free, 0.0), 1))}{theirs}) allow {rec}."
        msg += gain_text
        capped = capped_by_shards(lv, rec) if rec is not None else None
        if capped is not None:
            msg += capped.sentence
            sugg = capped.suggestion + " so batches load in the background while the loop computes"
        elif rec is not None:
            sugg = (
                f"set {setting(lv.loader, 'num_workers', rec)} so batches load in the "
                f"background while the loop computes"
            )
        else:
            sugg = (
                f"set {setting(lv.loader, 'num_workers', 2)} to load in the background, "
                "then re-measure the data wait"
            )
        short = short_epoch_ms(lv)
        # Only where the setting exists (a grain.DataLoader has none).
        if rec is not None and short is not None and lv.loader.get("persistent_workers") is False:
            sugg += (
                f", with {setting(lv.loader, 'persistent_workers', True)}: its epochs last "
                f"{ms(short)}, and workers started anew at each would pay their start-up every epoch"
            )
        ev: dict[str, Any] = {
            "data_wait_fraction": r(lv.wait),
            "num_workers": 0,
            "short_epoch_ms": r(short, 1),
            "wait_ms_mean": r(wait_ms, 1),
            "step_ms_mean": r(lv.step_ms, 1),
            "recommended_num_workers": rec,
            "usable_cores": ctx.usable_cores,
            "core_cap": cap,
            "free_cores": r(free, 2),
            "loading_cpu_cores": r(load_cpu, 2),
            "loading_cpu_basis": load_how,
        }
        ev |= _prediction_evidence(pred)
        if capped is not None:
            ev |= capped.evidence
        if acc is not None:
            ev["cpu_accounting"] = acc.evidence()
        out.append(_nothing_to_gain(hint("no-workers", severity, lv.pid, lv.lid, msg, sugg, ev), pred, lv))
    return out


def fewest_with_partners(ctx: Context, lv: LoaderView, rec: int, nw: int) -> int:
    """``rec``, or fewer where another loader the loop takes from in the same
    steps sets the pace first (zip: past its workers' pace, more here buy
    nothing): the fewest above ``nw`` the cycle model prices as good."""
    if not lv.partners or rec <= nw + 1:
        return rec
    best = capacity.best_count(ctx, lv, rec)
    return rec if best is None else max(nw + 1, best)


def _sizable(ctx: Context, cpu_bound: bool) -> Iterator[tuple[LoaderView, str, int]]:
    """Data-bound loaders of one kind (CPU- or I/O-bound) whose worker time and
    step time are known: (view, why-this-kind, Little's-law worker count)."""
    for lv in ctx.loaders:
        if not _data_bound_workers(lv):
            continue
        kind = _bound_kind(lv)
        if kind is None or kind[0] != cpu_bound:
            continue
        if lv.worker_ms is None or lv.step_ms is None or lv.step_ms <= 0:
            continue
        yield lv, kind[1], little_workers(lv.worker_ms, lv.step_ms)


@dataclass(frozen=True)
class _Raise:
    """add-workers' weighing of one loader: the count it would set and why."""

    rec: int
    little: int
    free: float  # cores this loader's workers may use in all
    spare: float  # of those, cores nobody uses now
    acc: capacity.Account
    pred: capacity.Prediction | capacity.NoPrediction

    def raises(self, nw: int) -> bool:
        """A raise add-workers says (a warning, or info that cannot price it):
        not one it prices under the bar (then it says "keep")."""
        if self.rec <= nw:
            return False
        p = self.pred
        return not isinstance(p, capacity.Prediction) or p.speedup >= MIN_WORTHWHILE_SPEEDUP


def _weigh_raise(ctx: Context, lv: LoaderView, little: int) -> _Raise | None:
    """The count add-workers would set for a data-bound CPU-bound loader.

    The cap is in cores, but not a whole free core per worker: ``free`` counts
    the trainer at its measured CPU, which a data-bound trainer spends only
    while it computes, and the cycle model prices the rest (its "CPU" term:
    trainer + loading CPU per batch over the cores). So half a core nobody
    uses is room to try one more worker, and the prediction says whether it
    is worth it. Issue 43's field case: 2 cores, the trainer at 0.43 and its
    one worker at 1.0 (1.55 free, 0.55 spare): the whole-core cap said 1, so
    no rule spoke beside a 55 % wait. The model says ×1.50 for 2 workers
    (the job's CPU then fills the 2 cores, so 3 are no better); measured on
    the idle box: 7.79 -> 11.55 batches/s (×1.48, dlwatch record), ×1.44
    (dlwatch compare), ×1.18 (dlwatch tune, 4 s windows), and in alternated
    25 s runs 1/2/3 workers 7.50/10.75/10.87 batches/s on average (×1.43,
    ×1.45): RULES.md "Predicted gain".
    """
    got = capacity.free_cores_for(ctx, lv)
    if got is None:
        return None
    free, acc = got
    nw = lv.num_workers or 0
    spare = free - capacity.workers_demand(lv)
    # Little's law can say "enough" while the loop still waits (the fetch
    # time misses IPC/unpickling): one more worker is then the measured
    # next step.
    needed = max(little, nw + 1)
    cap = max(whole_cores(free), nw + 1 if spare >= SPARE_FOR_ONE_MORE else 0)
    rec = fewest_with_partners(ctx, lv, min(needed, cap), nw)
    return _Raise(rec, little, free, spare, acc, capacity.predict(ctx, lv, rec))


def rule_add_workers(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv, why, little in _sizable(ctx, cpu_bound=True):
        w = _weigh_raise(ctx, lv, little)
        if w is None:
            continue
        nw = lv.num_workers or 0  # _sizable: at least 1
        rec, free, acc, pred = w.rec, w.free, w.acc, w.pred
        if rec <= nw:
            continue  # under half a core spare: cpu-bound-preprocessing's case
        worth, gain_text = _gain(pred)
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the time{window_phrase(lv)}; its "
            f"{count_of(nw, 'worker')} {plural(nw, 'is')} busy {pct(lv.busy_mean)} of the time "
            f"and one batch costs a worker {ms(lv.worker_ms)} while the loop uses one every "
            f"{ms(lv.step_ms)}{partner_phrase(lv)}"
        )
        if little > nw:
            msg += f": keeping up needs {little} workers"
            if rec < little:
                msg += (
                    f", and the free cores ({cores(round(free, 1))}, {cores(round(max(w.spare, 0.0), 1))} "
                    f"of them unused now) allow {rec}"
                )
        else:
            msg += (
                f": by fetch time alone {nw} should keep up, yet the loop waits, so "
                f"per-batch overhead outside the fetch (IPC, collate) is the rest"
            )
        msg += "." + gain_text
        sugg = f"set {setting(lv.loader, 'num_workers', rec)}"
        capped = capped_by_shards(lv, rec)
        if capped is not None:
            msg += capped.sentence
            sugg = capped.suggestion
        ev = _common_evidence(lv) | {
            "recommended_num_workers": rec,
            "little_law_workers": little,
            "usable_cores": ctx.usable_cores,
            "usable_cores_source": ctx.usable_cores_source(),
            "main_loops": ctx.main_loops,
            "free_cores": r(free, 2),
            "cpu_bound": True,
            "cpu_bound_reason": why,
            "cpu_accounting": acc.evidence(),
        }
        ev |= _prediction_evidence(pred)
        if capped is not None:
            ev |= capped.evidence
        h = hint("add-workers", "warn" if worth else "info", lv.pid, lv.lid, msg, sugg, ev)
        out.append(_nothing_to_gain(h, pred, lv))
    return out


def rule_io_bound(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv, why, little in _sizable(ctx, cpu_bound=False):
        nw = lv.num_workers or 0  # _sizable: at least 1
        share = lv.cpu_share_of_busy or 0.0  # _bound_kind: known
        rec = min(max(little, nw + 1), IO_MAX_RECOMMENDED_WORKERS)
        if rec <= nw:
            continue
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the time{window_phrase(lv)}; its "
            f"{count_of(nw, 'worker')} {plural(nw, 'is')} busy {pct(lv.busy_mean)} of the time but on a "
            f"CPU only {pct(min(share, 1.0))} of it: loading waits on storage or network. "
            f"One batch takes a worker {ms(lv.worker_ms)} and the loop uses one every "
            f"{ms(lv.step_ms)}{partner_phrase(lv)}."
        )
        rec = fewest_with_partners(ctx, lv, rec, nw)
        pred = capacity.predict(ctx, lv, rec)
        worth, gain_text = _gain(pred)
        msg += gain_text
        sugg = (
            f"set {setting(lv.loader, 'num_workers', rec)} (I/O waits overlap, so this may exceed "
            f"the core count), or cache the dataset on local SSD / in RAM"
        )
        capped = capped_by_shards(lv, rec)
        if capped is not None:
            msg += capped.sentence
            sugg = capped.suggestion + "; or cache the dataset on local SSD / in RAM"
        ev = _common_evidence(lv) | {
            "recommended_num_workers": rec,
            "little_law_workers": little,
            "usable_cores": ctx.usable_cores,
            "cpu_bound": False,
            "cpu_bound_reason": why,
        }
        ev |= _prediction_evidence(pred)
        if capped is not None:
            ev |= capped.evidence
        out.append(
            _nothing_to_gain(
                hint("io-bound", "warn" if worth else "info", lv.pid, lv.lid, msg, sugg, ev), pred, lv
            )
        )
    return out


def rule_cpu_bound_preprocessing(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not _data_bound_workers(lv):
            continue
        kind = _bound_kind(lv)
        if kind is None or not kind[0]:
            continue
        nw = lv.num_workers or 0
        # Exactly the loaders add-workers gives no raise worth making: every
        # data-bound loader with saturated CPU-bound workers gets one of the
        # two (issue 43: a demand gate of 90 % of the cores here and a
        # whole-core cap there left 1.45 of 2 cores in use between them).
        if lv.worker_ms is not None and lv.step_ms is not None and lv.step_ms > 0:
            w = _weigh_raise(ctx, lv, little_workers(lv.worker_ms, lv.step_ms))
            if w is not None and w.raises(nw):
                continue  # add-workers says it
        acc = capacity.account(ctx)
        if acc is None or ctx.usable_cores is None:
            continue
        demand = acc.demand
        more = capacity.predict(ctx, lv, nw + 1)
        # The most cheaper batches could give: no wait at all, the job's CPU
        # then only the trainer's.
        upside = _speedup_if_loading_free(ctx, lv)
        worth = upside is None or upside >= MIN_WORTHWHILE_SPEEDUP
        one_more_helps = isinstance(more, capacity.Prediction) and more.speedup >= MIN_WORTHWHILE_SPEEDUP
        # Demand is CPU plus run-queue wait: it can exceed the cores, and says
        # so (a QA run: "of the 2 usable, its workers 4" read as nonsense).
        parts = [f"its workers want {cores(round(acc.workers, 1))}"]
        parts.append(f"the {plural(ctx.main_loops, 'trainer')} {cores(round(acc.trainers, 1))}")
        parts += others_cores(acc)
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the time{window_phrase(lv)} while its "
            f"{count_of(nw, 'CPU-bound worker')} {plural(nw, 'is')} busy "
            f"{pct(lv.busy_mean)} of the time, and {_cores_phrase(ctx.usable_cores, demand)}: "
            f"{_and(parts)}, in cores of CPU plus the time waiting for one, against "
            f"{cores(ctx.usable_cores)} usable."
        )
        # One story: never "cannot help" beside a predicted gain.
        if isinstance(more, capacity.NoPrediction):
            msg += f" Whether one more worker helps cannot be predicted: {more.reason}."
        elif one_more_helps:
            msg += f" One more worker still helps: {more.phrase()}."
        else:
            msg += f" More workers cannot help: one more, {more.phrase()}."
        assumes = None
        if upside is not None:
            bound_text, assumes = _loading_free_phrase(ctx, lv, upside, acc.workers)
            msg += " " + bound_text
        sugg = "make each batch cheaper: decode/resize once and cache the result, use lighter transforms"
        if ctx.has_gpu:
            sugg += ", or move augmentation to the GPU (e.g. torchvision.transforms.v2 on CUDA tensors, DALI)"
        else:
            sugg += ", or a faster decoder (e.g. Pillow-SIMD, decoding at reduced size)"
        wp = _worker_profile_of(lv)
        if wp is not None:
            msg += (
                f" The last worker profile puts {pct(wp['top_share'])} of the workers' time in "
                f"{wp['top_stage']} ({wp['verdict']})."
            )
            # Its next step, unless it weighs more workers where one more cannot help.
            theirs = str(wp.get("suggestion") or "")
            if theirs and (one_more_helps or direction.RAISE not in story.says(theirs)):
                sugg = theirs
        else:
            sugg += "; to see which stage costs what: dlwatch profile --workers (W in the live view)"
        capped = capped_by_shards(lv, nw + 1) if one_more_helps else None
        if one_more_helps:
            raise_to = f"set {setting(lv.loader, 'num_workers', nw + 1)}"
            if capped is not None:
                msg += capped.sentence
                raise_to = capped.suggestion
            sugg = f"{raise_to}; beyond that, " + sugg
        ev = _common_evidence(lv) | {
            "usable_cores": ctx.usable_cores,
            "usable_cores_source": ctx.usable_cores_source(),
            "main_loops": ctx.main_loops,
            "cpu_demand_cores": r(demand, 2),
            "cpu_bound": True,
            "cpu_bound_reason": kind[1],
            "cpu_accounting": acc.evidence(),
            "speedup_if_loading_free": r(upside, 2),
            "speedup_if_loading_free_assumes": assumes,
        }
        if one_more_helps:
            ev["recommended_num_workers"] = nw + 1
        ev |= _prediction_evidence(more)
        if capped is not None:
            ev |= capped.evidence
        ev["worker_profile"] = wp
        out.append(
            hint("cpu-bound-preprocessing", "warn" if worth else "info", lv.pid, lv.lid, msg, sugg, ev)
        )
    return out


def _cores_phrase(usable: float, demand: float) -> str:
    """How full the cores are, in the words the figures allow."""
    if demand >= CORES_SATURATED_FRACTION * usable:
        return "the cores are taken"
    spare = cores(round(max(0.0, usable - demand), 1))
    if usable - demand < SPARE_FOR_ONE_MORE:
        return f"under half a core is unused ({count_of(spare, 'core')}), no room for another worker"
    return f"{count_of(spare, 'core')} {plural(spare, 'is')} unused"


def _worker_profile_of(lv: LoaderView) -> dict[str, Any] | None:
    """The job's last worker profile, if it was of this loader."""
    wp = lv.job.get("worker_profile")
    if not isinstance(wp, dict) or wp.get("loader_id") != lv.lid or num(wp.get("top_share")) is None:
        return None
    return wp


def _and(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# A trainer using this much CPU computes its step on the CPU: it shares the
# cores with the loading (a GPU step's host thread uses a tenth of a core).
CPU_STEP_CORES = 0.5


def _loading_free_phrase(
    ctx: Context, lv: LoaderView, upside: float, workers_cores: float
) -> tuple[str, str]:
    """The live bound on cheaper batches, and what it assumes. It keeps the
    step at its measured time. Where the step runs on the CPU it shares the
    cores with the loading, and cheaper batches give it cores back: the loop
    can then gain more than this, up to the data-free ceiling `dlwatch tune`
    measures by replaying batches (issue 43: live 1.20× beside tune's 5.51×
    on a 2-core box, unsaid why)."""
    step = ms(lv.step_ms)
    said = f"Cheaper batches could give up to ≈ {upside:.2f}× throughput with the step at its present {step}"
    trainer = capacity.trainer_cpu(lv.job)
    if not ctx.has_gpu and trainer is not None and trainer >= CPU_STEP_CORES:
        usable = count_of(cores(ctx.usable_cores), "usable core")
        said += (
            f"; here the step and the loading share the {usable} (the workers take "
            f"{cores(round(workers_cores, 1))} now), so batches that cost less CPU also speed the step "
            f"and the gain can be larger: `dlwatch tune` measures the ceiling with data for free "
            f"(batches replayed)."
        )
        return said, (
            "the step keeps its present time; it shares the cores with the loading (a CPU step), "
            "so the data-free ceiling (dlwatch tune, batches replayed) can be higher"
        )
    return said + " (the loop's pace if data were free: the kind of figure tune's ceiling measures).", (
        "the step keeps its present time (it does not compute on the cores the loading uses)"
    )


def _speedup_if_loading_free(ctx: Context, lv: LoaderView) -> float | None:
    wait_ms = num(lv.loader.get("wait_ms_mean"))
    if wait_ms is None or lv.step_ms is None or lv.step_ms <= 0:
        return None
    before = wait_ms + lv.step_ms
    after = lv.step_ms
    trainer = capacity.trainer_cpu(lv.job)
    cap = capacity.job_capacity(ctx, lv)
    if trainer is not None and cap:
        after = max(after, trainer * before / cap)
    return before / after


def rule_pipeline_has_headroom(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        nw = lv.num_workers
        if not lv.steady or nw is None or nw < 2:
            continue
        if lv.wait is None or lv.wait >= HEADROOM_MAX_WAIT:
            continue
        if lv.busy_mean is None or lv.busy_mean >= HEADROOM_MAX_BUSY:
            continue
        q = as_dict(lv.loader.get("queue"))
        ready, cap = num(q.get("ready")), num(q.get("capacity"))
        if ready is None or cap is None or cap <= 0 or ready < HEADROOM_QUEUE_FULL * cap:
            continue
        if lv.worker_ms is not None and lv.step_ms is not None and lv.step_ms > 0:
            rec = max(1, ceil_ratio(lv.worker_ms * HEADROOM_SAFETY, lv.step_ms))
            method = (
                f"Little's law ({ms(lv.worker_ms)} per batch per worker vs "
                f"{ms(lv.step_ms)} per step) with {HEADROOM_SAFETY:g}x margin"
            )
        else:
            rec = max(1, ceil_ratio(nw * lv.busy_mean, HEADROOM_TARGET_BUSY))
            method = f"busy time of {count_of(nw, 'worker')} spread at {pct(HEADROOM_TARGET_BUSY)} busy each"
        if rec >= nw:
            continue
        idle_cpu = sum(worker_values(lv.workers, "cpu_percent")) / 100.0
        pred = capacity.predict(ctx, lv, rec)
        msg = (
            f"{lv.title} has its prefetch queue full ({int(ready)}/{int(cap)} "
            f"batches ready), the loop waits {pct(lv.wait)} of the time{window_phrase(lv)} and its "
            f"{count_of(nw, 'worker')} {plural(nw, 'is')} "
            f"busy only {pct(lv.busy_mean)} of the time."
        )
        if isinstance(pred, capacity.Prediction):
            msg += f" With {rec}: {pred.phrase()}."
        elif isinstance(pred, capacity.NoPrediction):
            who = count_of(rec, "worker")
            msg += f" Whether {who} would keep up cannot be predicted: {pred.reason}; measure it."
        # In the words of the code that builds the loader (a QA run of the HF
        # Trainer read "num_workers=1" where its knob is dataloader_num_workers).
        # Unpriced, the suggestion says no more than the message: torchvision's
        # reference train.py read "cannot be predicted" beside "would keep up".
        keeps = "would keep up" if isinstance(pred, capacity.Prediction) else "may keep up"
        sugg = f"{setting(lv.loader, 'num_workers', rec)} {keeps} and free CPU and memory for other work"
        ev = _common_evidence(lv) | {
            "recommended_num_workers": rec,
            "method": method,
            "queue_ready": int(ready),
            "queue_capacity": int(cap),
            "worker_cpu_cores_total": r(idle_cpu, 2),
        }
        ev |= _prediction_evidence(pred)
        out.append(hint("pipeline-has-headroom", "info", lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (
    Rule("no-workers", rule_no_workers, "loader", rate=True, worker_count_rank=1, tunable=True),
    Rule("add-workers", rule_add_workers, "loader", rate=True, worker_count_rank=2, tunable=True),
    Rule("io-bound", rule_io_bound, "loader", rate=True, worker_count_rank=4, tunable=True),
    Rule("cpu-bound-preprocessing", rule_cpu_bound_preprocessing, "loader", rate=True, tunable=True),
    Rule(
        "pipeline-has-headroom",
        rule_pipeline_has_headroom,
        "loader",
        rate=True,
        worker_count_rank=5,
        tunable=True,
    ),
)
