"""A recording as time series and summaries, per job and loader.

Everything is read through the snapshot accessors (``num``, ``records``,
...), so a line from an older or newer dlwatch, or one with figures missing,
costs a gap in a series, never an error. Times are seconds since the
recording's start.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from dlwatch.record.reader import Recording
from dlwatch.snapshot import GONE_STATES, as_dict, as_int, as_str, num, records, severity_rank

# A hint's identity across lines: (id, job_pid, loader_id).
HintKey = tuple[str, int | None, int | None]

# The loader settings a report shows and a comparison diffs, in that order.
SETTINGS = (
    "num_workers",
    "batch_size",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "start_method",
    "kind",
    "dataset",
)


@dataclass
class WorkerSeries:
    id: int
    pids: list[int] = field(default_factory=list)  # a new pid per epoch without persistent workers
    busy: list[float | None] = field(default_factory=list)  # 0..1
    cpu: list[float | None] = field(default_factory=list)  # 100 = one core
    uss: list[float | None] = field(default_factory=list)  # bytes
    rss: list[float | None] = field(default_factory=list)


@dataclass
class LoaderSeries:
    job_pid: int
    loader_id: int
    cmdline: str = ""
    rank: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    settings_changed: list[str] = field(default_factory=list)
    t: list[float] = field(default_factory=list)
    data_wait: list[float | None] = field(default_factory=list)  # 0..1
    batches_per_s: list[float | None] = field(default_factory=list)
    wait_ms: list[float | None] = field(default_factory=list)
    step_ms: list[float | None] = field(default_factory=list)
    batches_total: list[int | None] = field(default_factory=list)
    epoch: list[int | None] = field(default_factory=list)
    workers: dict[int, WorkerSeries] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"job {self.job_pid} loader {self.loader_id}"

    def _pad_workers(self) -> None:
        n = len(self.t)
        for w in self.workers.values():
            for s in (w.busy, w.cpu, w.uss, w.rss):
                s.extend([None] * (n - len(s)))


@dataclass
class HintSpan:
    """One stretch of time a hint was shown, with what it said at its start."""

    id: str
    severity: str
    job_pid: int | None
    loader_id: int | None
    start: float
    end: float
    message: str
    suggestion: str
    evidence: dict[str, Any]


@dataclass
class RecordingSeries:
    recording: Recording
    t0: float
    interval_s: float
    times: list[float] = field(default_factory=list)
    loaders: dict[tuple[int, int], LoaderSeries] = field(default_factory=dict)
    host_cpu: list[float | None] = field(default_factory=list)  # 100 = one core, all cores
    usable_cores: float | None = None
    gpus: dict[int, list[float | None]] = field(default_factory=dict)
    gpu_names: dict[int, str] = field(default_factory=dict)
    hints: list[HintSpan] = field(default_factory=list)
    jobs: dict[int, dict[str, Any]] = field(default_factory=dict)  # pid -> the job's last record

    @property
    def duration_s(self) -> float:
        return self.times[-1] - self.times[0] if len(self.times) > 1 else 0.0

    def main_loader(self) -> LoaderSeries | None:
        """The loader that moved the most batches: the training loader."""
        if not self.loaders:
            return None
        return max(self.loaders.values(), key=lambda ls: (_moved(ls), len(ls.t)))


def build(rec: Recording) -> RecordingSeries:
    snaps = [s for s in rec.snapshots if num(s.get("time")) is not None]
    snaps.sort(key=lambda s: num(s.get("time")) or 0.0)
    t0 = rec.start if rec.start is not None else (num(snaps[0].get("time")) if snaps else 0.0) or 0.0
    out = RecordingSeries(rec, t0, num(rec.header.get("interval_s")) or _median_step(snaps) or 1.0)
    open_hints: dict[HintKey, HintSpan] = {}
    for snap in snaps:
        t = (num(snap.get("time")) or t0) - t0
        out.times.append(t)
        host = as_dict(snap.get("host"))
        out.host_cpu.append(num(host.get("cpu_percent")))
        out.usable_cores = num(host.get("usable_cores")) or out.usable_cores
        for g in records(snap.get("gpus")):
            i = as_int(g.get("index"))
            if i is None:
                continue
            series = out.gpus.setdefault(i, [None] * (len(out.times) - 1))
            series.extend([None] * (len(out.times) - 1 - len(series)))
            series.append(num(g.get("util_percent")))
            out.gpu_names[i] = as_str(g.get("name"), f"GPU {i}")
        for job in records(snap.get("jobs")):
            pid = as_int(job.get("pid"))
            if pid is None:
                continue
            out.jobs[pid] = job
            if job.get("state", "live") != "live":
                continue  # an exited job's last figures repeat: not new samples
            for ld in records(job.get("loaders")):
                _add_loader(out, pid, job, ld, t)
        _add_hints(out, open_hints, snap, t)
    for ls in out.loaders.values():
        ls._pad_workers()
    for util in out.gpus.values():
        util.extend([None] * (len(out.times) - len(util)))
    out.hints.sort(key=lambda h: (h.start, severity_rank(h.severity), h.id))
    return out


def _median_step(snaps: list[dict[str, Any]]) -> float | None:
    ts = [num(s.get("time")) or 0.0 for s in snaps]
    steps = [b - a for a, b in zip(ts, ts[1:]) if b > a]
    return statistics.median(steps) if steps else None


def _add_loader(out: RecordingSeries, pid: int, job: dict[str, Any], ld: dict[str, Any], t: float) -> None:
    lid = as_int(ld.get("id"))
    if lid is None:
        return
    ls = out.loaders.get((pid, lid))
    settings = {k: ld.get(k) for k in SETTINGS if k in ld}
    if ls is None:
        ls = out.loaders[(pid, lid)] = LoaderSeries(
            pid, lid, as_str(job.get("cmdline")), as_int(job.get("rank"))
        )
        ls.settings = settings
    elif settings != ls.settings:
        changed = [k for k in SETTINGS if settings.get(k) != ls.settings.get(k)]
        ls.settings_changed.append(
            f"{_clock(t)}: " + ", ".join(f"{k} {ls.settings.get(k)} → {settings.get(k)}" for k in changed)
        )
        ls.settings = settings
    ls.t.append(t)
    ls.data_wait.append(num(ld.get("data_wait_fraction")))
    ls.batches_per_s.append(num(ld.get("batches_per_s")))
    ls.wait_ms.append(num(ld.get("wait_ms_mean")))
    ls.step_ms.append(num(ld.get("step_ms_mean")))
    ls.batches_total.append(as_int(ld.get("batches_total")))
    ls.epoch.append(as_int(ld.get("epoch")))
    n = len(ls.t)
    for w in records(ld.get("workers")):
        wid = as_int(w.get("id"))
        if wid is None or w.get("state") in GONE_STATES:
            continue
        ws = ls.workers.setdefault(wid, WorkerSeries(wid))
        for s in (ws.busy, ws.cpu, ws.uss, ws.rss):
            s.extend([None] * (n - 1 - len(s)))
        if len(ws.busy) >= n:
            continue  # the same worker id twice in one line: keep the first
        wpid = as_int(w.get("pid"))
        if wpid is not None and wpid not in ws.pids:
            ws.pids.append(wpid)
        ws.busy.append(num(w.get("busy_fraction")))
        ws.cpu.append(num(w.get("cpu_percent")))
        ws.uss.append(num(w.get("uss_bytes")))
        ws.rss.append(num(w.get("rss_bytes")))


def _add_hints(
    out: RecordingSeries, open_hints: dict[HintKey, HintSpan], snap: dict[str, Any], t: float
) -> None:
    seen: set[HintKey] = set()
    for h in records(snap.get("hints")):
        key = (as_str(h.get("id")), as_int(h.get("job_pid")), as_int(h.get("loader_id")))
        if not key[0]:
            continue
        seen.add(key)
        span = open_hints.get(key)
        if span is None:
            span = HintSpan(
                id=key[0],
                severity=as_str(h.get("severity"), "info"),
                job_pid=key[1],
                loader_id=key[2],
                start=t,
                end=t,
                message=as_str(h.get("message")),
                suggestion=as_str(h.get("suggestion")),
                evidence=as_dict(h.get("evidence")),
            )
            open_hints[key] = span
            out.hints.append(span)
        span.end = t
        if severity_rank(h.get("severity")) < severity_rank(span.severity):
            span.severity = as_str(h.get("severity"))
    for key in [k for k in open_hints if k not in seen]:
        del open_hints[key]


def _clock(t: float) -> str:
    t = int(round(t))
    return f"{t // 3600}:{t // 60 % 60:02d}:{t % 60:02d}" if t >= 3600 else f"{t // 60}:{t % 60:02d}"


def _moved(ls: LoaderSeries) -> int:
    done = [b for b in ls.batches_total if b is not None]
    return (max(done) - min(done)) if done else 0


# ---------------------------------------------------------------- summaries


def mean(values: Iterable[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return sum(xs) / len(xs) if xs else None


def quantile(values: Iterable[float | None], q: float) -> float | None:
    xs: list[float] = sorted(v for v in values if v is not None)
    if not xs:
        return None
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summary(ls: LoaderSeries) -> dict[str, Any]:
    """The figures a report's table and a comparison show for one loader.

    Throughput is batches moved over the time they took (from the job's
    cumulative count, exact whatever the sampling); data wait is the mean of
    the lines' fractions (each line covers its own interval, so this is the
    time-weighted mean), with its median and 90th percentile."""
    pts = [(t, b) for t, b in zip(ls.t, ls.batches_total) if b is not None]
    rate = None
    if len(pts) > 1 and pts[-1][0] > pts[0][0]:
        rate = (pts[-1][1] - pts[0][1]) / (pts[-1][0] - pts[0][0])
    workers = list(ls.workers.values())
    busy = [v for w in workers for v in w.busy if v is not None]
    cpu = [v for w in workers for v in w.cpu if v is not None]
    growth = []
    for w in workers:
        uss = [v for v in w.uss if v is not None]
        if len(uss) > 1:
            growth.append(uss[-1] - uss[0])
    uss_last = [next((v for v in reversed(w.uss) if v is not None), None) for w in workers]
    # The largest sum of the workers' USS in one line: like with like whether
    # the workers live the whole run or restart every epoch (then the sum "at
    # the end" is of workers just born: 198 MiB -> 16 MiB, issue 43).
    ls._pad_workers()
    sums = [[v for v in line if v is not None] for line in zip(*(w.uss for w in workers))]
    uss_peak = max((sum(vs) for vs in sums if vs), default=None)
    return {
        "duration_s": (ls.t[-1] - ls.t[0]) if len(ls.t) > 1 else 0.0,
        "batches": _moved(ls),
        "batches_per_s": rate,
        "data_wait_mean": mean(ls.data_wait),
        "data_wait_p50": quantile(ls.data_wait, 0.5),
        "data_wait_p90": quantile(ls.data_wait, 0.9),
        "step_ms_p50": quantile(ls.step_ms, 0.5),
        "wait_ms_p50": quantile(ls.wait_ms, 0.5),
        "worker_busy_mean": mean(busy),
        "worker_cpu_mean": mean(cpu),
        "worker_uss_last_sum": sum(v for v in uss_last if v is not None) if any(uss_last) else None,
        "worker_uss_peak_sum": uss_peak,
        "worker_uss_growth_max": max(growth) if growth else None,
        "epochs": len({e for e in ls.epoch if e is not None}),
    }
