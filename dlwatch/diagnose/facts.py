"""Read-only views of one snapshot that every rule shares.

Rules never read the raw snapshot with ``dict[...]``: the monitor reports
``None`` for whatever it could not measure, an older collector may lack a key,
and a rule must stay silent rather than guess. Everything here therefore
returns ``None`` when a number is missing or malformed, and the rules treat
``None`` as "cannot decide".
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

# The contract's accessors and constants, re-exported for the rules: one
# definition of "a number", "gone" and "100 = one core" for every consumer.
from dlwatch.snapshot import GONE_STATES as GONE_STATES
from dlwatch.snapshot import NA, percent
from dlwatch.snapshot import PERCENT_PER_CORE as PERCENT_PER_CORE
from dlwatch.snapshot import WORKER_KNOB_ENDS as WORKER_KNOB_ENDS
from dlwatch.snapshot import as_dict as as_dict
from dlwatch.snapshot import as_int as as_int
from dlwatch.snapshot import as_list as as_list
from dlwatch.snapshot import count_of as count_of  # counts in the rules' text
from dlwatch.snapshot import live_workers as live_workers
from dlwatch.snapshot import num as num
from dlwatch.snapshot import plural as plural
from dlwatch.thresholds import ceil_ratio as ceil_ratio  # the rules' arithmetic

# (job_pid, worker_pid) -> (first_t, samples, growth): the memory rule's state.
MemSeries = Mapping[tuple[int, int], tuple[Any, ...]]

# Phases a loader can be in, as far as the rate-based rules are concerned.
STEADY = "steady"  # window figures are trustworthy
WARMUP = "warmup"  # epoch start / first batches: figures are suspect, decide nothing
INACTIVE = "inactive"  # no iterator alive: the loader is not being consumed


def mean(values: Iterable[float]) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def median(values: Iterable[float]) -> float | None:
    vals = sorted(values)
    if not vals:
        return None
    mid = len(vals) // 2
    return vals[mid] if len(vals) % 2 else (vals[mid - 1] + vals[mid]) / 2


def whole_cores(free: float) -> int:
    """Workers that fit in ``free`` cores: a main loop using a tenth of a core
    should not cost the loader a whole worker (1.9 -> 2), half a core should
    (3.5 -> 3)."""
    return max(0, math.floor(free + 0.25))


def cores_to_try(free: float) -> int:
    """Workers worth pricing on ``free`` cores: one for each whole core and
    one for a part of at least a quarter (1.55 -> 2). The cycle model prices
    the last one's share of a core; capping at whole cores kept a QA run of
    the HF Trainer (CPU-bound loading on the main thread, 1.55 cores free) at
    "1 would gain under 10 %" where 2 workers measured 2.13x."""
    return max(0, math.ceil(free - 0.25))


# Figures in messages; a rule only words figures it has checked, but "n/a"
# beats a TypeError should one slip through.
def pct(fraction: float | None) -> str:
    return percent(fraction)


def ms(v: float | None) -> str:
    if v is None:
        return NA
    return f"{v:.1f} ms" if v < 10 else f"{v:.0f} ms"


def mib(nbytes: float | None) -> str:
    return NA if nbytes is None else f"{nbytes / (1 << 20):.0f} MiB"


def cores(v: float | None) -> str:
    if v is None:
        return NA
    return f"{v:.0f}" if v == int(v) else f"{v:.1f}"


def window_phrase(lv: LoaderView) -> str:
    """Which window a hint's figures of a loader cover, " (last 3 s, 69
    batches)": the live headline reads a shorter one (1 s by default), so a
    hint that quotes the wait says which it quotes."""
    w = num(lv.loader.get("window_s"))
    b = lv.loader.get("window_batches")
    if w is None:
        return ""
    return f" (last {w:.0f} s" + (f", {count_of(b, 'batch')})" if isinstance(b, int) and b > 0 else ")")


def window_note(ctx: Context) -> str:
    """The window of a job- or host-wide hint's figures, " (last 3 s)"."""
    return f" (last {ctx.window_s:.0f} s)" if ctx.window_s else ""


def worker_values(workers: Iterable[Mapping[str, Any]], key: str) -> list[float]:
    return [v for v in (num(w.get(key)) for w in workers) if v is not None]


