"""Which trial to run next, and which setting to recommend: pure functions of
the trials measured so far. ``dlwatch tune`` runs a trial per process;
the probe's autotune (``dlwatch run --autotune``) an epoch per trial, so this
module is stdlib only and sits in the lowest layer, importable by both. It
does not live in ``dlwatch/tune/``: that package is monitor-side (it starts
processes and runs a collector), and the code that runs inside a training job
may import nothing of the monitor's (an import-linter contract), so the one
search both use stays beside ``wire`` and ``thresholds``.

A trial here is the dict of the result document (docs/tune.md): ``config``
(the knobs it overrode), ``settings`` (the loader's four knobs as the probe
read them), ``status`` and the figures of ``measure.TrialMeter``.

The search follows the baseline's diagnosis rather than a grid:

1. The baseline (the script's own settings). If its loop waits for data less
   than the diagnosis' data-bound threshold, nothing here can speed it up:
   stop after one trial.
2. ``num_workers``: first the Little's-law count (the worker time one batch
   costs over the loop's step time), capped at the usable cores when workers
   are CPU-bound and not when they sleep on I/O (their waits overlap). Then up
   (doubling) while the best is still the largest tried and the loop still
   waits, or down (halfway to the next smaller tried count) once the loop no
   longer waits, to find the fewest workers that keep up. A baseline with 0
   workers tells nothing about CPU vs I/O: it is treated as CPU-bound until a
   trial with workers says otherwise.
3. On the best so far, each of ``persistent_workers`` (when epoch starts
   cost time), ``prefetch_factor`` (when the loop still waits) and
   ``pin_memory`` (only with CUDA), once.
4. The leading settings are measured again, so their spread is known.

The recommendation is the setting with the fewest workers (then the fewest
changes) among those within noise of the fastest: fewer processes, less
memory, for the same speed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from dlwatch.overrides import KNOBS as KNOBS
from dlwatch.overrides import resolve
from dlwatch.snapshot import num, percent
from dlwatch.thresholds import (
    CPU_BOUND_MIN_SHARE,
    DATA_BOUND_WAIT,
    IO_MAX_RECOMMENDED_WORKERS,
    little_workers,
)

# The loop still waits for data above this after a change: more of the same
# may help (under it the pipeline keeps up; the rest is epoch boundaries and
# IPC, DATA_BOUND_WAIT's "material" is 10 %).
STILL_WAITING = 0.05
# Two settings whose batches/s differ by less than this are "within noise":
# repeated trials of one setting on a quiet 2-core box differ by 1-4 %.
# When repeats of any one setting in the sweep differed by more (a busy box:
# 96 vs 113 batches/s was seen), that measured difference is the allowance,
# up to the cap: beyond it the figures say too little to pick on.
NOISE_FLOOR = 0.05
NOISE_CAP = 0.25
# persistent_workers is worth a trial when later epoch starts cost this share
# of an epoch (the hint's bar is 10 % and 20 ms: a trial can measure less).
PERSIST_MIN_SHARE = 0.02
PERSIST_MIN_STALL_MS = 20.0
PREFETCH_TRY = 4
# Leading settings repeated once each (the best and the runner-up).
REPEAT_LEADERS = 2

# The step functions' arguments: the trials so far, the job's own settings,
# and whether a candidate's settings have not been tried yet.
Trials = Sequence[dict[str, Any]]
Settings = dict[str, Any]
IsNew = Callable[[Settings], bool]


@dataclass(frozen=True)
class Facts:
    """What the diagnosis of a trial says about its loader."""

    data_wait: float | None
    data_bound: bool
    kind: str | None  # "cpu" | "io" | None (no workers to judge by)
    little: int | None  # workers Little's law asks for
    usable_cores: float | None
    num_workers: int


def facts(trial: dict[str, Any]) -> Facts:
    s = trial.get("settings") or {}
    nw = int(s.get("num_workers") or 0)
    wait = num(trial.get("data_wait_fraction"))
    step = num(trial.get("step_ms_mean"))
    kind = None
    little = None
    if nw > 0:
        share = num(trial.get("worker_cpu_share_of_busy"))
        if share is not None:
            kind = "cpu" if share >= CPU_BOUND_MIN_SHARE else "io"
        wms = num(trial.get("worker_ms_per_batch"))
        if wms and step and step > 0:
            little = little_workers(wms, step)
    else:
        # The loop loads in __next__: its wait per batch is one worker's time.
        wms = num(trial.get("wait_ms_mean"))
        if wms and step and step > 0:
            little = little_workers(wms, step)
        # The whole job's CPU under half its wait: the loading is off a CPU
        # (a QA run: an Accelerate job at 0.0 cores waiting 83 % was capped
        # at one worker per core, "no workers to judge CPU vs I/O by", while
        # the live hint judged it I/O-bound and advised 5).
        cpu = num(trial.get("cpu_cores"))
        if (
            wait is not None
            and wait >= DATA_BOUND_WAIT
            and cpu is not None
            and cpu < CPU_BOUND_MIN_SHARE * wait
        ):
            kind = "io"
    return Facts(
        data_wait=wait,
        data_bound=wait is not None and wait >= DATA_BOUND_WAIT,
        kind=kind,
        little=little,
        usable_cores=num(trial.get("usable_cores")),
        num_workers=nw,
    )


def settings_key(settings: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(settings.get(k) for k in KNOBS)


def apply(base: dict[str, Any], config: dict[str, Any], cuda: bool) -> dict[str, Any]:
    """The loader's settings once ``config`` overrides ``base`` (as the probe
    will make them: valid for torch)."""
    out = resolve(dict(base), config, lambda: cuda)
    out.pop("multiprocessing_context", None)
    if out.get("num_workers") and out.get("prefetch_factor") is None:
        out["prefetch_factor"] = 2  # torch's default, as the probe reads it back
    return {k: out.get(k) for k in KNOBS}


def ok(trials: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [t for t in trials if t.get("status") == "ok" and num(t.get("batches_per_s")) is not None]


@dataclass
class Group:
    """All ok trials of one setting."""

    key: tuple[Any, ...]
    settings: dict[str, Any]
    config: dict[str, Any]
    trials: list[dict[str, Any]]

    @property
    def rates(self) -> list[float]:
        return [float(t["batches_per_s"]) for t in self.trials]

    @property
    def mean(self) -> float:
        return sum(self.rates) / len(self.rates)

    @property
    def spread(self) -> float | None:
        """Half the range over the mean (None with one trial)."""
        r = self.rates
        if len(r) < 2 or self.mean <= 0:
            return None
        return (max(r) - min(r)) / 2 / self.mean

    @property
    def wait(self) -> float | None:
        w = [x for x in (num(t.get("data_wait_fraction")) for t in self.trials) if x is not None]
        return sum(w) / len(w) if w else None


def groups(trials: Sequence[dict[str, Any]]) -> list[Group]:
    out: dict[tuple[Any, ...], Group] = {}
    for t in ok(trials):
        k = settings_key(t["settings"])
        g = out.get(k)
        if g is None:
            out[k] = Group(k, t["settings"], t.get("config") or {}, [t])
        else:
            g.trials.append(t)
    return list(out.values())


def measured_noise(gs: Sequence[Group]) -> float | None:
    """The widest difference between repeats of one setting, relative to
    their mean (None: nothing was repeated)."""
    out = None
    for g in gs:
        r = g.rates
        if len(r) >= 2 and g.mean > 0:
            d = (max(r) - min(r)) / g.mean
            out = d if out is None else max(out, d)
    return out


def noise_allowance(gs: Sequence[Group]) -> float:
    """How far below the fastest a setting may measure and still count as
    within noise of it: the measured noise of the sweep, at least the floor."""
    return min(NOISE_CAP, max(NOISE_FLOOR, measured_noise(gs) or 0.0))


def changes(settings: dict[str, Any], base: dict[str, Any]) -> int:
    return sum(1 for k in KNOBS if k != "num_workers" and settings.get(k) != base.get(k))


# A change is recommended over the script's own settings only when it beats
# them by this many times the noise allowance: a new user's sweep recommended
# a 1.15x setting beside 12 % noise, and alternated runs measured it 0.90x.
KEEP_MARGIN = 1.5


def choose(trials: Sequence[dict[str, Any]]) -> Group | None:
    """The recommendation: fewest workers, then fewest changes, among the
    settings within noise of the fastest (the script's own within
    ``KEEP_MARGIN`` times the noise)."""
    gs = groups(trials)
    if not gs:
        return None
    base = trials[0].get("settings") or {}
    top = max(gs, key=lambda g: g.mean)
    allow = noise_allowance(gs)
    own = settings_key(base)
    near = [g for g in gs if g.mean >= top.mean * (1 - (KEEP_MARGIN * allow if g.key == own else allow))]
    return min(near, key=lambda g: (g.settings.get("num_workers") or 0, changes(g.settings, base), -g.mean))


def fastest(trials: Sequence[dict[str, Any]]) -> Group | None:
    gs = groups(trials)
    return max(gs, key=lambda g: g.mean) if gs else None


@dataclass
class Options:
    cuda: bool = False
    workers: list[int] | None = None  # an explicit grid replaces the search
    # The knobs the search may change (autotune cannot change persistent_workers
    # after the DataLoader exists, nor pin what the model receives).
    knobs: tuple[str, ...] = KNOBS


Proposal = tuple[dict[str, Any] | None, str]  # (config to try, why) or (None, why the search stops)


def propose(trials: Sequence[dict[str, Any]], opts: Options) -> Proposal:
    if not trials:
        return {}, "baseline: the script's own settings"
    base = trials[0]
    if base.get("status") != "ok":
        return None, f"the baseline trial did not measure ({base.get('status')}: {base.get('reason', '')})"
    bf = facts(base)
    base_s = base["settings"]
    # A setting counts as tried once asked for, whatever came of it (a crash
    # is not retried) and whatever the loader reported.
    tried = {settings_key(apply(base_s, t.get("config") or {}, opts.cuda)) for t in trials}

    def new(config: dict[str, Any]) -> bool:
        return settings_key(apply(base_s, config, opts.cuda)) not in tried

    if opts.workers is not None:
        # An explicit grid is the user's request: run it even when the
        # baseline says no setting can help (and say so).
        why = "--workers grid" if bf.data_bound else f"--workers grid ({not_data_bound(bf)})"
        for n in opts.workers:
            if new({"num_workers": n}):
                return {"num_workers": n}, why
        return _repeat(trials) or (None, "every setting of the --workers grid was measured")
    if not bf.data_bound:
        return None, not_data_bound(bf) + ", so no DataLoader setting can make it faster"
    for step in (_workers_step, _knobs_step):
        p = step(trials, base_s, bf, opts, new)
        if p is not None:
            return p
    return _repeat(trials) or (None, "converged: no untried setting is likely to be faster")


def not_data_bound(bf: Facts) -> str:
    return (
        f"not data-bound: the training loop waits for data {percent(bf.data_wait)} of the time "
        f"(under {percent(DATA_BOUND_WAIT)})"
    )


def ceiling_reached(trials: Sequence[dict[str, Any]], ceiling_rate: float | None) -> str | None:
    """Why the search can stop, when the fastest setting measured is within
    noise of the ceiling (the loop's pace with data for free); else None."""
    best = fastest(trials)
    if best is None or not ceiling_rate or ceiling_rate <= 0:
        return None
    allow = noise_allowance(groups(trials))
    share = best.mean / ceiling_rate
    if share < 1 - allow:
        return None
    return (
        f"the fastest setting reaches {percent(share)} of the ceiling (within the "
        f"{percent(allow)} noise allowance): the loader is no longer the limit; what is left "
        "is the step itself (see where its time goes with `dlwatch profile`)"
    )


def _kind(trials: Sequence[dict[str, Any]], bf: Facts) -> tuple[str | None, Facts]:
    """CPU or I/O, judged on the first measured trial with workers."""
    if bf.kind is not None:
        return bf.kind, bf
    for t in ok(trials):
        f = facts(t)
        if f.kind is not None:
            return f.kind, f
    return None, bf


def cpu_cap(usable_cores: float | None) -> int:
    """Workers for CPU-bound loading: one per usable core (0.75 of a core counts)."""
    if usable_cores is None:
        return 1
    return max(1, math.floor(usable_cores + 0.25))


def _workers_step(trials: Trials, base_s: Settings, bf: Facts, opts: Options, new: IsNew) -> Proposal | None:
    kind, kf = _kind(trials, bf)
    cap = IO_MAX_RECOMMENDED_WORKERS if kind == "io" else cpu_cap(bf.usable_cores)
    why_cap = (
        "I/O-bound workers (they sleep on reads, so their waits overlap past the core count)"
        if kind == "io"
        else f"CPU-bound workers: at most one per usable core ({cap})"
        if kind == "cpu"
        else f"no workers to judge CPU vs I/O by yet: at most one per usable core ({cap})"
    )
    # The num_workers ladder: the settings that differ from the baseline's in num_workers only.
    ladder = [g for g in groups(trials) if g.key == _nw_key(base_s, g.settings["num_workers"], opts.cuda)]
    nw0 = bf.num_workers
    if len(ladder) <= 1:
        little = kf.little or bf.little
        first = min(cap, max(little or 2 * nw0 or 2, nw0 + 1))
        if first > nw0 and new({"num_workers": first}):
            return {"num_workers": first}, (
                f"Little's law asks for {little} workers; {why_cap}" if little else why_cap
            )
    if not ladder:
        return None
    best = _best_of(ladder)
    nw = best.settings["num_workers"]
    counts = sorted(g.settings["num_workers"] for g in ladder)
    wait = best.wait
    if nw == counts[-1] and wait is not None and wait >= STILL_WAITING and nw < cap:
        up = min(cap, max(nw + 1, nw * 2))
        if new({"num_workers": up}):
            return {"num_workers": up}, (
                f"{nw} workers were the fastest so far and the loop still waits "
                f"{percent(wait)} of the time; {why_cap}"
            )
    if wait is not None and wait < STILL_WAITING:
        lower = [c for c in counts if c < nw]
        lo = lower[-1] if lower else 0
        mid = (lo + nw) // 2
        if lo < mid < nw and new({"num_workers": mid}):
            return {"num_workers": mid}, (
                f"with {nw} workers the loop no longer waits ({percent(wait)}): fewer may keep up"
            )
    return None


def _nw_key(base_s: dict[str, Any], nw: int, cuda: bool) -> tuple[Any, ...]:
    return settings_key(apply(base_s, {"num_workers": nw}, cuda))


def _best_of(gs: list[Group]) -> Group:
    top = max(gs, key=lambda g: g.mean)
    allow = noise_allowance(gs)
    near = [g for g in gs if g.mean >= top.mean * (1 - allow)]
    return min(near, key=lambda g: g.settings.get("num_workers") or 0)


def _knobs_step(trials: Trials, base_s: Settings, bf: Facts, opts: Options, new: IsNew) -> Proposal | None:
    best = fastest(trials)
    if best is None:
        return None
    s = best.settings
    nw = s.get("num_workers") or 0
    if nw == 0:
        return None
    tried_knobs = {k for t in trials for k in (t.get("config") or {}) if k != "num_workers"}
    t = max(best.trials, key=lambda x: x.get("steady_s") or 0)
    cfg = {k: s[k] for k in KNOBS if s.get(k) != base_s.get(k)}
    cfg["num_workers"] = nw
    stall, epoch = num(t.get("epoch_start_ms")), num(t.get("epoch_ms"))
    if (
        "persistent_workers" in opts.knobs
        and "persistent_workers" not in tried_knobs
        and not s.get("persistent_workers")
        and stall is not None
        and epoch
        and stall >= PERSIST_MIN_STALL_MS
        and stall / epoch >= PERSIST_MIN_SHARE
    ):
        c = dict(cfg, persistent_workers=True)
        if new(c):
            return c, (
                f"every epoch starts with a {stall:.0f} ms stall ({percent(stall / epoch)} of an epoch) "
                "while workers re-spawn"
            )
    wait = best.wait
    pf = s.get("prefetch_factor") or 2
    if (
        "prefetch_factor" in opts.knobs
        and "prefetch_factor" not in tried_knobs
        and wait is not None
        and wait >= STILL_WAITING
        and pf < PREFETCH_TRY
    ):
        c = dict(cfg, prefetch_factor=max(PREFETCH_TRY, pf * 2))
        if new(c):
            return (
                c,
                f"the loop still waits {percent(wait)} of the time: a deeper queue absorbs slow batches",
            )
    pin_ok = opts.cuda and "pin_memory" in opts.knobs
    if pin_ok and "pin_memory" not in tried_knobs and not s.get("pin_memory"):
        c = dict(cfg, pin_memory=True)
        if new(c):
            return c, "the job uses CUDA: page-locked batches copy to the GPU faster and asynchronously"
    return None


def _repeat(trials: Sequence[dict[str, Any]]) -> Proposal | None:
    """Measure the leading settings a second time (their spread is the noise)."""
    gs = sorted(groups(trials), key=lambda g: -g.mean)
    if len(gs) < 2:
        return None
    for g in gs[:REPEAT_LEADERS]:
        if len(g.trials) < 2:
            return dict(g.config), "repeat a leading setting to measure its spread"
    return None
