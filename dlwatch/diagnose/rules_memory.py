"""Memory: worker-memory-growth (slope over samples kept in the state) and shm-low.

Copy-on-read: a forked worker shares the parent's dataset pages, but merely
reading a Python object writes its reference count, so the kernel copies each
touched page into the worker. The copy shows in USS (pages only this process
has) and not in RSS (the page was resident, and counted, before it was
copied), which is why the slope is taken on ``uss_bytes`` only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dlwatch.snapshot import count_of, plural

from .facts import (
    Context,
    MemSeries,
    as_int,
    as_list,
    hint,
    live_workers,
    median,
    mib,
    num,
    r,
)
from .registry import Rule

MIB = float(1 << 20)

# Keep one sample per worker at most every 2 s and at most 5 min of them: long
# enough to see a slow leak, bounded (≤ 150 samples per worker) in memory.
MEM_SAMPLE_INTERVAL_S = 2.0
MEM_WINDOW_S = 300.0
# Ignore a worker's first 10 s: imports and first-batch buffers make USS jump
# right after start, which would look like a steep but meaningless slope.
MEM_SKIP_START_S = 10.0
# A slope needs ≥ 60 s and ≥ 10 samples behind it, ...
MEM_MIN_SPAN_S = 60.0
MEM_MIN_SAMPLES = 10
# ... a straight-line fit that explains ≥ 80 % of the variance (steady growth,
# not a one-off allocation or a sawtooth from the allocator), ...
MEM_MIN_R2 = 0.80
# ... and ≥ 32 MiB of fitted growth per worker over the span: less is noise for
# a process that holds a few hundred MiB of torch.
MEM_MIN_GROWTH_MIB = 32.0

# shm-low. With batch bytes known: warn when free /dev/shm is below twice what
# the in-flight batches need (two epochs' iterators can overlap at an epoch
# boundary), critical below once (the next batch may fail with "bus error").
SHM_HEADROOM = 2.0
# Batch size in bytes unknown: fire only on absolute floors. Docker's default
# /dev/shm is 64 MiB, the classic cause of "DataLoader worker killed by bus
# error"; 256 MiB holds only a few image batches.
SHM_FLOOR_WARN_BYTES = 256 << 20
SHM_FLOOR_CRITICAL_BYTES = 64 << 20
# torch's default when prefetch_factor is None and num_workers > 0.
DEFAULT_PREFETCH_FACTOR = 2

# State entry per worker: (first_seen_t, ((t, uss, rss|None), ...), growth facts|None).
# The fit is redone only when a sample is added (every MEM_SAMPLE_INTERVAL_S),
# not on every snapshot: 64 workers x 150 samples at 10 Hz would cost more
# than the whole rest of the diagnosis.


def update_mem_series(
    old: MemSeries, snapshot: Mapping[str, Any], t: float
) -> dict[tuple[int, int], tuple[Any, ...]]:
    """Fold this snapshot's USS readings into the per-worker sample history.

    Returns a new dict (tuples inside are shared, never mutated). Workers no
    longer in the snapshot are dropped: a new pid is a new process.
    """
    new: dict[tuple[int, int], tuple[Any, ...]] = {}
    for job in as_list(snapshot.get("jobs")):
        if not isinstance(job, dict) or job.get("state", "live") != "live":
            continue
        pid = as_int(job.get("pid"))
        if pid is None:
            continue
        for ld in as_list(job.get("loaders")):
            if not isinstance(ld, dict):
                continue
            for w in live_workers(ld):
                wpid = as_int(w.get("pid"))
                if wpid is None:
                    continue
                key = (pid, wpid)
                first, samples, growth = old.get(key, (t, (), None))
                uss = num(w.get("uss_bytes"))
                if (
                    uss is not None
                    and t - first >= MEM_SKIP_START_S
                    and (not samples or t - samples[-1][0] >= MEM_SAMPLE_INTERVAL_S)
                ):
                    samples = samples + ((t, uss, num(w.get("rss_bytes"))),)
                    while samples and t - samples[0][0] > MEM_WINDOW_S:
                        samples = samples[1:]
                    growth = worker_growth(samples)
                new[key] = (first, samples, growth)
    return new


def fit_line(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares slope (y per x) and R²; None when x or y does not vary."""
    n = len(points)
    if n < 2:
        return None
    mx = sum(p[0] for p in points) / n
    my = sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    syy = sum((p[1] - my) ** 2 for p in points)
    sxy = sum((p[0] - mx) * (p[1] - my) for p in points)
    if sxx <= 0 or syy <= 0:
        return None
    slope = sxy / sxx
    r2 = (sxy * sxy) / (sxx * syy)
    return slope, r2


def worker_growth(samples: tuple[tuple[float, float, float | None], ...]) -> dict[str, Any] | None:
    """Slope facts for one worker's samples, or None if too few to judge."""
    if len(samples) < MEM_MIN_SAMPLES:
        return None
    span = samples[-1][0] - samples[0][0]
    if span < MEM_MIN_SPAN_S:
        return None
    t0 = samples[0][0]
    fit = fit_line([(s[0] - t0, s[1] / MIB) for s in samples])
    slope_s, r2 = fit if fit else (0.0, 0.0)
    rss = [(s[0] - t0, s[2] / MIB) for s in samples if s[2] is not None]
    rss_slope = None
    if len(rss) == len(samples):
        rss_fit = fit_line(rss)
        rss_slope = rss_fit[0] * 60.0 if rss_fit else 0.0  # no fit: RSS did not move
    return {
        "slope_mib_per_min": slope_s * 60.0,
        "r2": r2,
        "growth_mib": slope_s * span,
        "span_s": span,
        "uss_mib": samples[-1][1] / MIB,
        "rss_slope_mib_per_min": rss_slope,
    }


