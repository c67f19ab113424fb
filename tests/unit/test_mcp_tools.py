"""`dlwatch mcp`: the tool functions without a transport, the server's list
of tools through the SDK in this process, and the command's refusals.

The tools against a real job, through the real stdio client, are in
tests/e2e/test_mcp.py."""

from __future__ import annotations

import os
import sys

import anyio
import pytest

from dlwatch.mcp import tools as T
from tests.e2e_util import dlwatch, short_tmpdir

NO_SUCH_PID = 2**22 + 1  # above Linux's largest pid_max: never a process


@pytest.fixture
def empty_dir(private_runtime_dir):
    return T.Tools(directory=private_runtime_dir)


def test_every_tool_is_a_method_and_says_what_it_measures_and_costs():
    names = [t.name for t in T.TOOLS]
    assert len(set(names)) == len(names)
    for spec in T.TOOLS:
        assert callable(getattr(T.Tools, spec.name, None)), spec.name
        assert "Cost:" in spec.description, spec.name
    assert [t.name for t in T.TOOLS if t.runs_commands] == ["tune"]
    assert "tune" not in [t.name for t in T.available(allow_run=False)]
    assert [t.name for t in T.available(allow_run=True)] == names


def test_explain_gives_a_hints_page_and_refuses_an_unknown_id(empty_dir):
    doc = empty_dir.explain("add-workers")
    assert doc["page"].startswith("# `add-workers`") and "## What to do" in doc["page"]
    with pytest.raises(T.ToolFailure, match="no hint 'made-up'"):
        empty_dir.explain("made-up")


def test_an_empty_runtime_dir_answers_with_no_jobs(empty_dir, private_runtime_dir):
    doc = empty_dir.list_jobs()
    assert doc["schema_version"] == 1 and doc["runtime_dir"] == private_runtime_dir and doc["jobs"] == []
    # Where it looked, and what to do when the user's shell sees jobs elsewhere.
    assert doc["note"].startswith(f"no dlwatch jobs in {private_runtime_dir}: ")
    assert "DLWATCH_DIR" in doc["note"]
    snap = empty_dir.snapshot(window_seconds=1.0)
    assert snap["schema_version"] == 1 and snap["jobs"] == [] and snap["hints"] == []
    hints = empty_dir.hints()
    assert hints["hints"] == [] and hints["note"].startswith("no hints")


@pytest.mark.parametrize("tool", ["snapshot", "hints", "profile", "worker_profile"])
def test_a_pid_that_is_no_job_of_ours_is_a_tool_failure(empty_dir, private_runtime_dir, tool):
    call = getattr(empty_dir, tool)
    missing = f"no dlwatch job with PID {NO_SUCH_PID} in {private_runtime_dir}"
    with pytest.raises(T.ToolFailure, match=missing):
        call(pid=NO_SUCH_PID)
    # PID 1 is alive but not ours: no socket of it in our directory.
    with pytest.raises(T.ToolFailure, match="PID 1 ") as e:
        call(pid=1)
    assert "\n" not in str(e.value)
    for bad in (0, -1, True):  # 0 and -1 name process groups to kill(2)
        with pytest.raises(T.ToolFailure, match="pid must be a process id"):
            call(pid=bad)


def test_bounds_are_checked_before_anything_is_asked(empty_dir):
    for w in (0.0, -1.0, T.MAX_WINDOW_S + 1):
        with pytest.raises(T.ToolFailure, match="window_seconds must be in"):
            empty_dir.snapshot(window_seconds=w)
    for j in (-1.0, T.MAX_JUDGE_S + 1):
        for tool in (empty_dir.snapshot, empty_dir.hints):
            with pytest.raises(T.ToolFailure, match="judge_seconds must be in"):
                tool(judge_seconds=j)
    # A burst's bounds are control.py's (the CLI's), checked before the job is looked for.
    with pytest.raises(T.ToolFailure, match="--steps must be 1..200"):
        empty_dir.profile(pid=NO_SUCH_PID, steps=10_000)
    with pytest.raises(T.ToolFailure, match="the time bound must be in"):
        empty_dir.profile(pid=NO_SUCH_PID, max_seconds=61)
    with pytest.raises(T.ToolFailure, match="--seconds must be in"):
        empty_dir.worker_profile(pid=NO_SUCH_PID, seconds=0)


