"""Pure arithmetic from a job's frames to the figures of a time window.

Frames carry cumulative counters stamped with the job's monotonic clock, so
any window is the difference of two frames. Nothing here does I/O or reads a
clock: the caller passes the frames and the samples.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from dlwatch import wire

NS = 1e9


def pick_base(frames: Sequence[dict[str, Any]], window_s: float, end: int | None = None) -> int:
    """Index of the frame that starts a window of ``window_s`` ending at frame
    ``end`` (default: the newest): the newest frame at least ``window_s``
    older, else the oldest."""
    if not frames:
        raise ValueError("no frames")
    e = len(frames) - 1 if end is None else end
    target = frames[e]["mono_ns"] - int(window_s * NS)
    # O(log n) reads of the stamps, not a list of every stamp on each call.
    i = bisect_left(frames, target, hi=e + 1, key=_stamp)
    if i <= e and frames[i]["mono_ns"] == target:
        return i
    return max(0, i - 1)


def _stamp(frame: dict[str, Any]) -> int:
    stamp: int = frame["mono_ns"]
    return stamp


def _loader_in(frame: dict[str, Any], loader_id: int) -> dict[str, Any] | None:
    ld: dict[str, Any]
    for ld in frame.get("loaders", ()):
        if ld.get("id") == loader_id:
            return ld
    return None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


# A rate figure covers at least this many completed batches as well as its
# time window (up to the frames held): a 2 s step in a 1 s window reads 0 or
# 100 % by turns, five of them read the same figure every time. Five: the
# window of a 2 s/step job is then 10 s, still short enough to see a change
# of regime within one screen of history.
MIN_WINDOW_BATCHES = 5


def _batch_key(loader_id: int) -> Callable[[dict[str, Any]], int]:
    def key(frame: dict[str, Any]) -> int:
        ld = _loader_in(frame, loader_id)
        return -1 if ld is None else ld["batches"]

    return key


def window_base(
    frames: Sequence[dict[str, Any]],
    loader_id: int,
    window_s: float,
    min_batches: int = 0,
    end: int | None = None,
) -> int:
    """Index of the frame that starts a loader's window ending at ``end``
    (default: the newest frame).

    The window covers at least ``window_s`` and ``min_batches`` completed
    batches, as far back as the frames go. When batches are slower than
    frames, its start is moved back to the same point of a batch cycle as its
    end (the same time after a batch was returned), so that it spans whole
    cycles of wait + step: a figure that does not saw-tooth with the phase.
    """
    e = len(frames) - 1 if end is None else end
    i = pick_base(frames, window_s, e)
    if min_batches <= 0:
        return i
    key = _batch_key(loader_id)
    b_end = key(frames[e])
    if b_end < 0:
        return i
    if b_end - max(0, key(frames[i])) < min_batches:
        # The newest frame with at most b_end - min_batches batches (counters
        # are cumulative: a binary search); none held: the oldest frame.
        j = bisect_right(frames, b_end - min_batches, hi=i + 1, key=key) - 1
        i = max(0, min(i, j))
    return _align_phase(frames, key, i, e)


def _align_phase(
    frames: Sequence[dict[str, Any]], key: Callable[[dict[str, Any]], int], i: int, e: int
) -> int:
    b_end = key(frames[e])
    if 2 * (b_end - key(frames[i])) > e - i:
        return i  # a batch every other frame or faster: the frames' own 0.1 s grid is finer
    first_of_end = bisect_left(frames, b_end, hi=e + 1, key=key)
    if first_of_end == 0:
        return i  # the newest batch is older than the frames: no phase to match
    phase = frames[e]["mono_ns"] - frames[first_of_end]["mono_ns"]
    b_i = key(frames[i])
    k0 = bisect_left(frames, b_i, hi=i + 1, key=key)
    if b_i < 0 or k0 == 0:
        return i
    target = frames[k0]["mono_ns"] + phase
    lo, hi = k0, i
    if target > frames[i]["mono_ns"]:
        # i sits earlier in its cycle than the end does: one cycle further back.
        k1 = bisect_left(frames, key(frames[k0 - 1]), hi=k0, key=key)
        if k1 == 0 or key(frames[k1]) < 0:
            return i
        target = frames[k1]["mono_ns"] + phase
        if target >= frames[k0]["mono_ns"]:
            return i  # the batch in progress is longer than a whole earlier cycle: a stall, no phase
        lo, hi = k1, k0 - 1
    j = bisect_left(frames, target, lo=lo, hi=hi + 1, key=_stamp)
    if j > lo and (j > hi or target - frames[j - 1]["mono_ns"] <= frames[j]["mono_ns"] - target):
        j -= 1
    return min(j, hi)


def _no_batch_reason(d_wait: int, d_step: int, dt: float, total: int, error: Any = None) -> str:
    what = "no batch yet" if total <= 0 else f"no batch completed in the last {dt:.0f} s"
    if isinstance(error, str) and error and d_wait == 0:
        # A QA run: a loader whose worker raised read "the loader is not
        # being iterated".
        return f"{what}: the loader raised {error[:160]}"
    if d_wait > 0 and d_step == 0:
        return what + ": the loop is waiting for data inside next()"
    if d_step > 0 and d_wait == 0:
        return what + ": the loop is busy outside the loader (a long step, validation, a checkpoint?)"
    if d_wait == 0 and d_step == 0:
        return what + ": the loader is not being iterated"
    return what


def loader_window(
    frames: Sequence[dict[str, Any]], loader_id: int, window_s: float, min_batches: int = MIN_WINDOW_BATCHES
) -> dict[str, Any] | None:
    """Rates and means of one loader over the last ``window_s`` seconds and at
    least ``min_batches`` batches (``window_base``).

    Returns None if the loader is not in the newest frame. A window without a
    completed batch has no data-wait fraction (None, and ``no_batch_reason``
    says why): its time is all in one phase, and 0 % there is no figure.
    """
    if not frames:
        return None
    new = _loader_in(frames[-1], loader_id)
    if new is None:
        return None
    i = window_base(frames, loader_id, window_s, min_batches)
    old = None
    # A loader created inside the window starts at its first frame.
    fed = "consumer" in new
    for j in range(i, len(frames) - 1):
        old = _loader_in(frames[j], loader_id)
        # The loop's side of a queue, once found, replaces the feeder's
        # counters in the main fields: a window starts on one side only.
        if old is not None and ("consumer" in old) == fed:
            i = j
            break
        old = None
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
        "window_batches": d_b,
        # The job's own monotonic clock: lets a caller line the window up with
        # timestamps taken inside the job.
        "start_mono_ns": t_old,
        "end_mono_ns": t_new,
        "batches_per_s": round(d_b / dt, 3) if dt > 0 else 0.0,
        "data_wait_fraction": _round(_ratio(d_wait, busy_total), 4) if d_b else None,
        "no_batch_reason": None
        if d_b
        else _no_batch_reason(d_wait, d_step, dt, new["batches"], new.get("last_error")),
        "wait_ms_mean": _round(_ratio(d_wait / 1e6, d_b), 3),
        "step_ms_mean": _round(_ratio(d_step / 1e6, d_b), 3),
        "epoch_first_batch_age_s": epoch_first_batch_age(frames, loader_id),
        "last_batch_age_s": last_batch_age(frames, loader_id),
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
    out.update(_sample_fractions(old, new))
    out["feeder"] = feeder_window(old.get("feeder"), new.get("feeder"), dt)
    out["next_cpu_ms_mean"] = next_cpu_mean(old, new)
    return out


# A window's mean of the loop thread's CPU in next() needs this many of the
# probe's readings (one batch in 16); a thinner window takes the run's mean.
MIN_NEXT_CPU_READINGS = 4


def next_cpu_mean(old: dict[str, Any], new: dict[str, Any]) -> float | None:
    """ms of the loop thread's CPU inside ``next()`` per batch: the handover
    of a batch from the workers, in series with the step. The cost hardly
    moves with time, so a window with few readings falls back to the run's."""
    c_new, n_new = new.get("next_cpu_ns"), new.get("next_cpu_batches")
    if not isinstance(c_new, int) or not isinstance(n_new, int) or n_new <= 0 or c_new < 0:
        return None
    c_old, n_old = old.get("next_cpu_ns"), old.get("next_cpu_batches")
    if isinstance(c_old, int) and isinstance(n_old, int):
        d_c, d_n = c_new - c_old, n_new - n_old
        if d_n >= MIN_NEXT_CPU_READINGS and d_c >= 0:
            return round(d_c / 1e6 / d_n, 3)
    return round(c_new / 1e6 / n_new, 3)


