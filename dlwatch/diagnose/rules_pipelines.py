"""Pipelines other than a DataLoader's worker processes (DESIGN.md §9):
add-pipeline-workers, gil-bound-threads, no-worker-knob.

- **add-pipeline-workers**: the loop waits for data from a pipeline whose
  worker count is a knob of its library (``ParallelMapper(num_workers=…)``,
  ``ReadOptions(num_threads=…)``, ``MultiprocessingOptions(num_workers=…)``).
  Its workers' per-batch times are not timed (only a DataLoader's are), so
  the count comes from the wait: the pool must deliver ``1 / (1 − wait)``
  times as fast; capped by the cores free when the workers are CPU-bound
  (0.8 core each; a worker thread from half a core when its process's
  threads run at the GIL's one-core ceiling).

- **gil-bound-threads**: the loop waits for data while the pipeline's
  worker *threads* (torchdata.nodes' ``ParallelMapper(method="thread")``,
  Grain's ``ReadOptions(num_threads=…)``) together use about one core with
  cores to spare: Python threads share one GIL, so more threads add nothing;
  worker processes are the fix, named in the library's own terms.
- **no-worker-knob**: the loop waits for data from a pipeline that has no
  worker setting dlwatch can see (a ``dlwatch.watch()``ed iterable, WebDataset
  iterated directly): it says what is known (the wait, the most that hiding
  it could give) and how such a pipeline gets background workers.
"""

from __future__ import annotations

import math
from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT

from .facts import (
    PERCENT_PER_CORE,
    Context,
    LoaderView,
    as_int,
    as_list,
    cores,
    has_worker_knob,
    hint,
    num,
    pct,
    r,
    setting,
)
from .registry import Rule
from .rules_sharding import WEBDATASET_EMPTY_WORKER

# Threads whose CPU sums to at most this many cores while the loop waits run
# one at a time: one core is the GIL's ceiling, the margin is tick noise and
# the interpreter's own GIL hand-offs.
GIL_CORES_MAX = 1.25
# ...and at least this much: threads far below one core wait on I/O, where the
# GIL is not what holds them (io-bound's case, more threads help).
GIL_CORES_MIN = 0.7
# ...on a box with at least this many cores idle: threads held to one core on
# cores other processes fill are no evidence of the GIL (a QA run: nodes'
# threads decoding JPEGs read 1 core beside another job's 100 %, and the
# process workers the hint advised measured 0.83-1.0x).
GIL_IDLE_CORES_MIN = 0.5
# A wait with a ceiling this high is worth a warning without a knob to measure.
NO_KNOB_WARN_WAIT = 0.2

_PROCESS_FIX = {
    "torchdata.nodes": 'method="process" in ParallelMapper(...) (same num_workers)',
    "grain": (
        ".mp_prefetch(grain.MultiprocessingOptions(num_workers=N)) at the end of the pipeline, so "
        "whole batches are made in worker processes"
    ),
}


# A grain.DataLoader's own argument for the same (it builds the mp_prefetch).
_GRAIN_DATALOADER_FIX = "worker_count=N in grain.DataLoader(...), so the operations run in N worker processes"


def _cores(v: float) -> str:
    """ "1.0 core", "8 cores": one decimal where it is not whole."""
    text = cores(round(v, 1))
    return f"{text} core" if text in ("1", "1.0") else f"{text} cores"


def _thread_cpu(lv: LoaderView) -> tuple[float | None, int]:
    """Cores the pipeline's worker threads use together, and how many threads."""
    threads = [w for w in as_list(lv.loader.get("pipeline_workers")) if isinstance(w, dict)]
    threads = [w for w in threads if w.get("kind") == "thread"]
    vals = [v for v in (num(w.get("cpu_percent")) for w in threads) if v is not None]
    if not threads or len(vals) < len(threads):
        return None, len(threads)
    return sum(vals) / PERCENT_PER_CORE, len(threads)


