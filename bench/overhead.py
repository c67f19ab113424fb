#!/usr/bin/env python
"""Overhead of the dlwatch probe: with vs without, side by side, in one run.

    python bench/overhead.py [--quick] [--json PATH]

docs/ARCHITECTURE.md §4 asks for at most 1 µs median added per batch in the trainer and at
most 1 µs per batch in a worker. Every "with vs without" figure here is an
A/B alternation inside one process (ABBA order, so a linear drift cancels),
with the garbage collector off during timed loops, after a warm-up; the
"added" column is the median of the per-round paired differences and the
"ratio" column the median of the per-round ratios. See bench/README.md for
what each row measures.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import types
from time import perf_counter_ns

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import write_json  # noqa: E402

# Targets (docs/ARCHITECTURE.md §4).
TARGET_TRAINER_ADDED_NS = 1000
TARGET_TRAINER_RATIO = 1.03
TARGET_WORKER_ADDED_NS = 1000

# rounds: A/B pairs; blocks x block: timed blocks of calls per arm and round.
FULL = dict(
    trainer_rounds=30,
    trainer_batches=2000,
    next_rounds=30,
    next_blocks=20,
    next_block=200,
    wrap_rounds=30,
    wrap_blocks=20,
    wrap_block=1000,
    fetch_rounds=30,
    fetch_blocks=40,
    fetch_block=50,
    e2e_rounds=24,
    e2e_batches=1000,
    pub_ticks=200,
)
QUICK = dict(
    trainer_rounds=10,
    trainer_batches=1000,
    next_rounds=8,
    next_blocks=10,
    next_block=200,
    wrap_rounds=8,
    wrap_blocks=10,
    wrap_block=1000,
    fetch_rounds=8,
    fetch_blocks=20,
    fetch_block=50,
    e2e_rounds=4,
    e2e_batches=300,
    pub_ticks=50,
)


# --- environment -----------------------------------------------------------------


def cpu_model() -> str:
    """/proc/cpuinfo's "model name" (the same on every core here), else platform's guess.

    Overhead figures are per CPU model: the same code costs +0.2 µs on one
    2-core cloud CPU and +1.2 µs on another (README, Performance).
    """
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


# --- statistics ------------------------------------------------------------------


def _quantile(xs, q):
    s = sorted(xs)
    if not s:
        return float("nan")
    pos = (len(s) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def ab(fn_without, fn_with, rounds: int, warmup: int = 1) -> dict:
    """Alternate A (without) and B (with) ``rounds`` times, ABBA order.

    Each fn runs one measurement and returns ``{metric: ns per unit}``; every
    metric is summarised on its own (medians of the rounds, median of the
    paired differences and ratios).
    """
    gc.collect()
    for _ in range(warmup):
        fn_without()
        fn_with()
    a, b = [], []
    for r in range(rounds):
        if r % 2 == 0:
            x = fn_without()
            y = fn_with()
        else:
            y = fn_with()
            x = fn_without()
        a.append(x)
        b.append(y)
    out = {}
    for k in a[0]:
        xa = [m[k] for m in a]
        xb = [m[k] for m in b]
        diffs = [y - x for x, y in zip(xa, xb)]
        ratios = [y / x for x, y in zip(xa, xb) if x > 0]
        out[k] = {
            "rounds": rounds,
            "without_ns": statistics.median(xa),
            "with_ns": statistics.median(xb),
            "added_ns": statistics.median(diffs),
            "added_iqr_ns": [_quantile(diffs, 0.25), _quantile(diffs, 0.75)],
            "ratio": statistics.median(ratios) if ratios else float("nan"),
            "raw_without_ns": xa,
            "raw_with_ns": xb,
        }
    return out


def _timed_loop(body) -> int:
    """Run ``body()`` with GC off; return elapsed ns."""
    gc.disable()
    try:
        t0 = perf_counter_ns()
        body()
        return perf_counter_ns() - t0
    finally:
        gc.enable()


def _blocks(call_block, nblocks: int, per_block: int) -> dict:
    """Time ``nblocks`` runs of ``call_block()`` (``per_block`` calls each).

    Returns the median block and the mean, in ns per call. A block is well
    under a scheduler time slice, so most blocks are never preempted and the
    median ignores the ones that are.
    """
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


# --- trainer side ------------------------------------------------------------------


def _snapshot_class(cls, names):
    return {n: cls.__dict__.get(n, _ABSENT) for n in names}


_ABSENT = object()
_PATCHED_NAMES = ("__init__", "__next__", "_reset", "_worker_init_fn")


def check_restore(dl_mod, patches) -> dict:
    """install()/uninstall() must leave the iterator class exactly as it was."""
    cls = dl_mod._BaseDataLoaderIter
    patches.uninstall()
    before = _snapshot_class(cls, _PATCHED_NAMES)
    patches.install()
    during = _snapshot_class(cls, _PATCHED_NAMES)
    changed = [n for n in _PATCHED_NAMES if during[n] is not before[n]]
    patches.uninstall()
    after = _snapshot_class(cls, _PATCHED_NAMES)
    not_restored = [n for n in _PATCHED_NAMES if after[n] is not before[n]]
    # A second round trip too: install() builds fresh closures every time.
    patches.install()
    patches.uninstall()
    after2 = _snapshot_class(cls, _PATCHED_NAMES)
    not_restored += [n for n in _PATCHED_NAMES if after2[n] is not before[n] and n not in not_restored]
    return {
        "patched": changed,
        "not_restored": not_restored,
        "ok": not not_restored and set(changed) == set(_PATCHED_NAMES),
    }


def _children_cpu_ns() -> int:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return int((ru.ru_utime + ru.ru_stime) * 1e9)


def _epoch_runner(loader, n: int):
    """One full epoch, as ns per batch:

    - ``mean``: wall time of the whole epoch over n (iterator creation and the
      teardown ``StopIteration`` included): what the user waits for, and what
      preemption by other processes inflates;
    - ``median``: median interval between successive batches (the loop's whole
      cycle, ``__next__`` plus the ``for``): ignores the batches a preemption
      landed on;
    - ``cpu``: CPU time of this thread over the epoch, over n: immune to
      preemption, blind to time spent waiting (for workers, for the GIL);
    - ``workers_cpu``: CPU time of the worker processes reaped during the
      epoch (non-persistent workers are joined by the last ``__next__``).
    """
    clk = perf_counter_ns
    cpu = time.thread_time_ns
    ts = [0] * (n + 2)

    def run() -> dict:
        i = 0
        ch0 = _children_cpu_ns()
        gc.disable()
        try:
            c0 = cpu()
            ts[0] = clk()
            for _ in loader:
                i += 1
                ts[i] = clk()
            end = clk()
            c1 = cpu()
        finally:
            gc.enable()
        ch1 = _children_cpu_ns()
        if i != n:
            raise RuntimeError(f"epoch yielded {i} batches, expected {n}")
        # ts[1] - ts[0] also holds iter(): leave the first interval out.
        d = sorted(ts[k] - ts[k - 1] for k in range(2, n + 1))
        return {
            "median": d[len(d) // 2],
            "mean": (end - ts[0]) / n,
            "cpu": (c1 - c0) / n,
            "workers_cpu": (ch1 - ch0) / n,
        }

    return run


def bench_trainer(cfg, torch, patches) -> dict:
    from torch.utils.data import DataLoader, TensorDataset

    n = cfg["trainer_batches"]
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=1, num_workers=0)
    epoch = _epoch_runner(loader, n)

    def without():
        patches.uninstall()
        return epoch()

    def with_():
        patches.install()
        return epoch()

    try:
        res = ab(without, with_, cfg["trainer_rounds"], warmup=2)
    finally:
        patches.install()
    for r in res.values():
        r["batches_per_round"] = n
    return res


def bench_next(cfg, torch, dl_mod, patches):
    """The patched ``__next__`` on a real iterator whose ``_next_data`` is trivial.

    Both arms call the function object directly on the same iterator, so the
    difference is the wrapper (its extra frame included), with torch's own
    ``__next__`` (record_function, ~8 µs) in both.
    """
    from torch.utils.data import DataLoader, TensorDataset

    patches.install()
    loader = DataLoader(TensorDataset(torch.arange(8).float()), batch_size=1, num_workers=0)
    it = iter(loader)
    if "_dlw_stats" not in it.__dict__:
        raise RuntimeError("iterator not instrumented")
    it._next_data = lambda: None  # shadows the method: no sampler, no fetch
    patched = dl_mod._BaseDataLoaderIter.__dict__["__next__"]
    orig = patched._dlwatch_orig
    per, nb = cfg["next_block"], cfg["next_blocks"]
    rng = range(per)

    def run(f):
        def block():
            for _ in rng:
                f(it)

        return _blocks(block, nb, per)

    res = ab(lambda: run(orig), lambda: run(patched), cfg["next_rounds"], warmup=2)
    return res, it, loader


def _rebind(fn, inner):
    """``fn`` (a wrapper closure with exactly one free variable) around ``inner``."""
    code = fn.__code__
    if len(code.co_freevars) != 1:
        return None
    g = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, (types.CellType(inner),))
    g.__kwdefaults__ = fn.__kwdefaults__
    return g


def bench_next_wrapper(cfg, dl_mod, it) -> dict | None:
    """The wrapper's own cost: the patched ``__next__`` rebuilt around a no-op."""
    patched = dl_mod._BaseDataLoaderIter.__dict__["__next__"]

    def noop(self):
        return self

    wrapped = _rebind(patched, noop)
    if wrapped is None:
        return None
    per, nb = cfg["wrap_block"], cfg["wrap_blocks"]
    rng = range(per)

    def run(f):
        def block():
            for _ in rng:
                f(it)

        return _blocks(block, nb, per)

    return ab(lambda: run(noop), lambda: run(wrapped), cfg["wrap_rounds"], warmup=2)


