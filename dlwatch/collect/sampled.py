"""What the stacks of an attached job say (``dlwatch attach``), as estimates.

A job started without the hook is sampled from outside (``stacks.py`` reads
py-spy's output); this module turns the samples into the snapshot's figures:

- **data wait**: the share of the training thread's samples that are inside a
  DataLoader iterator's ``__next__`` (torch's single-process and
  multi-process iterators, pin memory or not, and iterators derived from
  them: torchdata's StatefulDataLoader). The training thread is the thread of
  the attached process seen inside ``__next__`` most often;
- **workers**: the job's descendants whose stacks run torch's ``_worker_loop``,
  each with its busy share (inside the dataset fetch) and its share waiting
  for the next index;
- every share with its sample count and a 95 % binomial interval (Wilson's,
  which stays inside 0..1 and is honest at 0 % and 100 %).

Nothing here does I/O: the same stacks and process figures always give the
same document.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dlwatch.collect.model import process_figures
from dlwatch.collect.stacks import Stack, parse_frame

# A forkserver worker's parent: the server the job started (a child of the job).
_FORKSERVER = "multiprocessing.forkserver"

Z95 = 1.96
# What views print for a figure only the hook can measure.
NOT_SAMPLED = "n/a (attached: sampled)"

# Where torch's DataLoader code lives; frames are matched on the function
# name and on the file, so a user function that happens to be called
# ``fetch`` is not mistaken for torch's.
_DATA_FILES = ("torch/utils/data/", "stateful_dataloader")
_WORKER_FILE = "torch/utils/data/_utils/worker.py"
_FETCH_FILE = "torch/utils/data/_utils/fetch.py"
_PIN_FILE = "torch/utils/data/_utils/pin_memory.py"
# An iterator's __next__ and what only __next__ calls: a sample torn by
# non-blocking reading may have lost the __next__ frame but kept these.
_ITERATOR_STEPS = frozenset(
    {"__next__", "_next_data", "_get_data", "_try_get_data", "_try_put_index", "_process_data", "_next_index"}
)


def wilson(hits: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial share, None without samples."""
    if n <= 0:
        return None
    p = hits / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass(frozen=True)
class Share:
    """``hits`` of ``samples`` samples, e.g. inside ``__next__``."""

    hits: int
    samples: int

    @property
    def fraction(self) -> float | None:
        return self.hits / self.samples if self.samples > 0 else None

    @property
    def bounds(self) -> tuple[float, float] | None:
        return wilson(self.hits, self.samples)

    @property
    def pm(self) -> float | None:
        """Half the width of the 95 % interval: the "±" views print."""
        b = self.bounds
        return None if b is None else (b[1] - b[0]) / 2

    def evidence(self) -> dict[str, Any]:
        b = self.bounds
        return {
            "fraction": _r(self.fraction),
            "pm": _r(self.pm),
            "samples": self.samples,
            "ci95": None if b is None else [_r(b[0]), _r(b[1])],
        }


def _r(v: float | None, nd: int = 4) -> float | None:
    return None if v is None else round(v, nd)


def _funcname(func: str) -> str:
    return func.rsplit(".", 1)[-1]


def frame_kind(frame: str) -> str | None:
    """What a frame means here: "next" (a DataLoader iterator's __next__),
    "worker" (torch's worker loop), "fetch" (a worker's dataset fetch),
    "index" (a worker waiting for its next index), "pin" (the pin-memory
    thread), or None."""
    f = parse_frame(frame)
    name = _funcname(f.func)
    path = f.file.replace("\\", "/")
    if name in _ITERATOR_STEPS and any(d in path for d in _DATA_FILES):
        return "next"
    if name == "_worker_loop" and path.endswith(_WORKER_FILE):
        return "worker"
    if name == "fetch" and path.endswith(_FETCH_FILE):
        return "fetch"
    if name == "_pin_memory_loop" and path.endswith(_PIN_FILE):
        return "pin"
    return None


def _kinds(frames: Iterable[str]) -> set[str]:
    out = set()
    for fr in frames:
        k = frame_kind(fr)
        if k is not None:
            out.add(k)
    return out


# What only the multi-process iterator calls (its queues and indices).
_MULTI_ONLY = frozenset({"_get_data", "_try_get_data", "_try_put_index", "_process_data"})


def _iterator_class(frames: Iterable[str]) -> str | None:
    parsed = [parse_frame(fr) for fr in frames]
    for f in parsed:
        if "SingleProcessDataLoaderIter" in f.func:
            return "single-process"
        if "MultiProcessingDataLoaderIter" in f.func:
            return "multi-process"
    # A Python 3.10 job's frames name no class: what the iterator calls tells
    # them apart (the single-process one fetches in the loop's own thread).
    calls = {(_funcname(f.func), f.file.replace("\\", "/")) for f in parsed}
    if any(n in _MULTI_ONLY and any(d in p for d in _DATA_FILES) for n, p in calls):
        return "multi-process"
    if any(n == "fetch" and p.endswith(_FETCH_FILE) for n, p in calls):
        return "single-process"
    return None


