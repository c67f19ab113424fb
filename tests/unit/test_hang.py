"""The hang doctor's pure parts: the stall clock, worker deaths from torch's
errors, what a stack waits on, the loader-stalled rule's causes, the cgroup
OOM counter, py-spy's dump in our format."""

from __future__ import annotations

import os
import signal
import threading
from types import SimpleNamespace

import pytest

from dlwatch.collect import oom
from dlwatch.collect.hang import threads_from_py_spy
from dlwatch.diagnose import Diagnoser, evaluate, hang
from dlwatch.probe import deaths, stall
from dlwatch.record.recorder import stacks_path

from .test_diagnose_rules import T0, get, ids, job, loader, snap

# --- the stall clock (probe/stall.py) ------------------------------------------------


class _It:
    pass


def _st(lid=0, *, batches=0, t_last=0.0, t_enter=0.0, epoch_t0=1.0, first=False, starts=(), it=None):
    it = it or _It()
    return SimpleNamespace(
        id=lid,
        epoch=1,
        batches=batches,
        t_last=t_last,
        t_enter=t_enter,
        epoch_t0=epoch_t0,
        paused_t=0.0,
        first_pending=first,
        epoch_start_ms=list(starts),
        iter_ref=(lambda: it),
        _it=it,
    )


def _steady(watch, st, period=0.1, n=20, t0=2.0):
    """Feed ``watch`` a loader that takes a batch every ``period`` s."""
    t = t0
    for _ in range(n):
        st.batches += 1
        st.t_last = t
        watch.check([st], t + 0.01)
        t += period
    return st.t_last


def test_a_loader_is_stalled_past_max_floor_or_ten_periods():
    w = stall.StallWatch(floor_s=2.0)
    st = _st()
    last = _steady(w, st, period=0.1)
    st.t_enter = last + 0.001  # inside next() since
    assert w.check([st], last + 1.9)[0]["stalled_s"] is None  # floor 2 s > 10 x 0.1 s
    got = w.check([st], last + 2.5)[0]
    assert got["stalled_s"] == pytest.approx(2.5) and got["stall_threshold_s"] == 2.0 and got["in_next"]
    slow = stall.StallWatch(floor_s=2.0)
    st2 = _st()
    last = _steady(slow, st2, period=1.0)
    assert slow.check([st2], last + 5.0)[0]["stalled_s"] is None  # 10 x 1 s = 10 s
    assert slow.check([st2], last + 10.5)[0]["stalled_s"] == pytest.approx(10.5)


def test_an_ended_epoch_a_dead_iterator_or_a_stepping_sibling_is_no_stall():
    w = stall.StallWatch(floor_s=1.0)
    st = _st()
    last = _steady(w, st)
    st.epoch_t0 = 0.0  # StopIteration
    assert w.check([st], last + 100)[0]["stalled_s"] is None
    st.epoch_t0, st.iter_ref = 1.0, (lambda: None)
    assert w.check([st], last + 100)[0]["stalled_s"] is None
    st.iter_ref = lambda: st._it
    val = _st(1, batches=5, t_last=last + 99.5)  # a validation loader stepping now
    assert w.check([st, val], last + 100)[0]["stalled_s"] is None
    assert w.check([st], last + 100)[0]["stalled_s"] == pytest.approx(100)


def test_a_loader_paused_by_an_evaluation_is_no_stall_while_the_evaluation_has_the_loop():
    """A QA run of Lightning: validation paused the train loader (its t_last
    0) and fetched its own first batch (its t_last 0 too) for longer than the
    train loader's threshold; the train loader read "no batch for 25 s", its
    whole epoch so far."""
    w = stall.StallWatch(floor_s=2.0)
    train = _st()
    last = _steady(w, train, period=0.5)  # threshold max(2, 10 x 0.5) = 5 s
    train.t_last, train.t_enter, train.paused_t = 0.0, 0.0, last + 0.1
    val = _st(1, t_enter=last + 0.2, epoch_t0=last + 0.1, first=True)  # inside next(), no batch yet
    assert w.check([train, val], last + 8.0)[0]["stalled_s"] is None
    val.t_last, val.t_enter = last + 8.0, last + 7.9  # its batch came; the loop steps on it
    assert w.check([train, val], last + 12.0)[0]["stalled_s"] is None
    # Nothing has the loop: the idle time counts from the pause, not the epoch's start.
    assert w.check([train, val], last + 20.0)[0]["stalled_s"] == pytest.approx(19.9)


def test_an_epoch_start_gets_three_floors_or_three_slowest_starts():
    w = stall.StallWatch(floor_s=2.0)
    st = _st(first=True, epoch_t0=10.0)
    assert w.check([st], 15.0)[0]["stalled_s"] is None
    assert w.check([st], 16.5)[0]["stalled_s"] == pytest.approx(6.5)
    st.epoch_start_ms = [4000.0]  # spawned workers took 4 s last time
    assert w.check([st], 21.0)[0]["stall_threshold_s"] == 12.0


@pytest.mark.parametrize(
    "raw, want",
    [(None, 10.0), ("", 10.0), ("2.5", 2.5), ("x", 10.0), ("0", 0.5), ("nan", 10.0), ("1e9", 3600.0)],
)
def test_the_floor_comes_from_the_environment_within_bounds(raw, want):
    env = {} if raw is None else {"DLWATCH_STALL_FLOOR_S": raw}
    assert stall.floor_from_env(env) == want


# --- worker deaths (probe/deaths.py) -------------------------------------------------


def _proc(pid, rc):
    return SimpleNamespace(pid=pid, _popen=SimpleNamespace(returncode=rc))


def test_a_reaped_worker_is_recorded_with_its_signal_or_exit_code_once():
    out: list[dict] = []
    # The running one is this process: not reaped yet, so its /proc entry is
    # read, and it must be there (a made-up PID is absent on some boxes).
    alive = os.getpid()
    deaths.scan([_proc(alive, None), _proc(12, -signal.SIGKILL), _proc(13, 0), _proc(14, 3)], out)
    deaths.scan([_proc(12, -signal.SIGKILL)], out)
    assert [(d["id"], d["pid"], d["signal"], d["exit_code"]) for d in out] == [
        (1, 12, "SIGKILL", None),
        (3, 14, None, 3),
    ]


