#!/usr/bin/env python
"""Overhead of the hook on the pipelines other than a DataLoader: with vs without, side by side.

    python bench/pipelines_overhead.py [--quick] [--json PATH] [--only NAME,NAME]

What the training loop pays per ``next()`` (per batch, per optimizer step) on each path of
the probe that is not the DataLoader patch: ``dlwatch.watch()``'s proxy, the class-swapped
iterators of torchdata.nodes and Grain (probe/consumer.py ``measure()``), the
``queue.Queue`` hand-over (probe/handover.py) and the global optimizer-step hook
(probe/trainthread.py). A plain DataLoader row (probe/patches.py) is there for scale.

Each path runs in its own subprocess (``dlwatch.hook`` imported before the library, as a
job does), so that one path's class-level patches (handover's ``queue.Queue``) never reach
another path's arms. Inside it, as in bench/overhead.py, "without" and "with" alternate
round by round in ABBA order: the hook's piece for that path is taken out with its
``uninstall()`` and put back with its ``install()`` between rounds (for ``watch()``: the
iterable itself, which is what ``watch()`` returns under ``DLWATCH_DISABLE=1``). GC is off
while timing and every arm warms up. Per-call rows time blocks of calls (median block over
calls: a block a neighbour preempted is ignored). Columns: medians over the rounds of each
arm; "added" and "ratio" are the medians of the per-round paired differences and ratios,
with the IQR of those differences and a distribution-free 95% interval for their median.

Rows (``--only`` names in brackets):

- [dataloader] ``DataLoader(TensorDataset, batch_size=1, num_workers=0)``, ``next()``.
- [watch] ``iter(dlwatch.watch(list_of_ints))`` vs ``iter(list_of_ints)``, and
  ``dlwatch.watch(gen())`` vs ``gen()``, a generator of 1-element tensors.
- [nodes] ``Loader(IterableWrapper(list))``: the ``LoaderIterator`` whose class the adapter
  swaps. The row under it has no hook in either arm: the same iterator with its class
  swapped for an empty subclass (on CPython 3.11 a ``__class__`` assignment turns the
  instance's inline attribute values into a dict, and the library's own attribute reads
  on it get slower): the share of the class swap itself.
- [grain] ``MapDataset.source(range(N)).to_iter_dataset(ReadOptions(num_threads=0))``
  (the iterator's own cost) and the same class-swap row; [grain_threads] the default
  ``to_iter_dataset()`` (16 prefetch threads on 2 cores: thread traffic, noisy).
- [handover] a feeder thread iterates a DataLoader (bs=1, nw=0) and ``put()``s into a
  ``queue.Queue()`` / ``Queue(maxsize=2)``, the main thread ``get()``s: per batch, the main
  thread's CPU (``thread_time``), the loop's wall time, the feeder's CPU. 'With' has the
  DataLoader patch in, whose first batch off the main thread installs handover.py. Every
  batch crosses threads and the GIL, so these rows move with the scheduling.
- [queue] the same mechanism without threads in the timing: a queue a feeder thread's real
  epoch marked; the main thread (its consumer) ``put()``s blocks of batches (the feeder's
  per-batch cost) and ``get()``s them (the loop's, timed into its counters); 'without' is a
  pristine ``queue.Queue``. And an unrelated queue nobody marked: ``put()`` + ``get()`` with
  handover.py's class-level patch in vs out.
- [optimizer] ``opt.step()`` of ``SGD`` over 4 floats, trainthread.py's global post-hook
  registered vs not.

A second table gives the once-per-epoch cost: ``iter()`` plus the first ``next()``.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from time import perf_counter_ns

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import text_table, write_json  # noqa: E402
from overhead import ab as _overhead_ab  # noqa: E402
from overhead import cpu_model  # noqa: E402

# rounds: A/B pairs; blocks x block: timed blocks of calls per arm and round.
FULL = dict(
    rounds=60,
    grain_threads_rounds=40,
    handover_rounds=60,
    dl_blocks=20,
    dl_block=100,
    watch_blocks=20,
    watch_block=1000,
    nodes_blocks=20,
    nodes_block=300,
    grain_blocks=20,
    grain_block=100,
    grain_threads_blocks=10,
    grain_threads_block=20,
    handover_batches=2000,
    queue_blocks=20,
    queue_block=300,
    opt_blocks=20,
    opt_block=100,
    warm=16,
)
QUICK = dict(
    rounds=10,
    grain_threads_rounds=6,
    handover_rounds=8,
    dl_blocks=10,
    dl_block=100,
    watch_blocks=10,
    watch_block=1000,
    nodes_blocks=10,
    nodes_block=300,
    grain_blocks=10,
    grain_block=100,
    grain_threads_blocks=6,
    grain_threads_block=20,
    handover_batches=1000,
    queue_blocks=10,
    queue_block=300,
    opt_blocks=10,
    opt_block=100,
    warm=16,
)


# --- statistics: bench/overhead.py's, plus an interval for the median -------------


def median_ci(xs, conf: float = 0.95) -> list[float]:
    """Distribution-free interval for the median: order statistics k and n+1-k, k the
    largest with P(Binomial(n, 1/2) < k) <= (1 - conf) / 2. The range for n < 6."""
    s = sorted(xs)
    n = len(s)
    if n == 0:
        return [float("nan"), float("nan")]
    tail = (1 - conf) / 2
    k, cum = 0, 0.0
    while k < n:
        p = math.comb(n, k) / 2**n
        if cum + p > tail:
            break
        cum += p
        k += 1
    if k == 0:
        return [s[0], s[-1]]
    return [s[k - 1], s[n - k]]


def ab(fn_without, fn_with, rounds: int, warmup: int = 1) -> dict:
    """bench/overhead.py's ABBA alternation and summary, with a 95 % interval
    for each metric's median paired difference."""
    out = _overhead_ab(fn_without, fn_with, rounds, warmup)
    for m in out.values():
        m["added_ci95_ns"] = median_ci([y - x for x, y in zip(m["raw_without_ns"], m["raw_with_ns"])])
    return out


