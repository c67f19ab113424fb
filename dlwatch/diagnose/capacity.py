"""Who uses the cores, and what a different worker count would give.

CPU accounting (RULES.md "CPU accounting"): a trainer's demand is its
measured CPU, all threads (intra-op pools, the pin-memory thread), plus its
run-queue wait; a worker's likewise; everyone else's is the host's busy time
on our CPUs minus the jobs' (``host.other_cpu_cores``). "One core per main
loop" was wrong both ways: an idle loop waiting on its GPU uses a tenth of a
core, and a CPU-only step with torch's intra-op threads uses all of them, so a
"free" core seen next to it did not exist.

The speed-up model: one batch of the loop takes ``T0 = wait_ms + step_ms``
now. With ``n`` workers it takes at least

- ``step_ms`` (the loop's own compute, which workers cannot shorten),
- ``load_ms / n`` (the pool delivers a batch every ``load_ms / n``), and
- ``C / K``: the job's CPU work per batch (``C`` = its measured CPU × T0, in
  core-ms, the same whoever does it) over the cores the job can have (``K`` =
  usable cores minus everyone else's CPU).

The third term is what "one core per main loop" missed: on a box whose cores
the compute already saturates, a worker moves CPU from compute to loading
and hides little. The prediction is ``T0 / max(...)``; the evidence names the
term that bounds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .facts import PERCENT_PER_CORE, Context, LoaderView, num, r

# A trainer without a CPU figure counts as one full core: the sum only ever
# shrinks "free", so unknown means pessimistic (and the evidence says so).
UNKNOWN_TRAINER_CORES = 1.0


def trainer_cpu(job: Mapping[str, Any]) -> float | None:
    """Measured CPU of the trainer process, all threads, in cores."""
    v = num(job.get("main_cpu_percent"))
    return None if v is None else max(0.0, v / PERCENT_PER_CORE)


def trainer_runqueue(job: Mapping[str, Any]) -> float:
    v = num(job.get("main_runqueue_percent"))
    return 0.0 if v is None else max(0.0, v / PERCENT_PER_CORE)


def trainer_demand(job: Mapping[str, Any]) -> float:
    cpu = trainer_cpu(job)
    return (UNKNOWN_TRAINER_CORES if cpu is None else cpu) + trainer_runqueue(job)


def others_cpu(ctx: Context) -> float | None:
    """Everyone else's CPU on our cores (measured by the collector), None if unknown."""
    v = num(ctx.host.get("other_cpu_cores"))
    return None if v is None else max(0.0, v)


def workers_demand(lv: LoaderView) -> float:
    # A worker without a CPU figure counts as a full core, as for trainers.
    return lv.cpu_sum + lv.rq_sum + lv.cpu_missing


@dataclass(frozen=True)
class Account:
    """The usable cores split by who uses them (cores; 1.0 = one core)."""

    usable: float
    others: float  # everyone else's CPU (0 when unknown: see ``others_measured``)
    others_measured: bool
    trainers: float  # Σ trainer CPU (all threads) + run-queue wait
    trainers_runqueue: float
    workers: float  # Σ worker CPU + run-queue wait (of the loaders counted)
    unknown_trainers: int

    @property
    def demand(self) -> float:
        return self.others + self.trainers + self.workers

    def evidence(self) -> dict[str, Any]:
        measured = ["trainer CPU (all threads) and run-queue wait", "worker CPU and run-queue wait"]
        assumed = []
        if self.others_measured:
            measured.append("other processes' CPU (host busy cores minus the jobs')")
        else:
            assumed.append("no other process uses the cores (host busy time not measured)")
        if self.unknown_trainers:
            assumed.append(f"{self.unknown_trainers} trainer(s) without a CPU figure use 1 core each")
        return {
            "usable_cores": self.usable,
            "other_cpu_cores": r(self.others, 2) if self.others_measured else None,
            "trainer_cpu_cores": r(self.trainers - self.trainers_runqueue, 2),
            "trainer_runqueue_cores": r(self.trainers_runqueue, 2),
            "worker_cpu_cores": r(self.workers, 2),
            "measured": measured,
            "assumed": assumed,
        }


