"""The hang doctor on real hangs (docs/hangs.md): a job whose two workers are
stuck for good (one opening a FIFO nobody writes, one on a lock a trainer
thread held when it forked), a worker SIGKILLed, a worker that runs out of
/dev/shm in a mount namespace of its own, and a torchrun rank that runs out
of data. Each shows its state, frame and hint in ``snapshot --json``, the
live view and ``dlwatch stacks``.

One hung job serves every test that reads it (module fixture). The stall
floor is 1.5 s here (``DLWATCH_STALL_FLOOR_S``, the production default is
10 s) so that the stall is declared a second after the hang, not ten.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dlwatch.collect.hang import gather_stacks
from dlwatch.collect.monitor import Monitor
from dlwatch.mcp.tools import Tools
from dlwatch.tui.app import DlwatchApp
from dlwatch.tui.jobs import JobList
from dlwatch.tui.stacks import StacksScreen
from tests.e2e.test_tui_live import sync, wait_for
from tests.e2e_util import dlwatch, short_tmpdir, snapshot_json, stop_sessions
from tests.tui_fixtures import plain, row_text

JOBS = Path(__file__).resolve().parent.parent / "jobs" / "hang_jobs.py"
FLOOR_S = "1.5"
LIMIT_S = 60.0  # a generous "eventually" on a loaded 2-core machine


def start(mode: str, *args: str, runtime_dir: str | None = None, launcher: tuple = ()) -> tuple:
    d = runtime_dir or short_tmpdir()
    env = dict(os.environ, DLWATCH_DIR=d, DLWATCH_STALL_FLOOR_S=FLOOR_S, OMP_NUM_THREADS="1")
    p = subprocess.Popen(
        [*launcher, sys.executable, str(JOBS), mode, *args] if not launcher else [*launcher, str(JOBS), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        cwd=d,
    )
    return p, d


def wait_snapshot(d: str, done, what: str) -> dict:
    end = time.monotonic() + LIMIT_S
    snap: dict = {}
    while time.monotonic() < end:
        snap = snapshot_json(d, "--window", "1")
        if done(snap):
            return snap
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: {_stall_parts(snap)}\n{json.dumps(snap)[:3000]}")


def _stall_parts(snap: dict) -> str:
    """What a stall's test waits for, part by part: which one was missing."""
    parts = [f"hints {[h['id'] for h in snap.get('hints') or []]}"]
    for j in snap.get("jobs") or []:
        stacks = j.get("stacks") or {}
        summary = [
            {k: e.get(k) for k in ("role", "worker_id", "via", "kind", "error", "channel_error")}
            for e in stacks.get("summary") or []
        ]
        stalled = [ld.get("stalled_s") for ld in j.get("loaders") or []]
        parts.append(f"job {j.get('pid')}: stalled_s {stalled}, stacks {sorted(stacks)}, summary {summary}")
    return "; ".join(parts)


def stalled_with_stacks(snap: dict, pid: int | None = None) -> bool:
    """A stall judged on its own stacks: the hint's evidence quotes them (an
    earlier stall's stacks, still the job's last while this one's are
    gathered, are not its evidence)."""
    for j in snap["jobs"]:
        if pid is not None and j["pid"] != pid:
            continue
        if any(ld.get("stalled_s") for ld in j["loaders"]) and (j.get("stacks") or {}).get("summary"):
            return any(
                h["id"] == "loader-stalled" and h.get("job_pid") == j["pid"] and h["evidence"].get("lines")
                for h in snap["hints"]
            )
    return False


def summary_of(job: dict, role: str, worker_id: int | None = None) -> dict:
    for e in job["stacks"]["summary"]:
        if e["role"] == role and (worker_id is None or e["worker_id"] == worker_id):
            if role == "worker" or e["thread"] == "MainThread":
                return e
    raise AssertionError(f"no {role} {worker_id} in {job['stacks']['summary']}")


@pytest.fixture(scope="module")
def hung():
    work = short_tmpdir("dlwhang")
    fifo = os.path.join(work, "shard.fifo")
    os.mkfifo(fifo)
    p, d = start("hang", fifo)
    try:
        snap = wait_snapshot(d, stalled_with_stacks, "the stall, its stacks and its hint")
        yield SimpleNamespace(proc=p, dir=d, snap=snap, job=snap["jobs"][0])
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)


