"""One trial: the user's command, run once with some DataLoader settings.

The command starts in a session of its own (so the tuner can stop all of it,
DataLoader workers included, and the terminal's Ctrl-C reaches only the
tuner), under ``dlwatch run``'s environment plus ``DLWATCH_OVERRIDES`` and a
private ``DLWATCH_DIR``, so the collector of this trial sees this job and no
other. A ``Monitor`` on that directory feeds a ``TrialMeter`` until the meter
has its steady state; then the process group is stopped the way a terminal
would (SIGINT), then SIGTERM, then SIGKILL, each after a grace period, and
the trial checks that no process of the group and no socket is left.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dlwatch import overrides
from dlwatch.collect import process_group
from dlwatch.snapshot import SnapshotSource
from dlwatch.tune.measure import TrialMeter

# The collector's cadence during a trial: windows that tile the steady state.
INTERVAL_S = 1.0
# How long the job gets to stop after each signal.
SIGINT_GRACE_S = 5.0
SIGTERM_GRACE_S = 3.0
STDERR_TAIL_LINES = 15


@dataclass
class TrialOutcome:
    status: str  # "ok" | "crashed" | "exited" | "no-batches" | "interrupted" | "failed"
    figures: dict
    returncode: int | None = None
    stderr_tail: list[str] = field(default_factory=list)
    reason: str = ""
    elapsed_s: float = 0.0
    cleanup: list[str] = field(default_factory=list)  # what had to be forced or was left over


def run_trial(
    cmd: list[str],
    env: dict[str, str],
    override: dict | None,
    trial_s: float,
    loader_id: int | None = None,
    warmup_s: float | None = None,
    on_progress: Callable[[TrialMeter, float], None] | None = None,
    monitor_factory: Callable[[str], SnapshotSource] | None = None,
    first_epoch: bool = False,
) -> TrialOutcome:
    """Run ``cmd`` until ``trial_s`` of steady state at a settled pace (or it
    ends; ``TrialMeter``). ``env`` is the bootstrap environment; ``override``
    the DLWATCH_OVERRIDES document (None: the script's own settings);
    ``first_epoch``: wait for the loader's first epoch to end (the
    baseline's). KeyboardInterrupt stops the job, then propagates with the
    partial outcome in ``exc.outcome``."""
    workdir = tempfile.mkdtemp(prefix="dlwtune-", dir="/tmp")  # socket paths must be short
    os.chmod(workdir, 0o700)
    rdir = os.path.join(workdir, "run")
    os.mkdir(rdir, 0o700)
    err_path = os.path.join(workdir, "stderr")
    env = dict(env, DLWATCH_DIR=rdir)
    env.pop("DLWATCH_DISABLE", None)
    env.pop(overrides.ENV_VAR, None)
    if override is not None:
        env[overrides.ENV_VAR] = overrides.encode(override)
    replay = bool(override and "replay" in override)
    meter = TrialMeter(
        trial_s, loader_id=loader_id, warmup_s=warmup_s, replay=replay, first_epoch=first_epoch
    )
    cpu = _GroupCpu()
    cpu_from = None  # the steady state the CPU figure covers: anew when a slower start is left out
    t0 = time.monotonic()
    err = open(err_path, "wb")
    try:
        proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            start_new_session=True,
        )
    except OSError as e:
        err.close()
        shutil.rmtree(workdir, ignore_errors=True)
        return TrialOutcome("failed", meter.figures(), reason=f"cannot start {cmd[0]}: {e.strerror or e}")
    monitor = (monitor_factory or _monitor)(rdir)
    monitor.start()
    status, reason = "ok", ""
    try:
        seen = None
        while True:
            if proc.poll() is not None:
                # Read what the collector has so far, then judge the exit.
                status = "crashed" if proc.returncode != 0 else "exited"
                reason = _exit_reason(proc.returncode, meter)
                break
            snap = monitor.latest()
            if snap is not None and snap is not seen:
                seen = snap
                meter.feed(snap)
                if meter.phase == "steady":
                    if meter.steady_from != cpu_from:
                        cpu, cpu_from = _GroupCpu(), meter.steady_from
                    cpu.sample(proc.pid)
                if on_progress is not None:
                    on_progress(meter, time.monotonic() - t0)
                if meter.done:
                    break
                if meter.stuck:
                    status, reason = "no-batches", meter.stuck_reason or ""
                    break
            time.sleep(0.1)
    except KeyboardInterrupt as e:
        outcome = _finish(proc, monitor, err, err_path, workdir, meter, "interrupted", "by Ctrl-C", t0, cpu)
        e.outcome = outcome  # type: ignore[attr-defined]
        raise
    return _finish(proc, monitor, err, err_path, workdir, meter, status, reason, t0, cpu)


def _monitor(directory: str) -> SnapshotSource:
    from dlwatch.collect.monitor import Monitor

    # No GPU sampling: NVML's figures are not part of a trial's result and its
    # first call can take a second.
    return Monitor(directory=directory, window_s=INTERVAL_S, interval=INTERVAL_S, gpu=False)


def _exit_reason(code: int, meter: TrialMeter) -> str:
    # What dlwatch saw, not what the script did: a script that ran 23 batches
    # in its first second had exited before any snapshot showed one (a QA run
    # read "before its first batch" for it).
    seen = meter.batches_seen
    when = {
        "starting": "before dlwatch saw a batch"
        if not seen
        else f"after {seen} batches, before they were timed",
        "warm-up": f"during warm-up, after {seen} batches (a trial needs the script to run past its warm-up)",
    }.get(meter.phase, f"after {meter.steady_s:.1f} s of steady state")
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"killed by {name} {when}"
    return f"exited with code {code} {when}"


def _finish(proc, monitor, err, err_path, workdir, meter, status, reason, t0, cpu) -> TrialOutcome:
    if meter.phase == "steady":
        cpu.sample(proc.pid)  # the end of the steady state, before the group is stopped
    cleanup = stop_group(proc)
    try:
        monitor.stop()
    finally:
        err.close()
    tail = _tail(err_path)
    left = [n for n in _listdir(os.path.join(workdir, "run")) if n.endswith(".sock")]
    if left:
        cleanup.append(f"removed {len(left)} leftover socket(s)")
    shutil.rmtree(workdir, ignore_errors=True)
    figures = meter.figures()
    if cpu.cores is not None:
        figures["cpu_cores"] = round(cpu.cores, 2)
    figures["storage_read_bytes"] = cpu.storage_read_bytes
    if status == "ok" and figures["batches_per_s"] is None:
        status, reason = "no-batches", "no steady-state batches were measured"
    return TrialOutcome(
        status=status,
        figures=figures,
        returncode=proc.returncode,
        stderr_tail=tail if status != "ok" else [],
        reason=reason,
        elapsed_s=round(time.monotonic() - t0, 2),
        cleanup=cleanup,
    )


def stop_group(proc: subprocess.Popen) -> list[str]:
    """Stop ``proc``'s process group: SIGINT (a terminal's Ctrl-C), then
    SIGTERM, then SIGKILL, each after its grace; wait for every member, not
    just the leader (DataLoader workers outlive a killed trainer for a
    moment). Returns what had to be forced, for the report."""
    notes: list[str] = []
    pgid = proc.pid
    for sig, grace in (
        (signal.SIGINT, SIGINT_GRACE_S),
        (signal.SIGTERM, SIGTERM_GRACE_S),
        (signal.SIGKILL, 5.0),
    ):
        if not process_group.members(pgid) and proc.poll() is not None:
            break
        if sig != signal.SIGINT:
            notes.append(f"sent {sig.name}")
        if sig == signal.SIGKILL:
            process_group.kill(pgid)  # its resource tracker last: nothing left in /dev/shm
        else:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        end = time.monotonic() + grace
        while time.monotonic() < end:
            proc.poll()
            if proc.returncode is not None and not process_group.members(pgid):
                break
            time.sleep(0.05)
    try:
        proc.wait(timeout=1.0)
    except subprocess.TimeoutExpired:
        notes.append("the command did not exit")
    left = process_group.members(pgid)
    if left:
        notes.append(f"{len(left)} process(es) of the group still running: {sorted(left)}")
    return notes


class _GroupCpu:
    """CPU of the trial's whole process group over the steady state, in
    cores: the first and the last ``sample()`` of the group's cumulative CPU
    time. Each member counts its own time and that of the children it has
    reaped (``cutime``, ``cstime``), zombies their own: DataLoader workers
    that exit inside the trial (replaced every epoch without
    ``persistent_workers``) count, which per-process CPU rates of the live
    workers miss."""

    def __init__(self) -> None:
        self.first: tuple[float, float] | None = None
        self.last: tuple[float, float] | None = None
        # Storage reads of the live members, first and last sample: whether
        # a cold page cache can be what a first-epoch baseline paid for.
        self.reads_first: dict[int, int] | None = None
        self.reads_last: dict[int, int] = {}

    def sample(self, pgid: int) -> None:
        v = process_group.cpu_s(pgid)
        if v is None:
            return
        now = time.monotonic()
        if self.first is None:
            self.first = (now, v)
        self.last = (now, v)
        reads = process_group.read_bytes(pgid)
        if self.reads_first is None:
            self.reads_first = reads
        self.reads_last = reads

    @property
    def storage_read_bytes(self) -> int | None:
        """Bytes the group read from storage between the first and the last
        sample (a member that came meanwhile, all of its own); None before
        two samples or where no member's file could be read."""
        if self.reads_first is None or not self.reads_last or self.first == self.last:
            return None
        return sum(max(0, v - self.reads_first.get(pid, 0)) for pid, v in self.reads_last.items())

    @property
    def cores(self) -> float | None:
        if self.first is None or self.last is None or self.last[0] - self.first[0] < 0.5:
            return None
        return max(0.0, (self.last[1] - self.first[1]) / (self.last[0] - self.first[0]))


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _tail(path: str) -> list[str]:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 16384))
            text = f.read().decode(errors="replace")
    except OSError:
        return []
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-STDERR_TAIL_LINES:]
