"""The snapshot as Prometheus metrics (``dlwatch export``).

``SnapshotCollector`` is a ``prometheus_client`` custom collector: on each
scrape it reads the collector's latest snapshot and yields metric families.
A scrape does no I/O against the jobs (the monitor thread does that, on its
own cadence), so a slow or broken job never slows a scrape, and two
Prometheus servers scraping the same exporter cost one collector.

Naming follows Prometheus's conventions: counters in base units ending in
``_total`` (lifetime figures the collector keeps monotonic, see
``collect/totals.py``, so ``rate()`` works across epochs and worker
restarts), gauges for ratios (0..1) and state. Labels: ``host``, ``pid``,
``rank``, ``run_id``, ``master`` (torchrun's MASTER_ADDR:PORT: with the run
id, the run a rank belongs to, as the live view groups them; the run id alone
is "none" on every run started without ``--rdzv-id``), ``loader`` (the
loader's index in its process) and
``worker`` (the worker's index, never its PID, which changes every epoch
with non-persistent workers). There is no label named ``job``: Prometheus
sets that one itself to the scrape job's name. A missing figure (None in
the snapshot) is a missing sample, never NaN or 0.

GPU series carry dcgm-exporter's label names and values instead (``gpu``:
the NVML index as a string, ``UUID``, ``Hostname``, ``modelName``), so that
PromQL joins them with ``DCGM_FI_DEV_*`` series: ``dlwatch_job_gpu`` says
which GPUs each job's trainer holds a context on, and ``on(UUID)`` takes
the job's labels to dcgm-exporter's figures of those GPUs.

A job that exits keeps its series for ``grace_s`` (its last counters get
scraped, ``dlwatch_job_up`` reads 0), then they disappear; a new PID is a new
set of series.
"""

from __future__ import annotations

import inspect
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import Collector

from dlwatch.snapshot import (
    PERCENT_PER_CORE,
    SnapshotSource,
    as_dict,
    as_int,
    as_list,
    as_str,
    is_live,
    num,
    records,
)

DEFAULT_GRACE_S = 60.0
JOB_LABELS = ("host", "pid", "rank", "run_id", "master")
LOADER_LABELS = (*JOB_LABELS, "loader")
WORKER_LABELS = (*LOADER_LABELS, "worker")
# dcgm-exporter's names, so that GPU series join with its DCGM_FI_DEV_* ones.
GPU_LABELS = ("gpu", "UUID", "Hostname", "modelName")
QUEUE_STATES = ("ready", "in_flight", "capacity")
# Loader settings carried by the info metric (a change of settings is a new
# series, as a change of version is for build_info metrics).
LOADER_SETTINGS = (
    "num_workers",
    "batch_size",
    "prefetch_factor",
    "pin_memory",
    "persistent_workers",
    "start_method",
    "kind",
    "dataset",
)


def _label(v: Any) -> str:
    """A label value: "" for None (Prometheus's "no such label"), lower-case
    booleans, the rest as text."""
    if v is None:
        return ""
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