def _blocks(call_block, nblocks: int, per_block: int) -> dict:
    """Time ``nblocks`` runs of ``call_block()`` (``per_block`` calls each): the median
    block and the mean, in ns per call (as bench/overhead.py)."""
    clk = perf_counter_ns
    ts = [0] * nblocks
    gc.disable()
    try:
        t0 = clk()
        for i in range(nblocks):
            call_block()
            ts[i] = clk()
    finally:
        gc.enable()
    d = [ts[0] - t0] + [ts[i] - ts[i - 1] for i in range(1, nblocks)]
    return {"median": statistics.median(d) / per_block, "mean": (ts[-1] - t0) / (nblocks * per_block)}


# --- one epoch of an iterator, timed in blocks of next() ---------------------------


class Epochs:
    """Runs of one arm: ``before()`` (untimed: put the hook in or take it out, build the
    pipeline), then ``make()`` (``iter()``), the first ``next()``, ``warm`` more, then
    ``nblocks`` timed blocks of ``per`` ``next()`` calls, then the rest of the epoch to
    its ``StopIteration`` (untimed). Metrics: ``median`` / ``mean`` ns per ``next()``,
    and ``start``: ``iter()`` plus the first ``next()``, ns (per epoch, not per batch)."""

    def __init__(self, before, make, nblocks: int, per: int, warm: int) -> None:
        self.before, self.make = before, make
        self.nblocks, self.per, self.warm = nblocks, per, warm
        self.measured: list[bool] = []

    def items(self) -> int:
        """How many items an epoch must hold."""
        return 1 + self.warm + self.nblocks * self.per

    def __call__(self) -> dict:
        if self.before is not None:
            self.before()
        clk = perf_counter_ns
        gc.disable()
        try:
            t0 = clk()
            it = self.make()
            next(it)
            t1 = clk()
        finally:
            gc.enable()
        nxt = next
        for _ in range(self.warm):
            nxt(it)
        rng = range(self.per)

        def block():
            for _ in rng:
                nxt(it)

        r = _blocks(block, self.nblocks, self.per)
        left = sum(1 for _ in it)
        if left > 4:
            raise RuntimeError(f"epoch longer than timed: {left} items left")
        self.measured.append(getattr(it, "_dlw_stats", None) is not None)
        r["start"] = float(t1 - t0)
        return r


