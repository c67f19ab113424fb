"""A PID that is no dlwatch job, named for what it is, with the PID to use
(collect/whose.py): real processes, a synthetic set of job PIDs."""

from __future__ import annotations

import os
import pwd
import subprocess
import sys
import time

import pytest

from dlwatch.collect import whose
from tests.e2e_util import shell_and_child


@pytest.fixture
def tree():
    """A shell (the wrapper) and its child (the job)."""
    with shell_and_child() as pids:
        yield pids


def test_a_wrappers_pid_names_the_job_below_it(tree):
    wrapper, job = tree
    kind, why = whose.explain(wrapper, {job}, "/run/d")
    assert kind == whose.WRAPPER
    assert why.startswith(f"PID {wrapper} is not a dlwatch job: it started the job {job} ")
    assert f"use --pid {job}" in why


def test_a_launchers_pid_names_each_job_below_it_with_its_rank():
    # torchrun's PID: which --pid is which rank (a QA run: "use --pid 20587 or
    # --pid 20588" and no more). RANK comes from each job's environment.
    import psutil

    launcher = subprocess.Popen(
        ["sh", "-c", "RANK=0 sleep 30 & RANK=1 sleep 30 & wait"], env=dict(os.environ)
    )
    try:
        # Until both children have exec'd sleep: a child forked but not yet
        # exec'd still has the shell's environment, without RANK (beside the
        # loaded parallel tier the test once read it so: KeyError '1').
        ranks: dict = {}
        for _ in range(500):
            kids = psutil.Process(launcher.pid).children()
            try:
                ranks = {k.environ().get("RANK"): k.pid for k in kids}
            except psutil.Error:
                ranks = {}
            if set(ranks) == {"0", "1"}:
                break
            time.sleep(0.01)
        kind, why = whose.explain(launcher.pid, set(ranks.values()), "/run/d")
    finally:
        for k in psutil.Process(launcher.pid).children():
            k.kill()
        launcher.kill()
        launcher.wait()
    assert kind == whose.WRAPPER
    first, second = sorted(ranks.values())
    want = {ranks["0"]: "rank 0", ranks["1"]: "rank 1"}
    assert f"use --pid {first} ({want[first]}) or --pid {second} ({want[second]})" in why, why


def test_a_workers_pid_names_its_job(tree):
    job, worker = tree
    kind, why = whose.explain(worker, {job}, "/run/d")
    assert kind == whose.WORKER and f"it is a process of job {job}" in why and f"use --pid {job}" in why


def test_a_process_without_the_hook_a_process_not_pythons_and_a_gone_one(tree):
    _, sleep = tree
    py = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        kind, why = whose.explain(py.pid, set(), "/run/d")
    finally:
        py.kill()
        py.wait()
    assert kind == whose.NOT_HOOKED and why.startswith(f"PID {py.pid} is not instrumented by dlwatch")
    assert "dlwatch ls" in why
    # A new user's `--pid 1` (a container's process_api) read "a job started
    # … without the hook".
    kind, why = whose.explain(sleep, set(), "/run/d")
    assert kind == whose.NOT_HOOKED and why.startswith(f"PID {sleep} (sleep) is not a Python process"), why
    gone = subprocess.Popen(["true"])
    gone.wait()
    kind, why = whose.explain(gone.pid, set(), "/run/d")
    assert kind == whose.GONE and why == f"no dlwatch job with PID {gone.pid} in /run/d"


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a process as another user")
def test_another_users_process_says_whose_it_is():
    def as_nobody():
        os.setgroups([])
        os.setgid(65534)
        os.setuid(65534)

    p = subprocess.Popen(["sleep", "30"], preexec_fn=as_nobody)
    try:
        kind, why = whose.explain(p.pid, set(), "/tmp/dlwatch-0")
    finally:
        p.kill()
        p.wait()
    name = pwd.getpwuid(65534).pw_name
    assert kind == whose.OTHER_USER
    assert why.startswith(f"PID {p.pid} runs as user {name}, and dlwatch shows each user only their own jobs")
    assert f"run dlwatch as {name}" in why