def test_a_running_child_is_never_reaped_by_the_scan():
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    out: list[dict] = []
    try:
        while deaths._status(SimpleNamespace(pid=pid, _popen=None)) == (False, None, None):
            pass
        deaths.scan([SimpleNamespace(pid=pid, _popen=None)], out)
        assert out[0]["exit_code"] == 7
        # WNOWAIT: the child is still there for its parent (torch) to reap.
        assert os.waitpid(pid, 0)[1] >> 8 == 7
    finally:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


@pytest.mark.parametrize(
    "message, want",
    [
        ("DataLoader worker (pid {w1}) is killed by signal: Killed. ", (1, "w1", "SIGKILL", None)),
        (
            "DataLoader worker (pid {w1}) is killed by signal: Segmentation fault. ",
            (1, "w1", "SIGSEGV", None),
        ),
        ("DataLoader worker (pid(s) {w1}) exited unexpectedly", (1, "w1", None, None)),
        (
            "Caught ValueError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
            '  File "x.py", line 3, in f\nValueError: bad shard 7\n',
            (0, "w0", None, "ValueError: bad shard 7"),
        ),
    ],
)
def test_torchs_errors_name_the_dead_worker(message, want):
    # Two live processes that are not our children (their exit status is not ours to read).
    pids = {"w0": os.getpid(), "w1": os.getppid()}
    it = SimpleNamespace(_workers=[_proc(pids["w0"], None), _proc(pids["w1"], None)], _shutdown=False)
    out: list[dict] = []
    first = deaths.from_error(it, RuntimeError(message.format(**pids)), out)
    if want[3] is None:
        assert first.startswith("RuntimeError: ")
    else:  # the original exception, not torch's wrapper line
        assert first == f"{want[3]} (caught in DataLoader worker process 0)", first
    assert [(d["id"], d["pid"], d["signal"], d["exception"]) for d in out] == [
        (*want[:1], pids[want[1]], *want[2:])
    ]


def test_a_wrapped_exception_of_a_pipeline_thread_keeps_its_original_message():
    # torchdata.nodes re-raises its threads' errors through torch's
    # ExceptionWrapper (a QA run kept "Caught ValueError in _populate_queue.").
    e = ValueError(
        "Caught ValueError in _populate_queue.\nOriginal Traceback (most recent call last):\n"
        '  File "qa_lib.py", line 30, in sample\nValueError: QA corrupt sample 1200\n'
    )
    out: list[dict] = []
    first = deaths.from_error(SimpleNamespace(), e, out)
    assert first == "ValueError: QA corrupt sample 1200 (caught in _populate_queue)", first
    assert out == []


def test_death_and_stall_lines():
    d = {
        "id": 2,
        "pid": 4712,
        "signal": "SIGKILL",
        "oom_kills": 1,
        "oom_kills_at_start": 0,
        "rss_first_bytes": int(1.2 * 2**30),
        "rss_last_bytes": int(7.8 * 2**30),
        "rss_span_s": 240.0,
    }
    assert hang.death_line(d) == (
        "worker 2 (pid 4712) was killed by SIGKILL; the cgroup counted 1 OOM kill since dlwatch first "
        "saw the job; its RSS grew 1.2 → 7.8 GiB in 4 min; the OOM killer (memory limit)"
    )
    assert hang.death_cause(d) == "oom"
    # A SIGKILL the cgroup did not count is someone's kill, not the OOM killer's.
    assert hang.death_cause({**d, "oom_kills": 0}) == "signal"
    no_shm = "RuntimeError: unable to allocate shared memory(shm) for file </torch_1>: No space left"
    assert hang.death_cause({"signal": "SIGBUS"}) == "shm" == hang.death_cause({"exception": no_shm})
    assert hang.death_cause({"signal": "SIGSEGV"}) == "segfault"
    assert hang.death_cause({"exit_code": 1}) == "exit"
    no_oom = {
        "id": 0,
        "pid": 9,
        "exception": "ValueError: x",
        "oom_kills": None,
        "oom_kills_reason": "no cgroup",
    }
    # A worker's own exception weighs no OOM kills, counted or not (a QA run:
    # "raised ValueError …; the cgroup counted 0 OOM kills").
    assert hang.death_line(no_oom) == "worker 0 (pid 9) raised ValueError: x"
    assert (
        hang.death_line(dict(no_oom, oom_kills=0, oom_kills_at_start=0))
        == "worker 0 (pid 9) raised ValueError: x"
    )
    killed = {"id": 0, "pid": 9, "signal": "SIGKILL", "oom_kills": None, "oom_kills_reason": "no cgroup"}
    assert hang.death_line(killed) == "worker 0 (pid 9) was killed by SIGKILL; OOM kills n/a: no cgroup"
    assert hang.stall_line({"stalled_s": 42.4, "stall_threshold_s": 10, "in_next": True}) == (
        "STALLED: no batch for 42 s (threshold 10 s), inside next()"
    )
    assert hang.stall_line({"stalled_s": None}) is None


# --- what a stack waits on (diagnose/hang.py) ----------------------------------------

STD = "/usr/lib/python3.11"
TORCH = "/venv/lib/python3.11/site-packages/torch/utils/data"


def _thread(frames, src="", main=True, name="MainThread"):
    return {"name": name, "main": main, "frames": [list(f) for f in frames], "src": src}


WORKER_LOOP = [("_worker_loop", f"{TORCH}/_utils/worker.py", 374)]
FETCH = [*WORKER_LOOP, ("fetch", f"{TORCH}/_utils/fetch.py", 54)]
NODES_UDF = [("_apply_udf", "/venv/lib/python3.11/site-packages/torchdata/nodes/map.py", 37)]
GRAIN = "/venv/lib/python3.11/site-packages/grain/_src/python"
GRAIN_WORKER = [
    ("_put_dataset_elements_in_buffer", f"{GRAIN}/dataset/transformations/process_prefetch.py", 260)
]