def worker_ms_per_batch(loader: Mapping[str, Any], workers: list[dict[str, Any]]) -> float | None:
    """Dataset fetch time one batch costs one worker.

    Prefers the collector's loader-level figure; falls back to the mean of the
    workers' own means (equal weight: every worker serves the same sampler).
    """
    v = num(loader.get("worker_ms_per_batch"))
    if v is not None and v > 0:
        return v
    m = mean(x for x in worker_values(workers, "fetch_ms_mean") if x > 0)
    return m


PREFETCH_KNOB_ENDS = (".prefetch_factor", ".prefetch_buffer_size", ".buffer_size", ".worker_buffer_size")
_KNOB_ENDS = {"num_workers": WORKER_KNOB_ENDS, "prefetch_factor": PREFETCH_KNOB_ENDS}


def knob(loader: Mapping[str, Any], name: str) -> str | None:
    """The library's own knob for a DataLoader setting (``num_workers``,
    ``prefetch_factor``) as ``Class.arg``, from the knobs its adapter read
    (probe/adapters); None for a plain DataLoader or a setting it lacks."""
    knobs = loader.get("knobs")
    if not isinstance(knobs, Mapping):
        return None
    ends = _KNOB_ENDS.get(name, (f".{name}",))
    for key in knobs:
        if isinstance(key, str) and key.endswith(ends):
            return key
    return None


def has_worker_knob(loader: Mapping[str, Any]) -> bool:
    """Whether advice may name a worker count: a torch DataLoader (or a
    subclass such as MONAI's ThreadDataLoader), or a pipeline whose adapter
    found its worker knob (nodes' ParallelMapper, Grain's ReadOptions). A
    watched iterable has none dlwatch can see."""
    lib = loader.get("library")
    return bool(lib in (None, "torch", "monai") or knob(loader, "num_workers") is not None)


def is_loop_wait(loader: Mapping[str, Any]) -> bool:
    """Whether the loader's wait figures are the training loop's (its
    ``loop_role``, collect/loop_role.py): not a feeder's or a stage's."""
    return bool(loader.get("loop_role", "loop") == "loop")


@dataclass(frozen=True)
class Partner:
    """Another loader one loop takes from with this one, per batch of this one.

    ``wait_ms``: the loop's wait on it. ``floor_ms``: the least time its
    workers need per step (their busy fraction of the cycle: busy 50 % means
    they could keep a loop twice as fast fed); None where it has no workers
    (the loop loads its batches itself, inside this loader's step) or their
    busy time is not measured."""

    lid: int
    num_workers: int | None
    wait_ms: float
    floor_ms: float | None


@dataclass
class LoaderView:
    """One loader of one live job, with the figures most rules need."""

    job: dict[str, Any]
    loader: dict[str, Any]
    pid: int
    lid: int
    phase: str
    workers: list[dict[str, Any]]
    num_workers: int | None
    wait: float | None  # data_wait_fraction 0..1: the loop's; None for a feeder or a stage (is_loop_wait)
    busy_mean: float | None  # mean worker busy fraction 0..1
    cpu_mean: float | None  # mean worker CPU in cores (1.0 = one core)
    cpu_missing: int  # live workers without a CPU figure
    cpu_sum: float  # cores the workers use now (missing count 0)
    rq_sum: float  # cores' worth of time the workers spent runnable but not
    # running (run-queue wait: starved of CPU), 0 when unknown
    worker_ms: float | None  # fetch time per batch in one worker
    step_ms: float | None  # loop time per batch outside this loader's next() (partners' waits included)
    # The other loaders the loop takes from in the same steps (zip, FixMatch:
    # the job's ``loops``), each priced per batch of this one.
    partners: tuple[Partner, ...] = ()

    @property
    def steady(self) -> bool:
        return self.phase == STEADY

    @property
    def title(self) -> str:
        """How messages name the loader (at the start of a sentence), with
        its role where the framework says (an evaluation loader's advice is
        not the training loader's)."""
        role = self.loader.get("role")
        said = f" ({role})" if isinstance(role, str) and role else ""
        return f"Loader {self.lid}{said} of PID {self.pid}"

    @property
    def cpu_share_of_busy(self) -> float | None:
        """How much of a worker's busy time it wants a CPU for.

        ~1: CPU-bound (decoding, augmentation); well below 1: the worker is
        "busy" inside ``fetch`` but sleeping on storage, network or locks.
        Above 1 means the worker runs several threads at once: CPU-bound too
        (evidence shows it as threads, ``threads_cores_while_busy``, never
        as a share above 100 %).
        Time spent runnable but waiting for a core (run-queue wait, from
        /proc/PID/schedstat) counts as CPU demand: a worker starved by
        oversubscribed cores is not waiting on storage, and more workers
        would make it worse.
        """
        if self.busy_mean is None or self.cpu_mean is None or self.busy_mean < MIN_BUSY_FOR_SHARE:
            # Idle workers: a ratio of two near-zero figures (a QA run read
            # 16.56 cores "while busy" on a 2-core box).
            return None
        n = max(1, len(self.workers))
        return (self.cpu_mean + self.rq_sum / n) / self.busy_mean