def test_a_runtime_dir_that_is_not_private_is_refused_by_every_tool(private_runtime_dir):
    os.chmod(private_runtime_dir, 0o755)
    tools = T.Tools(directory=private_runtime_dir)
    for call in (
        tools.list_jobs,
        tools.snapshot,
        tools.hints,
        lambda: tools.profile(pid=1),
        lambda: tools.worker_profile(pid=1),
    ):
        with pytest.raises(T.ToolFailure, match="has mode 0755; it must give no access"):
            call()


def test_a_runtime_dir_too_long_for_a_socket_path_is_a_tool_failure(private_runtime_dir):
    deep = os.path.join(private_runtime_dir, "d" * 100)
    os.mkdir(deep, 0o700)
    tools = T.Tools(directory=deep)
    for call in (lambda: tools.snapshot(pid=12345), lambda: tools.profile(pid=12345)):
        with pytest.raises(T.ToolFailure, match="longer than the 107-byte limit of Unix sockets"):
            call()


def test_a_server_keeps_only_its_newest_traces(private_runtime_dir):
    tools = T.Tools(directory=private_runtime_dir)
    d = private_runtime_dir
    paths = [os.path.join(d, f"dlwatch-profile-1-{i}.json") for i in range(T.KEEP_TRACES + 2)]
    other = os.path.join(private_runtime_dir, "dlwatch-profile-2-0.json")  # not this server's
    for p in [*paths, other]:
        open(p, "w").close()
    tools._keep_trace(None)  # a burst that wrote none
    for p in paths:
        tools._keep_trace(p)
    kept = sorted(os.listdir(d))
    assert kept == sorted(os.path.basename(p) for p in [*paths[2:], other])