def account(ctx: Context, loaders: list[LoaderView] | None = None) -> Account | None:
    """Every live trainer, the given loaders' workers (default: all), and everyone else."""
    if ctx.usable_cores is None:
        return None
    others = others_cpu(ctx)
    trainers = sum(trainer_demand(j) for j in ctx.live_jobs)
    rq = sum(trainer_runqueue(j) for j in ctx.live_jobs)
    unknown = sum(1 for j in ctx.live_jobs if trainer_cpu(j) is None)
    views = ctx.loaders if loaders is None else loaders
    return Account(
        usable=ctx.usable_cores,
        others=others or 0.0,
        others_measured=others is not None,
        trainers=trainers,
        trainers_runqueue=rq,
        workers=sum(workers_demand(lv) for lv in views),
        unknown_trainers=unknown,
    )


def free_cores_for(ctx: Context, lv: LoaderView, released: float = 0.0) -> tuple[float, Account] | None:
    """Cores this loader's workers may use in all: usable minus everyone
    else, every trainer and every other loader's workers; ``released`` is CPU
    the trainer would give up (its own loading, once workers do it)."""
    acc = account(ctx, [x for x in ctx.loaders if x is not lv])
    if acc is None:
        return None
    return acc.usable - acc.demand + released, acc


def job_cpu(ctx: Context, lv: LoaderView) -> float | None:
    """Measured CPU of this loader's job: its trainer (all threads) and this
    loader's workers, in cores."""
    cpu = trainer_cpu(lv.job)
    if cpu is None:
        return None
    return cpu + lv.cpu_sum


def job_capacity(ctx: Context, lv: LoaderView) -> float | None:
    """Cores this loader's job could have: usable minus everyone else's CPU,
    other trainers' and other loaders' workers. Never below what the job
    measurably uses already."""
    if ctx.usable_cores is None:
        return None
    others = others_cpu(ctx) or 0.0
    rest = sum(trainer_demand(j) for j in ctx.live_jobs if j is not lv.job)
    rest += sum(workers_demand(x) for x in ctx.loaders if x is not lv)
    k = ctx.usable_cores - others - rest
    used = job_cpu(ctx, lv)
    return max(k, used or 0.0, 0.0)


@dataclass(frozen=True)
class Prediction:
    speedup: float  # throughput after / before
    before_ms: float  # loop time per batch now: wait + step
    after_ms: float
    bound: str  # "compute step" | "workers" | "CPU"
    cpu_ms_per_batch: float | None  # the job's CPU work per batch (core-ms)
    capacity_cores: float | None

    def evidence(self) -> dict[str, Any]:
        return {
            "expected_speedup": r(self.speedup, 2),
            "expected_ms_per_batch": r(self.after_ms, 1),
            "ms_per_batch_now": r(self.before_ms, 1),
            "expected_bound": self.bound,
            "job_cpu_ms_per_batch": r(self.cpu_ms_per_batch, 1),
            "job_capacity_cores": r(self.capacity_cores, 2),
        }

    def phrase(self) -> str:
        why = {
            "compute step": "the loop's own step then sets the pace",
            "workers": "the workers then set the pace",
            "CPU": (
                f"the job's {self.cpu_ms_per_batch:.0f} core-ms of CPU per batch on the "
                f"{self.capacity_cores:.1f} cores it can have then set the pace"
                if self.cpu_ms_per_batch is not None and self.capacity_cores is not None
                else "the CPU then sets the pace"
            ),
        }[self.bound]
        return f"expected ≈ {self.speedup:.2f}× throughput ({why})"


def predict(ctx: Context, lv: LoaderView, n_workers: int, load_ms: float | None) -> Prediction | None:
    """Throughput with ``n_workers`` workers whose batch costs ``load_ms``
    each, relative to now (module docstring)."""
    wait_ms = num(lv.loader.get("wait_ms_mean"))
    step = lv.step_ms
    if wait_ms is None or step is None or step <= 0 or n_workers < 1 or load_ms is None:
        return None
    before = wait_ms + step
    terms = {"compute step": step, "workers": load_ms / n_workers}
    used, cap = job_cpu(ctx, lv), job_capacity(ctx, lv)
    cpu_per_batch = None
    if used is not None and cap is not None and cap > 0:
        cpu_per_batch = used * before
        terms["CPU"] = cpu_per_batch / cap
    bound = max(terms, key=lambda k: terms[k])
    after = max(terms[bound], 1e-6)
    return Prediction(before / after, before, after, bound, cpu_per_batch, cap)