@dataclass(frozen=True)
class WorkerSamples:
    pid: int
    tid: int | None
    busy: Share  # inside the dataset fetch, of the samples inside the worker loop
    waiting_index: Share  # blocked on the index queue: idle
    # Earlier processes of the same worker slot, replaced during the
    # recording (a loader without persistent_workers starts new ones each
    # epoch); ``pid`` is the newest. The shares cover them all.
    replaced: tuple[int, ...] = ()


@dataclass
class Sampled:
    """The job as its samples show it."""

    root_pid: int
    samples: int = 0  # every sample of every thread of the job's processes
    torn: int = 0  # samples left out: frames missing at the outer end (see summarize)
    # Samples of processes that are not the job's (see own_process), left out.
    foreign: int = 0
    # Children seen inside a DataLoader iterator themselves: the ranks under a
    # launcher (torchrun, accelerate launch) are the jobs to attach to.
    child_loops: set[int] = field(default_factory=set)
    processes: set[int] = field(default_factory=set)  # processes with at least one sample
    training_tid: int | None = None
    training_thread: str = ""
    data_wait: Share | None = None
    iterator: str | None = None  # "single-process" / "multi-process"
    pin_memory: bool = False
    workers: list[WorkerSamples] = field(default_factory=list)

    @property
    def python(self) -> bool:
        """py-spy could read the process at least once."""
        return self.root_pid in self.processes


def _roots(stacks: list[Stack], root_pid: int) -> dict[tuple[int, int | None], str]:
    """Each thread's outermost frame (function and file, not line) as most of
    its samples show it."""
    seen: dict[tuple[int, int | None], dict[str, int]] = {}
    for st in stacks:
        if st.frames:
            key = (st.pid if st.pid is not None else root_pid, st.tid)
            c = seen.setdefault(key, {})
            r = _outer(st)
            c[r] = c.get(r, 0) + st.count
    return {k: max(c.items(), key=lambda kv: kv[1])[0] for k, c in seen.items()}


def _outer(st: Stack) -> str:
    f = parse_frame(st.frames[0])
    return f"{f.func} ({f.file})"


def own_process(st: Stack, root_pid: int) -> bool:
    """Whether a stack is of the job's own processes: the attached process
    itself, its children (fork and spawn workers are the trainer's children)
    and a forkserver's children (the server is the trainer's child). py-spy
    follows every descendant of the PID it is given, and from a launcher or
    a container's first process that is other programs altogether: their
    DataLoader workers are not this job's."""
    pids = st.pids or (root_pid,)
    if pids[0] != root_pid:
        return False
    if len(pids) <= 2:
        return True
    return len(pids) == 3 and len(st.cmdlines) > 1 and _FORKSERVER in st.cmdlines[1]


def summarize(stacks: Iterable[Stack], root_pid: int) -> Sampled:
    """The training thread, the data wait and the workers of one job.

    py-spy reads a running thread's frames without stopping it, so now and
    then a sample is torn: frames missing from its outer end. Those (a stack
    whose outermost frame is not the one the thread's other samples start
    at) are left out of every share and counted in ``torn``: torn reads
    happen while the thread runs Python, which in a loop that sleeps or
    waits on the GPU is mostly inside ``__next__``, so counting them as
    "not waiting" would bias the data wait down."""
    stacks = list(stacks)
    roots = _roots([st for st in stacks if own_process(st, root_pid)], root_pid)
    out = Sampled(root_pid=root_pid)
    # (pid, tid) -> [all samples, samples in __next__ / in the worker loop, in fetch, on the index]
    threads: dict[tuple[int, int | None], list[int]] = {}
    names: dict[tuple[int, int | None], str] = {}
    workers: set[tuple[int, int | None]] = set()
    iterators: dict[str, int] = {}
    for st in stacks:
        if not own_process(st, root_pid):
            out.foreign += st.count
            continue
        pid = st.pid if st.pid is not None else root_pid
        out.samples += st.count
        out.processes.add(pid)
        key = (pid, st.tid)
        if st.frames and _outer(st) != roots.get(key):
            out.torn += st.count
            continue
        c = threads.setdefault(key, [0, 0, 0, 0])
        names.setdefault(key, st.thread)
        c[0] += st.count
        kinds = _kinds(st.frames)
        if "pin" in kinds and pid == root_pid:
            out.pin_memory = True
        if pid != root_pid and "next" in kinds and "worker" not in kinds:
            out.child_loops.add(pid)
        if pid == root_pid and "next" in kinds:
            c[1] += st.count
            it = _iterator_class(st.frames)
            if it is not None:
                iterators[it] = iterators.get(it, 0) + st.count
        if pid != root_pid and "worker" in kinds:
            workers.add(key)
            c[1] += st.count
            if "fetch" in kinds:
                c[2] += st.count
            elif _waiting_for_index(st.frames):
                c[3] += st.count
    trainers = [(c[1], k) for k, c in threads.items() if k[0] == root_pid and c[1] > 0]
    if trainers:
        _, key = max(trainers, key=lambda t: (t[0], -(t[1][1] or 0)))
        out.training_tid = key[1]
        out.training_thread = names.get(key, "")
        out.data_wait = Share(threads[key][1], threads[key][0])
    if iterators:
        out.iterator = max(iterators.items(), key=lambda kv: kv[1])[0]
    per_pid: dict[int, tuple[int | None, list[int]]] = {}
    for key in workers:
        c = threads[key]
        # A worker process runs the loop in one thread; keep the busiest if two say so.
        if key[0] not in per_pid or c[1] > per_pid[key[0]][1][1]:
            per_pid[key[0]] = (key[1], c)
    out.workers = [
        WorkerSamples(pid, tid, Share(c[2], c[1]), Share(c[3], c[1]))
        for pid, (tid, c) in sorted(per_pid.items())
    ]
    return out


