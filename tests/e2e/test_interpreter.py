"""The probe across the interpreter's life: exit, os._exit, fork, Ctrl-C,
abandoned iterators, and the frameworks that create loaders for the user
(Lightning, Accelerate) with ``import dlwatch.hook`` as the only change.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlwatch.collect import process_group
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.monitor import Monitor, take_snapshot
from tests.e2e_util import dlwatch, short_tmpdir

HERE = Path(__file__).resolve().parent.parent
SCEN = HERE / "jobs" / "fault_scenarios.py"
FRAMEWORKS = HERE / "jobs" / "fault_frameworks.py"
MONITOR = HERE / "jobs" / "fault_monitor.py"


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class Proc:
    """A scenario subprocess with its own runtime dir; reads its stdout lines."""

    def __init__(
        self,
        script: Path,
        *args: str,
        disable: bool = False,
        env: dict | None = None,
        new_session: bool = False,
    ) -> None:
        self.dir = short_tmpdir()
        e = dict(os.environ, DLWATCH_DIR=self.dir, PYTHONUNBUFFERED="1")
        e.pop("DLWATCH_DISABLE", None)
        if disable:
            e["DLWATCH_DISABLE"] = "1"
        e.update(env or {})
        self.p = subprocess.Popen(
            [sys.executable, str(script), *args],
            env=e,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=new_session,
            # A job in a session of its own stands for one started at a
            # terminal, where Ctrl-C's SIGINT is not ignored; a suite started
            # in the background (`cmd &` in a script) hands its children
            # SIGINT and SIGQUIT ignored, and such a job never sees Ctrl-C.
            preexec_fn=_default_sigint if new_session else None,
            cwd=str(HERE.parent),
        )
        self.pid = self.p.pid

    def line(self, prefix: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            r, _, _ = select.select([self.p.stdout], [], [], max(0.0, left))
            if not r:
                raise AssertionError(f"no '{prefix}' line within {timeout} s")
            text = self.p.stdout.readline()
            if not text:
                err = self.p.stderr.read() if self.p.poll() is not None else ""
                raise AssertionError(f"job ended before '{prefix}': {err[-3000:]}")
            if text.startswith(prefix):
                return text[len(prefix) :].strip()

    def json_line(self, prefix: str, timeout: float = 60.0) -> dict:
        return json.loads(self.line(prefix, timeout))

    def sock(self, pid: int | None = None) -> str:
        return os.path.join(self.dir, f"{pid or self.pid}.sock")

    def finish(self, timeout: float = 60.0) -> tuple[int, str, str]:
        out, err = self.p.communicate(timeout=timeout)
        return self.p.returncode, out, err

    def cleanup(self) -> None:
        if self.p.poll() is None:
            try:
                if _is_leader(self.pid):
                    process_group.kill(self.pid)
                else:
                    self.p.kill()
            except ProcessLookupError:
                pass
            self.p.wait()
        import shutil

        shutil.rmtree(self.dir, ignore_errors=True)


def _is_leader(pid: int) -> bool:
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def wait_path(path: str, present: bool = True, timeout: float = 10.0) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path) == present:
            return True
        time.sleep(0.02)
    return os.path.exists(path) == present


def live_frames(pid: int, path: str, n: int = 3, timeout: float = 5.0) -> JobConnection:
    """A connection that has read at least ``n`` frames, the last of them
    sent after it connected: the job first replays its last minute, and
    frames[-1] of a read that stopped inside the replay is an old one (a
    parent's batches once read 10 after 13 a connection earlier)."""
    c = JobConnection(pid, path)
    since = time.time()
    assert c.connect(), c.reason
    try:
        end = time.monotonic() + timeout
        while time.monotonic() < end and (len(c.frames) < n or c.frames[-1]["t"] < since):
            select.select([c.sock], [], [], 0.1)
            c.read()
        assert c.state == "live" and len(c.frames) >= n, (c.state, c.reason, len(c.frames))
        assert c.frames[-1]["t"] >= since, "no frame sent after connecting"
        assert c.job["pid"] == pid
        return c
    finally:
        c.close()


def job_in(snap: dict, pid: int) -> dict:
    found = [j for j in snap["jobs"] if j["pid"] == pid]
    assert found, f"job {pid} not in snapshot: {[j['pid'] for j in snap['jobs']]}"
    return found[0]


# --- exit ------------------------------------------------------------------------------------


@pytest.mark.parametrize("monitor", ["reading", "stopped"])
def test_exit_with_a_monitor_attached_never_hangs(monitor):
    job = Proc(SCEN, "exit_attached", "2.0")
    mon = None
    try:
        job.line("ready")
        mon = subprocess.Popen(
            [sys.executable, str(MONITOR), str(job.pid), job.sock()], stdout=subprocess.PIPE, text=True
        )
        r, _, _ = select.select([mon.stdout], [], [], 15)
        assert r and mon.stdout.readline().strip() == "live"
        if monitor == "stopped":
            os.kill(mon.pid, signal.SIGSTOP)
        last = int(job.line("last-batch"))
        rc, out, err = job.finish(timeout=30)
        exited = time.perf_counter_ns()
        assert rc == 0, err
        took = (exited - last) / 1e9
        clock = {k: int(v) for k, v in (line.split() for line in out.splitlines() if line.startswith("clos"))}
        closing = (clock["closed"] - clock["closing"]) / 1e9
        print(
            f"\n[{monitor} monitor] exit {took:.2f} s after the last batch; dlwatch's close {closing:.3f} s"
        )
        # dlwatch's part of the exit (the publisher's close: it waits up to 1 s
        # for its thread, the rest never blocks) whatever the monitor does. The
        # exit as a whole (torch joins its workers first) is the scheduler's on
        # a loaded box: 8.7 s was seen beside the parallel tier, 0.7 s alone.
        assert closing < 2.0, f"dlwatch's close took {closing:.1f} s with a {monitor} monitor attached"
        assert not os.path.exists(job.sock()), "socket not removed at exit"
        if monitor == "reading":
            assert mon.stdout.readline().strip().startswith("ended"), "monitor not told"
    finally:
        if mon is not None:
            mon.kill()
            mon.wait()
            mon.stdout.close()
        job.cleanup()


def test_a_job_that_dies_of_an_exception_says_so_to_the_monitor():
    """A QA run of torchrun: a rank that crashed read "exited", as one that
    finished. The job's last frame carries the uncaught exception, and the
    job's own traceback is printed as ever."""
    job = Proc(SCEN, "crash", "1.5")
    m = Monitor(directory=job.dir, interval=0.2, gpu=False, diagnoser=False)
    try:
        job.line("ready")
        m.start()
        rc, _, err = job.finish(timeout=60)
        assert rc == 1 and "RuntimeError: boom in the step" in err and "Traceback" in err, err[-2000:]
        end = time.monotonic() + 10
        j = None
        while time.monotonic() < end:
            snap = m.latest()
            j = next((x for x in (snap or {}).get("jobs", ()) if x["pid"] == job.pid), None)
            if j is not None and j["state"] == "exited":
                break
            time.sleep(0.2)
    finally:
        m.stop()
        job.cleanup()
    assert j is not None and j["state"] == "exited", j
    assert j["state_reason"] == "the process has exited after an uncaught RuntimeError: boom in the step", j


def _sampled_until(m: Monitor, pid: int, state: str, end: float) -> dict:
    """The job as the monitor's next samples show it, once it reads ``state``
    (driven by hand, no thread: the test chooses what happens between)."""
    while True:
        j = next((x for x in m.sample_now()["jobs"] if x["pid"] == pid), None)
        if j is not None and j["state"] == state:
            return j
        assert time.monotonic() < end, j
        time.sleep(0.1)


@pytest.mark.parametrize("reaped", [False, True])
def test_a_job_killed_by_a_signal_is_told_from_one_that_exited(reaped):
    """A QA run of torchrun: a rank SIGKILLed read "the process has exited",
    as a rank that finished. Not yet reaped, its wait status names the
    signal; reaped, the missing last frame says it did not exit through
    Python."""
    job = Proc(SCEN, "killed", "1.5")
    # Driven by hand (no thread): whether the monitor reads the end before or
    # after the job is reaped is the test's to choose.
    m = Monitor(directory=job.dir, interval=0.2, gpu=False, diagnoser=False)
    if reaped:
        # The monitor's exit clock reads the status the moment the process
        # ends, most often before its parent reaps it: without pidfds (a
        # kernel before 5.3) the frames are all there is.
        m._exits.unavailable = "this test: no pidfds"
    j = None
    try:
        job.line("ready")
        end = time.monotonic() + 20
        _sampled_until(m, job.pid, "live", end)
        # Dead, not reaped: waitid(WNOWAIT) leaves the zombie for finish().
        os.waitid(os.P_PID, job.pid, os.WEXITED | os.WNOWAIT)
        if reaped:
            assert job.finish(timeout=60)[0] == -signal.SIGKILL
        j = _sampled_until(m, job.pid, "exited", end)
    finally:
        m.stop()
        job.cleanup()
    assert j is not None and j["state"] == "exited", j
    if reaped:
        assert j["state_reason"].startswith(
            "the process ended without exiting through Python: a signal (SIGKILL, SIGTERM)"
        ), j
    else:
        assert j["state_reason"] == "the process was killed by SIGKILL", j


def test_a_job_that_calls_sys_exit_keeps_its_code_once_reaped():
    """A job started from a shell and reaped there: its exit status is gone
    before the monitor reads it, and "exited" read as a finished run. The
    last frame names the failing sys.exit call."""
    job = Proc(SCEN, "sys_exit", "1.0")
    m = Monitor(directory=job.dir, interval=0.2, gpu=False, diagnoser=False)
    j = None
    try:
        job.line("ready")
        end = time.monotonic() + 20
        _sampled_until(m, job.pid, "live", end)
        # Reaped before the monitor looks again, as a shell does.
        assert job.finish(timeout=60)[0] == 3
        j = _sampled_until(m, job.pid, "exited", end)
    finally:
        m.stop()
        job.cleanup()
    assert j is not None and j["state_reason"] == "the process has exited after sys.exit(3)", j


def test_os_exit_leaves_a_stale_socket_that_ls_cleans_up():
    job = Proc(SCEN, "os_exit")
    try:
        job.line("ready")
        rc, _, err = job.finish(timeout=30)
        assert rc == 0, err
        assert os.path.exists(job.sock()), "os._exit skips atexit: the file stays"
        r = dlwatch("ls", "--json", runtime_dir=job.dir)
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["jobs"] == []
        assert not os.path.exists(job.sock()), "dlwatch ls must remove the stale socket"
        assert "Traceback" not in r.stderr
    finally:
        job.cleanup()


# --- fork ---------------------------------------------------------------------------------------


# The child must have trained a batch by its first frames: under load it has not yet.
@pytest.mark.timing
def test_fork_after_iterating_child_gets_its_own_socket():
    job = Proc(SCEN, "fork", "80")
    try:
        ids = job.json_line("ready")
        parent, child = ids["parent"], ids["child"]
        assert parent == job.pid and child != parent
        assert wait_path(job.sock(child), timeout=15), "the child never got its own socket"
        # The child's socket appears when its publisher starts, at its first
        # iter(); its first batch follows its workers' start (0.1-0.3 s here).
        deadline = time.monotonic() + 5.0
        while True:
            c_child = live_frames(child, job.sock(child))
            if any(ld["batches"] > 0 for ld in c_child.frames[-1]["loaders"]) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert any(ld["batches"] > 0 for ld in c_child.frames[-1]["loaders"]), c_child.frames[-1]
        # The child's registry starts empty: only its own loader, numbered afresh.
        assert [ld["id"] for ld in c_child.frames[-1]["loaders"]] == [0]
        assert len(c_child.frames[-1]["loaders"][0]["workers"]) == 2
        c_parent = live_frames(parent, job.sock(parent))
        assert c_parent.frames[-1]["loaders"][0]["batches"] >= 10
        done = job.json_line("child-done", timeout=60)
        assert done["batches"] == 80
        assert job.line("child-exit") == "0"
        # The child's exit removed its own socket and left the parent's alone.
        assert wait_path(job.sock(child), present=False, timeout=5)
        assert os.path.exists(job.sock(parent))
        c2 = live_frames(parent, job.sock(parent))
        assert c2.frames[-1]["loaders"][0]["batches"] > c_parent.frames[-1]["loaders"][0]["batches"]
        job.line("parent-done")
        rc, _, err = job.finish()
        assert rc == 0, err
        assert os.listdir(job.dir) == []
    finally:
        job.cleanup()


# --- Ctrl-C ----------------------------------------------------------------------------------------


# What an arm that did not finish was doing (for the failure message: once
# it showed SIGINT ignored, handed down by a suite started in the background).
hung: list[str] = []


def _where(pid: int, arm: str) -> str:
    """The hung job's processes: state, kernel wait channel and signal masks."""
    lines = [arm]
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return f"{arm}: gone"
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/status") as f:
                st = {k: v.strip() for k, _, v in (ln.partition(":") for ln in f)}
            with open(f"/proc/{p.pid}/wchan") as f:
                wchan = f.read()
            fields = " ".join(
                f"{k}={st.get(k)}" for k in ("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt")
            )
            lines.append(f"  pid {p.pid} {' '.join(p.cmdline())[-60:]!r}: {fields} wchan={wchan}")
        except (OSError, psutil.Error):
            continue
    return "\n".join(lines)


def _interrupt(disable: bool) -> tuple[int, str, str, list, list]:
    job = Proc(SCEN, "sigint", disable=disable, new_session=True)
    try:
        job.line("ready")
        kids = [p.pid for p in psutil.Process(job.pid).children(recursive=True)]
        time.sleep(0.3)  # mid-epoch, workers busy
        os.killpg(job.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        try:
            rc, out, err = job.finish(timeout=30)
        except subprocess.TimeoutExpired:
            hung.append(_where(job.pid, "plain" if disable else "hooked"))
            raise
        left = os.listdir(job.dir)
        alive = [
            k for k in kids if psutil.pid_exists(k) and psutil.Process(k).status() != psutil.STATUS_ZOMBIE
        ]
        return rc, out, err, left, alive
    finally:
        job.cleanup()


# The stdlib's own race at Ctrl-C, hook or no hook: a worker's fd server
# (multiprocessing.resource_sharer, how a batch's shared memory reaches the
# main process) hands a descriptor to a main process interrupted mid-receive,
# and its thread prints the broken send (fresh-clone run 19, beside the
# parallel tier at -n 4). Nothing of dlwatch runs on that thread.
_FD_SERVER = re.compile(r"/multiprocessing/(resource_sharer|reduction|connection)\.py\b")


def _without_fd_server_races(err: str) -> str:
    """``err`` less each traceback whose every frame is in multiprocessing's fd server."""
    out: list[str] = []
    lines = err.splitlines()
    i = 0
    while i < len(lines):
        if lines[i] != "Traceback (most recent call last):":
            out.append(lines[i])
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].startswith(" "):
            end += 1
        frames = [ln for ln in lines[i + 1 : end] if ln.lstrip().startswith('File "')]
        if not frames or not all(_FD_SERVER.search(f) for f in frames):
            out.extend(lines[i : end + 1])
        i = end + 1  # past the exception's own line
    return "\n".join(out)


def test_fd_server_races_are_told_from_other_tracebacks():
    race = (
        "Traceback (most recent call last):\n"
        '  File "/usr/lib/python3.11/multiprocessing/resource_sharer.py", line 145, in _serve\n'
        "    send(conn, destination_pid)\n"
        '  File "/usr/lib/python3.11/multiprocessing/reduction.py", line 184, in send_handle\n'
        "    sendfds(s, [handle])\n"
        "BrokenPipeError: [Errno 32] Broken pipe\n"
    )
    ours = race.replace("multiprocessing/reduction.py", "dlwatch/probe/loader.py")
    assert _without_fd_server_races("before\n" + race + "after") == "before\nafter"
    assert "Traceback" in _without_fd_server_races(ours) and "dlwatch" in _without_fd_server_races(ours)


def test_ctrl_c_with_two_workers_behaves_as_without_the_hook():
    hung.clear()
    try:
        rc0, out0, err0, _, alive0 = _interrupt(disable=True)
        rc1, out1, err1, left1, alive1 = _interrupt(disable=False)
    except subprocess.TimeoutExpired:
        pytest.fail("a job did not finish in 30 s after Ctrl-C:\n" + "\n".join(hung))
    assert rc0 == 130 and "interrupted cleanly" in out0, (rc0, out0, err0)
    assert (rc1, out1) == (rc0, out0)
    err1 = _without_fd_server_races(err1)
    assert "Traceback" not in err1 and "dlwatch" not in err1, err1
    assert left1 == [], "the socket must be removed after Ctrl-C"
    assert alive1 == [] and alive0 == [], "worker processes outlived the job"


# --- abandoned iterators ------------------------------------------------------------------------


def test_abandoned_iterators_are_counted_as_epochs():
    job = Proc(SCEN, "abandon")
    try:
        facts = job.json_line("ready")
        snap = take_snapshot(directory=job.dir, settle_s=0.3)
        j = job_in(snap, job.pid)
        assert j["state"] == "live"
        lds = {ld["id"]: ld for ld in j["loaders"]}
        assert set(lds) == {0, 1}, lds
        plain, keep = lds[0], lds[1]
        assert not plain["persistent_workers"] and keep["persistent_workers"]
        assert plain["epoch"] == facts["plain_epochs"] == 4
        assert keep["epoch"] == facts["keep_epochs"] == 4
        assert plain["batches_total"] == facts["plain_batches"] == 21
        assert keep["batches_total"] == facts["keep_batches"] == 21
        job.line("done")
        rc, _, err = job.finish()
        assert rc == 0, err
        assert "Traceback" not in err and "Exception" not in err, err
    finally:
        job.cleanup()


# --- frameworks -----------------------------------------------------------------------------------


def _framework_snapshot(name: str) -> tuple[dict, str]:
    job = Proc(FRAMEWORKS, name, env={"TRAIN_S": "6"})
    try:
        info = job.json_line("ready", timeout=120)
        time.sleep(1.0)  # a second of steady training for the rates
        snap = take_snapshot(directory=job.dir, settle_s=0.5)
        j = job_in(snap, job.pid)
        # Live, or ended during the snapshot's watch (6 s of training): then
        # its last live figures, said to be so.
        assert j["state"] == "live" or j["state_reason"].endswith("while it was watched"), j["state_reason"]
        train = [ld for ld in j["loaders"] if ld["num_workers"] == 2]
        assert train, j["loaders"]
        ld = train[0]
        # Accelerate's DataLoaderShard carries its batch size on its batch sampler
        # (DataLoader.batch_size is None): see the batch-sampler test below.
        assert ld["batch_size"] in (8, None)
        assert ld["batches_total"] > 0 and ld["batches_per_s"] > 0
        assert len(ld["workers"]) == 2
        assert all(w["pid"] > 0 and w["batches"] > 0 for w in ld["workers"]), ld["workers"]
        rc, out, err = job.finish(timeout=120)
        assert rc == 0, err[-3000:]
        assert "fit-done" in out
        assert "dlwatch" not in err, err[-3000:]
        assert os.listdir(job.dir) == []
        return info, out
    finally:
        job.cleanup()


def _has(mod: str) -> bool:
    return importlib.util.find_spec(mod) is not None


@pytest.mark.skipif(
    not _has("lightning"),
    reason="PyTorch Lightning not installed (pip install lightning; it keeps an installed torch 2.13)",
)
def test_lightning_trainer_fit():
    info, out = _framework_snapshot("lightning")
    # Lightning checks worker_init_fn for None: the hook must never make it non-None.
    assert info["worker_init_fn_is_none"] is True
    assert "fit-done True" in out


@pytest.mark.skipif(
    not _has("accelerate"),
    reason="HF Accelerate not installed (pip install accelerate; it keeps an installed torch 2.13)",
)
def test_accelerate_prepared_loader():
    info, _ = _framework_snapshot("accelerate")
    assert info["loader_type"] == "DataLoaderShard"


def test_batch_size_of_a_batch_sampler_loader_is_reported():
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler, TensorDataset

    from dlwatch.probe.stats import loader_config

    ds = TensorDataset(torch.zeros(64, 2))
    dl = DataLoader(ds, batch_sampler=BatchSampler(SequentialSampler(ds), 8, False))
    assert dl.batch_size is None  # what Accelerate's DataLoaderShard looks like
    assert loader_config(dl, None)["batch_size"] == 8
