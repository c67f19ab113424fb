"""Who uses the cores, and what a different worker count would give.

CPU accounting (RULES.md "CPU accounting"): a trainer's demand is its
measured CPU, all threads (intra-op pools, the pin-memory thread), plus its
run-queue wait; a worker's likewise; everyone else's is the host's busy time
on our CPUs minus the jobs' (``host.other_cpu_cores``). "One core per main
loop" was wrong both ways: an idle loop waiting on its GPU uses a tenth of a
core, and a CPU-only step with torch's intra-op threads uses all of them, so a
"free" core seen next to it did not exist.

The speed-up model (``CycleModel``, RULES.md "Predicted gain"): one batch
takes ``wait_ms + step_ms`` now; with another worker count it takes the
longest of the step, the pool's delivery, the job's CPU work over its cores,
and the step stretched by the loading CPU that does not fit on the cores the
trainer's threads leave idle. The last term is what a brute-force sweep of
CPU training showed: a trainer whose intra-op threads fill the cores loses a
worker's whole CPU time per batch, it does not share the cores fairly.
Where the model does not reproduce the measured cycle of the current count,
it gives no number (``NoPrediction``) rather than a wrong one.
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
    other trainers' and other loaders' workers; or, on cores others keep
    busy, its fair share of them (``share_of``). Never below what the job
    measurably uses already."""
    parts = capacity_parts(ctx, lv)
    return None if parts is None else parts[0]


def capacity_parts(ctx: Context, lv: LoaderView) -> tuple[float, Share | None] | None:
    """``job_capacity`` and, where others keep the cores busy, the share
    that prices it at another worker count."""
    if ctx.usable_cores is None:
        return None
    others = others_cpu(ctx) or 0.0
    rest = sum(trainer_demand(j) for j in ctx.live_jobs if j is not lv.job)
    rest += sum(workers_demand(x) for x in ctx.loaders if x is not lv)
    k = ctx.usable_cores - others - rest
    used = job_cpu(ctx, lv)
    share = share_of(ctx, lv, others + rest)
    fair = share.cores(lv.num_workers or 0) if share else 0.0
    return max(k, used or 0.0, fair, 0.0), share


# The least share of the CPU it wants that a job's threads are taken to get
# (their CPU over CPU plus run-queue wait): bounds the estimate of how many
# threads the others run.
MIN_GRANT = 0.05
# A thread at a positive nice against one at nice 0, on a contested core: the
# kernel's weight at nice 10 (what `nice` alone gives) is 110 against 1024.
# The others' CPU at a positive nice (/proc/stat's "nice" time) counts as
# threads of this weight: they use the idle time, and yield the rest.
NICED_WEIGHT = 110 / 1024


@dataclass(frozen=True)
class Share:
    """Contended cores split by runnable threads (``share_of``)."""

    usable: float
    mine: int  # the trainer's busy threads
    theirs: float  # the others' runnable threads, by weight

    def cores(self, workers: int) -> float:
        """The job's share with ``workers`` worker processes, each a thread
        that wants a core."""
        m = self.mine + workers
        return self.usable * m / (m + self.theirs)


def share_of(ctx: Context, lv: LoaderView, theirs: float) -> Share | None:
    """How the cores would be shared if each of the job's threads (the
    trainer's busy ones and one per worker) wanted a core, on cores others
    use ``theirs`` of: Linux's scheduler shares contended cores equally among
    the runnable threads by their weight (nice). The others' runnable
    threads are their CPU over the share the job's threads get of what they
    want (CPU over CPU plus run-queue wait); those at a positive nice weigh
    ``NICED_WEIGHT`` each: background work started with ``nice`` takes
    only the idle time from nice-0 threads, and a share at equal weight
    underpriced the cores the job would get.

    Why: "what the others leave free" is no limit for a job whose threads
    seldom want a core. A QA run on a box others kept 97-100 % busy: two
    ranks with one worker each that slept on storage read 0.06 cores "free",
    so the CPU term held every count at 1.00x; 2 workers measured 2.15x. A
    job whose threads do want the cores gets about what it uses now, and
    more with each worker it adds: each is one more runnable thread."""
    usable = ctx.usable_cores
    if usable is None or theirs <= 0 or lv.cpu_missing:
        return None
    t_cpu = trainer_cpu(lv.job)
    if t_cpu is None:
        return None
    t_rq = trainer_runqueue(lv.job)
    cpu = t_cpu + lv.cpu_sum
    wait = t_rq + lv.rq_sum
    grant = max(MIN_GRANT, cpu / (cpu + wait)) if cpu + wait > 0 else 1.0
    niced = min(theirs, num(ctx.host.get("other_niced_cpu_cores")) or 0.0)
    their_threads = (theirs - niced + niced * NICED_WEIGHT) / grant
    return Share(usable, max(1, round(t_cpu + t_rq)), their_threads)


