"""The command line: help, version, no jobs, usage errors, and `dlwatch run`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dlwatch import __version__
from dlwatch.cli import main
from tests.e2e_util import dlwatch, short_tmpdir


def test_version_and_help():
    d = short_tmpdir()
    r = dlwatch("--version", runtime_dir=d)
    assert r.returncode == 0 and r.stdout.strip() == f"dlwatch {__version__}"
    r = dlwatch("--help", runtime_dir=d)
    assert r.returncode == 0
    for word in ("snapshot", "ls", "run", "demo", "DLWATCH_DIR", "DLWATCH_DISABLE"):
        assert word in r.stdout


def test_usage_error_exits_2():
    d = short_tmpdir()
    r = dlwatch("snapshot", "--window", "abc", runtime_dir=d)
    assert r.returncode == 2 and "argument --window: not a number: 'abc'" in r.stderr
    r = dlwatch("nonsense", runtime_dir=d)
    assert r.returncode == 2
    r = dlwatch("run", runtime_dir=d)
    assert r.returncode == 2 and "give the command" in r.stderr


@pytest.mark.parametrize(
    "argv, usage",
    [
        (["run", "--bogus", "--", "python", "x.py"], "usage: dlwatch run "),
        (["snapshot", "--window", "2", "--bogus"], "usage: dlwatch snapshot "),
        (["--bogus"], "usage: dlwatch [-h]"),
    ],
)
def test_an_unknown_option_is_reported_by_its_commands_usage(argv, usage, capsys):
    # argparse hands a command's unknown options to the top level, whose
    # usage never names the command (a QA run: `run --bogus` printed it).
    with pytest.raises(SystemExit) as e:
        main.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage), err
    assert "unrecognized arguments: --bogus" in err


def test_a_misspelt_option_before_the_command_is_named_not_its_value(capsys):
    # A new user's `dlwatch --intervl 1` read "invalid choice: '1' (choose
    # from 'ls', ...)": the unknown option's value was taken for the command.
    with pytest.raises(SystemExit) as e:
        main.main(["--intervl", "1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "unrecognized arguments: --intervl (did you mean --interval?)" in err, err
    assert "invalid choice" not in err


@pytest.mark.parametrize("exists", [True, False])
def test_no_jobs_is_a_message_and_exit_0(exists):
    d = short_tmpdir()
    if not exists:
        os.rmdir(d)
    for args in (("snapshot",), ("ls",)):
        r = dlwatch(*args, runtime_dir=d)
        assert r.returncode == 0, r.stderr
        assert "no dlwatch jobs found" in r.stdout and "Traceback" not in r.stderr
    r = dlwatch("snapshot", "--json", runtime_dir=d)
    snap = json.loads(r.stdout)
    assert snap["schema_version"] == 1 and snap["jobs"] == [] and snap["hints"] == []
    assert isinstance(snap["host"]["usable_cores"], float)
    assert snap["gpu_status"] == "ok" or snap["gpu_status"].startswith("n/a")
    r = dlwatch("ls", "--json", runtime_dir=d)
    assert json.loads(r.stdout)["jobs"] == []


def test_snapshot_pid_not_found_is_an_error():
    d = short_tmpdir()
    r = dlwatch("snapshot", "--pid", "999999", runtime_dir=d)
    assert r.returncode == 1 and "no dlwatch job with PID 999999" in r.stderr


def test_insecure_runtime_dir_is_refused():
    d = short_tmpdir()
    os.chmod(d, 0o777)
    r = dlwatch("snapshot", runtime_dir=d)
    assert r.returncode == 1 and "0777" in r.stderr and "Traceback" not in r.stderr
    # A script reading --json gets the document with the reason, not an empty stdout.
    r = dlwatch("snapshot", "--json", runtime_dir=d)
    assert r.returncode == 1 and "0777" in r.stderr
    snap = json.loads(r.stdout)
    assert snap["schema_version"] == 1 and snap["jobs"] == [] and "0777" in snap["runtime_dir_error"]


@pytest.mark.parametrize("parent", ["file", "readonly", "proc"])
def test_runtime_dir_that_cannot_be_created_says_why(parent):
    """No job can ever publish in a directory that cannot be created: say so
    instead of "no dlwatch jobs found"."""
    d = short_tmpdir()
    if parent == "proc":
        # /proc takes no new directory, from root either (access() says it may).
        target, why = "/proc/dlwatch-nope", "cannot be created in /proc"
    elif parent == "file":
        blocker = os.path.join(d, "not-a-dir")
        open(blocker, "w").close()
        target, why = os.path.join(blocker, "dlwatch"), "is not a directory"
    else:
        if os.geteuid() == 0:
            pytest.skip("root may write in a read-only directory")
        os.chmod(d, 0o500)
        target, why = os.path.join(d, "dlwatch"), "no permission to write"
    for args in (("snapshot",), ("ls",), ()):
        r = dlwatch(*args, runtime_dir=target)
        assert r.returncode == 1, (args, r.stdout)
        assert "cannot be created" in r.stderr and why in r.stderr and "no dlwatch jobs" not in r.stdout


def test_the_live_view_gets_a_profiler_on_its_collectors_runtime_dir(monkeypatch):
    """The CLI hands the TUI its profile runner (the TUI imports no job
    control): one that looks for the job where the collector does."""
    from dlwatch.cli.main import main
    from dlwatch.collect.control import ProfileError
    from dlwatch.tui import app as tui_app

    d = short_tmpdir()
    monkeypatch.setenv("DLWATCH_DIR", d)
    seen = {}
    monkeypatch.setattr(
        tui_app,
        "run_tui",
        lambda source, interval, profiler, worker_profiler, stacker, follow_pid=None: (
            seen.update(p=profiler, w=worker_profiler, s=stacker) or 0
        ),
    )
    assert main([]) == 0
    with pytest.raises(ProfileError, match=f"no dlwatch job with PID 4194305 in {d}$"):
        seen["p"](2**22 + 1, steps=3)
    with pytest.raises(ProfileError, match=f"no dlwatch job with PID 4194305 in {d}$"):
        seen["w"](2**22 + 1, seconds=1.0)
    # S: stacks are asked where the collector looks too, the failure an answer, not a raise.
    doc = seen["s"](2**22 + 1)
    assert doc["error"].endswith(f"no dlwatch job with PID 4194305 in {d}") and doc["processes"] == []


def test_a_command_builds_only_its_own_parser():
    # `dlwatch snapshot` must not pay for tune's imports (bench/snapshot_cost.py).
    code = (
        "import sys; from dlwatch.cli.main import build_parser; "
        "p = build_parser('snapshot'); print('dlwatch.tune' in sys.modules, 'tune' in p.format_help())"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.split() == ["False", "False"], r.stderr
    from dlwatch.cli.main import build_parser

    assert "tune" in build_parser("no-such-command").format_help()


def test_every_subcommand_is_one_module_with_help():
    """main finds the subcommands in dlwatch/cli/commands; each has a description."""
    from dlwatch.cli import commands
    from dlwatch.cli.main import build_parser

    names = [m.NAME for m in commands.modules()]
    assert names[:2] == ["ls", "snapshot"] and {"run", "demo"} <= set(names)
    for name in names:
        r = dlwatch(name, "--help", runtime_dir=short_tmpdir())
        assert r.returncode == 0 and f"usage: dlwatch {name}" in r.stdout
    assert "opens the live view" in " ".join(build_parser().format_help().split())
    r = dlwatch("run", "--help", runtime_dir=short_tmpdir())
    assert "with no change to the training script" in " ".join(r.stdout.split())
    r = dlwatch("snapshot", "--help", runtime_dir=short_tmpdir())
    assert "docs/reference/snapshot-json.md" in "".join(r.stdout.split())  # argparse may wrap at the hyphen


def _run_cmd(code: str, env_extra: dict, d: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DLWATCH_DIR=d, **env_extra)
    return subprocess.run(
        [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_run_activates_the_hook_and_keeps_pythonpath_and_sitecustomize(tmp_path):
    d = short_tmpdir()
    user = tmp_path / "userpath"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITECUSTOMIZE_RAN'] = '1'\n")
    (user / "mymod.py").write_text("VALUE = 42\n")
    code = textwrap.dedent("""
        import os, sys
        import mymod
        print(mymod.VALUE, os.environ.get('USER_SITECUSTOMIZE_RAN'),
              'dlwatch.hook' in sys.modules, 'torch' in sys.modules)
        import torch
        from torch.utils.data import DataLoader
        from dlwatch.probe import patches
        print(patches.installed())
        for _ in DataLoader(list(range(8)), batch_size=2):
            pass
        print(os.path.exists(os.path.join(os.environ['DLWATCH_DIR'], f'{os.getpid()}.sock')))
    """)
    r = _run_cmd(code, {"PYTHONPATH": str(user)}, d)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.split()
    # The user's module and sitecustomize still work; the hook is armed
    # without importing torch, patches once torch is imported, and the socket
    # exists while a loader has been iterated.
    assert lines == ["42", "1", "True", "False", "True", "True"], r.stdout


def test_run_passes_exit_status_and_reports_missing_command():
    d = short_tmpdir()
    r = _run_cmd("import sys; sys.exit(3)", {}, d)
    assert r.returncode == 3
    env = dict(os.environ, DLWATCH_DIR=d)
    r = subprocess.run(
        [sys.executable, "-m", "dlwatch", "run", "no-such-command-xyz"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 127 and "command not found" in r.stderr
    # A directory: exec says "permission denied", as a shell would not.
    script = os.path.join(d, "train.py")
    with open(script, "w") as f:
        f.write("print('hi')\n")
    for cmd, said in ((d, f"{d} is a directory, not a command"), (script, f"permission denied: {script}")):
        r = subprocess.run(
            [sys.executable, "-m", "dlwatch", "run", "--", cmd],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 126 and r.stderr.strip() == f"dlwatch run: {said}", r.stderr


def test_hook_import_is_light_and_side_effect_free():
    code = textwrap.dedent("""
        import sys, os, threading
        before = threading.active_count()
        import dlwatch.hook
        heavy = [m for m in ('torch', 'textual', 'psutil', 'pynvml', 'rich') if m in sys.modules]
        print(heavy, threading.active_count() - before, os.listdir(os.environ['DLWATCH_DIR']))
    """)
    d = short_tmpdir()
    r = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, DLWATCH_DIR=d),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[] 0 []"


def test_snapshot_text_says_what_a_window_covers_and_why_a_figure_is_missing():
    from dlwatch.cli.text import render_snapshot
    from tests import tui_fixtures as F

    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(window_s=10.2, window_batches=5)
    out = render_snapshot(snap)
    assert "data wait 62.0 %" in out and "(over 10 s, 5 batches)" in out
    ld.update(data_wait_fraction=None, window_batches=0, no_batch_reason="no batch yet: the loop is waiting")
    out = render_snapshot(snap)
    assert "data wait n/a" in out and "data wait n/a: no batch yet: the loop is waiting" in out
    assert "0.0 %" not in out


def test_no_hints_for_a_job_with_no_loader_measured_is_not_nothing_to_fix():
    # nanoGPT's get_batch() loop: "no loader seen yet: wrap …", then
    # "hints: none — nothing to fix", an all-clear on no evidence.
    from dlwatch.cli.text import render_snapshot
    from tests import tui_fixtures as F

    snap = F.data_bound(hints=False)
    job = snap["jobs"][0]
    job["loaders"], job["train_threads"] = [], [{"thread": "MainThread", "steps": 178}]
    out = render_snapshot(snap)
    assert "stepped the optimizer 178 times) but no loader seen yet" in out, out
    assert f"no hints: no loader of job {job['pid']} measured yet, so its data wait is not judged" in out
    assert "nothing to fix" not in out
    out = render_snapshot(F.data_bound(hints=False))
    assert "hints: none — nothing to fix" in out


def test_a_pipelines_settings_are_its_own_knobs_not_a_dataloaders():
    # A QA run: a torchdata.nodes graph read "pin_memory off, persistent off".
    from dlwatch.cli.text import render_snapshot
    from dlwatch.tui import fmt
    from dlwatch.tui.loader import loader_title
    from tests import tui_fixtures as F

    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(
        library="torchdata.nodes",
        dataset="Prefetcher",
        knobs={"ParallelMapper.num_workers": 4, "Prefetcher.prefetch_factor": 2},
    )
    out = render_snapshot(snap)
    assert "ParallelMapper.num_workers=4, Prefetcher.prefetch_factor=2" in out, out
    assert "pin_memory" not in out and "persistent off" not in out
    title = loader_title(ld, fmt.DEFAULT_PALETTE).plain
    assert "ParallelMapper.num_workers=4" in title and "pin " not in title and "persistent" not in title
    ld.update(library="torch", knobs=None, framework="accelerate", role=None)
    assert "(accelerate, " in render_snapshot(snap)
    assert "Accelerate" in loader_title(ld, fmt.DEFAULT_PALETTE).plain
    assert "pin_memory" in render_snapshot(snap)
    assert "persistent" in loader_title(ld, fmt.DEFAULT_PALETTE).plain


def test_snapshot_text_says_a_loader_is_not_judged_yet():
    from dlwatch.cli.text import render_snapshot
    from tests import tui_fixtures as F

    snap = F.data_bound(hints=False)
    pid = snap["jobs"][0]["pid"]
    snap["judging"] = [{"job_pid": pid, "loader_id": 0, "judging_s": None, "reason": "3 of the 20 batches"}]
    out = render_snapshot(snap)
    assert f"judging… loader 0 of PID {pid}: no hints until its rates settle (3 of the 20 batches" in out
    assert "hints: none yet" in out


def test_snapshot_follow_usage_errors(capsys):
    from dlwatch.cli.main import main

    for argv, why in (
        (["snapshot", "--count", "2"], "--count needs --follow"),
        # A QA run: --interval without --follow was silently ignored.
        (["snapshot", "--interval", "5"], "--interval needs --follow (one snapshot's span is --window)"),
        (["snapshot", "--follow", "--count", "0"], "--count must be 1 or more"),
        (["snapshot", "--follow", "--interval", "0.1"], "--interval must be between 0.5 and 60 seconds"),
        (["snapshot", "--follow", "--window", "0"], "--window must be positive"),
    ):
        assert main(argv) == 2
        assert capsys.readouterr().err == f"dlwatch snapshot: {why}\n"


@pytest.mark.parametrize(
    "status,words",
    [
        (-2, "interrupted (Ctrl-C, SIGINT); the recording is kept"),
        (130, "interrupted (Ctrl-C, SIGINT)"),
        (-15, "stopped (SIGTERM)"),
        (-9, "killed by SIGKILL"),
        (7, "the command exited with status 7"),
        (0, "the command exited with status 0"),
    ],
)
def test_run_says_how_the_command_ended(status, words):
    from dlwatch.cli.commands.run import exit_reason

    assert words in exit_reason(status) and "status -" not in exit_reason(status)


def test_tune_help_is_wrapped_to_the_terminal():
    r = subprocess.run(
        [sys.executable, "-m", "dlwatch", "tune", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, COLUMNS="100"),
    )
    assert r.returncode == 0 and "Little's-law" in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= 100


def test_record_pid_of_a_process_that_is_no_job_says_so_up_front():
    from dlwatch.cli.commands.record import not_a_job_problem

    d = short_tmpdir()
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        problem = not_a_job_problem(p.pid, d, 0.0)
    finally:
        p.kill()
        p.wait()
    assert problem is not None
    assert f"PID {p.pid} is not instrumented by dlwatch" in problem and "dlwatch ls" in problem


def test_snapshot_text_epoch_start_in_a_first_epoch_hang_is_under_way_not_unstarted():
    from dlwatch.cli.text import render_snapshot
    from tests import tui_fixtures as F

    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    ld.update(epoch=1, epoch_start_ms_last=None)
    out = render_snapshot(snap)
    assert "epoch 1   epoch start still under way (no first batch yet)" in out
    assert "no epoch started" not in out
    ld.update(epoch=0)
    assert "epoch start n/a (no epoch started yet)" in render_snapshot(snap)


def _with_stacks(reason: str, age_s: float, pids: list[int]) -> dict:
    from tests import tui_fixtures as F

    snap = F.data_bound()
    snap["jobs"][0]["stacks"] = {
        "reason": reason,
        "t": snap["time"] - age_s,
        "summary": [
            {"pid": p, "line": f"worker {i} (pid {p}): sleeping in Cold.__getitem__"}
            for i, p in enumerate(pids)
        ],
    }
    return snap


def test_snapshot_stacks_say_their_age_and_mark_workers_that_exited_since():
    from dlwatch.cli.text import render_snapshot

    # A request's stacks of an earlier epoch's worker (7891), 20 s old: the
    # current workers are 4301..4304. Before, no age and no mark.
    out = render_snapshot(_with_stacks("request", 20.0, [7891, 4301]))
    assert "stacks (request, taken 20 s ago; dlwatch stacks --pid 4242" in out, out
    assert "worker 0 (pid 7891): sleeping in Cold.__getitem__ (exited since)" in out
    assert "worker 1 (pid 4301): sleeping in Cold.__getitem__\n" in out + "\n"
    snap = _with_stacks("request", 5.0, [4242, 5555])
    snap["jobs"][0]["loaders"][0]["pipeline_workers"] = [{"kind": "process", "pid": 5555}]
    assert "(exited since)" not in render_snapshot(snap)
    # Two minutes old: left out, with where new ones come from.
    out = render_snapshot(_with_stacks("request", 120.0, [7891]))
    assert "pid 7891" not in out
    assert (
        "stacks: the last ones (request) were taken 2 min ago, not shown: `dlwatch stacks --pid 4242`" in out
    )


def test_snapshot_stall_stacks_after_the_stall_ended_say_so_and_a_live_stall_keeps_them():
    from dlwatch.cli.text import render_snapshot

    snap = _with_stacks("stall", 7.0, [4301])
    out = render_snapshot(snap)
    assert "stacks (stall, taken 7 s ago; the stall has since ended;" in out, out
    # Still stalled: the stall's stacks are what it waits on, however old.
    snap = _with_stacks("stall", 80.0, [4301])
    snap["jobs"][0]["loaders"][0]["stalled_s"] = 81.0
    out = render_snapshot(snap)
    assert "stacks (stall, taken 80 s ago; dlwatch stacks" in out and "(pid 4301): sleeping" in out


def test_the_demo_jobs_output_is_named_only_when_the_job_failed(tmp_path, monkeypatch):
    """`dlwatch demo` writes its job's output to a file without a name: a
    monitor killed before its clean-up (its terminal closed) leaves nothing in
    the temp dir. A job that failed has its output saved under a name, which
    the monitor prints; one that was stopped, or an unwritable temp dir, no
    file (and no traceback)."""
    import signal
    import tempfile

    from dlwatch.cli.commands.demo import keep_log

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def job(code: str) -> tuple[subprocess.Popen, object]:
        log = tempfile.TemporaryFile()
        p = subprocess.Popen([sys.executable, "-c", code], stdout=log, stderr=subprocess.STDOUT)
        p.wait(timeout=30)
        return p, log

    p, log = job("import sys; print('epoch 0: loss nan'); sys.exit(3)")
    assert os.listdir(tmp_path) == []  # nothing named while it ran
    path = keep_log(p, log)
    assert os.path.dirname(path) == str(tmp_path) and os.path.basename(path).startswith(
        f"dlwatch-demo-{os.getpid()}-"
    )
    assert open(path).read() == "epoch 0: loss nan\n" and oct(os.stat(path).st_mode & 0o777) == "0o600"
    os.unlink(path)
    for code in ("print('fine')", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"):
        p, log = job(code)
        assert p.returncode in (0, -signal.SIGTERM) and keep_log(p, log) == ""
    assert os.listdir(tmp_path) == []
    # Nowhere to save it: said, not raised.
    p, log = job("raise SystemExit(3)")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "gone"))
    assert keep_log(p, log).startswith("(not saved: ")


def test_a_dataloader_subclass_is_named_where_the_loader_is_listed():
    # The class the script builds (litdata's StreamingDataLoader, an
    # Accelerate shard) is what the user looks for in their code; a plain
    # DataLoader adds nothing, and a library's own loader keeps its name.
    from dlwatch.cli.text import render_snapshot
    from dlwatch.tui import fmt
    from dlwatch.tui.loader import loader_title
    from tests import tui_fixtures as F

    snap = F.data_bound()
    ld = snap["jobs"][0]["loaders"][0]
    head = render_snapshot(snap).splitlines()
    (plain_line,) = [ln for ln in head if ln.startswith("  loader 0 (")]
    assert "DataLoader" not in plain_line and "DataLoader" not in loader_title(ld, fmt.Palette()).plain
    ld["loader_class"] = "StreamingDataLoader"
    (line,) = [ln for ln in render_snapshot(snap).splitlines() if ln.startswith("  loader 0 (")]
    assert line == plain_line.replace("): ", ", StreamingDataLoader): ", 1)
    assert "StreamingDataLoader" in loader_title(ld, fmt.Palette()).plain
    ld.update(library="monai", loader_class="ThreadDataLoader")
    assert "ThreadDataLoader" in loader_title(ld, fmt.Palette()).plain


def _number_options(parser) -> list[tuple[list[str], str]]:
    """(command words, option) for every option that takes a number of
    seconds, a speed or a percentage, in every command's parser."""
    import argparse

    from dlwatch.cli.common import number

    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += [([name, *words], opt) for words, opt in _number_options(sub)]
        elif action.option_strings:
            assert action.type is not float, f"{action.option_strings}: type=float lets nan through"
            if action.type is number:
                out.append(([], action.option_strings[-1]))
    return out


