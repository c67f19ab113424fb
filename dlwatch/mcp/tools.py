"""The tools of ``dlwatch mcp``: what an agent may ask, over the contracts the
command line already has (``ls --json``, ``snapshot --json``, the hints,
``profile --json``, ``profile --workers --json``, ``tune --json``).

Plain functions returning JSON-able documents, with no MCP in sight, so
they are tested without a transport; ``dlwatch.mcp.server`` lists them.
Each call reads this user's runtime directory as the CLI does (its checks in
``dlwatch.rundir``; each job checks the caller's uid on its socket). A call
that cannot be answered raises ``ToolFailure`` with one line for the agent.

Adding a tool: a method on ``Tools`` and a ``ToolSpec`` in ``TOOLS`` (its
name, what it measures and what it costs); the server lists it from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from dlwatch import rundir, wire
from dlwatch.collect import whose
from dlwatch.collect.control import ProfileError, request_profile, request_worker_profile
from dlwatch.collect.hang import gather_stacks
from dlwatch.collect.jobs import discover
from dlwatch.collect.listing import list_jobs
from dlwatch.collect.loop_role import no_loader_yet
from dlwatch.collect.monitor import DEFAULT_WINDOW_S, JUDGE_S, take_snapshot
from dlwatch.record.fileformat import compact
from dlwatch.snapshot import records, severity_rank, unmeasured_jobs, unmeasured_line

# Jobs keep about two minutes of frames (collect/jobs.py MAX_FRAMES at 10 a
# second): a longer window would cover less than it says.
MAX_WINDOW_S = 120.0
# As `dlwatch snapshot --judge`: a warm-up longer than this is the live view's to watch.
MAX_JUDGE_S = 120.0
# A tune call from an agent: shorter than the CLI's defaults (20 s trials, 8
# of them), so that one call ends in minutes, not a quarter of an hour.
TUNE_TRIAL_S = 10.0
TUNE_MAX_TRIALS = 4
TUNE_BUDGET_S = 300.0
TUNE_MAX_BUDGET_S = 3600.0
MAX_WORKERS = 256  # as `dlwatch tune --workers`
# Profiler traces a server keeps in the runtime directory (the newest).
KEEP_TRACES = 5


class ToolFailure(Exception):
    """The call cannot be answered; the message says why, in one line."""


class TuneRunner(Protocol):
    """How the server runs ``dlwatch tune`` (handed in by the CLI, which owns
    the bootstrap environment; absent unless the user allowed it)."""

    def __call__(
        self, command: list[str], trial_s: float, max_trials: int, budget_s: float, workers: list[int] | None
    ) -> dict[str, Any]: ...


@dataclass(frozen=True)
class ToolSpec:
    name: str  # a method of Tools
    description: str  # what it measures, what it returns, what it costs
    # Starts the user's command: listed only when the server was started
    # with --allow-run.
    runs_commands: bool = False


@dataclass
class Tools:
    directory: str | None = None  # the runtime directory (default: this user's)
    tune_runner: TuneRunner | None = None
    # The traces this server's bursts wrote, oldest first (KEEP_TRACES of them).
    traces: deque[str] = field(default_factory=deque)

    def list_jobs(self) -> dict[str, Any]:
        doc = list_jobs(self.directory)
        if doc.get("runtime_dir_error"):
            raise ToolFailure(doc["runtime_dir_error"])
        if not doc["jobs"]:
            doc["note"] = (
                f"no dlwatch jobs in {doc['runtime_dir']}: instrument one with `import dlwatch.hook` or "
                "`dlwatch run -- python train.py`. If `dlwatch ls --json` in the user's shell shows jobs, "
                "its runtime_dir differs: set DLWATCH_DIR to it in this server's environment (docs/mcp.md)"
            )
        return doc

    def snapshot(
        self, pid: int | None = None, window_seconds: float = DEFAULT_WINDOW_S, judge_seconds: float = JUDGE_S
    ) -> dict[str, Any]:
        return self._measure(pid, window_seconds, judge_seconds)

    def hints(
        self, pid: int | None = None, window_seconds: float = DEFAULT_WINDOW_S, judge_seconds: float = JUDGE_S
    ) -> dict[str, Any]:
        snap = self._measure(pid, window_seconds, judge_seconds)
        hints = sorted(records(snap.get("hints")), key=lambda h: severity_rank(h.get("severity")))
        if pid is not None:
            hints = [h for h in hints if h.get("job_pid") in (pid, None)]
        doc: dict[str, Any] = {
            "time": snap.get("time"),
            "window_s": snap.get("window_s"),
            "jobs": [_headline(j) for j in records(snap.get("jobs"))],
            "hints": hints,
            "judged_s": snap.get("judged_s"),
        }
        # The same state the live view shows: a loader still warming up has
        # no hints yet, which is not "nothing to fix".
        judging = [j for j in records(snap.get("judging")) if pid is None or j.get("job_pid") == pid]
        if judging:
            doc["judging"] = judging
        if snap.get("hints_error"):
            doc["hints_error"] = snap["hints_error"]
        elif judging:
            doc["note"] = (
                f"not judged yet: watched {snap.get('judged_s')} s, and the figures of "
                f"{len(judging)} loader(s) are still settling (see judging); ask again with a longer "
                "judge_seconds (each call watches from scratch)"
            )
        elif not hints and (unmeasured := unmeasured_jobs(snap.get("jobs"), pid)):
            doc["note"] = unmeasured_line(unmeasured) + " (see the job's note)"
        elif not hints:
            doc["note"] = "no hints: nothing in the input pipeline needs attention"
        return doc

    def profile(
        self, pid: int, steps: int = wire.PROFILE_DEFAULT_STEPS, max_seconds: float = 30.0
    ) -> dict[str, Any]:
        directory = self.directory or rundir.runtime_dir()
        # The trace goes to the private runtime directory, not into whatever
        # folder the agent's server was started in.
        doc = self._burst(
            pid, lambda: request_profile(pid, steps, max_seconds, directory, directory=self.directory)
        )
        self._keep_trace(doc.get("trace_path"))
        return doc

    def stacks(self, pid: int) -> dict[str, Any]:
        """Where job ``pid`` is stuck: every trainer thread's and worker's
        stack, one summary line per process (``dlwatch stacks --json``)."""
        _check_pid(pid)
        directory = self.directory or rundir.runtime_dir()
        if not os.path.exists(_socket_path(directory, pid)):
            # Only this user's dlwatch jobs: `dlwatch stacks` may read an
            # unhooked process with py-spy, the agent's server does not.
            raise _not_a_job(pid, directory)
        return self._burst(pid, lambda: gather_stacks(pid, directory=self.directory))

    def explain(self, hint_id: str) -> dict[str, Any]:
        """A hint's page: what it means, when it fires, where its thresholds
        come from and what to do (``dlwatch explain``)."""
        from dlwatch.diagnose import pages

        try:
            text = pages.page(str(hint_id).strip().strip("`"))
        except pages.MissingPage as e:
            raise ToolFailure(str(e)) from e
        body = "\n".join(line for line in text.splitlines() if not line.startswith("<!--")).strip()
        return {"hint_id": hint_id, "page": body}

    def worker_profile(
        self, pid: int, seconds: float = 3.0, hz: int = wire.WORKER_PROFILE_DEFAULT_HZ
    ) -> dict[str, Any]:
        return self._burst(pid, lambda: request_worker_profile(pid, seconds, hz, directory=self.directory))

    def tune(
        self,
        command: list[str],
        trial_seconds: float = TUNE_TRIAL_S,
        max_trials: int = TUNE_MAX_TRIALS,
        budget_seconds: float = TUNE_BUDGET_S,
        workers: list[int] | None = None,
    ) -> dict[str, Any]:
        if self.tune_runner is None:
            raise ToolFailure("tune is off: start the server with `dlwatch mcp --allow-run` to allow it")
        if not command or not all(isinstance(a, str) and a for a in command):
            raise ToolFailure("give the command to tune as a list of arguments, e.g. ['python', 'train.py']")
        if shutil.which(command[0]) is None:
            raise ToolFailure(f"command not found: {command[0]}")
        if not trial_seconds > 0:
            raise ToolFailure("trial_seconds must be positive")
        if not 1 <= max_trials <= 16:
            raise ToolFailure("max_trials must be between 1 and 16")
        if not 0 < budget_seconds <= TUNE_MAX_BUDGET_S:
            raise ToolFailure(f"budget_seconds must be in (0, {TUNE_MAX_BUDGET_S:g}]")
        if workers is not None and (not workers or any(not 0 <= n <= MAX_WORKERS for n in workers)):
            raise ToolFailure(f"workers must be a non-empty list of counts within 0..{MAX_WORKERS}")
        doc = self.tune_runner(list(command), trial_seconds, max_trials, budget_seconds, workers)
        return json.loads(json.dumps(doc, default=str))

    # ----------------------------------------------------------------- helpers

    def _keep_trace(self, path: Any) -> None:
        """Remember a trace this server had written; remove the oldest beyond
        KEEP_TRACES: the runtime directory is often a RAM-backed tmpfs, and an
        agent may call profile in a loop (a trace may hold up to 64 MiB)."""
        if not isinstance(path, str):
            return
        self.traces.append(path)
        while len(self.traces) > KEEP_TRACES:
            with contextlib.suppress(OSError):
                os.unlink(self.traces.popleft())

    def _usable_dir(self) -> None:
        problem = rundir.problem(self.directory or rundir.runtime_dir())
        if problem:
            raise ToolFailure(problem)

    def _measure(self, pid: int | None, window_s: float, judge_s: float = JUDGE_S) -> dict[str, Any]:
        """One measurement, as ``dlwatch snapshot --json [--pid]`` takes it,
        in JSON's types and as a recording stores it (``compact``: without the
        120-point history series, which would fill the agent's context)."""
        if pid is not None:
            _check_pid(pid)
        if not 0 < window_s <= MAX_WINDOW_S:
            raise ToolFailure(f"window_seconds must be in (0, {MAX_WINDOW_S:g}]")
        if not 0 <= judge_s <= MAX_JUDGE_S:
            raise ToolFailure(f"judge_seconds must be in [0, {MAX_JUDGE_S:g}]")
        self._usable_dir()
        directory = self.directory or rundir.runtime_dir()
        if pid is not None and not os.path.exists(_socket_path(directory, pid)):
            raise _not_a_job(pid, directory)  # (without measuring the host for a second first)
        missing = ToolFailure(
            f"no dlwatch job with PID {pid} in {directory} (list_jobs lists this user's jobs)"
        )
        snap = dict(take_snapshot(window_s=window_s, directory=self.directory, only_pid=pid, judge_s=judge_s))
        if snap.get("runtime_dir_error"):
            raise ToolFailure(snap["runtime_dir_error"])
        if pid is not None and not snap["jobs"]:
            raise missing
        doc: dict[str, Any] = json.loads(json.dumps(compact(snap), default=str))
        return doc

    def _burst(self, pid: int, ask: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        _check_pid(pid)
        self._usable_dir()
        _socket_path(self.directory or rundir.runtime_dir(), pid)
        try:
            doc = ask()
        except ProfileError as e:
            raise ToolFailure(str(e)) from None
        if doc.get("error"):
            raise ToolFailure(f"PID {pid}: {doc['error']}")
        return doc


def _headline(job: dict[str, Any]) -> dict[str, Any]:
    """Who a job is and how its loaders fare, beside its hints."""
    keys = ("id", "num_workers", "batch_size", "batch_rows", "data_wait_fraction", "batches_per_s")
    out = {
        "pid": job.get("pid"),
        "cmdline": job.get("cmdline"),
        "state": job.get("state"),
        "loaders": [{k: ld.get(k) for k in keys} for ld in records(job.get("loaders"))],
    }
    if not out["loaders"]:
        # What the live view says of it ("training … but no loader seen yet: wrap …").
        out["note"] = no_loader_yet(job)
    return out


def _socket_path(directory: str, pid: int) -> str:
    try:
        return rundir.socket_path(directory, pid)
    except rundir.RuntimeDirError as e:  # a directory too long for a Unix socket's path
        raise ToolFailure(str(e)) from None


def _not_a_job(pid: int, directory: str) -> ToolFailure:
    """What ``pid`` is, with the PID to use (a wrapper's names its job, a
    worker's its job: collect/whose.py), as the CLI says it."""
    _, why = whose.explain(pid, {p for p, _ in discover(directory)}, directory)
    # The tools take the PID as an argument, not as the CLI's option.
    return ToolFailure(f"{why.replace('--pid ', 'pid=')} (list_jobs lists this user's jobs)")


def _check_pid(pid: int) -> None:
    # 0 and negative numbers name process groups to the kernel, not a job.
    if isinstance(pid, bool) or not isinstance(pid, int) or pid < 1:
        raise ToolFailure(f"pid must be a process id (a positive integer), not {pid!r}")


_COST_SNAPSHOT = (
    "It watches until the hints are judged as the live view judges them (a condition shows once it "
    "held 3 s), at most `judge_seconds` (default 7, at most 120; 0: one measurement, no judging). "
    "Cost: 1-8 s; reads the job's own stream and /proc, asks the job for nothing."
)

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "list_jobs",
        "The PyTorch training jobs instrumented by dlwatch (`import dlwatch.hook` or `dlwatch run`) of "
        "this user on this machine, as `dlwatch ls --json`: per job its pid, rank, local_rank, "
        "world_size, run_id, cmdline, number of DataLoaders, age_s and state. Start here to find the "
        "pid the other tools take. Cost: about 0.2 s; reads each job's socket, changes nothing.",
    ),
    ToolSpec(
        "snapshot",
        "One live measurement of every job (or only `pid`) over the last `window_seconds` "
        "(default 3, at most 120), as `dlwatch snapshot --json` (schema_version 1; the per-loader "
        "120-point history series left out, figures rounded to 4 decimals): per DataLoader the "
        "data_wait_fraction (share of the training loop's time blocked in next(), 0..1), "
        "batches_per_s, wait_ms_mean, step_ms_mean, the prefetch queue, the settings (num_workers, "
        "batch_size, pin_memory, persistent_workers, prefetch_factor), and per worker process its "
        "CPU, busy_fraction, fetch_ms_mean and memory; the host's usable cores and CPU; the GPUs; "
        "and the hints. Missing figures are null with a reason beside them. " + _COST_SNAPSHOT,
    ),
    ToolSpec(
        "hints",
        "dlwatch's diagnosis of every job (or only `pid`) from one measurement over "
        "`window_seconds` (default 3): why the input pipeline is slow or what to change, most "
        "severe first. Each hint has an id (e.g. no-workers, add-workers, cpu-bound-preprocessing, "
        "io-bound, workers-oversubscribe-cores, enable-persistent-workers, main-loop-cpu-bound), "
        "severity (critical, warn, info), job_pid, loader_id, message, suggestion (one concrete next "
        "step, often the `dlwatch tune` command that verifies it) and evidence (the measured "
        "figures behind it, e.g. data_wait_fraction, recommended_num_workers, expected_speedup). "
        "No hints means nothing needs attention. " + _COST_SNAPSHOT,
    ),
    ToolSpec(
        "explain",
        "The documentation page of one hint id (as the `hints` tool returns them): what it means for "
        "the training job, when it fires and its severity, the evidence it carries, where its "
        "thresholds come from, and what to do, with the framework knobs (HF Trainer, Lightning, "
        "Accelerate) and how to verify the change. Use it to explain a hint to the user or before "
        "changing their code. Cost: none; reads dlwatch's own docs, touches no job.",
    ),
    ToolSpec(
        "profile",
        "A torch.profiler burst of `steps` training steps (default 10, at most 200) of job `pid`, "
        "stopped after `max_seconds` (default 30, at most 60), as `dlwatch profile --json`: a "
        "verdict (data-bound, gpu-bound, launch-bound, dispatch-bound, cpu-bound) with its reason and "
        "next step, step_ms_mean, data_wait_fraction, top_ops by self CPU time, CUDA figures, and "
        "trace_path, a Chrome/Perfetto trace written by the job in the runtime directory. Use it when "
        "the loop is slow but not waiting for data. Cost: the steps' time plus a few seconds; the job "
        "runs the profiler on its training thread for those steps (each step slower, the first "
        "burst in a process pays 1.5-2 s of profiler start-up), then is as before. One burst per job "
        "at a time.",
    ),
    ToolSpec(
        "worker_profile",
        "The busiest DataLoader's worker processes of job `pid` sample their own stacks for "
        "`seconds` (default 3, at most 60) at `hz` samples a second (default 100), as `dlwatch "
        "profile --workers --json`: the workers' fetch time split by stage (file read, image decode, "
        "each transform, tokenization, collate, the user's own functions) and by function, with a "
        "verdict and next step. Use it when the hints say the workers are CPU-bound. Cost: `seconds` "
        "plus up to 3 s; each worker runs a sampling thread for that long (a few percent of a core), "
        "then is as before. One burst per job at a time.",
    ),
    ToolSpec(
        "tune",
        "Runs `command` (a list of arguments, e.g. ['python', 'train.py']) several times with other "
        "DataLoader settings (num_workers, prefetch_factor, persistent_workers, pin_memory, changed "
        "through dlwatch's hook, no code change), measures each trial's steady throughput and data "
        "wait, and recommends the fastest setting, as `dlwatch tune --json` (`workers`: try exactly "
        "these num_workers values). Cost: it STARTS the user's command once per trial and stops its "
        "process group after warm-up plus `trial_seconds` (default 10); at most `max_trials` "
        "(default 4) trials and `budget_seconds` (default 300) in all: minutes of the machine's CPU "
        "and GPU.",
        runs_commands=True,
    ),
    ToolSpec(
        "stacks",
        "Where job `pid` is stuck, as `dlwatch stacks --json`: the Python stack of every thread of the "
        "trainer (the pin-memory thread included) and of every DataLoader worker, outermost frame first, "
        "and `summary`: one line per process naming what it waits on (a batch, a lock, I/O, a collective, "
        "idle) and the frame it is blocked in. Use it when the hints say loader-stalled, or a job has "
        "gone silent. Cost: about a second; the job's publisher thread reads its own frames and each "
        "worker's watcher thread writes its own, no ptrace and no signal; a process that cannot answer "
        "is read with py-spy only when installed and permitted.",
    ),
)


def available(allow_run: bool) -> list[ToolSpec]:
    """The tools a server lists: those that start commands only if allowed."""
    return [t for t in TOOLS if allow_run or not t.runs_commands]
