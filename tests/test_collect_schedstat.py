"""Run-queue wait from /proc: starved processes show it, sleeping ones do not."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from dlwatch.collect.schedstat import SchedSampler, parse_schedstat, read_process

SPIN = "import time\nend = time.time() + 30\nwhile time.time() < end: pass\n"


def test_parse():
    assert parse_schedstat("123 456 7\n") == (123, 456)
    assert parse_schedstat("") is None
    assert parse_schedstat("x y z") is None


def test_missing_process_is_none():
    assert read_process(2 ** 22 + 12345) is None
    assert SchedSampler().sample([2 ** 22 + 12345]) == {2 ** 22 + 12345: None}


@pytest.mark.skipif(not os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/schedstat"),
                    reason="kernel without schedstat")
def test_oversubscribed_spinners_wait_in_the_run_queue_and_a_sleeper_does_not():
    cores = len(os.sched_getaffinity(0))
    # Pin 3 spinners per core onto one core: each runs a third of the time.
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(3)]
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
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