@pytest.mark.parametrize(
    "frames, src, role, want",
    [
        ([*FETCH, ("read_shard", "/job/shards.py", 88)], "with open(path) as f:", "worker", hang.IO),
        ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with LOCK:", "worker", hang.LOCK),
        (
            [*FETCH, ("__getitem__", "/job/ds.py", 5), ("acquire", f"{STD}/threading.py", 9)],
            "",
            "worker",
            hang.LOCK,
        ),
        ([*WORKER_LOOP, ("get", f"{STD}/multiprocessing/queues.py", 113)], "", "worker", hang.IDLE),
        (
            [("<module>", "/job/t.py", 9), ("_try_get_data", f"{TORCH}/dataloader.py", 1291)],
            "",
            "trainer",
            hang.QUEUE,
        ),
        (
            [("<module>", "/job/t.py", 9), ("all_reduce", "/v/site-packages/torch/distributed/c10d.py", 2)],
            "work.wait()",
            "trainer",
            hang.COLLECTIVE,
        ),
        (
            [
                ("<module>", "/job/t.py", 9),
                ("get", f"{STD}/queue.py", 171),
                ("wait", f"{STD}/threading.py", 327),
            ],
            "",
            "trainer",
            hang.QUEUE,
        ),
        ([("<module>", "/job/t.py", 9)], "time.sleep(3600)", "trainer", hang.SLEEP),
        # The commonest lock idioms: "_" is a word character (a QA run read
        # `with self._lock:` as a plain call, then "blocked in C").
        ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with self._lock:", "worker", hang.LOCK),
        ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with store_lock:", "worker", hang.LOCK),
        ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with self._mutex:", "worker", hang.LOCK),
        ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with self.clock:", "worker", hang.RUNNING),
        # A worker's own multiprocessing queue (an end-of-data sentinel): not "C".
        (
            [
                *FETCH,
                ("__iter__", "/job/ds.py", 11),
                ("get", f"{STD}/multiprocessing/queues.py", 103),
                ("_recv", f"{STD}/multiprocessing/connection.py", 395),
            ],
            "chunk = read(handle, remaining)",
            "worker",
            hang.QUEUE,
        ),
        # torchdata.nodes' process worker between items: its in-queue's poll
        # is no read of the user's (a QA run: "blocked in I/O").
        (
            [
                *NODES_UDF,
                ("get", f"{STD}/multiprocessing/queues.py", 113),
                ("select", f"{STD}/selectors.py", 415),
            ],
            "fd_event_list = self._selector.poll(timeout)",
            "worker",
            hang.IDLE,
        ),
        ([*NODES_UDF, ("decode", "/job/t.py", 11)], "time.sleep(60)", "worker", hang.SLEEP),
        (
            [*GRAIN_WORKER, ("add_element_to_queue", f"{GRAIN}/queue.py", 40), ("put", f"{STD}/queue.py", 9)],
            "",
            "worker",
            hang.IDLE,
        ),
        ([("<module>", "/job/t.py", 9)], "x = model(batch)", "trainer", hang.RUNNING),
        ([], "", "trainer", hang.RUNNING),
    ],
)
def test_what_a_thread_waits_on(frames, src, role, want):
    assert hang.wait_kind(_thread(frames, src), role) == want


def test_the_summary_names_each_process_and_the_users_frame_under_the_stdlib():
    doc = {
        "processes": [
            {
                "role": "trainer",
                "pid": 100,
                "threads": [
                    _thread(
                        [("<module>", "/job/t.py", 35), ("_try_get_data", f"{TORCH}/dataloader.py", 1291)],
                        "idx, data = self._get_data()",
                    ),
                    _thread(
                        [("_feed", f"{STD}/multiprocessing/queues.py", 231)],
                        main=False,
                        name="QueueFeederThread",
                    ),
                    # Python's name for torch's pin thread ("pt_data_pin" is its OS name)
                    _thread(
                        [("_pin_memory_loop", f"{TORCH}/_utils/pin_memory.py", 50)],
                        main=False,
                        name="Thread-1 (_pin_memory_loop)",
                    ),
                ],
            },
            {
                "role": "worker",
                "pid": 4711,
                "worker_id": 3,
                "loader_id": 0,
                "threads": [_thread([*FETCH, ("read_remote_shard", "/job/shards.py", 88)], "f.read()")],
            },
            {"role": "worker", "pid": 4712, "worker_id": 4, "loader_id": 0, "error": "no answer"},
        ]
    }
    lines = hang.lines(doc)
    assert lines == [
        "main thread (pid 100): waiting for a batch in _try_get_data, dataloader.py:1291 "
        "(from <module>, t.py:35)",
        "trainer (pid 100) thread Thread-1 (_pin_memory_loop): in _pin_memory_loop, pin_memory.py:50",
        "worker 3 (pid 4711): blocked in I/O in read_remote_shard, shards.py:88",
        "worker 4 (pid 4712): no answer",
    ]
    text = hang.render(doc)
    assert "== worker 3 (pid 4711)" in text and "      > f.read()" in text


# --- loader-stalled (diagnose/rules_hang.py) -----------------------------------------


def _stalled_job(
    workers, *, main=None, others=(), start_method="fork", pid=1000, run_id=None, rank=None, **ld_kw
):
    ld = loader(nw=len(workers) or 2, stalled_s=40.0, stall_threshold_s=10.0, in_next=True, **ld_kw)
    ld["start_method"] = start_method
    procs = [
        {
            "role": "trainer",
            "pid": pid,
            "threads": [
                main
                or _thread(
                    [("<module>", "/job/t.py", 35), ("_try_get_data", f"{TORCH}/dataloader.py", 1291)], ""
                ),
                *others,
            ],
        }
    ]
    for i, (frames, src) in enumerate(workers):
        procs.append(
            {
                "role": "worker",
                "pid": 5000 + i,
                "worker_id": i,
                "loader_id": 0,
                "in_fetch_s": 39.0,
                "threads": [_thread(frames, src)],
            }
        )
    doc = {"t": T0 - 30, "reason": "stall", "processes": procs}
    doc["summary"] = hang.summarize(doc)
    return job(pid, loaders=[ld], stacks=doc, run_id=run_id, rank=rank)


IO_WORKER = ([*FETCH, ("read_remote_shard", "/job/shards.py", 88)], "with open(path) as f:")
LOCK_WORKER = ([*FETCH, ("__getitem__", "/job/ds.py", 23)], "with LOCK:")
IDLE_WORKER = ([*WORKER_LOOP, ("get", f"{STD}/multiprocessing/queues.py", 113)], "")
USER_THREAD = _thread(
    [("refresh", "/job/cache.py", 30)], "time.sleep(60)", main=False, name="cache-refresher"
)


