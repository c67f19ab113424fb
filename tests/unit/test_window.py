"""Pure window arithmetic over synthetic frame lists (no I/O, no clock)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dlwatch.collect.window import loader_window, pick_base, queue_means, series, worker_window

T0 = 5_000_000_000_000  # the job's monotonic clock at the first frame
DT = 100_000_000  # 100 ms between frames
MS = 1_000_000


def frame(i: int, loaders: list, dt: int = DT) -> dict:
    return {
        "type": "window",
        "seq": i + 1,
        "t": 1000.0 + i * dt / 1e9,
        "mono_ns": T0 + i * dt,
        "loaders": loaders,
    }


def loader(lid: int, batches: int, wait_ns: int, step_ns: int, workers=(), queue=None) -> dict:
    return {
        "id": lid,
        "epoch": 1,
        "batches": batches,
        "wait_ns": wait_ns,
        "step_ns": step_ns,
        "num_workers": len(workers),
        "workers": list(workers),
        "queue": queue or {"ready": None, "in_flight": None, "capacity": None},
    }


def worker(wid: int, pid: int, batches: int, fetch_ns: int, busy_ns: int, started_ns: int = 0) -> dict:
    return {
        "id": wid,
        "pid": pid,
        "batches": batches,
        "fetch_ns": fetch_ns,
        "busy_ns": busy_ns,
        "started_ns": started_ns,
    }


def steady(
    n: int, *, per_frame_batches=2, wait=30 * MS, step=70 * MS, with_workers=False, queue=None
) -> list[dict]:
    """n frames of a job that, every 100 ms, takes 2 batches, waits 30 ms and works 70 ms.

    Workers (when asked): w0 busy 80 ms per 100 ms fetching 1 batch of 40 ms... see below.
    """
    out = []
    for i in range(n):
        ws = ()
        if with_workers:
            ws = (
                # worker 0: 1 batch / 100 ms, 40 ms fetch each, busy 80 ms / 100 ms
                worker(0, 101, i, 40 * MS * i, 80 * MS * i),
                # worker 1: 1 batch / 100 ms, 10 ms fetch each, busy 50 ms / 100 ms
                worker(1, 102, i, 10 * MS * i, 50 * MS * i),
            )
        out.append(frame(i, [loader(0, per_frame_batches * i, wait * i, step * i, ws, queue)]))
    return out


# --- pick_base ------------------------------------------------------------------------


def test_pick_base_boundaries():
    frames = [frame(i, []) for i in range(51)]  # 0 .. 5.0 s
    last = len(frames) - 1
    assert pick_base(frames, 0) == last
    assert pick_base(frames, 0.1) == last - 1  # exactly one step older
    assert pick_base(frames, 0.05) == last - 1  # the newest frame at least 50 ms older
    assert pick_base(frames, 0.15) == last - 2
    assert pick_base(frames, 1.0) == last - 10
    assert pick_base(frames, 2.0) == last - 20
    assert pick_base(frames, 5.0) == 0  # exactly the whole span
    assert pick_base(frames, 60.0) == 0  # longer than the history: the oldest
    assert pick_base(frames[:1], 3.0) == 0


def test_pick_base_irregular_stamps():
    stamps = [0, 10, 400, 450, 1000]  # ms
    frames = [{"mono_ns": s * MS, "loaders": []} for s in stamps]
    assert pick_base(frames, 0.5) == 3  # target 500 ms: the newest frame at or before it is 450
    assert pick_base(frames, 0.55) == 3  # 450 is exactly 550 ms older
    assert pick_base(frames, 0.56) == 2
    assert pick_base(frames, 0.991) == 0
    assert pick_base(frames, 0.990) == 1


def test_pick_base_empty():
    with pytest.raises(ValueError):
        pick_base([], 1.0)


# --- loader_window ----------------------------------------------------------------------


def test_loader_window_exact_figures():
    frames = steady(51)
    w = loader_window(frames, 0, 2.0)
    assert w["window_s"] == 2.0
    assert w["start_mono_ns"] == frames[30]["mono_ns"]
    assert w["end_mono_ns"] == frames[50]["mono_ns"]
    assert w["batches_per_s"] == 20.0
    assert w["data_wait_fraction"] == 0.3
    assert w["wait_ms_mean"] == 15.0
    assert w["step_ms_mean"] == 35.0
    assert w["workers"] == []
    assert w["worker_ms_per_batch"] is None
    assert w["queue_mean"] == {"ready": None, "in_flight": None}


def test_loader_window_not_aligned_to_frames():
    frames = steady(51, wait=10 * MS, step=90 * MS)
    w = loader_window(frames, 0, 2.05)  # base: the frame 2.1 s older
    assert w["window_s"] == 2.1
    assert w["batches_per_s"] == 20.0
    assert w["data_wait_fraction"] == 0.1


def test_loader_window_longer_than_history_uses_the_oldest_frame():
    frames = steady(11)
    w = loader_window(frames, 0, 30.0)
    assert w["window_s"] == 1.0
    assert w["batches_per_s"] == 20.0


def test_loader_window_sees_a_change_of_regime():
    # 3 s of a healthy loop, then 2 s in which it waits 90 ms of every 100 ms.
    frames = []
    b = wait = step = 0
    for i in range(51):
        frames.append(frame(i, [loader(0, b, wait, step)]))
        if i < 30:
            b, wait, step = b + 2, wait + 5 * MS, step + 95 * MS
        else:
            b, wait, step = b + 1, wait + 90 * MS, step + 10 * MS
    w = loader_window(frames, 0, 2.0)
    assert w["data_wait_fraction"] == 0.9
    assert w["batches_per_s"] == 10.0
    assert w["wait_ms_mean"] == 90.0
    w5 = loader_window(frames, 0, 5.0)
    assert w5["data_wait_fraction"] == round((30 * 5 + 20 * 90) / 5000, 4)


def test_idle_loader_has_no_fraction_rather_than_a_guess():
    frames = [frame(i, [loader(0, 100, 7 * MS, 9 * MS)]) for i in range(20)]
    w = loader_window(frames, 0, 1.0)
    assert w["batches_per_s"] == 0.0
    assert w["data_wait_fraction"] is None
    assert w["wait_ms_mean"] is None and w["step_ms_mean"] is None


def test_workers_busy_fraction_and_fetch_time():
    frames = steady(51, with_workers=True)
    w = loader_window(frames, 0, 2.0)
    by_id = {x["id"]: x for x in w["workers"]}
    assert by_id[0]["pid"] == 101 and by_id[1]["pid"] == 102
    assert by_id[0]["busy_fraction"] == 0.8
    assert by_id[1]["busy_fraction"] == 0.5
    assert by_id[0]["fetch_ms_mean"] == 40.0
    assert by_id[1]["fetch_ms_mean"] == 10.0
    assert by_id[0]["window_batches"] == 20
    assert by_id[0]["batches"] == 50  # lifetime
    assert w["worker_ms_per_batch"] == 25.0  # weighted by batches


def test_worker_window_direct():
    frames = steady(11, with_workers=True)
    new = frames[-1]["loaders"][0]["workers"][0]
    out = worker_window(frames, 0, 0, new)
    assert out["busy_fraction"] == 0.8 and out["fetch_ms_mean"] == 40.0


def test_busy_fraction_is_capped_at_one():
    frames = [frame(i, [loader(0, i, 0, 0, [worker(0, 7, i, 0, 250 * MS * i)])]) for i in range(11)]
    assert loader_window(frames, 0, 1.0)["workers"][0]["busy_fraction"] == 1.0


def test_new_worker_pids_are_not_diffed_against_old_ones():
    """Non-persistent workers: a new epoch brings new processes whose counters restart."""
    frames = []
    for i in range(51):
        if i < 30:  # epoch 1: pids 101/102, large lifetime counters
            ws = [
                worker(0, 101, 1000 + i, 9000 * MS + 40 * MS * i, 9000 * MS + 80 * MS * i),
                worker(1, 102, 1000 + i, 9000 * MS + 40 * MS * i, 9000 * MS + 80 * MS * i),
            ]
        else:  # epoch 2 from frame 30: pids 201/202, counters from zero
            k = i - 30
            ws = [
                worker(0, 201, k, 20 * MS * k, 30 * MS * k, started_ns=T0 + 30 * DT),
                worker(1, 202, 2 * k, 10 * MS * 2 * k, 60 * MS * k, started_ns=T0 + 30 * DT),
            ]
        frames.append(frame(i, [loader(0, 3 * i, 10 * MS * i, 90 * MS * i, ws)]))
    w = loader_window(frames, 0, 3.0)  # base at frame 20: still the old pids
    by_id = {x["id"]: x for x in w["workers"]}
    # Matched from frame 30 (their first sighting): 2 s of the new processes only.
    assert by_id[0]["pid"] == 201
    assert by_id[0]["busy_fraction"] == 0.3
    assert by_id[0]["fetch_ms_mean"] == 20.0
    assert by_id[0]["window_batches"] == 20
    assert by_id[1]["busy_fraction"] == 0.6
    assert by_id[1]["fetch_ms_mean"] == 10.0
    assert by_id[1]["window_batches"] == 40
    assert w["worker_ms_per_batch"] == round((20 * 20 + 10 * 40) / 60, 3)


def test_worker_seen_once_falls_back_to_lifetime_means():
    frames = steady(10)
    frames.append(
        frame(
            10,
            [
                loader(
                    0, 20, 300 * MS, 700 * MS, [worker(0, 555, 4, 200 * MS, 400 * MS, started_ns=T0 + 2 * DT)]
                )
            ],
        )
    )
    w = loader_window(frames, 0, 1.0)["workers"][0]
    assert w["fetch_ms_mean"] == 50.0
    assert w["busy_fraction"] == 0.5  # 400 ms busy over the 800 ms since it started
    assert w["window_batches"] == 0


def test_worker_without_start_time_seen_once():
    frames = [frame(0, [loader(0, 0, 0, 0, [worker(0, 9, 0, 0, 0)])])]
    w = loader_window(frames, 0, 1.0)["workers"][0]
    assert w["busy_fraction"] is None and w["fetch_ms_mean"] is None


def test_loader_appearing_inside_the_window():
    frames = []
    for i in range(51):
        lds = [loader(0, 2 * i, 30 * MS * i, 70 * MS * i)]
        if i >= 40:
            k = i - 40
            lds.append(loader(1, 5 * k, 50 * MS * k, 50 * MS * k))
        frames.append(frame(i, lds))
    w = loader_window(frames, 1, 3.0)
    assert w["window_s"] == 1.0
    assert w["start_mono_ns"] == frames[40]["mono_ns"]
    assert w["batches_per_s"] == 50.0
    assert w["data_wait_fraction"] == 0.5
    assert w["wait_ms_mean"] == 10.0
    # The other loader is unaffected.
    assert loader_window(frames, 0, 3.0)["batches_per_s"] == 20.0


def test_loader_only_in_the_newest_frame():
    frames = steady(10)
    frames.append(frame(10, [loader(0, 18, 0, 0), loader(3, 4, 30 * MS, 10 * MS)]))
    w = loader_window(frames, 3, 1.0)
    assert w["window_s"] == 0.0
    assert w["batches_per_s"] == 0.0  # no rate from a single sighting
    assert w["data_wait_fraction"] == 0.75


def test_loader_missing_from_the_newest_frame():
    frames = steady(10)
    frames.append(frame(10, []))
    assert loader_window(frames, 0, 1.0) is None
    assert loader_window(steady(10), 9, 1.0) is None


def test_empty_inputs():
    assert loader_window([], 0, 1.0) is None
    assert series([], 0) == {"t": [], "data_wait_fraction": [], "batches_per_s": []}
    assert series(steady(1), 0) == {"t": [], "data_wait_fraction": [], "batches_per_s": []}
    assert queue_means([], 0) == {"ready": None, "in_flight": None}


def test_counters_going_backwards_are_clamped():
    old = loader(0, 500, 900 * MS, 900 * MS, [worker(0, 7, 300, 800 * MS, 900 * MS)])
    new = loader(0, 10, 5 * MS, 5 * MS, [worker(0, 7, 2, 1 * MS, 1 * MS)])
    frames = [frame(0, [old]), frame(10, [new])]
    w = loader_window(frames, 0, 1.0)
    assert w["batches_per_s"] == 0.0
    assert w["data_wait_fraction"] is None
    ww = w["workers"][0]
    assert ww["busy_fraction"] == 0.0
    assert ww["window_batches"] == 0
    assert ww["fetch_ms_mean"] == 0.5  # lifetime mean, not a negative diff
    s = series([frame(i, [old if i < 12 else new]) for i in range(25)], 0)
    assert all(v >= 0 for v in s["batches_per_s"])
    assert all(v is None or 0 <= v <= 1 for v in s["data_wait_fraction"])


_counter = st.integers(0, 10**12)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            _counter, _counter, _counter, st.integers(1, 3), _counter, _counter, _counter, st.integers(1, 500)
        ),
        min_size=1,
        max_size=30,
    ),
    window_s=st.floats(0, 5),
)
def test_arbitrary_counters_never_give_negative_or_impossible_figures(rows, window_s):
    frames = []
    t = T0
    for i, (b, wt, sp, pid, wb, wf, wbusy, gap_ms) in enumerate(rows):
        t += gap_ms * MS
        f = frame(i, [loader(0, b, wt, sp, [worker(0, pid, wb, wf, wbusy, started_ns=T0)])])
        f["mono_ns"] = t
        frames.append(f)
    w = loader_window(frames, 0, window_s)
    assert w["window_s"] >= 0 and w["batches_per_s"] >= 0
    for k in ("wait_ms_mean", "step_ms_mean"):
        assert w[k] is None or w[k] >= 0
    assert w["data_wait_fraction"] is None or 0 <= w["data_wait_fraction"] <= 1
    for x in w["workers"]:
        assert x["busy_fraction"] is None or 0 <= x["busy_fraction"] <= 1
        assert x["fetch_ms_mean"] is None or x["fetch_ms_mean"] >= 0
        assert x["window_batches"] >= 0
    s = series(frames, 0, step_s=0.3)
    assert all(v >= 0 for v in s["batches_per_s"])
    assert all(v is None or 0 <= v <= 1 for v in s["data_wait_fraction"])
    assert s["t"] == sorted(s["t"])


def test_queue_means():
    frames = []
    for i in range(21):
        q = (
            {"ready": i % 4, "in_flight": 2, "capacity": 8}
            if i % 2 == 0
            else {"ready": None, "in_flight": True, "capacity": 8}
        )  # bools are not numbers
        frames.append(frame(i, [loader(0, i, 0, 0, queue=q)]))
    qm = loader_window(frames, 0, 1.0)["queue_mean"]
    readies = [i % 4 for i in range(10, 21) if i % 2 == 0]
    assert qm == {"ready": round(sum(readies) / len(readies), 3), "in_flight": 2.0}


# --- series ----------------------------------------------------------------------------


def test_series_one_sample_per_second_oldest_first():
    frames = steady(101)  # 10 s
    s = series(frames, 0)
    assert len(s["t"]) == 10
    assert s["t"] == sorted(s["t"])
    assert s["t"][-1] == frames[-1]["t"]
    assert [round(b - a, 6) for a, b in zip(s["t"], s["t"][1:])] == [1.0] * 9
    assert s["data_wait_fraction"] == [0.3] * 10
    assert s["batches_per_s"] == [20.0] * 10


def test_series_order_shows_the_change():
    frames = []
    b = wait = step = 0
    for i in range(101):
        frames.append(frame(i, [loader(0, b, wait, step)]))
        if i < 50:
            b, wait, step = b + 2, wait + 10 * MS, step + 90 * MS
        else:
            b, wait, step = b + 1, wait + 80 * MS, step + 20 * MS
    s = series(frames, 0)
    assert s["data_wait_fraction"][:5] == [0.1] * 5
    assert s["data_wait_fraction"][5:] == [0.8] * 5
    assert s["batches_per_s"][:5] == [20.0] * 5 and s["batches_per_s"][5:] == [10.0] * 5


def test_series_step():
    s = series(steady(101), 0, step_s=0.5)
    assert len(s["t"]) == 20


def test_series_length_is_bounded_newest_kept():
    frames = steady(3001)  # 300 s at 10 Hz
    s = series(frames, 0, max_points=120)
    assert len(s["t"]) == len(s["data_wait_fraction"]) == len(s["batches_per_s"]) == 120
    assert s["t"][-1] == frames[-1]["t"]
    assert round(s["t"][-1] - s["t"][0], 6) == 119.0
    s10 = series(frames, 0, max_points=10)
    assert len(s10["t"]) == 10 and s10["t"][-1] == frames[-1]["t"]


def test_series_with_a_gap_in_the_frames():
    frames = steady(101)
    gappy = frames[:30] + frames[70:]  # 4 s without frames (monitor detached)
    s = series(gappy, 0)
    assert s["t"] == sorted(set(s["t"]))
    assert all(v == 0.3 for v in s["data_wait_fraction"])
    assert all(v == 20.0 for v in s["batches_per_s"])


def test_series_loader_appearing_late():
    frames = []
    for i in range(101):
        lds = [loader(0, 2 * i, 0, 100 * MS * i)]
        if i >= 55:
            k = i - 55
            lds.append(loader(1, k, 50 * MS * k, 50 * MS * k))
        frames.append(frame(i, lds))
    s = series(frames, 1)
    assert 4 <= len(s["t"]) <= 5
    assert all(v == 0.5 for v in s["data_wait_fraction"])
    assert all(0 < v <= 10.0 for v in s["batches_per_s"])


# --- windows that fit the job ---------------------------------------------------------


def slow_job(n: int, wait_ms: int = 500, step_ms: int = 1500, epoch_at: dict | None = None) -> list[dict]:
    """n frames (100 ms apart) of a loop that waits ``wait_ms`` in next(), then
    works ``step_ms``, with the probe's in-progress accounting in each frame."""
    cycle = (wait_ms + step_ms) * MS
    out = []
    for i in range(n):
        t = i * DT
        full, into = divmod(t, cycle)
        wait = full * wait_ms * MS + min(into, wait_ms * MS)
        step = full * step_ms * MS + max(0, into - wait_ms * MS)
        batches = full + (1 if into >= wait_ms * MS else 0)
        out.append(frame(i, [loader(0, batches, wait, step)]))
    return out


