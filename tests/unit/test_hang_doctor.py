"""The hang doctor of issue 42, its pure parts on recorded evidence: py-spy's
threads in place of a worker's channel error, a call blocked in C told from
one that runs, the cause classes (a pool or lock inherited across fork, a
barrier whose partner never comes, I/O that never returns, a finished rank),
figures live at the snapshot's time, the ranks of a job started by
``torch.multiprocessing.spawn``, and no load or thread advice beside a stall.

The py-spy dumps in tests/data/pyspy/dump_*.json were taken with
``py-spy dump --json --nonblocking`` from a DataLoader worker of each
tests/jobs/hang_jobs.py mode while it hung; dump_py310_threads.json from a
Python 3.10 process (its main thread asleep in C, two threads in
``time.sleep``, one named ``dlwatch-x``), with py-spy 0.4.3.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dlwatch.collect import hang as collect_hang
from dlwatch.collect import ptrace, spy
from dlwatch.diagnose import engine, evaluate, hang, rules_hang
from dlwatch.diagnose.engine import DiagnoseState, HintTrack, diagnose, quiet_beside_stall
from dlwatch.diagnose.facts import build_context
from dlwatch.probe import identity

from .test_diagnose_rules import T0, get, ids, job, loader, snap
from .test_hang import FETCH, IDLE_WORKER, STD, TORCH, _stalled_job, _thread

PYSPY = Path(__file__).resolve().parent.parent / "data" / "pyspy"


def _dump(name: str) -> tuple[int, list]:
    doc = json.loads((PYSPY / f"dump_{name}.json").read_text())
    return doc["pid"], doc["dump"]


def _main(threads: list[dict]) -> dict:
    return next(t for t in threads if t["main"])


# --- py-spy's answer in place of the channel's error --------------------------------------


def test_a_worker_blocked_in_c_holding_the_gil_reads_from_py_spy_as_blocked_in_c():
    pid, dump = _dump("native_lock")
    threads = collect_hang.threads_from_py_spy(dump, pid)
    # dlwatch's own stack watcher is left out, as the job leaves it out.
    assert not any(t["name"].startswith("dlwatch-") for t in threads)
    main = _main(threads)
    assert main["frames"][-1][0] == "_NativeLock.take_keeping_the_gil" and main["tid"] == pid
    assert main["active"] is False and main["owns_gil"] is True  # asleep in C, the GIL held
    assert hang.wait_kind(main, "worker") == hang.NATIVE
    doc = {
        "processes": [
            {
                "role": "worker",
                "pid": pid,
                "worker_id": 0,
                "loader_id": 0,
                "channel_error": "no answer within 1.5 s",
                "via": "py-spy",
                "threads": threads,
            }
        ]
    }
    [entry] = hang.summarize(doc)
    assert entry["kind"] == "native" and entry["via"] == "py-spy"
    assert entry["line"] == (
        f"worker 0 (pid {pid}): blocked in C (idle to py-spy) in _NativeLock.take_keeping_the_gil, "
        "hang_jobs.py:127"
    )
    text = hang.render(doc)
    assert f"== worker 0 (pid {pid}) (read by py-spy from outside)" in text
    assert "  thread MainThread (main) (idle to py-spy):" in text


def test_a_python_310_jobs_main_thread_gets_the_processs_os_id_from_py_spy():
    # py-spy 0.4 reads no OS thread ids from a Python 3.10 process and calls
    # every thread active (this dump: the main thread asleep in C, two
    # threads in time.sleep). The main thread's id is the process's, so
    # /proc can still say it sleeps; the others stay without one.
    pid, dump = _dump("py310_threads")
    assert all(t["os_thread_id"] is None and t["active"] is True for t in dump)
    threads = collect_hang.threads_from_py_spy(dump, pid)
    assert [(t["name"], t["main"], t.get("tid")) for t in threads] == [
        ("MainThread", True, pid),
        ("user", False, None),
    ]
    # A process that never imported threading has no names either: its one
    # thread not started by threading is the main one.
    anonymous = [dict(t, thread_name=None) for t in dump]
    by_root = collect_hang.threads_from_py_spy(anonymous, pid)
    assert [(t["main"], t.get("tid"), t["frames"][0][0]) for t in by_root][0] == (True, pid, "<module>")
    assert sum(t["main"] for t in by_root) == 1
    # Two threads not started by threading: which is main is not guessed.
    two_roots = [dict(t, thread_name=None, frames=t["frames"][:1]) for t in dump]
    assert not any(t["main"] or "tid" in t for t in collect_hang.threads_from_py_spy(two_roots, pid))


def test_stacks_come_before_an_error_and_an_error_without_stacks_still_says_why():
    pid, dump = _dump("fifo_read")
    threads = collect_hang.threads_from_py_spy(dump, pid)
    both = {"role": "worker", "pid": pid, "worker_id": 1, "loader_id": 0, "threads": threads, "error": "x"}
    [entry] = hang.summarize({"processes": [both]})
    assert entry["kind"] == "io" and "read_remote_shard" in entry["line"] and "x" not in entry["line"]
    bare = {"role": "worker", "pid": 7, "worker_id": 2, "loader_id": 0, "error": "the worker has exited"}
    assert hang.lines({"processes": [bare]}) == ["worker 2 (pid 7): the worker has exited"]
    assert hang.render({"processes": [bare]}) == ["worker 2 (pid 7): the worker has exited"]


@pytest.mark.parametrize(
    "name, want",
    [("barrier", hang.BARRIER), ("fifo_read", hang.IO), ("omp", hang.RUNNING)],
)
def test_recorded_dumps_say_what_the_worker_waits_on(name, want):
    pid, dump = _dump(name)
    main = _main(collect_hang.threads_from_py_spy(dump, pid))
    # Without py-spy's idle flag and /proc's figures, a plain call is "running" ...
    assert hang.wait_kind({k: v for k, v in main.items() if k != "active"}, "worker") == want
    if want == hang.RUNNING:
        # ... and at 0 % CPU, asleep, it is blocked in C (the OpenMP pool's futex).
        off = {**main, "active": None, "state": "S", "cpu_percent": 0.0}
        assert hang.wait_kind(off, "worker") == hang.NATIVE
        busy = {**main, "active": None, "state": "R", "cpu_percent": 97.0}
        assert hang.wait_kind(busy, "worker") == hang.RUNNING


def test_libraries_that_read_are_io_and_a_deep_data_queue_wait_is_the_queue():
    fs = _thread(
        [*FETCH, ("__getitem__", "/job/ds.py", 9), ("cat_file", "/v/site-packages/fsspec/spec.py", 3)]
    )
    assert hang.wait_kind(fs, "worker") == hang.IO
    wds = _thread([*FETCH, ("url_opener", "/v/site-packages/webdataset/tariterators.py", 60)])
    assert hang.wait_kind(wds, "worker") == hang.IO
    # Decoding a shard's JPEG under webdataset's autodecode is PIL's work, not
    # a read (a QA run of OpenCLIP's webdataset loader read "blocked in I/O").
    dec = [*FETCH, ("__call__", "/v/site-packages/webdataset/autodecode.py", 420)]
    dec += [("decode", "/v/site-packages/PIL/ImageFile.py", 300)]
    assert hang.wait_kind(_thread(dec), "worker") == hang.RUNNING
    own = [
        *FETCH,
        ("decode", "/v/site-packages/webdataset/autodecode.py", 420),
        ("loads", f"{STD}/json/__init__.py", 3),
    ]
    assert hang.wait_kind(_thread(own), "worker") == hang.RUNNING
    # The loop's get, nine frames above a worker's fd hand-over (resource_sharer).
    deep = [("<module>", "/job/t.py", 9), ("_try_get_data", f"{TORCH}/dataloader.py", 1291)]
    deep += [(f"f{i}", f"{STD}/multiprocessing/connection.py", i) for i in range(9)]
    assert hang.wait_kind(_thread(deep), "trainer") == hang.QUEUE


@pytest.fixture
def gil_held_in_c():
    """A process whose main thread sleeps in a C call that keeps the GIL."""
    code = "import ctypes, sys\nprint('ready', flush=True)\nctypes.PyDLL(None).sleep(30)\n"
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    time.sleep(0.2)
    yield p
    p.kill()
    p.wait()


def test_complete_replaces_the_channels_error_with_py_spys_threads_and_their_cpu(gil_held_in_c):
    pid = gil_held_in_c.pid
    if spy.find() is None or not ptrace.check(pid).allowed:
        pytest.skip("py-spy cannot read a process here")
    doc = {
        "t": time.time(),
        "pid": os.getpid(),  # the job: the worker is its child
        "processes": [
            {"role": "worker", "pid": pid, "worker_id": 0, "loader_id": 0, "error": "no answer within 1.5 s"}
        ],
    }
    out = collect_hang.complete(doc, sample_s=0.3)
    assert doc["processes"][0].get("threads") is None  # a new document, the old one untouched
    proc = out["processes"][0]
    assert "error" not in proc and proc["channel_error"] == "no answer within 1.5 s"
    assert proc["via"] == "py-spy"
    main = _main(proc["threads"])
    assert main["state"] == "S" and main["cpu_percent"] < hang.NATIVE_CPU_MAX
    [entry] = out["summary"]
    assert entry["kind"] == "native"
    assert entry["line"].startswith(f"worker 0 (pid {pid}): blocked in C (0 % CPU, sleeping) in <module>")


def test_only_the_jobs_own_processes_are_read_from_outside(gil_held_in_c):
    """The job names the processes to read; one outside its tree (here a
    sibling of the "job": another child of the test) is never read."""
    other = subprocess.Popen(["sleep", "30"])
    try:
        doc = {
            "pid": other.pid,
            "processes": [{"role": "worker", "pid": gil_held_in_c.pid, "worker_id": 0, "error": "no answer"}],
        }
        proc = collect_hang.complete(doc, sample_s=0.0)["processes"][0]
    finally:
        other.kill()
        other.wait()
    assert not proc.get("threads") and "via" not in proc
    assert (
        proc["error"] == f"no answer; not read: PID {gil_held_in_c.pid} is not a process of job {other.pid}"
    )
    assert collect_hang.in_tree(gil_held_in_c.pid, os.getpid())
    assert not collect_hang.in_tree(os.getpid(), None)


def test_a_py_spy_that_misses_the_python_version_once_is_asked_again(gil_held_in_c, monkeypatch, tmp_path):
    # py-spy's version heuristic now and then misses on a Python process
    # (pyenv's 3.10): the first dump here fails as it did there, the second
    # is the real py-spy's.
    pid = gil_held_in_c.pid
    real = spy.find()
    if real is None or not ptrace.check(pid).allowed:
        pytest.skip("py-spy cannot read a process here")
    flaky = tmp_path / "py-spy"
    flaky.write_text(
        "#!/bin/sh\n"
        f"if [ ! -e {tmp_path}/missed ]; then touch {tmp_path}/missed\n"
        "  echo 'Error: Failed to find python version from target process' >&2; exit 1; fi\n"
        f'exec {real} "$@"\n'
    )
    flaky.chmod(0o755)
    monkeypatch.setattr(spy, "find", lambda: str(flaky))
    out = collect_hang._from_outside(pid, "worker", "no answer")
    assert (tmp_path / "missed").exists() and "error" not in out and out["via"] == "py-spy"
    assert _main(out["threads"])["frames"]  # the real dump's main thread, frames and all


def test_a_stalls_unanswered_workers_are_read_side_by_side_each_into_its_own_entry(monkeypatch):
    # One after the other, a stall of many workers blocked in C took a dump's
    # time per worker, past what a one-shot snapshot waits on a loaded box.
    code = "import ctypes\nprint('ready', flush=True)\nctypes.PyDLL(None).sleep(30)\n"
    procs = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(3)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        if spy.find() is None or not ptrace.check(procs[0].pid).allowed:
            pytest.skip("py-spy cannot read a process here")
        read_pids: list[int] = []
        real = collect_hang._from_outside
        # Side by side: each read waits here until all three have begun. One
        # after the other, the first would wait alone and break the barrier.
        # (Comparing the reads' start and end times failed on a loaded box:
        # a dump took 22 ms and the third thread was scheduled 40 µs after
        # the first one's end, fresh-clone run 78.)
        met = threading.Barrier(len(procs))

        def side_by_side(pid: int, role: str, why: str) -> dict:
            read_pids.append(pid)
            met.wait(timeout=30)
            return real(pid, role, why)

        monkeypatch.setattr(collect_hang, "_from_outside", side_by_side)
        gone = 2**22 + 7
        doc = {
            "pid": os.getpid(),
            "processes": [
                {"role": "worker", "pid": p.pid, "worker_id": i, "error": f"no answer from {i}"}
                for i, p in enumerate(procs)
            ]
            + [{"role": "worker", "pid": gone, "worker_id": 3, "error": "no answer from 3"}],
        }
        out = collect_hang.complete(doc, sample_s=0)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    read, dead = out["processes"][:3], out["processes"][3]
    for i, (entry, p) in enumerate(zip(read, procs)):
        assert (
            entry["pid"] == p.pid
            and entry["via"] == "py-spy"
            and entry["channel_error"] == f"no answer from {i}"
        )
        # its own process's dump: its one thread is the process's main thread
        assert [(t.get("tid"), t["main"]) for t in entry["threads"]] == [
            (p.pid, True)
        ] and "error" not in entry
    assert dead["error"] == "no answer from 3" and "via" not in dead
    assert sorted(read_pids) == sorted(p.pid for p in procs) and met.n_waiting == 0 and not met.broken


def test_a_process_py_spy_cannot_read_keeps_the_channels_error_with_why():
    doc = {"processes": [{"role": "worker", "pid": 2**22 + 7, "worker_id": 0, "error": "no answer"}]}
    out = collect_hang.complete(doc, sample_s=0)
    assert out["processes"][0]["error"] == "no answer" and out["summary"][0]["line"].endswith("no answer")


# --- the cause classes ----------------------------------------------------------------------

NATIVE_WORKER = ([*FETCH, ("Matmuls.__getitem__", "/job/ds.py", 101)], "return (y @ y).sum()")
BARRIER_WORKER = (
    [
        *FETCH,
        ("Partitions.__iter__", "/job/ds.py", 165),
        ("Barrier.wait", f"{STD}/threading.py", 701),
        ("Condition.wait", f"{STD}/multiprocessing/synchronize.py", 268),
    ],
    "return self._wait_semaphore.acquire(True, timeout)",
)
FS_WORKER = (
    [*FETCH, ("__getitem__", "/job/ds.py", 9), ("cat_file", "/v/site-packages/fsspec/spec.py", 3)],
    "",
)


def _off_cpu(j: dict, batches: int = 0) -> dict:
    """The snapshot's sample of every worker: asleep at 0 % CPU."""
    for w in j["loaders"][0]["workers"]:
        w.update(cpu_percent=0.0, state="sleeping", batches=batches)
    return j


