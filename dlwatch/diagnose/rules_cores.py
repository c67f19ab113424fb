"""Too many runnable things for the cores: workers-oversubscribe-cores,
worker-thread-oversubscription.

Cores are ``host.usable_cores`` (CPU affinity and cgroup quota), never
``os.cpu_count()``: in a container with a 4-CPU quota on a 64-core host, 16
workers are oversubscribed even though the kernel lists 64 CPUs.

Only loaders past warm-up count: spawning workers makes every one of them busy
importing torch for a second or two, which is not a steady oversubscription.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT

from . import capacity, others, rules_workers
from .facts import (
    Context,
    LoaderView,
    cores,
    count_of,
    hint,
    median,
    num,
    others_cores,
    pct,
    plural,
    r,
    setting,
    window_note,
    window_phrase,
    worker_values,
)
from .registry import Rule
from .render import tune_command

# A worker below 10 % of a core is parked (a persistent worker between epochs,
# or one blocked on a full prefetch queue): it costs memory, not CPU time, so
# it does not count as competing for a core.
IDLE_WORKER_CPU_PERCENT = 10.0
# Processes only fight over cores when they actually want them: the measured
# CPU of workers and main loops must reach 90 % of the usable cores (a quota is
# never read back as exactly 100 %).
OVERSUB_DEMAND_FRACTION = 0.90
# A DataLoader worker normally runs its main thread plus the multiprocessing
# queue feeder thread (torch also sets intra-op threads to 1 in workers), so 2–3
# threads is normal; more than 4 means an OpenMP/BLAS/OpenCV pool got started.
THREADS_PER_WORKER_MAX = 4
# Worker threads across the box must exceed the usable cores by this factor
# before the pools are worth a warning ("≫ usable cores").
THREAD_OVERSUB_FACTOR = 2.0
# "Worker CPU shows it": a worker using more than 1.2 cores on average runs
# several threads at once. (Otherwise the box must be saturated, see above.)
THREAD_CPU_CORES_PER_WORKER = 1.2


OVERSUB_SLACK_CORES = 0.5
# "waited 1 core's worth", "2 cores' worth" (count_of).
CORE_S = "core's"
# A lower worker count is advised (and the hint is a warning) only when the
# cycle model prices it at least this much faster: the worker-count hints' bar.
MIN_LOWERING_GAIN = 1.10


def _demand(ctx: Context, loaders: Iterable[LoaderView]) -> tuple[float, capacity.Account | None]:
    """Cores wanted by these loaders' workers, every trainer (measured CPU of
    all its threads, plus run-queue wait) and everyone else on the box
    (nothing known without the usable cores)."""
    acc = capacity.account(ctx, list(loaders))
    return (acc.demand, acc) if acc is not None else (0.0, None)


def _runqueue_cores(ctx: Context, loaders: Iterable[LoaderView]) -> float:
    return 0.0 + sum(lv.rq_sum for lv in loaders) + sum(capacity.trainer_runqueue(j) for j in ctx.live_jobs)


Lowering = tuple[int, "capacity.Prediction | capacity.NoPrediction"]


def _lower_count(ctx: Context, lv: LoaderView) -> Lowering:
    """The fewer workers (num_workers-1 down to 0) the cycle model prices
    best, with its prediction (ties: the most workers)."""
    nw = lv.num_workers or 0
    preds = [(n, capacity.predict(ctx, lv, n)) for n in range(nw - 1, -1, -1)]
    known = [(n, p) for n, p in preds if isinstance(p, capacity.Prediction)]
    if not known:
        return preds[0]
    return max(known, key=lambda x: (round(x[1].speedup, 2), x[0]))


def _waits_on_cpu_workers(lv: LoaderView) -> bool:
    """cpu-bound-preprocessing's premise: data-bound, saturated, CPU-bound workers."""
    if not rules_workers._data_bound_workers(lv):
        return False
    kind = rules_workers._bound_kind(lv)
    return kind is not None and kind[0]


def _busy_worker_wants(lv: LoaderView) -> list[float]:
    """Cores each busy worker of this loader wants: the CPU it used plus the
    time it waited for a CPU, at most one core; a whole core when its wait is
    unknown. A worker that sleeps most of the time (I/O, a full prefetch
    queue) wants the share it uses, not a core: counted as a core, six such
    workers at 20 % read as six runnable things on two cores."""
    wants = []
    for w in lv.workers:
        cpu = num(w.get("cpu_percent"))
        if cpu is None or cpu < IDLE_WORKER_CPU_PERCENT:
            continue
        rq = num(w.get("runqueue_percent"))
        wants.append(1.0 if rq is None else min(1.0, (cpu + rq) / 100.0))
    return wants


