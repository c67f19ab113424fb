"""The snapshot, built from what the collector holds.

``Monitor`` (``monitor.py``) decides *when* to read sockets and sample
processes, host and GPUs; this module turns what it has into the snapshot
document of ``dlwatch.snapshot`` (docs/reference/snapshot-json.md). Nothing here does
I/O: the same connections and samples always give the same document, which
is what the golden test in ``tests/unit/test_snapshot_contract.py`` pins.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, cast

from dlwatch.collect import job_end
from dlwatch.collect import window as win
from dlwatch.collect.co_iterated import loops
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.loop_role import LOOP, loop_role
from dlwatch.collect.totals import Totals
from dlwatch.diagnose import hang
from dlwatch.snapshot import SCHEMA_VERSION, Host, Job, Snapshot

HISTORY_POINTS = 120
HISTORY_EVERY_NS = 1_000_000_000
# The diagnosis's own pass carries only what warm-up detection reads.
WARMUP_POINTS = 8


def process_figures(p: Mapping[str, Any]) -> dict[str, Any]:
    """A worker's figures from its process sample (``p``: empty when unsampled)."""
    # A zombie's memory is gone: /proc reads its RSS as 0, no figure of the
    # worker's (a QA run: an exited worker listed with "rss 0 B").
    gone = p.get("state") == "zombie"
    return {
        "rss_bytes": None if gone else p.get("rss_bytes"),
        "uss_bytes": None if gone else p.get("uss_bytes"),
        "threads": p.get("threads"),
        "runqueue_percent": p.get("runqueue_percent"),
        "state": p.get("state", "n/a") if p else "n/a",
        "error": p.get("error"),
    }


def snapshot_dict(
    *,
    now: float,
    window_s: float,
    host: dict[str, Any],
    gpu_status: str,
    gpus: list[dict[str, Any]],
    conns: Iterable[JobConnection],
    procs: dict[int, dict[str, Any]],
    runtime_dir: str,
    runtime_dir_error: str | None,
    errors: list[str],
    attached: Iterable[dict[str, Any]] = (),
) -> Snapshot:
    """The whole document. Jobs are ordered by run, rank and PID so that the
    ranks of one torchrun run sit together. ``hints`` is left empty: the
    diagnosis fills it. ``errors`` appears only when the collector had faults,
    so the document of a healthy collector is the schema's and nothing more.
    ``attached``: jobs sampled from outside (``attach.py``), already built;
    they come first: they are the jobs the user named (``dlwatch --attach
    P``), and the live view opens on the first job, not on a hooked job's
    exited entry."""
    conns = ordered(conns)
    attached = list(attached)
    snap: dict[str, Any] = {
        "schema_version": SCHEMA_VERSION,
        "time": now,
        "window_s": window_s,
        "host": host_dict(host) | cpu_accounting(host, conns, procs, attached),
        "gpu_status": gpu_status,
        "gpus": gpus,
        "jobs": attached + ended_in_order([job_dict(c, window_s, procs, now) for c in conns], conns),
        "hints": [],
        "runtime_dir": runtime_dir,
        "runtime_dir_error": runtime_dir_error,
    }
    if errors:
        snap["errors"] = list(errors)
    return snap  # type: ignore[return-value]


def ordered(conns: Iterable[JobConnection]) -> list[JobConnection]:
    return sorted(
        conns, key=lambda c: ((c.job or {}).get("run_id") or "", (c.job or {}).get("rank") or 0, c.pid)
    )


def host_dict(h: dict[str, Any]) -> Host:
    out: dict[str, Any] = {
        "logical_cpus": h.get("logical_cpus"),
        "usable_cores": h.get("usable_cores"),
        "cpu_percent": h.get("cpu_percent"),
        "shm_free_bytes": h.get("shm_free_bytes"),
    }
    for k, v in h.items():
        out.setdefault(k, v)
    return cast(Host, out)  # checked: snapshot.problems, in the tests


