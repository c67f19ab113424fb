"""The snapshot: the one document every consumer of dlwatch reads.

The collector (``dlwatch.collect.model``) builds it; the diagnosis, the live
view, ``dlwatch snapshot``/``ls`` and every later consumer (record, export,
tune) read it, through the types and the None-tolerant accessors here and
nowhere else. Its JSON form is ``dlwatch snapshot --json`` (schema_version 1,
documented in docs/reference/snapshot-json.md): keys are only ever added, never renamed.

stdlib only: the probe side's tests and any script may import it without the
monitor's dependencies.

Missing values are ``None`` (``null`` in JSON) with, where it helps, a reason
string beside them (``gpu_status``, a worker's ``error``, a job's
``state_reason``); a view writes "n/a". Nothing here ever raises for "not
available": every accessor returns ``None`` or an empty container for a
missing, malformed or non-finite value, so a consumer stays silent rather than
guess, and a snapshot from an older collector still reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypedDict, get_type_hints, runtime_checkable

SCHEMA_VERSION = 1

# Hint severities, most severe first: the one order every view sorts by.
SEVERITIES = ("critical", "warn", "info")
SEVERITY_ORDER = {s: i for i, s in enumerate(SEVERITIES)}

# A worker whose process is gone still appears for a moment (the sampler
# reports "gone" until the loader's next window drops it): its figures are
# stale and count towards nothing.
GONE_STATES = frozenset({"gone", "zombie", "dead"})

# ``cpu_percent`` figures use 100 = one core (psutil's convention).
PERCENT_PER_CORE = 100.0


# ----------------------------------------------------------------- the types
#
# Each record is a required part (the minimum schema of docs/reference/snapshot-json.md) and an optional part
# (extras the collector adds; a consumer may rely on them but must accept their
# absence in a file written by an older dlwatch). Python 3.10 has no
# ``NotRequired``, hence the two-class pattern.


class Queue(TypedDict):
    ready: int | None
    in_flight: int | None
    capacity: int | None


class _WorkerRequired(TypedDict):
    id: int
    pid: int
    cpu_percent: float | None  # 100 = one core, over the sampling interval
    busy_fraction: float | None  # 0..1 of the window inside the dataset fetch
    fetch_ms_mean: float | None
    batches: int | None  # None for an attached job (sampled: no batch counts)
    rss_bytes: int | None
    uss_bytes: int | None  # None when /proc/PID/smaps_rollup is unreadable
    threads: int | None


class Worker(_WorkerRequired, total=False):
    runqueue_percent: float | None  # runnable but not running (CPU-starved), 100 = one core
    state: str  # process state, "gone" once it exited, "n/a" unsampled
    error: str | None  # why figures are missing ("no permission to read ...")
    # Seconds inside the dataset fetch since the loader began, over every
    # process that held this worker slot (monotonic: the exporter's counter).
    busy_s_total: float | None
    window_batches: int  # batches this worker delivered in the loader's window
    # The fetch-time tail of one batch (ms), over the window when it holds 50
    # fetches or more, else over the worker's life; from a fixed histogram of
    # 4 buckets an octave in the worker, so each is good to about ±10 %.
    fetch_ms_p50: float | None
    fetch_ms_p95: float | None
    fetch_ms_p99: float | None
    # Digests of the first two batches the worker delivered from an iterable
    # dataset (None: a map dataset, or none yet): equal in two workers when
    # the dataset is not shared out among them.
    first_batch_digest: int | None
    second_batch_digest: int | None
    # Attached jobs: busy_fraction is the share of the worker's samples inside
    # the fetch, ± half its 95 % interval, over this many samples.
    busy_pm: float | None
    busy_samples: int
    waiting_index_fraction: float | None  # share of samples blocked on the index queue


class History(TypedDict, total=False):
    data_wait_fraction: list[float | None]  # oldest first, about 1 point/s
    batches_per_s: list[float | None]


class _LoaderRequired(TypedDict):
    id: int
    num_workers: int
    batch_size: int | None
    pin_memory: bool | None  # None: the loop has no such setting (watched, nodes, Grain)
    persistent_workers: bool | None  # None: not known (an attached job)
    prefetch_factor: int | None
    # None for an attached job: only the hook counts batches.
    epoch: int | None
    batches_total: int | None
    batches_per_s: float | None
    data_wait_fraction: float | None  # 0..1 over the window; None: no batch in it (no_batch_reason)
    wait_ms_mean: float | None
    step_ms_mean: float | None
    epoch_start_ms_last: float | None  # iter() to first batch, last epoch
    queue: Queue
    workers: list[Worker]


class Loader(_LoaderRequired, total=False):
    start_method: str | None
    kind: str  # "map" | "iterable"
    dataset: str | None  # the user's dataset class, beneath frameworks' wrappers
    dataset_wrappers: list[str]  # the wrappers' classes, outermost first (Subset, IterableDatasetShard)
    # An iterable dataset whose library hands each worker whole shards, none
    # to the workers past this count (HF datasets: "datasets", WebDataset's
    # tar files: "webdataset"); None else.
    shards: int | None
    shards_of: str | None
    # The loop thread's CPU inside next() per batch, ms (read on one batch in
    # 16): the handover from the workers, in series with the step. None: not read.
    next_cpu_ms_mean: float | None
    in_order: bool | None  # DataLoader(in_order=) with workers, torch >= 2.6; None otherwise
    # The first dimension the arrays of an epoch's first batch share (None:
    # they disagree, or hold none): shown, as read, where batch_size is None.
    batch_rows: int | None
    # The thread that takes the loader's batches: {"thread": name, "main": bool,
    # "trains": whether that thread steps a torch optimizer (absent: none has yet)}
    # (None: no batch yet). Whose wait the figures are: loop_role.
    iterated_on: dict[str, Any] | None
    # "loop" | "feeder" | "stage" (collect/loop_role.py, docs/pipelines.md): for a
    # feeder or a stage data_wait_fraction is None (no_batch_reason says why).
    loop_role: str
    # A feeder thread's own figures: {"thread", "wait_fraction", "wait_ms_mean",
    # "handover_ms_mean", "batches_per_s"}; None when the loop iterates it itself.
    feeder: dict[str, Any] | None
    # The loop's side of a hand-over, when found: {"thread", "main", "via"}
    # ("queue.Queue", "ThreadDataLoader"); the main figures are then its.
    consumer: dict[str, Any] | None
    nested_in: int | None  # a stage's outer loader id
    workers_from: int  # a wrapper's: the stage whose workers and settings it shows
    # What feeds the loop: "torch" | "torchdata.nodes" | "grain" | "monai" |
    # "webdataset" | "watch"; the library's class (ThreadDataLoader); its knobs
    # under its own names ({"ParallelMapper.num_workers": 2, ...}; None: a plain
    # DataLoader's are the fields above); its workers' kind and, for thread or
    # process workers the probe's worker table does not time, each one's CPU:
    # [{"id", "kind": "thread", "tid", "name", "cpu_percent"}
    #  | {"id", "kind": "process", "pid", "cpu_percent"}].
    library: str
    loader_class: str | None
    knobs: dict[str, Any] | None
    worker_kind: str | None
    pipeline_workers: list[dict[str, Any]]
    # Share of the loop's time inside next() while later batches sat ready in
    # the reorder buffer (head-of-line blocking), sampled ~10 times a second.
    head_of_line_fraction: float | None
    active: bool  # an iterator is alive
    # An epoch runs (begun, not exhausted or dropped); None: the probe does not say
    epoch_open: bool | None
    # The framework iterating it ("transformers" | "lightning" | "accelerate")
    # and what for ("train" | "eval"), from the code that calls iter(); None: not known
    framework: str | None
    role: str | None
    epoch_start_ms: list[float]  # recent epochs, oldest first
    epoch_ms: list[float]  # recent completed epoch durations
    epoch_ms_last: float | None
    # The next() that ends an epoch, on average: joining non-persistent
    # workers (not in epoch_ms); None before an epoch has ended
    teardown_ms_mean: float | None
    epoch_batches: list[int]  # batches of each epoch in epoch_ms (exhausted, replaced or dropped)
    window_s: float | None  # seconds this loader's rates cover: >= the snapshot's window_s
    window_batches: int  # batches completed in it (>= 5 where the frames held allow)
    no_batch_reason: str | None  # why data_wait_fraction is None (no batch completed in the window)
    epoch_first_batch_age_s: float | None  # since the current epoch's first batch (None: none yet)
    last_batch_age_s: float | None  # since its newest batch (None: none yet)
    queue_mean: dict[str, float | None]
    worker_ms_per_batch: float | None  # dataset fetch time one batch costs one worker
    batch_bytes: int | None  # CPU tensor bytes of a batch (each epoch's first); None: not read
    window_mono_ns: list[int | None]  # the job's monotonic clock span of the window
    # Lifetime seconds blocked in next() / in the loop's own work since the
    # loader was first iterated; monotonic (the exporter's counters).
    wait_s_total: float | None
    step_s_total: float | None
    history: History
    # An attached job's loader (``dlwatch attach``): data_wait_fraction is the
    # share of the training thread's samples inside __next__, with ± half its
    # 95 % interval (data_wait_ci95) over data_wait_samples samples.
    sampled: bool
    data_wait_pm: float | None
    data_wait_samples: int
    data_wait_ci95: list[float] | None
    iterator: str | None  # "single-process" | "multi-process", from the stacks
    workers_busy: dict[str, Any] | None  # every worker's samples pooled: fraction, pm, samples, ci95
    # Only in a `dlwatch tune` ceiling trial (DLWATCH_OVERRIDES' replay):
    # {"state": "warm-up"|"caching"|"replaying", "batches_cached", "bytes_cached",
    #  "batches_wanted", "max_bytes", "limited_by": "max_bytes"|None,
    #  "in_place": the loop changed a cached batch in place, so replays are copies}
    replay: dict[str, Any]
    # Only under `dlwatch run --autotune` (docs/autotune.md): state, reason,
    # current/original setting, changes (epoch, from, to, why, batches_per_s).
    autotune: dict[str, Any] | None
    # A stall (docs/hangs.md): seconds since the last batch once past
    # stall_threshold_s, else None; in_next: the loop is inside next().
    stalled_s: float | None
    stall_threshold_s: float | None
    in_next: bool | None
    # A loader a feeder thread iterates (its ``consumer`` is the loop): while
    # stalled, whether that thread still runs; else None.
    feeder_alive: bool | None
    awaited_worker: int | None  # the worker whose batch a stalled in-order loop waits for
    # Workers that died: id, pid, signal, exit_code, exception, t, their RSS
    # when first and last sampled, the cgroup's oom_kills (None + reason), cause (oom, shm, segfault, ...).
    worker_deaths: list[dict[str, Any]]
    last_error: str | None  # the last exception next() raised ("RuntimeError: DataLoader worker ...")


class _JobRequired(TypedDict):
    pid: int
    cmdline: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    torch_version: str
    start_method: str
    main_cpu_percent: float | None
    loaders: list[Loader]


class Job(_JobRequired, total=False):
    run_id: str | None  # torchrun's run id: ranks of one run share it
    master: str | None  # MASTER_ADDR:MASTER_PORT: with run_id, the ranks of one run (None: not set)
    hostname: str | None  # the job's own socket.gethostname()
    cuda_visible_devices: str | None  # the job's CUDA_VISIBLE_DEVICES: which GPU is its own
    cuda_device_order: str | None  # the job's CUDA_DEVICE_ORDER: what CUDA's indices count in
    # `dlwatch --host` (collect/merge.py): the node the job runs on, as the
    # user named it to ssh (this machine's jobs: its hostname)
    host: str
    state: str  # "live" | "connecting" | "exited" | "unreachable" | "incompatible"
    state_reason: str
    age_s: float
    main_thread_cpu_percent: float | None
    autograd_cpu_percent: float | None  # torch's autograd device threads (CUDA backward); None without one
    main_runqueue_percent: float | None  # trainer threads runnable but waiting for a core
    threads: int | None
    rss_bytes: int | None
    cuda_initialized: bool | None
    bad_frames: int
    last_wire_error: str | None
    # The last worker profile burst's top stage (dlwatch.diagnose.worker_profile.brief)
    worker_profile: dict[str, Any] | None
    # The job's last stacks (a stall's or `dlwatch stacks`'): reason, t,
    # processes (threads, frames), summary (one line each), error. docs/hangs.md.
    stacks: dict[str, Any] | None
    # Threads that step a torch optimizer (the training threads), most steps
    # first: [{"thread", "steps", "main"}]; a job listed without a loader says so.
    train_threads: list[dict[str, Any]]
    # Loaders one loop takes from together (zip(a, b), FixMatch's two iterators, a
    # validation pass inside the loop): [{"thread", "main", "loaders": [ids], "shares":
    # [each one's part of the loop's time], "data_wait_fraction"}], that last the
    # loop's wait, their sum (collect/co_iterated.py); empty with one loader a loop.
    loops: list[dict[str, Any]]
    sampled: bool  # attached without the hook, sampled from outside
    sampling: dict[str, Any]  # tool, span_s, samples, rate_hz, training thread


class _HostRequired(TypedDict):
    logical_cpus: int | None
    usable_cores: float | None  # affinity and cgroup quota, not os.cpu_count()
    cpu_percent: float | None
    shm_free_bytes: int | None


class Host(_HostRequired, total=False):
    cores_reason: str
    load_percent_of_usable: float | None
    busy_cores: float | None  # busy time on the affinity CPUs, in cores
    jobs_cpu_cores: float | None  # measured CPU of every live job's trainers and workers
    other_cpu_cores: float | None  # everyone else's CPU on our cores (busy minus the jobs')
    niced_busy_cores: float | None  # of busy_cores, processes at a positive nice
    monitor_cores: float | None  # of busy_cores, the monitor's own process (not counted as others')
    other_niced_cpu_cores: float | None  # of other_cpu_cores, processes at a positive nice


class _GpuRequired(TypedDict):
    index: int
    name: str
    util_percent: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None


class Gpu(_GpuRequired, total=False):
    uuid: str | None  # NVML's, e.g. "GPU-5f2c…" (dcgm-exporter's UUID label)
    processes: list[int] | None  # PIDs with a compute context on it, in NVML's PID namespace
    history: list[float | None]
    mem_history: list[float | None]
    # util_percent is the mean of NVML's samples since the last reading ("samples"), or one
    # reading ("reading") where the driver keeps no buffer; min/max: the spread of those samples
    util_source: str | None
    util_samples: int | None
    util_min_percent: float | None
    util_max_percent: float | None
    # the mean (and spread) of the per-second figures over the snapshot's window:
    # what the view shows and the hints quote
    util_window_percent: float | None
    util_window_min_percent: float | None
    util_window_max_percent: float | None


class Hint(TypedDict):
    id: str
    severity: str  # one of SEVERITIES
    job_pid: int | None
    loader_id: int | None
    message: str
    suggestion: str
    evidence: dict[str, Any]


class _SnapshotRequired(TypedDict):
    schema_version: int
    time: float  # unix seconds
    window_s: float  # seconds the rates cover
    host: Host
    gpu_status: str  # "ok" or why there are no GPU figures
    gpus: list[Gpu]
    jobs: list[Job]
    hints: list[Hint]


class Snapshot(_SnapshotRequired, total=False):
    runtime_dir: str
    runtime_dir_error: str | None
    errors: list[str]  # collector faults (a sampler that raised), newest last
    # Why ``hints`` says nothing: the diagnosis could not start or raised.
    # Absent when the hints are the diagnosis's own verdict.
    hints_error: str
    # Only with `dlwatch --host` (docs/multinode.md): one line per node, {"host",
    # "state": "ok"|"connecting"|"stale"|"unreachable"|"no-dlwatch"|"dropped"|"error",
    # "reason": ssh's error in one line or None, "local", "figures": the node's Host,
    # "gpu_status", "gpus", "jobs", "age_s", "lines", "bytes", "bad_lines", "connects"} ...
    hosts: list[dict[str, Any]]
    # ... and the ranks of each run across nodes: {"run_id", "world_size", "ranks_seen",
    # "ranks_live", "hosts", "data_wait_fraction_max" (the slowest rank's: the run's pace),
    # "data_wait_fraction_mean", "slowest": {"rank", "host", "pid"} | None}
    runs: list[dict[str, Any]]
    # Why every worker's uss_bytes is None: not read (a one-shot snapshot);
    # absent when USS is read.
    uss_reason: str
    # Loaders of live jobs the diagnosis has not judged yet (their first
    # warm-up): {"job_pid", "loader_id", "judging_s" (seconds so far, None
    # when not known), "reason"}. No hints for such a loader is "not judged
    # yet", never "nothing to fix".
    judging: list[dict[str, Any]]
    # Only in a one-shot (`dlwatch snapshot`, take_snapshot): the seconds it
    # watched the jobs to judge the hints as the live view does (a condition
    # shows once it held HOLD_ON_S). A loader still judging after them is in
    # ``judging``: its hints were not printed, as the live view shows none yet.
    judged_s: float


# ------------------------------------------------------------- the source


@runtime_checkable
class SnapshotSource(Protocol):
    """Where a consumer (the live view, the recorder, the exporter) gets
    snapshots: the collector (``dlwatch.collect.Monitor``), or a replay.

    ``latest()`` answers from memory (the newest snapshot built, None before
    the first): it is called from an event loop or a scrape thread.
    ``subscribe(callback)``: ``callback()`` is called, from any thread, after
    each new snapshot, so a consumer need not poll on a timer of its own."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def latest(self) -> dict[str, Any] | None: ...
    def subscribe(self, callback: Callable[[], None]) -> None: ...
    def dismiss(self, job_pid: int) -> None: ...