class Recorder:
    """Stands where the CLI's tune runner goes: what reached it."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def __call__(self, command, trial_s, max_trials, budget_s, workers):
        self.calls.append((command, trial_s, max_trials, budget_s, workers))
        return {"schema_version": 1, "recommendation": None}


def test_tune_refuses_without_a_runner_and_checks_every_argument_before_running():
    with pytest.raises(T.ToolFailure, match="dlwatch mcp --allow-run"):
        T.Tools().tune(command=[sys.executable, "train.py"])
    runner = Recorder()
    tools = T.Tools(tune_runner=runner)
    for kwargs, why in (
        ({"command": []}, "give the command"),
        ({"command": [""]}, "give the command"),
        ({"command": ["no-such-command-dlwatch"]}, "command not found: no-such-command-dlwatch"),
        ({"command": [sys.executable], "trial_seconds": 0}, "trial_seconds must be positive"),
        ({"command": [sys.executable], "max_trials": 0}, "max_trials must be between"),
        ({"command": [sys.executable], "budget_seconds": 1e9}, "budget_seconds must be in"),
        ({"command": [sys.executable], "workers": [2, 999]}, "workers must be"),
        ({"command": [sys.executable], "workers": []}, "workers must be"),
    ):
        with pytest.raises(T.ToolFailure, match=why):
            tools.tune(**kwargs)
    assert runner.calls == []
    doc = tools.tune(command=[sys.executable, "train.py"], workers=[0, 2])
    assert doc == {"schema_version": 1, "recommendation": None}
    defaults = (T.TUNE_TRIAL_S, T.TUNE_MAX_TRIALS, T.TUNE_BUDGET_S)
    assert runner.calls == [([sys.executable, "train.py"], *defaults, [0, 2])]


def test_the_server_lists_tune_only_when_allowed_and_answers_failures_as_tool_errors(private_runtime_dir):
    from mcp import Client

    from dlwatch.mcp.server import build

    async def session(runner):
        async with Client(build(private_runtime_dir, runner)) as c:
            listed = {t.name: t for t in (await c.list_tools()).tools}
            failed = await c.call_tool("profile", {"pid": NO_SUCH_PID})
            return listed, failed

    listed, failed = anyio.run(session, None)
    assert sorted(listed) == sorted(t.name for t in T.available(allow_run=False))
    assert all(t.annotations.read_only_hint for t in listed.values())
    described = {s.name: s.description for s in T.TOOLS}
    assert all(t.description == described[n] for n, t in listed.items())
    assert failed.is_error and f"no dlwatch job with PID {NO_SUCH_PID}" in failed.content[0].text
    listed, _ = anyio.run(session, Recorder())
    assert "tune" in listed and listed["tune"].annotations.read_only_hint is False
    assert listed["tune"].input_schema["required"] == ["command"]


def test_dlwatch_mcp_without_the_sdk_says_how_to_install_it(monkeypatch, capsys):
    import dlwatch.mcp
    from dlwatch.cli.main import main

    # `import mcp` (and of any module of it loaded before) now fails as if absent.
    for name in ["mcp", *(n for n in sys.modules if n.startswith(("mcp.", "mcp_types")))]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "dlwatch.mcp.server", raising=False)
    monkeypatch.delattr(dlwatch.mcp, "server", raising=False)
    assert main(["mcp"]) == 1
    err = capsys.readouterr().err
    assert err == "dlwatch mcp: needs the MCP SDK (mcp>=2.3): pip install 'dlwatch[mcp]'\n"


def test_dlwatch_mcp_refuses_a_runtime_dir_that_is_not_private():
    d = short_tmpdir()
    os.chmod(d, 0o777)
    r = dlwatch("mcp", runtime_dir=d)
    assert r.returncode == 1 and "has mode 0777" in r.stderr and "Traceback" not in r.stderr
    assert r.stdout == ""  # stdout is the protocol's


def test_hints_while_a_loader_is_judging_say_so_rather_than_nothing_to_fix(empty_dir, monkeypatch):
    # The live view prints "judging…" for a loader whose figures are still
    # settling; the agent's answer must not read that as "nothing to fix".
    snap = {
        "time": 1.0,
        "window_s": 3.0,
        "judged_s": 7.1,
        "jobs": [],
        "hints": [],
        "judging": [
            {"job_pid": 11, "loader_id": 0, "judging_s": 5.0, "reason": "3 of the 20 batches"},
            {"job_pid": 12, "loader_id": 0, "judging_s": 5.0, "reason": "3 of the 20 batches"},
        ],
    }
    monkeypatch.setattr(empty_dir, "_measure", lambda pid, window_s, judge_s: snap)
    doc = empty_dir.hints(pid=11)
    assert doc["judged_s"] == 7.1 and [j["job_pid"] for j in doc["judging"]] == [11]
    assert doc["note"].startswith("not judged yet: watched 7.1 s") and "nothing" not in doc["note"]
    # Asking the same again watches from scratch: the way on is a longer watch.
    assert "longer judge_seconds" in doc["note"]
    snap["judging"] = []
    doc = empty_dir.hints(pid=11)
    assert "judging" not in doc and doc["note"].startswith("no hints: nothing")


def test_hints_of_a_job_with_no_loader_measured_are_no_judgement(empty_dir, monkeypatch):
    # nanoGPT's train.py draws batches with its own get_batch(): the job is
    # listed, nothing measures its wait, and "nothing to fix" was an all-clear
    # on no evidence.
    steppers = [{"thread": "MainThread", "steps": 178}]
    job = {"pid": 11, "state": "live", "loaders": [], "train_threads": steppers}
    snap = {"time": 1.0, "window_s": 3.0, "judged_s": 7.1, "jobs": [job], "hints": [], "judging": []}
    monkeypatch.setattr(empty_dir, "_measure", lambda pid, window_s, judge_s: snap)
    doc = empty_dir.hints(pid=11)
    assert doc["note"].startswith("no hints: no loader of job 11 measured yet"), doc["note"]
    assert "nothing" not in doc["note"]
    (head,) = doc["jobs"]
    assert "stepped the optimizer 178 times" in head["note"] and "dlwatch.watch(" in head["note"]
    job["loaders"] = [{"id": 0, "data_wait_fraction": 0.02}]
    doc = empty_dir.hints(pid=11)
    assert doc["note"].startswith("no hints: nothing") and "note" not in doc["jobs"][0]


def test_a_wrappers_pid_names_the_job_to_ask(empty_dir, private_runtime_dir):
    # The agent was given the `dlwatch run` wrapper's PID (the one it started):
    # the failure names the job below it, as the CLI does (collect/whose.py).
    from tests.e2e_util import shell_and_child

    with shell_and_child() as (wrapper, job):
        # A socket file named for the child: what discover() lists as a job.
        open(os.path.join(private_runtime_dir, f"{job}.sock"), "w").close()
        for call in (empty_dir.snapshot, empty_dir.stacks):
            with pytest.raises(T.ToolFailure, match=f"use pid={job} ") as e:
                call(pid=wrapper)
            assert f"PID {wrapper} is not a dlwatch job: it started the job {job}" in str(e.value)