# The model's cycle for the loader's current count must match the measured
# one within this fraction, or its prediction for another count is no number
# to print: something it does not know (a GPU sync, a lock, a CPU figure from
# another phase of the job) sets the pace.
MODEL_FIT_TOLERANCE = 0.25


@dataclass(frozen=True)
class CycleModel:
    """What one batch costs the job, split so another worker count can be priced.

    Measured (ms per batch unless said): ``now`` = wait + step; ``step`` =
    the loop's step; ``trainer_cores`` = the cores its threads want while
    they compute (its CPU per batch over the step, run-queue wait included);
    ``load_cpu`` = CPU the loading costs per batch (core-ms: the workers'
    CPU, or with num_workers=0 the main thread's during the wait);
    ``load_off_cpu`` = loading time off a CPU (storage, sleeps); ``capacity``
    = the cores the job can have.

    With ``n ≥ 1`` workers a batch takes the longest of: the step; the pool's
    delivery ``(load_cpu + load_off_cpu) / n``; the job's CPU work over its
    cores ``(trainer CPU + load_cpu) / capacity``; and the step stretched by
    loading that does not fit on the cores the trainer leaves idle,
    ``(step + load_cpu) / (1 + idle)``. The last is the sweep's finding on CPU
    training: a trainer whose intra-op threads fill the cores is a gang whose
    parallel regions wait for the slowest thread, so a worker's CPU time on
    one of its cores stalls all of it rather than sharing the core fairly
    (workers measured 1.00× where the CPU sum predicted 1.40×). With
    ``n = 0`` the loop loads each batch itself: step + loading.
    """

    now: float
    step: float
    trainer_cores: float
    trainer_cpu: float  # core-ms per batch of the trainer's own work (loading excluded)
    load_cpu: float
    load_off_cpu: float
    capacity: float
    workers_now: int
    # Loaders the loop takes from in the same steps (facts.Partner): their
    # workers' least time per batch of this one. Faster loading here cannot
    # make the loop outrun them; ``step`` then excludes the loop's wait on them.
    partners: tuple[tuple[int, float], ...] = ()
    # num_workers=0 behind a feeder thread (a producer thread, MONAI's buffer):
    # that thread loads while the loop computes, one batch at a time, as one
    # in-process worker would. ``n`` worker processes then load n at once.
    thread_fed: bool = False
    # The usable cores, when known: what ``capacity`` is short of them is
    # the others' (said with the capacity: a QA run read "the 1.6 cores it
    # can have" beside a host line of 2.0 usable cores, with no reason).
    usable: float | None = None
    # Where others keep the cores busy: how they are shared, so that a count
    # with more workers gets the larger share its added threads win. Held at
    # ``capacity`` for the current count and fewer: a QA box kept busy by two
    # CPU burners priced 1 worker at 1.36x with the 0-worker job's share;
    # it measured 1.70x.
    share: Share | None = None
    # ms of the loop thread's CPU inside next() per batch with workers (the
    # probe's next_cpu_ms_mean): taking a batch off their queue, in series
    # with the step, however many workers load. 0: not measured.
    handover: float = 0.0

    def capacity_for(self, n: int) -> float:
        """The cores the job can have with ``n`` workers."""
        if self.share is None or n <= self.workers_now:
            return self.capacity
        return min(self.share.usable, max(self.capacity, self.share.cores(n)))

    def can_have_with(self, n: int) -> str:
        """ "the 1.6 cores it can have (of 2.0 usable: other processes and
        jobs use the rest)", or without the parenthesis when it has them all;
        "would have" where more workers win it a larger share."""
        cap = self.capacity_for(n)
        text = f"the {cap:.1f} cores it can have"
        if cap > self.capacity + 0.05:
            # More runnable threads win more of the contended cores.
            text = f"the {cap:.1f} cores it would have with {n} worker{'s' if n != 1 else ''}"
        if self.usable is not None and cap < self.usable - 0.05:
            text += f" (of {self.usable:.1f} usable: other processes and jobs use the rest)"
        return text

    def contended(self, n: int) -> float | None:
        """ms per batch with ``n`` workers on cores others keep busy, phase by
        phase: while the trainer computes, its threads, the workers and the
        others' threads share the cores; while it waits for a batch, only
        the workers and the others do. Each runnable thread gets
        ``usable / runnable threads`` of a core (at most one), so a worker
        loads slower while the step runs than the trainer did alone.

        Why: the CPU term prices the job's share as if the job could use it
        all batch long, but a waiting trainer has no thread to run. OpenCLIP
        on webdataset (0 workers, another process on one of 2 cores) read
        "1 worker ≈ 1.32×" and measured 1.04×; a demo loop loading 95 ms a
        batch beside a 34 ms step and a CPU burner read 1.33×, measured
        1.14×, and prices 1.14× so.

        None where it does not apply: no others on the cores, workers
        already (it takes every worker as runnable all batch long, which
        workers that keep up are not: a loader priced from its current count
        then read its own cycle 2.4x too long), loading that waits off a CPU
        more than on it, or a trainer whose threads fill several cores (a
        gang of intra-op threads: workload a beside two burners measured
        1.57× where this priced 1.06×; its step ran faster with workers than
        without, which no sharing model here explains)."""
        sh = self.share
        if sh is None or n < 1 or self.workers_now or sh.mine > 1 or self.load_off_cpu > 0.25 * self.load_cpu:
            return None

        def rate(threads: float) -> float:
            return min(1.0, sh.usable / max(threads + sh.theirs, 1e-9))

        m = self.trainer_cores
        # The step's CPU part, at the rate its threads get now; the rest
        # (a GPU, a sleep) is not the cores'.
        cpu_now = self.trainer_cpu / m / rate(m) if m > 1e-6 else 0.0
        off = max(0.0, self.step - cpu_now)
        r_step = rate(m + n)
        step = off + (self.trainer_cpu / m / r_step if m > 1e-6 else 0.0)
        per_worker = self.load_cpu / n
        behind = max(0.0, per_worker - r_step * step) / rate(n)
        return step + behind + self.load_off_cpu / n

    def idle_cores(self, n: int) -> float:
        return max(0.0, self.capacity_for(n) - self.trainer_cores)

    def terms(self, n: int) -> dict[str, float]:
        others = {f"loader {lid}": floor for lid, floor in self.partners}
        cap = self.capacity_for(n)
        if n <= 0 and self.thread_fed:
            return {
                "compute step": self.step,
                "feeder thread": self.load_cpu + self.load_off_cpu,
                "CPU": (self.trainer_cpu + self.load_cpu) / cap,
                **others,
            }
        if n <= 0:
            return {"loop loads": self.step + self.load_cpu + self.load_off_cpu, **others}
        out = {
            "compute step": self.step,
            # The loop's thread takes each batch (unpickles it, maps its
            # tensors) between its steps: no count of workers hides that.
            # An HF stream with a 3.2 ms step priced 6 workers at 2.48x
            # without it, measured 1.87-2.24x (RULES.md "Predicted gain").
            **({"handover": self.step + self.handover} if self.handover > 0 else {}),
            "workers": (self.load_cpu + self.load_off_cpu) / n,
            "CPU": (self.trainer_cpu + self.load_cpu) / cap,
            "shared cores": (self.step + self.load_cpu) / (1.0 + self.idle_cores(n)),
            **others,
        }
        contended = self.contended(n)
        if contended is not None:
            out["contended cores"] = contended
        return out

    def cycle(self, n: int) -> tuple[float, str]:
        """Predicted ms per batch with ``n`` workers, and the term that sets it."""
        t = self.terms(n)
        bound = max(t, key=lambda k: t[k])
        return max(t[bound], 1e-6), bound

    def fit(self) -> float:
        """Model over measurement for the current count (1.0: exact)."""
        return self.cycle(self.workers_now)[0] / self.now