def cpu_accounting(
    host: dict[str, Any],
    conns: list[JobConnection],
    procs: dict[int, dict[str, Any]],
    attached: Iterable[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Who uses the usable cores, in cores (1.0 = one core), over one interval.

    ``jobs_cpu_cores``: the measured CPU of every live job's processes
    (trainers with all their threads, and workers); ``other_cpu_cores``: what
    the rest of the box uses on our CPUs, the host's busy cores minus those.
    The collector samples processes and host together, so both cover the same
    interval. Under a CPU quota smaller than the affinity mask, other tenants
    only count as far as they leave less idle time than the quota would let
    us use. None where a figure is missing: the rules then fall back to the
    jobs' own figures and say so.
    """
    pids = []
    for c in conns:
        if not c.live:
            continue
        pids.append(c.pid)
        if c.frames:
            for ld in c.frames[-1]["loaders"]:
                pids.extend(w["pid"] for w in ld["workers"] if w.get("pid"))
    for job in attached:
        if job.get("state") in ("live", "connecting"):
            pids.append(job["pid"])
            for ld in job.get("loaders", []):
                pids.extend(w["pid"] for w in ld.get("workers", []) if w.get("pid"))
    cpu = [(procs.get(p) or {}).get("cpu_percent") for p in pids]
    known = [v for v in cpu if isinstance(v, (int, float))]
    jobs = sum(known) / 100.0 if pids and len(known) == len(cpu) else None
    # The jobs' own CPU at a positive nice, which /proc/stat counts as "nice" too.
    jobs_niced = (
        sum(
            (procs.get(p) or {}).get("cpu_percent") or 0.0
            for p in pids
            if ((procs.get(p) or {}).get("nice") or 0) > 0
        )
        / 100.0
    )
    busy = host.get("busy_cores")
    others = None
    if isinstance(busy, (int, float)) and (jobs is not None or not pids):
        affinity = host.get("affinity_cores")
        usable = host.get("usable_cores")
        slack = 0.0
        if isinstance(affinity, (int, float)) and isinstance(usable, (int, float)):
            slack = max(0.0, affinity - usable)
        mine = host.get("monitor_cores")
        mine = mine if isinstance(mine, (int, float)) else 0.0
        # The monitor's own busy time (the live view drawing, a snapshot
        # starting) is no other process's: a new user's live view blamed
        # "other processes" for it.
        others = round(max(0.0, busy - (jobs or 0.0) - slack - mine), 3)
    niced = host.get("niced_busy_cores")
    others_niced = (
        round(min(others, max(0.0, niced - jobs_niced)), 3)
        if others is not None and isinstance(niced, (int, float))
        else None
    )
    return {
        "jobs_cpu_cores": None if jobs is None else round(jobs, 3),
        "other_cpu_cores": others,
        "other_niced_cpu_cores": others_niced,
    }


# A job whose trainer is stopped (SIGSTOP, ctrl-Z in its terminal) sends no
# frames: its last figures are frozen, and read beside /proc's fresh 0 % CPU
# they made a false story (a worker "busy 99 %" on "0 % CPU" read io-bound).
# Only "T": py-spy's reads stop a process briefly in "t" (tracing stop).
STOPPED_REASON = (
    "the process is stopped (SIGSTOP, or ctrl-Z in its terminal): its figures are frozen "
    "until it resumes (kill -CONT {pid})"
)


def job_state(c: JobConnection, main: dict[str, Any] | None = None) -> str:
    if c.state == "connecting":
        state = "live" if c.job is not None else "connecting"
    else:
        state = c.state
    if state == "live" and (main or {}).get("state") == "stopped":
        return "unreachable"
    return state


def ended_in_order(jobs: list[Job], conns: list[JobConnection]) -> list[Job]:
    """The jobs, with the order in which the ranks of a run ended said."""
    last = {c.pid: c.frames[-1].get("t") if c.frames else None for c in conns}
    exact = {c.pid: c.exit_clock_at for c in conns}
    job_end.order_of_ends(cast(list[dict[str, Any]], jobs), last, exact)
    return jobs


def job_dict(
    c: JobConnection, window_s: float, procs: dict[int, dict[str, Any]], now: float, history: bool = True
) -> Job:
    job = c.job or {}
    main = procs.get(c.pid, {}) if c.live else {}
    frames = list(c.frames)
    last = frames[-1] if frames else None
    state = job_state(c, main)
    stopped = state != job_state(c)  # live on its socket, SIGSTOPped in /proc
    out = {
        "pid": c.pid,
        "cmdline": job.get("cmdline", ""),
        "rank": job.get("rank"),
        "local_rank": job.get("local_rank"),
        "world_size": job.get("world_size"),
        "run_id": job.get("run_id"),
        "master": job.get("master"),
        "hostname": job.get("hostname"),
        "cuda_visible_devices": job.get("cuda_visible_devices"),
        "cuda_device_order": job.get("cuda_device_order"),
        "torch_version": job.get("torch_version", "unknown"),
        "start_method": job.get("start_method", "unknown"),
        "state": state,
        "state_reason": c.reason
        or (STOPPED_REASON.format(pid=c.pid) if stopped else "")
        or (
            "connected, but the job has not answered yet (stopped?)"
            if c.job is None and c.state == "connecting"
            else ""
        ),
        "age_s": round(max(0.0, now - float(job.get("started") or now)), 1),
        "main_cpu_percent": main.get("cpu_percent"),
        "main_thread_cpu_percent": main.get("main_thread_cpu_percent"),
        # torch's autograd device threads (CUDA's backward pass): null without any
        "autograd_cpu_percent": main.get("autograd_cpu_percent"),
        # Time the trainer's threads were runnable but waited for a core: with
        # main_cpu_percent, its CPU demand.
        "main_runqueue_percent": main.get("runqueue_percent"),
        "threads": main.get("threads"),
        "rss_bytes": main.get("rss_bytes"),
        "cuda_initialized": (last or {}).get("main", {}).get("cuda_initialized"),
        "bad_frames": c.bad_frames,
        "last_wire_error": c.last_error or None,
        "worker_profile": c.worker_profile,
        "loaders": [],
    }
    out["stacks"] = c.stacks
    lm = (last or {}).get("main") or {}
    train_threads = [t for t in lm.get("train_threads") or [] if isinstance(t, dict)]
    # Threads that step an optimizer (probe/trainthread.py): a job listed
    # before, or without, a loader dlwatch recognises says so.
    out["train_threads"] = train_threads
    if last is None:
        return cast(Job, out)  # checked: snapshot.problems, in the tests
    for ld in last["loaders"]:
        loader = loader_dict(
            frames,
            ld,
            window_s,
            procs if c.live else {},
            _history(c, frames, ld["id"], history),
            c.totals,
            train_threads,
            main.get("thread_cpu") if c.live else None,
        )
        if c.live:
            for wk in loader["workers"]:
                if isinstance(wk.get("rss_bytes"), int) and wk.get("pid"):
                    c.track_rss(wk["pid"], wk["rss_bytes"], now)
        loader["worker_deaths"] = [_death(d, c) for d in ld.get("worker_deaths") or [] if isinstance(d, dict)]
        if not c.live:
            # The process is gone, its iterators with it: the views say so
            # where a figure is missing, instead of a bare n/a.
            loader["active"] = False
            loader["epoch_open"] = False
        out["loaders"].append(loader)
    lend_stage_workers(out["loaders"])
    # Loaders one loop takes from together (zip, FixMatch): the loop's wait is theirs summed.
    out["loops"] = loops(out["loaders"])
    return cast(Job, out)  # checked: snapshot.problems, in the tests


def _death(d: dict[str, Any], c: JobConnection) -> dict[str, Any]:
    """A worker death as the job reported it, with what the monitor saw of
    it: its RSS when first and last sampled, the cgroup's OOM-kill count."""
    pid = d.get("pid")
    rss = c.worker_rss.get(pid) if isinstance(pid, int) else None
    oom = c.oom or {}
    out = {
        "id": d.get("id"),
        "pid": pid,
        "signal": d.get("signal"),
        "exit_code": d.get("exit_code"),
        "exception": d.get("exception"),
        "t": d.get("t"),
        "rss_first_bytes": rss[1] if rss else None,
        "rss_last_bytes": rss[3] if rss else None,
        "rss_span_s": round(rss[2] - rss[0], 1) if rss else None,
        "oom_kills": oom.get("oom_kills"),
        "oom_kills_at_start": oom.get("oom_kills_at_start"),
        "oom_kills_reason": oom.get("reason") if oom else "no worker death seen by this monitor",
    }
    out["cause"] = hang.death_cause(out)
    return out


def _history(c: JobConnection, frames: list[dict[str, Any]], loader_id: int, full: bool) -> dict[str, Any]:
    """The loader's 1 s history, computed at most once per second of the job's
    clock (its points are a second apart; the live figures are not from it).
    Without ``full``, only what warm-up detection reads: the last few points."""
    newest = frames[-1]["mono_ns"]
    cached = c.history_cache.get(loader_id)
    if cached is None or newest < cached[0] or newest - cached[0] >= HISTORY_EVERY_NS:
        cached = (newest, win.series(frames, loader_id, 1.0, HISTORY_POINTS))
        live = {ld["id"] for ld in frames[-1]["loaders"]}
        c.history_cache = {k: v for k, v in c.history_cache.items() if k in live}
        c.history_cache[loader_id] = cached
    series = cached[1]
    if full:
        return {k: list(v) for k, v in series.items()}
    return {k: v[-WARMUP_POINTS:] for k, v in series.items()}


def _iterated_on(v: Any) -> dict[str, Any] | None:
    if not isinstance(v, dict) or not isinstance(v.get("main"), bool):
        return None
    return {"thread": str(v.get("thread") or "?")[:80], "main": v["main"]}


def loader_dict(
    frames: list[dict[str, Any]],
    ld: dict[str, Any],
    window_s: float,
    procs: dict[int, dict[str, Any]],
    history: dict[str, Any],
    totals: Totals | None = None,
    train_threads: list[dict[str, Any]] | None = None,
    thread_cpu: dict[int, float | None] | None = None,
) -> dict[str, Any]:
    w = win.loader_window(frames, ld["id"], window_s) or {}
    train_threads = train_threads or []
    lifetime = (totals.loader(ld["id"]) if totals is not None else None) or {}
    esm = ld.get("epoch_start_ms") or []
    em = ld.get("epoch_ms") or []
    workers = []
    for wk in w.get("workers", []):
        p = procs.get(wk["pid"], {})
        workers.append(
            {
                "id": wk["id"],
                "pid": wk["pid"],
                "cpu_percent": p.get("cpu_percent"),
                "busy_fraction": wk["busy_fraction"],
                "fetch_ms_mean": wk["fetch_ms_mean"],
                "fetch_ms_p50": wk.get("fetch_ms_p50"),
                "fetch_ms_p95": wk.get("fetch_ms_p95"),
                "fetch_ms_p99": wk.get("fetch_ms_p99"),
                "batches": wk["batches"],
                "window_batches": wk.get("window_batches", 0),
                "first_batch_digest": wk.get("first_batch_digest"),
                "second_batch_digest": wk.get("second_batch_digest"),
                "busy_s_total": totals.worker_busy_s(ld["id"], wk["id"]) if totals is not None else None,
                **process_figures(p),
            }
        )
    q = ld.get("queue") or {}
    role, role_reason = loop_role(ld, train_threads)
    feeder = w.get("feeder")
    if role != LOOP:
        # Its own figures are a feeder's (or a stage's): shown as such, never
        # as the loop's wait, which no rule then reads.
        feeder = {
            "thread": str((ld.get("iterated_on") or {}).get("thread") or "?")[:80],
            "wait_fraction": w.get("data_wait_fraction"),
            "wait_ms_mean": w.get("wait_ms_mean"),
            "handover_ms_mean": w.get("step_ms_mean"),
            "batches_per_s": w.get("batches_per_s", 0.0),
        }
        w = dict(
            w,
            data_wait_fraction=None,
            wait_ms_mean=None,
            step_ms_mean=None,
            next_cpu_ms_mean=None,
            no_batch_reason=role_reason,
        )
    out = {
        "id": ld["id"],
        "num_workers": ld.get("num_workers", 0),
        "batch_size": ld.get("batch_size"),
        # The first dimension of the batch's arrays: what the view shows where
        # no batch size is declared (a watched get_batch()), said as read.
        "batch_rows": ld.get("batch_rows"),
        # None where the loop has no such setting (a watched loop, nodes, Grain:
        # only a DataLoader's config carries it): "set pin_memory=True in
        # DataLoader(...)" is no advice for a loop without one.
        "pin_memory": pin if isinstance(pin := ld.get("pin_memory"), bool) else None,
        "batch_bytes": ld.get("batch_bytes"),
        # None where the pipeline has no such setting (nodes, Grain): a QA run
        # of a grain.DataLoader read "set persistent_workers=True", which it lacks.
        "persistent_workers": pw if isinstance(pw := ld.get("persistent_workers"), bool) else None,
        "prefetch_factor": ld.get("prefetch_factor"),
        "start_method": ld.get("start_method"),
        "kind": ld.get("kind", "map"),
        "dataset": ld.get("dataset"),
        "dataset_wrappers": list(ld.get("dataset_wrappers") or []),
        "shards": ld.get("shards"),
        "shards_of": ld.get("shards_of"),
        "in_order": ld.get("in_order"),
        "iterated_on": _iterated_on(ld.get("iterated_on")),
        "head_of_line_fraction": w.get("head_of_line_fraction"),
        "active": bool(ld.get("active", False)),
        # Older probes do not say: None, taken as open while active.
        "epoch_open": ld.get("epoch_open"),
        "framework": ld.get("framework"),
        "role": ld.get("role"),
        "epoch": ld["epoch"],
        "batches_total": ld["batches"],
        "wait_s_total": lifetime.get("wait_s_total"),
        "step_s_total": lifetime.get("step_s_total"),
        "batches_per_s": w.get("batches_per_s", 0.0),
        "data_wait_fraction": w.get("data_wait_fraction"),
        # What the rate figures cover: at least the snapshot's window_s and
        # MIN_WINDOW_BATCHES batches (collect/window.py), as far as the frames go.
        "window_s": w.get("window_s"),
        "window_batches": w.get("window_batches", 0),
        "no_batch_reason": w.get("no_batch_reason"),
        "epoch_first_batch_age_s": w.get("epoch_first_batch_age_s"),
        "last_batch_age_s": w.get("last_batch_age_s"),
        "wait_ms_mean": w.get("wait_ms_mean"),
        "step_ms_mean": w.get("step_ms_mean"),
        # The loop thread's CPU inside next() per batch (the probe reads it on
        # one batch in 16): taking a batch from the workers, in series with
        # the step (capacity.py's "handover" term). None: not read.
        "next_cpu_ms_mean": w.get("next_cpu_ms_mean"),
        "epoch_start_ms_last": esm[-1] if esm else None,
        "epoch_start_ms": esm,
        "epoch_ms": em,
        "epoch_ms_last": em[-1] if em else None,
        "teardown_ms_mean": teardown_ms_mean(ld),
        "epoch_batches": list(ld.get("epoch_batches") or []),
        "queue": {"ready": q.get("ready"), "in_flight": q.get("in_flight"), "capacity": q.get("capacity")},
        "queue_mean": w.get("queue_mean", {"ready": None, "in_flight": None}),
        "worker_ms_per_batch": w.get("worker_ms_per_batch"),
        "window_mono_ns": [w.get("start_mono_ns"), w.get("end_mono_ns")],
        "workers": workers,
        "history": history,
        # A stall (docs/hangs.md): seconds without a batch past the threshold, else None.
        "stalled_s": num_or_none(ld.get("stalled_s")),
        "stall_threshold_s": num_or_none(ld.get("stall_threshold_s")),
        "in_next": ld.get("in_next") if isinstance(ld.get("in_next"), bool) else None,
        "feeder_alive": ld.get("feeder_alive") if isinstance(ld.get("feeder_alive"), bool) else None,
        # The worker whose batch the stalled loop waits for (in-order loaders), else None.
        "awaited_worker": ld.get("awaited_worker") if isinstance(ld.get("awaited_worker"), int) else None,
        "last_error": ld.get("last_error") if isinstance(ld.get("last_error"), str) else None,
        # Only with `dlwatch run --autotune`: its state and decisions (docs/autotune.md).
        "autotune": ld.get("autotune") if isinstance(ld.get("autotune"), dict) else None,
        # What feeds the loop (docs/pipelines.md): the library, its knobs under
        # its own names, thread or process workers; whose wait the figures are.
        "library": str(ld.get("library") or "torch")[:40],
        "loader_class": ld.get("loader_class") if isinstance(ld.get("loader_class"), str) else None,
        "knobs": dict(ld["knobs"]) if isinstance(ld.get("knobs"), dict) else None,
        "worker_kind": ld.get("worker_kind") if ld.get("worker_kind") in ("thread", "process") else None,
        "pipeline_workers": pipeline_workers(ld.get("pipeline_workers"), procs, thread_cpu),
        "loop_role": role,
        "feeder": feeder,
        "consumer": _consumer(ld.get("consumer")),
        "nested_in": ld.get("nested_in") if isinstance(ld.get("nested_in"), int) else None,
    }

    if isinstance(ld.get("replay"), dict):
        out["replay"] = _replay(ld["replay"])
    return out


# What a thin wrapper (WebDataset's WebLoader, a dlwatch.watch() around a
# DataLoader) takes from the DataLoader it steps: its workers and settings.
_LENT = (
    # an iterable dataset's shards cap the stage's workers (rules_sharding)
    "kind",
    "shards",
    "shards_of",
    "num_workers",
    "workers",
    "queue",
    "prefetch_factor",
    "persistent_workers",
    "pin_memory",
    "start_method",
)


def lend_stage_workers(loaders: list[dict[str, Any]]) -> None:
    """A wrapper with no workers of its own whose stage is a DataLoader with
    workers (``WebLoader(dataset, num_workers=4)``): the wrapper's wait is
    the loop's, the stage's workers are what make its batches, so the
    wrapper shows them and the advice names the DataLoader's knob."""
    by_id = {ld["id"]: ld for ld in loaders}
    for inner in loaders:
        outer = by_id.get(inner.get("nested_in"))
        if outer is None or inner.get("loop_role") != "stage" or inner.get("library") != "torch":
            continue
        if outer.get("knobs") or outer.get("num_workers") or outer.get("workers"):
            continue
        for k in _LENT:
            outer[k] = inner.get(k)
        nw = inner.get("num_workers") or 0
        outer["knobs"] = {"DataLoader.num_workers": nw}
        if inner.get("prefetch_factor") is not None:
            outer["knobs"]["DataLoader.prefetch_factor"] = inner["prefetch_factor"]
        outer["worker_ms_per_batch"] = inner.get("worker_ms_per_batch")
        outer["workers_from"] = inner["id"]


def _consumer(v: Any) -> dict[str, Any] | None:
    if not isinstance(v, dict):
        return None
    return {
        "thread": str(v.get("thread") or "?")[:80],
        "main": bool(v.get("main")),
        "via": str(v.get("via") or ""),
    }


def pipeline_workers(
    v: Any, procs: dict[int, dict[str, Any]], thread_cpu: dict[int, float | None] | None
) -> list[dict[str, Any]]:
    """A pipeline's thread or process workers (nodes, Grain), with the CPU
    the monitor measured for each: a thread's from /proc/PID/task/TID, a
    process's as any worker's."""
    out: list[dict[str, Any]] = []
    for w in v if isinstance(v, list) else []:
        if not isinstance(w, dict):
            continue
        if w.get("kind") == "thread" and isinstance(w.get("tid"), int):
            out.append(
                {
                    "id": w.get("id"),
                    "kind": "thread",
                    "tid": w["tid"],
                    "name": str(w.get("name") or "")[:80],
                    "cpu_percent": (thread_cpu or {}).get(w["tid"]),
                }
            )
        elif w.get("kind") == "process" and isinstance(w.get("pid"), int):
            p = procs.get(w["pid"], {})
            out.append(
                {"id": w.get("id"), "kind": "process", "pid": w["pid"], "cpu_percent": p.get("cpu_percent")}
            )
    return out


def num_or_none(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


REPLAY_KEYS = (
    "state",
    "batches_cached",
    "bytes_cached",
    "batches_wanted",
    "max_bytes",
    "limited_by",
    "in_place",
)


def _replay(rep: dict[str, Any]) -> dict[str, Any]:
    """The replay state a tune ceiling trial's probe reports (docs/tune.md)."""
    return {k: rep.get(k) for k in REPLAY_KEYS}


def teardown_ms_mean(ld: dict[str, Any]) -> float | None:
    """ms the ``next()`` that ends an epoch takes, on average over the epochs
    ended (the probe's ``teardown_ns``): joining non-persistent workers, which
    ``epoch_ms`` leaves out and persistent workers do not pay."""
    total = ld.get("teardown_ns")
    epoch = ld.get("epoch")
    if not isinstance(total, int) or not isinstance(epoch, int):
        return None
    ended = epoch - (0 if ld.get("epoch_open") is False or ld.get("active") is False else 1)
    return round(total / 1e6 / ended, 3) if ended > 0 else None