# Workers busier than this say what their busy time is spent on.
MIN_BUSY_FOR_SHARE = 0.05


@dataclass
class Context:
    """Everything the rules see: the snapshot, loader views, state-kept samples."""

    snapshot: dict[str, Any]
    time: float | None
    window_s: float | None
    host: dict[str, Any]
    usable_cores: float | None
    live_jobs: list[dict[str, Any]]
    loaders: list[LoaderView]
    gpu_ok: bool
    gpus: list[dict[str, Any]]
    # (job_pid, worker_pid) -> (first_t, samples, growth): rules_memory; only the
    # stateful path fills it, so slope rules are silent in one-shot use.
    mem_series: MemSeries = field(default_factory=dict)
    # Whether other processes decide the best worker counts (others.py): the
    # stateful diagnosis's held state; None: judge this snapshot alone.
    others_decide: bool | None = None
    # The most cores other processes used while that state holds (others.py).
    others_peak: float | None = None

    @property
    def main_loops(self) -> int:
        # Trainer processes, for messages and evidence only: their CPU is
        # measured (capacity.py), not assumed to be one core each.
        return len(self.live_jobs)

    def loaders_of(self, pid: int) -> list[LoaderView]:
        return [lv for lv in self.loaders if lv.pid == pid]

    @property
    def has_gpu(self) -> bool:
        """A GPU the snapshot can see: GPU advice is for boxes that have one."""
        return self.gpu_ok and bool(self.gpus)

    def usable_cores_source(self) -> str:
        # collect/host.py reports it as "cores_reason"; accept either name.
        for key in ("usable_cores_source", "cores_reason"):
            src = self.host.get(key)
            if isinstance(src, str) and src:
                return src
        return "host.usable_cores (CPU affinity and cgroup quota, not os.cpu_count())"

    def gpu_util_for(self, job: Mapping[str, Any]) -> tuple[float | None, str]:
        """GPU utilisation (percent, averaged over the snapshot window) for a job.

        Only when the mapping is unambiguous (``job_gpu``). Several GPUs and
        no way to tell: None, since averaging an idle GPU of another job into
        this one's would be a guess.
        """
        if not self.gpu_ok or not self.gpus:
            return None, ""
        gpu = job_gpu(job, self.gpus)
        if gpu is None:
            return None, ""
        util = num(gpu.get("util_window_percent"))
        if util is None:
            util = window_util(gpu.get("history"), self.window_s)[0]
        if util is None:
            util = num(gpu.get("util_percent"))
        return util, f"GPU {gpu.get('index', '?')}"


def job_gpu(job: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The GPU a job computes on, where that can be told: the one GPU on the
    box; the GPU whose NVML process list holds the job's PID (absent where
    the job runs in another PID namespace); else the job's ``local_rank``
    taken through its ``CUDA_VISIBLE_DEVICES`` (indices or UUIDs, in CUDA's
    order: rank 0 of ``CUDA_VISIBLE_DEVICES=4,5`` computes on GPU 4), or as
    the GPU's index when that variable is not set. A CUDA index is taken as
    NVML's only where the two count alike (``cuda_order_is_nvml``)."""
    if len(gpus) == 1:
        return gpus[0]
    pid = as_int(job.get("pid"))
    owning = [g for g in gpus if pid is not None and pid in (g.get("processes") or [])]
    if len(owning) == 1:
        return owning[0]
    rank = as_int(job.get("local_rank"))
    visible = job.get("cuda_visible_devices")
    if isinstance(visible, str):
        entries = [e.strip() for e in visible.split(",") if e.strip()]
        if rank is None and len(entries) != 1:
            return None  # several GPUs visible and no rank: no telling which
        if (rank or 0) >= len(entries):
            return None
        entry = entries[rank or 0]
        if entry.isdigit():
            if not cuda_order_is_nvml(job, gpus):
                return None
            return next((g for g in gpus if as_int(g.get("index")) == int(entry)), None)
        # a UUID (GPU-…, MIG-…), which CUDA also takes by a unique prefix
        named = [g for g in gpus if str(g.get("uuid") or "").startswith(entry)]
        return named[0] if len(named) == 1 else None
    if rank is not None and cuda_order_is_nvml(job, gpus):
        return next((g for g in gpus if as_int(g.get("index")) == rank), None)
    return None