def bench_clock(calls: int = 1000, blocks: int = 200) -> float:
    rng = range(calls)
    clk = perf_counter_ns

    def body():
        for _ in rng:
            clk()

    def empty():
        for _ in rng:
            pass

    t = statistics.median(_blocks(body, blocks, calls)["median"] for _ in range(3))
    e = statistics.median(_blocks(empty, blocks, calls)["median"] for _ in range(3))
    return t - e


def bench_publisher(cfg, publisher, wire) -> dict | None:
    """One publisher tick (build + encode a frame), timed on this thread."""
    pub = publisher.current()
    if pub is None:
        return None
    samples = []
    for _ in range(cfg["pub_ticks"]):
        gc.disable()
        t0 = perf_counter_ns()
        wire.encode(pub.build_frame())
        samples.append(perf_counter_ns() - t0)
        gc.enable()
    tick = statistics.median(samples)
    return {
        "tick_ns": tick,
        "interval_s": pub.interval,
        "cpu_fraction": tick / (pub.interval * 1e9),
        "loaders_in_frame": len(publisher.patches.registry.snapshot()),
        "frames_built": pub.frames_built,
        "thread_alive": bool(pub._thread is not None and pub._thread.is_alive()),
    }


# --- worker side --------------------------------------------------------------------


def _fetchers():
    from torch.utils.data._utils import fetch as F

    return F, (F._MapDatasetFetcher, F._IterableDatasetFetcher)


