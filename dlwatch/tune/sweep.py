"""The sweep: baseline, then the trials ``search.propose`` asks for, within
``--max-trials`` and ``--budget``; the result document at the end.

The result document (``dlwatch tune --json``, docs/tune.md):
``schema_version``, ``command``, ``baseline`` and ``trials[]`` (trial
objects: ``index``, ``config`` — the knobs the trial overrode —, ``settings``,
``status``, ``why`` and the figures of ``measure.TrialMeter``), ``best`` (a
trial object of the recommended setting, with its mean and spread over its
repeats), ``speedup`` (best over baseline batches/s), ``ceiling`` (the
replay trial: the loop's pace when data is free), ``noise``,
``recommendation`` (a code line) and ``stopped_because``.

The ceiling trial runs right after a baseline that waits for data (the
search's data-bound threshold): the script's own settings with
``DLWATCH_OVERRIDES``' replay, so the selected loader serves batches it
already made. It is not one of ``trials`` (the search never sees it), does
not count towards ``--max-trials``, and once the fastest setting is within
noise of it the sweep stops: no loader setting can do better.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dlwatch import search
from dlwatch.diagnose import ceiling as hint_ceiling
from dlwatch.tune.runner import TrialOutcome, run_trial

SCHEMA_VERSION = 1
DEFAULT_TRIAL_S = 20.0
DEFAULT_MAX_TRIALS = 8
# The replay cache of the ceiling trial: about 20 batches (enough that a
# loop's per-batch variation averages out), within a byte budget.
CEILING_BATCHES = 20
DEFAULT_CEILING_BYTES = 1 << 30

# Pipelines whose settings DLWATCH_OVERRIDES reaches (a torch DataLoader, or a
# subclass that passes them on: MONAI's ThreadDataLoader).
SETTABLE_LIBRARIES = ("torch", "monai")


@dataclass
class TuneOptions:
    trial_s: float = DEFAULT_TRIAL_S
    max_trials: int = DEFAULT_MAX_TRIALS
    budget_s: float | None = None
    workers: list[int] | None = None
    all_loaders: bool = False
    warmup_s: float | None = None
    ceiling: bool = True
    ceiling_bytes: int = DEFAULT_CEILING_BYTES


@dataclass(eq=False)
class Sweep:
    """Run it with ``run()``; ``trials`` and ``document()`` are readable at any
    time (Ctrl-C ends ``run`` with what was measured)."""

    cmd: list[str]
    env: dict[str, str]
    opts: TuneOptions
    runner: Callable[..., TrialOutcome] = run_trial
    on_trial_start: Callable[[int, dict, str], None] | None = None
    on_progress: Callable | None = None
    clock: Callable[[], float] = time.monotonic

    def __post_init__(self) -> None:
        self.trials: list[dict] = []
        self.stopped_because = ""
        self.interrupted = False
        self.started = self.clock()
        self.selector: dict | str | None = None
        self.loader_id: int | None = None
        self.ceiling_trial: dict | None = None
        self.runs = 0  # commands started, the ceiling's included: {trial} in the command

    @property
    def elapsed_s(self) -> float:
        return self.clock() - self.started

    def budget_left(self) -> float | None:
        b = self.opts.budget_s
        return None if b is None else max(0.0, b - self.elapsed_s)

    def run(self) -> dict:
        try:
            self._loop()
        except KeyboardInterrupt:
            self.interrupted = True
            self.stopped_because = "interrupted (Ctrl-C): the running trial was stopped"
        return self.document()

    def _loop(self) -> None:
        sopts = search.Options(cuda=self._cuda(), workers=self.opts.workers)
        while True:
            unsettable = self._unsettable()
            if unsettable is not None:
                self.stopped_because = unsettable
                return
            if self._wants_ceiling():
                self._run_ceiling()
            reached = search.ceiling_reached(self.trials, self.ceiling_rate())
            if reached is not None:
                self.stopped_because = reached
                return
            config, why = search.propose(self.trials, sopts)
            if config is None:
                self.stopped_because = why
                return
            if len(self.trials) >= self.opts.max_trials:
                self.stopped_because = f"--max-trials {self.opts.max_trials} reached"
                return
            left = self.budget_left()
            if left is not None and self.trials:
                est = sum(t["elapsed_s"] for t in self.trials) / len(self.trials)
                if est > left:
                    self.stopped_because = f"--budget: {left:.0f} s left, a trial takes about {est:.0f} s"
                    return
            self._trial(config, why)
            sopts.cuda = self._cuda()

    def _unsettable(self) -> str | None:
        """Why no trial after the baseline can change anything: the loop's
        pipeline is not a torch DataLoader (torchdata.nodes, Grain, a watched
        iterable), and DLWATCH_OVERRIDES reaches DataLoaders only."""
        if len(self.trials) != 1 or self.trials[0].get("status") != "ok":
            return None
        loader = self.trials[0].get("pipeline") or {}
        lib = loader.get("library") or "torch"
        if lib in SETTABLE_LIBRARIES:
            return None
        knobs = ", ".join(f"{k}={v}" for k, v in (loader.get("knobs") or {}).items())
        own = f" ({knobs})" if knobs else ""
        return (
            f"the loop's pipeline is {lib}{own}, not a torch DataLoader: tune sets a DataLoader's "
            f"settings only, so it measured the script's own and stops; change the pipeline's knobs in "
            f"the script and compare runs with `dlwatch record` and `dlwatch compare`"
        )

    def _wants_ceiling(self) -> bool:
        if not self.opts.ceiling or self.ceiling_trial is not None or len(self.trials) != 1:
            return False
        base = self.trials[0]
        return base.get("status") == "ok" and search.facts(base).data_bound

    def ceiling_rate(self) -> float | None:
        c = self.ceiling_trial
        return c.get("batches_per_s") if c is not None and c.get("status") == "ok" else None

    def _run_ceiling(self) -> None:
        why = "data is free: the loader replays batches it already made (the ceiling)"
        replay = {"batches": CEILING_BATCHES, "max_bytes": self.opts.ceiling_bytes}
        if self.on_trial_start is not None:
            self.on_trial_start(-1, {"replay": replay}, why)
        override = {"loader": self.selector or "all", "replay": replay}
        try:
            out = self._run(override)
        except KeyboardInterrupt as e:
            partial = getattr(e, "outcome", None)
            if partial is not None:
                self.ceiling_trial = self._trial_doc(-1, {}, why, partial)
            raise
        self.ceiling_trial = self._trial_doc(-1, {}, why, out)
        rep = self.ceiling_trial.get("replay") or {}
        if out.status == "ok" and rep.get("state") != "replaying":
            self.ceiling_trial["status"] = "not-applied"
            self.ceiling_trial["reason"] = "the loader never replayed: the override did not reach it"

    def _run(self, override: dict | None):
        """One trial of the command with ``override`` (None: the script's own
        settings). The baseline, the sweep's first pass over the data, waits
        for its first epoch to end where that fits in the trial's bound
        (measure.py: a cold page cache slows that pass only)."""
        self.runs += 1
        return self.runner(
            trial_command(self.cmd, self.runs),
            self.env,
            override,
            self.opts.trial_s,
            loader_id=self.loader_id,
            warmup_s=self.opts.warmup_s,
            on_progress=self.on_progress,
            first_epoch=not self.trials,
        )

    def _cuda(self) -> bool:
        return bool(self.trials and self.trials[0].get("cuda_initialized") is True)

    def _trial(self, config: dict, why: str) -> None:
        index = len(self.trials)
        if self.on_trial_start is not None:
            self.on_trial_start(index, config, why)
        override = None
        if index > 0:
            override = {"loader": self.selector or "all", **config}
        try:
            out = self._run(override)
        except KeyboardInterrupt as e:
            partial = getattr(e, "outcome", None)
            if partial is not None:
                self._record(index, config, why, partial)
            raise
        self._record(index, config, why, out)

    def _record(self, index: int, config: dict, why: str, out: TrialOutcome) -> None:
        trial = self._trial_doc(index, config, why, out)
        settings = trial["settings"]
        loader = out.figures.get("loader") or {}
        if index == 0:
            self._pick_loader(trial, loader)
        elif out.status == "ok" and self.trials and self.trials[0].get("settings"):
            want = search.apply(self.trials[0]["settings"], config, self._cuda())
            if search.settings_key(want) != search.settings_key(settings):
                trial["status"] = "not-applied"
                trial["reason"] = (
                    f"the loader reported {_fmt_settings(settings)}, not {_fmt_settings(want)}: "
                    "the override did not reach it (does the script build its loaders in another order?)"
                )
        self.trials.append(trial)

    def _trial_doc(self, index: int, config: dict, why: str, out: TrialOutcome) -> dict:
        fig = dict(out.figures)
        loader = fig.pop("loader", None) or {}
        settings = {k: loader.get(k) for k in search.KNOBS} if loader else {}
        pipeline = (
            {
                "library": loader.get("library") or "torch",
                "knobs": loader.get("knobs"),
                "loader_class": loader.get("loader_class"),
                "framework": loader.get("framework"),
            }
            if loader
            else {}
        )
        return {
            "pipeline": pipeline,
            "index": index,
            "config": dict(config),
            "settings": settings,
            "status": out.status,
            "reason": out.reason,
            "why": why,
            **fig,
            "returncode": out.returncode,
            "stderr_tail": out.stderr_tail,
            "elapsed_s": out.elapsed_s,
            "cleanup": out.cleanup,
        }

    def _pick_loader(self, trial: dict, loader: dict) -> None:
        """The loader later trials change (and measure): the baseline's busiest."""
        lid = trial.get("loader_id")
        if lid is None or not loader:
            return
        self.loader_id = lid
        if self.opts.all_loaders:
            self.selector = "all"
            return
        same = [
            x["id"]
            for x in trial.get("loaders_seen") or []
            if x.get("dataset") == loader.get("dataset") and x.get("batch_size") == loader.get("batch_size")
        ]
        self.selector = {
            "index": sorted(same).index(lid) if lid in same else 0,
            "dataset": loader.get("dataset"),
            "batch_size": loader.get("batch_size"),
        }

    # --- the result --------------------------------------------------------------

    def document(self) -> dict:
        base = self.trials[0] if self.trials else None
        chosen = search.choose(self.trials) if base is not None and base.get("status") == "ok" else None
        base_group = next(
            (
                g
                for g in search.groups(self.trials)
                if base and g.key == search.settings_key(base["settings"])
            ),
            None,
        )
        best = speedup = spread = None
        rec = None
        if chosen is not None and base_group is not None and base is not None:
            rep = max(chosen.trials, key=lambda t: t["batches_per_s"])
            best = dict(
                rep,
                batches_per_s_mean=round(chosen.mean, 3),
                batches_per_s_spread=_r(chosen.spread, 4),
                repeats=[t["index"] for t in chosen.trials],
            )
            speedup = round(chosen.mean / base_group.mean, 3) if base_group.mean > 0 else None
            spread = _r(search.measured_noise(search.groups(self.trials)), 4)
            pipe = base.get("pipeline") or {}
            rec = code_line(
                chosen.settings, base["settings"], pipe.get("loader_class"), pipe.get("framework")
            )
        return {
            "schema_version": SCHEMA_VERSION,
            "command": list(self.cmd),
            "trial_seconds": self.opts.trial_s,
            "loader": self.selector,
            "loader_id": self.loader_id,
            "usable_cores": base.get("usable_cores") if base else None,
            "baseline": base,
            "trials": self.trials,
            "best": best,
            "speedup": speedup,
            "speedup_spread": spread,
            "speedup_notes": speedup_notes(base, best, base_group.trials if base_group else ())
            if speedup is not None
            else [],
            "noise": self._noise(),
            "ceiling": self._ceiling_doc(base_group, chosen),
            "recommendation": rec,
            "stopped_because": self.stopped_because,
            "interrupted": self.interrupted,
            "elapsed_s": round(self.elapsed_s, 1),
        }

    def _noise(self) -> dict:
        gs = search.groups(self.trials)
        worst = max(
            (g for g in gs if len(g.trials) >= 2),
            key=lambda g: (max(g.rates) - min(g.rates)) / g.mean if g.mean > 0 else 0.0,
            default=None,
        )
        return {
            "measured": _r(search.measured_noise(gs), 4),
            "allowance": round(search.noise_allowance(gs), 4),
            "repeats": [round(x, 3) for x in worst.rates] if worst is not None else [],
            "settings": worst.settings if worst is not None else None,
        }

    def _ceiling_doc(self, base_group, chosen) -> dict | None:
        c = self.ceiling_trial
        if c is None:
            return None
        rate = c.get("batches_per_s") if c.get("status") == "ok" else None
        rep = c.get("replay") or {}
        base_rate = base_group.mean if base_group is not None and base_group.mean > 0 else None
        return {
            "batches_per_s": rate,
            "speedup": round(rate / base_rate, 3) if rate and base_rate else None,
            "method": "replay",
            "batches_cached": rep.get("batches_cached"),
            "batches_wanted": rep.get("batches_wanted"),
            "bytes_cached": rep.get("bytes_cached"),
            "limited_by": rep.get("limited_by"),
            "in_place": rep.get("in_place"),
            "best_share": round(chosen.mean / rate, 3) if rate and chosen is not None else None,
            "hints": self._bounded_hints(rate / base_rate if rate and base_rate else None),
            "status": c.get("status"),
            "reason": c.get("reason"),
            "trial": c,
        }

    def _bounded_hints(self, measured: float | None) -> list[dict]:
        """The baseline's worker-count hints with their promise bounded by the
        measured ceiling (the live view can only estimate it)."""
        base = self.trials[0] if self.trials else {}
        out = []
        for hid, promised in (base.get("hint_speedups") or {}).items():
            h = {"id": hid, "evidence": {"expected_speedup": promised}}
            ev = hint_ceiling.bound(h, None, measured)["evidence"]
            out.append({"id": hid, "promised": promised, "expected_speedup": ev["expected_speedup"]})
        return out


