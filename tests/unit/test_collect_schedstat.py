"""Run-queue wait from /proc: starved processes show it, sleeping ones do not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dlwatch.collect import schedstat
from dlwatch.collect.schedstat import SchedSampler, parse_schedstat, read_process

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_parse():
    assert parse_schedstat("123 456 7\n") == (123, 456)
    assert parse_schedstat("") is None
    assert parse_schedstat("x y z") is None


def test_missing_process_is_none():
    assert read_process(2**22 + 12345) is None
    assert SchedSampler().sample([2**22 + 12345]) == {2**22 + 12345: None}


@pytest.mark.skipif(
    not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"), reason="kernel without schedstat"
)
def test_oversubscribed_spinners_wait_in_the_run_queue_and_a_sleeper_does_not():
    cores = len(os.sched_getaffinity(0))
    # Pin 3 spinners per core onto one core: each runs a third of the time.
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    # The sleeper says when it sleeps: its interpreter start-up (CPU, and
    # run-queue wait on a loaded box) must not fall inside the sampled second.
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sleeper.stdout.readline().strip() == "ready"
        one = {sorted(os.sched_getaffinity(0))[0]}
        for p in spinners:
            os.sched_setaffinity(p.pid, one)
        s = SchedSampler()
        pids = [p.pid for p in spinners] + [sleeper.pid]
        s.sample(pids)
        time.sleep(1.5)
        out = s.sample(pids)
    finally:
        for p in spinners + [sleeper]:
            p.kill()
            p.wait()
    waits = [out[p.pid] for p in spinners]
    # Three on one core: about 2/3 of each one's time is spent waiting.
    assert all(w is not None and w > 30 for w in waits), (waits, cores)
    assert out[sleeper.pid] is not None and out[sleeper.pid] < 5


def test_thread_list_is_reused_and_a_changed_list_starts_a_new_baseline(tmp_path):
    clock = [100.0]
    task = tmp_path / "7" / "task"

    def thread(tid: str, run: int, wait: int) -> None:
        (task / tid).mkdir(parents=True, exist_ok=True)
        (task / tid / "schedstat").write_text(f"{run} {wait} 5\n")

    thread("7", 10, 1_000_000_000)
    s = SchedSampler(clock=lambda: clock[0], proc=str(tmp_path))
    assert s.sample([7]) == {7: None}  # first sight
    clock[0] += 1.0
    thread("7", 10, 1_500_000_000)
    assert s.sample([7]) == {7: 50.0}  # half a second of waiting in one second
    # A new thread with a long past: not listed until the list is due again,
    # and then its wait does not land in one interval.
    thread("8", 10, 9_000_000_000)
    clock[0] += 1.0
    thread("7", 10, 2_000_000_000)
    assert s.sample([7]) == {7: 50.0}
    clock[0] += schedstat.TIDS_EVERY_S
    assert s.sample([7]) == {7: None}
    clock[0] += 1.0
    thread("8", 10, 9_250_000_000)
    assert s.sample([7]) == {7: 25.0}


def test_a_young_process_first_sight_gives_its_lifetime_wait(tmp_path):
    # A DataLoader worker that lives under a second never gets a second
    # sample: given its age, the first sight averages its wait over its life.
    task = tmp_path / "9" / "task" / "9"
    task.mkdir(parents=True)
    (task / "schedstat").write_text("10 200000000 5\n")  # 0.2 s waited
    s = SchedSampler(clock=lambda: 50.0, proc=str(tmp_path))
    assert s.sample([9], young={9: 0.4}) == {9: 50.0}
    fresh = SchedSampler(clock=lambda: 50.0, proc=str(tmp_path))
    assert fresh.sample([9], young={9: 0.05}) == {9: None}  # too young: tick-granular noise
    assert fresh.sample([9]) == {9: None}  # no age: first sight as before