def bench_fetch(cfg, torch, worker):
    """In-process: ``_MapDatasetFetcher.fetch([i])`` original vs timed, as a worker runs it."""
    from torch.utils.data import TensorDataset
    from torch.utils.data._utils.collate import default_collate

    F, classes = _fetchers()
    saved = {c: c.__dict__.get("fetch") for c in classes}
    saved_row = worker._row
    slots = worker.make_slots(1)
    try:
        worker.activate(slots, 0)
        cls = F._MapDatasetFetcher
        patched = cls.__dict__["fetch"]
        orig = getattr(patched, "_dlwatch_orig", None)
        if orig is None:
            raise RuntimeError("activate() did not patch _MapDatasetFetcher.fetch")
        per, nb = cfg["fetch_block"], cfg["fetch_blocks"]
        total = per * nb
        ds = TensorDataset(torch.arange(total).float())
        fetcher = cls(ds, True, default_collate, False)
        idx = [[i] for i in range(total)]

        def run(f):
            cls.fetch = f  # the worker's own call path: fetcher.fetch(index)
            pos = iter(range(0, total, per))

            def block():
                k = next(pos)
                fetch = fetcher.fetch
                for b in idx[k : k + per]:
                    fetch(b)

            return _blocks(block, nb, per)

        res = ab(lambda: run(orig), lambda: run(patched), cfg["fetch_rounds"], warmup=2)
        view = worker.as_int64_view(slots)
        counted = int(view[worker.BATCHES])
        for r in res.values():
            r["worker_batches_counted"] = counted

        # The timed wrapper's own cost, around a no-op fetch.
        def noop(self, index):
            return index

        scratch = worker.make_slots(1)
        wrapped = worker._timed(noop, worker.as_int64_view(scratch), worker.as_float64_view(scratch), 0)
        wper, wnb = cfg["wrap_block"], cfg["wrap_blocks"]
        rng = range(wper)
        one = [0]

        def run_w(f):
            def block():
                for _ in rng:
                    f(fetcher, one)

            return _blocks(block, wnb, wper)

        wres = ab(lambda: run_w(noop), lambda: run_w(wrapped), cfg["wrap_rounds"], warmup=2)
        return res, wres
    finally:
        # Leave this process as it was: the end-to-end run forks workers that
        # must start with the original fetch unless the hook patches it.
        for c, f in saved.items():
            if f is not None:
                c.fetch = f
        worker._row = saved_row