# ------------------------------------------------------------- the accessors

# How every view writes a figure it does not have.
NA = "n/a"


def num(v: Any) -> float | None:
    """A finite number as float, else None (a bool is not a number here)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def as_int(v: Any) -> int | None:
    """An integral number as int, else None (2.0 -> 2, 2.5 -> None)."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    f = num(v)
    return int(f) if f is not None and f == int(f) else None


def as_dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def as_list(v: Any) -> list[Any]:
    """A list as it is, a tuple as a list, anything else as []."""
    if isinstance(v, list):
        return v
    return list(v) if isinstance(v, tuple) else []


def as_str(v: Any, default: str = "") -> str:
    return v if isinstance(v, str) else default


def records(v: Any) -> list[dict[str, Any]]:
    """The dicts of a list (jobs, loaders, workers, hints); anything else skipped."""
    return [x for x in as_list(v) if isinstance(x, dict)]


def severity_rank(severity: Any) -> int:
    """Sort key: critical < warn < info < anything unknown."""
    return SEVERITY_ORDER.get(severity, len(SEVERITIES))


def is_live(job: Mapping[str, Any]) -> bool:
    return job.get("state", "live") in ("live", "connecting")


def unmeasured_jobs(jobs: Any, pid: int | None = None) -> list[int]:
    """PIDs of the live jobs (``pid``'s alone, if given) with no loader
    measured (nothing iterated that dlwatch recognises, or not yet): no hint
    about them is no judgement, so never "nothing to fix" (nanoGPT's
    get_batch() loop read "✓ no hints — nothing to fix" beside "no loader
    seen yet")."""
    live = (as_int(j.get("pid")) for j in records(jobs) if is_live(j) and not j.get("loaders"))
    return [p for p in live if p is not None and pid in (None, p)]


