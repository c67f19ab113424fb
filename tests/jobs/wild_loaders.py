"""Loaders as they are found in the wild, each measuring what its loop waits.

Usage: wild_loaders.py MODE OUT.json [--in-order 0|1] [--train-s S] [--stop-file PATH]

MODE:
  thread      a producer thread iterates a num_workers=0 DataLoader into a
              queue; the main thread trains from the queue and times its get()
  thread-dies the same, but the producer returns after 60 batches: the loop
              then waits in get() forever
  unsharded   an IterableDataset over one "file" shared out by worker id with
              get_worker_info(): worker 0 gets it, workers 1 and 2 nothing
  sharded     the same over three files: every worker gets one
  duplicated  an IterableDataset that ignores get_worker_info(): every worker
              yields the whole stream
  hf-shards   an HF datasets IterableDataset (from_generator) of one shard on
              3 workers: datasets gives worker 0 the shard and stops 1 and 2
  slow-tail   a map dataset where 1 batch in 20 takes 300 ms (the others 12
              ms), 4 workers, in_order as given: head-of-line blocking
  cycle       itertools.cycle over a 64-sample DataLoader (16 batches): after
              the first pass the loop trains on cached batches
  short-epochs  48 samples of ~20 ms of CPU work each, 2 workers,
              persistent_workers off: ~0.5 s epochs, new workers every epoch
  zip         two DataLoaders taken together every step, zip(a, b) as in
              semi-supervised training: a loads 40 ms a batch, b 80 ms, each
              on 2 workers (b on --workers-b): the loop waits for b, then a

Prints ``ready {json}`` at the first batch and writes OUT.json at the end:
``spans`` (the main loop's own [epoch, wait start, wait end] per batch,
``next_cpu`` (its thread's CPU ns inside each next(), [wait end, ns]),
perf_counter_ns), ``batches`` and ``seconds`` (of the measured loop).
"""

import argparse
import itertools
import json
import os
import queue
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, get_worker_info

import dlwatch.hook  # noqa: F401  (the one line)

SAMPLE_S = 0.004
BATCH = 4


class Files(IterableDataset):
    """Samples from ``files`` files of 100000 each; ``shard`` False: every
    worker reads every file (the classic duplicate)."""

    def __init__(self, files: int, shard: bool = True) -> None:
        self.files = files
        self.shard = shard

    def __iter__(self):
        info = get_worker_info()
        mine = range(self.files)
        if self.shard and info is not None:
            mine = range(info.id, self.files, info.num_workers)
        for f in mine:
            for i in range(100000):
                time.sleep(SAMPLE_S)
                yield torch.tensor([f, i], dtype=torch.float32)


class Slow(Dataset):
    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(SAMPLE_S)
        return torch.tensor([i], dtype=torch.float32)


class Sleepy(Dataset):
    def __init__(self, sample_s: float) -> None:
        self.sample_s = sample_s

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(self.sample_s)
        return torch.tensor([i], dtype=torch.float32)


class RareSlow(Dataset):
    """12 ms a batch of 4, but every 80th sample (one batch in 20) takes 300 ms."""

    def __len__(self):
        return 100000

    def __getitem__(self, i):
        time.sleep(0.3 if i % 80 == 79 else 0.003)
        return torch.tensor([i], dtype=torch.float32)


class Spinning(Dataset):
    """``n`` samples that each cost a fixed amount of CPU work (decoding):
    ``ops`` additions, about 20 ms on the 2-core box. Work, not a spin for a
    time: a worker that waits for a core takes longer, as a real one does."""

    def __init__(self, n: int, ops: int) -> None:
        self.n, self.ops = n, ops

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = 0
        for k in range(self.ops):
            x += k
        return torch.tensor([i], dtype=torch.float32)


def hf_stream(shards: int):
    """An HF datasets IterableDataset of ``shards`` shards (one a list item
    of gen_kwargs) whose samples load as Files' do."""
    from datasets import IterableDataset as HFIterable

    return HFIterable.from_generator(_hf_rows, gen_kwargs={"files": list(range(shards))})


def _hf_rows(files):
    for f in files:
        for i in range(100000):
            time.sleep(SAMPLE_S)
            yield {"f": f, "i": i}


def pairs(rows):
    return torch.tensor([[r["f"], r["i"]] for r in rows], dtype=torch.float32)


def spin(seconds: float) -> None:
    """A step that keeps the thread on a CPU, as training does."""
    end = time.perf_counter() + seconds
    x = torch.ones(64, 64)
    while time.perf_counter() < end:
        x = (x @ x).clamp_(-1, 1)