def merge_slots(
    workers: list[WorkerSamples], lives: Mapping[int, tuple[float, float]] | None
) -> list[WorkerSamples]:
    """One entry per worker slot: a worker that started after another one
    ended holds that one's slot (a loader without persistent_workers
    replaces its workers each epoch), so the count is the most workers alive
    at once, not every process seen. ``lives``: each worker's (start, last
    seen alive) in seconds, from polls of the process tree during the
    recording. A worker no poll saw lived between two polls (well under a
    second): it joins the slot with the fewest samples, never adds one.
    Without ``lives`` nothing is merged."""
    if not lives or len(workers) < 2:
        return list(workers)
    known = sorted((w for w in workers if w.pid in lives), key=lambda w: (lives[w.pid][0], w.pid))
    slots: list[list[WorkerSamples]] = []
    for w in known:
        start = lives[w.pid][0]
        free = [s for s in slots if lives[s[-1].pid][1] < start]
        if free:
            # The slot whose worker ended last before this one started.
            max(free, key=lambda s: lives[s[-1].pid][1]).append(w)
        else:
            slots.append([w])
    for w in workers:
        if w.pid not in lives:
            if slots:
                min(slots, key=lambda s: sum(x.busy.samples for x in s)).insert(0, w)
            else:
                slots.append([w])
    return sorted((_merged(s) for s in slots), key=lambda w: w.pid)


def _merged(slot: list[WorkerSamples]) -> WorkerSamples:
    last = slot[-1]
    if len(slot) == 1:
        return last
    return WorkerSamples(
        last.pid,
        last.tid,
        Share(sum(w.busy.hits for w in slot), sum(w.busy.samples for w in slot)),
        Share(sum(w.waiting_index.hits for w in slot), sum(w.waiting_index.samples for w in slot)),
        tuple(w.pid for w in slot[:-1]),
    )


def _waiting_for_index(frames: tuple[str, ...]) -> bool:
    """Inside the worker loop, blocked in a queue's ``get``: the worker waits
    for the next index (the only queue a worker reads)."""
    seen_loop = False
    for fr in frames:
        k = frame_kind(fr)
        if k == "worker":
            seen_loop = True
            continue
        if seen_loop and _funcname(parse_frame(fr).func) == "get" and "queues.py" in parse_frame(fr).file:
            return True
    return False


def start_method(root_cmdline: str, worker_cmdline: str, worker_ppid: int | None, root_pid: int) -> str:
    """How a worker was started, from its command line and parent: a spawn
    child runs ``multiprocessing.spawn``, a forkserver child's parent is the
    fork server, a fork child is the trainer's copy."""
    if "multiprocessing.spawn" in worker_cmdline or "--multiprocessing-fork" in worker_cmdline:
        return "spawn"
    if worker_ppid is not None and worker_ppid != root_pid:
        return "forkserver"
    return "fork"


