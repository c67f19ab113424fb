"""End to end: `dlwatch mcp` as an agent meets it. The SDK's own stdio client
starts the real server process and calls its tools about one real hooked
job, shared by every test here (a module fixture); the job logs each of its
batches as it goes, so the loop's own figure is there while it runs."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from anyio.from_thread import start_blocking_portal
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

import dlwatch as dlwatch_pkg
from dlwatch import snapshot as S
from dlwatch.collect import whose
from tests.e2e_util import Job, dlwatch, short_tmpdir, truth_in_window

ROOT = Path(__file__).resolve().parents[2]
READ_ONLY = ["list_jobs", "snapshot", "hints", "explain", "profile", "worker_profile", "stacks"]
NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max
MCP_CMD = ["-m", "dlwatch", "mcp"]


class Agent:
    """A connected client session, called from a test's own thread."""

    def __init__(self, portal, session, errlog) -> None:
        self.portal, self.session, self.errlog = portal, session, errlog

    def tools(self) -> dict:
        return {t.name: t for t in self.portal.call(self.session.list_tools).tools}

    def call(self, name: str, **arguments):
        return self.portal.call(self.session.call_tool, name, arguments)

    def ok(self, name: str, **arguments) -> dict:
        r = self.call(name, **arguments)
        assert not r.is_error, r.content
        # The text the model reads is the same document as the structured one.
        assert json.loads(r.content[0].text) == r.structured_content
        return r.structured_content

    def server_log(self) -> str:
        self.errlog.seek(0)
        return self.errlog.read()


@contextlib.contextmanager
def connected(runtime_dir: str, *flags: str):
    """``dlwatch mcp FLAGS`` started by the SDK's stdio client, initialised."""
    params = StdioServerParameters(
        command=sys.executable,
        args=[*MCP_CMD, *flags],
        env={"DLWATCH_DIR": runtime_dir},
        cwd=str(ROOT),
    )
    with tempfile.TemporaryFile("w+") as errlog, start_blocking_portal() as portal:
        with portal.wrap_async_context_manager(stdio_client(params, errlog=errlog)) as (read, write):
            with portal.wrap_async_context_manager(ClientSession(read, write)) as session:
                portal.call(session.initialize)
                yield Agent(portal, session, errlog)


@pytest.fixture(scope="module")
def job():
    # Data-bound by the costs (e2e_snapshot's "fork" case): 2 workers deliver
    # a batch every ~10 ms, the loop eats one every 5 ms, ~50 % wait. Sleeps,
    # so the truth does not depend on how busy the box is. It runs until the
    # fixture ends (killed then).
    logs = short_tmpdir("dlwlog")
    j = Job("--duration", "300", "--batch-log", os.path.join(logs, "batches.txt"))
    j.batch_log = os.path.join(logs, "batches.txt")
    try:
        j.wait_ready(2.5)
        yield j
    finally:
        j.cleanup()
        shutil.rmtree(logs, ignore_errors=True)


@pytest.fixture(scope="module")
def agent(job):
    with connected(job.dir) as a:
        yield a
        log = a.server_log()
    # Every refusal above was an answer, not a crash in the server.
    assert "Traceback" not in log, log


def marker_command(path: str) -> list[str]:
    """A command that leaves ``path`` behind, holding the package folder of
    the dlwatch bootstrap it ran under (none: not under `dlwatch tune`)."""
    code = f"import os; open({path!r}, 'w').write(os.environ.get('DLWATCH_PKG_DIR', 'none'))"
    return [sys.executable, "-c", code]


def _cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def test_the_read_only_server_lists_its_tools_and_starts_nothing(agent, job):
    tools = agent.tools()
    assert sorted(tools) == sorted(READ_ONLY)
    for t in tools.values():
        assert "Cost:" in t.description and t.annotations.read_only_hint is True, t
    assert tools["profile"].input_schema["required"] == ["pid"]
    # stdio only: the server process has no network socket at all. (A child
    # that has just exited, such as the job's worker at an epoch's end, is a
    # zombie a moment: it has no command line to read, and is not the server.)
    (server,) = [p for p in psutil.Process().children(recursive=True) if _cmdline(p)[1:4] == MCP_CMD]
    assert server.net_connections(kind="inet") == []
    marker = os.path.join(job.workdir, "ran-read-only")
    r = agent.call("tune", command=marker_command(marker), trial_seconds=1, max_trials=1)
    assert r.is_error and "Unknown tool: tune" in r.content[0].text
    assert not os.path.exists(marker)


def test_list_jobs_is_ls_json(agent, job):
    doc = agent.ok("list_jobs")
    cli = json.loads(dlwatch("ls", "--json", runtime_dir=job.dir).stdout)
    assert [j["pid"] for j in doc["jobs"]] == [j["pid"] for j in cli["jobs"]] == [job.proc.pid]
    (row,) = doc["jobs"]
    assert row.keys() == cli["jobs"][0].keys()
    assert row["state"] == "live" and "timed_job.py" in row["cmdline"] and row["loaders"] == 1


