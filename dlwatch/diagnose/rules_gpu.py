"""Rules that need GPU figures: enable-pin-memory, main-loop-cpu-bound.

enable-pin-memory weighs the copies: a WARN only when the batch's bytes
(read by the probe at each epoch's first batch) make a pageable copy a
large share of the loop's time per batch (docs/gpu.md).

Both stay silent without ``gpu_status == "ok"`` and a GPU that can be tied to
the job (``facts.job_gpu``: one GPU on the box, NVML's process list, or the
job's ``local_rank`` through its ``CUDA_VISIBLE_DEVICES`` naming a listed
index, counted in NVML's order): "the GPU is idle" must be measured, not
assumed.
"""

from __future__ import annotations

from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT

from .facts import Context, hint, num, pct, r, setting, window_note, window_phrase
from .registry import Rule

# Data wait that makes a pageable host-to-device copy worth fixing: the copy
# happens in the loop, so any material wait (the catalog's lower 5 %, docs/hints/index.md) counts.
PIN_MIN_WAIT = 0.05
# The pageable host-to-device copy is estimated, not timed (the probe does
# not see the copy): bytes per batch over this bandwidth. Pageable copies
# run at a fraction of a pinned copy's PCIe rate; ~10 GB/s is the upper end
# we know of on recent hosts (PCIe 4/5), so the estimate errs low and a WARN
# means the copy is large for certain.
PAGEABLE_H2D_BYTES_PER_S = 10e9
# WARN from this share of the loop's time per batch (wait + step): a copy
# that large costs the step measurably even where part of it overlaps; timm
# at batch 256 (38.5 MiB of uint8 a batch, ~4 ms) against 65 ms measured no
# gain from pin_memory beyond the run-to-run spread (934 vs 843 img/s) ...
PIN_WARN_SHARE = 0.20
# ... info from this share (or when the batch's bytes are not known); below
# it nothing: a 256-byte batch's copy cannot matter.
PIN_INFO_SHARE = 0.05
# GPU utilisation below this over the snapshot window is "under-used": under
# 80 % is worth a look, 50 % keeps the hint for clear cases.
GPU_UNDERUSED_UTIL = 50.0
# main-loop-cpu-bound: the loop must not be data-bound: under the wait where
# the worker hints start (DATA_BOUND_WAIT, 10 %), faster data could buy under
# 10 % (1 / (1 - wait)). It was 5 % until the H100 run of 2026-11-28: a
# 3-layer MLP at batch 1 (num_workers=0, so the wait is the loop's own loading)
# waited 6.7 % with its GPU 95 % idle and the host 93 % busy, and the live
# view named nothing ...
MAIN_LOW_WAIT = DATA_BOUND_WAIT
# ... while its Python thread is pegged: ≥ 80 % of one core, not 90 %: on an
# H100 the demo's launch-bound loop measured 86 % on its main
# thread (the rest is the batch hand-off and the GIL) with the GPU at 1 %.
MAIN_THREAD_PEGGED_PERCENT = 80.0


def pageable_copy_ms(batch_bytes: float) -> float:
    """Estimated time of one batch's host-to-device copy from pageable memory."""
    return batch_bytes / PAGEABLE_H2D_BYTES_PER_S * 1e3


def _pin_words(loader: dict[str, Any]) -> tuple[str, str]:
    """How the loader leaves its batches unpinned, and how to pin them, in
    its library's terms: a torchdata.nodes graph pins in a ``PinMemory``
    node (a thread beside the loop, as a DataLoader's pin thread), not with
    a DataLoader argument it does not have."""
    if loader.get("library") == "torchdata.nodes":
        return (
            "no PinMemory node in its graph",
            "add a PinMemory node over the batches (PinMemory(Batcher(...)), under the Prefetcher)",
        )
    return "pin_memory=False", f"set {setting(loader, 'pin_memory', True)}"