def test_a_slow_job_window_covers_five_batches_and_reads_the_same_at_every_phase():
    frames = slow_job(400)  # 40 s of 2 s cycles, 25 % waiting
    seen = []
    for end in range(200, 221):  # every phase of two cycles
        w = loader_window(frames[: end + 1], 0, 1.0)
        assert w["window_batches"] >= 5
        assert 9.9 <= w["window_s"] <= 12.1, w["window_s"]
        seen.append(w["data_wait_fraction"])
    # Whole cycles: within a point of 25 % whatever the phase (frames are 100 ms apart).
    assert all(abs(v - 0.25) <= 0.01 for v in seen), seen
    # The time window alone swings from n/a to 10 % to 50 %: what the batches fix.
    bare = [
        loader_window(frames[: end + 1], 0, 1.0, min_batches=0)["data_wait_fraction"]
        for end in range(200, 221)
    ]
    figures = [v for v in bare if v is not None]
    assert max(figures) - min(figures) >= 0.4 and None in bare


def test_a_stall_longer_than_a_cycle_is_inside_the_window_not_aligned_away():
    frames = slow_job(200)  # 20 s, then 6 s inside next() without a batch
    last = frames[-1]["loaders"][0]
    for k in range(1, 61):
        ld = dict(last, wait_ns=last["wait_ns"] + k * DT)
        frames.append(frame(len(frames), [ld]))
    w = loader_window(frames, 0, 1.0)
    assert w["window_batches"] >= 5
    assert w["data_wait_fraction"] > 0.5  # the stall is what the window shows