def test_a_hung_job_is_stalled_with_each_workers_frame_and_the_cause_in_snapshot_json(hung):
    job = hung.job
    ld = job["loaders"][0]
    # The threshold is the floor or ten batch periods, whichever is longer
    # (2.0 s seen beside the parallel tier, whose load stretched the periods).
    assert ld["stall_threshold_s"] >= float(FLOOR_S), ld
    assert ld["stalled_s"] >= ld["stall_threshold_s"] and ld["in_next"] is True
    assert job["stacks"]["reason"] == "stall"
    reader = summary_of(job, "worker", 0)
    assert reader["kind"] == "io" and reader["at"]["function"] == "read_remote_shard"
    assert reader["at"]["file"].endswith("hang_jobs.py") and reader["in_fetch_s"] > 0
    assert reader["line"].startswith(f"worker 0 (pid {reader['pid']}): blocked in I/O in read_remote_shard")
    locked = summary_of(job, "worker", 1)
    assert locked["kind"] == "lock" and locked["at"]["function"] == "Shards.__getitem__"
    main = summary_of(job, "trainer")
    assert main["kind"] == "data-queue" and main["at"]["user"]["function"] == "run"
    assert {w["pid"] for w in ld["workers"]} == {reader["pid"], locked["pid"]}
    h = next(h for h in hung.snap["hints"] if h["id"] == "loader-stalled")
    assert h["severity"] == "critical" and h["job_pid"] == hung.proc.pid
    ev = h["evidence"]
    # Both stuck workers are named; the one the loop waits for first.
    assert (
        sorted(ev["causes"]) == ["fork-inherited-lock", "worker-blocked-io"]
        and "cache-refresher" in h["message"]
    )
    assert ev["awaited_worker"] in (0, 1) and ld["awaited_worker"] == ev["awaited_worker"]
    assert ev["cause"] == {0: "worker-blocked-io", 1: "fork-inherited-lock"}[ev["awaited_worker"]]
    assert "read_remote_shard" in h["message"] and "spawn" in h["suggestion"]
    assert {w["id"]: w["kind"] for w in ev["workers_not_delivered"]} == {0: "io", 1: "lock"}
    # The stall hides the rate hints its empty windows would otherwise raise.
    assert not {"io-bound", "add-workers"} & {x["id"] for x in hung.snap["hints"]}


def test_dlwatch_stacks_names_the_blocking_frame_of_each_process(hung):
    pid = hung.proc.pid
    r = dlwatch("stacks", "--pid", str(pid), runtime_dir=hung.dir)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"main thread (pid {pid}): waiting for a batch in ")
    assert any(
        "worker 0 (pid" in x and "blocked in I/O in read_remote_shard, hang_jobs.py:" in x for x in lines
    )
    assert any(
        "worker 1 (pid" in x and "blocked on a lock in Shards.__getitem__, hang_jobs.py:" in x for x in lines
    )
    assert any(x.startswith(f"trainer (pid {pid}) thread cache-refresher: sleeping in ") for x in lines)
    assert '      > with open(path, "rb") as f:  # a FIFO nobody writes: blocks here forever' in lines
    doc = json.loads(dlwatch("stacks", "--pid", str(pid), "--json", runtime_dir=hung.dir).stdout)
    assert doc["source"] == "job" and doc["reason"] == "request" and doc["error"] is None
    roles = sorted((p["role"], p.get("worker_id")) for p in doc["processes"])
    assert roles == [("trainer", None), ("worker", 0), ("worker", 1)]
    assert all(p["threads"] for p in doc["processes"])


def test_stacks_of_a_process_that_is_not_a_dlwatch_job_say_why(hung):
    # This test's process started the hung job: the job's PID is the one to use.
    r = dlwatch("stacks", "--pid", str(os.getpid()), "--no-py-spy", runtime_dir=hung.dir)
    assert r.returncode == 1 and r.stdout == ""
    assert f"PID {os.getpid()} is not a dlwatch job: it started the job" in r.stderr, r.stderr
    assert "use --pid " in r.stderr and "Traceback" not in r.stderr