def _arms(make_arm, rounds: int) -> tuple[dict, dict]:
    """``make_arm(hooked)`` -> an ``Epochs``; A/B over them; also whether each arm's
    iterators were measured (every 'with' one, no 'without' one)."""
    without, with_ = make_arm(False), make_arm(True)
    res = ab(without, with_, rounds, warmup=2)
    checks = {
        "with_measured": all(with_.measured),
        "without_unmeasured": not any(without.measured),
    }
    return res, checks


_plain_subclasses: dict[type, type] = {}


def _swap_alone(make_arm, rounds: int) -> dict:
    """Bare (hook out) vs bare with the iterator's class swapped, right after ``iter()``, for
    a subclass with nothing in it (``__slots__ = ()``; the library's own ``__next__``): the
    class swap of consumer.measure() without its timed ``__next__``. On CPython 3.11 the
    ``__class__`` assignment turns the instance's inline attribute values into a dict (as
    reading ``it.__dict__`` does), and the library's own attribute reads on it get slower."""
    plain = make_arm(False)
    swapped = make_arm(False)
    mk = swapped.make

    def make_swapped():
        it = mk()
        cls = type(it)
        sub = _plain_subclasses.get(cls)
        if sub is None:
            sub = _plain_subclasses[cls] = type(cls.__name__, (cls,), {"__slots__": ()})
        it.__class__ = sub
        return it

    swapped.make = make_swapped
    return ab(plain, swapped, rounds, warmup=2)


def _row(path: str, unit: str, res: dict, key: str = "median", start: bool = True) -> dict:
    """A table row: ``res[key]`` (an ``ab()`` summary), with the per-epoch start if any."""
    return {
        "path": path,
        "per": unit,
        "res": res[key],
        "start": res.get("start") if start else None,
        "all": res,
    }


# --- the paths (each in its own subprocess) ---------------------------------------


def path_dataloader(cfg, torch) -> dict:
    """Reference: a bare DataLoader(TensorDataset, bs=1, nw=0), patches.py's wrapper."""
    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import patches

    nb, per, warm = cfg["dl_blocks"], cfg["dl_block"], cfg["warm"]
    n = Epochs(None, None, nb, per, warm).items()
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=1, num_workers=0)

    def make_arm(hooked):
        return Epochs(patches.install if hooked else patches.uninstall, lambda: iter(loader), nb, per, warm)

    try:
        res, checks = _arms(make_arm, cfg["rounds"])
    finally:
        patches.install()
    return {"rows": [_row("DataLoader, bs=1, nw=0 (reference)", "next()", res)], "checks": checks}


def path_watch(cfg, torch) -> dict:
    """dlwatch.watch() over a list of ints and over a generator of small tensors."""
    import dlwatch

    nb, per, warm = cfg["watch_blocks"], cfg["watch_block"], cfg["warm"]
    n = Epochs(None, None, nb, per, warm).items()
    ints = list(range(n))
    watched = dlwatch.watch(ints)  # an iterable: each iter() an epoch
    if watched is ints:
        raise RuntimeError("dlwatch.watch() returned the list itself (DLWATCH_DISABLE set?)")
    tensors = [torch.tensor([float(i)]) for i in range(n)]

    def gen():
        yield from tensors

    def make_list(hooked):
        return Epochs(None, (lambda: iter(watched)) if hooked else (lambda: iter(ints)), nb, per, warm)

    def make_gen(hooked):
        # An iterator: watch() wraps it, and its one epoch is its life.
        return Epochs(None, (lambda: dlwatch.watch(gen())) if hooked else gen, nb, per, warm)

    r1, c1 = _arms(make_list, cfg["rounds"])
    r2, c2 = _arms(make_gen, cfg["rounds"])
    return {
        "rows": [
            _row("watch(list of ints)", "next()", r1),
            _row("watch(generator of 1-elem tensors)", "next()", r2),
        ],
        "checks": {f"list_{k}": v for k, v in c1.items()} | {f"generator_{k}": v for k, v in c2.items()},
    }