TRIAL_FIELD = "{trial}"


def trial_command(cmd: list[str], run: int) -> list[str]:
    """``cmd`` with ``{trial}`` replaced by the run's number (1 for the
    baseline): a script that refuses to run twice with the same arguments
    (OpenCLIP: "Experiment already exists" for a ``--name`` whose logs are
    there) gets a fresh one each trial, ``--name tune{trial}``."""
    return [a.replace(TRIAL_FIELD, str(run)) for a in cmd]


def pace_note(trial: dict) -> str:
    """How a trial's steady state was chosen, when not simply: the slower
    start left out, a pace still rising at the bound, a first epoch only."""
    parts = []
    for p in trial.get("left_out") or []:
        rise = p.get("rise")
        x = f", {rise:.2f}x slower" if isinstance(rise, (int, float)) else ""
        what = "the first epoch" if p.get("cause") == "first-epoch" else "the pace still rose"
        parts.append(f"its first {p.get('s', 0):.0f} s left out ({what}{x})")
    if trial.get("settled") is False:
        rise = trial.get("pace_rise")
        by = f" (+{(rise - 1) * 100:.0f} % over the window)" if isinstance(rise, (int, float)) else ""
        parts.append(f"not settled: still rising at the bound{by}")
    elif trial.get("first_epoch_only") and trial.get("index") == 0:
        parts.append("its first epoch only")
    return "; ".join(parts)