def _hint(j: dict | list, t: float = T0) -> dict:
    return get(evaluate(snap(j if isinstance(j, list) else [j], t=t)), "loader-stalled")


def test_a_pool_inherited_across_fork_blocks_a_new_workers_first_call_at_zero_cpu():
    j = _off_cpu(_stalled_job([NATIVE_WORKER, NATIVE_WORKER]))
    h = _hint(j)
    ev = h["evidence"]
    assert ev["cause"] == "fork-inherited-pool" and set(ev["causes"]) == {"fork-inherited-pool"}
    assert (
        "worker 0 (pid 5000) is blocked in C at 0 % CPU, asleep, in Matmuls.__getitem__, ds.py:101"
        in (h["message"])
    )
    assert (
        "OMP_NUM_THREADS=1" in h["suggestion"]
        and "torch.set_num_threads(1) in worker_init_fn" in (h["suggestion"])
    )
    assert "'spawn' or 'forkserver'" in h["suggestion"]
    assert {w["kind"] for w in ev["workers_not_delivered"]} == {"native"}
    assert all("blocked in C (0 % CPU, sleeping)" in x for x in ev["lines"] if x.startswith("worker"))


def test_blocked_in_c_under_spawn_or_after_batches_is_not_called_inherited():
    spawned = _off_cpu(_stalled_job([NATIVE_WORKER], start_method="spawn"))
    assert _hint(spawned)["evidence"]["cause"] == "worker-blocked-native"
    later = _off_cpu(_stalled_job([NATIVE_WORKER]), batches=40)
    assert _hint(later)["evidence"]["cause"] == "worker-blocked-native"
    # ... unless a thread of the user's ran in the trainer when it forked (a native lock it held).
    holder = _thread(
        [("hold_forever", "/job/cache.py", 12)], "time.sleep(60)", main=False, name="native-cache"
    )
    held = _off_cpu(_stalled_job([NATIVE_WORKER], others=[holder]), batches=40)
    h = _hint(held)
    assert h["evidence"]["cause"] == "fork-inherited-pool" and "native-cache" in h["message"]
    # A held lock is released by no thread count: a fresh interpreter comes first.
    assert h["suggestion"].startswith("start the workers with multiprocessing_context='spawn'"), h
    assert "only after the workers have forked" in h["suggestion"]