def _cause(jobs, **kw):
    h = get(evaluate(snap(jobs, **kw)), "loader-stalled")
    assert h["severity"] == "critical"
    return h


def test_a_worker_blocked_in_io_is_named_with_its_frame():
    h = _cause([_stalled_job([IO_WORKER, IDLE_WORKER])])
    ev = h["evidence"]
    assert ev["cause"] == "worker-blocked-io" and ev["stalled_s"] == 40.0 and ev["in_next"] is True
    assert "worker 0 (pid 5000) is blocked in I/O in read_remote_shard, shards.py:88" in h["message"]
    assert ev["workers_not_delivered"] == [
        {
            "id": 0,
            "pid": 5000,
            # 39 s when the stacks were gathered, 30 s before this snapshot: 69 s now.
            "in_fetch_s": 69.0,
            "kind": "io",
            "blocked_at": "read_remote_shard, shards.py:88",
        }
    ]
    assert ev["main_thread"].startswith("_try_get_data, dataloader.py:1291")
    assert "timeout" in h["suggestion"]


def test_a_lock_held_at_fork_by_a_trainer_thread_is_told_from_a_plain_lock():
    h = _cause([_stalled_job([LOCK_WORKER, IO_WORKER], others=[USER_THREAD])])
    assert h["evidence"]["cause"] == "fork-inherited-lock"
    assert "cache-refresher" in h["message"] and "spawn" in h["suggestion"]
    assert "also worker 1 (pid 5001) is blocked in I/O" in h["message"]
    plain = _cause([_stalled_job([LOCK_WORKER], start_method="spawn", others=[USER_THREAD])])
    assert plain["evidence"]["cause"] == "worker-blocked-lock"


def test_the_worker_the_loop_waits_for_comes_first_and_the_others_are_named_too():
    j = _stalled_job([LOCK_WORKER, IO_WORKER], others=[USER_THREAD])
    j["loaders"][0]["awaited_worker"] = 1
    h = _cause([j])
    ev = h["evidence"]
    assert ev["cause"] == "worker-blocked-io" and ev["causes"] == ["worker-blocked-io", "fork-inherited-lock"]
    assert ev["awaited_worker"] == 1
    assert "it waits for worker 1's batch; worker 1 (pid 5001) is blocked in I/O" in h["message"]
    assert "also worker 0 (pid 5000) waits on a lock" in h["message"] and "cache-refresher" in h["message"]
    assert (
        "timeout" in h["suggestion"]
        and "also start workers with multiprocessing_context='spawn'" in h["suggestion"]
    )


def test_the_awaited_worker_is_read_from_torchs_reorder_table():
    it = SimpleNamespace(_rcvd_idx=8, _task_info={8: (0,), 9: (1, "batch")})
    assert stall.awaited_worker(it) == 0
    it._task_info[8] = (0, "arrived")
    assert stall.awaited_worker(it) is None
    assert stall.awaited_worker(SimpleNamespace(_in_order=False, _rcvd_idx=8, _task_info={8: (0,)})) is None
    assert stall.awaited_worker(object()) is None


def test_a_full_dev_shm_and_a_dead_worker_come_first():
    assert _cause([_stalled_job([IDLE_WORKER])], shm_free=1 << 20)["evidence"]["cause"] == "shm-full"
    dead = _stalled_job([IO_WORKER])
    dead["loaders"][0]["worker_deaths"] = [{"id": 0, "pid": 5000, "signal": "SIGKILL"}]
    assert _cause([dead])["evidence"]["cause"] == "worker-died"


def _rank0_in_a_collective() -> dict:
    """Rank 0 of run "r" stalled: its workers idle, its loop in all_reduce."""
    coll = _thread(
        [("<module>", "/job/t.py", 40), ("all_reduce", "/v/site-packages/torch/distributed/c10d.py", 2)],
        "work.wait()",
    )
    r0 = _stalled_job([IDLE_WORKER, IDLE_WORKER], main=coll, run_id="r", rank=0, pid=1000)
    r0["loaders"][0]["in_next"] = False
    return r0


def test_idle_workers_while_the_loop_waits_in_a_collective_name_the_rank_that_ran_out():
    r0 = _rank0_in_a_collective()
    r1 = job(1001, loaders=[loader(batches=80, epoch_batches=[80])], run_id="r", rank=1)
    h = _cause([r0, r1])
    ev = h["evidence"]
    assert ev["cause"] == "uneven-ranks" and ev["main_thread_kind"] == "collective"
    assert ev["finished_ranks"][0]["rank"] == 1 and "rank 1 (pid 1001)" in h["message"]
    assert "drop_last" in h["suggestion"]
    alone = _stalled_job([IDLE_WORKER], main=_thread([("<module>", "/job/t.py", 40)], "save(model)"))
    alone["loaders"][0]["in_next"] = False
    assert _cause([alone])["evidence"]["cause"] == "loop-stuck"


def test_the_rank_a_shown_hint_names_as_finished_is_not_listed_as_judging():
    # A one-shot of the k2-fsa/snowfall#152 hang listed rank 1 ("no epoch
    # open") as judging beside the hint that names it, and watched the
    # judge cap to the end for an epoch that never begins.
    r0 = _rank0_in_a_collective()

    def judging_of(jobs):
        d = Diagnoser()
        hints = d.update(snap(jobs))
        return hints, {e["job_pid"]: e["reason"] for e in d.judging()}

    def finished():
        return job(
            1001, loaders=[loader(batches=80, epoch_batches=[80], epoch_open=False)], run_id="r", rank=1
        )

    hints, judging = judging_of([r0, finished()])
    assert get(hints, "loader-stalled")["evidence"]["finished_ranks"][0]["pid"] == 1001
    assert 1001 not in judging, judging
    # Without the hint that names it, the same rank has no verdict yet.
    assert "no epoch open" in judging_of([finished()])[1][1001]