_HOST = ("host",)
_GAUGE, _COUNTER, _INFO = GaugeMetricFamily, CounterMetricFamily, InfoMetricFamily
# (key, kind, name, labels, unit, help): every family of a scrape, in the
# order /metrics lists them.
FAMILIES: tuple[tuple[str, type[Metric], str, tuple[str, ...], str, str], ...] = (
    (
        "job_up",
        _GAUGE,
        "dlwatch_job_up",
        JOB_LABELS,
        "",
        "1 while the job is connected, 0 after it exited (until dropped)",
    ),
    (
        "job_info",
        _INFO,
        "dlwatch_job",
        JOB_LABELS,
        "",
        "The training process: world size, local rank, torch version",
    ),
    (
        "main_cpu",
        _GAUGE,
        "dlwatch_main_cpu_ratio",
        JOB_LABELS,
        "ratio",
        "CPU of the trainer's main process (1 = one core)",
    ),
    ("loader_info", _INFO, "dlwatch_loader", LOADER_LABELS, "", "DataLoader settings"),
    ("epoch", _GAUGE, "dlwatch_epoch", LOADER_LABELS, "", "Epochs started by the loader"),
    (
        "batches",
        _COUNTER,
        "dlwatch_batches",
        LOADER_LABELS,
        "",
        "Batches the loader returned since it was first iterated",
    ),
    (
        "wait",
        _COUNTER,
        "dlwatch_data_wait_seconds",
        LOADER_LABELS,
        "seconds",
        "Time the training loop spent blocked in next() on the loader",
    ),
    (
        "step",
        _COUNTER,
        "dlwatch_step_seconds",
        LOADER_LABELS,
        "seconds",
        "Time the training loop spent between batches (its own work)",
    ),
    (
        "wait_ratio",
        _GAUGE,
        "dlwatch_data_wait_ratio",
        LOADER_LABELS,
        "ratio",
        "Data-wait fraction of the loop over the collector's window (0..1)",
    ),
    (
        "queue",
        _GAUGE,
        "dlwatch_prefetch_queue_batches",
        (*LOADER_LABELS, "state"),
        "",
        "Prefetch queue: batches ready, in flight in workers, and its capacity",
    ),
    (
        "busy",
        _COUNTER,
        "dlwatch_worker_busy_seconds",
        WORKER_LABELS,
        "seconds",
        "Time the worker slot spent inside the dataset fetch, over every process that held it",
    ),
    (
        "worker_cpu",
        _GAUGE,
        "dlwatch_worker_cpu_ratio",
        WORKER_LABELS,
        "ratio",
        "CPU of the worker process (1 = one core)",
    ),
    (
        "runqueue",
        _GAUGE,
        "dlwatch_worker_runqueue_ratio",
        WORKER_LABELS,
        "ratio",
        "Time the worker was runnable but waiting for a core (1 = one core)",
    ),
    (
        "uss",
        _GAUGE,
        "dlwatch_worker_uss_bytes",
        WORKER_LABELS,
        "bytes",
        "Unique set size of the worker process (memory only it holds)",
    ),
    (
        "rss",
        _GAUGE,
        "dlwatch_worker_rss_bytes",
        WORKER_LABELS,
        "bytes",
        "Resident set size of the worker process",
    ),
    (
        "hint",
        _GAUGE,
        "dlwatch_hint_active",
        (*LOADER_LABELS, "hint", "severity"),
        "",
        "1 while a diagnosis hint holds (series gone when it clears)",
    ),
    (
        "cores",
        _GAUGE,
        "dlwatch_host_usable_cores",
        _HOST,
        "",
        "Cores this host's jobs may use (CPU affinity and cgroup quota)",
    ),
    (
        "job_gpu",
        _GAUGE,
        "dlwatch_job_gpu",
        (*JOB_LABELS, *GPU_LABELS),
        "",
        "1 for each GPU the job's trainer process uses (NVML's compute processes)",
    ),
    (
        "gpu_util",
        _GAUGE,
        "dlwatch_gpu_utilization_ratio",
        GPU_LABELS,
        "ratio",
        "GPU utilization as NVML samples it (0..1)",
    ),
    (
        "gpu_mem_used",
        _GAUGE,
        "dlwatch_gpu_memory_used_bytes",
        GPU_LABELS,
        "bytes",
        "GPU memory in use",
    ),
    (
        "gpu_mem_total",
        _GAUGE,
        "dlwatch_gpu_memory_total_bytes",
        GPU_LABELS,
        "bytes",
        "GPU memory in all",
    ),
    ("jobs", _GAUGE, "dlwatch_exporter_jobs", (*_HOST, "state"), "", "Jobs the exporter follows, by state"),
    (
        "age",
        _GAUGE,
        "dlwatch_exporter_snapshot_age_seconds",
        _HOST,
        "seconds",
        "Age of the snapshot this scrape was read from",
    ),
)


def _families() -> dict[str, Metric]:
    """The metric families of one scrape, each created once, by key."""
    fams: dict[str, Metric] = {}
    for key, kind, name, labels, unit, doc in FAMILIES:
        # Info families take no unit.
        extra = {"unit": unit} if unit else {}
        fams[key] = kind(name, doc, labels=list(labels), **extra)  # type: ignore[call-arg]
    return fams


