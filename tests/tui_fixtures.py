"""Deterministic snapshot dicts for the TUI tests (fixed times and numbers).

Shapes follow the snapshot contract (dlwatch/snapshot.py), which
tests/unit/test_snapshot_contract.py checks them against. Every builder
returns a fresh dict so tests may mutate what they get.
"""

from __future__ import annotations

import copy

T0 = 1_750_000_000.0  # fixed "now" of every snapshot
GIB = 1024**3
MIB = 1024**2

NO_GPU_STATUS = "n/a: NVML not found"


def ramp(n: int, start: float, end: float) -> list[float]:
    """``n`` values from start to end with a fixed wobble (no randomness)."""
    wobble = [0.0, 0.03, -0.02, 0.01, -0.03, 0.02]
    out = []
    for i in range(n):
        v = start + (end - start) * i / max(1, n - 1) + wobble[i % len(wobble)]
        out.append(round(min(1.0, max(0.0, v)), 3))
    if out:
        out[-1] = round(end, 3)  # the newest sample is the figure on screen
    return out


def worker(
    wid: int,
    pid: int,
    *,
    cpu: float = 95.0,
    busy: float | None = 0.97,
    fetch_ms: float | None = 180.0,
    batches: int = 300,
    rss: int = 610 * MIB,
    uss: int | None = 240 * MIB,
    threads: int = 3,
    state: str = "running",
) -> dict:
    return {
        "id": wid,
        "pid": pid,
        "cpu_percent": cpu,
        "busy_fraction": busy,
        "fetch_ms_mean": fetch_ms,
        "batches": batches,
        "rss_bytes": rss,
        "uss_bytes": uss,
        "threads": threads,
        "state": state,
        "error": None,
    }


def loader(
    lid: int = 0,
    *,
    workers: list[dict] | None = None,
    wait: float = 0.62,
    bps: float = 12.3,
    wait_ms: float = 50.4,
    step_ms: float = 81.2,
    epoch: int = 3,
    batches_total: int = 1234,
    epoch_start_ms: float | None = 1840.0,
    queue: dict | None = None,
    persistent: bool = False,
    pin: bool = True,
    prefetch: int | None = 2,
    batch_size: int | None = 64,
    active: bool = True,
    history_from: float = 0.55,
) -> dict:
    workers = workers if workers is not None else []
    nw = len(workers)
    return {
        "id": lid,
        "num_workers": nw,
        "batch_size": batch_size,
        "pin_memory": pin,
        "persistent_workers": persistent,
        "prefetch_factor": prefetch if nw else None,
        "epoch": epoch,
        "batches_total": batches_total,
        "batches_per_s": bps,
        "data_wait_fraction": wait,
        "wait_ms_mean": wait_ms,
        "step_ms_mean": step_ms,
        "epoch_start_ms_last": epoch_start_ms,
        "queue": queue
        if queue is not None
        else (
            {"ready": 0, "in_flight": 2 * nw, "capacity": 2 * nw}
            if nw
            else {"ready": None, "in_flight": None, "capacity": None}
        ),
        "workers": workers,
        "kind": "map",
        "active": active,
        "start_method": "fork" if nw else None,
        "epoch_ms_last": 98_000.0,
        "epoch_start_ms": [1790.0, 1850.0, epoch_start_ms or 0.0],
        "epoch_ms": [97_500.0, 98_000.0],
        "history": {
            "data_wait_fraction": ramp(60, history_from, wait),
            "batches_per_s": [round(bps + (i % 5) * 0.1, 2) for i in range(60)],
        },
        "worker_ms_per_batch": 180.0 if nw else None,
    }


def job(
    pid: int,
    *,
    cmdline: str = "python train.py --epochs 10",
    loaders: list[dict] | None = None,
    rank: int | None = None,
    world_size: int | None = None,
    run_id: str | None = None,
    state: str = "live",
    state_reason: str = "",
    age_s: float = 754.0,
    main_cpu: float = 38.0,
) -> dict:
    return {
        "pid": pid,
        "cmdline": cmdline,
        "rank": rank,
        "local_rank": rank,
        "world_size": world_size,
        "torch_version": "2.13.0+cpu",
        "start_method": "fork",
        "main_cpu_percent": main_cpu,
        "loaders": loaders if loaders is not None else [],
        "state": state,
        "state_reason": state_reason,
        "run_id": run_id,
        "age_s": age_s,
        "main_thread_cpu_percent": main_cpu - 2,
        "threads": 14,
        "rss_bytes": 3 * GIB,
        "cuda_initialized": False,
    }