def path_nodes(cfg, torch) -> dict:
    """torchdata.nodes: IterableWrapper(list) -> Loader; LoaderIterator class-swapped."""
    from torchdata.nodes import IterableWrapper, Loader

    from dlwatch.probe.adapters import nodes

    nb, per, warm = cfg["nodes_blocks"], cfg["nodes_block"], cfg["warm"]
    n = Epochs(None, None, nb, per, warm).items()
    items = list(range(n))
    # One Loader per arm, each iterated only with its arm's setting: a Loader hands out the
    # same LoaderIterator every epoch, and a swapped class stays swapped.
    loaders = {False: Loader(IterableWrapper(items)), True: Loader(IterableWrapper(items))}

    def make_arm(hooked):
        ld = loaders[hooked]
        return Epochs(nodes.install if hooked else nodes.uninstall, lambda: iter(ld), nb, per, warm)

    def make_bare(_hooked):
        return Epochs(nodes.uninstall, lambda: iter(Loader(IterableWrapper(items))), nb, per, warm)

    try:
        res, checks = _arms(make_arm, cfg["rounds"])
        mat = _swap_alone(make_bare, cfg["rounds"])
    finally:
        nodes.install()
    return {
        "rows": [
            _row("torchdata.nodes Loader(IterableWrapper(list))", "next()", res),
            _row("  no hook: the class swap alone", "next()", mat, start=False),
        ],
        "checks": checks,
    }


def path_grain(cfg, torch, threads: bool) -> dict:
    """Grain: MapDataset.source(range(N)).to_iter_dataset(), iterated."""
    import grain

    from dlwatch.probe.adapters import grain as grain_adapter

    if threads:
        nb, per = cfg["grain_threads_blocks"], cfg["grain_threads_block"]
        rounds = cfg["grain_threads_rounds"]
        opts: tuple = ()
    else:
        nb, per, rounds = cfg["grain_blocks"], cfg["grain_block"], cfg["rounds"]
        opts = (grain.ReadOptions(num_threads=0),)
    warm = cfg["warm"]
    n = Epochs(None, None, nb, per, warm).items()
    built: list = []

    def build(hooked):
        # A fresh pipeline each round, built with the arm's setting (the adapter swaps the
        # dataset's class at its first iter(); a swapped one stays swapped).
        def before():
            (grain_adapter.install if hooked else grain_adapter.uninstall)()
            built[:] = [grain.MapDataset.source(range(n)).to_iter_dataset(*opts)]

        return before

    def make_arm(hooked):
        return Epochs(build(hooked), lambda: iter(built[0]), nb, per, warm)

    try:
        res, checks = _arms(make_arm, rounds)
        label = "16 prefetch threads" if threads else "ReadOptions(num_threads=0)"
        rows = [_row(f"grain to_iter_dataset(), {label}", "next()", res)]
        if not threads:
            mat = _swap_alone(make_arm, rounds)
            rows.append(_row("  no hook: the class swap alone", "next()", mat, start=False))
    finally:
        grain_adapter.install()
    return {"rows": rows, "checks": checks}