def test_stacks_of_an_earlier_stall_are_not_this_ones_however_recent():
    # Fresh-clone run 72: on a loaded box rank 0's first batch came past the
    # epoch-start threshold (the loop in next(), its workers idle once they
    # answered); it trained 13 batches and hung in a collective, and that
    # first stall's stacks, seconds old, were read as the hang's.
    def rank0(stacks_at_batches):
        r0 = _stalled_job([IDLE_WORKER, IDLE_WORKER], run_id="r", rank=0, pid=1000, batches=13, epoch=0)
        ld = r0["loaders"][0]
        ld.update(in_next=False, stalled_s=2.0)
        r0["stacks"].update(t=T0 - 4.0, loaders=[{"id": 0, "epoch": 0, "batches": stacks_at_batches}])
        return r0

    r1 = job(1001, loaders=[loader(batches=12, epoch_batches=[12])], run_id="r", rank=1)
    earlier = _cause([rank0(5), r1])
    assert earlier["evidence"]["cause"] == "uneven-ranks" and earlier["evidence"]["lines"] == []
    assert "rank 1 (pid 1001) has finished its epoch" in earlier["message"]
    # Gathered for this stall (no batch since): they are its evidence.
    this = _cause([rank0(13), r1])
    assert this["evidence"]["cause"] == "workers-idle" and this["evidence"]["lines"]


def test_a_loop_without_workers_stuck_in_its_own_fetch():
    main = _thread(
        [("<module>", "/job/t.py", 9), ("__getitem__", "/job/ds.py", 12)], "with open(self.path) as f:"
    )
    j = _stalled_job([], main=main)
    j["loaders"][0]["num_workers"] = 0
    h = _cause([j])
    assert h["evidence"]["cause"] == "loop-fetch-blocked"
    assert "(num_workers=0) and that fetch is blocked in I/O in __getitem__, ds.py:12" in h["message"]


def test_no_stall_no_hint_and_old_stacks_are_not_evidence():
    calm = _stalled_job([IO_WORKER])
    calm["loaders"][0]["stalled_s"] = None
    assert "loader-stalled" not in ids(evaluate(snap([calm])))
    stale = _stalled_job([IO_WORKER])
    stale["stacks"]["t"] = T0 - 600
    h = _cause([stale])
    assert h["evidence"]["cause"] == "unknown" and h["evidence"]["lines"] == []


def test_the_stall_hides_the_window_rate_hints_of_its_loader():
    j = _stalled_job(
        [IO_WORKER], wait=0.9, worker_kw=dict(cpu=5.0, busy=1.0, fetch_ms=900.0), worker_ms=900.0
    )
    assert "io-bound" not in ids(evaluate(snap([j])))


# --- the cgroup's OOM counter, py-spy's dump, the recording's stacks file ---------------