def _identity(batch):
    return batch


def bench_worker_e2e(cfg, torch, patches, worker) -> dict:
    """2 fork workers over a cheap dataset, epoch time with vs without the hook."""
    import multiprocessing

    from torch.utils.data import DataLoader

    _, classes = _fetchers()
    for c in classes:
        if getattr(c.__dict__.get("fetch"), "_dlwatch_orig", None) is not None:
            raise RuntimeError("fetch is patched in the trainer; the 'without' arm would be timed")
    n = cfg["e2e_batches"]
    ctx = multiprocessing.get_context("fork")
    # A list of ints and no collation: per-batch work is tiny, so the hook's
    # share is as large as it gets with 2 workers.
    loader = DataLoader(
        list(range(n)), batch_size=1, num_workers=2, multiprocessing_context=ctx, collate_fn=_identity
    )
    epoch = _epoch_runner(loader, n)

    def without():
        patches.uninstall()
        return epoch()

    def with_():
        patches.install()
        return epoch()

    try:
        res = ab(without, with_, cfg["e2e_rounds"], warmup=1)
    finally:
        patches.install()
    # Did the workers really time their fetches in the 'with' arm?
    st = next(
        (s for s in patches.registry.snapshot() if s.loader_ref is not None and s.loader_ref() is loader),
        None,
    )
    counted = None
    if st is not None and st.slots_view is not None:
        counted = sum(int(st.slots_view[i * worker.NFIELDS + worker.BATCHES]) for i in range(st.num_workers))
    for r in res.values():
        r["batches_per_round"] = n
        r["worker_batches_counted_last_epoch"] = counted
    return res


# --- report ---------------------------------------------------------------------------


