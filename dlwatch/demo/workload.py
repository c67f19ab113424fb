"""The demo's workload: what each sample, batch and training step costs, the
deterministic synthetic datasets, and the tiny model and its step.

Every class here is top-level and picklable on purpose: under spawn/forkserver
the workers re-import this module and unpickle the datasets, collate and
worker-init objects by name.
"""

from __future__ import annotations

import atexit
import math
import signal
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, IterableDataset, default_collate, get_worker_info

# A collated batch as the loop and the step see it: images, then labels.
Batch = Sequence[torch.Tensor]

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

    def __iter__(self) -> Iterator[tuple[torch.Tensor, int]]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        # Non-persistent workers get a fresh copy carrying set_epoch's value;
        # persistent ones keep their first copy, so count passes locally too.
        epoch = max(self.epoch, self._passes)
        self._passes += 1
        order: Sequence[int]
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

    def __call__(self, samples: list[tuple[torch.Tensor, int]]) -> Batch:
        global _KEPT_BYTES
        batch = default_collate(samples)
        spend(self.cost, self.batch_cost_ms)
        if self.grow_bytes > 0 and _KEPT_BYTES + self.grow_bytes <= self.grow_limit_bytes:
            # Filled, not zeroed: untouched pages of a fresh allocation are not
            # resident and would not show in USS.
            _KEPT.append(bytearray(b"\xa5") * self.grow_bytes)
            _KEPT_BYTES += self.grow_bytes
        return batch


def _let_the_feeder_finish() -> None:
    # A spawned or forkserver worker leaves through the interpreter's
    # finalization. When the trainer stops mid-epoch, the worker's result
    # queue may still be sending a batch, its feeder thread inside torch's
    # C++ (sharing a storage's file descriptor); CPython 3.11 then ends that
    # daemon thread with pthread_exit through the C++ frames, std::terminate
    # aborts the worker, and the trainer reports "DataLoader worker ... is
    # killed by signal: Aborted" (2 to 5 runs in 12 of the spawn scenario,
    # each run three 0.3 s stops). torch does not join the feeder
    # (cancel_join_thread), so the worker gives it a moment here, before
    # finalization starts (atexit runs on the main thread, never the feeder).
    for t in threading.enumerate():
        if t.name == "QueueFeederThread":
            t.join(timeout=1.0)


class DemoWorkerInit:
    def __init__(self, threads: int | None) -> None:
        self.threads = threads

    def __call__(self, worker_id: int) -> None:
        atexit.register(_let_the_feeder_finish)
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

    def _gpu_pad(self, target_ms: float) -> None:
        # Pad with a GPU spin kernel so the device shows as busy, like real
        # kernels would; the model's own GPU time is subtracted from the target.
        pad_ms = max(0.0, target_ms - self._gpu_model_ms)
        if pad_ms > 0:
            torch.cuda._sleep(int(pad_ms * self._gpu_cycles_per_ms))

    def train_step(self, batch: Batch) -> None:
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

    def val_step(self, batch: Batch) -> None:
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