def test_no_batch_in_all_the_frames_held_is_no_figure_with_a_reason():
    frames = [frame(i, [loader(0, 0, i * DT, 0)]) for i in range(30)]
    w = loader_window(frames, 0, 1.0)
    assert w["data_wait_fraction"] is None
    assert w["no_batch_reason"] == "no batch yet: the loop is waiting for data inside next()"
    busy = [frame(i, [loader(0, 3, 0, i * DT)]) for i in range(30)]
    w = loader_window(busy, 0, 1.0)
    assert w["data_wait_fraction"] is None and w["window_batches"] == 0
    assert w["no_batch_reason"].startswith("no batch completed in the last 3 s: the loop is busy outside")
    ok = loader_window(steady(30), 0, 1.0)
    assert ok["no_batch_reason"] is None and ok["window_batches"] == 20


def test_a_slow_job_history_is_steady_and_a_fast_one_unchanged():
    s = series(slow_job(400), 0)
    vals = s["data_wait_fraction"][-20:]
    assert all(v is not None and abs(v - 0.25) <= 0.02 for v in vals), vals
    assert all(abs(v - 0.5) <= 0.06 for v in s["batches_per_s"][-20:])
    assert series(steady(101), 0)["data_wait_fraction"] == [0.3] * 10


def test_epoch_first_batch_age():
    frames = []
    for i in range(50):
        epoch = 1 if i < 20 else 2
        batches = i if i < 20 else 19 + max(0, i - 30)  # epoch 2: first batch at frame 31
        ld = dict(loader(0, batches, 0, 0), epoch=epoch)
        frames.append(frame(i, [ld]))
    w = loader_window(frames, 0, 1.0)
    assert w["epoch_first_batch_age_s"] == 1.8  # frame 31 -> frame 49
    assert loader_window(frames[:25], 0, 1.0)["epoch_first_batch_age_s"] is None
    assert loader_window(frames[:20], 0, 1.0)["epoch_first_batch_age_s"] == 1.9  # older than the frames
    # The newest batch: frame 49's (batch 38), none yet, or older than the frames.
    assert w["last_batch_age_s"] == 0.0
    assert loader_window(frames[:25], 0, 1.0)["last_batch_age_s"] == 0.5  # batch 19 at frame 19 (or 20)
    idle = [dict(f, loaders=[dict(f["loaders"][0], batches=3)]) for f in frames[:10]]
    assert loader_window(idle, 0, 1.0)["last_batch_age_s"] == 0.9  # a lower bound: the frames' span
    none = [dict(f, loaders=[dict(f["loaders"][0], batches=0)]) for f in frames[:10]]
    assert loader_window(none, 0, 1.0)["last_batch_age_s"] is None