def test_a_busy_worker_in_a_plain_call_is_stuck_in_its_fetch_not_blocked_in_c():
    j = _stalled_job([NATIVE_WORKER])
    j["loaders"][0]["workers"][0].update(cpu_percent=99.0, state="running", batches=0)
    h = _hint(j)
    assert h["evidence"]["cause"] == "worker-stuck" and "has been in one fetch for" in h["message"]


def test_a_barrier_whose_partner_never_arrives():
    h = _hint(_stalled_job([BARRIER_WORKER, IDLE_WORKER]))
    ev = h["evidence"]
    assert ev["cause"] == "barrier-partner-missing"
    assert (
        "worker 0 (pid 5000) waits at a barrier in Condition.wait, synchronize.py:268 (from "
        "Partitions.__iter__, ds.py:165) for a partner that does not arrive; 1 other worker is idle"
    ) in h["message"]
    assert "drop_last=True" in h["suggestion"] and "timeout" in h["suggestion"] and "Join" in h["suggestion"]
    # The loop itself at a barrier, every worker idle.
    main = _thread([("<module>", "/job/t.py", 40), ("Barrier.wait", f"{STD}/threading.py", 701)], "")
    loop = _stalled_job([IDLE_WORKER], main=main)
    loop["loaders"][0]["in_next"] = False
    assert _hint(loop)["evidence"]["cause"] == "barrier-partner-missing"