def cycle_model(ctx: Context, lv: LoaderView) -> tuple[CycleModel | None, str]:
    """The loader's cycle model from its measurements, or None and why not."""
    wait_ms = num(lv.loader.get("wait_ms_mean"))
    step = lv.step_ms
    n0 = lv.num_workers
    if wait_ms is None or step is None or step <= 0 or n0 is None:
        if lv.loader.get("sampled") is True:
            return None, (
                "the wait and step times per batch are never measured when attached (only the hook "
                "counts batches): run the job with the hook for them"
            )
        return None, "the loader's wait and step times per batch are not measured yet"
    c_t = trainer_cpu(lv.job)
    parts = capacity_parts(ctx, lv)
    cap, share = parts if parts is not None else (None, None)
    if c_t is None or cap is None or cap <= 0:
        return None, "the trainer's CPU is not measured"
    now = wait_ms + step
    # zip(a, b): the loop's wait on the other loaders sits in this one's step.
    # It is theirs, not the loop's compute: the step is what is left, and
    # their workers' pace is a floor of its own (a QA run: "num_workers=10,
    # ≈ 4.85×" measured 1.97×, the other loader's workers then the limit).
    fed = [p for p in lv.partners if p.num_workers]
    blind = [p.lid for p in fed if p.floor_ms is None]
    if blind:
        return None, (
            f"the same loop also takes from loader {blind[0]}, and its workers' busy time is not "
            f"measured, so how fast it could go is not known"
        )
    step = step - sum(p.wait_ms for p in fed)
    if step <= 0:
        return None, "the loop's waits on the loaders it takes from together hold all of its step"
    rq = trainer_runqueue(lv.job) * now
    fed_ms = thread_fed_load(lv) if n0 == 0 else None
    if fed_ms is not None:
        # The feeder thread's time in the loader per batch is the loading;
        # the trainer's CPU beyond its main thread's is (mostly) that thread's.
        main_thread = num(lv.job.get("main_thread_cpu_percent"))
        others_cpu_cores = c_t if main_thread is None else max(0.0, c_t - main_thread / PERCENT_PER_CORE)
        load_cpu = min(fed_ms, others_cpu_cores * now)
        off_cpu = max(0.0, fed_ms - load_cpu)
        trainer_work = max(0.0, c_t * now - load_cpu)
    elif n0 == 0:
        main_thread = num(lv.job.get("main_thread_cpu_percent"))
        frac = wait_ms / now
        load_cores = frac if main_thread is None else min(frac, main_thread / PERCENT_PER_CORE)
        load_cpu = load_cores * now
        off_cpu = max(0.0, wait_ms - load_cpu)
        trainer_work = max(0.0, c_t * now - load_cpu)
    else:
        if lv.cpu_missing:
            return None, "a worker's CPU is not measured"
        load_cpu = lv.cpu_sum * now
        w = lv.worker_ms
        off_cpu = 0.0 if w is None else max(0.0, w - load_cpu - lv.rq_sum * now)
        trainer_work = c_t * now
    # The cores the trainer's threads want while computing: their CPU and
    # run-queue wait per batch over the step. The step itself is kept as
    # measured: how much of it the workers stretch now is not known apart
    # from other processes' share, so fewer workers are never priced faster
    # than the model's sum says (no gain promised that the run queue hides).
    cores = min(cap, (trainer_work + rq) / step)
    floors = tuple((p.lid, p.floor_ms) for p in fed if p.floor_ms is not None)
    m = CycleModel(
        now,
        step,
        cores,
        trainer_work,
        load_cpu,
        off_cpu,
        cap,
        n0,
        floors,
        fed_ms is not None,
        ctx.usable_cores,
        share,
        handover_ms(lv, wait_ms) if n0 > 0 else 0.0,
    )
    fit = m.fit()
    if abs(fit - 1.0) > MODEL_FIT_TOLERANCE:
        return None, misfit(m.cycle(n0)[0], now)
    return m, ""