def _with_next_cpu(frames: list, ms_before: float, ms_after: float | None = None, every: int = 16) -> list:
    """The frames with the probe's readings of the loop thread's CPU in next(),
    one a batch in ``every``: ``ms_before`` each up to frame 30, then
    ``ms_after`` (default: the same)."""
    after = ms_before if ms_after is None else ms_after
    out, cpu_ms, seen = [], 0.0, 0
    for i, f in enumerate(frames):
        (ld,) = f["loaders"]
        n = ld["batches"] // every
        cpu_ms += (n - seen) * (ms_before if i <= 30 else after)
        seen = n
        out.append(dict(f, loaders=[dict(ld, next_cpu_ns=round(cpu_ms * MS), next_cpu_batches=n)]))
    return out


def test_the_loop_threads_cpu_in_next_is_the_windows_mean_of_its_readings():
    frames = steady(51)  # 20 batches/s: 40 batches in the 2 s window (frames 30 to 50)
    assert loader_window(_with_next_cpu(frames, 0.8, every=4), 0, 2.0)["next_cpu_ms_mean"] == 0.8
    # The cost changed at the window's start: the window reads the new one (10 readings).
    assert loader_window(_with_next_cpu(frames, 0.8, 0.3, every=4), 0, 2.0)["next_cpu_ms_mean"] == 0.3


def test_a_window_with_few_readings_takes_the_runs_mean_and_none_is_none():
    # One batch in 16: 3 readings in the window, too few: the run's mean over
    # its 6 (3 at 1.0 ms, 3 at 2.0 ms), not the window's 2.0.
    w = loader_window(_with_next_cpu(steady(51), 1.0, 2.0), 0, 2.0)
    assert w["next_cpu_ms_mean"] == 1.5
    assert loader_window(steady(51), 0, 2.0)["next_cpu_ms_mean"] is None  # an older probe, or a feeder