def gpu(
    index: int,
    *,
    util: float = 23.0,
    used: int = 9 * GIB,
    total: int = 80 * GIB,
    name: str = "NVIDIA H100 80GB HBM3",
) -> dict:
    return {
        "index": index,
        "name": name,
        "util_percent": util,
        "mem_used_bytes": used,
        "mem_total_bytes": total,
        "history": [round(util + (i % 7) * 3 - 9, 1) for i in range(60)],
        "mem_history": [round(used / total, 3)] * 60,
    }


def fake_gpus() -> list[dict]:
    return [gpu(0, util=23.0, used=9 * GIB), gpu(1, util=71.0, used=41 * GIB)]


def hint(
    hid: str,
    severity: str,
    message: str,
    suggestion: str,
    *,
    job_pid: int | None = 4242,
    loader_id: int | None = 0,
    **evidence,
) -> dict:
    return {
        "id": hid,
        "severity": severity,
        "job_pid": job_pid,
        "loader_id": loader_id,
        "message": message,
        "suggestion": suggestion,
        "evidence": evidence,
    }


def add_workers_hint(pid: int = 4242) -> dict:
    return hint(
        "add-workers",
        "warn",
        "data-bound: 62% of the loop waits for data; 4 workers make a batch every 45 ms, "
        "the loop eats one every 81 ms... ",
        "set num_workers=6 (each batch costs a worker 180 ms)",
        job_pid=pid,
        data_wait_fraction=0.62,
        worker_ms_per_batch=180.0,
        step_ms=81.2,
        recommended_num_workers=6,
    )


def persistent_hint(pid: int = 4242) -> dict:
    return hint(
        "enable-persistent-workers",
        "info",
        "each epoch starts with a 1.8 s stall while 4 workers are re-spawned",
        "pass persistent_workers=True to the DataLoader",
        job_pid=pid,
        epoch_start_ms=1840.0,
        epoch_ms=98000.0,
    )


def host(**over) -> dict:
    h = {
        "logical_cpus": 8,
        "usable_cores": 4.0,
        "cpu_percent": 51.5,
        "shm_free_bytes": 31 * GIB,
        "load_percent_of_usable": 103.0,
        "cores_reason": "cgroup v2 quota 4 cores",
        "affinity_cores": 8,
        "quota_cores": 4.0,
    }
    h.update(over)
    return h


def snapshot(
    jobs: list[dict],
    *,
    gpus: list[dict] | None = None,
    gpu_status: str | None = None,
    hints: list[dict] | None = None,
    time: float = T0,
) -> dict:
    if gpu_status is None:
        gpu_status = "ok" if gpus else NO_GPU_STATUS
    return {
        "schema_version": 1,
        "time": time,
        "window_s": 2.0,
        "host": host(),
        "gpu_status": gpu_status,
        "gpus": gpus or [],
        "jobs": jobs,
        "hints": hints or [],
    }


def four_workers(base_pid: int = 4300) -> list[dict]:
    return [
        worker(0, base_pid + 1, cpu=97.0, busy=0.98, fetch_ms=176.0, batches=310),
        worker(1, base_pid + 2, cpu=94.5, busy=0.96, fetch_ms=181.5, batches=305),
        worker(2, base_pid + 3, cpu=99.1, busy=0.99, fetch_ms=179.2, batches=309, uss=None),
        worker(3, base_pid + 4, cpu=88.0, busy=0.91, fetch_ms=190.4, batches=298, state="sleeping"),
    ]


def data_bound(*, with_gpu: bool = False, hints: bool = True) -> dict:
    """One data-bound job (62 % wait) with 4 workers."""
    j = job(4242, loaders=[loader(0, workers=four_workers())])
    return snapshot(
        [j],
        gpus=fake_gpus() if with_gpu else None,
        hints=[add_workers_hint(), persistent_hint()] if hints else [],
    )