def handover_ms(lv: LoaderView, wait_ms: float) -> float:
    """The loop thread's CPU inside next() per batch (the probe's reading),
    at most the wait it is part of; 0 where not read. Only with workers: with
    none, next() is the loading itself, which the model prices apart."""
    v = num(lv.loader.get("next_cpu_ms_mean"))
    return 0.0 if v is None or v <= 0 else min(v, wait_ms)


def thread_fed_load(lv: LoaderView) -> float | None:
    """ms a batch a feeder thread spends in the loader (its own wait), for a
    loader the loop takes from through that thread's queue; None otherwise."""
    if not isinstance(lv.loader.get("consumer"), dict):
        return None
    fd = lv.loader.get("feeder")
    v = num(fd.get("wait_ms_mean")) if isinstance(fd, dict) else None
    return v if v is not None and v > 0 else None


def misfit(model_ms: float, now_ms: float) -> str:
    """Why a model that misses the measured cycle prices nothing, in the
    direction it misses: short of the cycle, something unseen sets the pace;
    past it, the CPU figures hold more than the batches' work (issue 43: "its
    CPU figures account for 782 ms of the 500 ms each batch takes" said
    neither)."""
    if model_ms < now_ms:
        return (
            f"its CPU figures account for only {model_ms:.0f} ms of the {now_ms:.0f} ms each batch takes "
            f"now: something they do not show sets the pace (a GPU sync, a lock, I/O in the step)"
        )
    return (
        f"its CPU figures would make each batch take {model_ms:.0f} ms, yet it takes {now_ms:.0f} ms "
        f"now: they hold work that does not slow these batches (another phase or loader of the job, "
        f"CPU time the step overlaps)"
    )


