"""The sweep: baseline, then the trials ``search.propose`` asks for, within
``--max-trials`` and ``--budget``; the result document at the end.

The result document (``dlwatch tune --json``, README "Tune"):
``schema_version``, ``command``, ``baseline`` and ``trials[]`` (trial
objects: ``index``, ``config`` — the knobs the trial overrode —, ``settings``,
``status``, ``why`` and the figures of ``measure.TrialMeter``), ``best`` (a
trial object of the recommended setting, with its mean and spread over its
repeats), ``speedup`` (best over baseline batches/s), ``recommendation`` (a
code line) and ``stopped_because``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from dlwatch import search
from dlwatch.tune.runner import TrialOutcome, run_trial

SCHEMA_VERSION = 1
DEFAULT_TRIAL_S = 20.0
DEFAULT_MAX_TRIALS = 8


@dataclass
class TuneOptions:
    trial_s: float = DEFAULT_TRIAL_S
    max_trials: int = DEFAULT_MAX_TRIALS
    budget_s: float | None = None
    workers: list[int] | None = None
    all_loaders: bool = False
    warmup_s: float | None = None


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
            out = self.runner(
                self.cmd,
                self.env,
                override,
                self.opts.trial_s,
                loader_id=self.loader_id,
                warmup_s=self.opts.warmup_s,
                on_progress=self.on_progress,
            )
        except KeyboardInterrupt as e:
            partial = getattr(e, "outcome", None)
            if partial is not None:
                self._record(index, config, why, partial)
            raise
        self._record(index, config, why, out)

    def _record(self, index: int, config: dict, why: str, out: TrialOutcome) -> None:
        fig = dict(out.figures)
        loader = fig.pop("loader", None) or {}
        settings = {k: loader.get(k) for k in search.KNOBS} if loader else {}
        trial = {
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
        if chosen is not None and base_group is not None:
            rep = max(chosen.trials, key=lambda t: t["batches_per_s"])
            best = dict(
                rep,
                batches_per_s_mean=round(chosen.mean, 3),
                batches_per_s_spread=_r(chosen.spread, 4),
                repeats=[t["index"] for t in chosen.trials],
            )
            speedup = round(chosen.mean / base_group.mean, 3) if base_group.mean > 0 else None
            spreads = [s for s in (chosen.spread, base_group.spread) if s is not None]
            spread = round(sum(s * s for s in spreads) ** 0.5, 4) if spreads else None
            rec = code_line(chosen.settings, base["settings"])
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
            "recommendation": rec,
            "stopped_because": self.stopped_because,
            "interrupted": self.interrupted,
            "elapsed_s": round(self.elapsed_s, 1),
        }


def code_line(settings: dict, base: dict) -> str:
    """What to write in the script: num_workers always, the other knobs where
    they differ from the script's own."""
    parts = [f"num_workers={settings.get('num_workers') or 0}"]
    for k in ("persistent_workers", "prefetch_factor", "pin_memory"):
        if settings.get(k) != base.get(k) and settings.get(k) is not None:
            parts.append(f"{k}={settings[k]}")
    return f"DataLoader(..., {', '.join(parts)})"


def _fmt_settings(s: dict) -> str:
    return ", ".join(f"{k}={s.get(k)}" for k in search.KNOBS)


def _r(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