def _and_titles(views: list[LoaderView]) -> str:
    titles = [lv.title for lv in views]
    return titles[0] if len(titles) == 1 else ", ".join(titles[:-1]) + " and " + titles[-1]


def rule_workers_oversubscribe_cores(ctx: Context) -> list[dict[str, Any]]:
    if ctx.usable_cores is None:
        return []
    steady = [lv for lv in ctx.loaders if lv.steady]
    wants = [want for lv in steady for want in _busy_worker_wants(lv)]
    busy_workers = len(wants)
    workers_want = sum(wants)
    demand, acc = _demand(ctx, steady)
    if acc is None:
        return []
    # Runnable things against cores: what the busy workers want, plus the
    # cores the trainers (all threads) and other processes measurably use. A
    # trainer waiting on its GPU counts for the tenth of a core it uses, a
    # CPU step with intra-op threads for all of them.
    # Half a core of slack: a trainer's few percent next to fully busy
    # workers is not an oversubscription worth a line (the old rule counted a
    # trainer from 50 % of a core).
    wanted = workers_want + acc.trainers + acc.others
    if wanted <= ctx.usable_cores + OVERSUB_SLACK_CORES or busy_workers == 0:
        return []
    if demand < OVERSUB_DEMAND_FRACTION * ctx.usable_cores:
        return []
    decided = [lv for lv in steady if lv.workers and others.decide(ctx, lv) is not None]
    with_workers = [lv for lv in steady if lv.workers and (lv.num_workers or 0) >= 1]
    jobs_fit = workers_want + acc.trainers <= ctx.usable_cores + OVERSUB_SLACK_CORES
    starved = [lv for lv in steady if lv.workers and others.starve(ctx, lv) is not None]
    if jobs_fit and (decided or starved):
        # The jobs alone fit the cores: the other processes oversubscribe
        # them, and cores-shared-with-others says so for each loader they
        # decide (or whose idle workers wait for a core to start a batch),
        # with one count that does not move with their load.
        return []
    if jobs_fit and not others.heavy(ctx):
        # ... and the others are light, or the jobs hardly wait for them:
        # what tips the sum over the cores is then a monitor, a shell, or
        # processes at nice 19 on the time the workers leave idle (a test
        # beside the demo: 0.2 cores of them, 0.4 cores of run-queue wait).
        # The loaders' own hints keep the story they told before.
        return []
    if with_workers and all(rules_workers.waits_on_io(lv) for lv in with_workers):
        # Workers that wait on I/O want what they use and wait for
        # (acc.workers), not a core each; if the jobs alone fit the cores
        # then, the other processes oversubscribe them, the I/O waits lose
        # nothing to them, and hiding io-bound while the others' load peaks
        # would make its advice come and go with that load.
        if acc.trainers + acc.workers <= ctx.usable_cores + OVERSUB_SLACK_CORES:
            return []
    # Loaders whose workers wait on I/O keep their own hint (io-bound): more
    # of them add little CPU, and the cycle model prices what they add. A QA
    # run: a sleeping loader beside another job's CPU workers lost io-bound
    # (≈ 2.3× measured with more workers) to this line, which told it to make
    # its batches cheaper.
    # Unless they overfill the cores themselves (twelve of them at 20 % CPU
    # each beside a busy trainer): then more of them is no advice.
    io_waiting = [lv for lv in with_workers if rules_workers.waits_on_io(lv)]
    io_demand = acc.trainers + sum(capacity.workers_demand(lv) for lv in io_waiting)
    if io_demand > ctx.usable_cores + OVERSUB_SLACK_CORES:
        io_waiting = []
    with_workers = [lv for lv in with_workers if lv not in io_waiting]
    total_workers = sum(len(lv.workers) for lv in ctx.loaders)
    jobs = sorted(int(j["pid"]) for j in ctx.live_jobs)
    rq = _runqueue_cores(ctx, steady)
    # Advice that can be followed: a lower count only where the cycle model
    # (capacity.py, the one the worker-count hints use) prices it >= 10 %
    # faster; never the current count or more.
    cut: dict[tuple[int, int], int] = {}
    unpriced: list[tuple[LoaderView, int]] = []  # loaders whose fewer workers the model cannot price
    verdicts = []
    for lv in with_workers:
        if lv in decided:
            verdicts.append(f"{lv.title}: its best count depends on the other processes' load")
            continue
        n, pred = _lower_count(ctx, lv)
        if isinstance(pred, capacity.Prediction) and pred.speedup >= MIN_LOWERING_GAIN:
            cut[(lv.pid, lv.lid)] = n
            verdicts.append(f"{lv.title} with num_workers={n}: {pred.phrase()}")
        elif isinstance(pred, capacity.Prediction):
            verdicts.append(
                f"{lv.title}: fewer workers are not predicted to help "
                f"(num_workers={n}: expected ≈ {pred.speedup:.2f}×)"
            )
        else:
            unpriced.append((lv, n))
            verdicts.append(f"{lv.title}: the gain of fewer workers cannot be predicted ({pred.reason})")
    harmful = bool(cut)
    usable = cores(ctx.usable_cores)
    # CPU alone under the names the tables use (a worker's CPU %, the
    # trainer's main CPU): the run-queue wait is said apart, as a wait.
    workers_cpu = sum(lv.cpu_sum + lv.cpu_missing for lv in steady)
    who = [
        f"{'the trainer' if ctx.main_loops == 1 else count_of(ctx.main_loops, 'trainer')} "
        f"{count_of(cores(round(acc.trainers - acc.trainers_runqueue, 1)), 'core')} of CPU (all threads)",
        f"{count_of(busy_workers, 'busy DataLoader worker')} {cores(round(workers_cpu, 1))}",
    ]
    who += others_cores(acc)
    msg = (
        f"The {count_of(usable, 'usable core')} {plural(usable, 'is')} fully used{window_note(ctx)}: "
        f"{', '.join(who[:-1])} and {who[-1]}; besides, their threads waited "
        f"{count_of(cores(round(rq, 1)), CORE_S)} worth for a CPU "
        f"({pct(rq / ctx.usable_cores)} of the cores)."
    )
    if verdicts:
        msg += " " + "; ".join(verdicts) + "."
    if harmful:
        by_key = {(lv.pid, lv.lid): lv.loader for lv in ctx.loaders}
        parts = [
            f"{setting(by_key.get((pid, lid), {}), 'num_workers', n)} for loader {lid} of PID {pid}"
            for (pid, lid), n in sorted(cut.items())
        ]
        sugg = "lower " + ", ".join(parts)
    elif unpriced:
        # The model cannot price fewer workers: say so, and give the command
        # that measures them (a QA run: "no lower num_workers is predicted
        # faster" where 0 workers measured 1.24x, and `dlwatch tune` said so).
        msg += " Fewer workers may be faster here; only a measurement can say."
        cmds = [
            cmd
            for lv, n in unpriced
            if (cmd := tune_command(lv.job, {"num_workers": n, "current": lv.num_workers})) is not None
        ]
        sugg = (
            "measure fewer workers against the count now: a step whose intra-op threads fill the cores "
            "leaves a worker none (torch.set_num_threads trades one for the other)"
            + (f"; `{cmds[0]}`" if len(cmds) == 1 else "; `dlwatch tune --workers` on each job")
        )
    else:
        msg += " Worth knowing; no lower count is predicted faster."
        sugg = (
            "no lower num_workers is predicted faster; a step whose intra-op threads fill the cores leaves a "
            "worker none (torch.set_num_threads trades one for the other): `dlwatch tune` measures it"
        )
        starved = [lv for lv in steady if _waits_on_cpu_workers(lv)]
        if starved:
            # This hint hides cpu-bound-preprocessing on those loaders, so it
            # carries its advice: with the cores full and no count faster,
            # cheaper batches are what is left (issue 43: 2 workers on 2
            # cores, 41 % data wait, this info line and nothing to do).
            if len(starved) == 1:
                waits = f"still waits for data {pct(starved[0].wait or 0.0)} of the time"
            else:
                # Each its own figure (a QA run: three loaders, one "33 %"
                # that was the largest, one of them waiting 12 %).
                each = ", ".join(f"{pct(lv.wait or 0.0)}" for lv in starved[:-1])
                waits = f"still wait for data {each} and {pct(starved[-1].wait or 0.0)} of the time"
            msg += f" {_and_titles(starved)} {waits} on CPU-bound workers: the gain is in cheaper batches."
            sugg = (
                "make each batch cheaper (decode/resize once and cache the result, lighter transforms, a "
                "faster decoder); no lower num_workers is predicted faster: `dlwatch tune` measures counts"
            )
    logical = num(ctx.host.get("logical_cpus"))
    ev = {
        "total_workers": total_workers,
        "busy_workers": busy_workers,
        "busy_workers_want_cores": r(workers_want, 2),
        "main_loops": ctx.main_loops,
        "jobs": jobs,
        "usable_cores": ctx.usable_cores,
        "usable_cores_source": ctx.usable_cores_source(),
        "logical_cpus": int(logical) if logical is not None else None,
        "cpu_demand_cores": r(demand, 2),
        "runqueue_cores": r(rq, 2),
        "costs_throughput": harmful,
        # What engine.py's precedence compares with the per-loader hints:
        # only counts below the current one, priced >= 10 % faster.
        "recommended_num_workers_by_loader": [
            {"job_pid": pid, "loader_id": lid, "recommended_num_workers": n}
            for (pid, lid), n in sorted(cut.items())
        ],
        "busy_worker_cpu_percent_min": IDLE_WORKER_CPU_PERCENT,
        # The loaders whose worker-count hints this one stands for (engine.py:
        # it supersedes theirs only); those waiting on I/O keep their own.
        "loaders_covered": [
            {"job_pid": lv.pid, "loader_id": lv.lid} for lv in steady if lv not in io_waiting
        ],
        "cpu_accounting": acc.evidence(),
    }
    return [hint("workers-oversubscribe-cores", "warn" if harmful else "info", None, None, msg, sugg, ev)]