def _grows(g: dict[str, Any]) -> bool:
    return (
        bool(g["slope_mib_per_min"] > 0) and g["r2"] >= MEM_MIN_R2 and g["growth_mib"] >= MEM_MIN_GROWTH_MIB
    )


def rule_worker_memory_growth(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        measured = []
        for w in lv.workers:
            wpid = as_int(w.get("pid"))
            entry = ctx.mem_series.get((lv.pid, wpid)) if wpid is not None else None
            g = entry[2] if entry else None
            if g is not None:
                measured.append(g)
        growing = [g for g in measured if _grows(g)]
        # Copy-on-read hits every worker that walks the dataset; one growing
        # worker out of eight is more likely its own batch buffers.
        if not measured or len(growing) < math.ceil(len(measured) / 2):
            continue
        slope = median(g["slope_mib_per_min"] for g in growing)
        growth = median(g["growth_mib"] for g in growing)
        if slope is None or growth is None:  # growing is not empty: for the type checker
            continue
        span = min(g["span_s"] for g in growing)
        nw = lv.num_workers or len(lv.workers)
        rss_slopes = [g["rss_slope_mib_per_min"] for g in growing if g["rss_slope_mib_per_min"] is not None]
        rss_slope = median(rss_slopes) if rss_slopes else None
        msg = (
            f"{lv.title}: {len(growing)} of {count_of(len(measured), 'worker')} "
            f"{plural(len(growing), 'grows')} steadily "
            f"by {slope:.1f} MiB/min each in private memory (USS), {growth:.0f} MiB over "
            f"{span:.0f} s; at this rate the {count_of(nw, 'worker')} add {slope * 60 * nw / 1024:.1f} GiB "
            f"per hour."
        )
        if rss_slope is not None and rss_slope < slope / 2:
            msg += f" RSS hides it (it grows {rss_slope:.1f} MiB/min): shared pages are being copied."
        sugg = (
            "avoid copy-on-read: store the dataset as numpy arrays or torch tensors (or "
            "pyarrow/np.memmap) instead of Python lists/dicts of objects"
        )
        ev = {
            "slope_mib_per_min_per_worker": r(slope, 2),
            "growth_mib_per_worker": r(growth, 1),
            "span_s": r(span, 1),
            "r2_min": r(min(g["r2"] for g in growing)),
            "workers_growing": len(growing),
            "workers_measured": len(measured),
            "num_workers": lv.num_workers,
            "projected_mib_per_hour_per_worker": r(slope * 60, 1),
            "projected_mib_per_hour_total": r(slope * 60 * nw, 1),
            "uss_mib_median": r(median(g["uss_mib"] for g in growing), 1),
            "rss_slope_mib_per_min_per_worker": r(rss_slope, 2),
        }
        out.append(hint("worker-memory-growth", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


def rule_shm_low(ctx: Context) -> list[dict[str, Any]]:
    free = num(ctx.host.get("shm_free_bytes"))
    if free is None or free < 0:
        return []
    users = [
        lv
        for lv in ctx.loaders
        if lv.num_workers and lv.num_workers > 0 and lv.loader.get("active") is not False
    ]
    if not users:
        return []
    rows = []
    need = 0.0
    known = True
    for lv in users:
        pf = num(lv.loader.get("prefetch_factor"))
        pf = DEFAULT_PREFETCH_FACTOR if pf is None else pf
        bb = num(lv.loader.get("batch_bytes"))
        rows.append(
            {
                "job_pid": lv.pid,
                "loader_id": lv.lid,
                "num_workers": lv.num_workers,
                "prefetch_factor": int(pf),
                "batch_bytes": None if bb is None else int(bb),
            }
        )
        if bb is None or bb <= 0:
            known = False
        else:
            need += (lv.num_workers or 0) * pf * bb
    workers = sum(lv.num_workers or 0 for lv in users)
    if known:
        if free >= SHM_HEADROOM * need:
            return []
        severity = "critical" if free < need else "warn"
        basis = "workers × prefetch_factor × batch bytes"
        whose = count_of(workers, "worker's")
        msg = f"/dev/shm has {mib(free)} free, but the {whose} prefetched batches need {mib(need)} ({basis})."
    else:
        if free >= SHM_FLOOR_WARN_BYTES:
            return []
        severity = "critical" if free < SHM_FLOOR_CRITICAL_BYTES else "warn"
        basis = (
            f"absolute floor: batch size in bytes unknown, free below "
            f"{mib(SHM_FLOOR_CRITICAL_BYTES if severity == 'critical' else SHM_FLOOR_WARN_BYTES)}"
        )
        msg = (
            f"/dev/shm has only {mib(free)} free while {count_of(workers, 'DataLoader worker')} "
            f"{plural(workers, 'passes', 'pass')} batches through it."
        )
    msg += " Workers that run out of shared memory die with 'bus error'."
    sugg = (
        "enlarge /dev/shm (docker run --shm-size=8g, or mount -o remount,size=8G /dev/shm), "
        "or lower num_workers / prefetch_factor"
    )
    ev = {
        "shm_free_bytes": int(free),
        "shm_needed_bytes": int(need) if known else None,
        "basis": basis,
        "workers": workers,
        "loaders": rows,
    }
    return [hint("shm-low", severity, None, None, msg, sugg, ev)]


RULES = (
    Rule("worker-memory-growth", rule_worker_memory_growth, "loader"),
    Rule("shm-low", rule_shm_low, "host"),
)