def job_dict(
    identity: Mapping[str, Any],
    s: Sampled,
    procs: Mapping[int, Mapping],
    *,
    span_s: float | None,
    state: str = "live",
    state_reason: str = "",
    worker_order: Mapping[int, float] | None = None,
    start_methods: Mapping[int, str] | None = None,
) -> dict:
    """A job of the snapshot (docs/reference/snapshot-json.md) for an attached job:
    the sampled figures, the process figures of ``procs`` (as the hooked
    jobs'), and None where only the hook can measure (views print
    ``NOT_SAMPLED``)."""
    main = procs.get(s.root_pid) or {}
    rate = s.data_wait.samples / span_s if s.data_wait and span_s else None
    job: dict[str, Any] = {
        "pid": s.root_pid,
        "cmdline": identity.get("cmdline", ""),
        "rank": identity.get("rank"),
        "local_rank": identity.get("local_rank"),
        "world_size": identity.get("world_size"),
        "run_id": identity.get("run_id"),
        "master": identity.get("master"),
        "hostname": identity.get("hostname"),
        "cuda_visible_devices": identity.get("cuda_visible_devices"),
        "cuda_device_order": identity.get("cuda_device_order"),
        "torch_version": identity.get("torch_version") or "unknown",
        "start_method": "unknown",
        "state": state,
        "state_reason": state_reason,
        "age_s": identity.get("age_s"),
        "main_cpu_percent": main.get("cpu_percent"),
        "main_thread_cpu_percent": main.get("main_thread_cpu_percent"),
        "autograd_cpu_percent": main.get("autograd_cpu_percent"),
        "main_runqueue_percent": main.get("runqueue_percent"),
        "threads": main.get("threads"),
        "rss_bytes": main.get("rss_bytes"),
        "cuda_initialized": None,
        "bad_frames": 0,
        "last_wire_error": None,
        "sampled": True,
        "sampling": {
            "tool": "py-spy",
            "span_s": _r(span_s, 2),
            "samples": s.samples,
            "training_thread_samples": s.data_wait.samples if s.data_wait else 0,
            "rate_hz": _r(rate, 1),
            "training_tid": s.training_tid,
            "training_thread": s.training_thread,
            "torn_samples": s.torn,
            "other_process_samples": s.foreign,
            "replaced_workers": sum(len(w.replaced) for w in s.workers),
            "torch_loaded": identity.get("torch_loaded"),
        },
        "loaders": [],
    }
    if s.data_wait is None:
        if not job["state_reason"]:
            job["state_reason"] = (
                f"no DataLoader iterator seen in {s.samples} samples of this process"
                if s.python
                else "not sampled yet"
            )
            if s.child_loops:
                pids = " ".join(f"--pid {p}" for p in sorted(s.child_loops))
                job["state_reason"] += (
                    f"; its child process{'es' if len(s.child_loops) > 1 else ''} "
                    f"{', '.join(map(str, sorted(s.child_loops)))} iterate one: `dlwatch attach {pids}`"
                )
        return job
    order = worker_order or {}
    ordered = sorted(s.workers, key=lambda w: (order.get(w.pid, math.inf), w.pid))
    methods = {m for m in ((start_methods or {}).get(w.pid) for w in ordered) if m}
    method = methods.pop() if len(methods) == 1 else None
    if method:
        job["start_method"] = method
    workers = []
    for i, w in enumerate(ordered):
        p = procs.get(w.pid) or {}
        workers.append(
            {
                "id": i,
                "pid": w.pid,
                "cpu_percent": p.get("cpu_percent"),
                "busy_fraction": _r(w.busy.fraction),
                "busy_pm": _r(w.busy.pm),
                "busy_samples": w.busy.samples,
                "waiting_index_fraction": _r(w.waiting_index.fraction),
                "fetch_ms_mean": None,
                "batches": None,
                **process_figures(p),
            }
        )
    dw = s.data_wait
    pooled = Share(sum(w.busy.hits for w in s.workers), sum(w.busy.samples for w in s.workers))
    job["loaders"].append(
        {
            "id": 0,
            "num_workers": len(workers),
            "batch_size": None,
            "batch_rows": None,
            "pin_memory": s.pin_memory,
            "persistent_workers": None,
            "prefetch_factor": None,
            "start_method": method,
            "kind": None,
            "dataset": None,
            "active": True,
            "epoch": None,
            "batches_total": None,
            "batches_per_s": None,
            "data_wait_fraction": _r(dw.fraction),
            "data_wait_pm": _r(dw.pm),
            "data_wait_samples": dw.samples,
            "data_wait_ci95": [_r(b) for b in dw.bounds] if dw.bounds else None,
            "iterator": s.iterator,
            # Every worker's samples together: what the worker-count estimate reads.
            "workers_busy": pooled.evidence() if s.workers else None,
            "sampled": True,
            "window_s": _r(span_s, 2),
            "wait_ms_mean": None,
            "step_ms_mean": None,
            "epoch_start_ms_last": None,
            "queue": {"ready": None, "in_flight": None, "capacity": None},
            "workers": workers,
        }
    )
    return job


def is_sampled(record: Mapping) -> bool:
    return record.get("sampled") is True