def _logged(job) -> list[tuple[int, ...]]:
    """The batches the loop has logged: (epoch, next() began, it returned), its monotonic ns."""
    with open(job.batch_log) as f:
        return [tuple(map(int, line.split())) for line in f if line.count(" ") == 2]


def _loops_own(job, start: int, end: int) -> float:
    """The loop's own data-wait fraction over [start, end] (monotonic ns)."""
    return truth_in_window(_logged(job), start, end)["data_wait_fraction"]


def test_the_snapshot_and_hints_are_about_the_job(agent, job):
    pid = job.proc.pid
    snap = agent.ok("snapshot", pid=pid)
    assert S.problems(snap) == []
    (j,) = snap["jobs"]
    (ld,) = j["loaders"]
    assert j["pid"] == pid and ld["num_workers"] == 2 and len(ld["workers"]) == 2
    # The job's figure: the loop's own over the same window. Not a fixed
    # 0.3-0.7 around the ~50 % its costs give on a quiet box: beside the
    # parallel tier its sleeping workers wake late and the loop really
    # waited 70 % (README run of 2026-11-30). 10 points: this tier's
    # preemptions; the 2-point accuracy is the timing tier's test below.
    assert ld["data_wait_fraction"] == pytest.approx(_loops_own(job, *ld["window_mono_ns"]), abs=0.1), ld
    # Judged as the live view judges (held 3 s): beside the parallel tier's
    # load "other processes decide" may be the held story and no hint about
    # the job shows; that the hints say why is the timing tier's test below.
    # There, a story that changes as the load does may take longer than the
    # default 7 s to hold (fresh-clone run 17): the agent's longer watch.
    doc = agent.ok("hints", pid=pid, judge_seconds=30)
    answered = time.monotonic_ns()
    (headline,) = doc["jobs"]
    assert headline["pid"] == pid and headline["state"] == "live", doc
    # Its window (3 s, not in the headline) ended by the answer: the loop's
    # own figure over the 3.5 s before it.
    own = _loops_own(job, answered - 3_500_000_000, answered)
    assert headline["loaders"][0]["data_wait_fraction"] == pytest.approx(own, abs=0.1), (headline, own)
    assert doc["judged_s"] > 0 and not doc.get("judging"), doc
    assert {h.get("job_pid") for h in doc["hints"]} <= {pid, None}, doc["hints"]


# Which hint explains the wait is judged on CPU shares (test_scenarios'
# CPU_SHARE_HINTS): beside the parallel tier's spawn storms the sleeping
# workers can wait for a core most of their busy time, and then "other
# processes decide" is the right story, not this one. Hence the timing tier.
@pytest.mark.timing
def test_the_hints_say_why_the_job_is_slow(agent, job):
    pid = job.proc.pid
    # Watched until judged, as the test above: with the default watch a
    # story still settling after a load change showed no hint yet (fresh-clone
    # run 32 reran it: hints []).
    doc = agent.ok("hints", pid=pid, judge_seconds=30)
    # What the box was doing, said when the story is not the one expected.
    why = lambda: (doc, _box(agent.ok("snapshot", pid=pid, judge_seconds=0)))  # noqa: E731
    assert doc["judged_s"] > 0 and not doc.get("judging"), why()
    # The first hint about this job's loader (host-wide ones name no job).
    mine = [h for h in doc["hints"] if h.get("job_pid") is not None]
    assert all(h["job_pid"] == pid for h in mine) and mine, why()
    top = mine[0]
    assert top["job_pid"] == pid and top["loader_id"] == 0, top
    ev = top["evidence"]
    assert ev["data_wait_fraction"] > 0.3, top
    if top["id"] == "cores-shared-with-others":
        # The CI run of stop 50 had other work on the box in this test: the
        # loop waited while its workers idled for cores (no hint then, the
        # engine's fault). That story, with its figures, is the right one.
        assert ev["others_decide"] is True and ev["recommended_num_workers"] is None, top
        assert ev["other_cpu_cores"] >= 0.5 and ev["jobs_runqueue_cores"] >= 0.2, top
        return
    # The workers sleep (off-CPU): more of them is the answer, with its figures.
    # (Its severity follows the gain the free cores allow: load-sensitive here.)
    assert top["id"] in ("io-bound", "add-workers"), why()
    # A count when the gain is worth it; under 10 % no setting is advised and
    # the count weighed is `considered_num_workers` (issue 32's "no 1.00x advice").
    count = (
        ev["recommended_num_workers"]
        if ev["recommended_num_workers"] is not None
        else ev.get("considered_num_workers")
    )
    assert count is not None and count >= 3 and "num_workers" in top["suggestion"], top


def _box(snap: dict) -> dict:
    """The figures a worker-count story is judged on, from a snapshot."""
    (j,) = snap["jobs"]
    (ld,) = j["loaders"]
    keys = ("busy_fraction", "cpu_percent", "runqueue_percent")
    return {
        "data_wait_fraction": ld.get("data_wait_fraction"),
        "workers": [{k: w.get(k) for k in keys} for w in ld["workers"]],
        "main_cpu_percent": j.get("main_cpu_percent"),
        "main_runqueue_percent": j.get("main_runqueue_percent"),
        "host": {k: v for k, v in snap.get("host", {}).items() if "cpu" in k or "core" in k},
    }


