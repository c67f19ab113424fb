"""The figures of a profiler burst, from the profiler's raw event rows.

Pure and stdlib-only: the burst (``profiler.py``) turns Kineto's events into
plain rows ``(name, category, start_ns, end_ns, thread)`` and this module
reduces them to the numbers a verdict needs. Tests feed it recorded or
hand-made rows, CUDA rows included, so every path runs without a GPU.

We read Kineto's rows directly rather than ``prof.key_averages()``: building
torch's ``FunctionEvent`` tree costs ~100 µs of Python per event (seconds for
a burst of tiny ops, all of it holding the GIL the training thread needs);
this pass costs ~1 µs per event.
"""

from __future__ import annotations

from collections import defaultdict

# Kineto activity types (``KinetoEvent.activity_type()``).
CPU_OP = "cpu_op"
ANNOTATION = "user_annotation"
RUNTIME = ("cuda_runtime", "cuda_driver")
DEVICE = ("kernel", "gpu_memcpy", "gpu_memset")
KERNEL = "kernel"
# The host calls that enqueue a kernel: what a launch-bound loop spends its CPU on.
# Prefixes: Kineto also names cudaLaunchKernelExC, cudaLaunchKernel_ptsz (per-
# thread default stream builds), cudaLaunchCooperativeKernel and cuLaunchKernelEx.
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaLaunchCooperativeKernel", "cuLaunchKernel")
# Annotations that mark our steps; not operators, so never in top_ops.
STEP_PREFIX = "ProfilerStep#"
TOP_OPS = 10
MAX_NAME_CHARS = 160

Row = tuple  # (name: str, category: str, start_ns: int, end_ns: int, thread: int)


def summarize(rows: list[Row], step_ns: list[int], wait_ns: int, cuda: bool) -> dict:
    """The burst's figures. ``step_ns``: each profiled step's wall time and
    ``wait_ns``: the time inside the DataLoader's ``__next__`` during them,
    both measured by the burst's own clock around the loader's ``__next__``;
    ``cuda``: whether CUDA activity was recorded (then ``cuda`` is an object
    even when no kernel ran)."""
    steps = len(step_ns)
    total_ns = sum(step_ns)
    train_tid, window = _training_thread(rows)
    self_ns, calls, top_count, top_ns = _self_times(rows, train_tid)
    top = sorted(self_ns.items(), key=lambda kv: -kv[1])[:TOP_OPS]
    out: dict = {
        "steps": steps,
        "step_ms": [round(s / 1e6, 3) for s in step_ns],
        "step_ms_mean": round(total_ns / steps / 1e6, 3) if steps else None,
        "data_wait_fraction": round(wait_ns / total_ns, 4) if total_ns > 0 else None,
        "events": len(rows),
        "ops_per_step": round(top_count / steps, 1) if steps else None,
        "op_ms_per_step": round(top_ns / steps / 1e6, 3) if steps else None,
        "mean_op_us": round(top_ns / top_count / 1e3, 2) if top_count else None,
        "top_ops": [
            {"name": name[:MAX_NAME_CHARS], "calls": calls[name], "self_cpu_ms": round(ns / 1e6, 3)}
            for name, ns in top
        ],
        "cuda": _cuda(rows, steps, total_ns, window) if cuda else None,
    }
    return out


def _training_thread(rows: list[Row]) -> tuple[int | None, tuple[int, int] | None]:
    """The thread that ran the steps (where the step annotations are) and
    the span of the steps on the events' clock."""
    spans = [(r[2], r[3], r[4]) for r in rows if r[1] == ANNOTATION and r[0].startswith(STEP_PREFIX)]
    if spans:
        return spans[0][2], (min(s for s, _, _ in spans), max(e for _, e, _ in spans))
    ops = [r for r in rows if r[1] == CPU_OP]
    if not ops:
        return None, None
    counts: dict[int, int] = defaultdict(int)
    for r in ops:
        counts[r[4]] += 1
    tid = max(counts, key=counts.__getitem__)
    return tid, (min(r[2] for r in rows), max(r[3] for r in rows))