# A first-epoch baseline that read less than this from storage (/proc/PID/io
# read_bytes of the job's processes, page-cache hits not counted) paid no
# cold cache.
COLD_CACHE_READ_BYTES = 1 << 20


def speedup_notes(base: dict | None, best: dict | None, base_trials: Iterable[dict] = ()) -> list[str]:
    """What the speed-up rests on, where a pace had not settled (issue 43:
    a baseline timed on a cold first epoch made a 1.09x setting read 1.23x).
    ``base_trials``: every trial of the baseline's settings (the speed-up is
    over their mean); one timed past the first epoch answers the cold-cache
    doubt (a QA run: the note stood beside a repeat that measured the same)."""
    notes = []
    warm = any(
        t is not base and t.get("status") == "ok" and not t.get("first_epoch_only") for t in base_trials
    )
    if base and base.get("settled") is False:
        notes.append("the baseline's pace was still rising when its trial ended: the gain may be overstated")
    elif base and base.get("first_epoch_only") and not warm:
        read = base.get("storage_read_bytes")
        if not isinstance(read, int) or read >= COLD_CACHE_READ_BYTES:
            how = f" (it read {read / 2**20:.0f} MiB from storage)" if isinstance(read, int) else ""
            notes.append(
                "the baseline was timed within the script's first epoch, which outlasted its trial: if that "
                f"pass read its data from a cold page cache{how}, later trials read a warm one, and part of "
                "the gain is the cache"
            )
        # Reading nothing from storage, no cache made it slower (a QA run:
        # the note stood beside a dataset generated in memory).
    if best and best.get("settled") is False and best.get("index") != 0:
        notes.append(
            "the recommended setting's pace was still rising when its trial ended: "
            "the gain may be understated"
        )
    return notes


