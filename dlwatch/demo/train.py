"""A small, real PyTorch training run whose input pipeline can be made slow on purpose.

It is dlwatch's demo and its end-to-end test workload: every cost is a flag, so
a test can build a job with a known data-wait fraction, worker load or memory
growth, and compare what the monitor shows with what the loop measured itself
(``--report``).

    python demo/train.py --num-workers 2 --sample-ms 2 --step-ms 15 --report r.json
    python -m dlwatch.demo.train --scenario data-bound
    dlwatch run -- python -m dlwatch.demo.train --scenario io-bound

Instrumentation is never imported here unless ``--hook`` asks for it, so the
demo also serves as the "without dlwatch" side of comparisons.

The dataset, collate and worker-init classes are top-level and picklable on
purpose: under spawn/forkserver the workers re-import this module (as
``__mp_main__`` when it is the script) and unpickle them by name.
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import signal
import sys
import time
import warnings
from dataclasses import dataclass, replace

# torch warns on every import (workers included) when NumPy is absent; the demo
# never uses NumPy, so the warning is noise on the user's terminal.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
warnings.filterwarnings("ignore", message=".*pin_memory.*no accelerator is found")

import torch  # noqa: E402
from torch.utils.data import (  # noqa: E402
    DataLoader,
    Dataset,
    IterableDataset,
    default_collate,
    get_worker_info,
)

REPORT_SCHEMA = "dlwatch-demo-report/1"
# Bounds what a run that is never stopped keeps in memory and in its report.
MAX_EPOCH_RECORDS = 200
EXIT_OK, EXIT_ERROR, EXIT_USAGE = 0, 1, 2


# --------------------------------------------------------------------------
# Per-sample and per-batch cost
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class CostSpec:
    ms: float = 0.0
    kind: str = "cpu"  # sleep | cpu | mixed
    # >1: CPU work runs as torch intra-op parallel ops on this many threads.
    threads: int = 1


# Below ATen's 32k-element grain size: ops on it stay on the calling thread
# whatever the intra-op pool size.
_SERIAL_ELEMENTS = 1 << 14
# Above the grain: every op is split over the intra-op pool.
_PARALLEL_ELEMENTS = 1 << 18
_BUFFERS: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}


def _buffers(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    bufs = _BUFFERS.get(n)
    if bufs is None:
        src = torch.rand(n, generator=torch.Generator().manual_seed(n))
        bufs = _BUFFERS[n] = (src, torch.empty_like(src))
    return bufs


def _burn_cpu(seconds: float, parallel: bool = False) -> None:
    # Work in torch kernels, as decoding and augmentation libraries do, so the
    # GIL is released while computing: a worker's other threads (torch's fd
    # resource sharer serving the trainer) then answer promptly, and the wait
    # the demo shows is the pipeline's, not an artefact of a Python spin loop.
    # Budgeted in this thread's CPU time, not wall time: when workers fight for
    # cores each sample takes longer in wall time, as real decoding would, so
    # oversubscription loses throughput instead of hiding it.
    # ``parallel``: a tensor large enough that torch's intra-op pool really
    # runs, like an OpenCV or BLAS pool inside a worker, budgeted in process
    # CPU time so a sample costs the same total CPU whatever the thread count.
    src, out = _buffers(_PARALLEL_ELEMENTS if parallel else _SERIAL_ELEMENTS)
    clock = time.process_time if parallel else time.thread_time
    deadline = clock() + seconds
    while clock() < deadline:
        torch.sin(src, out=out)


def spend(cost: CostSpec, ms: float) -> None:
    if ms <= 0:
        return
    seconds = ms / 1e3
    parallel = cost.threads > 1
    if cost.kind == "sleep":
        time.sleep(seconds)
    elif cost.kind == "cpu":
        _burn_cpu(seconds, parallel)
    else:  # mixed: a read followed by decoding what was read
        time.sleep(seconds / 2)
        _burn_cpu(seconds / 2, parallel)


# --------------------------------------------------------------------------
# Datasets
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DataSpec:
    size: int = 2048
    image_size: int = 32
    channels: int = 3
    num_classes: int = 10
    seed: int = 0
    cost: CostSpec = CostSpec()
    jitter: float = 0.0
    leak_bytes_per_sample: int = 0
    shuffle: bool = False  # only read by the iterable variant


# A str of 256 chars occupies ~305 bytes with its header; records are made of
# many such small objects so that touching one record writes a refcount into
# every page it spans.
_RECORD_STR_CHARS = 256
_RECORD_STR_BYTES = 305


def _build_records(n: int, bytes_per_sample: int) -> list[tuple[str, ...]]:
    per = max(1, round(bytes_per_sample / _RECORD_STR_BYTES))
    reps = _RECORD_STR_CHARS // 16
    return [tuple(("%016x" % (i * per + j)) * reps for j in range(per)) for i in range(n)]


class _SyntheticImageSource:
    """Deterministic images: sample i depends only on (seed, i), never on which
    process or in which order it is produced, so batches can be compared
    across start methods and with/without instrumentation."""

    def __init__(self, spec: DataSpec) -> None:
        self.spec = spec
        # Built in the trainer before workers exist: forked workers share these
        # pages until they touch them (copy-on-read), spawned ones get a copy.
        self._records = (
            _build_records(spec.size, spec.leak_bytes_per_sample) if spec.leak_bytes_per_sample > 0 else None
        )

    def sample(self, index: int) -> tuple[torch.Tensor, int]:
        spec = self.spec
        if not 0 <= index < spec.size:
            raise IndexError(f"sample {index} out of range 0..{spec.size - 1}")
        gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + index)
        image = torch.randn(spec.channels, spec.image_size, spec.image_size, generator=gen)
        label = int(torch.randint(spec.num_classes, (1,), generator=gen))
        ms = spec.cost.ms
        if spec.jitter > 0 and ms > 0:
            u = float(torch.rand(1, generator=gen))
            ms *= 1.0 + spec.jitter * (2.0 * u - 1.0)
        spend(spec.cost, ms)
        if self._records is not None:
            # Reading the strings increments their refcounts: that write is
            # what turns shared pages into private ones in a forked worker.
            sum(map(len, self._records[index]))
        return image, label


class SyntheticImages(_SyntheticImageSource, Dataset):
    """Map-style variant (the usual case: a sampler picks indices)."""

    def __len__(self) -> int:
        return self.spec.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return self.sample(int(index))


class SyntheticImageStream(_SyntheticImageSource, IterableDataset):
    """Iterable variant: each worker streams its own shard (round-robin by
    worker id), the way sharded record files are read."""

    def __init__(self, spec: DataSpec) -> None:
        super().__init__(spec)
        self.epoch = 0
        self._passes = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        # Non-persistent workers get a fresh copy carrying set_epoch's value;
        # persistent ones keep their first copy, so count passes locally too.
        epoch = max(self.epoch, self._passes)
        self._passes += 1
        if self.spec.shuffle:
            gen = torch.Generator().manual_seed(self.spec.seed * 7919 + epoch)
            order = torch.randperm(self.spec.size, generator=gen).tolist()
        else:
            order = range(self.spec.size)
        for index in order[worker::workers]:
            yield self.sample(index)


# Per-process, so in a worker it holds what that worker deliberately kept.
_KEPT: list[bytearray] = []
_KEPT_BYTES = 0


class DemoCollate:
    """default_collate plus a fixed per-batch cost and optional deliberate
    memory growth; runs in the worker that built the batch."""

    def __init__(self, cost: CostSpec, batch_cost_ms: float, grow_bytes: int, grow_limit_bytes: int) -> None:
        self.cost = cost
        self.batch_cost_ms = batch_cost_ms
        self.grow_bytes = grow_bytes
        self.grow_limit_bytes = grow_limit_bytes

    def __call__(self, samples):
        global _KEPT_BYTES
        batch = default_collate(samples)
        spend(self.cost, self.batch_cost_ms)
        if self.grow_bytes > 0 and _KEPT_BYTES + self.grow_bytes <= self.grow_limit_bytes:
            # Filled, not zeroed: untouched pages of a fresh allocation are not
            # resident and would not show in USS.
            _KEPT.append(bytearray(b"\xa5") * self.grow_bytes)
            _KEPT_BYTES += self.grow_bytes
        return batch


class DemoWorkerInit:
    def __init__(self, threads: int | None) -> None:
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        # Ctrl-C reaches the whole process group; the trainer stops cleanly and
        # shuts its workers down itself, so they must not die first. SIGTERM
        # goes back to the default because a forked worker inherits the
        # trainer's handler, and torch terminates stuck workers with SIGTERM.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if self.threads:
            # DataLoader sets 1 thread in workers before calling us; undoing it
            # reproduces libraries that size their pools by the core count.
            torch.set_num_threads(self.threads)


# --------------------------------------------------------------------------
# Model and step
# --------------------------------------------------------------------------


def build_model(channels: int, num_classes: int) -> torch.nn.Module:
    # Deliberately tiny: a step's duration is set by --step-ms, and the real
    # forward/backward only has to stay well below it.
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(channels, 16, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(16, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(32, num_classes),
    )


def _busy_wait_until(deadline: float) -> None:
    # Wall clock here (unlike sample costs): a test sets a step time and must
    # get it, whatever else runs on the box.
    x = 1
    while time.perf_counter() < deadline:
        for _ in range(32):
            x = (x * 48271) % 2147483647


class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        device: torch.device,
        non_blocking: bool,
        step_ms: float,
        step_kind: str,
        step_threads: int | None = None,
    ) -> None:
        self.model = model.to(device)
        self.device = device
        self.non_blocking = non_blocking
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.step_ms = step_ms
        self.step_kind = step_kind
        self.step_threads = step_threads
        self.last_loss = math.nan
        self._gpu_cycles_per_ms = 0.0
        self._gpu_model_ms = 0.0  # running estimate of the model's own GPU time
        if step_kind == "gpu" and step_ms > 0:
            self._gpu_cycles_per_ms = _calibrate_gpu_sleep()

    def warm_up(self, batch_shape: tuple[int, ...], num_classes: int) -> None:
        # Lazy initialisation (CUDA context, cuDNN, allocator, first pinned
        # copy) would otherwise land in the first measured step and skew a
        # short run's step time. No optimizer step: the weights stay as seeded.
        x = torch.zeros(batch_shape)
        y = torch.zeros(batch_shape[0], dtype=torch.long)
        if self.non_blocking and self.device.type == "cuda":
            x, y = x.pin_memory(), y.pin_memory()
        x = x.to(self.device, non_blocking=self.non_blocking)
        y = y.to(self.device, non_blocking=self.non_blocking)
        torch.nn.functional.cross_entropy(self.model(x), y % num_classes).backward()
        self.opt.zero_grad(set_to_none=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _pad(self, started: float, target_ms: float) -> None:
        if target_ms <= 0:
            return
        deadline = started + target_ms / 1e3
        if self.step_kind == "cpu" and self.step_threads:
            # A compute step: a fixed amount of CPU work on the intra-op pool,
            # so processes competing for the cores stretch it in wall time.
            spend(
                CostSpec(target_ms * self.step_threads, "cpu", self.step_threads),
                target_ms * self.step_threads,
            )
        elif self.step_kind == "cpu":
            _busy_wait_until(deadline)
        else:
            remaining = deadline - time.perf_counter()
            if remaining > 0:
                time.sleep(remaining)

    def _gpu_pad(self, target_ms: float):
        # Pad with a GPU spin kernel so the device shows as busy, like real
        # kernels would; the model's own GPU time is subtracted from the target.
        pad_ms = max(0.0, target_ms - self._gpu_model_ms)
        if pad_ms > 0:
            torch.cuda._sleep(int(pad_ms * self._gpu_cycles_per_ms))

    def train_step(self, batch) -> None:
        started = time.perf_counter()
        x, y = batch
        x = x.to(self.device, non_blocking=self.non_blocking)
        y = y.to(self.device, non_blocking=self.non_blocking)
        gpu_pad = self.step_kind == "gpu" and self.step_ms > 0
        if gpu_pad:
            ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            ev0.record()
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        if gpu_pad:
            ev1.record()
            self._gpu_pad(self.step_ms)
        # Reading the loss each step is what real loops do (logging), and on
        # CUDA it is the sync that makes the step's time visible to the host.
        self.last_loss = loss.item()
        if gpu_pad:
            self._gpu_model_ms = 0.8 * self._gpu_model_ms + 0.2 * ev0.elapsed_time(ev1)
        else:
            self._pad(started, self.step_ms)

    def val_step(self, batch) -> None:
        # Forward only, about a third of a training step by the usual rule.
        started = time.perf_counter()
        x, y = batch
        with torch.no_grad():
            x = x.to(self.device, non_blocking=self.non_blocking)
            y = y.to(self.device, non_blocking=self.non_blocking)
            loss = torch.nn.functional.cross_entropy(self.model(x), y)
            if self.step_kind == "gpu" and self.step_ms > 0:
                self._gpu_pad(self.step_ms / 3)
            loss.item()
        if self.step_kind != "gpu":
            self._pad(started, self.step_ms / 3)


def _calibrate_gpu_sleep() -> float:
    cycles = 10_000_000
    torch.cuda._sleep(1000)  # first launch pays module loading
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / max(start.elapsed_time(end), 1e-3)


# --------------------------------------------------------------------------
# Measurement (the ground truth the monitor is compared against)
# --------------------------------------------------------------------------


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
        self.epochs: list[dict] = []
        self.worker_pids: list[int] = []

    def to_json(self, pending: dict | None = None) -> dict:
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

    def _handle(self, signum, frame) -> None:
        if os.getpid() != self._pid:
            # A forked worker between fork and its init fn: behave as default.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.reason is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.reason = signal.Signals(signum).name


def _batch_digest(hasher, batch) -> None:
    for t in batch:
        t = t.detach().cpu().contiguous()
        # Raw bytes without NumPy (not a dependency of the probe's environment).
        hasher.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        hasher.update(str(tuple(t.shape)).encode())


class Run:
    def __init__(self, args: argparse.Namespace, config: dict) -> None:
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

    def run_epoch(self, loader: DataLoader, stats: LoaderStats, step, epoch: int, limit: int | None) -> None:
        perf = time.perf_counter
        record = {
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

    def report(self, final: bool, current=None) -> dict:
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

    def write_report(self, final: bool, current=None) -> None:
        path = self.args.report
        if not path:
            return
        data = self.report(final, current)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        # Readers polling mid-run must never see a half-written file.
        os.replace(tmp, path)


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _nonneg_float(text: str) -> float:
    value = float(text)
    if not value >= 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def _pos_float(text: str) -> float:
    value = _nonneg_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("must be > 0")
    return value


def _nonneg_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def _pos_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be within 0..1, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m dlwatch.demo.train",
        description="Synthetic training job with a tunable input pipeline (dlwatch demo and test workload).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    bool_flag = argparse.BooleanOptionalAction
    g = p.add_argument_group("scenario")
    g.add_argument(
        "--scenario",
        metavar="NAME",
        help="start from a named scenario's flags; flags given here override them",
    )
    g.add_argument("--list-scenarios", action="store_true", help="print the scenarios and exit")

    g = p.add_argument_group("dataset")
    g.add_argument("--dataset-size", type=_pos_int, default=2048)
    g.add_argument("--image-size", type=_pos_int, default=32)
    g.add_argument(
        "--iterable",
        action=bool_flag,
        default=False,
        help="IterableDataset sharded by worker instead of a map-style dataset",
    )
    g.add_argument("--sample-ms", type=_nonneg_float, default=0.0, help="extra cost of producing one sample")
    g.add_argument(
        "--cost-kind",
        choices=("sleep", "cpu", "mixed"),
        default="cpu",
        help="sleep: off-CPU like storage reads; cpu: single-threaded work "
        "(budgeted in CPU time, so contention stretches it); mixed: half each",
    )
    g.add_argument(
        "--sample-jitter",
        type=_fraction,
        default=0.0,
        help="per-sample cost varies uniformly by +- this fraction",
    )
    g.add_argument(
        "--batch-cost-ms", type=_nonneg_float, default=0.0, help="extra fixed cost per batch, paid in collate"
    )
    g.add_argument(
        "--worker-threads",
        type=_pos_int,
        default=None,
        help="give each worker an intra-op pool of N threads and do the CPU "
        "cost as parallel ops (thread oversubscription)",
    )
    g.add_argument(
        "--leak-bytes-per-sample",
        type=_nonneg_int,
        default=0,
        help="dataset holds this many bytes of small Python objects per "
        "sample and reads them (copy-on-read growth in forked workers)",
    )
    g.add_argument(
        "--grow-bytes-per-batch",
        type=_nonneg_int,
        default=0,
        help="each worker keeps this many bytes per batch it builds",
    )
    g.add_argument(
        "--grow-limit-bytes",
        type=_nonneg_int,
        default=256 << 20,
        help="stop growing a worker past this many kept bytes",
    )

    g = p.add_argument_group("DataLoader")
    g.add_argument("--num-workers", type=_nonneg_int, default=2)
    g.add_argument("--batch-size", type=_pos_int, default=32)
    g.add_argument("--pin-memory", action=bool_flag, default=None, help="default: on when the device is CUDA")
    g.add_argument("--persistent-workers", action=bool_flag, default=False)
    g.add_argument("--prefetch-factor", type=_pos_int, default=None, help="default: torch's (2)")
    g.add_argument(
        "--start-method",
        choices=("fork", "spawn", "forkserver"),
        default=None,
        help="worker multiprocessing context (default: the platform's)",
    )
    g.add_argument("--shuffle", action=bool_flag, default=True)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--drop-last", action=bool_flag, default=False)

    g = p.add_argument_group("model and step")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    g.add_argument(
        "--step-ms",
        type=_nonneg_float,
        default=0.0,
        help="target time of one training step (0: the real model's time)",
    )
    g.add_argument(
        "--step-kind",
        choices=("auto", "sleep", "cpu", "gpu"),
        default="auto",
        help="how a step is padded to --step-ms: sleep (off-CPU, like waiting "
        "on a GPU), cpu (busy main thread), gpu (spin kernel); "
        "auto: gpu on CUDA, else sleep",
    )
    g.add_argument(
        "--step-threads",
        type=_pos_int,
        default=None,
        help="with --step-kind cpu: the step is N x --step-ms of CPU work on torch's intra-op "
        "pool of N threads (a CPU training step: other processes on the cores stretch it)",
    )

    g = p.add_argument_group("run")
    g.add_argument("--epochs", type=_nonneg_int, default=2, help="0: until stopped")
    g.add_argument("--steps-per-epoch", type=_pos_int, default=None)
    g.add_argument(
        "--duration", type=_pos_float, default=None, help="stop after this many seconds (checked every step)"
    )
    g.add_argument(
        "--val", action=bool_flag, default=False, help="also iterate a validation loader after each epoch"
    )
    g.add_argument(
        "--val-size",
        type=_pos_int,
        default=None,
        help="validation samples (default: a fifth of --dataset-size)",
    )

    g = p.add_argument_group("output")
    g.add_argument("--report", metavar="PATH", help="write the loop's own measurements as JSON")
    g.add_argument(
        "--report-interval",
        type=_pos_float,
        default=None,
        metavar="S",
        help="also rewrite the report every S seconds (atomically)",
    )
    g.add_argument(
        "--checksum-batches",
        type=_nonneg_int,
        default=8,
        help="hash the first N training batches into the report's checksum",
    )
    g.add_argument("--hook", action="store_true", help="import dlwatch.hook before building the loaders")
    g.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    return p


def _scenarios():
    if __package__:
        from .scenarios import DEFAULT_SCENARIO, SCENARIOS
    else:
        # Run as a script: this file's folder is sys.path[0].
        from scenarios import DEFAULT_SCENARIO, SCENARIOS
    return SCENARIOS, DEFAULT_SCENARIO


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    first = parser.parse_args(argv)
    if first.list_scenarios:
        return first
    if first.scenario is None:
        return first
    scenarios, _ = _scenarios()
    if first.scenario not in scenarios:
        parser.error(f"unknown scenario {first.scenario!r}; known: {', '.join(scenarios)}")
    # Scenario first, then the user's flags: argparse keeps the last value.
    args = parser.parse_args(list(scenarios[first.scenario].args) + argv)
    return args


def list_scenarios() -> str:
    scenarios, default = _scenarios()
    width = max(map(len, scenarios))
    lines = []
    for s in scenarios.values():
        mark = " (default demo)" if s.name == default else ""
        lines.append(f"{s.name:<{width}}  {s.description}{mark}")
        lines.append(f"{'':<{width}}  args: {' '.join(s.args)}")
    return "\n".join(lines)


def _log(args, message: str) -> None:
    if not args.quiet:
        print(f"[demo {os.getpid()}] {message}", file=sys.stderr, flush=True)


def _import_hook() -> str | None:
    try:
        import dlwatch.hook  # noqa: F401
    except ModuleNotFoundError as e:
        if e.name in ("dlwatch", "dlwatch.hook"):
            return (
                f"--hook: cannot import dlwatch.hook ({e}). Install dlwatch in this "
                "environment (pip install -e .), or instrument from outside with "
                "`dlwatch run -- python -m dlwatch.demo.train ...`."
            )
        raise
    return None


def make_loader(
    args, dataset, collate, worker_init, generator, shuffle: bool, pin_memory: bool
) -> DataLoader:
    kwargs = dict(
        batch_size=args.batch_size,
        drop_last=args.drop_last,
        pin_memory=pin_memory,
        collate_fn=collate,
        num_workers=args.num_workers,
    )
    if not isinstance(dataset, IterableDataset):
        kwargs.update(shuffle=shuffle, generator=generator)
    if args.num_workers > 0:
        kwargs.update(persistent_workers=args.persistent_workers, worker_init_fn=worker_init)
        if args.prefetch_factor is not None:
            kwargs["prefetch_factor"] = args.prefetch_factor
        if args.start_method is not None:
            kwargs["multiprocessing_context"] = args.start_method
    return DataLoader(dataset, **kwargs)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if args.list_scenarios:
        print(list_scenarios())
        return EXIT_OK

    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    elif args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda, but torch sees no CUDA device", file=sys.stderr)
        return EXIT_USAGE
    else:
        device = torch.device(args.device)
    step_kind = args.step_kind
    if step_kind == "auto":
        step_kind = "gpu" if device.type == "cuda" else "sleep"
    if step_kind == "gpu" and device.type != "cuda":
        print("error: --step-kind gpu needs a CUDA device", file=sys.stderr)
        return EXIT_USAGE
    pin_memory = device.type == "cuda" if args.pin_memory is None else args.pin_memory
    if args.num_workers == 0:
        ignored = [
            flag
            for flag, on in (
                ("--persistent-workers", args.persistent_workers),
                ("--prefetch-factor", args.prefetch_factor is not None),
                ("--start-method", args.start_method is not None),
            )
            if on
        ]
        if ignored:
            _log(args, f"num_workers=0: ignoring {', '.join(ignored)}")

    # The model is tiny and its time is set by --step-ms; an intra-op pool
    # would only add overhead (tens of ms per step on 2 cores) and compete with
    # the workers whose load the demo is meant to show. Without workers the
    # trainer is the one loading data, so --worker-threads applies to it.
    threads = args.worker_threads if args.num_workers == 0 and args.worker_threads else 1
    torch.set_num_threads(args.step_threads or threads)

    if args.hook:
        problem = _import_hook()
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return EXIT_ERROR

    torch.manual_seed(args.seed)
    cost = CostSpec(args.sample_ms, args.cost_kind, args.worker_threads or 1)
    spec = DataSpec(
        size=args.dataset_size,
        image_size=args.image_size,
        seed=args.seed,
        cost=cost,
        jitter=args.sample_jitter,
        leak_bytes_per_sample=args.leak_bytes_per_sample,
        shuffle=args.shuffle,
    )
    dataset_cls = SyntheticImageStream if args.iterable else SyntheticImages
    train_set = dataset_cls(spec)
    collate = DemoCollate(cost, args.batch_cost_ms, args.grow_bytes_per_batch, args.grow_limit_bytes)
    worker_init = DemoWorkerInit(args.worker_threads)
    train_loader = make_loader(
        args,
        train_set,
        collate,
        worker_init,
        torch.Generator().manual_seed(args.seed),
        args.shuffle,
        pin_memory,
    )
    val_loader = None
    if args.val:
        val_size = args.val_size or max(1, args.dataset_size // 5)
        # A different seed so validation images differ from training ones.
        val_spec = replace(spec, size=val_size, seed=args.seed + 1, shuffle=False, leak_bytes_per_sample=0)
        val_loader = make_loader(args, dataset_cls(val_spec), collate, worker_init, None, False, pin_memory)

    trainer = Trainer(
        build_model(spec.channels, spec.num_classes),
        device,
        pin_memory,
        args.step_ms,
        step_kind,
        args.step_threads if step_kind == "cpu" else None,
    )
    trainer.warm_up((args.batch_size, spec.channels, spec.image_size, spec.image_size), spec.num_classes)
    config = dict(vars(args))
    config.update(
        device=str(device),
        step_kind=step_kind,
        pin_memory=pin_memory,
        start_method=(args.start_method or torch.multiprocessing.get_start_method())
        if args.num_workers
        else None,
        torch_version=torch.__version__,
        argv=argv,
        cpu_count=os.cpu_count(),
    )

    run = Run(args, config)
    run.stop.install()
    _log(
        args,
        f"{args.num_workers} workers ({config['start_method'] or 'in-process'}), "
        f"batch {args.batch_size}, {args.cost_kind} {args.sample_ms:g} ms/sample, "
        f"step {args.step_ms:g} ms ({step_kind}), device {device}"
        + (f", scenario {args.scenario}" if args.scenario else ""),
    )
    try:
        epoch = 0
        while args.epochs == 0 or epoch < args.epochs:
            run.phase = "train"
            before = (run.train.batches, run.train.wait_s, run.train.compute_s)
            run.run_epoch(train_loader, run.train, trainer.train_step, epoch, args.steps_per_epoch)
            last = run.train.epochs[-1]
            line = (
                f"epoch {epoch}: {last['batches']} batches in {last['epoch_s']:.2f} s, "
                f"first batch {last['first_batch_ms'] or 0:.0f} ms, "
                f"data wait {_pct(run.train.wait_s - before[1], run.train.compute_s - before[2])}"
            )
            if val_loader is not None and run.stop_reason is None:
                run.phase = "val"
                vb = (run.val.wait_s, run.val.compute_s)
                run.run_epoch(val_loader, run.val, trainer.val_step, epoch, args.steps_per_epoch)
                line += (
                    f"; val {run.val.epochs[-1]['batches']} batches, data wait "
                    f"{_pct(run.val.wait_s - vb[0], run.val.compute_s - vb[1])}"
                )
            _log(args, line)
            epoch += 1
            if run.stop_reason is not None:
                break
        run.phase = "done"
    except KeyboardInterrupt:
        run.stop_reason = "signal SIGINT (forced)"
        run.phase = "done"
    except BaseException as e:
        # Kept in the report so a test that finds a short run can say why.
        run.error = f"{type(e).__name__}: {e}"
        raise
    finally:
        elapsed_loop = time.perf_counter() - run.t0
        run.last_loss = trainer.last_loss
        run.write_report(final=True)
        # Persistent workers are otherwise left to interpreter teardown, which
        # can leak their semaphores and race the exit.
        for loader in (train_loader, val_loader):
            _close_loader(loader)
    s = run.train
    _log(
        args,
        f"done: {s.batches} batches in {elapsed_loop:.2f} s, data wait "
        f"{_pct(s.wait_s, s.compute_s)}" + (f" (stopped: {run.stop_reason})" if run.stop_reason else ""),
    )
    return EXIT_OK


def _close_loader(loader: DataLoader | None) -> None:
    it = getattr(loader, "_iterator", None)
    if it is not None:
        loader._iterator = None
        shutdown = getattr(it, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()


def _pct(wait: float, compute: float) -> str:
    total = wait + compute
    return f"{100 * wait / total:.1f}%" if total > 0 else "n/a"


if __name__ == "__main__":
    sys.exit(main())