def test_the_oom_kill_count_from_cgroup_v2_then_v1(tmp_path):
    assert oom.parse_oom_kill("low 0\nhigh 0\nmax 3\noom 2\noom_kill 1\n") == 1
    assert oom.parse_oom_kill("oom_kill_disable 0\nunder_oom 0\n") is None
    v2 = tmp_path / "job.scope"
    v2.mkdir()
    (v2 / "memory.events").write_text("oom 1\noom_kill 2\n")
    assert oom.oom_kills(str(v2)) == (2, "memory.events")
    v1 = tmp_path / "v1"
    v1.mkdir()
    (v1 / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 5\n")
    assert oom.oom_kills(str(v1)) == (5, "memory.oom_control")
    assert oom.oom_kills(None)[0] is None and "unknown" in oom.oom_kills(None)[1]
    directory, how = oom.cgroup_dir(os.getpid())
    assert (directory is None) == (how.startswith(("no ", "cannot")))


def test_py_spy_dump_in_the_jobs_format():
    dump = [
        {
            "thread_name": "MainThread",
            "thread_id": 1,
            "frames": [
                {"name": "read", "filename": "/job/shards.py", "line": 88},
                {"name": "<module>", "filename": "/job/t.py", "line": 3},
            ],
        },
        {"thread_name": None, "thread_id": 7, "os_thread_id": 4242, "frames": []},
    ]
    threads = threads_from_py_spy(dump)
    assert not threads[1]["main"]
    # py-spy often names no thread: the main one is the thread whose OS id is the pid.
    assert [t["name"] for t in threads_from_py_spy(dump, 4242) if t["main"]] == ["MainThread", "thread 7"]
    assert threads[0]["main"] and threads[0]["frames"] == [
        ["<module>", "/job/t.py", 3],
        ["read", "/job/shards.py", 88],
    ]
    assert threads[1]["name"] == "thread 7" and threads[1]["frames"] == []


def test_stacks_go_beside_the_recording():
    assert stacks_path("/r/run.jsonl.gz") == "/r/run.stacks.txt"
    assert stacks_path("run.jsonl") == "run.stacks.txt"


def test_the_loader_panel_draws_a_stall_and_deaths_and_survives_garbage():
    from dlwatch.tui import fmt
    from dlwatch.tui.loader import hang_text

    pal = fmt.DEFAULT_PALETTE
    stuck = {
        "role": "worker",
        "loader_id": 0,
        "kind": "io",
        "line": "worker 0 (pid 5): blocked in I/O in r, s.py:1",
    }
    other = {"role": "worker", "loader_id": 1, "kind": "io", "line": "worker 0 (pid 9): of another loader"}
    ld = {
        "id": 0,
        "stalled_s": 42.0,
        "stall_threshold_s": 10.0,
        "in_next": True,
        "job_stacks": {"summary": [stuck, other]},
        "worker_deaths": [{"id": 1, "pid": 6, "signal": "SIGKILL"}],
        "last_error": "RuntimeError: DataLoader worker (pid 6) is killed by signal: Killed.",
    }
    text = hang_text(ld, pal).plain.splitlines()
    assert text[0] == "STALLED: no batch for 42 s (threshold 10 s), inside next()"
    assert text[1] == "  worker 0 (pid 5): blocked in I/O in r, s.py:1" and "of another loader" not in str(
        text
    )
    assert text[2].startswith("✖ worker 1 (pid 6) was killed by SIGKILL")
    assert text[3].startswith("the loader raised RuntimeError: DataLoader worker (pid 6)")
    assert hang_text({"id": 0}, pal).plain == ""
    garbage = {
        "stalled_s": "x",
        "job_stacks": 7,
        "worker_deaths": [None, {"rss_first_bytes": "a", "rss_last_bytes": 3, "oom_kills": "n", "signal": 9}],
        "last_error": 5,
    }
    assert "worker ? (pid None) was killed by 9" in hang_text(garbage, pal).plain


def test_a_zombies_zero_rss_is_not_a_dead_workers_last_rss():
    # Killed, a worker is a zombie until torch reaps it, and /proc reads its
    # RSS as 0: the death keeps the last RSS the worker really had.
    from dlwatch.collect.jobs import JobConnection

    c = JobConnection(2929, "/nonexistent/2929.sock")
    c.track_rss(4712, 1 << 30, 10.0)
    c.track_rss(4712, 3 << 30, 250.0)
    c.track_rss(4712, 0, 251.0)
    assert c.worker_rss[4712] == (10.0, 1 << 30, 250.0, 3 << 30)


def _zombie(cmd: list[str], kill: bool = False):
    import subprocess
    import time

    p = subprocess.Popen(cmd)
    if kill:
        p.send_signal(signal.SIGKILL)
    end = time.monotonic() + 10
    while True:
        with open(f"/proc/{p.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                return p
        assert time.monotonic() < end
        time.sleep(0.02)


def test_a_gone_worker_that_exited_with_code_0_reads_as_done_not_as_a_crash():
    # A worker that finished its share (uneven partitions in a barrier hang)
    # is a zombie with exit status 0 until the loader reaps it: before, its
    # line read "the worker has exited or died", as a crash would.
    from dlwatch.collect.hang import complete

    done, killed = _zombie(["true"]), _zombie(["sleep", "30"], kill=True)
    try:
        doc = {
            "processes": [
                {
                    "role": "worker",
                    "pid": p.pid,
                    "worker_id": i,
                    "loader_id": 0,
                    "error": "the worker has exited or died",
                }
                for i, p in enumerate((done, killed))
            ]
        }
        out = complete(doc, py_spy=False, sample_s=0.0)
    finally:
        done.wait()
        killed.wait()
    text = "\n".join(s["line"] for s in out["summary"])
    assert "worker 0" in text and "exited (its share done): exit code 0" in text, text
    assert "the worker has exited or died: killed by SIGKILL" in text, text
    # Once reaped there is no evidence left: the channel's words stay.
    again = complete(doc, py_spy=False, sample_s=0.0)
    assert all("exited or died" in s["line"] for s in again["summary"])


def _exit_with(code: int) -> None:
    os._exit(code)


def test_a_reaped_worker_that_exited_with_code_0_reads_as_done_in_the_jobs_own_answer():
    # Reaped already (torch's is_alive() check): only the Process object
    # keeps the code; 0 is a finished share, anything else stays as it was.
    import multiprocessing as mp

    from dlwatch.probe.stack_request import gone_text

    ctx = mp.get_context("fork")
    done, failed = ctx.Process(target=_exit_with, args=(0,)), ctx.Process(target=_exit_with, args=(3,))
    for p in (done, failed):
        p.start()
        p.join()
    assert gone_text(done) == "exited (its share done): exit code 0"
    assert gone_text(failed) == "the worker has exited or died"
    assert gone_text(None) == "the worker has exited or died"


def test_a_thread_fed_loop_is_stalled_by_its_own_wait_in_get_not_its_feeders_epoch():
    # The loop's wait is its consumer's (handover.py): a producer that returned
    # early closed the feeder's epoch while the loop sat in q.get() for good.
    w = stall.StallWatch(floor_s=2.0)
    st = _st()
    last = _steady(w, st, period=0.1)
    dead_feeder = threading.Thread(target=lambda: None)
    dead_feeder.start()
    dead_feeder.join()
    st.thread_ident = dead_feeder.ident
    st.consumer = SimpleNamespace(thread_ident=threading.get_ident(), t_enter=last + 0.5, t_last=last + 0.4)
    st.epoch_t0 = 0.0  # the feeder's epoch has ended
    quiet = w.check([st], last + 2.0)[0]
    assert quiet["stalled_s"] is None and quiet["in_next"] is True  # the loop is in get()
    got = w.check([st], last + 3.0)[0]
    assert got["stalled_s"] == pytest.approx(2.6) and got["in_next"] and got["feeder_alive"] is False
    # The loop stepping (its wait closed): no stall, whatever the feeder does.
    st.consumer.t_last = last + 2.9
    got = w.check([st], last + 3.0)[0]
    assert got["stalled_s"] is None and got["in_next"] is False and "feeder_alive" not in got
    # A live feeder: said alive.
    st.consumer.t_enter, st.thread_ident = last + 2.95, threading.get_ident()
    assert w.check([st], last + 10.0)[0]["feeder_alive"] is True


def test_a_loop_whose_feeder_ended_is_told_so_before_the_workers_exception():
    j = _stalled_job([IDLE_WORKER])
    ld = j["loaders"][0]
    ld.update(feeder_alive=False, in_next=True, iterated_on={"thread": "producer", "main": False})
    ld["consumer"] = {"thread": "MainThread", "main": True, "via": "queue.Queue"}
    ld["worker_deaths"] = [{"id": 0, "pid": 5000, "exception": "ValueError: corrupt sample 2400"}]
    h = _cause([j])
    assert h["evidence"]["cause"] == "feeder-gone", h
    assert (
        "the queue.Queue that thread 'producer' fills, and that thread has ended, on worker 0's "
        in h["message"]
    )
    assert "sentinel" in h["suggestion"] and "is_alive()" in h["suggestion"]
    # Without the feeder's end: the worker raised (it lives on), it did not die.
    ld["feeder_alive"] = None
    h = _cause([j])
    assert (
        h["evidence"]["cause"] == "worker-raised" and "raised ValueError: corrupt sample 2400" in h["message"]
    )


def _pipeline_stall(worker_thread, *, feeder=None):
    """A loader whose workers are threads of the trainer (torchdata.nodes,
    Grain), or with num_workers=0 behind a feeder thread, stalled with the
    loop in next() and the other thread's stack in the summary."""
    loop = _thread(
        [
            ("<module>", "/job/t.py", 35),
            ("get", f"{STD}/queue.py", 171),
            ("wait", f"{STD}/threading.py", 327),
        ],
        "",
    )
    j = _stalled_job([], main=loop, others=[worker_thread])
    ld = j["loaders"][0]
    ld["workers"] = []
    if feeder is None:
        ld.update(num_workers=2, worker_kind="thread")
        ld["pipeline_workers"] = [
            {"kind": "thread", "tid": 777, "cpu_percent": 0.0},
            {"kind": "thread", "tid": 778},
        ]
    else:
        ld.update(num_workers=0, iterated_on={"thread": feeder, "main": False})
        ld["consumer"] = {"thread": "MainThread", "main": True, "via": "queue.Queue"}
    worker_thread["tid"] = 777
    j["stacks"]["summary"] = hang.summarize(j["stacks"])
    return j


def test_a_pipelines_worker_thread_blocked_on_a_lock_is_the_cause_not_unknown():
    # A QA run: "Thread-2 (_apply_udf): blocked on a lock in sample, qa.py:41"
    # in the summary, and the cause read "unknown".
    udf = _thread(
        [("_apply_udf", "/v/site-packages/torchdata/nodes/map.py", 60), ("sample", "/job/qa.py", 41)],
        "with LOCK:",
        main=False,
        name="Thread-2 (_apply_udf)",
    )
    h = _cause([_pipeline_stall(udf)])
    assert h["evidence"]["cause"] == "worker-blocked-lock", h
    assert (
        "worker thread 'Thread-2 (_apply_udf)' (tid 777) waits on a lock in sample, qa.py:41" in h["message"]
    )
    slow = _thread([("sample", "/job/qa.py", 39)], "time.sleep(60)", main=False, name="grain-prefetch_0")
    h = _cause([_pipeline_stall(slow)])
    assert h["evidence"]["cause"] == "worker-stuck", h
    assert "worker thread 'grain-prefetch_0' (tid 777) is in sample, qa.py:39" in h["message"]


def test_num_workers_0_behind_a_feeder_thread_names_the_feeders_fetch_not_the_loops_get():
    # A QA run: "the loop loads its own batches … waits on a lock in
    # Condition.wait" (the loop's q.get()) and advice about DataLoader(timeout).
    producer = _thread(
        [("produce", "/job/qa.py", 70), ("__getitem__", "/job/qa_lib.py", 26)],
        "with LOCK:",
        main=False,
        name="producer",
    )
    h = _cause([_pipeline_stall(producer, feeder="producer")])
    assert h["evidence"]["cause"] == "feeder-fetch-blocked", h
    assert (
        "thread 'producer' loads the batches (num_workers=0) and its fetch waits on a lock in __getitem__"
        in (h["message"])
    )


def test_a_pipeline_worker_process_waiting_on_its_thread_pool_is_named_by_the_thread_that_works():
    """Grain's mp_prefetch worker: its main thread waits for a ReadOptions
    thread's future; the thread asleep in the user's map is the worker's
    line (a QA run: "blocked on a lock in Condition.wait")."""
    waits = [
        *GRAIN_WORKER,
        ("PrefetchDatasetIterator.__next__", f"{GRAIN}/dataset/transformations/prefetch.py", 264),
        ("Future.result", f"{STD}/concurrent/futures/_base.py", 451),
        ("Condition.wait", f"{STD}/threading.py", 327),
    ]
    works = [
        ("_worker", f"{STD}/concurrent/futures/thread.py", 83),
        ("MapMapDataset._map_element", f"{GRAIN}/dataset/transformations/map.py", 161),
        ("load", "/job/t.py", 9),
    ]
    proc = {
        "role": "worker",
        "pid": 4711,
        "worker_id": 0,
        "loader_id": 1,
        "threads": [
            _thread(waits, "waiter.acquire()"),
            _thread([("_feed", f"{STD}/multiprocessing/queues.py", 231)], main=False, name="QueueFeeder"),
            _thread(works, "time.sleep(3600)", main=False, name="grain-prefetch_0"),
        ],
    }
    (e,) = hang.summarize({"processes": [proc]})
    assert e["line"] == "worker 0 (pid 4711) thread grain-prefetch_0: sleeping in load, t.py:9"
    assert e["kind"] == hang.SLEEP and e["thread"] == "grain-prefetch_0"
    # Without such a thread the main thread's own line stays.
    proc["threads"] = proc["threads"][:2]
    (e,) = hang.summarize({"processes": [proc]})
    assert e["thread"] == "MainThread" and e["kind"] == hang.LOCK


QUEUE_WORKER = (
    [*FETCH, ("__iter__", "/job/ds.py", 11), ("get", f"{STD}/multiprocessing/queues.py", 103)],
    "res = self._recv_bytes()",
)


def _native(src: str = "x = db.execute(q)", func: str = "__getitem__") -> tuple:
    return ([*FETCH, (func, "/job/ds.py", 19)], src)


def _asleep_at_first_fetch(j: dict, *ids: int) -> dict:
    """Workers ``ids`` asleep at 0 % CPU in their first fetch (the process
    sample the snapshot carries)."""
    ld = j["loaders"][0]
    ld["workers"] = [
        {"id": i, "pid": 5000 + i, "cpu_percent": 0.0, "state": "sleeping", "batches": 0} for i in ids
    ]
    return j


def test_a_worker_waiting_on_its_own_queue_is_told_to_send_every_reader_its_item():
    h = _cause([_stalled_job([QUEUE_WORKER, IDLE_WORKER])])
    assert h["evidence"]["cause"] == "worker-waits-on-queue", h
    assert "worker 0 (pid 5000) waits in a queue's get()" in h["message"]
    assert "one end-of-data sentinel per worker" in h["suggestion"]


def test_a_native_block_beside_an_idle_sibling_is_no_inherited_pool():
    """pyg-team/pytorch_geometric#8661: worker 0 keeps a sqlite write
    transaction open; worker 1 waits in sqlite at its first fetch. Not a
    pool copied at fork (which stops every worker alike)."""
    j = _asleep_at_first_fetch(_stalled_job([IDLE_WORKER, _native()]), 1)
    h = _cause([j])
    assert h["evidence"]["cause"] == "worker-blocked-native", h
    assert "worker 0 (pid 5000) is idle: a lock one worker took and kept" in h["message"]
    assert "sqlite" in h["suggestion"]
    both = _asleep_at_first_fetch(_stalled_job([_native(), _native()]), 0, 1)
    assert _cause([both])["evidence"]["cause"] == "fork-inherited-pool"


def test_a_tokenizers_pool_copied_at_fork_is_told_its_own_switch():
    """huggingface/tokenizers#187: OMP_NUM_THREADS=1 does not help there."""
    tok = _native("enc = tok.encode_batch(list(batch))", "Collate.__call__")
    h = _cause([_asleep_at_first_fetch(_stalled_job([tok, tok]), 0, 1)])
    assert h["evidence"]["cause"] == "fork-inherited-pool"
    assert (
        h["suggestion"].startswith("TOKENIZERS_PARALLELISM=false")
        and "OMP_NUM_THREADS=1" not in h["suggestion"]
    )


@pytest.mark.parametrize(
    "death, start_method, want",
    [
        ({"signal": "SIGKILL", "oom_kills": 1, "oom_kills_at_start": 0}, "fork", "the memory limit"),
        ({"signal": "SIGBUS"}, "fork", "a SIGBUS is most often /dev/shm running out"),
        ({"signal": "SIGSEGV"}, "fork", "PYTHONFAULTHANDLER=1"),
        ({"signal": "SIGKILL", "oom_kills": 0, "oom_kills_at_start": 0}, "fork", "SIGKILL came from outside"),
        ({"exit_code": 1}, "spawn", "could not, most often, unpickle the dataset"),
        ({"exit_code": 1}, "fork", "the worker's error is in the job's output"),
    ],
)
def test_the_step_after_a_death_follows_what_the_record_shows(death, start_method, want):
    j = _stalled_job([IDLE_WORKER], start_method=start_method)
    j["loaders"][0]["worker_deaths"] = [{"id": 0, "pid": 5000, "signal": None, "exception": None, **death}]
    j["loaders"][0]["batches_total"] = 0
    h = _cause([j])
    assert h["evidence"]["cause"] == "worker-died" and want in h["suggestion"], h["suggestion"]


def test_worker_init_fn_raising_is_no_sample_and_a_fired_timeout_is_not_advised_again():
    text = (
        "Caught FileNotFoundError in DataLoader worker process 0.\n"
        "Original Traceback (most recent call last):\n"
        '  File "w.py", line 306, in _worker_loop\n    init_fn(worker_id)\n'
        "FileNotFoundError: no shard\n"
    )
    out: list[dict] = []
    deaths.from_error(SimpleNamespace(_workers=[], _shutdown=False), RuntimeError(text), out)
    assert out[0]["exception"] == "FileNotFoundError: no shard (in worker_init_fn)"
    j = _stalled_job([IDLE_WORKER])
    j["loaders"][0]["worker_deaths"] = out
    assert _cause([j])["suggestion"].startswith("worker_init_fn raised (no sample yet)")
    t = _stalled_job([IO_WORKER])
    t["loaders"][0]["last_error"] = "RuntimeError: DataLoader timed out after 6 seconds"
    s = _cause([t])["suggestion"]
    assert "DataLoader(timeout=" not in s and "timeout has fired already" in s


def test_a_read_that_runs_on_a_cpu_is_not_called_blocked_in_io():
    # A QA run: nodes' threads decoding page-cached JPEGs read "blocked in
    # I/O in JpegImageFile.load_read" beside a hint calling them CPU-bound.
    t = _thread([*FETCH, ("read_shard", "/job/shards.py", 88)], "with open(path) as f:", main=True)
    assert hang.thread_line(dict(t, cpu_percent=92.0, state="R"), "worker") == (
        "reading, on a CPU (92 % CPU), in read_shard, shards.py:88"
    )
    assert hang.thread_line(dict(t, state="R"), "worker").startswith("reading, on a CPU")
    assert hang.thread_line(dict(t, cpu_percent=1.0, state="S"), "worker") == (
        "blocked in I/O in read_shard, shards.py:88"
    )
    assert hang.thread_line(t, "worker") == "blocked in I/O in read_shard, shards.py:88"


FUTURE_WORKER = (
    [
        *FETCH,
        ("__getitem__", "/job/ds.py", 18),
        ("result", f"{STD}/concurrent/futures/_base.py", 451),
        ("wait", f"{STD}/threading.py", 327),
    ],
    "waiter.acquire()",
)
POOL_THREAD = _thread(
    [("_worker", f"{STD}/concurrent/futures/thread.py", 81)], "", main=False, name="ThreadPoolExecutor-0_0"
)


@pytest.mark.parametrize(
    ("start_method", "others", "worker_threads", "want"),
    [
        ("fork", [POOL_THREAD], [], "fork-inherited-executor"),
        # The trainer's pool is named even beside a thread of the user's.
        ("fork", [USER_THREAD, POOL_THREAD], [], "fork-inherited-executor"),
        # A pool that started in the worker has its threads there (Grain's
        # mp_prefetch worker): the wait is that pool's.
        ("fork", [POOL_THREAD], ["ThreadPoolExecutor-1_0"], None),
        # Spawned workers copy nothing; no thread in the trainer, no pool to copy.
        ("spawn", [POOL_THREAD], [], None),
        ("fork", [], [], None),
    ],
)
def test_a_future_only_the_trainers_pool_would_complete_is_an_executor_copied_by_fork(
    start_method, others, worker_threads, want
):
    """datachain-ai/datachain#691 (fsspec's IO loop), a dataset's
    ThreadPoolExecutor: read "waits on a lock: find who holds that lock"."""
    j = _stalled_job([FUTURE_WORKER, FUTURE_WORKER], others=others, start_method=start_method)
    for proc in j["stacks"]["processes"]:
        if proc["role"] == "worker":
            proc["threads"] += [
                _thread([("run", f"{STD}/threading.py", 9)], "", False, n) for n in worker_threads
            ]
    j["stacks"]["summary"] = hang.summarize(j["stacks"])
    h = _cause([j])
    if want is None:
        assert h["evidence"]["cause"] != "fork-inherited-executor", h
        return
    assert h["evidence"]["cause"] == want, h
    assert "worker 0 (pid 5000) waits for a future in" in h["message"], h["message"]
    assert "(ThreadPoolExecutor-0_0)" in h["message"] and "cache-refresher" not in h["message"], h["message"]