def _self_times(rows: list[Row], train_tid: int | None):
    """Self CPU time and calls per name over all host threads, and the
    operators at the top of the training thread's stack (an op called by an
    op is part of its parent's cost, not one more op the loop dispatched)."""
    self_ns: dict[str, int] = defaultdict(int)
    calls: dict[str, int] = defaultdict(int)
    top_count = top_ns = 0
    by_thread: dict[int, list[Row]] = defaultdict(list)
    for r in rows:
        if r[1] == CPU_OP or r[1] == ANNOTATION or r[1] in RUNTIME:
            by_thread[r[4]].append(r)
    for tid, trows in by_thread.items():
        trows.sort(key=lambda r: (r[2], -r[3]))
        # The stack of open events: [end_ns, index into trows, child_ns, is_op]
        stack: list[list] = []
        ops_open = 0
        child = [0] * len(trows)
        for i, (_name, cat, start, end, _t) in enumerate(trows):
            while stack and stack[-1][0] <= start:
                ops_open -= stack.pop()[2]
            dur = max(0, end - start)
            if stack and end <= stack[-1][0]:
                child[stack[-1][1]] += dur
            else:
                stack.clear()  # not nested (async or clipped): start a fresh stack
                ops_open = 0
            is_op = cat == CPU_OP
            if is_op and ops_open == 0 and tid == train_tid:
                top_count += 1
                top_ns += dur
            stack.append([end, i, 1 if is_op else 0])
            ops_open += 1 if is_op else 0
        for i, (name, cat, start, end, _t) in enumerate(trows):
            if cat == ANNOTATION and name.startswith(STEP_PREFIX):
                continue
            self_ns[name] += max(0, end - start - child[i])
            calls[name] += 1
    return self_ns, calls, top_count, top_ns


def _cuda(rows: list[Row], steps: int, total_ns: int, window: tuple[int, int] | None) -> dict:
    kernels = [r[3] - r[2] for r in rows if r[1] == KERNEL]
    device = sorted((r[2], r[3]) for r in rows if r[1] in DEVICE)
    launches = [r[3] - r[2] for r in rows if r[1] in RUNTIME and r[0].startswith(LAUNCH_CALLS)]
    device_ns = sum(e - s for s, e in device)
    idle = None
    if window is not None and window[1] > window[0]:
        busy = _union_within(device, window)
        idle = round(1.0 - busy / (window[1] - window[0]), 4)
    return {
        "kernels": len(kernels),
        "kernels_per_step": round(len(kernels) / steps, 1) if steps else None,
        "kernel_median_us": round(_median(kernels) / 1e3, 2) if kernels else None,
        "self_cuda_ms_total": round(device_ns / 1e6, 3),
        "launches_per_step": round(len(launches) / steps, 1) if steps else None,
        "launch_cpu_fraction": round(sum(launches) / total_ns, 4) if total_ns > 0 else None,
        "gpu_idle_fraction": idle,
    }


def _union_within(intervals: list[tuple[int, int]], window: tuple[int, int]) -> int:
    """Length of the union of sorted intervals, clipped to ``window``."""
    lo, hi = window
    busy = 0
    cur_s, cur_e = 0, None
    for s, e in intervals:
        s, e = max(s, lo), min(e, hi)
        if e <= s:
            continue
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        busy += cur_e - cur_s
    return busy


def _median(values: list[int]) -> float:
    v = sorted(values)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def unprofiled(windows: list[dict], in_flight: int) -> dict | None:
    """The loop's own figures over the plain windows before and after the
    burst (each ``{"steps", "wall_ns", "wait_ns", "cpu_ns"}``): what the
    verdict judges data wait and the main thread's CPU by, since the
    profiler slows the steps it records. None when neither window has a step."""
    used = [w for w in windows if w.get("steps") and w.get("wall_ns")]
    if not used:
        return None
    steps = sum(w["steps"] for w in used)
    wall = sum(w["wall_ns"] for w in used)
    wait = sum(w["wait_ns"] for w in used)
    cpu_known = [w for w in used if w.get("cpu_ns") is not None]
    cpu_wall = sum(w["wall_ns"] for w in cpu_known)
    # autograd's device threads, read over the same windows as the training thread
    ag_known = [w for w in cpu_known if w.get("autograd_cpu_ns") is not None]
    ag_wall = sum(w["wall_ns"] for w in ag_known)
    return {
        "steps": steps,
        "seconds": round(wall / 1e9, 3),
        "step_ms_mean": round(wall / steps / 1e6, 3),
        "data_wait_fraction": round(wait / wall, 4),
        "main_thread_cpu_fraction": round(sum(w["cpu_ns"] for w in cpu_known) / cpu_wall, 4)
        if cpu_wall > 0
        else None,
        "autograd_cpu_fraction": round(sum(w["autograd_cpu_ns"] for w in ag_known) / ag_wall, 4)
        if ag_wall > 0
        else None,
        "batches_in_flight": in_flight,
        "windows": len(used),
    }
