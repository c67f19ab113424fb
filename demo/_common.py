"""Shared parts of the demo training scripts: arguments, data, the step, the loop and its own meter.

Each demo script only builds its input pipeline; everything else lives here so
that the scripts differ in exactly one thing, what feeds the loop. The loop's
own meter (LoopMeter) is the ground truth dlwatch's end-to-end tests compare
against, so it times nothing but the loop's own request for the next batch.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import time

import numpy as np
from PIL import Image

# torch is imported only where it is used: grain's mp_prefetch spawns workers that
# re-import this module, and they need only PIL and numpy (torch costs seconds each).

N_IMAGES = 64
IMAGE_SIZE = 192
CROP = 160
# 512 samples = 64 batches of 8: long enough that epoch restarts stay a small
# part of the run, short enough that every run crosses several epochs.
EPOCH_SAMPLES = 512
REPORT_EVERY_NS = 2_000_000_000

_MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32).reshape(3, 1, 1)
_STD = np.array([0.229, 0.224, 0.225], dtype=np.float32).reshape(3, 1, 1)


# -- arguments --------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Sets EPOCH_SAMPLES from --epoch-samples as it parses (the scripts read
    the module's constant)."""

    def parse_args(self, *a, **kw):  # type: ignore[override]
        global EPOCH_SAMPLES
        args = super().parse_args(*a, **kw)
        EPOCH_SAMPLES = args.epoch_samples
        return args