def test_io_that_never_returns_asks_for_a_timeout_and_a_retry():
    h = _hint(_stalled_job([FS_WORKER]))
    assert h["evidence"]["cause"] == "worker-blocked-io" and "cat_file, spec.py:3" in h["message"]
    assert "timeout" in h["suggestion"] and "retry" in h["suggestion"]


def _ranks(rank1, master1="127.0.0.1:29500"):
    coll = _thread(
        [("<module>", "/job/t.py", 40), ("all_reduce", "/v/site-packages/torch/distributed/c10d.py", 2)],
        "work.wait()",
    )
    r0 = _stalled_job([IDLE_WORKER], main=coll, run_id="127.0.0.1:29500", rank=0)
    r0["loaders"][0]["in_next"] = False
    r0["master"] = "127.0.0.1:29500"
    r1 = job(1001, loaders=[loader(batches=12)], run_id="127.0.0.1:29500", rank=rank1, master=master1)
    return [r0, r1]


def test_a_finished_rank_is_named_by_its_rank_or_its_pid_never_rank_none():
    h = _hint(_ranks(1))
    assert h["evidence"]["cause"] == "uneven-ranks"
    assert "rank 1 (pid 1001) has finished its epoch" in h["message"]
    assert "DistributedSampler(drop_last=True)" in h["suggestion"] and "Join" in h["suggestion"]
    unknown = _hint(_ranks(None))
    assert "; pid 1001 has finished its epoch" in unknown["message"] and "rank None" not in unknown["message"]
    # Another run (another rendezvous) is not this run's finished rank.
    other = _hint(_ranks(1, master1="10.0.0.9:29500"))
    assert other["evidence"]["finished_ranks"] == [] and "finished" not in other["message"]