class SnapshotCollector(Collector):
    """Metric families from ``source.latest()`` (the collector's), on each scrape.

    ``hostname`` overrides the ``host`` label (a node name in Kubernetes,
    where a pod's own hostname is the pod's); by default each job's own
    hostname, else this machine's. ``wall`` is the clock of the snapshot's
    ``time`` (tests pass their own)."""

    def __init__(
        self,
        source: SnapshotSource,
        hostname: str | None = None,
        grace_s: float = DEFAULT_GRACE_S,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._hostname = hostname
        self._default_host = hostname or socket.gethostname()
        self.grace_s = grace_s
        self._wall = wall
        # pid -> the snapshot time it was first seen ended; scrapes may run
        # on several server threads at once.
        self._ended: dict[int, float] = {}
        self._lock = threading.Lock()

    def describe(self) -> list:
        # No dry-run scrape at registration: the families depend on the jobs.
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self._source.latest()
        fam = _families()
        if isinstance(snap, dict):
            self._fill(snap, fam)
        yield from fam.values()

    def _fill(self, snap: dict, fam: dict[str, Metric]) -> None:
        t = num(snap.get("time"))
        host = self._default_host
        if t is not None:
            _add(fam["age"], [host], max(0.0, self._wall() - t))
        cores = num(as_dict(snap.get("host")).get("usable_cores"))
        if cores is not None:
            _add(fam["cores"], [host], cores)
        states: dict[str, int] = {}
        jobs = self._visible(records(snap.get("jobs")), t)
        for job in records(snap.get("jobs")):
            state = as_str(job.get("state"), "live")
            states[state] = states.get(state, 0) + 1
        for state, n in sorted(states.items()):
            _add(fam["jobs"], [host, state], n)
        labels_of: dict[int, list[str]] = {}
        for job in jobs:
            jl = self._job_labels(job)
            pid = as_int(job.get("pid"))
            if pid is not None:
                labels_of[pid] = jl
            self._job(job, jl, fam)
        self._gpus(snap, labels_of, fam)
        for h in records(snap.get("hints")):
            pid = as_int(h.get("job_pid"))
            if pid is not None and pid not in labels_of:
                continue  # a job whose series were dropped (or never shown)
            jl = labels_of.get(pid, []) if pid is not None else [host, *[""] * (len(JOB_LABELS) - 1)]
            hl = [*jl, _label(as_int(h.get("loader_id"))), as_str(h.get("id")), as_str(h.get("severity"))]
            _add(fam["hint"], hl, 1)

    def _gpus(self, snap: dict, jobs: dict[int, list[str]], fam: dict[str, Metric]) -> None:
        for g in records(snap.get("gpus")):
            index = as_int(g.get("index"))
            if index is None:
                continue
            gl = [str(index), as_str(g.get("uuid")), self._default_host, as_str(g.get("name"))]
            _add(fam["gpu_util"], gl, _ratio(g.get("util_percent")))
            _add(fam["gpu_mem_used"], gl, num(g.get("mem_used_bytes")))
            _add(fam["gpu_mem_total"], gl, num(g.get("mem_total_bytes")))
            # NVML names processes by the host's PIDs: they match the jobs'
            # only when the exporter shares the host's PID namespace.
            for pid in sorted({p for p in (as_int(x) for x in as_list(g.get("processes"))) if p in jobs}):
                _add(fam["job_gpu"], [*jobs[pid], *gl], 1)

    def _visible(self, jobs: list[dict], t: float | None) -> list[dict]:
        """Live jobs, and ended ones for ``grace_s`` of snapshot time."""
        out = []
        with self._lock:
            present = set()
            for job in jobs:
                pid = as_int(job.get("pid"))
                if pid is None:
                    continue
                present.add(pid)
                if is_live(job):
                    self._ended.pop(pid, None)
                    out.append(job)
                    continue
                if t is None:
                    continue
                ended = self._ended.setdefault(pid, t)
                if t - ended <= self.grace_s:
                    out.append(job)
            for pid in [p for p in self._ended if p not in present]:
                del self._ended[pid]
        return out

    def _job_labels(self, job: dict) -> list[str]:
        host = self._hostname or as_str(job.get("hostname")) or self._default_host
        pid, rank = _label(as_int(job.get("pid"))), _label(as_int(job.get("rank")))
        return [host, pid, rank, _label(job.get("run_id")), _label(job.get("master"))]

    def _job(self, job: dict, jl: list[str], fam: dict[str, Metric]) -> None:
        _add(fam["job_up"], jl, 1 if is_live(job) else 0)
        _add(
            fam["job_info"],
            jl,
            {
                "world_size": _label(as_int(job.get("world_size"))),
                "local_rank": _label(as_int(job.get("local_rank"))),
                "torch_version": as_str(job.get("torch_version")),
                "start_method": as_str(job.get("start_method")),
            },
        )
        _add(fam["main_cpu"], jl, _ratio(job.get("main_cpu_percent")))
        for ld in records(job.get("loaders")):
            lid = as_int(ld.get("id"))
            if lid is None:
                continue
            ll = [*jl, str(lid)]
            _add(fam["loader_info"], ll, {k: _label(ld.get(k)) for k in LOADER_SETTINGS})
            _add(fam["epoch"], ll, num(ld.get("epoch")))
            _add(fam["batches"], ll, num(ld.get("batches_total")))
            _add(fam["wait"], ll, num(ld.get("wait_s_total")))
            _add(fam["step"], ll, num(ld.get("step_s_total")))
            _add(fam["wait_ratio"], ll, num(ld.get("data_wait_fraction")))
            q = as_dict(ld.get("queue"))
            for state in QUEUE_STATES:
                _add(fam["queue"], [*ll, state], num(q.get(state)))
            for w in records(ld.get("workers")):
                wid = as_int(w.get("id"))
                if wid is None:
                    continue
                wl = [*ll, str(wid)]
                _add(fam["busy"], wl, num(w.get("busy_s_total")))
                _add(fam["worker_cpu"], wl, _ratio(w.get("cpu_percent")))
                _add(fam["runqueue"], wl, _ratio(w.get("runqueue_percent")))
                _add(fam["uss"], wl, num(w.get("uss_bytes")))
                _add(fam["rss"], wl, num(w.get("rss_bytes")))


def _ratio(percent: Any) -> float | None:
    p = num(percent)
    return None if p is None else p / PERCENT_PER_CORE


def _add(family: Metric, labels: list[str], value: float | dict[str, str] | None) -> None:
    if value is not None:
        family.add_metric(labels, value)  # type: ignore[attr-defined]


def serve(
    collector: Collector,
    port: int,
    addr: str = "127.0.0.1",
    tls: tuple[str | None, str | None] = (None, None),
) -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` on a daemon thread: ``collector`` and the standard
    ``process_*`` metrics of the exporter itself (its CPU and memory, as
    every exporter reports them); over HTTPS when ``tls`` is (certificate
    file, key file), prometheus_client's own TLS (check them first with
    ``tls_problem``). Raises OSError when the address cannot be bound.
    Returns (server, thread); ``server.shutdown()`` stops it."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    ProcessCollector(registry=registry)
    certfile, keyfile = tls
    server, thread = start_http_server(port, addr=addr, registry=registry, certfile=certfile, keyfile=keyfile)
    if certfile:
        # prometheus_client wraps the listening socket, so each TLS handshake
        # runs inside accept(), on the one thread that accepts every
        # connection: a client that connects and says nothing would stall
        # every scrape. Deferred, the handshake runs on the connection's own
        # request thread, at its first read.
        server.socket.do_handshake_on_connect = False  # type: ignore[attr-defined]  # an SSLSocket here
    return server, thread


def tls_problem(certfile: str, keyfile: str) -> str | None:
    """Why the certificate and key cannot serve HTTPS, in one line, or None.
    Checked before the port is bound, so that a bad file is said as such
    rather than as a failure to listen."""
    if "certfile" not in inspect.signature(start_http_server).parameters:
        # The extra asks for 0.19, the first with TLS; an older one installed
        # some other way is said, not a TypeError.
        return "--tls-cert needs prometheus_client 0.19 or newer: pip install -U 'dlwatch[export]'"
    for flag, path in (("--tls-cert", certfile), ("--tls-key", keyfile)):
        try:
            with open(path, "rb"):
                pass
        except OSError as e:
            return f"cannot read {flag} {path}: {e.strerror or e}"
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(certfile, keyfile)
    except (ssl.SSLError, OSError, ValueError) as e:
        why = getattr(e, "reason", None) or e
        return f"--tls-cert {certfile} and --tls-key {keyfile} are not a PEM certificate and its key: {why}"
    return None
