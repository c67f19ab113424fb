"""CPU figures over the same window as the loader figures they are set against.

The collector samples each process's CPU once a second, while a loader's
figures cover at least 3 s and five batches (collect/window.py). A worker
that works 120 ms every 0.9 s then reads 0 % in one sample and 40 % in the
next while its busy fraction says 14 % throughout, and a rule that sets one
against the other flickers. The diagnosis therefore keeps each process's
recent samples (from the snapshots it is fed: no clock but theirs) and hands
the rules the mean over the window of the loader they belong to.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .facts import as_dict, as_int, as_list, num

# Samples older than this are dropped: longer than any loader window the
# collector builds for a job the rules still judge.
KEEP_S = 60.0
# Per-process figures averaged, job level then worker level.
JOB_KEYS = ("main_cpu_percent", "main_thread_cpu_percent", "autograd_cpu_percent", "main_runqueue_percent")
WORKER_KEYS = ("cpu_percent", "runqueue_percent")
# Other processes' cores (host level, kept under a key no process has): the
# busy cores minus the jobs' in one sample, set against the same window.
HOST_KEYS = ("other_cpu_cores", "other_niced_cpu_cores")
HOST_KEY = 0

# One process's sample: (time, {key: value}); a history: key -> samples, oldest
# first. A key is a PID (``HOST_KEY`` for the host), or a worker slot
# (job PID, loader id, worker id) across the processes that hold it.
Sample = tuple[float, dict[str, float | None]]
Key = int | tuple[int, int | None, int]
History = Mapping[Key, tuple[Sample, ...]]


def _add(hist: dict[Key, tuple[Sample, ...]], pid: Key, t: float, values: dict[str, float | None]) -> None:
    old = [s for s in hist.get(pid, ()) if t - KEEP_S <= s[0] < t]
    hist[pid] = (*old, (t, values))


def _mean_over(samples: tuple[Sample, ...], key: str, since: float) -> float | None:
    vals = [x for t, v in samples if t >= since and (x := v.get(key)) is not None]
    return sum(vals) / len(vals) if vals else None


def _smoothed(
    d: dict[str, Any], samples: tuple[Sample, ...], keys: tuple[str, ...], since: float
) -> dict[str, Any]:
    out = dict(d)
    for k in keys:
        if d.get(k) is not None:
            m = _mean_over(samples, k, since)
            if m is not None:
                out[k] = round(m, 3)
    return out


def _fill_from_slot(w: dict[str, Any], samples: tuple[Sample, ...], since: float) -> None:
    """A worker with no figure yet (its process younger than the monitor can
    time, persistent_workers off: new ones every short epoch) takes its
    slot's mean over the window, its predecessors' in that slot. A QA run:
    0.3-0.8 s epochs left each new worker's CPU n/a for its first 0.1 s, and the
    hint's 3 s hold never held."""
    for k in WORKER_KEYS:
        if w.get(k) is None:
            m = _mean_over(samples, k, since)
            if m is not None:
                w[k] = round(m, 3)


def _window(snapshot: Mapping[str, Any], loader: Mapping[str, Any]) -> float:
    return max(num(snapshot.get("window_s")) or 0.0, num(loader.get("window_s")) or 0.0)


def smooth_cpu(
    snapshot: Mapping[str, Any], history: History, t: float
) -> tuple[dict[str, Any], dict[Key, tuple[Sample, ...]]]:
    """``snapshot`` with each live job's and worker's CPU figures replaced by
    their mean over the samples within its loader's window (the job's:
    its longest loader window; the host's other processes: the longest of
    all), and the updated history. Pure."""
    hist = {pid: s for pid, s in history.items() if s and s[-1][0] >= t - KEEP_S}
    host = as_dict(snapshot.get("host"))
    _add(hist, HOST_KEY, t, {k: num(host.get(k)) for k in HOST_KEYS})
    window = max(
        (
            _window(snapshot, ld)
            for job in as_list(snapshot.get("jobs"))
            for ld in as_list(as_dict(job).get("loaders"))
        ),
        default=num(snapshot.get("window_s")) or 0.0,
    )
    judged_host = _smoothed(host, hist[HOST_KEY], HOST_KEYS, t - window)
    jobs = []
    for job in as_list(snapshot.get("jobs")):
        if not isinstance(job, dict) or job.get("state", "live") != "live" or as_int(job.get("pid")) is None:
            jobs.append(job)
            continue
        pid = int(job["pid"])
        loaders = [ld for ld in as_list(job.get("loaders")) if isinstance(ld, dict)]
        _add(hist, pid, t, {k: num(job.get(k)) for k in JOB_KEYS})
        default = num(snapshot.get("window_s")) or 0.0
        job_window = max((_window(snapshot, ld) for ld in loaders), default=default)
        new_job = _smoothed(job, hist[pid], JOB_KEYS, t - job_window)
        new_loaders = []
        for ld in as_list(job.get("loaders")):
            if not isinstance(ld, dict):
                new_loaders.append(ld)
                continue
            since = t - _window(snapshot, ld)
            workers = []
            for w in as_list(ld.get("workers")):
                wpid = as_int(as_dict(w).get("pid"))
                if wpid is None:
                    workers.append(w)
                    continue
                values = {k: num(w.get(k)) for k in WORKER_KEYS}
                _add(hist, wpid, t, values)
                sm = _smoothed(w, hist[wpid], WORKER_KEYS, since)
                wid = as_int(as_dict(w).get("id"))
                if wid is not None:
                    slot = (pid, as_int(ld.get("id")), wid)
                    _add(hist, slot, t, values)
                    _fill_from_slot(sm, hist[slot], since)
                workers.append(sm)
            new_loaders.append(dict(ld, workers=workers))
        new_job["loaders"] = new_loaders
        jobs.append(new_job)
    out = dict(snapshot, jobs=jobs)
    if "host" in snapshot:
        out["host"] = judged_host
    return out, hist