def rule_enable_pin_memory(ctx: Context) -> list[dict[str, Any]]:
    if not ctx.gpu_ok or not ctx.gpus:
        return []
    out = []
    for lv in ctx.loaders:
        if not lv.steady or lv.loader.get("pin_memory") is not False:
            continue
        if lv.job.get("cuda_initialized") is not True or lv.wait is None:
            continue
        util, gpu_name = ctx.gpu_util_for(lv.job)
        waits = lv.wait >= PIN_MIN_WAIT
        idle = util is not None and util < GPU_UNDERUSED_UTIL
        if not (waits or idle):
            continue
        bb = num(lv.loader.get("batch_bytes"))
        wait_ms, step_ms = num(lv.loader.get("wait_ms_mean")), num(lv.loader.get("step_ms_mean"))
        per_batch = (wait_ms or 0.0) + (step_ms or 0.0)
        copy_ms = pageable_copy_ms(bb) if bb is not None else None
        share = copy_ms / per_batch if copy_ms is not None and per_batch > 0 else None
        if share is not None and share < PIN_INFO_SHARE:
            continue  # the copies cannot matter: nothing to say
        severity = "warn" if share is not None and share >= PIN_WARN_SHARE else "info"
        reasons = []
        if waits:
            reasons.append(f"the loop waits for data {pct(lv.wait)} of the time{window_phrase(lv)}")
        if idle:
            reasons.append(f"{gpu_name} is only {util:.0f} % busy")
        if share is not None and copy_ms is not None and bb is not None:
            cost = (
                f"a batch is {bb / 2**20:.1f} MiB: about {copy_ms:.1f} ms to copy from pageable memory "
                f"(at ~{PAGEABLE_H2D_BYTES_PER_S / 1e9:.0f} GB/s), {pct(share)} of the "
                f"{per_batch:.1f} ms the loop spends per batch"
            )
        else:
            cost = "the batch size in bytes is not known here, so the copies' cost is not estimated"
        unpinned, pin = _pin_words(lv.loader)
        msg = (
            f"{lv.title} hands batches to CUDA from pageable memory ({unpinned}) while "
            f"{' and '.join(reasons)}; {cost}. A pageable .to('cuda') makes an extra CPU copy "
            f"and cannot overlap with compute."
        )
        sugg = f"{pin} and copy with .to(device, non_blocking=True)"
        ev = {
            "pin_memory": False,
            "cuda_initialized": True,
            "data_wait_fraction": r(lv.wait),
            "gpu": gpu_name or None,
            "gpu_util_percent": r(util, 1),
            "batch_bytes": None if bb is None else int(bb),
            "copy_ms_estimate": r(copy_ms, 2),
            "copy_share_of_batch_time": r(share),
        }
        out.append(hint("enable-pin-memory", severity, lv.pid, lv.lid, msg, sugg, ev))
    return out


def rule_main_loop_cpu_bound(ctx: Context) -> list[dict[str, Any]]:
    if not ctx.gpu_ok or not ctx.gpus:
        return []
    out = []
    for job in ctx.live_jobs:
        pid = int(job["pid"])
        if job.get("cuda_initialized") is not True:
            continue  # a CPU-only run has an idle GPU by design
        steady = [lv for lv in ctx.loaders_of(pid) if lv.steady and lv.wait is not None]
        waits = [lv.wait for lv in steady if lv.wait is not None]
        if not waits:
            continue
        wait = max(waits)
        if wait >= MAIN_LOW_WAIT:
            continue
        main_cpu = num(job.get("main_thread_cpu_percent"))
        # On CUDA the backward pass runs on autograd's device thread while the
        # training thread waits: a host-bound step keeps the two busy in turn.
        autograd = num(job.get("autograd_cpu_percent"))
        if main_cpu is None or main_cpu + (autograd or 0.0) < MAIN_THREAD_PEGGED_PERCENT:
            continue
        util, gpu_name = ctx.gpu_util_for(job)
        if util is None or util >= GPU_UNDERUSED_UTIL:
            continue
        msg = (
            f"PID {pid}: the loop waits for data only {pct(wait)} of the time{window_note(ctx)}, "
            f"yet {gpu_name} "
            f"is {util:.0f} % busy while {_host_words(main_cpu, autograd)}: "
            "the Python side cannot launch kernels fast enough."
        )
        sugg = (
            f"profile a few steps: `dlwatch profile --pid {pid}` (or P in the live view); then use "
            "larger batches, torch.compile, or CUDA graphs to cut per-kernel launch overhead"
        )
        ev = {
            "data_wait_fraction_max": r(wait),
            "main_thread_cpu_percent": r(main_cpu, 1),
            "autograd_cpu_percent": r(autograd, 1),
            "gpu": gpu_name,
            "gpu_util_percent": r(util, 1),
            "loaders": [lv.lid for lv in steady],
        }
        out.append(hint("main-loop-cpu-bound", "warn", pid, None, msg, sugg, ev))
    return out


RULES = (
    Rule("enable-pin-memory", rule_enable_pin_memory, "loader", rate=True),
    Rule("main-loop-cpu-bound", rule_main_loop_cpu_bound, "job", rate=True),
)


def _host_words(main_cpu: float, autograd: float | None) -> str:
    if autograd is None or autograd < 1.0:
        return f"the trainer's main thread uses {main_cpu:.0f} % of a core"
    return (
        f"the trainer's main thread and autograd's backward thread use {main_cpu + autograd:.0f} % "
        f"of a core between them ({main_cpu:.0f} + {autograd:.0f} %)"
    )
