"""dlwatch's own threads inside a job are left out of what the rules read
(issue 43): the probe lists their native ids (a worker's in its shared row,
the trainer's by name), the monitor subtracts them from thread counts, CPU
and run-queue wait. Real threads of this process, real /proc."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from dlwatch import own_threads, wire
from dlwatch.collect.monitor import Monitor
from dlwatch.collect.procs import ProcSampler
from dlwatch.collect.schedstat import SchedSampler
from dlwatch.probe import publisher, worker
from dlwatch.probe.worker_row import OWN_TIDS, claim_tid, read_own_tids, release_tid


class Spinner:
    """A thread that burns CPU until stopped; its native id and CPU seconds."""

    def __init__(self, name: str = "spinner", native: bool = False) -> None:
        """``native``: named in the kernel too, as dlwatch names its threads."""
        self.native = native
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.cpu_s = 0.0
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()
        self.ready.wait()
        self.tid = self.thread.native_id

    def _run(self) -> None:
        if self.native:
            own_threads.set_native_name(self.thread.name)
        self.ready.set()
        while not self.stop.is_set():
            sum(range(2000))
            self.cpu_s = time.thread_time()

    def join(self) -> None:
        self.stop.set()
        self.thread.join()


# CPU seconds a spinner runs before the process is sampled: a share of the
# interval that a figure must visibly leave out. Waited for rather than a
# fixed 0.6 s: beside the parallel tier two spinners on one GIL got 18 %
# of a core each over 0.6 s (fresh-clone run 76, against a 20 % bar). Not
# much less than that: the spinner runs on while the sample reads /proc
# (0.07 s here), CPU its figure counts and the interval does not.
SPUN_S = 0.5


def until_spun(spin: Spinner, since: float = 0.0, timeout: float = 30.0) -> None:
    """Until the spinner has run SPUN_S of CPU past ``since`` (its cpu_s)."""
    end = time.monotonic() + timeout
    while spin.cpu_s < since + SPUN_S and time.monotonic() < end:
        time.sleep(0.05)
    ran = spin.cpu_s - since
    assert ran >= SPUN_S, f"the spinner ran {ran:.3f} s of CPU in {timeout:.0f} s"


def test_own_threads_are_left_out_of_the_thread_count_and_cpu():
    pid = os.getpid()
    plain, aware = ProcSampler(), ProcSampler()
    plain.sample([pid])
    aware.sample([pid], own_tids={pid: []})
    # Born after the first sample: all of its CPU is in the next interval.
    spin = Spinner("dlwatch-test-spinner")
    try:
        until_spun(spin)
        a = plain.sample([pid])[pid]
        b = aware.sample([pid], own_tids={pid: [spin.tid]})[pid]
    finally:
        spin.join()
    assert b["own_threads"] == 1 and a["own_threads"] == 0
    assert b["threads"] == a["threads"] - 1
    # The spinner's CPU (most of the process's: the test thread sleeps) is gone
    # from the figure; the two samples are a few microseconds apart.
    spun = spin.cpu_s / a["cpu_interval_s"] * 100
    assert a["cpu_percent"] - b["cpu_percent"] > 0.6 * spun, (a, b, spun)


def _comm(tid: int) -> str:
    with open(f"/proc/self/task/{tid}/comm") as f:
        return f.read().strip()


def test_dlwatch_threads_carry_their_name_in_the_kernel():
    started = threading.Event()
    stop = threading.Event()

    def body(x: int) -> None:
        started.set()
        stop.wait(10)

    t = own_threads.start(body, "dlwatch-worker-sampler", (1,))
    user = Spinner("dlwatch-looking-user-thread")  # a Python name only
    try:
        started.wait(5)
        assert t.daemon and t.name == "dlwatch-worker-sampler"
        # 15 bytes: what ps -L, top -H and py-spy show.
        assert _comm(t.native_id) == "dlwatch-worker-"
        assert _comm(user.tid) != "dlwatch-looking"
        found = own_threads.find()
        assert t.native_id in found and user.tid not in found and os.getpid() not in found
    finally:
        stop.set()
        user.join()
        t.join()
    # Never the main thread: its name is the process's.
    assert own_threads.set_native_name("dlwatch-main") is False
    assert _comm(os.getpid()) != "dlwatch-main"


def named_thread_left_out() -> None:
    """The scenario of the test below, in a process whose threads are all
    its own."""
    pid = os.getpid()
    s = ProcSampler()
    first = s.sample([pid])[pid]
    assert first["own_threads"] == 0
    spin = Spinner("dlwatch-test-named", native=True)
    user = Spinner("user-thread")
    try:
        until_spun(spin)
        got = s.sample([pid])[pid]
        # Their CPU up to the sample, not up to the joins below (a loaded box
        # can hold one spinner up while the other runs on).
        ours, theirs = (t.cpu_s / got["cpu_interval_s"] * 100 for t in (spin, user))
        named = s.named_own()
    finally:
        spin.join()
        user.join()
    assert named == {pid: frozenset({spin.tid})}
    assert got["own_threads"] == 1
    # The user's thread is the job's: counted.
    assert got["threads"] == first["threads"] + 1, (first, got)
    # Born after the first sample: all of the named spinner's CPU is left
    # out, the user's spinner's stays (they share the cores; the main thread
    # sleeps).
    assert abs(got["cpu_percent"] - theirs) < 0.4 * ours, (got["cpu_percent"], theirs, ours)
    # join() returns before the kernel has dropped the thread's task (the
    # README run of 2026-11-30 sampled it still there): gone first, then sampled.
    end = time.monotonic() + 10
    while {spin.tid, user.tid} & {int(t) for t in os.listdir("/proc/self/task")} and time.monotonic() < end:
        time.sleep(0.01)
    after = s.sample([pid])[pid]
    assert after["own_threads"] == 0 and s.named_own() == {}


def test_a_named_thread_is_left_out_before_any_frame_lists_it():
    # A burst's sampler starts in a worker; the frame listing its id comes a
    # moment later. Sampled in between, the worker's figures leave it out
    # already (fresh-clone run 62: "4 threads" for two snapshots, not 3).
    # In a fresh interpreter: in the test runner's process, threads left by
    # earlier tests (a pool's, collected mid-test) end or run between the
    # two samples, and the counts and CPU below are exact about threads.
    code = "from tests.unit.test_never_perturb import named_thread_left_out as f; f()"
    root = Path(__file__).resolve().parents[2]
    p = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]


def test_an_own_thread_seen_late_starts_a_baseline_not_a_dip():
    # Its id arrives with a frame after it has run for a while: its past CPU
    # is not subtracted from one interval (the figure would drop to 0). Each
    # figure is set against this process's own CPU over its interval
    # (time.process_time, every thread), each interval holding SPUN_S of the
    # spinner's: not a bar over fixed windows, which load can starve.
    pid = os.getpid()
    spin = Spinner("dlwatch-test-late")
    s = ProcSampler()
    own = {pid: [spin.tid]}
    try:
        s.sample([pid])
        until_spun(spin)  # its past, before its id is known
        s.sample([pid])
        p0, c0 = time.process_time(), spin.cpu_s
        until_spun(spin, since=c0)
        late = s.sample([pid], own_tids=own)[pid]
        p1, c1 = time.process_time(), spin.cpu_s
        until_spun(spin, since=c1)
        after = s.sample([pid], own_tids=own)[pid]
        p2, c2 = time.process_time(), spin.cpu_s
    finally:
        spin.join()

    def cpu_s(figure: dict) -> float:
        return figure["cpu_percent"] * figure["cpu_interval_s"] / 100.0

    # Slack: /proc's 10 ms ticks and the CPU run between a sample's read and
    # the clock read after it; the spinner's share of each interval is 0.5 s.
    slack = 0.1
    # Its first interval as ours still counts its CPU: the process's all.
    assert abs(cpu_s(late) - (p1 - p0)) < slack, (late, p1 - p0, c1 - c0)
    # From the next one it is left out: the process's CPU less the spinner's.
    assert abs(cpu_s(after) - ((p2 - p1) - (c2 - c1))) < slack, (after, p2 - p1, c2 - c1)


def test_ids_that_are_not_threads_of_the_process_change_nothing():
    pid = os.getpid()
    s = ProcSampler()
    # This process's own threads may come and go meanwhile (an xdist worker's,
    # a thread left by an earlier test ending: fresh-clone run 21): the count
    # sampled is the one between the two reads.
    before = len(os.listdir(f"/proc/{pid}/task"))
    got = s.sample([pid], own_tids={pid: [pid, 2**22 + 17]})[pid]
    after = len(os.listdir(f"/proc/{pid}/task"))
    assert got["own_threads"] == 0
    assert min(before, after) <= got["threads"] <= max(before, after), (before, got["threads"], after)


def test_run_queue_wait_of_own_threads_is_left_out(tmp_path):
    clock = [100.0]
    task = tmp_path / "7" / "task"

    def thread(tid: str, wait: int) -> None:
        (task / tid).mkdir(parents=True, exist_ok=True)
        (task / tid / "schedstat").write_text(f"10 {wait} 5\n")

    thread("7", 1_000_000_000)
    thread("9", 1_000_000_000)  # ours: a burst's sampler waiting for a core
    s = SchedSampler(clock=lambda: clock[0], proc=str(tmp_path))
    own = {7: [9]}
    assert s.sample([7], own) == {7: None}
    clock[0] += 1.0
    thread("7", 1_250_000_000)
    thread("9", 1_900_000_000)
    assert s.sample([7], own) == {7: 25.0}
    # The sampler ends (no longer listed): the sum changes, a new baseline.
    clock[0] += 1.0
    assert s.sample([7], {}) == {7: None}


def test_a_worker_lists_its_own_threads_in_its_row():
    slots = worker.make_slots(2)
    row = worker.as_int64_view(slots)
    base = worker.NFIELDS  # worker 1's row
    got: list[int] = []

    def ours() -> None:
        i = claim_tid(row, base)
        got.append(i)
        got.append(threading.get_native_id())

    t = threading.Thread(target=ours)
    t.start()
    t.join()
    tid = got[1]
    assert read_own_tids(row, base) == [tid] and read_own_tids(row, 0) == []
    workers = worker.read_workers(row, worker.as_float64_view(slots), 2, time.perf_counter_ns())
    assert workers[1]["own_tids"] == [tid] and "own_tids" not in workers[0]
    wire.validate(wire.window(1, 1.0, 1, [], {"own_tids": [tid]}))
    release_tid(row, got[0])
    assert read_own_tids(row, base) == []
    # A full row: the thread stays uncounted-as-ours, never an error.
    for _ in range(OWN_TIDS):
        row[claim_tid(row, base)] = 1
    assert claim_tid(row, base) == -1


def test_the_trainer_lists_its_dlwatch_named_threads():
    spin = Spinner("dlwatch-test-trainer")
    other = Spinner("user-thread")
    try:
        tids = publisher.own_tids()
    finally:
        spin.join()
        other.join()
    assert spin.tid in tids and other.tid not in tids


def test_the_monitor_reads_own_ids_from_the_last_frame_and_drops_junk():
    frame = {
        "main": {"own_tids": [11, "x", True, -3]},
        "loaders": [
            {"workers": [{"pid": 20, "own_tids": [21, 22]}, {"pid": 30}, {"pid": None, "own_tids": [5]}]}
        ],
    }
    live = SimpleNamespace(live=True, frames=[{"main": {"own_tids": [1]}, "loaders": []}, frame], pid=10)
    gone = SimpleNamespace(live=False, frames=[frame], pid=40)
    assert Monitor._own_tids([live, gone]) == {10: [11], 20: [21, 22]}


def test_a_stopped_publisher_is_gone_and_the_next_iterator_starts_a_new_one(tmp_path, monkeypatch):
    # A process that hosts one job after another (this test runner): each
    # has its publisher in its own runtime directory, and none outlives it.
    first, second = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("DLWATCH_DIR", str(first))
    publisher.ensure_started()
    pub = publisher.current()
    assert pub is not None and pub.path is not None and os.path.exists(pub.path)
    thread = pub._thread
    publisher.stop()
    assert publisher.current() is None and not os.path.exists(pub.path)
    assert thread is not None and not thread.is_alive()
    # Its thread, which would have rebound in the first directory once it
    # was deleted, has ended; the next iterator's publisher is in the second.
    monkeypatch.setenv("DLWATCH_DIR", str(second))
    publisher.ensure_started()
    try:
        new = publisher.current()
        assert new is not None and new is not pub and os.path.dirname(new.path) == str(second)
    finally:
        publisher.stop()