def feeder_window(old: Any, new: Any, dt: float) -> dict[str, Any] | None:
    """The feeder thread's own figures over the window (a loader whose
    batches reach the loop through a queue): how much of its time it waits
    in the loader's ``next()``, and how long it takes to hand a batch on."""
    if not isinstance(new, dict):
        return None
    if not isinstance(old, dict):
        old = {"wait_ns": 0, "step_ns": 0, "batches": 0}
    d_b = max(0, int(new.get("batches", 0)) - int(old.get("batches", 0)))
    d_wait = max(0, int(new.get("wait_ns", 0)) - int(old.get("wait_ns", 0)))
    d_step = max(0, int(new.get("step_ns", 0)) - int(old.get("step_ns", 0)))
    return {
        "thread": str(new.get("thread") or "?")[:80],
        "wait_fraction": _round(_ratio(d_wait, d_wait + d_step), 4) if d_b else None,
        "wait_ms_mean": _round(_ratio(d_wait / 1e6, d_b), 3),
        "handover_ms_mean": _round(_ratio(d_step / 1e6, d_b), 3),
        "batches_per_s": round(d_b / dt, 3) if dt > 0 else 0.0,
    }


def _sample_fractions(old: dict[str, Any], new: dict[str, Any]) -> dict[str, float | None]:
    """Of the probe's samples in the window (one a frame while an iterator is
    alive), the share that found the loop inside next() while later batches
    sat ready in the reorder buffer: head-of-line blocking, as a fraction of
    the loop's time."""
    keys = ("samples", "hol_samples")
    d = {k: max(0, int(new.get(k) or 0) - int(old.get(k) or 0)) for k in keys}
    if "samples" not in new or not d["samples"]:
        return {"head_of_line_fraction": None}
    return {"head_of_line_fraction": round(d["hol_samples"] / d["samples"], 4)}


