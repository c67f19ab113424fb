"""Too many runnable things for the cores: workers-oversubscribe-cores,
worker-thread-oversubscription.

Cores are ``host.usable_cores`` (CPU affinity and cgroup quota), never
``os.cpu_count()``: in a container with a 4-CPU quota on a 64-core host, 16
workers are oversubscribed even though the kernel lists 64 CPUs.

Only loaders past warm-up count: spawning workers makes every one of them busy
importing torch for a second or two, which is not a steady oversubscription.
"""

from __future__ import annotations

import math

from .facts import Context, cores, hint, median, num, r, worker_values

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


# A trainer main process below this CPU share is mostly waiting (on its GPU, or
# on data) and does not compete with the workers for a core.
BUSY_MAIN_LOOP_CPU_PERCENT = 50.0


def _demand(ctx: Context, loaders) -> tuple[float, int]:
    """Measured cores used by these loaders' workers + all main loops, and how
    many main loops lacked a CPU figure (those count as zero: this sum only
    ever makes a rule fire, so unknown must not push it up)."""
    # Run-queue wait counts as demand: workers starved of a core want one.
    total = sum(lv.cpu_sum + lv.rq_sum for lv in loaders)
    missing = 0
    for job in ctx.live_jobs:
        v = num(job.get("main_cpu_percent"))
        if v is None:
            missing += 1
        else:
            total += v / 100.0
    return total, missing


def rule_workers_oversubscribe_cores(ctx: Context) -> list[dict]:
    if ctx.usable_cores is None:
        return []
    steady = [lv for lv in ctx.loaders if lv.steady]
    busy_workers = 0
    for lv in steady:
        busy_workers += sum(
            1 for v in worker_values(lv.workers, "cpu_percent") if v >= IDLE_WORKER_CPU_PERCENT
        )
    # A main loop that waits on its GPU (or sleeps) leaves its core to the
    # workers: count it as a competitor only when it uses half a core or more
    # (unknown: it counts). Otherwise 2 workers next to an idle trainer on 2
    # cores would read as oversubscribed.
    busy_mains = sum(
        1
        for j in ctx.live_jobs
        if (
            num(j.get("main_cpu_percent")) is None
            or num(j.get("main_cpu_percent")) >= BUSY_MAIN_LOOP_CPU_PERCENT
        )
    )
    procs = busy_workers + busy_mains
    if procs <= ctx.usable_cores:
        return []
    demand, _ = _demand(ctx, steady)
    if demand < OVERSUB_DEMAND_FRACTION * ctx.usable_cores:
        return []
    total_workers = sum(len(lv.workers) for lv in ctx.loaders)
    jobs = sorted(int(j["pid"]) for j in ctx.live_jobs)
    with_workers = [lv for lv in steady if lv.workers]
    per_loader = max(1, math.floor((ctx.usable_cores - ctx.main_loops) / max(1, len(with_workers))))
    usable = cores(ctx.usable_cores)
    msg = (
        f"{busy_workers} busy DataLoader workers plus {ctx.main_loops} training main "
        f"loop{'s' if ctx.main_loops != 1 else ''} ({len(jobs)} job{'s' if len(jobs) != 1 else ''}) "
        f"compete for {usable} usable cores; they use {cores(round(demand, 1))} cores between "
        f"them, so every extra worker only adds context switches."
    )
    if len(with_workers) == 1:
        sugg = f"lower num_workers so workers + main loops ≤ {usable}: num_workers={per_loader}"
    elif with_workers:
        sugg = (
            f"lower num_workers so workers + main loops ≤ {usable}: about num_workers="
            f"{per_loader} for each of the {len(with_workers)} loaders with workers"
        )
    else:
        sugg = f"lower num_workers so workers + main loops ≤ {usable}"
    logical = num(ctx.host.get("logical_cpus"))
    ev = {
        "total_workers": total_workers,
        "busy_workers": busy_workers,
        "main_loops": ctx.main_loops,
        "jobs": jobs,
        "usable_cores": ctx.usable_cores,
        "usable_cores_source": ctx.usable_cores_source(),
        "logical_cpus": int(logical) if logical is not None else None,
        "cpu_demand_cores": r(demand, 2),
        "suggested_num_workers_per_loader": per_loader,
        "busy_worker_cpu_percent_min": IDLE_WORKER_CPU_PERCENT,
    }
    return [hint("workers-oversubscribe-cores", "warn", None, None, msg, sugg, ev)]


def rule_worker_thread_oversubscription(ctx: Context) -> list[dict]:
    if ctx.usable_cores is None:
        return []
    # Every live worker's threads count towards the box total, warm or not:
    # thread pools persist, they do not go away after warm-up.
    total_threads = 0
    for lv in ctx.loaders:
        total_threads += int(sum(worker_values(lv.workers, "threads")))
    if total_threads <= THREAD_OVERSUB_FACTOR * ctx.usable_cores:
        return []
    demand, _ = _demand(ctx, ctx.loaders)
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
            why = f"each worker uses {lv.cpu_mean:.1f} cores on average"
        else:
            why = (
                f"workers and main loops use {cores(round(demand, 1))} of "
                f"{cores(ctx.usable_cores)} usable cores"
            )
        msg = (
            f"{lv.title}'s {len(lv.workers)} workers run {tpw:.0f} threads each; "
            f"all workers on the box run {total_threads} threads on {cores(ctx.usable_cores)} "
            f"usable cores and {why}: OpenMP/BLAS/OpenCV pools are fighting over the cores."
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


RULES = {
    "workers-oversubscribe-cores": rule_workers_oversubscribe_cores,
    "worker-thread-oversubscription": rule_worker_thread_oversubscription,
}