def cuda_order_is_nvml(job: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the job's CUDA device indices count as NVML's do (PCI bus
    order). CUDA's default order is fastest first: the same as PCI order on a
    box of one GPU model (equals enumerate in PCI order), not on a mixed box
    unless the job sets ``CUDA_DEVICE_ORDER=PCI_BUS_ID``. Unknown names:
    no telling."""
    if str(job.get("cuda_device_order") or "").strip().upper() == "PCI_BUS_ID":
        return True
    names = {g.get("name") for g in gpus}
    return len(names) == 1 and None not in names


def window_util(history: Any, window_s: float | None) -> tuple[float | None, float | None, float | None]:
    """(mean, min, max) of a GPU's utilization figures over the last
    ``window_s`` seconds of its history (one figure a second, each itself the
    mean of NVML's samples over that second): the figure the hints quote and
    the view shows."""
    hist = [v for v in (num(x) for x in as_list(history)) if v is not None]
    n = max(1, int(round(window_s or 1)))
    last = hist[-n:]
    if not last:
        return None, None, None
    return round(sum(last) / len(last), 1), min(last), max(last)


def partner_phrase(lv: LoaderView) -> str:
    """ "; the same loop also takes from loader 1, and waits 63 ms on it a
    batch of this one": where the step figure a message quotes holds another
    loader's wait (zip, FixMatch), the message says so."""
    if not lv.partners:
        return ""
    ids = [str(p.lid) for p in lv.partners]
    waits = " and ".join(f"{p.wait_ms:.0f} ms" for p in lv.partners)
    if len(ids) == 1:
        return f"; the same loop also takes from loader {ids[0]}, and waits {waits} on it a batch of this one"
    return (
        f"; the same loop also takes from loaders {', '.join(ids[:-1])} and {ids[-1]}, and waits "
        f"{waits} on them a batch of this one"
    )


def partners_of(lv: LoaderView, views: Sequence[LoaderView]) -> tuple[Partner, ...]:
    """The loaders ``lv``'s loop takes from in the same steps (the job's
    ``loops``, collect/co_iterated.py), priced per batch of ``lv``."""
    ids: list[int] = []
    for loop in as_list(lv.job.get("loops")):
        group = as_list(as_dict(loop).get("loaders"))
        if lv.lid in group:
            ids = [i for i in group if isinstance(i, int) and i != lv.lid]
    rate = num(lv.loader.get("batches_per_s"))
    wait, step = num(lv.loader.get("wait_ms_mean")), lv.step_ms
    if not ids or not rate or wait is None or step is None:
        return ()
    out = []
    for other in views:
        if other.pid != lv.pid or other.lid not in ids:
            continue
        o_rate, o_wait = num(other.loader.get("batches_per_s")), num(other.loader.get("wait_ms_mean"))
        if not o_rate or o_wait is None:
            continue
        per = o_rate / rate  # its batches per batch of this one
        nw = as_int(other.loader.get("num_workers"))
        floor = None
        if nw and other.busy_mean is not None:
            floor = other.busy_mean * (wait + step)
        out.append(Partner(other.lid, nw, o_wait * per, floor))
    return tuple(out)


def build_context(
    snapshot: Mapping[str, Any],
    phase_of: Mapping[tuple[int, int], str],
    mem_series: MemSeries | None = None,
    others_decide: bool | None = None,
) -> Context:
    host = as_dict(snapshot.get("host"))
    usable = num(host.get("usable_cores"))
    if usable is not None and usable <= 0:
        usable = None
    live_jobs = [
        j
        for j in as_list(snapshot.get("jobs"))
        if isinstance(j, dict) and j.get("state", "live") == "live" and as_int(j.get("pid")) is not None
    ]
    views: list[LoaderView] = []
    for job in live_jobs:
        pid = as_int(job["pid"])
        if pid is None:  # live_jobs holds none such: for the type checker
            continue
        # A stage whose workers its wrapper shows (WebLoader's DataLoader,
        # model.lend_stage_workers): they are the wrapper's, counted once (a
        # QA run of OpenCLIP read "4 busy DataLoader workers" with 2).
        lent = {as_int(as_dict(ld).get("workers_from")) for ld in as_list(job.get("loaders"))} - {None}
        for ld in as_list(job.get("loaders")):
            lid = as_int(as_dict(ld).get("id"))
            if lid is None:
                continue
            workers = [] if lid in lent else live_workers(ld)
            busy = mean(worker_values(workers, "busy_fraction"))
            cpu_vals = worker_values(workers, "cpu_percent")
            cpu_mean = mean(cpu_vals)
            rq_vals = worker_values(workers, "runqueue_percent")
            views.append(
                LoaderView(
                    job=job,
                    loader=ld,
                    pid=pid,
                    lid=lid,
                    phase=phase_of.get((pid, lid), WARMUP),
                    workers=workers,
                    num_workers=as_int(ld.get("num_workers"))
                    if has_worker_knob(ld) and lid not in lent
                    else None,
                    wait=num(ld.get("data_wait_fraction")) if is_loop_wait(ld) else None,
                    busy_mean=busy,
                    cpu_mean=cpu_mean / PERCENT_PER_CORE if cpu_mean is not None else None,
                    cpu_missing=len(workers) - len(cpu_vals),
                    cpu_sum=sum(cpu_vals) / PERCENT_PER_CORE,
                    rq_sum=sum(rq_vals) / PERCENT_PER_CORE,
                    worker_ms=worker_ms_per_batch(ld, workers),
                    step_ms=num(ld.get("step_ms_mean")),
                )
            )
    for lv in views:
        lv.partners = partners_of(lv, views)
    return Context(
        snapshot=dict(snapshot),
        time=num(snapshot.get("time")),
        window_s=num(snapshot.get("window_s")),
        host=host,
        usable_cores=usable,
        live_jobs=live_jobs,
        loaders=views,
        gpu_ok=snapshot.get("gpu_status") == "ok",
        gpus=[g for g in as_list(snapshot.get("gpus")) if isinstance(g, dict)],
        mem_series=mem_series or {},
        others_decide=others_decide,
    )


def hint(
    id: str,
    severity: str,
    job_pid: int | None,
    loader_id: int | None,
    message: str,
    suggestion: str,
    evidence: dict[str, Any],
) -> dict[str, Any]:
    return {
        "id": id,
        "severity": severity,
        "job_pid": job_pid,
        "loader_id": loader_id,
        "message": message,
        "suggestion": suggestion,
        "evidence": evidence,
    }


def r(v: float | None, nd: int = 3) -> float | None:
    """Round evidence for humans and JSON diffs; keep None as None."""
    return None if v is None else round(v, nd)


def setting(loader: Mapping[str, Any], name: str, value: Any) -> str:
    """A DataLoader setting in the words of the framework that builds the
    loader (its ``framework``, from the code that iterates it): the HF
    Trainer's TrainingArguments, a Lightning DataModule's loader, the loader
    given to Accelerate's prepare(); else the class the script builds (a
    subclass's own name: litdata's or Mosaic's ``StreamingDataLoader``,
    torchdata's ``StatefulDataLoader``), else ``DataLoader(...)``."""
    own = knob(loader, name)
    if own is not None:
        cls, arg = own.split(".", 1)
        return f"{arg}={value} in {cls}(...)"
    fw = loader.get("framework")
    if fw == "transformers":
        return (
            f"dataloader_{name}={value} in TrainingArguments (the Trainer builds its train and eval "
            f"loaders with it)"
        )
    if fw == "lightning":
        which = {"eval": "val", "train": "train"}.get(str(loader.get("role")), "train/val")
        # Either class may define the hook (a QA run of Lightning's own
        # imagenet example: train_dataloader() on the LightningModule).
        return (
            f"{name}={value} in the DataLoader your {which}_dataloader() returns (in your "
            "LightningModule or LightningDataModule)"
        )
    if fw == "accelerate":
        return f"{name}={value} in the DataLoader you pass to accelerator.prepare()"
    built = loader.get("loader_class")
    if isinstance(built, str) and built.isidentifier():
        return f"{name}={value} in {built}(...)"
    return f"{name}={value} in DataLoader(...)"


def others_cores(acc: Any) -> list[str]:
    """["other processes N cores"] when processes outside the jobs measurably
    use CPU (``acc``: a capacity.CpuAccount), else nothing to say."""
    if acc.others_measured and acc.others >= 0.05:
        return [f"other processes {cores(round(acc.others, 1))}"]
    return []