# Within 2 points of the loop's own figure over the same window, as
# `dlwatch snapshot` (test_e2e_snapshot.py): beside the parallel tier a
# preemption between the loop's clock reads and the probe's parts them by a
# point or more, hence the timing tier.
@pytest.mark.timing
def test_the_data_wait_is_the_loops_own(agent, job):
    snap = agent.ok("snapshot", pid=job.proc.pid, window_seconds=2.0)
    (ld,) = snap["jobs"][0]["loaders"]
    start, end = ld["window_mono_ns"]
    assert end - start > 1.5e9, "the window should cover about 2 s"
    batches = _logged(job)
    assert batches and batches[-1][2] >= end, "the loop logged past the window"
    truth = truth_in_window(batches, start, end)
    why = ({k: v for k, v in ld.items() if k != "workers"}, truth)
    assert ld["data_wait_fraction"] == pytest.approx(truth["data_wait_fraction"], abs=0.02), why
    assert ld["batches_per_s"] == pytest.approx(truth["batches_per_s"], rel=0.10), why


def test_a_profiler_burst_and_a_worker_profile_of_the_job(agent, job):
    pid = job.proc.pid
    doc = agent.ok("profile", pid=pid, steps=5)
    assert doc["pid"] == pid and doc["steps"] == 5 and doc["verdict"] and doc["suggestion"]
    # The trace lands in the private runtime directory, not in the server's cwd.
    assert os.path.dirname(doc["trace_path"]) == job.dir and os.path.exists(doc["trace_path"])
    doc = agent.ok("worker_profile", pid=pid, seconds=1.0)
    assert doc["pid"] == pid and doc["samples"] > 0 and doc["workers_lost"] == 0
    # The job's own (fork) workers: its children.
    assert {w["pid"] for w in doc["workers"]} <= {c.pid for c in psutil.Process(pid).children()}


def test_the_stacks_of_the_job_name_every_process(agent, job):
    pid = job.proc.pid
    doc = agent.ok("stacks", pid=pid)
    assert doc["pid"] == pid and doc["source"] == "job" and not doc["error"]
    roles = [p["role"] for p in doc["processes"]]
    assert roles.count("trainer") == 1 and "worker" in roles, roles
    # One line per process, each naming its pid.
    pids = {p["pid"] for p in doc["processes"]}
    assert all(any(f"pid {q}" in e["line"] for e in doc["summary"]) for q in pids), doc["summary"]


# What PID 1 is, as dlwatch says it (a Python init is "not instrumented", a
# container's process_api "not a Python process").
PID_1 = whose.explain(1, set(), "/nowhere")[1].split(" (no socket")[0].split(":")[0]


@pytest.mark.parametrize(
    "tool,arguments,why",
    [
        ("snapshot", {"pid": NO_SUCH_PID}, f"no dlwatch job with PID {NO_SUCH_PID}"),
        ("hints", {"pid": 1}, PID_1),
        ("profile", {"pid": 1}, PID_1),
        ("worker_profile", {"pid": NO_SUCH_PID}, f"no dlwatch job with PID {NO_SUCH_PID}"),
        ("stacks", {"pid": 1}, PID_1),
        ("snapshot", {"pid": -1}, "pid must be a process id"),
        ("snapshot", {"pid": "abc"}, "valid integer"),
        ("snapshot", {"window_seconds": 0}, "window_seconds must be in"),
        ("profile", {"pid": 1, "steps": 10_000}, "--steps must be 1..200"),
    ],
)
def test_bad_arguments_are_tool_errors_and_the_server_goes_on(agent, tool, arguments, why):
    r = agent.call(tool, **arguments)
    assert r.is_error and why in r.content[0].text, r.content
    assert sorted(agent.tools()) == sorted(READ_ONLY)  # still answering


def test_allow_run_adds_tune_which_runs_the_command_under_the_hook(job):
    with connected(job.dir, "--allow-run") as agent:
        tools = agent.tools()
        assert sorted(tools) == sorted([*READ_ONLY, "tune"])
        assert tools["tune"].annotations.read_only_hint is False and "STARTS" in tools["tune"].description
        r = agent.call("tune", command=["no-such-command-dlwatch"])
        assert r.is_error and "command not found: no-such-command-dlwatch" in r.content[0].text
        # A command with no DataLoader: one trial that ends before a batch (a
        # real tune of a training job takes minutes: test_tune.py has those).
        marker = os.path.join(job.workdir, "ran-allowed")
        doc = agent.ok("tune", command=marker_command(marker), trial_seconds=1, max_trials=1)
        assert doc["baseline"]["status"] == "exited" and doc["recommendation"] is None, doc["baseline"]
        assert "--allow-run: the tune tool may start the commands the agent names" in agent.server_log()
    with open(marker) as f:
        assert f.read() == os.path.dirname(dlwatch_pkg.__file__)  # started by tune's bootstrap