def several_jobs(*, with_gpu: bool = True) -> dict:
    """Two ranks of one torchrun run, a single job, and an exited job."""
    ranks = [
        job(
            5001,
            cmdline="python -m torch.distributed.run --nproc-per-node 2 train_ddp.py",
            rank=0,
            world_size=2,
            run_id="a1b2c3",
            age_s=3600.0,
            loaders=[loader(0, workers=four_workers(5100), wait=0.40, bps=10.0, history_from=0.3)],
        ),
        job(
            5002,
            cmdline="python -m torch.distributed.run --nproc-per-node 2 train_ddp.py",
            rank=1,
            world_size=2,
            run_id="a1b2c3",
            age_s=3600.0,
            loaders=[loader(0, workers=four_workers(5200), wait=0.20, bps=11.0, history_from=0.2)],
        ),
    ]
    single = job(4242, loaders=[loader(0, workers=four_workers())])
    healthy = job(
        6001,
        cmdline="python finetune.py --config small.yaml",
        age_s=95.0,
        loaders=[
            loader(
                0,
                workers=[
                    worker(0, 6101, cpu=35.0, busy=0.4, fetch_ms=12.0),
                    worker(1, 6102, cpu=33.0, busy=0.38, fetch_ms=12.5),
                ],
                wait=0.03,
                bps=41.7,
                wait_ms=0.7,
                step_ms=24.0,
                history_from=0.05,
                queue={"ready": 4, "in_flight": 0, "capacity": 4},
            )
        ],
    )
    return snapshot(
        ranks + [single, healthy],
        gpus=fake_gpus() if with_gpu else None,
        hints=[
            add_workers_hint(),
            persistent_hint(),
            hint(
                "workers-oversubscribe-cores",
                "critical",
                "14 worker processes + 4 trainers on 4.0 usable cores",
                "lower num_workers so that all jobs together use ≤ 4 cores",
                job_pid=None,
                loader_id=None,
                workers=14,
                trainers=4,
                usable_cores=4.0,
            ),
        ],
    )


def with_exited(snap: dict, pid: int = 4242) -> dict:
    """``snap`` with job ``pid`` marked exited (last figures kept)."""
    snap = copy.deepcopy(snap)
    for j in snap["jobs"]:
        if j["pid"] == pid:
            j["state"] = "exited"
            j["state_reason"] = "exit code 0"
            for ld in j["loaders"]:
                ld["active"] = False
                for w in ld["workers"]:
                    w["state"] = "gone"
    return snap


def empty() -> dict:
    return snapshot([], gpus=None)


def malformed() -> dict:
    """Missing keys, None and wrong types where numbers and dicts are expected."""
    return {
        "schema_version": 1,
        "time": None,
        "host": {"usable_cores": None, "cpu_percent": "high"},
        "gpu_status": None,
        "gpus": [{"index": 0}, None, {"util_percent": None, "history": [None, 5, "x"]}],
        "jobs": [
            {"pid": 1, "loaders": None},
            {
                "pid": 2,
                "state": "live",
                "loaders": [
                    {
                        "id": 0,
                        "data_wait_fraction": None,
                        "queue": None,
                        "history": None,
                        "workers": [{"id": 0}, {"pid": None, "cpu_percent": "x"}, None],
                    },
                    {},
                    "not-a-loader",
                ],
            },
            {"cmdline": None, "rank": "0", "world_size": 2, "run_id": "r", "loaders": [{"workers": "none"}]},
            None,
            {
                "pid": 3,
                "rank": 1,
                "world_size": 2,
                "run_id": "r",
                "state": "exited",
                "loaders": [{"data_wait_fraction": float("nan"), "batches_per_s": float("inf")}],
            },
        ],
        "hints": [
            None,
            {"severity": "weird"},
            {"id": "x", "severity": "warn", "message": None, "evidence": [1, 2]},
        ],
    }


# ------------------------------------------------------------------ app helpers


def make_app(snapshots, *, interval: float = 0.5, advance: bool = False, clock_at: float = T0, **kwargs):
    """A DlwatchApp on a StaticSource with a fixed clock and time format, so
    that nothing on screen depends on the wall clock or the local timezone."""
    from dlwatch.tui.app import DlwatchApp
    from dlwatch.tui.sources import StaticSource

    source = snapshots if hasattr(snapshots, "latest") else StaticSource(list(snapshots), advance=advance)
    kwargs.setdefault("runtime_dir", "/run/user/1000/dlwatch")
    kwargs.setdefault("version", "0.1.0")
    return DlwatchApp(
        source, interval=interval, clock=lambda: clock_at, time_format=lambda t: "12:00:00", **kwargs
    )


def plain(widget) -> str:
    """The text a Static shows (its content as set by the app)."""
    return str(widget.content)


def row_text(table, key: str) -> list[str]:
    return [str(c) for c in table.get_row(key)]


def screen_lines(app) -> list[str]:
    """What the terminal shows, line by line (uses the compositor, a private
    Textual API, because there is no public one for "the text on screen")."""
    return [strip.text for strip in app.screen._compositor.render_strips()]