# torch's prefetch_factor where workers run and the script leaves it unset:
# a recommendation from 0 workers need not name it.
TORCH_DEFAULT_PREFETCH = 2


def code_line(
    settings: dict, base: dict, loader_class: str | None = None, framework: str | None = None
) -> str:
    """What to write in the script: num_workers always, the other knobs where
    they differ from the script's own; in the class the script builds (a
    DataLoader subclass: litdata's StreamingDataLoader, MONAI's
    ThreadDataLoader), or where the framework that builds the loader takes
    them (the HF Trainer's TrainingArguments: a QA run's Trainer job read
    "DataLoader(..., num_workers=8, prefetch_factor=2)", with no DataLoader
    in the script and a prefetch_factor it never set)."""
    n = settings.get("num_workers") or 0
    changed = []
    for k in ("persistent_workers", "prefetch_factor", "pin_memory"):
        v = settings.get(k)
        if v is None or v == base.get(k):
            continue
        if k == "prefetch_factor" and base.get(k) is None and v == TORCH_DEFAULT_PREFETCH:
            continue
        changed.append((k, v))
    if framework == "transformers":
        args = [f"dataloader_num_workers={n}", *(f"dataloader_{k}={v}" for k, v in changed)]
        return f"TrainingArguments(..., {', '.join(args)})"
    parts = ", ".join([f"num_workers={n}", *(f"{k}={v}" for k, v in changed)])
    if framework == "lightning":
        return (
            f"DataLoader(..., {parts}) in your LightningModule's or LightningDataModule's train_dataloader()"
        )
    if framework == "accelerate":
        return f"DataLoader(..., {parts}), the one you pass to accelerator.prepare()"
    cls = loader_class if isinstance(loader_class, str) and loader_class.isidentifier() else "DataLoader"
    return f"{cls}(..., {parts})"


def _fmt_settings(s: dict) -> str:
    return ", ".join(f"{k}={s.get(k)}" for k in search.KNOBS)


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