def test_a_rank_stopped_or_gone_is_named_as_what_the_collective_waits_for():
    # A QA run paused rank 1 with SIGSTOP: rank 0's hint said only that its
    # main thread "does not return", while the view listed rank 1 as stopped.
    r0, r1 = _ranks(1)
    r1.update(state="unreachable", state_reason="the process is stopped (SIGSTOP or Ctrl-Z)")
    h = _hint([r0, r1])
    assert h["evidence"]["cause"] == "peer-rank-down", h
    assert "rank 1 (pid 1001) is unreachable (the process is stopped (SIGSTOP or Ctrl-Z))" in h["message"]
    assert "kill -CONT" in h["suggestion"] and "--max-restarts" in h["suggestion"]
    r1.update(state="exited", state_reason="the process has exited")
    assert "rank 1 (pid 1001) has exited: the loop waits in" in _hint([r0, r1])["message"]
    # Inside next() the loop waits for its own loader, not for a collective.
    r0["loaders"][0]["in_next"] = True
    assert _hint([r0, r1])["evidence"]["cause"] != "peer-rank-down"


def test_a_rank_watched_alone_says_where_the_finished_one_is_named():
    # `dlwatch snapshot --pid` of the waiting rank: its partner is not in view.
    (r0, _r1) = _ranks(1)
    r0["world_size"] = 2
    h = _hint(r0)
    assert h["evidence"]["cause"] == "uneven-ranks" and h["evidence"]["finished_ranks"] == []
    assert "1 of the run's 2 ranks is in view" in h["message"] and "without --pid" in h["message"], h
    # Both in view: the finished one is named, not the note.
    both = _ranks(1)
    both[0]["world_size"] = both[1]["world_size"] = 2
    h = _hint(both)
    assert "rank 1 (pid 1001) has finished its epoch" in h["message"] and "in view" not in h["message"]