def test_a_job_without_the_hook_is_read_with_py_spy_or_says_which_permission_is_missing():
    from dlwatch.collect import ptrace

    d = short_tmpdir()
    script = Path(d, "plain.py")
    script.write_text(
        "import time\n\n\ndef read_remote_shard():\n    time.sleep(60)\n\n\nread_remote_shard()\n"
    )
    p = subprocess.Popen([sys.executable, str(script)])
    try:
        time.sleep(0.5)
        allowed = ptrace.check(p.pid).allowed
        r = dlwatch("stacks", "--pid", str(p.pid), "--json", runtime_dir=d)
    finally:
        p.kill()
        p.wait()
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    proc = doc["processes"][0]
    assert doc["source"] == "py-spy" and proc["pid"] == p.pid
    if allowed:
        assert proc["via"] == "py-spy"
        assert (
            doc["summary"][0]["line"]
            == f"main thread (pid {p.pid}): sleeping in read_remote_shard, plain.py:5"
        )
    else:
        assert "py-spy may not read it" in proc["error"]


def text_of(app, selector: str) -> str:
    return "\n".join(plain(w) for w in app.screen.query(selector))


def job_state_cell(app, pid: int) -> str:
    table = app.screen.query_one(JobList)
    key = f"job:{pid}"
    return row_text(table, key)[2] if key in set(table.row_keys) else ""


@sync
async def test_the_live_view_says_stalled_names_the_frames_and_S_shows_the_stacks(hung):
    pid = hung.proc.pid
    stacker = functools.partial(gather_stacks, directory=hung.dir)
    app = DlwatchApp(Monitor(directory=hung.dir), interval=0.5, runtime_dir=hung.dir, stacker=stacker)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(
            pilot, lambda: job_state_cell(app, pid) == "STALLED", "STALLED in the job list", LIMIT_S
        )
        await wait_for(
            pilot, lambda: "read_remote_shard" in text_of(app, "#loader-hang"), "stuck frames", LIMIT_S
        )
        panel = text_of(app, "#loader-hang")
        assert "STALLED: no batch for" in panel and "blocked on a lock in Shards.__getitem__" in panel
        assert "STALLED" in text_of(app, "#job-header")
        await pilot.press("S")
        await wait_for(pilot, lambda: isinstance(app.screen, StacksScreen), "the stacks screen")
        screen = app.screen
        await wait_for(pilot, lambda: not screen.asking, "the fresh stacks")
        shown = text_of(app, "#stacks-text")
        assert f"stacks of PID {pid}" in shown and "(request)" in shown
        assert "blocked in I/O in read_remote_shard" in shown and "== worker 1 (pid" in shown
        await pilot.press("escape")


def test_a_recording_keeps_the_stacks_in_a_file_beside_it(hung):
    out = os.path.join(hung.dir, "rec.jsonl")
    r = dlwatch("record", "-o", out, "--duration", "2", "--pid", str(hung.proc.pid), runtime_dir=hung.dir)
    assert r.returncode == 0, r.stderr
    text = Path(hung.dir, "rec.stacks.txt").read_text()
    # The job's last stacks: its stall's, or those another test asked for since.
    first = text.splitlines()[0]
    assert first.startswith(f"=== job {hung.proc.pid} at ") and first.endswith(("(stall)", "(request)"))
    assert "blocked in I/O in read_remote_shard" in text


def watch_until_exit(p, d: str) -> dict:
    """A collector watching the job from its start to after its end: the
    exited job's last figures, as the live view keeps them."""
    monitor = Monitor(directory=d, window_s=1.0)
    monitor.start()
    try:
        p.wait(timeout=LIMIT_S)
        time.sleep(1.0)
        return monitor.sample_now()
    finally:
        monitor.stop()