def rule_worker_thread_oversubscription(ctx: Context) -> list[dict[str, Any]]:
    if ctx.usable_cores is None:
        return []
    # Every live worker's threads count towards the box total, warm or not:
    # thread pools persist, they do not go away after warm-up.
    total_threads = 0
    for lv in ctx.loaders:
        total_threads += int(sum(worker_values(lv.workers, "threads")))
    if total_threads <= THREAD_OVERSUB_FACTOR * ctx.usable_cores:
        return []
    demand, _acc = _demand(ctx, ctx.loaders)
    saturated = demand >= OVERSUB_DEMAND_FRACTION * ctx.usable_cores
    out = []
    for lv in ctx.loaders:
        if not lv.steady or not lv.num_workers:
            continue
        tpw = median(worker_values(lv.workers, "threads"))
        if tpw is None or tpw <= THREADS_PER_WORKER_MAX:
            continue
        multi = lv.cpu_mean is not None and lv.cpu_mean >= THREAD_CPU_CORES_PER_WORKER
        if not (multi or saturated):
            continue
        if multi:
            why = f"each worker uses {count_of(lv.cpu_mean, 'core', '{:.1f}')} on average"
        else:
            why = (
                f"workers, trainers and other processes want {cores(round(demand, 1))} of "
                f"{count_of(cores(ctx.usable_cores), 'usable core')}"
            )
        msg = (
            f"{lv.title}'s {count_of(len(lv.workers), 'worker')} {plural(len(lv.workers), 'runs')} "
            f"{count_of(tpw, 'thread', '{:.0f}')} each; all workers on the box run "
            f"{count_of(total_threads, 'thread')} on {count_of(cores(ctx.usable_cores), 'usable core')} "
            f"and {why}: OpenMP/BLAS/OpenCV pools are fighting over the cores."
        )
        sugg = (
            "pass worker_init_fn that calls torch.set_num_threads(1) and cv2.setNumThreads(0), "
            "or start the job with OMP_NUM_THREADS=1 MKL_NUM_THREADS=1"
        )
        ev = {
            "threads_per_worker": r(tpw, 1),
            "num_workers": lv.num_workers,
            "total_worker_threads": total_threads,
            "usable_cores": ctx.usable_cores,
            "worker_cpu_cores_mean": r(lv.cpu_mean),
            "cpu_demand_cores": r(demand, 2),
            "cores_saturated": saturated,
            "cpu_evidence": why,
        }
        out.append(hint("worker-thread-oversubscription", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


def rule_cores_shared_with_others(ctx: Context) -> list[dict[str, Any]]:
    """A data-bound loader on cores other processes use (others.py): either
    its loading is on a CPU (no count, since the best one moves with their
    load: the figure, and the command that measures it), or its workers are
    not its limit and the loop waits for cores (free them: the count is not
    the fix)."""
    if ctx.usable_cores is None:
        return []
    out = []
    for lv in ctx.loaders:
        if not lv.steady or lv.num_workers is None or lv.wait is None or lv.wait < DATA_BOUND_WAIT:
            continue
        theirs = others.decide(ctx, lv)
        saturated = theirs is not None
        if theirs is None:
            theirs = others.starve(ctx, lv)
        acc = capacity.account(ctx)
        if theirs is None or acc is None:  # acc: usable cores known, for the type checker
            continue
        starved = others.starved_cores(ctx)
        nw = lv.num_workers
        usable = cores(ctx.usable_cores)
        peak = max(theirs, ctx.others_peak or 0.0)
        # Held after the others went quiet: their figure then is the most they used.
        use = f"use {cores(round(theirs, 1))} of the {count_of(usable, 'usable core')}"
        if peak >= theirs + 0.2:
            use = (
                f"used up to {cores(round(peak, 1))} of the {count_of(usable, 'usable core')} "
                f"in the last minute "
                f"({cores(round(theirs, 1))} now)"
            )
        # The suggestion in the same tense: "use up to 1 of the 2 cores …
        # measure while they run" read for a minute after they had stopped.
        upto = f"other processes use up to {cores(round(peak, 1))} of the {count_of(usable, 'core')}"
        if peak >= theirs + 0.2:
            upto = (
                f"other processes used up to {cores(round(peak, 1))} of the {count_of(usable, 'core')} in "
                f"the last minute ({cores(round(theirs, 1))} now)"
            )
        waited = f"this job's processes waited {count_of(cores(round(starved, 1)), CORE_S)} worth for a CPU"
        head = f"{lv.title} waits for data {pct(lv.wait)} of the time{window_phrase(lv)}; "
        if saturated:
            msg = (
                f"{head}its {count_of(nw, 'worker')} {plural(nw, 'is')} busy {pct(lv.busy_mean)} "
                f"of the time, loading on a CPU, and other processes {use}: {waited}. More workers take "
                f"more of the cores from the other processes, fewer load less at once: the best "
                f"num_workers depends on what they do, and dlwatch does not predict it."
            )
            cmd = tune_command(lv.job, {}) or "dlwatch tune"
            sugg = (
                f"{upto}; the best num_workers depends on them: measure with `{cmd}` while they run, "
                f"or make each batch cheaper (cache decoded samples)"
            )
        else:
            # Idle workers and a waiting loop on a quiet box are another
            # story; here the others hold the cores the job waits for.
            msg = (
                f"{head}its {count_of(nw, 'worker')} {plural(nw, 'is')} busy only {pct(lv.busy_mean)} "
                f"of the time, so {'they are' if nw > 1 else 'it is'} not what the loop waits for: other "
                f"processes {use} and {waited}. A batch is late while its worker waits for a core to "
                f"start it or the trainer waits for one to send the next index and take it in; the "
                f"wait comes and goes with their load."
            )
            sugg = (
                f"{upto}: "
                f"give this job its cores (stop or renice the other work, or run it where the cores "
                f"are its own); {setting(lv.loader, 'num_workers', nw)} is not the limit, its workers "
                f"idle {pct(1 - (lv.busy_mean or 0.0))} of the time"
            )
        ev = {
            "data_wait_fraction": r(lv.wait),
            "num_workers": nw,
            "worker_busy_fraction": r(lv.busy_mean),
            "workers_saturated": saturated,
            "other_cpu_cores": r(theirs, 2),
            "other_cpu_cores_peak": r(peak, 2),
            "usable_cores": ctx.usable_cores,
            "jobs_runqueue_cores": r(starved, 2),
            "others_decide": True,
            "recommended_num_workers": None,
            "cpu_accounting": acc.evidence(),
        }
        out.append(hint("cores-shared-with-others", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


# When cores are oversubscribed, per-loader advice about the worker count is
# measured on starved workers: fix the oversubscription first, one hint at a time.
SUPERSEDED_BY_OVERSUBSCRIPTION = frozenset(
    {"add-workers", "io-bound", "cpu-bound-preprocessing", "sampled-worker-count"}
)

# While other processes decide a loader's count, the count rules' figures
# move with their load: one story instead (others.py). Its "busy only" form
# (workers under 80 % busy, the loop waiting for cores) is head-of-line
# blocking's premise too, and there a fetch-time tail is a worker that
# waited for a core with the next batch in line, not a rare slow sample
# (the copy-on-read recording test beside the parallel tier: a
# head-of-line warn in 2 of 6 runs, on a scenario with no slow samples).
DECIDED_BY_OTHERS = frozenset({"add-workers", "cpu-bound-preprocessing", "head-of-line-blocking"})

RULES = (
    Rule(
        "cores-shared-with-others",
        rule_cores_shared_with_others,
        "loader",
        rate=True,
        supersedes=DECIDED_BY_OTHERS,
    ),
    Rule(
        "workers-oversubscribe-cores",
        rule_workers_oversubscribe_cores,
        "host",
        rate=True,
        worker_count_rank=0,
        supersedes=SUPERSEDED_BY_OVERSUBSCRIPTION,
    ),
    Rule(
        "worker-thread-oversubscription",
        rule_worker_thread_oversubscription,
        "loader",
        rate=True,
        supersedes=SUPERSEDED_BY_OVERSUBSCRIPTION,
    ),
)