def make_parser(doc: str | None, workers_help: str | None = None) -> argparse.ArgumentParser:
    """The arguments every demo takes; a script adds its own before parsing."""
    p = _Parser(
        description=doc.strip().splitlines()[0] if doc else None,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--seconds", type=float, default=60.0, help="train this long")
    p.add_argument(
        "--step",
        choices=["cpu", "idle", "cuda"],
        default="cpu",
        help="cpu: a small CNN on the CPU, padded with busy torch ops to --step-ms; cuda: the same CNN on "
        "the GPU, padded with GPU matmuls the host thread waits on; "
        "idle: a tiny model, then sleep to --step-ms (a stand-in for a GPU step)",
    )
    p.add_argument("--step-ms", type=float, default=20.0, help="how long one training step takes")
    p.add_argument("--workers", type=int, default=2, help=workers_help or "input pipeline workers")
    p.add_argument("--batch-size", type=int, default=8, help="samples per batch")
    p.add_argument("--spans", metavar="PATH", help="write the meter's spans here (JSON) at the end")
    p.add_argument("--stop-file", metavar="PATH", help="stop early once this file exists (checked per batch)")
    p.add_argument("--epoch-samples", type=int, default=EPOCH_SAMPLES, help="samples in an epoch")
    return p


# -- data -------------------------------------------------------------------

_jpegs: list[bytes] | None = None


def jpegs() -> list[bytes]:
    """The 64 JPEGs, built on first use.

    Lazily and deterministically, so that a worker started by spawn or
    forkserver rebuilds the very same bytes; call it once at start so that
    forked workers inherit them instead."""
    global _jpegs
    if _jpegs is None:
        rng = np.random.default_rng(0)
        yy, xx = np.mgrid[0:IMAGE_SIZE, 0:IMAGE_SIZE]
        out = []
        for k in range(N_IMAGES):
            # Gradients plus noise: compresses (and decodes) like a photo, not like flat colour.
            channels = [(xx * (k + 1)) % 256, (yy * (k + 3)) % 256, ((xx + yy) * (k + 5) // 2) % 256]
            base = np.stack(channels, -1)
            pixels = np.clip(base + rng.normal(0.0, 20.0, base.shape), 0, 255).astype(np.uint8)
            buf = io.BytesIO()
            Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
            out.append(buf.getvalue())
        _jpegs = out
    return _jpegs


def decode_sample(jpeg: bytes, i: int) -> np.ndarray:
    """Decode, crop (offset from i), flip odd i, normalize: float32 CHW."""
    img = Image.open(io.BytesIO(jpeg)).convert("RGB")
    ox, oy = (i * 7) % (IMAGE_SIZE - CROP + 1), (i * 13) % (IMAGE_SIZE - CROP + 1)
    img = img.crop((ox, oy, ox + CROP, oy + CROP))
    if i % 2:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    arr = np.asarray(img, dtype=np.float32).transpose(2, 0, 1) / 255.0
    return (arr - _MEAN) / _STD


def load_sample(i: int) -> tuple[np.ndarray, int]:
    """Sample i: (image [3,160,160] float32, label). Top level, so it pickles by reference."""
    i = int(i)
    return decode_sample(jpegs()[i % N_IMAGES], i), i % 10


def stack(samples) -> tuple[np.ndarray, np.ndarray]:
    """The numpy half of collate(): [B,3,160,160] float32 images, [B] int64 labels."""
    images, labels = zip(*samples)
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def to_torch(batch: tuple[np.ndarray, np.ndarray]):
    import torch

    images, labels = batch
    return torch.from_numpy(images), torch.from_numpy(labels)


def collate(samples):
    """[B,3,160,160] float32 and [B] int64 tensors."""
    return to_torch(stack(samples))


class JpegDataset:
    """Map-style dataset (all a DataLoader asks of one) of EPOCH_SAMPLES samples over the 64 JPEGs."""

    def __len__(self) -> int:
        return EPOCH_SAMPLES

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return load_sample(i)


# -- the training step ------------------------------------------------------


def make_step(args: argparse.Namespace):
    """step(batch): forward, backward and a real optimizer.step(), padded to --step-ms."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    # One intra-op thread: on a small box the step then costs one core, and the
    # input pipeline's workers get the rest, as they would beside a GPU step.
    torch.set_num_threads(1)
    torch.manual_seed(0)
    cpu = args.step == "cpu"
    cuda = args.step == "cuda"
    if cpu or cuda:
        model: nn.Module = nn.Sequential(
            nn.Conv2d(3, 8, kernel_size=4, stride=4),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 10),
        )
    else:
        model = nn.Linear(3, 10)
    device = "cuda" if cuda else "cpu"
    model = model.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    budget_ns = int(args.step_ms * 1e6)
    n = 4096 if cuda else 64
    spin = torch.randn(n, n, device=device)

    def step(batch) -> None:
        start = time.perf_counter_ns()
        x, y = batch
        if cuda:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        elif not cpu:
            x = x.mean(dim=(2, 3))
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if cuda:
            # GPU work until the budget is spent, waiting on each: the host
            # thread idles in CUDA synchronisation, as a GPU step's does.
            torch.cuda.synchronize()
            while time.perf_counter_ns() - start < budget_ns:
                torch.mm(spin, spin)
                torch.cuda.synchronize()
        elif cpu:
            # Busy torch ops, not a sleep: the step holds a core like real compute
            # (and, like real compute, releases the GIL inside each op).
            while time.perf_counter_ns() - start < budget_ns:
                torch.mm(spin, spin)
        else:
            rest = budget_ns - (time.perf_counter_ns() - start)
            if rest > 0:
                time.sleep(rest / 1e9)

    return step


# -- the loop's own meter ---------------------------------------------------


def _emit(tag: str, payload: dict) -> None:
    print(f"{tag} {json.dumps(payload)}", flush=True)


def _fraction(wait_ns: int, step_ns: int) -> float:
    return wait_ns / (wait_ns + step_ns) if wait_ns + step_ns > 0 else 0.0


class LoopMeter:
    """Times the loop's own wait for data.

    A span [epoch, t0, t1] is one next() call (perf_counter_ns). Wait is the
    time inside next(); step is the time from one next() returning to the
    following next() starting, within the same epoch (the gap across an epoch
    boundary, where the next epoch's iterator is built, counts as neither)."""

    def __init__(self) -> None:
        self.epoch = 0
        self.spans: list[list[int]] = []
        self.wait_ns = 0
        self.step_ns = 0
        self._prev_t1: int | None = None
        self._first_t0: int | None = None
        self._end_ns: int | None = None
        self._rep_t = self._rep_wait = self._rep_step = self._rep_batches = 0

    def new_epoch(self) -> None:
        self.epoch += 1
        self._prev_t1 = None

    def next(self, it):
        t0 = time.perf_counter_ns()
        batch = next(it)  # StopIteration propagates: the end of an epoch is no span
        t1 = time.perf_counter_ns()
        self._record(t0, t1)
        return batch

    def _record(self, t0: int, t1: int) -> None:
        self.spans.append([self.epoch, t0, t1])
        self.wait_ns += t1 - t0
        if self._prev_t1 is not None:
            self.step_ns += t0 - self._prev_t1
        self._prev_t1 = t1
        if self._first_t0 is None:
            self._first_t0 = self._rep_t = t0
            _emit("ready", {"pid": os.getpid()})
        if t1 - self._rep_t >= REPORT_EVERY_NS:
            batches = len(self.spans)
            _emit(
                "own-meter",
                {
                    "data_wait_fraction": round(
                        _fraction(self.wait_ns - self._rep_wait, self.step_ns - self._rep_step), 6
                    ),
                    "batches_per_s": round((batches - self._rep_batches) / ((t1 - self._rep_t) / 1e9), 3),
                    "batches": batches,
                },
            )
            self._rep_t, self._rep_wait, self._rep_step, self._rep_batches = (
                t1,
                self.wait_ns,
                self.step_ns,
                batches,
            )

    def end_loop(self) -> None:
        """The loop stopped (before any cleanup, which is no part of training)."""
        self._end_ns = time.perf_counter_ns()

    def finish(self, spans_path: str | None) -> None:
        end = self._end_ns if self._end_ns is not None else time.perf_counter_ns()
        seconds = (end - self._first_t0) / 1e9 if self._first_t0 is not None else 0.0
        batches = len(self.spans)
        _emit(
            "own-meter-total",
            {
                "data_wait_fraction": round(_fraction(self.wait_ns, self.step_ns), 6),
                "batches_per_s": round(batches / seconds, 3) if seconds > 0 else 0.0,
                "batches": batches,
                "epochs": self.epoch,
                "wait_s": round(self.wait_ns / 1e9, 6),
                "step_s": round(self.step_ns / 1e9, 6),
                "seconds": round(seconds, 6),
            },
        )
        if spans_path:
            # Written whole then renamed: a reader polling for the file never sees half of it.
            tmp = f"{spans_path}.tmp{os.getpid()}"
            with open(tmp, "w") as f:
                json.dump({"spans": self.spans, "batches": batches, "seconds": seconds}, f)
            os.replace(tmp, spans_path)


# -- the loop ---------------------------------------------------------------


def _close(obj) -> None:
    close = getattr(obj, "close", None)
    if callable(close):
        close()


def train(iterable_factory, args: argparse.Namespace, meter: LoopMeter | None = None) -> None:
    """Train for --seconds (or until --stop-file exists), one iter(iterable) per epoch.

    If the iterable or an epoch's iterator has close(), it is called on the way
    out, so whatever threads or processes the pipeline started are stopped
    before the process exits."""
    meter = meter or LoopMeter()
    step = make_step(args)
    deadline = time.perf_counter_ns() + int(args.seconds * 1e9)
    stop_file = args.stop_file
    iterable = iterable_factory()
    it = None
    try:
        while True:
            it = iter(iterable)
            n = 0
            stop = False
            while not stop:
                try:
                    batch = meter.next(it)
                except StopIteration:
                    break
                n += 1
                step(batch)
                stop = time.perf_counter_ns() >= deadline or bool(stop_file and os.path.exists(stop_file))
            if stop or n == 0:
                if n == 0:
                    print("the input pipeline yielded no batches", file=sys.stderr)
                break
            _close(it)
            meter.new_epoch()
    except KeyboardInterrupt:
        pass  # Ctrl-C ends training like the stop file does
    finally:
        # The loop's time ends here; shutting the pipeline down is no part of it.
        meter.end_loop()
        if it is not None:
            _close(it)
        del it
        _close(iterable)
    meter.finish(args.spans)