def rule_gil_bound_threads(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not lv.steady or lv.wait is None or lv.wait < DATA_BOUND_WAIT:
            continue
        if lv.loader.get("worker_kind") != "thread":
            continue
        used, n = _thread_cpu(lv)
        usable = ctx.usable_cores
        if used is None or n < 2 or usable is None or usable < 2:
            continue
        if not GIL_CORES_MIN <= used <= GIL_CORES_MAX:
            continue
        busy = num(ctx.host.get("busy_cores"))
        idle = None if busy is None else max(0.0, usable - busy)
        if idle is not None and idle < GIL_IDLE_CORES_MIN:
            continue
        lib = str(lv.loader.get("library") or "")
        fix = _PROCESS_FIX.get(lib, "worker processes instead of threads")
        if lv.loader.get("dataset") == "grain.DataLoader":
            fix = _GRAIN_DATALOADER_FIX
        spare = "" if idle is None else f", {cores(round(idle, 1))} of them idle"
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the loop, while its {n} worker threads use "
            f"{_cores(used)} together on a box with {_cores(usable)} usable{spare}: Python threads run one "
            f"at a time under the GIL, so the pool is capped at about one core and more threads add nothing."
        )
        sugg = f"run the work in processes: {fix}; then dlwatch measures the processes' CPU the same way"
        ev = {
            "data_wait_fraction": r(lv.wait),
            "worker_threads": n,
            "threads_cpu_cores": r(used, 2),
            "usable_cores": r(usable, 1),
            "idle_cores": r(idle, 2),
            "library": lib,
            "knobs": lv.loader.get("knobs"),
        }
        out.append(hint("gil-bound-threads", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


_NO_KNOB_FIX = {
    "webdataset": (
        "iterate it through torch's DataLoader(dataset, batch_size=None, num_workers=N) (webdataset's "
        "WebLoader does the same), so shards decode in worker processes; dlwatch then advises N"
    ),
}


def rule_no_worker_knob(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not lv.steady or lv.wait is None or lv.wait < DATA_BOUND_WAIT or has_worker_knob(lv.loader):
            continue
        lib = str(lv.loader.get("library") or "")
        name = str(lv.loader.get("dataset") or lib or "the pipeline")
        ceiling = 1 / (1 - lv.wait) if lv.wait < 1 else None
        up_to = f" Hiding the whole wait would give up to ≈ {ceiling:.2f}× throughput." if ceiling else ""
        msg = (
            f"{lv.title} ('{name}', {lib or 'an iterable'}) waits for data {pct(lv.wait)} of the loop, "
            f"and dlwatch sees no worker setting for this pipeline, so it cannot say which count would "
            f"help.{up_to}"
        )
        sugg = _NO_KNOB_FIX.get(
            lib,
            "load ahead of the loop in background workers (a DataLoader with num_workers over the same "
            "data, or the library's own prefetch or parallel option); dlwatch.watch() measures the loop's "
            "wait on whatever it iterates",
        )
        shards = as_int(lv.loader.get("shards"))
        if lib == "webdataset" and shards:
            # split_by_worker hands each worker whole tar files: N past them fails the run.
            sugg += f"; N at most {shards}, its tar files: a worker past them gets none, "
            sugg += WEBDATASET_EMPTY_WORKER
        ev = {
            "data_wait_fraction": r(lv.wait),
            "library": lib,
            "dataset": name,
            "ceiling_speedup": r(ceiling, 2),
            "shards": shards,
        }
        severity = "warn" if lv.wait >= NO_KNOB_WARN_WAIT else "info"
        out.append(hint("no-worker-knob", severity, lv.pid, lv.lid, msg, sugg, ev))
    return out


# Workers using this share of a core each while the loop waits are the
# limit, busy on a CPU (their batches are not timed one by one, as a
# DataLoader's are: their CPU stands for their busy time). Below it they wait
# for something else (a stage in the loop's process, the transfer from worker
# processes, storage), and more of them would not help: nothing is said.
PIPELINE_SATURATED = 0.8
# ...except a worker *thread* in a process whose threads together run at the
# GIL's one-core ceiling (this much, tick noise allowed for): its CPU is what
# the GIL left it beside the loop's and the graph's own threads, not what it
# would use. A ParallelMapper thread read 0.63-0.93 core so, and a second
# thread still gave 1.23-1.32x (2-core box, 2026-11-28). It must still hold
# this much of a core: a thread well below it waits on something else.
GIL_PROCESS_CORES = 0.9
GIL_CAPPED_THREAD = 0.5


def _pool_cores(lv: LoaderView) -> tuple[float | None, str]:
    """Cores the pipeline's workers use together, and where the figure comes
    from: their own (each thread's or process's), else, for threads, the
    trainer's CPU beyond its main thread (the pool restarts its threads each
    epoch, faster than a figure per thread settles)."""
    used, n = _thread_cpu(lv)
    if used is not None:
        return used, "each worker thread's CPU"
    procs = [w for w in as_list(lv.loader.get("pipeline_workers")) if isinstance(w, dict)]
    procs = [w for w in procs if w.get("kind") == "process"]
    vals = [v for v in (num(w.get("cpu_percent")) for w in procs) if v is not None]
    if procs and len(vals) == len(procs):
        return sum(vals) / PERCENT_PER_CORE, "each worker process's CPU"
    if lv.loader.get("worker_kind") == "thread":
        whole, main = num(lv.job.get("main_cpu_percent")), num(lv.job.get("main_thread_cpu_percent"))
        if whole is not None and main is not None:
            return max(0.0, whole - main) / PERCENT_PER_CORE, "the trainer's CPU beyond its main thread"
    return None, ""


def _gil_note(capped: float | None) -> str:
    if capped is None:
        return ""
    return (
        f" as far as the GIL lets it (the process's threads use {_cores(capped)} together, the one-core "
        f"ceiling of Python threads)"
    )


def _gil_capped(lv: LoaderView, per_worker: float) -> float | None:
    """The trainer's CPU in cores when its worker threads are held under
    PIPELINE_SATURATED by the GIL (see GIL_PROCESS_CORES), else None."""
    whole = num(lv.job.get("main_cpu_percent"))
    if whole is None or per_worker < GIL_CAPPED_THREAD:
        return None
    process = whole / PERCENT_PER_CORE
    return process if process >= GIL_PROCESS_CORES else None


def rule_add_pipeline_workers(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        lib = str(lv.loader.get("library") or "")
        if lib in ("", "torch", "monai") or not lv.steady or lv.wait is None or lv.wait < DATA_BOUND_WAIT:
            continue
        n = lv.num_workers
        if not n or n < 1:
            continue
        pool, source = _pool_cores(lv)
        if pool is None or ctx.usable_cores is None:
            continue
        per_worker = pool / n
        threads = lv.loader.get("worker_kind") == "thread"
        if threads and n >= 2 and GIL_CORES_MIN <= pool <= GIL_CORES_MAX:
            continue  # gil-bound-threads: more threads add nothing
        capped = _gil_capped(lv, per_worker) if threads and per_worker < PIPELINE_SATURATED else None
        if per_worker < PIPELINE_SATURATED and capped is None:
            continue
        want = math.ceil(n / (1 - lv.wait) - 1e-9) if lv.wait < 1 else n * 4
        busy = num(ctx.host.get("busy_cores"))
        free = max(0.0, ctx.usable_cores - (busy if busy is not None else pool))
        rec = min(want, n + int(free / per_worker + 0.25))
        if rec <= n:
            continue
        gain = min(rec / n, 1 / (1 - lv.wait)) if lv.wait < 1 else rec / n
        knob = setting(lv.loader, "num_workers", rec)
        workers = f"{n} worker{' thread' if threads else ''}{'s use' if n != 1 else ' uses'}"
        expect = f"expected ≈ {gain:.2f}× throughput"
        if threads:
            # Threads run in parallel only where the work releases the GIL.
            expect = (
                f"up to ≈ {gain:.2f}× throughput, where the work releases the GIL: PIL decoding, numpy "
                f"and torch ops do, Python code does not"
            )
        msg = (
            f"{lv.title} waits for data {pct(lv.wait)} of the loop; its {workers} {_cores(pool)} "
            f"({source}), busy on a CPU{_gil_note(capped)}, with {_cores(ctx.usable_cores)} usable and "
            f"{_cores(free)} free. "
            f"To keep up, the pool must deliver {1 / (1 - lv.wait):.1f}× as fast: {rec} "
            f"worker{'s' if rec != 1 else ''} ({expect})."
        )
        sugg = (
            f"set {knob}; dlwatch times the loop's wait the same way after the change (tune cannot set "
            f"{lib}'s knobs: compare runs with `dlwatch record` and `dlwatch compare`)"
        )
        if threads:
            sugg += "; their CPU then says whether they ran in parallel (about one core together: GIL-bound)"
        ev = {
            "recommended_num_workers": rec,
            "num_workers": n,
            "data_wait_fraction": r(lv.wait),
            "pool_cpu_cores": r(pool, 2),
            "cpu_source": source,
            "free_cores": r(free, 2),
            "expected_speedup": r(gain, 2),
            "speedup_bound": "upper: threads share the GIL" if threads else "expected",
            "library": lib,
            "knob": knob,
            "process_cpu_cores_gil_capped": r(capped, 2),
        }
        severity = "warn" if gain >= 1.10 else "info"
        out.append(hint("add-pipeline-workers", severity, lv.pid, lv.lid, msg, sugg, ev))
    return out


RULES = (
    Rule("add-pipeline-workers", rule_add_pipeline_workers, "loader", rate=True),
    Rule("gil-bound-threads", rule_gil_bound_threads, "loader", rate=True),
    Rule("no-worker-knob", rule_no_worker_knob, "loader", rate=True),
)