@pytest.mark.parametrize("bad", ["nan", "inf", "-inf"])
def test_no_number_option_takes_nan_or_infinity(bad, capsys):
    # A QA run: `snapshot --window nan` ended in a traceback, `record
    # --duration nan` never stopped, the live view's collector died on it.
    from dlwatch.cli.main import build_parser, main

    options = _number_options(build_parser())
    assert len(options) >= 12 and (["snapshot"], "--window") in options, options
    for words, opt in options:
        argv = [*words, f"{opt}={bad}"] + (["a", "b"] if words[:1] == ["compare"] else [])
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
        err = capsys.readouterr().err
        assert f"argument {opt}: must be a finite number, not '{bad}'" in err, (argv, err)


def test_the_live_view_refuses_a_pipe_or_a_file_and_says_what_to_use(tmp_path):
    """A QA run: `dlwatch > out.txt` and `dlwatch | cat` wrote escape codes
    until killed. The view and a replay now say what to use instead, at once."""
    import pty

    from dlwatch.tui.app import terminal_problem

    master, slave = pty.openpty()
    try:
        with (
            open(slave, "w", closefd=False) as tty,
            open(os.devnull) as devnull,
            open(tmp_path / "f", "w") as f,
        ):
            assert terminal_problem(tty, tty, term="xterm-256color") is None
            assert "TERM is 'dumb' here" in (terminal_problem(tty, tty, term="dumb") or "")
            assert "its output is not one" in (terminal_problem(tty, f) or "")
            assert "its input is not one" in (terminal_problem(devnull, tty) or "")
            f.close()  # a closed stream: isatty() raises ValueError
            assert terminal_problem(tty, f) is not None
    finally:
        os.close(master)
        os.close(slave)
    from tests.unit.test_record import stream, write

    recording = write(tmp_path / "r.jsonl.gz", stream(3))
    for argv, prog, instead in (
        ([], "dlwatch", "`dlwatch snapshot`"),
        (["replay", str(recording)], "dlwatch replay", f"`dlwatch report {recording}`"),
    ):
        r = subprocess.run(
            [sys.executable, "-m", "dlwatch", *argv],
            env=dict(os.environ, DLWATCH_DIR=short_tmpdir()),
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert r.returncode == 2 and r.stdout == "", (argv, r.stdout[:200])
        said = f"{prog}: the live view needs a terminal, and its output is not one"
        assert r.stderr.startswith(said), r.stderr
        assert instead in r.stderr and "Traceback" not in r.stderr


def test_the_live_view_opens_on_the_first_attached_job(monkeypatch):
    # A QA run: `dlwatch --attach P` opened on another, stalled, hooked job.
    from dlwatch.collect import attach

    seen = {}
    monkeypatch.setattr(attach, "preflight", lambda pid: None)
    monkeypatch.setattr(main, "open_live_view", lambda args: seen.setdefault("args", args) and 0)
    assert main.main(["--attach", "4242", "--attach", "77"]) == 0
    assert seen["args"].follow_pid == 4242