@dataclass(frozen=True)
class Prediction:
    speedup: float  # throughput after / before
    before_ms: float  # loop time per batch now: wait + step
    after_ms: float
    # "compute step" | "handover" | "workers" | "CPU" | "shared cores" | "contended cores" | "loop loads"
    bound: str
    model: CycleModel
    workers: int = 0  # the count priced

    def evidence(self) -> dict[str, Any]:
        m = self.model
        return {
            "expected_speedup": r(self.speedup, 2),
            "expected_ms_per_batch": r(self.after_ms, 1),
            "ms_per_batch_now": r(self.before_ms, 1),
            "expected_bound": self.bound,
            "model": {
                "trainer_step_ms": r(m.step, 1),
                **({"partner_floor_ms": {str(lid): r(f, 1) for lid, f in m.partners}} if m.partners else {}),
                "trainer_cores": r(m.trainer_cores, 2),
                **({"handover_cpu_ms_per_batch": r(m.handover, 2)} if m.handover > 0 else {}),
                "loading_cpu_ms_per_batch": r(m.load_cpu, 1),
                "loading_off_cpu_ms_per_batch": r(m.load_off_cpu, 1),
                "job_capacity_cores": r(m.capacity, 2),
                **(
                    {"job_capacity_cores_then": r(m.capacity_for(self.workers), 2)}
                    if m.capacity_for(self.workers) != m.capacity
                    else {}
                ),
                "fit": r(m.fit(), 2),
            },
        }

    def phrase(self) -> str:
        m = self.model
        can_have = m.can_have_with(self.workers)
        why = {
            "compute step": "the loop's own step then sets the pace",
            "handover": (
                f"the loop's step and the {m.handover:.1f} ms of its own CPU that taking each batch from "
                "the workers costs then set the pace"
            ),
            "workers": "the workers then set the pace",
            "CPU": f"the job's CPU work then fills {can_have}",
            # "want while computing": the free cores a hint quotes are an
            # average over the whole batch (a QA run read "the free cores
            # (1.1) allow 1" beside "use 2.0 of the 2.0 cores" as a
            # contradiction).
            "shared cores": (
                f"while it computes, the trainer's threads want {m.trainer_cores:.1f} of "
                f"{can_have}, so each batch's {m.load_cpu:.0f} ms of loading CPU, in a worker, "
                "stretches its step"
            ),
            "contended cores": (
                "other processes keep the cores busy: a worker gets only part of a core while the "
                f"trainer computes, so the {m.load_cpu:.0f} ms of loading CPU a batch sets the pace"
            ),
            "loop loads": "the loop then loads every batch itself",
            "feeder thread": "the feeder thread then loads every batch itself",
        }.get(self.bound) or f"{self.bound}'s workers then set the pace: the same loop takes from it"
        return f"expected ≈ {self.speedup:.2f}× throughput ({why})"


@dataclass(frozen=True)
class NoPrediction:
    """The measurements support no number; ``reason`` says why."""

    reason: str

    def evidence(self) -> dict[str, Any]:
        return {"expected_speedup": None, "no_prediction_reason": self.reason}


def predict(ctx: Context, lv: LoaderView, n_workers: int) -> Prediction | NoPrediction:
    """Throughput with ``n_workers`` relative to now, priced by the loader's
    cycle model on both sides (so its error for the current count cancels)."""
    m, why = cycle_model(ctx, lv)
    if m is None:
        return NoPrediction(why)
    cur, _ = m.cycle(m.workers_now)
    after, bound = m.cycle(n_workers)
    return Prediction(cur / after, m.now, m.now * after / cur, bound, m, n_workers)


def best_count(ctx: Context, lv: LoaderView, up_to: int) -> int | None:
    """The fewest workers in 1..``up_to`` within 5 % of the model's best."""
    m, _ = cycle_model(ctx, lv)
    if m is None or up_to < 1:
        return None
    cycles = {n: m.cycle(n)[0] for n in range(1, up_to + 1)}
    best = min(cycles.values())
    return min(n for n, c in cycles.items() if c <= best * 1.05)