@sync
async def test_a_worker_killed_by_sigkill_is_named_with_its_signal_rss_and_oom_count():
    """Watched by the live view from start to after the job's end: the exited
    job keeps the death in the snapshot and on screen. The worker dies once
    the view shows the job live (its go file): under load the app can take
    longer to start than the job takes to reach its kill."""
    d = short_tmpdir()
    go = os.path.join(d, "go")
    p, d = start("kill", go, runtime_dir=d)
    try:
        app = DlwatchApp(Monitor(directory=d, window_s=1.0), interval=0.5, runtime_dir=d)
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: job_state_cell(app, p.pid) == "live", "the job live", LIMIT_S)
            Path(go).touch()
            await wait_for(pilot, lambda: job_state_cell(app, p.pid) == "exited", "the job exited", LIMIT_S)
            await wait_for(
                pilot, lambda: "was killed by SIGKILL" in text_of(app, "#loader-hang"), "the death", 10
            )
            shown = text_of(app, "#loader-hang")
            snap = app.snapshot
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
    job = next(j for j in snap["jobs"] if j["pid"] == p.pid)
    assert job["state"] == "exited"
    deaths = job["loaders"][0]["worker_deaths"]
    assert len(deaths) == 1, deaths
    d0 = deaths[0]
    assert d0["id"] == 1 and d0["signal"] == "SIGKILL" and d0["rss_last_bytes"] > 0
    assert isinstance(d0["oom_kills"], int) or d0["oom_kills_reason"]
    assert d0["cause"] == ("oom" if d0["oom_kills"] else "signal")
    assert f"✖ worker 1 (pid {d0['pid']}) was killed by SIGKILL; " in shown


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    r = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs -o size=1m tmpfs /dev/shm"],
        capture_output=True,
    )
    return r.returncode == 0


def test_a_worker_that_runs_out_of_dev_shm_is_named_with_the_cause():
    if not _can_mount_tmpfs():
        pytest.skip("cannot mount a tmpfs in a mount namespace of its own here (needs root or CAP_SYS_ADMIN)")
    d = short_tmpdir()
    launcher = (
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size=1m tmpfs /dev/shm && exec "{sys.executable}" "$0" "$@"',
    )
    p, d = start("shm", runtime_dir=d, launcher=launcher)
    try:
        snap = watch_until_exit(p, d)
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
    job = snap["jobs"][0]
    d0 = job["loaders"][0]["worker_deaths"][0]
    assert d0["cause"] == "shm" and "No space left on device" in d0["exception"], d0
    # The original error, not torch's wrapper line (a QA run of nodes lost it).
    err = job["loaders"][0]["last_error"]
    assert "No space left on device" in err and err.endswith("(caught in DataLoader worker process 0)"), err