def unmeasured_line(pids: list[int]) -> str:
    """The hints line while those jobs' data wait is unmeasured."""
    if len(pids) == 1:
        return f"no hints: no loader of job {pids[0]} measured yet, so its data wait is not judged"
    who = ", ".join(map(str, pids))
    return f"no hints: no loader of jobs {who} measured yet, so their data wait is not judged"


def live_workers(loader: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Workers whose process still exists (their figures may still be None)."""
    return [w for w in records(loader.get("workers")) if w.get("state") not in GONE_STATES]


def numbers(values: Iterable[Any]) -> list[float]:
    """The finite numbers among ``values`` (None and garbage dropped)."""
    return [f for f in (num(v) for v in values) if f is not None]


def percent(fraction: Any, digits: int | None = 0) -> str:
    """A 0..1 fraction as a percentage, "42 %" (``digits`` decimals; None:
    as many as it has, for chart ticks); ``NA`` when it is missing. The one
    format of the hints, the CLI's text, the TUI and the report."""
    v = num(fraction)
    if v is None:
        return NA
    return f"{v * 100:g} %" if digits is None else f"{v * 100:.{digits}f} %"


# Plurals "+s" gets wrong, and the possessive a count takes ("1 core's
# worth", "2 cores' worth"); verbs agree with their count too.
_PLURALS = {
    "batch": "batches",
    "process": "processes",
    "core's": "cores'",
    "worker's": "workers'",
    "is": "are",
    "was": "were",
    "has": "have",
    "runs": "run",
    "waits": "wait",
    "grows": "grow",
}


def plural(n: Any, word: str, many: str | None = None) -> str:
    """``word`` as it goes with the count ``n``: itself for one, its plural
    (``many``, or the usual "+s") for any other count. A count is one when it
    reads "1" as written: pass the text a view prints (``count_of`` does)."""
    one = n == "1" if isinstance(n, str) else (not isinstance(n, bool) and n == 1)
    if one:
        return word
    return many or _PLURALS.get(word) or word + "s"


def epoch_start_missing(ld: dict[str, Any]) -> str:
    """Why a loader has no epoch-start figure (iter() to its first batch), as
    the CLI's text and the TUI say it: with an epoch counted, its start is
    still under way (a hang in the first epoch), not "no epoch started"."""
    epoch = ld.get("epoch")
    if isinstance(epoch, int) and epoch > 0:
        return "still under way (no first batch yet)"
    return "n/a (no epoch started yet)"


def count_of(n: Any, word: str, fmt: str = "{:g}", many: str | None = None) -> str:
    """``"1 worker"``, ``"2 workers"``, ``"0.5 cores"``, ``"1 core's"``: the
    count as ``fmt`` writes it and the word in the number that reads. The one
    place the hints, the CLI's text, the TUI and ``compare`` make a count."""
    text = fmt.format(n) if isinstance(n, (int, float)) and not isinstance(n, bool) else str(n)
    return f"{text} {plural(text, word, many)}"


# A loader the loop took a few batches from and then left with its epoch
# open (Lightning's sanity check: 2 validation batches, then training; a
# one-batch shape check with its iterator kept): fewer batches than a rate
# window holds, none for SET_ASIDE_S, not waited on now, while another
# loader on the same thread has returned batches since. It is no part of
# the loop and no loader to judge: a Lightning run read "loop takes from
# loaders 0 and 1" beside a sanity loader idle for 46 s, and "judging…
# (2 of the 5 batches …)" for as long as it ran.
SET_ASIDE_S = 5.0
SET_ASIDE_MAX_BATCHES = 5  # collect/window.py: MIN_WINDOW_BATCHES


def set_aside(ld: Mapping[str, Any], loaders: Iterable[Any]) -> bool:
    """Whether the loop has left ``ld`` for another of ``loaders`` (above)."""
    total, age = as_int(ld.get("batches_total")), num(ld.get("last_batch_age_s"))
    on = ld.get("iterated_on")
    if ld.get("in_next") is True or not isinstance(on, Mapping):
        return False
    if total is None or total >= SET_ASIDE_MAX_BATCHES or age is None or age < SET_ASIDE_S:
        return False
    for other in loaders:
        if not isinstance(other, Mapping) or other.get("id") == ld.get("id"):
            continue
        since = num(other.get("last_batch_age_s"))
        if other.get("iterated_on") == on and since is not None and since < age / 2:
            return True
    return False


# How a library's worker knob is named in a loader's ``knobs`` (the adapters'
# ``Class.arg``): the advice (diagnose/facts.py) and the views read it so.
WORKER_KNOB_ENDS = (".num_workers", ".num_threads", ".worker_count")


def workers_word(ld: Mapping[str, Any]) -> str:
    """The loader's worker knob in its library's words (``worker_count`` for
    a grain.DataLoader, ``ParallelMapper``'s ``num_workers``), from the knobs
    its adapter read; ``num_workers`` for a torch DataLoader."""
    knobs = ld.get("knobs")
    if isinstance(knobs, Mapping):
        for key in knobs:
            if isinstance(key, str) and key.endswith(WORKER_KNOB_ENDS):
                return key.rsplit(".", 1)[-1]
    return "num_workers"


def batch_word(ld: Mapping[str, Any]) -> str:
    """The loader's batch size as the views say it: the one it declares
    ("32"); where it declares none (a watched ``get_batch()``, a pipeline
    without a batching stage), the first dimension its batch's arrays share,
    said as read from them ("12 (first dim)": a [T, B] layout reads T); else
    "n/a"."""
    declared = as_int(ld.get("batch_size"))
    if declared is not None:
        return str(declared)
    rows = as_int(ld.get("batch_rows"))
    return f"{rows} (first dim)" if rows is not None else "n/a"


def pipeline_workers_line(ld: Mapping[str, Any], limit: int = 16) -> str | None:
    """A pipeline's own workers (torchdata.nodes' or Grain's threads or
    processes, not DataLoader workers) in one line: "2 thread workers (CPU):
    tid 19081 20 %, tid 19082 18 %"; None when the loader reports none. The
    snapshot text and the live view say it alike."""
    pw = [w for w in as_list(ld.get("pipeline_workers")) if isinstance(w, dict)]
    if not pw:
        return None
    cells = []
    for w in pw[:limit]:
        who = f"tid {w.get('tid')}" if w.get("kind") == "thread" else f"pid {w.get('pid')}"
        cpu = num(w.get("cpu_percent"))
        cells.append(f"{who} {cpu:.0f} %" if cpu is not None else f"{who} n/a")
    more = f", … {len(pw) - limit} more" if len(pw) > limit else ""
    kind = as_str(ld.get("worker_kind")) or "worker"
    return f"{count_of(len(pw), kind + ' worker')} (CPU): " + ", ".join(cells) + more


def run_key(job: Mapping[str, Any]) -> tuple[str, str] | None:
    """The run a job is a rank of: (torchrun's run id, its MASTER_ADDR:PORT or
    ""), the same on every node of the run; None outside a run. The run id
    alone is not enough: torchrun's ``--rdzv-id`` is "none" unless given, on
    every node of every run."""
    run_id, master = job.get("run_id"), job.get("master")
    if not isinstance(run_id, str) or not run_id:
        return None
    return run_id, master if isinstance(master, str) else ""


def find_job(snapshot: Mapping[str, Any], pid: int | None) -> dict[str, Any] | None:
    if pid is None:  # no job: not the first one without a PID
        return None
    return next((j for j in records(snapshot.get("jobs")) if as_int(j.get("pid")) == pid), None)


# ---------------------------------------------------------------- the check


def _required(td: type) -> dict[str, Any]:
    hints = get_type_hints(td)
    required = td.__required_keys__  # type: ignore[attr-defined]
    return {k: t for k, t in hints.items() if k in required}


def problems(snapshot: Any) -> list[str]:
    """Where ``snapshot`` breaks the contract: a missing required key or a
    value of the wrong kind (the consumers' accessors tolerate both; this is
    for tests and for a recorder that wants to refuse garbage). Empty: fine."""
    out: list[str] = []
    _check(snapshot, Snapshot, "snapshot", out)
    if not isinstance(snapshot, dict):
        return out
    for i, job in enumerate(as_list(as_dict(snapshot).get("jobs"))):
        _check(job, Job, f"jobs[{i}]", out)
        for k, ld in enumerate(as_list(as_dict(job).get("loaders"))):
            where = f"jobs[{i}].loaders[{k}]"
            _check(ld, Loader, where, out)
            _check(as_dict(ld).get("queue"), Queue, where + ".queue", out)
            for n, w in enumerate(as_list(as_dict(ld).get("workers"))):
                _check(w, Worker, f"{where}.workers[{n}]", out)
    _check(as_dict(snapshot).get("host"), Host, "host", out)
    for i, g in enumerate(as_list(as_dict(snapshot).get("gpus"))):
        _check(g, Gpu, f"gpus[{i}]", out)
    for i, h in enumerate(as_list(as_dict(snapshot).get("hints"))):
        _check(h, Hint, f"hints[{i}]", out)
        if isinstance(h, dict) and h.get("severity") not in SEVERITIES:
            out.append(f"hints[{i}].severity: {h.get('severity')!r} is not one of {SEVERITIES}")
    return out


def _check(obj: Any, td: type, where: str, out: list[str]) -> None:
    if not isinstance(obj, dict):
        out.append(f"{where}: expected an object, got {type(obj).__name__}")
        return
    for key, typ in _required(td).items():
        if key not in obj:
            out.append(f"{where}: missing {key!r}")
        elif not _kind_ok(obj[key], typ):
            out.append(f"{where}.{key}: {obj[key]!r} is not {typ}")


def _kind_ok(value: Any, typ: Any) -> bool:
    """A shallow check of a value against an annotation: the outer kind only
    (nested records are checked by ``problems`` itself)."""
    args = getattr(typ, "__args__", None)
    origin = getattr(typ, "__origin__", None)
    if origin is None and args and type(None) in args:  # X | None (types.UnionType)
        return value is None or any(_kind_ok(value, a) for a in args if a is not type(None))
    if origin is not None and str(origin) == "typing.Union" and args:
        return any(_kind_ok(value, a) for a in args)
    if typ is type(None):
        return value is None
    if origin in (list, dict):
        return isinstance(value, origin)
    if typ is float:
        return num(value) is not None
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is bool:
        return isinstance(value, bool)
    if typ is Any:
        return True
    if isinstance(typ, type) and issubclass(typ, dict):  # a TypedDict
        return isinstance(value, dict)
    return isinstance(value, typ) if isinstance(typ, type) else True
