"""The demo's training loop and what it measures around each DataLoader: the
ground truth the monitor is compared against, written as ``--report``."""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import signal
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, TypedDict

from torch.utils.data import DataLoader

# The checker reads the package form; the script form names the same file.
if TYPE_CHECKING or __package__:
    from .workload import Batch, SyntheticImageStream
else:  # train.py run as a script: its folder is sys.path[0]
    from workload import Batch, SyntheticImageStream

REPORT_SCHEMA = "dlwatch-demo-report/1"
# Bounds what a run that is never stopped keeps in memory and in its report.
MAX_EPOCH_RECORDS = 200


# --------------------------------------------------------------------------
# Measurement (the ground truth the monitor is compared against)
# --------------------------------------------------------------------------


class EpochRecord(TypedDict):
    """One pass over a loader, as the report lists it; the figures that are
    None are filled in as the epoch reaches them."""

    epoch: int
    batches: int
    wait_s: float
    compute_s: float
    iter_ms: float | None
    first_batch_ms: float | None
    teardown_ms: float | None
    epoch_s: float | None
    end: str | None  # limit | stopped | exhausted


class LoaderStats:
    """What the loop measures around one DataLoader, with the same split the
    probe uses: wait = inside a next() that returned a batch; compute =
    between a next() returning and the following call; iter = iter(loader);
    teardown = the next() that raised StopIteration (non-persistent workers
    are joined there)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.batches = 0
        self.samples = 0
        self.wait_s = 0.0
        self.compute_s = 0.0
        self.step_s = 0.0
        self.iter_s = 0.0
        self.teardown_s = 0.0
        self.close_s = 0.0
        self.epochs_total = 0
        self.epochs: list[EpochRecord] = []
        self.worker_pids: list[int] = []

    def to_json(self, pending: EpochRecord | None = None) -> dict[str, Any]:
        # pending: the epoch in progress, folded in so a mid-run report is current.
        batches, wait_s, compute_s = self.batches, self.wait_s, self.compute_s
        if pending is not None:
            batches += pending["batches"]
            wait_s += pending["wait_s"]
            compute_s += pending["compute_s"]
        busy = wait_s + compute_s
        return {
            "batches": batches,
            "samples": self.samples,
            "wait_s": wait_s,
            "compute_s": compute_s,
            "step_s": self.step_s,
            "iter_s": self.iter_s,
            "teardown_s": self.teardown_s,
            "close_s": self.close_s,
            "data_wait_fraction": wait_s / busy if busy > 0 else None,
            "wait_ms_mean": 1e3 * wait_s / batches if batches else None,
            "step_ms_mean": 1e3 * compute_s / batches if batches else None,
            "batches_per_s": batches / busy if busy > 0 else None,
            "epochs_total": self.epochs_total,
            "epochs": self.epochs[-MAX_EPOCH_RECORDS:],
            "worker_pids": self.worker_pids,
        }


class StopRequest:
    """First SIGINT/SIGTERM asks the loop to stop after the current step, so
    the final report is written and workers are shut down in order; a second
    SIGINT interrupts at once."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._pid = os.getpid()

    def install(self) -> None:
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._pid:
            # A forked worker between fork and its init fn: behave as default.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name


def _batch_digest(hasher: hashlib._Hash, batch: Batch) -> None:
    for t in batch:
        t = t.detach().cpu().contiguous()
        # Raw bytes without NumPy (not a dependency of the probe's environment).
        hasher.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        hasher.update(str(tuple(t.shape)).encode())


# The loader whose epoch is in progress and that epoch's record so far.
Current = tuple[LoaderStats, EpochRecord]