def hist_percentiles(
    new: Sequence[Any] | None, old: Sequence[Any] | None, qs: Sequence[float] = (0.5, 0.95, 0.99)
) -> list[float | None]:
    """Percentiles (ms) of the fetch times counted between two cumulative
    histograms (``wire.fetch_hist``: [[bucket, count], ...]), interpolated
    geometrically inside a bucket. None where no fetch was counted."""
    counts: dict[int, int] = {}
    for sign, hist in ((1, new), (-1, old)):
        for pair in hist or ():
            try:
                k, c = int(pair[0]), int(pair[1])
            except (TypeError, ValueError, IndexError):
                continue
            if 0 <= k < wire.FETCH_HIST_BUCKETS:
                counts[k] = counts.get(k, 0) + sign * c
    items = sorted((k, c) for k, c in counts.items() if c > 0)
    total = sum(c for _, c in items)
    if not total:
        return [None for _ in qs]
    out: list[float | None] = []
    for q in qs:
        want = q * total
        seen = 0
        for k, c in items:
            if seen + c >= want:
                lo, hi = wire.fetch_hist_bounds_ms(k)
                out.append(round(lo * (hi / lo) ** ((want - seen) / c), 3))
                break
            seen += c
    return out


def epoch_first_batch_age(frames: Sequence[dict[str, Any]], loader_id: int) -> float | None:
    """Seconds from the current epoch's first batch to the newest frame: how
    far a window may reach back before it holds the epoch's start-up stall.
    An epoch that began before the oldest frame held: the frames' span (a
    lower bound). None: the epoch has no batch yet."""
    new = _loader_in(frames[-1], loader_id)
    if new is None:
        return None

    def epoch(frame: dict[str, Any]) -> int:
        ld = _loader_in(frame, loader_id)
        return -1 if ld is None else ld.get("epoch", 0)

    t_new = _stamp(frames[-1])
    k = bisect_left(frames, new.get("epoch", 0), key=epoch)
    if k == 0:
        return round((t_new - _stamp(frames[0])) / NS, 3)
    before = max(0, _batch_key(loader_id)(frames[k - 1]))
    first = bisect_right(frames, before, lo=k, key=_batch_key(loader_id))
    if first >= len(frames):
        return None
    return round((t_new - _stamp(frames[first])) / NS, 3)