def test_a_torchrun_rank_that_ran_out_of_data_is_named():
    launcher = (sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2")
    p, d = start("ranks", launcher=launcher)
    try:
        snap = wait_snapshot(d, stalled_with_stacks, "rank 0's stall")
        r = dlwatch("stacks", runtime_dir=d)  # two jobs: --pid is needed
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 2 and "name one with --pid" in r.stderr
    h = next(h for h in snap["hints"] if h["id"] == "loader-stalled")
    r0 = next(j for j in snap["jobs"] if j["pid"] == h["job_pid"])
    r1 = next(j for j in snap["jobs"] if j["pid"] != h["job_pid"])
    assert (r0["rank"], r1["rank"]) == (0, 1)
    assert r0["loaders"][0]["in_next"] is False and r1["loaders"][0]["stalled_s"] is None
    ev = h["evidence"]
    assert ev["cause"] == "uneven-ranks" and ev["main_thread_kind"] == "collective"
    assert f"rank 1 (pid {r1['pid']}) has finished its epoch" in h["message"]
    assert "all_reduce" in ev["main_thread"]


# --- the hangs of public issues (issue 42): each gets its frame and its cause class ----------


def _stall_hint(snap: dict, pid: int | None = None) -> dict:
    return next(h for h in snap["hints"] if h["id"] == "loader-stalled" and pid in (None, h["job_pid"]))


def _no_advice_beside_the_stall(snap: dict) -> None:
    """No load or thread advice about the stalled loader's idle workers, no
    "rank None", no "batch None" (issue 42)."""
    quiet = {"worker-thread-oversubscription", "workers-oversubscribe-cores", "idle-workers", "add-workers"}
    assert not quiet & {h["id"] for h in snap["hints"]}, [h["id"] for h in snap["hints"]]
    text = json.dumps(snap["hints"])
    assert "rank None" not in text and "batch None" not in text


def _run_until_stalled(mode: str, done=stalled_with_stacks) -> tuple:
    p, d = start(mode)
    try:
        return p, d, wait_snapshot(d, done, f"the {mode} job's stall and its hint")
    except BaseException:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
        raise


def _worker_entries(job: dict) -> list[dict]:
    return [e for e in job["stacks"]["summary"] if e["role"] == "worker"]


def test_an_openmp_pool_inherited_across_fork_is_named_with_the_fix_and_figures_that_move():
    """pytorch#42444: the second epoch's workers fork from a busy OpenMP pool
    and block at their first parallel op, at 0 % CPU. The channel answers
    (torch released the GIL) with a frame that is a plain call: the worker's
    CPU and state say it is blocked in C, not running."""
    p, d, snap = _run_until_stalled("omp")
    try:
        time.sleep(2.0)
        later = wait_snapshot(d, stalled_with_stacks, "a later look at the stall")
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
    h = _stall_hint(snap)
    ev = h["evidence"]
    assert ev["cause"] == "fork-inherited-pool", h
    assert "OMP_NUM_THREADS=1" in h["suggestion"] and "worker_init_fn" in h["suggestion"]
    assert "spawn" in h["suggestion"] and "blocked in C" in h["message"]
    assert {w["kind"] for w in ev["workers_not_delivered"]} == {"native"}
    assert all("Matmuls.__getitem__" in w["blocked_at"] for w in ev["workers_not_delivered"])
    # Under the rule's 5 % (hang.NATIVE_CPU_MAX, rounded): 0 % on a quiet box, 1 % seen
    # beside the parallel tier (the worker's start counted in its window).
    blocked = re.compile(r"blocked in C \([0-5] % CPU, sleeping\) in ")
    assert any(blocked.search(x) for x in ev["lines"]), ev["lines"]
    assert not any(": in " in x for x in ev["lines"] if x.startswith("worker")), ev["lines"]
    _no_advice_beside_the_stall(snap)
    # Every figure is the stall's age at the snapshot, not at the gathering.
    h2 = _stall_hint(later)
    stalled = [ld["stalled_s"] for ld in later["jobs"][0]["loaders"]][0]
    fetch = max(w["in_fetch_s"] for w in h2["evidence"]["workers_not_delivered"])
    assert fetch > max(w["in_fetch_s"] for w in ev["workers_not_delivered"])
    assert stalled - 3.0 <= fetch, (stalled, fetch)
    assert later["jobs"][0]["loaders"][0]["batch_size"] == 2


def test_a_native_lock_held_at_fork_is_read_by_py_spy_in_every_view():
    """pytorch#75147: the worker blocks in a C call that keeps the GIL, so its
    own channel cannot answer; py-spy's threads replace the channel's error
    in `dlwatch stacks` (text and JSON), the snapshot's stacks and the hint."""
    from dlwatch.collect import ptrace, spy

    if spy.find() is None:
        pytest.skip("py-spy is not installed")

    def done(snap: dict) -> bool:
        if not stalled_with_stacks(snap):
            return False
        return all(e.get("via") == "py-spy" for e in _worker_entries(snap["jobs"][0]))

    p, d = start("native-lock")
    try:
        time.sleep(1.0)
        if not ptrace.check(p.pid).allowed:
            pytest.skip(f"py-spy may not read the job here: {ptrace.check(p.pid).line()}")
        snap = wait_snapshot(d, done, "the stall's stacks, read by py-spy")
        r = dlwatch("stacks", "--pid", str(p.pid), runtime_dir=d)
        doc = json.loads(dlwatch("stacks", "--pid", str(p.pid), "--json", runtime_dir=d).stdout)
        agent = Tools(directory=d).stacks(p.pid)  # the MCP tool
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    workers = [x for x in doc["processes"] if x["role"] == "worker"]
    assert len(workers) == 2 and all(w["via"] == "py-spy" and w["threads"] for w in workers)
    assert all("error" not in w and "no answer within" in w["channel_error"] for w in workers)
    lines = r.stdout.splitlines()
    for w in workers:
        assert f"== worker {w['worker_id']} (pid {w['pid']}) (read by py-spy from outside)" in lines
        assert any(
            x.startswith(f"worker {w['worker_id']} (pid {w['pid']}): blocked in C (0 % CPU, sleeping) in ")
            and "take_keeping_the_gil" in x
            for x in lines
        ), lines
    assert "no answer within" not in r.stdout
    assert [e["kind"] for e in agent["summary"] if e["role"] == "worker"] == ["native", "native"]
    # The live view's stacks window draws the stall's stacks the monitor completed.
    shown = StacksScreen(p.pid, snap["jobs"][0]["stacks"], None)._text().plain
    assert "(read by py-spy from outside)" in shown and "blocked in C (0 % CPU, sleeping) in " in shown
    assert "no answer within" not in shown
    h = _stall_hint(snap)
    assert h["evidence"]["cause"] == "fork-inherited-pool" and "native-cache" in h["message"], h
    assert all(w["kind"] == "native" for w in _worker_entries(snap["jobs"][0]))
    _no_advice_beside_the_stall(snap)


def test_a_barrier_whose_partner_never_arrives_is_named():
    """mosaicml/streaming#447: workers meet at a shared barrier at the end of
    uneven partitions; worker 0 waits there, worker 1 is far from its end."""
    p, d, snap = _run_until_stalled("barrier")
    stop_sessions([p], grace=0.0)
    shutil.rmtree(d, ignore_errors=True)
    h = _stall_hint(snap)
    ev = h["evidence"]
    assert ev["cause"] == "barrier-partner-missing", h
    assert "waits at a barrier" in h["message"] and "Partitions.__iter__" in h["message"]
    assert "drop_last" in h["suggestion"] and "timeout" in h["suggestion"]
    kinds = {e["worker_id"]: e["kind"] for e in _worker_entries(snap["jobs"][0])}
    assert kinds == {0: "barrier", 1: "idle"}
    _no_advice_beside_the_stall(snap)


def test_ranks_started_by_mp_spawn_are_named_from_torch_distributed():
    """k2-fsa/snowfall#152: ranks under torch.multiprocessing.spawn with
    init_process_group(rank=..., world_size=...): no RANK in the environment,
    the ranks come from torch.distributed, and the finished one is named."""

    def done(snap: dict) -> bool:
        # Both ranks with their loaders (a one-shot on a loaded box may have a
        # rank's hello before its first frames), and one of them done with its
        # epoch: on a loaded box the spawn workers' imports can outlast the
        # epoch-start threshold first (a stall of its own, rightly "in one fetch").
        both = len(snap["jobs"]) == 2 and all(j["loaders"] for j in snap["jobs"])
        ended = any(ld.get("epoch_open") is False for j in snap["jobs"] for ld in j["loaders"])
        return both and ended and stalled_with_stacks(snap)

    p, d, snap = _run_until_stalled("spawn-ranks", done)
    stop_sessions([p], grace=0.0)
    shutil.rmtree(d, ignore_errors=True)
    h = _stall_hint(snap)
    r0 = next(j for j in snap["jobs"] if j["pid"] == h["job_pid"])
    r1 = next(j for j in snap["jobs"] if j["pid"] != h["job_pid"])
    assert (r0["rank"], r0["local_rank"], r0["world_size"]) == (0, 0, 2)
    assert (r1["rank"], r1["local_rank"], r1["world_size"]) == (1, 1, 2)
    assert r0["run_id"] == r1["run_id"] and r0["run_id"].startswith("127.0.0.1:")
    assert h["evidence"]["cause"] == "uneven-ranks", (h, r0["stacks"]["summary"])
    assert f"rank 1 (pid {r1['pid']}) has finished its epoch" in h["message"]
    assert "Join" in h["suggestion"] and "drop_last" in h["suggestion"]
    # The hint is rank 1's verdict: not also "judging" (no epoch open).
    assert all(e["job_pid"] != r1["pid"] for e in snap.get("judging") or []), snap["judging"]
    _no_advice_beside_the_stall(snap)


def test_a_nodes_process_worker_that_hangs_or_dies_is_read_from_outside_and_named():
    """torchdata.nodes with method="process": its workers run no stack
    watcher and are not torch's. A QA run: the stall's stacks held the main
    thread alone, a SIGKILLed worker was never recorded, and the cause read
    "unknown" both ways. Now py-spy reads the workers from outside, the idle
    one reads idle (not "blocked in I/O" in its queue's poll), and the death
    is the cause. Both jobs run side by side."""
    stuck, d1 = start("nodes-process", "stuck")
    killed, d2 = start("nodes-process", "kill")

    def read(snap: dict) -> bool:
        entries = snap["jobs"] and snap["jobs"][0].get("stacks") and _worker_entries(snap["jobs"][0])
        return stalled_with_stacks(snap) and bool(entries) and all(e["kind"] or e["line"] for e in entries)

    try:
        a = wait_snapshot(
            d1, lambda s: read(s) and all(e["kind"] for e in _worker_entries(s["jobs"][0])), "the stuck one"
        )
        b = wait_snapshot(d2, read, "the killed nodes worker's stall")
    finally:
        stop_sessions([stuck, killed], grace=0.0)
        shutil.rmtree(d1, ignore_errors=True)
        shutil.rmtree(d2, ignore_errors=True)
    h = _stall_hint(a)
    ev = h["evidence"]
    kinds = {e["worker_id"]: e["kind"] for e in _worker_entries(a["jobs"][0])}
    assert sorted(kinds.values()) == ["idle", "sleep"], a["jobs"][0]["stacks"]["summary"]
    assert ev["cause"] == "worker-stuck" and "in nodes_map, hang_jobs.py" in h["message"], h
    (w,) = ev["workers_not_delivered"]
    pids = {p["pid"] for p in a["jobs"][0]["loaders"][0]["pipeline_workers"]}
    assert w["kind"] == "sleep" and w["pid"] in pids, w
    h = _stall_hint(b)
    ld = b["jobs"][0]["loaders"][0]
    (death,) = ld["worker_deaths"]
    assert death["signal"] == "SIGKILL" and death["id"] in (0, 1), death
    assert h["evidence"]["cause"] == "worker-died", h
    assert (
        f"worker {death['id']} (pid {death['pid']}) died (SIGKILL): torchdata.nodes does not notice"
        in h["message"]
    ), h["message"]


def test_a_worker_waiting_on_a_sentinel_and_a_worker_behind_a_siblings_lock_are_named():
    """Two hangs from public issues, side by side: a worker waits in a
    queue's get() for an end-of-data sentinel that went to the other one
    (a QA run read it "blocked in C" and sent the user to py-spy --native);
    a worker waits in sqlite for a write lock its sibling took and never
    released (read as an OpenMP pool copied at fork, with OMP_NUM_THREADS=1
    as the fix)."""
    work = short_tmpdir("dlwsql")
    queue_job, d1 = start("sentinel")
    sql_job, d2 = start("sqlite", os.path.join(work, "samples.db"))

    def named(snap: dict) -> bool:
        # Read from outside where the channel could not answer: every worker
        # that runs has its frame (the one whose share ended has exited).
        entries = stalled_with_stacks(snap) and _worker_entries(snap["jobs"][0])
        return bool(entries) and all(e["kind"] or "exited" in e["line"] for e in entries)

    try:
        a = wait_snapshot(d1, named, "the sentinel job's stall")
        b = wait_snapshot(d2, named, "the sqlite job's stall")
    finally:
        stop_sessions([queue_job, sql_job], grace=0.0)
        for d in (d1, d2, work):
            shutil.rmtree(d, ignore_errors=True)
    h = _stall_hint(a)
    assert h["evidence"]["cause"] == "worker-waits-on-queue", h
    assert "waits in a queue's get()" in h["message"] and "Stream.__iter__" in h["message"], h["message"]
    assert "one end-of-data sentinel per worker" in h["suggestion"]
    h = _stall_hint(b)
    assert h["evidence"]["cause"] == "worker-blocked-native", h
    assert "is idle: a lock one worker took and kept" in h["message"], h["message"]
    assert "OMP_NUM_THREADS" not in h["suggestion"] and "sqlite" in h["suggestion"]


def test_an_executor_and_a_pool_copied_by_fork_are_named_not_a_lock_or_a_timeout():
    """Two hangs from public issues, side by side, each read before with the
    right frame and the wrong cause: a dataset's executor made in the
    trainer and used in fork workers (datachain-ai/datachain#691, fsspec's
    IO loop) read "waits on a lock: find who holds that lock"; a loader run
    with num_workers=0 in a forked multiprocessing.Process after its parent
    ran it (pyg-team/pytorch_geometric#3565) read "give it a timeout"."""
    pool_job, d1 = start("executor")
    fork_job, d2 = start("forked-loop")
    try:
        a = wait_snapshot(d1, stalled_with_stacks, "the executor job's stall")
        b = wait_snapshot(d2, stalled_with_stacks, "the forked loop's stall")
    finally:
        stop_sessions([pool_job, fork_job], grace=0.0)
        for d in (d1, d2):
            shutil.rmtree(d, ignore_errors=True)
    h = _stall_hint(a)
    assert h["evidence"]["cause"] == "fork-inherited-executor", h
    assert "waits for a future in" in h["message"] and "Prefetching.__getitem__" in h["message"], h["message"]
    assert "(reader_0, reader_1)" in h["message"], h["message"]
    # The sample each worker is stuck on, read from its own frames.
    assert re.search(
        r"Prefetching.__getitem__, hang_jobs.py:\d+\), at sample \d+ of a batch of 2 \(indices", h["message"]
    )
    assert "in each worker" in h["suggestion"] and "find who holds" not in h["suggestion"], h
    (child,) = [j for j in b["jobs"] if any(ld.get("stalled_s") for ld in j["loaders"])]
    h = _stall_hint(b, child["pid"])
    assert h["evidence"]["cause"] == "fork-inherited-pool", h
    assert "forked by multiprocessing" in h["message"] and "<lambda>" in h["message"], h["message"]
    assert "get_context('spawn')" in h["suggestion"] and "timeout" not in h["suggestion"], h


def test_a_stopped_worker_is_named_with_kill_cont_and_the_loader_moves_once_it_continues():
    """A QA run: kill -STOP of a MONAI script's DataLoader worker read
    "every worker is idle" at the stall and, before it, other processes'
    CPU as the cause. Stopped, the worker is named with its pid and the
    command that resumes it; continued, the loader delivers again."""
    import signal

    p, d = start("steady")
    try:
        snap = wait_snapshot(
            d,
            lambda s: any(len(ld.get("workers") or []) == 2 for j in s["jobs"] for ld in j["loaders"]),
            "workers",
        )
        victim = snap["jobs"][0]["loaders"][0]["workers"][1]["pid"]
        os.kill(victim, signal.SIGSTOP)

        def named(s: dict) -> bool:
            return any(
                str(victim) in h["message"]
                and (h["id"] == "worker-stopped" or h["evidence"].get("cause") == "worker-stopped")
                for h in s["hints"]
            )

        snap = wait_snapshot(d, named, f"a hint naming the stopped worker {victim}")
        h = next(h for h in snap["hints"] if str(victim) in h["message"])
        assert f"kill -CONT {victim}" in h["suggestion"], h
        assert "is stopped (SIGSTOP" in h["message"], h
        rows = {w["pid"]: w for ld in snap["jobs"][0]["loaders"] for w in ld["workers"]}
        assert rows[victim]["state"] == "stopped", rows
        r = dlwatch("stacks", "--pid", str(p.pid), "--brief", runtime_dir=d)
        line = next((x for x in r.stdout.splitlines() if f"(pid {victim})" in x), "")
        assert "stopped (SIGSTOP or a debugger); where it stopped:" in line, r.stdout + r.stderr
        os.kill(victim, signal.SIGCONT)
        before = snap["jobs"][0]["loaders"][0]["batches_total"]
        wait_snapshot(
            d,
            lambda s: (
                s["jobs"][0]["loaders"][0]["batches_total"] > before + 10
                and not any(h["id"] in ("worker-stopped", "loader-stalled") for h in s["hints"])
            ),
            "the loader moving again, the hint gone",
        )
    finally:
        stop_sessions([p], grace=0.0)
        shutil.rmtree(d, ignore_errors=True)
