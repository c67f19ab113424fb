"""The verdict on a profiler burst, and its summary document.

Pure: the job measures (``dlwatch.probe.profile_figures``), this decides
what the figures mean and what to do next. ``summary(pid, result, error)``
is the document ``dlwatch profile --json`` prints (docs/profiles.md);
``verdict(figures)`` the rule, table-tested; ``summary_lines`` the plain text
the CLI prints and the live view shows.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dlwatch.snapshot import as_dict, as_int, as_list, as_str, num, percent, records

SUMMARY_SCHEMA_VERSION = 1
VERDICTS = ("data-bound", "launch-bound", "dispatch-bound", "gpu-bound", "cpu-bound")

# data-bound: the loop waits inside next(loader) this share of its steps or
# more; the live view calls the same share BAD (> 30 %).
DATA_BOUND_WAIT = 0.30
# gpu-bound: the GPU is busy for all but this share of the profiled steps.
GPU_BUSY_IDLE_MAX = 0.20
# launch-bound: many short kernels per step ...
LAUNCH_MIN_KERNELS_PER_STEP = 200
SHORT_KERNEL_US = 50.0
# ... or the host spends this share of the step inside cudaLaunchKernel ...
LAUNCH_CPU_FRACTION = 0.25
# ... or few kernels, but short ones on a GPU idle most of the step, while
# the main thread is busy and its step is no more than the host cost of
# launching them: a 3-layer MLP at batch 1 on an H100 ran 29 kernels a step
# in 1.7 ms (59 µs of host time per kernel: Python, dispatch, autograd),
# GPU 96 % idle, main thread 100 % busy. A loop whose host does real work
# besides (a CPU transform in the step) spends far more per kernel.
LAUNCH_IDLE_MIN = 0.50
LAUNCH_HOST_US_PER_KERNEL = 250.0
# The main thread counts as busy from this share of one core (the rest of a
# launch-bound step is the GIL hand-off and the batch's arrival: the demo's
# launch-bound loop measured 86 % on an H100).
MAIN_THREAD_BUSY = 0.80
# The plain windows around the burst judge data wait only with this many
# steps (fewer: the profiled steps' own figure).
UNPROFILED_MIN_STEPS = 5
# dispatch-bound (no CUDA): hundreds of top-level operators per step whose
# mean cost is near torch's fixed per-op overhead (a few µs of dispatch and
# Python), so the overhead, not the arithmetic, is the step.
DISPATCH_MIN_OPS_PER_STEP = 500
DISPATCH_MAX_MEAN_OP_US = 20.0


def verdict(fig: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
    """(verdict, reason, suggestion) for a burst's figures; all None
    without steps."""
    steps = as_int(fig.get("steps")) or 0
    step_ms = num(fig.get("step_ms_mean"))
    if steps <= 0 or step_ms is None:
        return None, None, None
    ops = num(fig.get("ops_per_step"))
    mean_op = num(fig.get("mean_op_us"))
    op_ms = num(fig.get("op_ms_per_step"))
    top = records(fig.get("top_ops"))
    cuda = fig.get("cuda") if isinstance(fig.get("cuda"), dict) else None
    blind = ""
    if cuda is not None and num(cuda.get("kernels")) == 0 and not num(cuda.get("launches_per_step")):
        # Not one kernel and not one launch: either the loop ran no CUDA work
        # in these steps or CUPTI saw none (unavailable, or taken by another
        # profiler). "The GPU idles 100 %" would be a guess: judge the host.
        cuda = None
        blind = "; the profiler recorded no CUDA kernel or launch, so the GPU's side is not judged"
    per_step = f"over {steps} steps of {step_ms:.1f} ms"
    wait, main_cpu, autograd_cpu, plain = _loop_figures(fig)
    # The host's share: the training thread's, and on CUDA autograd's device
    # threads', which launch the backward pass while the training thread waits.
    host_cpu = main_cpu + autograd_cpu if main_cpu is not None and autograd_cpu is not None else main_cpu
    where = plain or per_step
    around = f" ({plain})" if plain else ""

    if wait >= DATA_BOUND_WAIT:
        pin = ", pin_memory=True" if cuda is not None else ""
        return (
            "data-bound",
            f"the loop waits inside next(DataLoader) {percent(wait)} of each step ({where}): "
            "the model gets no faster than its input",
            "fix the input pipeline first (see the live view's data hints): more DataLoader workers, "
            f"a cheaper __getitem__/collate{pin}; profiling the model helps only once the wait is small",
        )
    if cuda is not None:
        idle = num(cuda.get("gpu_idle_fraction"))
        kernels = num(cuda.get("kernels_per_step"))
        median = num(cuda.get("kernel_median_us"))
        launch = num(cuda.get("launch_cpu_fraction"))
        host_per_kernel = step_ms * 1e3 / kernels if kernels else None
        if idle is not None and idle <= GPU_BUSY_IDLE_MAX:
            return (
                "gpu-bound",
                f"the GPU is busy {percent(1 - idle)} of the profiled steps ({per_step}) and the loop waits "
                f"for data only {percent(wait)}{around}: the input pipeline and kernel launches keep up",
                "speed up the model on the GPU: bf16/AMP autocast, channels_last, torch.compile, "
                "fused optimizers; or accept it: this is the GPU's pace",
            )
        many_short = (
            kernels is not None
            and median is not None
            and kernels >= LAUNCH_MIN_KERNELS_PER_STEP
            and median <= SHORT_KERNEL_US
        )
        few_tiny = (
            idle is not None
            and idle >= LAUNCH_IDLE_MIN
            and median is not None
            and median <= SHORT_KERNEL_US
            and host_per_kernel is not None
            and host_per_kernel <= LAUNCH_HOST_US_PER_KERNEL
            and (host_cpu is None or host_cpu >= MAIN_THREAD_BUSY)
        )
        launching = launch is not None and launch >= LAUNCH_CPU_FRACTION
        if idle is not None and (many_short or launching or few_tiny):
            shape = (
                f"{kernels:.0f} kernel launches per step, median kernel {median:.1f} µs"
                if kernels is not None and median is not None
                else "kernel launches"
            )
            spent = (
                f"; cudaLaunchKernel takes {percent(launch)} of the step's CPU time"
                if launch is not None
                else ""
            )
            if host_cpu is not None and autograd_cpu is not None:
                spent += (
                    f"; the main thread and autograd's backward thread are {percent(host_cpu)} busy "
                    f"between them ({percent(autograd_cpu)} backward)"
                )
            elif main_cpu is not None:
                spent += f"; the main thread is {percent(main_cpu)} busy"
            return (
                "launch-bound",
                f"{shape}{spent}; the GPU idles {percent(idle)} of the step between them ({per_step}): "
                "the CPU cannot launch kernels as fast as the GPU runs them",
                "batch the work: larger batches, fuse small ops (torch.compile), or capture the step "
                'as CUDA graphs (torch.compile(mode="reduce-overhead"))',
            )
        if idle is not None:
            return (
                "cpu-bound",
                f"the GPU idles {percent(idle)} of the step ({per_step}) and the loop waits for data only "
                f"{percent(wait)}{around}; {_top_share(top, step_ms, steps)}",
                "the host side of the step is the bottleneck: move the named CPU work to the GPU or out "
                "of the step (preprocessing into the DataLoader workers, logging less often, no .item() "
                "per op)",
            )
    if (
        ops is not None
        and mean_op is not None
        and ops >= DISPATCH_MIN_OPS_PER_STEP
        and mean_op <= DISPATCH_MAX_MEAN_OP_US
    ):
        inside = f" ({percent(op_ms / step_ms)} of the step)" if op_ms is not None and step_ms > 0 else ""
        name = f"; most self time: {as_str(top[0].get('name'))}" if top else ""
        return (
            "dispatch-bound",
            f"{ops:.0f} torch operators per step at {mean_op:.1f} µs each{inside}{name} ({per_step}): "
            f"the fixed per-operator overhead, not the arithmetic, is the step{blind}",
            "batch the work: replace loops of small ops with whole-tensor ops, use larger batches, or "
            "torch.compile the step to fuse them",
        )
    return (
        "cpu-bound",
        f"the loop waits for data only {percent(wait)} ({where}); {_top_share(top, step_ms, steps)}"
        + (f" ({per_step})" if plain else "")
        + blind,
        "the model's own CPU compute is the step: give it the cores (torch.set_num_threads to the "
        "usable cores, fewer DataLoader workers competing), move it to a GPU, or optimise the top operator",
    )


def _loop_figures(fig: dict[str, Any]) -> tuple[float, float | None, float | None, str | None]:
    """(data wait, main thread's CPU share, autograd's device threads' CPU
    share, where they come from): the plain steps around the burst when there
    are enough of them (the last item says so), else the profiled steps
    (None), which the profiler slows: their wait share reads low."""
    plain = as_dict(fig.get("unprofiled"))
    n = as_int(plain.get("steps")) or 0
    wait = num(plain.get("data_wait_fraction"))
    if n >= UNPROFILED_MIN_STEPS and wait is not None:
        secs = num(plain.get("seconds"))
        span = f" over {secs:.1f} s" if secs is not None else ""
        return (
            wait,
            num(plain.get("main_thread_cpu_fraction")),
            num(plain.get("autograd_cpu_fraction")),
            f"{n} plain steps around the burst{span}",
        )
    return (
        num(fig.get("data_wait_fraction")) or 0.0,
        num(fig.get("main_thread_cpu_fraction")),
        num(fig.get("autograd_cpu_fraction")),
        None,
    )


def _top_share(top: list[dict[str, Any]], step_ms: float, steps: int) -> str:
    if not top:
        return "no torch operator stands out"
    name = as_str(top[0].get("name"), "?")
    ms = num(top[0].get("self_cpu_ms"))
    if ms is None or step_ms <= 0:
        return f"the top operator is {name}"
    return f"the top operator {name} takes {percent(ms / (step_ms * steps))} of the step time"


def summary(pid: int, result: dict[str, Any] | None, error: str | None) -> dict[str, Any]:
    """The ``dlwatch profile --json`` document (docs/profiles.md)."""
    fig = as_dict(result)
    v, reason, suggestion = verdict(fig) if not error else (None, None, None)
    cuda = fig.get("cuda") if isinstance(fig.get("cuda"), dict) else None
    return {
        "schema_version": SUMMARY_SCHEMA_VERSION,
        "pid": pid,
        "steps": as_int(fig.get("steps")) or 0,
        "steps_requested": as_int(fig.get("steps_requested")),
        "step_ms_mean": num(fig.get("step_ms_mean")),
        "data_wait_fraction": num(fig.get("data_wait_fraction")),
        "main_thread_cpu_fraction": num(fig.get("main_thread_cpu_fraction")),
        "autograd_cpu_fraction": num(fig.get("autograd_cpu_fraction")),
        "unprofiled": as_dict(fig.get("unprofiled")) or None,
        "verdict": v,
        "reason": reason,
        "suggestion": suggestion,
        "top_ops": [
            {
                "name": as_str(o.get("name")),
                "calls": as_int(o.get("calls")),
                "self_cpu_ms": num(o.get("self_cpu_ms")),
            }
            for o in records(fig.get("top_ops"))
        ],
        "cuda": cuda,
        "ops_per_step": num(fig.get("ops_per_step")),
        "mean_op_us": num(fig.get("mean_op_us")),
        "op_ms_per_step": num(fig.get("op_ms_per_step")),
        "events": as_int(fig.get("events")),
        "loader": as_dict(fig.get("loader")) or None,
        "loaders_followed": as_int(fig.get("loaders_followed")),
        "stop_note": fig.get("stop_note") if isinstance(fig.get("stop_note"), str) else None,
        "trace_path": fig.get("trace_path") if isinstance(fig.get("trace_path"), str) else None,
        "trace_bytes": as_int(fig.get("trace_bytes")),
        "trace_truncated": fig.get("trace_truncated") is True,
        "trace_note": fig.get("trace_note") if isinstance(fig.get("trace_note"), str) else None,
        "window_mono_ns": [as_int(x) for x in as_list(fig.get("window_mono_ns"))] or None,
        "done_mono_ns": as_int(fig.get("done_mono_ns")),
        "error": error,
    }


def summary_lines(doc: dict[str, Any]) -> list[str]:
    """The summary as plain lines (CLI output, the live view's panel)."""
    pid = doc.get("pid")
    if doc.get("error"):
        lines = [f"PID {pid}: profiler burst failed: {doc['error']}"]
    else:
        steps = as_int(doc.get("steps")) or 0
        step_ms = num(doc.get("step_ms_mean"))
        wait = num(doc.get("data_wait_fraction"))
        head = f"PID {pid}: {steps} steps profiled"
        if step_ms is not None:
            head += f", {step_ms:.1f} ms per step"
        if wait is not None:
            head += f", {percent(wait)} waiting for data"
        lines = [head]
        followed = as_int(doc.get("loaders_followed")) or 0
        if followed > 1:
            name = as_str(as_dict(doc.get("loader")).get("name")) or "the loop's loader"
            lines.append(
                f"followed the loop across {followed} DataLoaders it built in turn (the last: {name})"
            )
        plain = as_dict(doc.get("unprofiled"))
        if plain:
            pw, pms = num(plain.get("data_wait_fraction")), num(plain.get("step_ms_mean"))
            if pw is not None and pms is not None:
                lines.append(
                    f"without the profiler: {pms:.1f} ms per step, {percent(pw)} waiting for data "
                    f"({as_int(plain.get('steps')) or 0} plain steps around the burst)"
                )
        if doc.get("verdict"):
            lines.append(f"verdict: {doc['verdict']}: {doc.get('reason')}")
            lines.append(f"next step: {doc.get('suggestion')}")
        ops, mean_op = num(doc.get("ops_per_step")), num(doc.get("mean_op_us"))
        if ops is not None and mean_op is not None:
            lines.append(f"torch operators: {ops:.0f} per step, {mean_op:.1f} µs each on average")
        cuda = doc.get("cuda")
        if isinstance(cuda, dict):
            parts = []
            words: tuple[tuple[str, Callable[[float], str]], ...] = (
                ("kernels_per_step", lambda v: f"{v:.0f} kernels/step"),
                ("kernel_median_us", lambda v: f"median kernel {v:.1f} µs"),
                ("self_cuda_ms_total", lambda v: f"{v:.1f} ms CUDA in all"),
                ("launch_cpu_fraction", lambda v: f"cudaLaunchKernel {percent(v)} of CPU"),
                ("gpu_idle_fraction", lambda v: f"GPU idle {percent(v)}"),
            )
            for key, say in words:
                v = num(cuda.get(key))
                if v is not None:
                    parts.append(say(v))
            lines.append("CUDA: " + (", ".join(parts) if parts else "no kernels recorded"))
        top = records(doc.get("top_ops"))
        if top:
            lines.append("top operators by self CPU time:")
            for o in top[:8]:
                ms = num(o.get("self_cpu_ms"))
                lines.append(
                    f"  {ms if ms is not None else 0:>10.2f} ms  {as_int(o.get('calls')) or 0:>8} calls  "
                    f"{as_str(o.get('name'))[:70]}"
                )
        if doc.get("stop_note"):
            lines.append(f"note: {doc['stop_note']}")
    if doc.get("trace_path"):
        size = as_int(doc.get("trace_bytes"))
        extra = f", {size / 1e6:.1f} MB" if size is not None else ""
        extra += ", truncated to the size cap" if doc.get("trace_truncated") else ""
        lines.append(
            f"trace: {doc['trace_path']}{extra} (open in https://ui.perfetto.dev or chrome://tracing)"
        )
    if doc.get("trace_note"):
        lines.append(f"trace note: {doc['trace_note']}")
    return lines