def loop(batches, a, spans, step_s: float, step=time.sleep) -> dict:
    """Train on ``batches`` (an iterable) for a.train_s seconds."""
    t0 = None
    n = 0
    next_cpu = []  # the loop thread's own CPU inside each next(): [wait end, ns]
    it = iter(batches)
    while True:
        w0 = time.perf_counter_ns()
        c0 = time.thread_time_ns()
        batch = next(it)
        c1 = time.thread_time_ns()
        w1 = time.perf_counter_ns()
        if t0 is None:
            t0 = time.monotonic()
            print("ready", json.dumps({"first": batch.tolist()[:2]}), flush=True)
        else:
            spans.append([0, w0, w1])
            next_cpu.append([w1, c1 - c0])
            n += 1
        step(step_s)
        if time.monotonic() - t0 > a.train_s or (a.stop_file and os.path.exists(a.stop_file)):
            return {"batches": n, "seconds": time.monotonic() - t0, "next_cpu": next_cpu}


def thread_fed(a, spans, last: int | None = None) -> dict:
    q: queue.Queue = queue.Queue(maxsize=8)
    dl = DataLoader(Slow(), batch_size=BATCH, num_workers=0)
    stop = threading.Event()

    def produce():
        for i, b in enumerate(dl):
            if last is not None and i == last:
                return  # gone without a word: the loop waits in get() for good
            while not stop.is_set():
                try:
                    q.put(b, timeout=0.1)
                    break
                except queue.Full:
                    pass
            if stop.is_set():
                return

    th = threading.Thread(target=produce, name="producer", daemon=True)
    th.start()
    # The queue fills before training starts: the loop then never waits
    # while the producer, loading every batch itself, always does.
    while not q.full():
        time.sleep(0.01)

    def take():
        while True:
            yield q.get()

    # 16 ms a batch loaded vs 25 ms a step on a CPU: the producer keeps ahead.
    out = loop(take(), a, spans, step_s=0.025, step=spin)
    stop.set()
    th.join()
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode")
    p.add_argument("out")
    p.add_argument("--in-order", type=int, default=1)
    p.add_argument("--workers-b", type=int, default=2)
    p.add_argument("--train-s", type=float, default=6.0)
    # Train until this file exists (or --train-s passes): a test that takes
    # several snapshots on a loaded box says when it is done.
    p.add_argument("--stop-file")
    a = p.parse_args()
    spans: list = []
    kw = dict(batch_size=BATCH, multiprocessing_context="fork")
    if a.mode == "thread":
        res = thread_fed(a, spans)
    elif a.mode == "thread-dies":
        res = thread_fed(a, spans, last=60)
    elif a.mode in ("unsharded", "sharded", "duplicated"):
        files = {"unsharded": 1, "sharded": 3, "duplicated": 1}[a.mode]
        ds = Files(files, shard=a.mode != "duplicated")
        res = loop(DataLoader(ds, num_workers=3, **kw), a, spans, step_s=0.004)
    elif a.mode == "hf-shards":
        res = loop(
            DataLoader(hf_stream(shards=1), num_workers=3, collate_fn=pairs, **kw), a, spans, step_s=0.004
        )
    elif a.mode == "slow-tail":
        dl = DataLoader(RareSlow(), num_workers=4, in_order=bool(a.in_order), **kw)
        res = loop(dl, a, spans, step_s=0.020)
    elif a.mode == "cycle":
        small = DataLoader(Subset(Sleepy(0.005), range(64)), num_workers=2, **kw)
        model = torch.nn.Linear(1, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)

        def train_step(seconds: float) -> None:
            # An optimizer step: how dlwatch knows the training thread.
            opt.zero_grad()
            model(torch.ones(1, 1)).sum().backward()
            opt.step()
            time.sleep(seconds)

        res = loop(itertools.cycle(small), a, spans, step_s=0.010, step=train_step)
    elif a.mode == "short-epochs":
        dl = DataLoader(Spinning(48, 160_000), num_workers=2, **kw)
        # A new iter(dl) each epoch: with persistent_workers off, new workers.
        res = loop((b for _ in itertools.count() for b in dl), a, spans, step_s=0.015)
    elif a.mode == "zip":
        # next() of the zip is the loop's wait on both loaders, one after the other.
        a_dl = DataLoader(Sleepy(0.010), num_workers=2, **kw)
        b_dl = DataLoader(Sleepy(0.020), num_workers=a.workers_b, **kw)
        res = loop(map(lambda ab: ab[1], zip(a_dl, b_dl)), a, spans, step_s=0.008)
    else:
        raise SystemExit(f"unknown mode {a.mode}")
    res["spans"] = spans
    with open(a.out, "w") as f:
        json.dump(res, f)
    print("done", flush=True)


if __name__ == "__main__":
    main()