# --- every figure live at the snapshot's time ----------------------------------------------


def test_the_fetch_age_grows_with_the_stall_not_frozen_at_the_gathering():
    j = _stalled_job([([*FETCH, ("__getitem__", "/job/ds.py", 9)], "x = decode(raw)")])
    j["loaders"][0]["workers"][0].update(cpu_percent=95.0, state="running")
    now = _hint(j, T0)
    later = _hint(j, T0 + 10)  # the stacks were taken at T0 - 30 with 39 s in the fetch
    assert now["evidence"]["workers_not_delivered"][0]["in_fetch_s"] == 69.0
    assert later["evidence"]["workers_not_delivered"][0]["in_fetch_s"] == 79.0
    assert "in one fetch for 69 s" in now["message"] and "in one fetch for 79 s" in later["message"]
    assert rules_hang.live_in_fetch({"in_fetch_s": 5.0}, None, T0) == 5.0


# --- ranks from torch.distributed ------------------------------------------------------------


def test_ranks_come_from_torch_distributed_once_initialised_whatever_started_the_process(tmp_path):
    """In a process of its own (a process group is process-wide): no RANK
    in the environment, init_process_group(rank=0, world_size=1) over tcp."""
    code = textwrap.dedent(
        """
        import json, os, socket
        for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID"):
            os.environ.pop(k, None)
        import torch.distributed as dist
        from dlwatch.probe import identity
        before = identity.job_identity()
        job = dict(before)
        learned_before = identity.learn_ranks(job)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        learned = identity.learn_ranks(job)
        again = identity.learn_ranks(job)
        print(json.dumps({"before": before, "learned_before": learned_before, "learned": learned,
                          "again": again, "job": job, "port": port, "fresh": identity.job_identity()}))
        dist.destroy_process_group()
        """
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert (out["before"]["rank"], out["before"]["world_size"]) == (None, None)
    assert out["learned_before"] is False and out["learned"] is True and out["again"] is False
    where = f"127.0.0.1:{out['port']}"
    for ident in (out["job"], out["fresh"]):
        assert (ident["rank"], ident["local_rank"], ident["world_size"]) == (0, 0, 1)
        assert ident["master"] == where and ident["run_id"] == where


def test_no_process_group_no_rank_and_never_an_exception():
    assert identity.dist_identity() is None or "rank" in identity.dist_identity()
    job = {"rank": 3, "world_size": 4}
    assert identity.learn_ranks(job) is False and job == {"rank": 3, "world_size": 4}


# --- no load or thread advice beside a stall ------------------------------------------------


def _oversub(pid: int, lid: int | None, rid: str = "worker-thread-oversubscription") -> dict:
    return {"id": rid, "severity": "warn", "job_pid": pid, "loader_id": lid, "message": "m", "evidence": {}}


def test_the_advice_about_a_stalled_loaders_idle_workers_is_quiet_and_others_stay():
    stalled = _stalled_job([IDLE_WORKER], pid=1000)
    calm = job(2000, loaders=[loader(pid_base=6000)])
    s = snap([stalled, calm])
    ctx = build_context(s, engine.stateless_phases(s))
    fired = {
        ("worker-thread-oversubscription", 1000, 0): _oversub(1000, 0),
        ("worker-thread-oversubscription", 2000, 0): _oversub(2000, 0),
        ("idle-workers", 1000, 0): _oversub(1000, 0, "idle-workers"),
        ("worker-memory-growth", 1000, 0): _oversub(1000, 0, "worker-memory-growth"),
        ("loader-stalled", 1000, 0): _oversub(1000, 0, "loader-stalled"),
    }
    host = _oversub(None, None, "workers-oversubscribe-cores")  # type: ignore[arg-type]
    fired[("workers-oversubscribe-cores", None, None)] = host
    quiet = quiet_beside_stall(fired, ctx)
    assert quiet == {("worker-thread-oversubscription", 1000, 0), ("idle-workers", 1000, 0)}
    # The host-wide hint goes when every loader it is about is stalled.
    host["evidence"] = {"recommended_num_workers_by_loader": [{"job_pid": 1000, "loader_id": 0}]}
    assert ("workers-oversubscribe-cores", None, None) in quiet_beside_stall(fired, ctx)
    alone = snap([stalled])
    only = quiet_beside_stall(
        {("workers-oversubscribe-cores", None, None): _oversub(None, None, "workers-oversubscribe-cores")},  # type: ignore[arg-type]
        build_context(alone, engine.stateless_phases(alone)),
    )
    assert only == {("workers-oversubscribe-cores", None, None)}
    assert (
        quiet_beside_stall(fired, build_context(snap([calm]), engine.stateless_phases(snap([calm])))) == set()
    )


def test_a_hint_on_screen_before_the_stall_goes_at_once_and_the_stall_shows_at_once():
    key = ("worker-thread-oversubscription", 1000, 0)
    shown = HintTrack(on_since=T0 - 60, off_since=None, shown=True, hint=_oversub(1000, 0))
    state = DiagnoseState(time=T0 - 0.5, hints={key: shown})
    hints, new = diagnose(snap([_stalled_job([IDLE_WORKER], pid=1000)]), state)
    assert "worker-thread-oversubscription" not in ids(hints) and key not in new.hints
    assert ids(hints) == {"loader-stalled"}  # no HOLD_ON_S wait: the probe's threshold was the hold


# --- recordings keep the completed stacks too ------------------------------------------------


def test_a_recording_writes_the_stacks_as_sent_then_as_completed_by_py_spy(tmp_path):
    from dlwatch.record.recorder import Recorder

    pid, dump = _dump("native_lock")
    raw = {
        "t": T0,
        "reason": "stall",
        "processes": [{"role": "worker", "pid": pid, "worker_id": 0, "loader_id": 0, "error": "no answer"}],
    }
    raw["summary"] = hang.summarize(raw)
    done = dict(raw, completed=True)
    done["processes"] = [
        {**raw["processes"][0], "threads": collect_hang.threads_from_py_spy(dump, pid), "via": "py-spy"}
    ]
    del done["processes"][0]["error"]
    rec = Recorder(str(tmp_path / "run.jsonl"), monitor=None, interval=1.0, window_s=1.0)  # type: ignore[arg-type]
    try:
        for st in (raw, raw, done, done):
            rec._keep_stacks({"jobs": [{"pid": 1000, "stacks": st}]})
    finally:
        rec._out.close()
    text = (tmp_path / "run.stacks.txt").read_text()
    assert text.count("=== job 1000 at ") == 2
    assert "(stall)\n" in text and "(stall, completed by py-spy)\n" in text
    assert f"worker 0 (pid {pid}): no answer" in text
    assert f"== worker 0 (pid {pid}) (read by py-spy from outside)" in text


def test_a_stopped_worker_is_the_cause_not_every_worker_idle():
    # A QA run: kill -STOP of one of a MONAI script's DataLoader workers while
    # its feeder thread wrote a batch to the result pipe; the stall read
    # "every worker is idle" (cause workers-idle), the stacks "idle".
    j = _off_cpu(_stalled_job([IDLE_WORKER, IDLE_WORKER], awaited_worker=1))
    j["loaders"][0]["workers"][1]["state"] = "stopped"
    h = _hint(j)
    ev = h["evidence"]
    assert ev["cause"] == "worker-stopped", ev
    assert "worker 1 (pid 5001) is stopped (SIGSTOP, ctrl-Z in its terminal, or a debugger" in h["message"]
    assert h["suggestion"].startswith("resume it: kill -CONT 5001"), h["suggestion"]
    line = next(x for x in ev["lines"] if "5001" in x)
    assert "stopped (SIGSTOP or a debugger); where it stopped:" in line, line
    # py-spy's own reads stop a process for an instant ("tracing-stop"): no evidence.
    j["loaders"][0]["workers"][1]["state"] = "tracing-stop"
    assert _hint(j)["evidence"]["cause"] != "worker-stopped"


def test_a_stopped_worker_before_the_stall_is_named_and_hides_the_count_advice():
    ld = loader(nw=2, wait=0.7, step_ms=20.0)
    ld["workers"][0]["state"] = "stopped"
    ld["workers"][0]["cpu_percent"] = 0.0
    hints = evaluate(snap([job(loaders=[ld])], usable=2.0, other_cpu_cores=0.5))
    h = get(hints, "worker-stopped")
    assert h["severity"] == "critical", h
    assert h["message"].startswith("Loader 0 of PID 1000: worker 0 (pid "), h["message"]
    assert "the loop waits for data 70 % of the time." in h["message"]
    assert h["suggestion"].startswith("resume it: kill -CONT ")
    assert not set(ids(hints)) & rules_hang.QUIET_WHILE_STALLED, ids(hints)
    ld["workers"][0]["state"] = "sleeping"
    assert "worker-stopped" not in ids(evaluate(snap([job(loaders=[ld])], usable=2.0)))