class Run:
    def __init__(self, args: argparse.Namespace, config: dict[str, Any]) -> None:
        self.args = args
        self.config = config
        self.stop = StopRequest()
        self.train = LoaderStats("train")
        self.val = LoaderStats("val") if args.val else None
        self.t0 = time.perf_counter()
        self.unix0 = time.time()
        self.deadline = self.t0 + args.duration if args.duration else math.inf
        self.next_report = self.t0 + args.report_interval if args.report_interval else math.inf
        self.phase = "starting"
        self.stop_reason: str | None = None
        self.error: str | None = None
        self.hasher = hashlib.sha256() if args.checksum_batches > 0 else None
        self.hashed = 0
        self.last_loss = math.nan

    def should_stop(self) -> bool:
        if self.stop.reason is not None:
            self.stop_reason = f"signal {self.stop.reason}"
        elif time.perf_counter() >= self.deadline:
            self.stop_reason = "duration"
        return self.stop_reason is not None

    def run_epoch(
        self,
        loader: DataLoader[Any],
        stats: LoaderStats,
        step: Callable[[Batch], None],
        epoch: int,
        limit: int | None,
    ) -> None:
        perf = time.perf_counter
        record: EpochRecord = {
            "epoch": epoch,
            "batches": 0,
            "wait_s": 0.0,
            "compute_s": 0.0,
            "iter_ms": None,
            "first_batch_ms": None,
            "teardown_ms": None,
            "epoch_s": None,
            "end": None,
        }
        dataset = loader.dataset
        if isinstance(dataset, SyntheticImageStream):
            dataset.set_epoch(epoch)
        started = perf()
        it = iter(loader)
        returned = perf()
        record["iter_ms"] = 1e3 * (returned - started)
        stats.iter_s += returned - started
        stats.worker_pids = [w.pid for w in getattr(it, "_workers", ())]
        try:
            while True:
                if limit is not None and record["batches"] >= limit:
                    record["end"] = "limit"
                    break
                if self.should_stop():
                    record["end"] = "stopped"
                    break
                called = perf()
                if record["batches"]:
                    record["compute_s"] += called - returned
                try:
                    batch = next(it)
                except StopIteration:
                    ended = perf()
                    record["teardown_ms"] = 1e3 * (ended - called)
                    stats.teardown_s += ended - called
                    record["end"] = "exhausted"
                    break
                returned = perf()
                if record["first_batch_ms"] is None:
                    record["first_batch_ms"] = 1e3 * (returned - started)
                record["wait_s"] += returned - called
                record["batches"] += 1
                stats.samples += len(batch[1])
                step(batch)
                stats.step_s += perf() - returned
                if (
                    self.hasher is not None
                    and stats is self.train
                    and self.hashed < self.args.checksum_batches
                ):
                    _batch_digest(self.hasher, batch)
                    self.hashed += 1
                del batch
                if perf() >= self.next_report:
                    self.write_report(final=False, current=(stats, record))
                    self.next_report = perf() + self.args.report_interval
            if record["end"] != "exhausted" and record["batches"]:
                # Stopped between calls: the last batch's step still counts.
                record["compute_s"] += perf() - returned
        finally:
            closing = perf()
            # Non-persistent workers of an unfinished epoch are joined here.
            del it
            stats.close_s += perf() - closing
            stats.batches += record["batches"]
            stats.wait_s += record["wait_s"]
            stats.compute_s += record["compute_s"]
            record["epoch_s"] = perf() - started
            stats.epochs_total += 1
            stats.epochs.append(record)
            del stats.epochs[:-MAX_EPOCH_RECORDS]

    def report(self, final: bool, current: Current | None = None) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.t0
        stats, record = current if current is not None else (None, None)
        train = self.train.to_json(record if stats is self.train else None)
        val = None
        if self.val is not None:
            val = self.val.to_json(record if stats is self.val else None)
        accounted = sum(
            s.wait_s + s.compute_s + s.iter_s + s.teardown_s + s.close_s
            for s in (self.train, self.val)
            if s is not None
        )
        return {
            "schema": REPORT_SCHEMA,
            "final": final,
            "phase": self.phase,
            "pid": os.getpid(),
            "time": time.time(),
            "started": self.unix0,
            "elapsed_s": elapsed,
            "other_s": elapsed - accounted if final else None,
            "stop_reason": self.stop_reason,
            "error": self.error,
            "config": self.config,
            # The training loader's figures at top level: what tests compare.
            **{
                k: train[k]
                for k in (
                    "batches",
                    "samples",
                    "wait_s",
                    "compute_s",
                    "step_s",
                    "iter_s",
                    "teardown_s",
                    "data_wait_fraction",
                    "wait_ms_mean",
                    "step_ms_mean",
                    "batches_per_s",
                    "worker_pids",
                )
            },
            "epochs": train["epochs"],
            "epochs_total": train["epochs_total"],
            "train": train,
            "val": val,
            "checksum": self.hasher.hexdigest() if self.hasher is not None else None,
            "checksum_batches": self.hashed,
            "last_loss": self.last_loss if math.isfinite(self.last_loss) else None,
        }

    def write_report(self, final: bool, current: Current | None = None) -> None:
        path = self.args.report
        if not path:
            return
        data = self.report(final, current)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        # Readers polling mid-run must never see a half-written file.
        os.replace(tmp, path)