def path_handover(cfg, torch) -> dict:
    """A feeder thread iterates a DataLoader and put()s into a queue.Queue; the main thread
    get()s. 'with': patches.py in (its first batch off the main thread installs handover.py's
    class-level Queue.put/get); 'without': both out."""
    import queue

    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import handover, patches

    n = cfg["handover_batches"]
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=1, num_workers=0)
    clk, cpu = perf_counter_ns, time.thread_time_ns
    seen: dict[bool, list] = {False: [], True: []}

    def epoch(hooked, maxsize):
        def run() -> dict:
            if hooked:
                patches.install()
            else:
                patches.uninstall()
                handover.uninstall()
            q = queue.Queue(maxsize)
            feeder_cpu = [0]

            def feed():
                c0 = cpu()
                # q.put / q.get looked up at each call, as a loop writes them: handover.py
                # patches the class after this epoch's first batch.
                for b in loader:
                    q.put(b)
                feeder_cpu[0] = cpu() - c0
                q.put(None)

            th = threading.Thread(target=feed, name="bench-feeder", daemon=True)
            ts = [0] * n
            gc.disable()
            try:
                th.start()
                q.get()  # the first batch: thread start and iter() are no batch's cost
                c0 = cpu()
                ts[0] = clk()
                for i in range(1, n):
                    q.get()
                    ts[i] = clk()
                c1 = cpu()
                if q.get() is not None:
                    raise RuntimeError("feeder sent more batches than expected")
            finally:
                gc.enable()
            th.join()
            m = n - 1
            d = sorted(ts[k] - ts[k - 1] for k in range(1, n))
            st = next(
                (s for s in patches.registry.snapshot() if s.loader_ref and s.loader_ref() is loader), None
            )
            c = st.consumer if st is not None else None
            seen[hooked].append(
                (
                    getattr(queue.Queue.get, "_dlwatch_orig", None) is not None,
                    c.batches if c is not None else 0,
                )
            )
            return {
                "wall": (ts[n - 1] - ts[0]) / m,
                "median": float(d[len(d) // 2]),
                "loop_cpu": (c1 - c0) / m,
                "feeder_cpu": feeder_cpu[0] / n,
            }

        return run

    out_rows, checks = [], {}
    try:
        for maxsize, label in ((0, "Queue()"), (2, "Queue(maxsize=2)")):
            for k in seen:
                seen[k].clear()
            res = ab(epoch(False, maxsize), epoch(True, maxsize), cfg["handover_rounds"], warmup=2)
            name = f"queue hand-over, {label}"
            out_rows += [
                _row(f"{name}: loop thread CPU", "batch", res, "loop_cpu"),
                _row(f"{name}: wall", "batch", res, "wall"),
                _row(f"{name}: feeder thread CPU", "batch", res, "feeder_cpu"),
            ]
            counts = [b for _, b in seen[True]]
            checks[f"{label}_with_patched"] = all(p for p, _ in seen[True])
            checks[f"{label}_without_pristine"] = not any(p for p, _ in seen[False])
            # The consumer's batch count grows by about n each 'with' epoch (the first get of an
            # epoch opens the wait on a new queue, before any batch marked it).
            steps = [b - a for a, b in zip(counts, counts[1:])]
            checks[f"{label}_loop_get_timed"] = bool(steps) and min(steps) >= n - 2
    finally:
        patches.install()
    return {"rows": out_rows, "checks": checks}


def _put_get_blocks(q, item, nblocks: int, per: int) -> dict:
    """``nblocks`` times: ``per`` ``q.put(item)`` then ``per`` ``q.get()``, each half timed;
    medians over the blocks, ns per call."""
    clk = perf_counter_ns
    rng = range(per)
    puts, gets = [0] * nblocks, [0] * nblocks
    gc.disable()
    try:
        for i in range(nblocks):
            t0 = clk()
            for _ in rng:
                q.put(item)
            t1 = clk()
            for _ in rng:
                q.get()
            t2 = clk()
            puts[i], gets[i] = t1 - t0, t2 - t1
    finally:
        gc.enable()
    pairs = [a + b for a, b in zip(puts, gets)]
    return {
        "put": statistics.median(puts) / per,
        "get": statistics.median(gets) / per,
        "median": statistics.median(pairs) / per,
    }


def path_queue(cfg, torch) -> dict:
    """queue.Queue on one thread, without any thread switch in the timing:

    - the hand-over's queue: a feeder thread ran one real epoch of a DataLoader into it, so
      handover.py marked it as carrying that loader's batches and the main thread is its
      consumer; then the main thread put()s blocks of batches and get()s them back: put() is
      the feeder's per-batch cost, get() the loop's (timed into the consumer's counters).
      'Without': handover.py out, a pristine queue.Queue;
    - an unrelated queue.Queue nobody marked: put() + get(), handover.py's class-level patch
      in vs out (what every other queue of the process pays once the patch is installed).
    """
    import queue

    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import handover, patches

    nb, per, warm = cfg["queue_blocks"], cfg["queue_block"], cfg["warm"]
    loader = DataLoader(TensorDataset(torch.arange(8).float()), batch_size=1, num_workers=0)
    patches.install()
    marked = queue.Queue()

    def feed():
        for b in loader:
            marked.put(b)
        marked.put(None)

    th = threading.Thread(target=feed, name="bench-feeder", daemon=True)
    th.start()
    while marked.get() is not None:
        pass
    th.join()
    st = getattr(marked, "_dlw_fed", None)
    if st is None or st.consumer is None:
        raise RuntimeError("the feeder's epoch did not mark the queue")
    consumer = st.consumer
    item = next(iter(loader))
    counted: list[int] = []
    patched: dict[bool, list] = {False: [], True: []}

    def arm(hooked, use_marked):
        def run() -> dict:
            (handover.install if hooked else handover.uninstall)()
            patched[hooked].append(getattr(queue.Queue.get, "_dlwatch_orig", None) is not None)
            q = marked if hooked and use_marked else queue.Queue()
            for _ in range(warm):
                q.put(item)
                q.get()
            b0 = consumer.batches
            r = _put_get_blocks(q, item, nb, per)
            if hooked and use_marked:
                counted.append(consumer.batches - b0)
            return r

        return run

    try:
        res = ab(arm(False, True), arm(True, True), cfg["rounds"], warmup=2)
        other = ab(arm(False, False), arm(True, False), cfg["rounds"], warmup=2)
    finally:
        handover.install()
    checks = {
        "with_patched": all(patched[True]),
        "without_pristine": not any(patched[False]),
        "marked_get_timed": bool(counted) and min(counted) == nb * per,
    }
    return {
        "rows": [
            _row("hand-over queue, loop's get() (one thread)", "batch", res, "get"),
            _row("hand-over queue, feeder's put() (one thread)", "batch", res, "put"),
            _row("unrelated queue.Queue: put() + get()", "put+get", other),
        ],
        "checks": checks,
    }


def path_optimizer(cfg, torch) -> dict:
    """torch's global optimizer-step post-hook (trainthread.py) on a tiny SGD."""
    from torch.optim import optimizer as optim_mod

    from dlwatch.probe import trainthread

    nb, per = cfg["opt_blocks"], cfg["opt_block"]
    p = torch.nn.Parameter(torch.zeros(4))
    p.grad = torch.ones(4)
    opt = torch.optim.SGD([p], lr=0.0)
    step = opt.step
    rng = range(per)
    hooks: dict[bool, list] = {False: [], True: []}

    def arm(hooked):
        def run() -> dict:
            (trainthread.install if hooked else trainthread.uninstall)()
            hooks[hooked].append(len(optim_mod._global_optimizer_post_hooks))
            for _ in range(cfg["warm"]):
                step()

            def block():
                for _ in rng:
                    step()

            return _blocks(block, nb, per)

        return run

    try:
        res = ab(arm(False), arm(True), cfg["rounds"], warmup=2)
    finally:
        trainthread.install()
    checks = {"with_hooked": min(hooks[True]) == 1, "without_no_hook": max(hooks[False]) == 0}
    return {"rows": [_row("optimizer.step(), SGD over 4 floats", "step", res)], "checks": checks}


PATHS = {
    "dataloader": path_dataloader,
    "watch": path_watch,
    "nodes": path_nodes,
    "grain": lambda cfg, torch: path_grain(cfg, torch, threads=False),
    "grain_threads": lambda cfg, torch: path_grain(cfg, torch, threads=True),
    "handover": path_handover,
    "queue": path_queue,
    "optimizer": path_optimizer,
}


def child(name: str, quick: bool, out: str) -> int:
    """One path, in this process: the hook imported first, as a job would."""
    os.environ.pop("DLWATCH_DISABLE", None)
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch

    import dlwatch.hook  # noqa: F401
    from dlwatch.probe import patches, publisher

    torch.set_num_threads(1)
    cfg = QUICK if quick else FULL
    t0 = time.monotonic()
    try:
        if not patches.installed():
            raise RuntimeError("dlwatch hook did not install")
        res = PATHS[name](cfg, torch)
    finally:
        pub = publisher.current()
        if pub is not None:
            pub.close()
    res["seconds"] = time.monotonic() - t0
    res["publisher_ran"] = pub is not None
    res["torch"] = torch.__version__
    with open(out, "w") as f:
        json.dump(res, f)
    return 0


# --- report ---------------------------------------------------------------------------


def _us(ns: float) -> str:
    return f"{ns / 1000:.3f}"


def _table(rows) -> str:
    body = []
    for path, unit, r in rows:
        lo, hi = r["added_iqr_ns"]
        clo, chi = r["added_ci95_ns"]
        body.append(
            (
                path,
                unit,
                _us(r["without_ns"]),
                _us(r["with_ns"]),
                f"{r['added_ns'] / 1000:+.3f}",
                f"[{lo / 1000:+.3f}, {hi / 1000:+.3f}]",
                f"[{clo / 1000:+.3f}, {chi / 1000:+.3f}]",
                f"{r['ratio']:.3f}",
            )
        )
    head = ("path", "per", "bare µs", "hooked µs", "added µs", "added IQR", "added 95% CI", "ratio")
    return text_table(head, body)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="short run (about a minute)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--only", metavar="NAMES", help=f"comma-separated subset of: {', '.join(PATHS)}")
    ap.add_argument("--child", metavar="NAME", help=argparse.SUPPRESS)
    ap.add_argument("--out", metavar="PATH", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args.child, args.quick, args.out)

    names = list(PATHS)
    if args.only:
        names = [x.strip() for x in args.only.split(",") if x.strip()]
        bad = [x for x in names if x not in PATHS]
        if bad:
            ap.error(f"unknown path(s): {', '.join(bad)}")
    t_start = time.monotonic()
    own_dir = tempfile.mkdtemp(prefix="dlwatch-bench-")
    env = dict(os.environ)
    env.pop("DLWATCH_DISABLE", None)
    # A private runtime dir: the publisher really runs, but no monitor lists the benchmark.
    env.setdefault("DLWATCH_DIR", os.path.join(own_dir, "run"))
    env["PYTHONWARNINGS"] = "ignore"
    results: dict = {}
    try:
        for name in names:
            out = os.path.join(own_dir, f"{name}.json")
            cmd = [sys.executable, os.path.abspath(__file__), "--child", name, "--out", out]
            if args.quick:
                cmd.append("--quick")
            p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if p.returncode != 0:
                print(f"{name}: failed (exit {p.returncode})\n{p.stdout[-4000:]}", file=sys.stderr)
                results[name] = {"error": p.stdout[-4000:]}
                continue
            with open(out) as f:
                results[name] = json.load(f)
            print(f"  {name}: {results[name]['seconds']:.1f} s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(own_dir, ignore_errors=True)

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    torch_v = next((r["torch"] for r in results.values() if "torch" in r), "?")
    envd = {
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "torch": torch_v,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "loadavg_end": load,
        "mode": "quick" if args.quick else "full",
        "params": QUICK if args.quick else FULL,
    }
    print(
        f"dlwatch pipelines overhead ({envd['mode']}): torch {torch_v}, Python {envd['python']}, "
        f"{envd['cpu_count']} CPUs, {envd['cpu_model']}"
    )
    print(f"{envd['platform']}; load average {', '.join(f'{x:.1f}' for x in load) if load else 'n/a'}")
    print(
        "µs per unit ('per'): medians over A/B-alternated rounds of each arm; added and ratio: medians"
        " of the per-round paired differences and ratios\n"
    )
    all_rows = [row for name in names for row in results.get(name, {}).get("rows", ())]
    print(_table([(x["path"], x["per"], x["res"]) for x in all_rows]))
    starts = [(x["path"], "epoch", x["start"]) for x in all_rows if x["start"] is not None]
    if starts:
        print(
            "\nper epoch, once: iter() plus the first next() (registry, class swap, first-batch"
            " bookkeeping)\n"
        )
        print(_table(starts))

    print("\nnotes (what each row measures: the module docstring):")
    print(
        "- per-call rows: median block of calls; 'queue hand-over' rows: two threads, per batch: the"
        " loop's CPU (thread_time),"
    )
    print(
        "  its wall time, the feeder's CPU (DataLoader + put); every batch crosses threads and the GIL,"
        " so read their intervals."
    )
    print("- 'no hook: the class swap alone' rows: both arms without the hook.")
    failed = []
    for name in names:
        r = results.get(name, {})
        if "error" in r:
            failed.append(f"{name}: run failed")
            continue
        for k, v in r.get("checks", {}).items():
            if not v:
                failed.append(f"{name}: {k}")
    print("- checks (each 'with' arm measured, each 'without' arm pristine): " + ("ok" if not failed else ""))
    for f in failed:
        print(f"  FAILED {f}")
    print(f"\ntotal {time.monotonic() - t_start:.1f} s")
    if args.json:
        write_json(args.json, {"env": envd, "results": results})
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