def last_batch_age(frames: Sequence[dict[str, Any]], loader_id: int) -> float | None:
    """Seconds from the loader's newest batch to the newest frame (a frame's
    spacing is the precision); a batch older than the frames held: their
    span (a lower bound). None: no batch yet. A loader the loop set aside
    with its epoch open (Lightning's sanity check stops after 2 batches)
    grows old here while the loop takes from another."""
    new = _loader_in(frames[-1], loader_id)
    if new is None or new.get("batches", 0) <= 0:
        return None
    first = bisect_left(frames, new["batches"], key=_batch_key(loader_id))
    return round((_stamp(frames[-1]) - _stamp(frames[first])) / NS, 3)


def worker_window(
    frames: Sequence[dict[str, Any]], base: int, loader_id: int, w_new: dict[str, Any]
) -> dict[str, Any]:
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
        "first_batch_digest": w_new.get("first_batch_digest"),
        "second_batch_digest": w_new.get("second_batch_digest"),
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
        _tail(out, w_new.get("fetch_hist"), None)
        return out
    _tail(out, w_new.get("fetch_hist"), w_old.get("fetch_hist"))
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


# The fetch-time tail of a worker in the window: fewer fetches than this and
# the lifetime histogram speaks instead (a p99 of 10 fetches is their maximum).
TAIL_MIN_FETCHES = 50


def _tail(out: dict[str, Any], new: Sequence[Any] | None, old: Sequence[Any] | None) -> None:
    """fetch_ms_p50/p95/p99 of a worker, over the window where it holds
    enough fetches, else over the worker's life."""
    if new is None:
        return
    base = old
    n = sum(int(p[1]) for p in new if isinstance(p, list) and len(p) == 2) - sum(
        int(p[1]) for p in (old or ()) if isinstance(p, list) and len(p) == 2
    )
    if n < TAIL_MIN_FETCHES:
        base = None
    out["fetch_ms_p50"], out["fetch_ms_p95"], out["fetch_ms_p99"] = hist_percentiles(new, base)


def queue_means(frames: Sequence[dict[str, Any]], loader_id: int) -> dict[str, float | None]:
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
    frames: Sequence[dict[str, Any]],
    loader_id: int,
    step_s: float = 1.0,
    max_points: int = 120,
    min_batches: int = MIN_WINDOW_BATCHES,
) -> dict[str, list[Any]]:
    """Per-``step_s`` history of data-wait fraction and batch rate, oldest
    first. Each point is the figure of a window ending there that covers at
    least ``step_s`` and ``min_batches`` batches (``window_base``), like the
    live figure: a slow job's history does not alternate 0 and 100 %, and a
    point without a completed batch has no data-wait fraction (None)."""
    out: dict[str, list[Any]] = {"t": [], "data_wait_fraction": [], "batches_per_s": []}
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
        lb = _loader_in(frames[b], loader_id)
        if lb is None:
            continue
        la = _loader_in(frames[a], loader_id) or {"batches": 0, "wait_ns": 0, "step_ns": 0}
        base = a
        if lb["batches"] - la["batches"] < min_batches:
            span = (stamps[b] - stamps[a]) / NS
            base = min(a, window_base(frames, loader_id, span, min_batches, end=b))
            la = _loader_in(frames[base], loader_id) or {"batches": 0, "wait_ns": 0, "step_ns": 0}
        fa = frames[base]
        dt = (frames[b]["mono_ns"] - fa["mono_ns"]) / NS
        if dt <= 0:
            continue
        d_b = max(0, lb["batches"] - la["batches"])
        d_wait = max(0, lb["wait_ns"] - la["wait_ns"])
        d_step = max(0, lb["step_ns"] - la["step_ns"])
        out["t"].append(frames[b]["t"])
        out["data_wait_fraction"].append(_round(_ratio(d_wait, d_wait + d_step), 4) if d_b else None)
        out["batches_per_s"].append(round(d_b / dt, 3))
    return out


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
