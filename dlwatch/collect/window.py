"""Pure arithmetic from a job's frames to the figures of a time window.

Frames carry cumulative counters stamped with the job's monotonic clock, so
any window is the difference of two frames. Nothing here does I/O or reads a
clock: the caller passes the frames and the samples.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

NS = 1e9


def pick_base(frames: Sequence[dict], window_s: float) -> int:
    """Index of the frame that starts a window of ``window_s`` ending at the
    newest frame: the newest frame at least ``window_s`` older, else the oldest."""
    if not frames:
        raise ValueError("no frames")
    target = frames[-1]["mono_ns"] - int(window_s * NS)
    # O(log n) reads of the stamps, not a list of every stamp on each call.
    n = len(frames)
    i = bisect_left(frames, target, key=_stamp)
    if i < n and frames[i]["mono_ns"] == target:
        return i
    return max(0, i - 1)


def _stamp(frame: dict) -> int:
    return frame["mono_ns"]


def _loader_in(frame: dict, loader_id: int) -> dict | None:
    for ld in frame.get("loaders", ()):
        if ld.get("id") == loader_id:
            return ld
    return None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def loader_window(frames: Sequence[dict], loader_id: int, window_s: float) -> dict[str, Any] | None:
    """Rates and means of one loader over the last ``window_s`` seconds.

    Returns None if the loader is not in the newest frame.
    """
    if not frames:
        return None
    new = _loader_in(frames[-1], loader_id)
    if new is None:
        return None
    i = pick_base(frames, window_s)
    old = None
    # A loader created inside the window starts at its first frame.
    for j in range(i, len(frames) - 1):
        old = _loader_in(frames[j], loader_id)
        if old is not None:
            i = j
            break
    t_new = frames[-1]["mono_ns"]
    t_old = frames[i]["mono_ns"] if old is not None else t_new
    dt = (t_new - t_old) / NS
    if old is None:
        old = {"batches": 0, "wait_ns": 0, "step_ns": 0, "workers": []}
    d_b = max(0, new["batches"] - old["batches"])
    d_wait = max(0, new["wait_ns"] - old["wait_ns"])
    d_step = max(0, new["step_ns"] - old["step_ns"])
    busy_total = d_wait + d_step
    out: dict[str, Any] = {
        "window_s": round(dt, 3),
        # The job's own monotonic clock: lets a caller line the window up with
        # timestamps taken inside the job.
        "start_mono_ns": t_old,
        "end_mono_ns": t_new,
        "batches_per_s": round(d_b / dt, 3) if dt > 0 else 0.0,
        "data_wait_fraction": _round(_ratio(d_wait, busy_total), 4),
        "wait_ms_mean": _round(_ratio(d_wait / 1e6, d_b), 3),
        "step_ms_mean": _round(_ratio(d_step / 1e6, d_b), 3),
    }
    out["workers"] = [worker_window(frames, i, loader_id, w) for w in new.get("workers", ())]
    fetch = [
        (w["fetch_ms_mean"], w["window_batches"])
        for w in out["workers"]
        if w["fetch_ms_mean"] is not None and w["window_batches"] > 0
    ]
    n = sum(b for _, b in fetch)
    out["worker_ms_per_batch"] = round(sum(m * b for m, b in fetch) / n, 3) if n else None
    out["queue_mean"] = queue_means(frames[i:], loader_id)
    return out


def worker_window(frames: Sequence[dict], base: int, loader_id: int, w_new: dict) -> dict[str, Any]:
    """Busy fraction and fetch time of one worker, matched by PID across frames
    (non-persistent loaders get new worker processes every epoch)."""
    pid = w_new.get("pid")
    w_old = None
    t_old = None
    for j in range(base, len(frames) - 1):
        ld = _loader_in(frames[j], loader_id)
        if ld is None:
            continue
        for w in ld.get("workers", ()):
            if w.get("pid") == pid and w.get("id") == w_new.get("id"):
                w_old, t_old = w, frames[j]["mono_ns"]
                break
        if w_old is not None:
            break
    t_new = frames[-1]["mono_ns"]
    out = {
        "id": w_new["id"],
        "pid": pid,
        "batches": w_new["batches"],
        "busy_fraction": None,
        "fetch_ms_mean": None,
        "window_batches": 0,
    }
    if w_old is None or t_old is None or t_new <= t_old:
        # Only one sighting: fall back to lifetime means since the worker started.
        started = w_new.get("started_ns") or 0
        if w_new["batches"] > 0:
            out["fetch_ms_mean"] = round(w_new["fetch_ns"] / w_new["batches"] / 1e6, 3)
        if started and t_new > started:
            out["busy_fraction"] = round(min(1.0, w_new["busy_ns"] / (t_new - started)), 4)
        return out
    d_b = max(0, w_new["batches"] - w_old["batches"])
    d_fetch = max(0, w_new["fetch_ns"] - w_old["fetch_ns"])
    d_busy = max(0, w_new["busy_ns"] - w_old["busy_ns"])
    out["window_batches"] = d_b
    out["busy_fraction"] = round(min(1.0, d_busy / (t_new - t_old)), 4)
    if d_b > 0:
        out["fetch_ms_mean"] = round(d_fetch / d_b / 1e6, 3)
    elif w_new["batches"] > 0:
        out["fetch_ms_mean"] = round(w_new["fetch_ns"] / w_new["batches"] / 1e6, 3)
    return out


def queue_means(frames: Sequence[dict], loader_id: int) -> dict[str, float | None]:
    sums = {"ready": [0.0, 0], "in_flight": [0.0, 0]}
    for f in frames:
        ld = _loader_in(f, loader_id)
        if ld is None:
            continue
        q = ld.get("queue") or {}
        for k in sums:
            v = q.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                sums[k][0] += v
                sums[k][1] += 1
    return {k: (round(s / n, 3) if n else None) for k, (s, n) in sums.items()}


def series(
    frames: Sequence[dict], loader_id: int, step_s: float = 1.0, max_points: int = 120
) -> dict[str, list]:
    """Per-``step_s`` history of data-wait fraction and batch rate, oldest first."""
    out: dict[str, list] = {"t": [], "data_wait_fraction": [], "batches_per_s": []}
    if len(frames) < 2:
        return out
    step = int(step_s * NS)
    stamps = [f["mono_ns"] for f in frames]
    # Newest frame at or before each step boundary, walking back from the end.
    marks: list[int] = []
    t = stamps[-1]
    while t >= stamps[0] and len(marks) <= max_points:
        j = bisect_right(stamps, t) - 1
        if not marks or j != marks[-1]:
            marks.append(j)
        # Jump straight below frame j, staying on the step grid: the loop
        # costs one pass per frame, however far apart the stamps are.
        t -= step * ((t - stamps[j]) // step + 1)
    marks.reverse()
    for a, b in zip(marks, marks[1:]):
        fa, fb = frames[a], frames[b]
        la, lb = _loader_in(fa, loader_id), _loader_in(fb, loader_id)
        if lb is None:
            continue
        if la is None:
            la = {"batches": 0, "wait_ns": 0, "step_ns": 0}
        dt = (fb["mono_ns"] - fa["mono_ns"]) / NS
        if dt <= 0:
            continue
        d_wait = max(0, lb["wait_ns"] - la["wait_ns"])
        d_step = max(0, lb["step_ns"] - la["step_ns"])
        out["t"].append(fb["t"])
        out["data_wait_fraction"].append(_round(_ratio(d_wait, d_wait + d_step), 4))
        out["batches_per_s"].append(round(max(0, lb["batches"] - la["batches"]) / dt, 3))
    return out


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
