"""dlwatch attach's pure parts: py-spy's raw output, the sampled estimates,
the permission table and the hints an attached job may get.

The recordings in tests/data/pyspy/ are real ``py-spy record --nonblocking
--idle --threads --subprocesses --format raw`` output of tests/jobs/attach_job.py
(torch 2.13, CPython 3.11): ``fork1`` 1 fork worker (the loop's own figure over
the whole run: 50 % data wait), ``noworkers`` num_workers=0 (67 %), ``spawn2``
2 spawn workers (14 %).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
from pathlib import Path

import pytest

from dlwatch.cli.text import render_snapshot
from dlwatch.collect import ptrace, sampled, spy
from dlwatch.collect.stacks import parse_frame, parse_line, parse_raw
from dlwatch.diagnose import evaluate
from dlwatch.snapshot import problems

DATA = Path(__file__).resolve().parent.parent / "data" / "pyspy"


def load(name: str):
    text = (DATA / f"{name}.txt").read_text()
    root = int(re.match(r"process (\d+)", text).group(1))
    stacks, bad = parse_raw(text)
    assert bad == 0
    return sampled.summarize(stacks, root), root


# ------------------------------------------------------------------ parsing


def test_line_with_processes_thread_and_frames():
    st = parse_line(
        'process 10:"python t.py";process 12:"python t.py";thread (12): MainThread;'
        "<module> (t.py:9);_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725) 37"
    )
    assert st.pids == (10, 12) and st.pid == 12 and st.tid == 12 and st.thread == "MainThread"
    assert st.count == 37 and len(st.frames) == 2
    f = parse_frame(st.frames[1])
    assert (f.func, f.file, f.line) == ("_BaseDataLoaderIter.__next__", "torch/utils/data/dataloader.py", 725)


def test_a_semicolon_inside_a_command_line_is_not_a_field():
    # A spawn worker's command line holds "; spawn_main(...)".
    st = parse_line(
        'process 1:"python a.py";process 2:"python -c from multiprocessing.spawn import spawn_main; '
        'spawn_main(tracker_fd=5)";thread (2): MainThread;_worker_loop '
        "(torch/utils/data/_utils/worker.py:300) 4"
    )
    assert st.pids == (1, 2) and st.tid == 2
    assert st.frames == ("_worker_loop (torch/utils/data/_utils/worker.py:300)",)


def test_without_subprocesses_the_root_owns_the_stack_and_hex_thread_ids_read():
    st = parse_line("thread (0x7F3E0C7A3740);<module> (t.py:1) 5", root_pid=99)
    assert st.pids == (99,) and st.tid == 0x7F3E0C7A3740 and st.thread == ""


@pytest.mark.parametrize(
    "line",
    ["", "no count here", 'process 1:"unterminated 3', "frames (a.py:1) -4"],
)
def test_malformed_lines_are_skipped_and_counted(line):
    stacks, bad = parse_raw(line + "\nthread (1): MainThread;f (a.py:1) 2\n", root_pid=1)
    assert len(stacks) == 1 and bad == (1 if line else 0)


# ---------------------------------------------------------------- estimates


def test_one_fork_worker_recording():
    s, root = load("fork1")
    assert s.python and s.iterator == "multi-process" and s.training_thread == "MainThread"
    assert s.training_tid == root
    # ~2 s at 100 Hz of the training thread; the loop measured 50 % itself.
    assert 150 <= s.data_wait.samples <= 210
    assert abs(s.data_wait.fraction - 0.50) <= s.data_wait.pm + 0.05
    [w] = s.workers
    assert w.pid != root and w.busy.fraction > 0.9  # 20 ms fetch per batch, one batch per 20 ms


def test_no_workers_recording():
    s, _ = load("noworkers")
    assert s.iterator == "single-process" and s.workers == []
    assert abs(s.data_wait.fraction - 0.67) <= s.data_wait.pm + 0.05


def test_spawn_workers_recording_leaves_out_the_resource_tracker():
    s, root = load("spawn2")
    # The spawn job has three children: two workers and multiprocessing's resource tracker.
    assert len(s.processes - {root}) == 3
    assert len(s.workers) == 2
    assert all(w.busy.fraction > 0.8 for w in s.workers)
    assert s.data_wait.fraction < 0.2


@pytest.mark.parametrize(
    "hits,n,lo,hi",
    [(50, 100, 0.404, 0.596), (0, 100, 0.0, 0.037), (100, 100, 0.963, 1.0), (1, 2, 0.095, 0.905)],
)
def test_wilson_interval(hits, n, lo, hi):
    b = sampled.wilson(hits, n)
    assert b[0] == pytest.approx(lo, abs=1e-3) and b[1] == pytest.approx(hi, abs=1e-3)


def test_share_without_samples_is_none():
    sh = sampled.Share(0, 0)
    assert sh.fraction is None and sh.pm is None and sh.bounds is None


def test_frames_are_matched_on_torch_files_not_names_alone():
    assert sampled.frame_kind("Mine.__next__ (myproj/data.py:3)") is None
    assert sampled.frame_kind("fetch (myproj/io.py:3)") is None
    assert sampled.frame_kind("_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:52)") == "fetch"
    assert (
        sampled.frame_kind(
            "_StatefulMultiProcessingDataLoaderIter.__next__ "
            "(torchdata/stateful_dataloader/stateful_dataloader.py:1)"
        )
        == "next"
    )


def test_pin_memory_thread_is_seen():
    line = (
        'process 5:"python t.py";thread (7): pt_data_pin;_pin_memory_loop '
        "(torch/utils/data/_utils/pin_memory.py:40) 9"
    )
    s = sampled.summarize([parse_line(line)], 5)
    assert s.pin_memory and s.data_wait is None


@pytest.mark.parametrize(
    "cmd,ppid,want",
    [
        ("python -c from multiprocessing.spawn import spawn_main; spawn_main(x)", 1, "spawn"),
        ("python t.py", 7, "forkserver"),
        ("python t.py", 1, "fork"),
    ],
)
def test_start_method(cmd, ppid, want):
    assert sampled.start_method("python t.py", cmd, ppid, 1) == want


# ------------------------------------------------------------- the snapshot


def snap_of(name: str, usable: float = 8.0, shm: int = 8 << 30, procs: dict | None = None) -> dict:
    s, root = load(name)
    job = sampled.job_dict({"cmdline": "python train.py"}, s, procs or {}, span_s=2.0)
    return {
        "schema_version": 1,
        "time": 1000.0,
        "window_s": 2.0,
        "host": {"logical_cpus": 8, "usable_cores": usable, "cpu_percent": 10.0, "shm_free_bytes": shm},
        "gpu_status": "n/a",
        "gpus": [],
        "jobs": [job],
        "hints": [],
    }


@pytest.mark.parametrize("name", ["fork1", "noworkers", "spawn2"])
def test_attached_job_satisfies_the_contract_and_says_what_it_cannot_know(name):
    snap = snap_of(name)
    assert problems(snap) == []
    [ld] = snap["jobs"][0]["loaders"]
    assert ld["sampled"] is True and ld["batches_per_s"] is None and ld["wait_ms_mean"] is None
    assert ld["data_wait_samples"] > 100 and 0 < ld["data_wait_pm"] < 0.1
    text = render_snapshot(snap)
    assert "sampled" in text and sampled.NOT_SAMPLED in text and "±" in text


def test_a_python_process_without_a_dataloader_gets_a_reason_not_a_loader():
    st = parse_line("thread (3): MainThread;<module> (serve.py:1) 200", root_pid=3)
    job = sampled.job_dict({}, sampled.summarize([st], 3), {}, span_s=2.0)
    assert job["loaders"] == [] and "no DataLoader iterator seen in 200 samples" in job["state_reason"]


# ------------------------------------------------------------------- hints


def test_no_workers_hint_with_an_estimate_and_its_range():
    [h] = [h for h in evaluate(snap_of("noworkers")) if h["id"] == "no-workers"]
    ev = h["evidence"]
    assert h["severity"] == "warn" and ev["sampled"] is True
    lo, hi = ev["range"]
    # 63 % waiting: loading takes ~1.7 loop computes per batch -> 2 workers.
    assert ev["recommended_num_workers"] == 2 and lo <= 2 <= hi
    assert "±" in h["message"] and "num_workers=2" in h["suggestion"]


def test_worker_count_estimate_for_a_saturated_worker():
    hints = evaluate(snap_of("fork1"))
    [h] = [h for h in hints if h["id"] == "sampled-worker-count"]
    ev = h["evidence"]
    # 1 worker busy ~97 %, the loop waits ~57 %: 0.97 / 0.43 -> ~2.3 -> 3 workers.
    assert ev["recommended_num_workers"] == 3
    assert ev["range"][0] <= 3 <= ev["range"][1]
    # Rules that need the hook's per-batch figures stay silent.
    assert {h["id"] for h in hints} <= {"sampled-worker-count"}


def test_balanced_spawn_workers_get_no_count_hint():
    assert [h for h in evaluate(snap_of("spawn2")) if h["id"] == "sampled-worker-count"] == []


def test_shm_low_speaks_for_an_attached_job():
    ids = {h["id"] for h in evaluate(snap_of("spawn2", shm=32 << 20))}
    assert "shm-low" in ids


def test_estimate_arithmetic():
    est = __import__("dlwatch.diagnose.rules_sampled", fromlist=["estimate"]).estimate
    e = est(2, (0.9, 0.85, 0.95), (0.4, 0.35, 0.45))
    assert e["workers_needed"] == pytest.approx(3.0) and e["recommended_num_workers"] == 3
    assert e["range"] == [3, 4]


# ------------------------------------------------------------- permissions

ME = dict(caller_uid=1000, caller_gid=1000, target_uids=(1000, 1000, 1000), target_gids=(1000, 1000, 1000))


@pytest.mark.parametrize(
    "kw,allowed,code,words",
    [
        (dict(ME, has_cap=False, scope=0, descendant=False), True, 0, "same user (ptrace_scope 0)"),
        (dict(ME, has_cap=False, scope=None, descendant=False), True, 0, "no Yama"),
        (dict(ME, has_cap=False, scope=1, descendant=False), False, 4, "sysctl kernel.yama.ptrace_scope=0"),
        (dict(ME, has_cap=False, scope=1, descendant=True), True, 0, "descends"),
        (dict(ME, has_cap=False, scope=2, descendant=False), False, 4, "sudo dlwatch attach --pid 42"),
        (dict(ME, has_cap=True, scope=2, descendant=False), True, 0, "CAP_SYS_PTRACE"),
        (dict(ME, has_cap=True, scope=3, descendant=False), False, 4, "rebooting"),
        (
            dict(ME, has_cap=False, scope=0, descendant=False, target_uids=(0, 0, 0)),
            False,
            4,
            "runs as uid 0 and you are uid 1000",
        ),
        (
            dict(ME, has_cap=False, scope=0, descendant=False, target_uids=(1000, 0, 0)),
            False,
            4,
            "sudo",
        ),
        (dict(ME, has_cap=True, scope=0, descendant=False, target_uids=(0, 0, 0)), True, 0, "CAP_SYS_PTRACE"),
    ],
)
def test_permission_table(kw, allowed, code, words):
    a = ptrace.decide(pid=42, **kw)
    assert a.allowed is allowed and a.code == code and words in a.line()
    assert "\n" not in a.line()


def test_check_of_a_missing_process(tmp_path):
    a = ptrace.check(42, proc=str(tmp_path))
    assert not a.allowed and a.code == ptrace.EXIT_NO_PROCESS


def test_status_ids_read_from_a_status_file(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "status").write_text("Name:\tpython\nPPid:\t3\nUid:\t5\t6\t7\t8\nGid:\t1\t2\t3\t4\n")
    assert ptrace.status_ids(7, str(tmp_path)) == ((5, 6, 7), (1, 2, 3), 3)


@pytest.mark.parametrize(
    "stderr,code,words",
    [
        ("Error: Permission denied (os error 13)", 4, "--check"),
        ("Error: Failed to get process executable name. Check that the process is running.", 3, "no process"),
        ("Error: something new", 1, "something new"),
    ],
)
def test_py_spy_failures_are_one_line(stderr, code, words):
    c, line = spy.failure(stderr + "\n\nStack backtrace:\n   0: x\n", 42)
    assert c == code and words in line and "\n" not in line


def test_py_spy_missing_the_version_of_a_python_process_is_not_called_not_python():
    # py-spy's version heuristic can miss on a Python process: the line says
    # so and asks for another try; only a process that runs no Python is "not
    # a Python process".
    err = "Error: Failed to find python version from target process\n"
    code, line = spy.failure(err, os.getpid())
    assert code == 1 and "runs Python" in line and "try again" in line
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        code, line = spy.failure(err, sleeper.pid)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert code == 5 and "not a Python process" in line


# ------------------------------------------------------------- the live view


def test_live_view_marks_an_attached_job_as_sampled():
    import asyncio

    from dlwatch.tui.jobs import JobList
    from dlwatch.tui.textline import TextLine
    from tests.tui_fixtures import make_app, plain, row_text

    snap = snap_of("fork1")
    snap["hints"] = evaluate(snap)

    async def go():
        app = make_app([snap])
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(4):
                await pilot.pause()
            header = plain(app.screen.query_one("#job-header", TextLine))
            assert "sampled (attached, no hook)" in header
            stats = plain(app.screen.query_one("#loader-stats", TextLine))
            assert "±" in stats and "samples" in stats and sampled.NOT_SAMPLED in stats
            jobs = app.screen.query_one(JobList)
            assert "[sampled]" in row_text(jobs, jobs.row_keys[0])[1]

    asyncio.run(go())


def test_torn_samples_are_left_out_and_iterator_internals_count_as_wait():
    root = "<module> (t.py:9)"
    nxt = "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)"
    put = "_MultiProcessingDataLoaderIter._try_put_index (torch/utils/data/dataloader.py:1400)"
    lines = [
        f"thread (5): MainThread;{root};{nxt};select (selectors.py:415) 40",
        "thread (5): MainThread;<module> (t.py:12);_spend (t.py:20) 50",
        # torn: the outer frames are gone
        f"thread (5): MainThread;{put};notify (threading.py:1) 7",
        # the __next__ frame lost, the iterator's own step kept
        f"thread (5): MainThread;{root};{put} 3",
    ]
    s = sampled.summarize([parse_line(ln, root_pid=5) for ln in lines], 5)
    assert s.torn == 7
    assert (s.data_wait.hits, s.data_wait.samples) == (43, 93)


# ------------------------------------------------- only the target's processes

_NEXT = "_BaseDataLoaderIter.__next__ (torch/utils/data/dataloader.py:725)"
_LOOP = "_worker_loop (torch/utils/data/_utils/worker.py:374)"
_FETCH = "_MapDatasetFetcher.fetch (torch/utils/data/_utils/fetch.py:57)"


def _chain(*procs: tuple[int, str]) -> str:
    return ";".join(f'process {pid}:"{cmd}"' for pid, cmd in procs)


def test_other_programs_under_the_target_are_left_out():
    # py-spy follows every descendant of the PID it is given: from a
    # launcher or a container's first process, other jobs and their workers.
    root, other = (1, "python entry.py"), (50, "python other_train.py")
    lines = [
        f"{_chain(root)};thread (1): MainThread;<module> (entry.py:3);{_NEXT} 30",
        f"{_chain(root)};thread (1): MainThread;<module> (entry.py:3);wait (entry.py:9) 70",
        # another job the target started: its child, but not a worker; its
        # own worker is not the target's
        f"{_chain(root, other)};thread (50): MainThread;<module> (t.py:1);{_NEXT} 90",
        f"{_chain(root, other, (51, 'python other_train.py'))};thread (51): MainThread;{_LOOP};{_FETCH} 80",
        # the target's own fork worker, and a forkserver worker of it
        f"{_chain(root, (2, 'python entry.py'))};thread (2): MainThread;{_LOOP};{_FETCH} 60",
        f"{_chain(root, (3, 'python -c from multiprocessing.forkserver import main; main(5)'), (4, 'x'))};"
        f"thread (4): MainThread;{_LOOP};{_FETCH} 40",
    ]
    s = sampled.summarize([parse_line(ln) for ln in lines], 1)
    assert s.foreign == 80 and s.samples == 290
    assert [w.pid for w in s.workers] == [2, 4]
    assert (s.data_wait.hits, s.data_wait.samples) == (30, 100)


def _worker(pid: int, hits: int, n: int) -> sampled.WorkerSamples:
    return sampled.WorkerSamples(pid, pid, sampled.Share(hits, n), sampled.Share(0, n))


def test_a_replaced_worker_is_the_same_slot():
    # num_workers=1 without persistent_workers: a new worker each epoch.
    ws = [_worker(10, 90, 100), _worker(11, 80, 100), _worker(12, 40, 50)]
    lives = {10: (0.0, 1.0), 11: (1.25, 2.0), 12: (2.25, 3.0)}
    [slot] = sampled.merge_slots(ws, lives)
    assert slot.pid == 12 and slot.replaced == (10, 11)
    assert (slot.busy.hits, slot.busy.samples) == (210, 250)


def test_workers_alive_together_are_slots_of_their_own():
    ws = [_worker(p, 50, 100) for p in (20, 21, 30, 31, 40)]
    # Two workers an epoch, replaced twice; 40 lived between two listings.
    lives = {20: (0.0, 1.0), 21: (0.0, 1.0), 30: (1.25, 2.0), 31: (1.25, 2.0)}
    slots = sampled.merge_slots(ws, lives)
    assert len(slots) == 2 and sorted(p for s in slots for p in (s.pid, *s.replaced)) == [20, 21, 30, 31, 40]
    assert sampled.merge_slots(ws, None) == ws  # nothing known: nothing merged


def test_a_replaced_worker_counts_once_in_the_snapshot():
    s, _ = load("fork1")
    [w] = s.workers
    twin = sampled.WorkerSamples(w.pid + 1000, w.tid, w.busy, w.waiting_index)
    s.workers = sampled.merge_slots([w, twin], {w.pid: (0.0, 1.0), w.pid + 1000: (1.5, 2.0)})
    job = sampled.job_dict({"cmdline": "python train.py"}, s, {}, span_s=2.0)
    [ld] = job["loaders"]
    assert ld["num_workers"] == 1 and job["sampling"]["replaced_workers"] == 1
    assert ld["workers"][0]["pid"] == w.pid + 1000


def test_a_process_the_kernel_will_not_let_us_read_is_refused(monkeypatch, tmp_path):
    (tmp_path / "7").mkdir()
    uid, gid = os.geteuid(), os.getegid()
    (tmp_path / "7" / "status").write_text(
        f"PPid:\t1\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{gid}\t{gid}\t{gid}\n"
    )
    monkeypatch.setattr(ptrace, "read_scope", lambda: 0)
    assert ptrace.check(7, str(tmp_path)).allowed  # no maps file: py-spy will tell
    monkeypatch.setattr(ptrace, "maps_readable", lambda pid, proc: False)
    a = ptrace.check(7, str(tmp_path))
    assert not a.allowed and a.code == ptrace.EXIT_NOT_PERMITTED
    assert "/proc/7/maps" in a.line() and "\n" not in a.line()


def test_a_bare_pid_is_told_to_use_dash_dash_pid(capsys):
    from dlwatch.cli import main as cli

    assert cli.main(["attach", "1234"]) == 2
    err = capsys.readouterr().err
    assert "--pid 1234" in err and len(err.strip().splitlines()) == 1


def test_what_attach_cannot_measure_is_said_not_yet():
    from dlwatch.diagnose import capacity
    from dlwatch.diagnose.facts import build_context
    from dlwatch.tui import fmt
    from dlwatch.tui.loader import epoch_stats, queue_line

    snap = snap_of("fork1")
    ctx = build_context(snap, {})
    [lv] = ctx.loaders
    got = capacity.predict(ctx, lv, 2)
    assert isinstance(got, capacity.NoPrediction) and "never measured when attached" in got.reason
    [ld] = snap["jobs"][0]["loaders"]
    for line in (epoch_stats(ld, fmt.DEFAULT_PALETTE), queue_line(ld, fmt.DEFAULT_PALETTE)):
        assert sampled.NOT_SAMPLED in line.plain


def test_live_view_says_what_the_samples_saw_of_a_job_without_a_loader():
    import asyncio

    from tests.tui_fixtures import make_app, screen_lines

    s = sampled.summarize([parse_line("thread (5): MainThread;<module> (t.py:1);sleep (t.py:2) 300", 5)], 5)
    snap = snap_of("fork1")
    snap["jobs"] = [sampled.job_dict({"cmdline": "python serve.py"}, s, {}, span_s=3.0)]

    async def go():
        app = make_app([snap])
        async with app.run_test(size=(120, 40)) as pilot:
            for _ in range(4):
                await pilot.pause()
            text = "\n".join(screen_lines(app))
            assert "no DataLoader iterator seen in 300 samples of this process (sampled from outside)" in text
            assert "figures appear at the first iter(loader)" not in text

    asyncio.run(go())


def test_a_launcher_points_at_the_ranks_that_iterate():
    # torchrun's own process: its ranks iterate, their workers are not the launcher's.
    launcher, rank = (1, "python -m torch.distributed.run t.py"), (2, "python t.py")
    lines = [
        f"{_chain(launcher)};thread (1): MainThread;<module> (run.py:1);sleep (run.py:2) 100",
        f"{_chain(launcher, rank)};thread (2): MainThread;<module> (t.py:3);{_NEXT} 60",
        f"{_chain(launcher, rank, (3, 'python t.py'))};thread (3): MainThread;{_LOOP};{_FETCH} 90",
    ]
    s = sampled.summarize([parse_line(ln) for ln in lines], 1)
    assert s.data_wait is None and s.workers == [] and s.child_loops == {2} and s.foreign == 90
    job = sampled.job_dict({"cmdline": "torchrun t.py"}, s, {}, span_s=3.0)
    assert job["loaders"] == [] and "`dlwatch attach --pid 2`" in job["state_reason"]


@pytest.mark.parametrize("name, kind", [("noworkers", "single-process"), ("fork1", "multi-process")])
def test_a_python_310_jobs_frames_without_class_names_still_tell_the_iterator(name, kind):
    # py-spy reads a 3.10 frame's bare name ("_next_data", not
    # "_SingleProcessDataLoaderIter._next_data"): the same recordings, their
    # names stripped so, give the same iterator kind.
    text = (DATA / f"{name}.txt").read_text()
    root = int(re.match(r"process (\d+)", text).group(1))
    stacks, _ = parse_raw(text)
    bare = []
    for st in stacks:
        frames = []
        for fr in st.frames:
            f = parse_frame(fr)
            frames.append(fr.replace(f.func, f.func.rsplit(".", 1)[-1], 1) if f.file else fr)
        bare.append(dataclasses.replace(st, frames=tuple(frames)))
    assert not any("DataLoaderIter" in fr for st in bare for fr in st.frames)
    assert sampled.summarize(bare, root).iterator == kind