def _row(name, r, note=""):
    if r is None:
        return f"{name:<44} {'n/a':>9}"
    lo, hi = r["added_iqr_ns"]
    return (
        f"{name:<44} {r['without_ns']:>9.0f} {r['with_ns']:>9.0f} {r['added_ns']:>+8.0f}"
        f" {r['ratio']:>7.3f}   [{lo:+.0f}, {hi:+.0f}]{note}"
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke-test sizes (< 20 s)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 when a target of docs/ARCHITECTURE.md §4 is missed",
    )
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    t_start = time.monotonic()

    own_dir = None
    if not os.environ.get("DLWATCH_DIR"):
        # A private runtime dir: the publisher really binds and runs, but the
        # user's monitor does not list the benchmark as a job.
        own_dir = tempfile.mkdtemp(prefix="dlwatch-bench-")
        os.environ["DLWATCH_DIR"] = own_dir
    os.environ.pop("DLWATCH_DISABLE", None)

    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.utils.data.dataloader as dl_mod

    results: dict = {}
    try:
        from dlwatch.probe import patches

        restore = check_restore(dl_mod, patches)  # on pristine torch, before the hook
        import dlwatch.hook  # noqa: F401  installs, and wires the publisher
        from dlwatch import wire
        from dlwatch.probe import publisher, worker

        if not patches.installed():
            print("dlwatch hook did not install", file=sys.stderr)
            return 1
        torch.set_num_threads(1)
        results["clock_ns"] = bench_clock()
        results["trainer"] = bench_trainer(cfg, torch, patches)
        results["next_real"], it, keep = bench_next(cfg, torch, dl_mod, patches)
        results["next_wrapper"] = bench_next_wrapper(cfg, dl_mod, it)
        results["fetch"], results["fetch_wrapper"] = bench_fetch(cfg, torch, worker)
        results["worker_e2e"] = bench_worker_e2e(cfg, torch, patches, worker)
        results["publisher"] = bench_publisher(cfg, publisher, wire)
        del it, keep
    finally:
        try:
            from dlwatch.probe import publisher as _pub

            if _pub.current() is not None:
                _pub.current().close()
        except Exception:
            pass
        if own_dir:
            shutil.rmtree(own_dir, ignore_errors=True)

    tr = results["trainer"]["median"]
    trm = results["trainer"]["mean"]
    trc = results["trainer"]["cpu"]
    fe = results["fetch"]["median"]
    e2e = results["worker_e2e"]
    pubr = results["publisher"]
    if pubr is not None:
        pubr["ns_per_batch_at_trainer_rate"] = pubr["tick_ns"] * trm["with_ns"] / (pubr["interval_s"] * 1e9)

    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    env = {
        "cpu_model": cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "torch": torch.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "affinity_cpus": usable,
        "torch_threads": torch.get_num_threads(),
        "loadavg": load,
        "mode": "quick" if args.quick else "full",
        "params": cfg,
    }
    checks = {
        "install_uninstall_restores_originals": bool(restore["ok"]),
        "trainer_median_batch_added_ns_le_1000": tr["added_ns"] <= TARGET_TRAINER_ADDED_NS,
        "trainer_median_batch_ratio_le_1_03": tr["ratio"] <= TARGET_TRAINER_RATIO,
        "worker_fetch_median_added_ns_le_1000": fe["added_ns"] <= TARGET_WORKER_ADDED_NS,
    }

    print(
        f"dlwatch overhead benchmark ({env['mode']}): torch {env['torch']}, Python {env['python']}, "
        f"{env['cpu_count']} CPUs ({usable} usable), torch threads {env['torch_threads']}"
    )
    print(f"CPU: {env['cpu_model']}")
    print(
        f"{env['platform']}; load average {', '.join(f'{x:.1f}' for x in load) if load else 'n/a'}; "
        f"perf_counter_ns() ~{results['clock_ns']:.0f} ns"
    )
    print(
        "ns per batch (or per call): median over A/B-alternated rounds of each arm; added and ratio:"
        " medians of the per-round paired differences and ratios\n"
    )
    hdr = f"{'metric':<44} {'without':>9} {'with':>9} {'added':>8} {'ratio':>7}   added IQR"
    print(hdr)
    print("-" * len(hdr))
    print(_row("trainer ns/batch (bs=1, nw=0), wall mean", trm, "  (epoch / n)"))
    print(_row("trainer ns/batch (bs=1, nw=0), median batch", tr))
    print(_row("trainer ns/batch (bs=1, nw=0), CPU", trc, "  (thread CPU / n)"))
    print(_row("trainer __next__, trivial _next_data", results["next_real"]["median"]))
    nw = results["next_wrapper"]
    print(_row("trainer __next__ wrapper alone (no-op)", nw["median"] if nw else None))
    print(_row("worker fetch ns/batch (bs=1), median", fe))
    print(_row("worker fetch ns/batch (bs=1), mean", results["fetch"]["mean"]))
    print(_row("worker fetch wrapper alone (no-op)", results["fetch_wrapper"]["median"]))
    print(_row("end to end (nw=2 fork), wall mean", e2e["mean"], "  noisy"))
    print(_row("end to end (nw=2 fork), median batch", e2e["median"], "  noisy"))
    print(_row("end to end (nw=2 fork), trainer CPU", e2e["cpu"]))
    print(_row("end to end (nw=2 fork), workers CPU", e2e["workers_cpu"], "  (both workers)"))
    if pubr is not None:
        print(
            f"{'publisher tick (build + encode a frame)':<44} {'':>9} {pubr['tick_ns']:>9.0f}"
            f"   = {pubr['cpu_fraction'] * 100:.3f}% of a core at {1 / pubr['interval_s']:.0f} Hz"
            f", ~{pubr['ns_per_batch_at_trainer_rate']:.0f} ns/batch at the trainer's rate"
        )
    print()
    print("notes:")
    print(
        f"- rounds: trainer {tr['rounds']} x {cfg['trainer_batches']} batches per arm; "
        f"end to end {e2e['mean']['rounds']} x {cfg['e2e_batches']}; micro rows "
        f"{cfg['next_rounds']} x {cfg['next_blocks']} blocks. ABBA order, GC off while timing."
    )
    alive = bool(pubr and pubr["thread_alive"])
    print(
        f"- publisher thread: {'running' if alive else 'NOT running'} "
        f"({pubr['frames_built'] if pubr else 0} frames built). It started on the first"
        " instrumented iterator and kept running"
    )
    print(
        "  through both arms of every round, so its share lands in both arms (and cancels in"
        " 'added'); its own cost is the 'publisher tick' row."
    )
    print(
        "- the trainer arms switch with patches.install()/uninstall() between epochs; restore check: "
        + ("ok" if restore["ok"] else f"FAILED {restore}")
    )
    print(
        f"- end to end: the 'with' arm has the trainer hook and the workers' timed fetch; workers"
        f" counted {e2e['mean']['worker_batches_counted_last_epoch']} of {cfg['e2e_batches']}"
        " batches in the last 'with' epoch."
    )
    print(
        "  Its wall rows are dominated by scheduling (2 workers + trainer): read their IQR;"
        " the CPU rows are steadier."
    )
    print(
        "- wall mean >> median batch means other processes took the CPU during the epochs"
        " (preemption inflates the mean, not the median or the CPU rows)."
    )
    print(
        "- docs/ARCHITECTURE.md §4: trainer <= 1000 ns median added per batch, ratio <= 1.03 "
        "(both checked on the median batch row); worker <= 1000 ns (median fetch row)."
    )
    for k, v in checks.items():
        print(f"  {'PASS' if v else 'MISS'}  {k}")
    print(f"\ntotal {time.monotonic() - t_start:.1f} s")

    if args.json:
        out = {
            "env": env,
            "checks": checks,
            "restore": restore,
            "targets": {
                "trainer_added_ns": TARGET_TRAINER_ADDED_NS,
                "trainer_ratio": TARGET_TRAINER_RATIO,
                "worker_added_ns": TARGET_WORKER_ADDED_NS,
            },
            "results": results,
        }
        write_json(args.json, out)
    return 1 if args.strict and not all(checks.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
