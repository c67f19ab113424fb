#!/usr/bin/env python
"""Where the probe's hot-path nanoseconds go: one shape of the wrapper per row.

    python bench/hotpath_variants.py [--quick] [--json PATH] [--only trainer|worker]

Every variant is a complete wrapper source (compiled here into its own module
namespace, so globals vs closure cells are what they would be in the probe),
timed against the unwrapped original with the A/B machinery of overhead.py
(ABBA rounds, medians of paired differences, GC off). Two contexts per side:

- trainer *alone*: the wrapper around a no-op ``__next__``, 1000 calls a block;
  trainer *epoch*: the wrapper set as ``_BaseDataLoaderIter.__next__`` over a
  bare ``DataLoader(TensorDataset, batch_size=1, num_workers=0)``, median
  interval between batches of 2000-batch epochs (overhead.py's target row);
- worker *alone*: the fetch wrapper around a no-op fetch; worker *fetch*:
  ``_MapDatasetFetcher.fetch([i])`` (TensorDataset + default_collate) with the
  class's ``fetch`` set to the variant, blocks of 50.

"shipped" rows time the probe's own code (``patches._wrap_next``,
``worker._timed``); "(probe before issue 16)" rows are the shapes it had before;
"floor" and "2 clock reads" rows keep only the clock reads, to show what is
left to win. Rows marked "unsafe" drop a
guarantee and are here to price it, not to be used.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sys
import textwrap
from time import perf_counter_ns

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import overhead  # noqa: E402  (bench/overhead.py: ab(), _blocks(), cpu_model())
from common import write_json  # noqa: E402

# --- trainer-side variants -----------------------------------------------------------
# Each source defines make(orig) -> __next__. The stats object is whatever
# STATS builds (a LoaderStats-like slots object unless the variant says so).

T_COMMON = """
from time import perf_counter_ns as _clock
"""

TRAINER = {
    "shipped: dlwatch.probe.patches._wrap_next": None,
    "frame only: return orig(self)": """
def make(orig):
    def __next__(self):
        return orig(self)
    return __next__
""",
    "2 clock reads, nothing kept": """
def make(orig):
    def __next__(self):
        _clock()
        data = orig(self)
        _clock()
        return data
    return __next__
""",
    "floor: stats read + 2 clocks + 1 add": """
def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        data = orig(self)
        st.wait_ns += _clock() - t0
        return data
    return __next__
""",
    "before: closure, try/except, slots (probe before issue 16)": """
def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        try:
            data = orig(self)
        except StopIteration:
            st.end_epoch(t0, _clock())
            raise
        except BaseException:
            st.t_enter = 0
            raise
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        if last:
            st.step_ns += t0 - last
        st.t_last = t1
        st.batches += 1
        if st.first_pending:
            st.first_batch(t1)
        return data
    return __next__
""",
    "unsafe: no try (exceptions unaccounted)": """
def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        data = orig(self)
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        if last:
            st.step_ns += t0 - last
        st.t_last = t1
        st.batches += 1
        if st.first_pending:
            st.first_batch(t1)
        return data
    return __next__
""",
    "try/finally shape": """
def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        ok = False
        try:
            data = orig(self)
            ok = True
        finally:
            if not ok:
                st.t_enter = 0
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        if last:
            st.step_ns += t0 - last
        st.t_last = t1
        st.batches += 1
        if st.first_pending:
            st.first_batch(t1)
        return data
    return __next__
""",
    "globals: orig and clock as module globals": """
def make(orig):
    global _orig
    _orig = orig
    return __next__

def __next__(self):
    st = self._dlw_stats
    if st is None:
        return _orig(self)
    t0 = _clock()
    st.t_enter = t0
    try:
        data = _orig(self)
    except StopIteration:
        st.end_epoch(t0, _clock())
        raise
    except BaseException:
        st.t_enter = 0
        raise
    t1 = _clock()
    st.wait_ns += t1 - t0
    last = st.t_last
    if last:
        st.step_ns += t0 - last
    st.t_last = t1
    st.batches += 1
    if st.first_pending:
        st.first_batch(t1)
    return data
""",
    "clock as a default argument (LOAD_FAST)": """
def make(orig):
    def __next__(self, _clock=_clock):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        try:
            data = orig(self)
        except StopIteration:
            st.end_epoch(t0, _clock())
            raise
        except BaseException:
            st.t_enter = 0
            raise
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        if last:
            st.step_ns += t0 - last
        st.t_last = t1
        st.batches += 1
        if st.first_pending:
            st.first_batch(t1)
        return data
    return __next__
""",
    "counters in a preallocated list": """
T_ENTER, T_LAST, WAIT, STEP, BATCHES, FIRST = range(6)

def make(orig):
    def __next__(self):
        c = self._dlw_stats
        if c is None:
            return orig(self)
        t0 = _clock()
        c[0] = t0
        try:
            data = orig(self)
        except StopIteration:
            c[0] = 0
            raise
        except BaseException:
            c[0] = 0
            raise
        t1 = _clock()
        c[2] += t1 - t0
        last = c[1]
        if last:
            c[3] += t0 - last
        c[1] = t1
        c[4] += 1
        if c[5]:
            c[5] = 0
        return data
    return __next__
""",
    "one attribute fewer: first batch via t_last == 0": """
def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        try:
            data = orig(self)
        except StopIteration:
            st.end_epoch(t0, _clock())
            raise
        except BaseException:
            st.t_enter = 0
            raise
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        st.t_last = t1
        st.batches += 1
        if last:
            st.step_ns += t0 - last
        else:
            st.after_gap(t1)
        return data
    return __next__
""",
    "float seconds (perf_counter), else as above": """
from time import perf_counter as _clock

def make(orig):
    def __next__(self):
        st = self._dlw_stats
        if st is None:
            return orig(self)
        t0 = _clock()
        st.t_enter = t0
        try:
            data = orig(self)
        except StopIteration:
            st.end_epoch(t0, _clock())
            raise
        except BaseException:
            st.t_enter = 0
            raise
        t1 = _clock()
        st.wait_ns += t1 - t0
        last = st.t_last
        st.t_last = t1
        st.batches += 1
        if last:
            st.step_ns += t0 - last
        else:
            st.after_gap(t1)
        return data
    return __next__
""",
}


class _Stats:
    """The hot path's fields of LoaderStats, with __slots__ as the probe's."""

    __slots__ = (
        "t_enter",
        "t_last",
        "wait_ns",
        "step_ns",
        "batches",
        "first_pending",
        "teardown_ns",
        "epoch_t0",
        "wait_s",
        "step_s",
    )

    def __init__(self) -> None:
        self.t_enter = self.t_last = self.wait_ns = self.step_ns = self.batches = 0
        self.teardown_ns = self.epoch_t0 = 0
        self.wait_s = self.step_s = 0.0
        self.first_pending = False

    def end_epoch(self, t0, t1) -> None:
        self.teardown_ns += t1 - t0
        self.t_last = self.t_enter = 0

    def first_batch(self, t1) -> None:
        self.first_pending = False

    def after_gap(self, t1) -> None:
        pass


def _stats_for(name: str):
    if "list" in name:
        return lambda: [0, 0, 0, 0, 0, 0]
    return _Stats


# --- worker-side variants ---------------------------------------------------------------
# Each source defines make(orig, row, base) -> fetch; row is the int64 view
# of a one-worker table (or the ctypes array itself, for that variant).

WORKER = {
    "shipped: dlwatch.probe.worker._timed": None,
    "frame only: return orig(self, index)": """
def make(orig, row, base):
    def fetch(self, possibly_batched_index):
        return orig(self, possibly_batched_index)
    return fetch
""",
    "2 clock reads, nothing kept": """
def make(orig, row, base):
    def fetch(self, possibly_batched_index):
        _clock()
        data = orig(self, possibly_batched_index)
        _clock()
        return data
    return fetch
""",
    "floor: 2 clocks + 1 shared store": """
def make(orig, row, base):
    def fetch(self, possibly_batched_index):
        t0 = _clock()
        data = orig(self, possibly_batched_index)
        row[2] = _clock() - t0
        return data
    return fetch
""",
    "before: globals, 4 stores + 2 reads (probe before issue 16)": """
def make(orig, row, base):
    global _row, _i_batches, _i_fetch, _i_cur
    _row, _i_batches, _i_fetch, _i_cur = row, base + 1, base + 2, base + 3
    def fetch(self, possibly_batched_index):
        row = _row
        if row is None:
            return orig(self, possibly_batched_index)
        cur = _i_cur
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            row[_i_fetch] += _clock() - t0
            row[cur] = 0
            raise
        row[_i_fetch] += _clock() - t0
        row[cur] = 0
        row[_i_batches] += 1
        return data
    return fetch
""",
    "running totals in a list, 4 shared stores": """
def make(orig, row, base):
    global _row, _i_batches, _i_fetch, _i_cur, _acc
    _row, _i_batches, _i_fetch, _i_cur = row, base + 1, base + 2, base + 3
    _acc = [0, 0]
    def fetch(self, possibly_batched_index):
        row = _row
        if row is None:
            return orig(self, possibly_batched_index)
        cur = _i_cur
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            acc = _acc
            acc[0] += _clock() - t0
            row[_i_fetch] = acc[0]
            row[cur] = 0
            raise
        acc = _acc
        acc[0] += _clock() - t0
        acc[1] += 1
        row[_i_fetch] = acc[0]
        row[_i_batches] = acc[1]
        row[cur] = 0
        return data
    return fetch
""",
    "closure: row and indices in cells": """
def make(orig, row, base):
    i_batches, i_fetch, cur = base + 1, base + 2, base + 3
    def fetch(self, possibly_batched_index):
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            row[i_fetch] += _clock() - t0
            row[cur] = 0
            raise
        row[i_fetch] += _clock() - t0
        row[cur] = 0
        row[i_batches] += 1
        return data
    return fetch
""",
    "running totals in cells (nonlocal), 4 stores": """
def make(orig, row, base):
    i_batches, i_fetch, cur = base + 1, base + 2, base + 3
    busy = batches = 0
    def fetch(self, possibly_batched_index):
        nonlocal busy, batches
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            busy += _clock() - t0
            row[i_fetch] = busy
            row[cur] = 0
            raise
        busy += _clock() - t0
        batches += 1
        row[i_fetch] = busy
        row[i_batches] = batches
        row[cur] = 0
        return data
    return fetch
""",
    "as above, float seconds in a double row": """
from time import perf_counter as _clock

def make(orig, row, base):
    row = row.cast("B").cast("d")
    i_batches, i_fetch, cur = base + 1, base + 2, base + 3
    busy = 0.0
    batches = 0
    def fetch(self, possibly_batched_index):
        nonlocal busy, batches
        t0 = _clock()
        row[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            busy += _clock() - t0
            row[i_fetch] = busy
            row[cur] = 0.0
            raise
        busy += _clock() - t0
        batches += 1
        row[i_fetch] = busy
        row[i_batches] = batches
        row[cur] = 0.0
        return data
    return fetch
""",
    "ctypes array instead of memoryview": """
def make(orig, row, base):
    arr = row.obj  # the RawArray behind the view
    i_batches, i_fetch, cur = base + 1, base + 2, base + 3
    def fetch(self, possibly_batched_index):
        t0 = _clock()
        arr[cur] = t0
        try:
            data = orig(self, possibly_batched_index)
        except BaseException:
            arr[i_fetch] += _clock() - t0
            arr[cur] = 0
            raise
        arr[i_fetch] += _clock() - t0
        arr[cur] = 0
        arr[i_batches] += 1
        return data
    return fetch
""",
}


def _compile(src: str, name: str) -> dict:
    ns = {"__name__": f"hotpath_variant_{abs(hash(name))}"}
    exec(compile(textwrap.dedent(T_COMMON + src), f"<variant {name}>", "exec"), ns)
    return ns


# --- contexts --------------------------------------------------------------------------


def _alone(fn, noop, arg_maker, cfg) -> dict:
    per, nb = cfg["block"], cfg["blocks"]
    rng = range(per)
    args = arg_maker()

    def run(f):
        def block():
            for _ in rng:
                f(*args)

        return overhead._blocks(block, nb, per)

    return overhead.ab(lambda: run(noop), lambda: run(fn), cfg["rounds"], warmup=2)["median"]


def trainer_rows(cfg, torch, dl_mod) -> list[dict]:
    from torch.utils.data import DataLoader, TensorDataset

    cls = dl_mod._BaseDataLoaderIter
    orig = cls.__dict__["__next__"]
    n = cfg["epoch_batches"]
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=1, num_workers=0)
    clk = perf_counter_ns
    ts = [0] * (n + 2)

    def epoch(fn, stats):
        def run():
            cls.__next__ = fn
            it = iter(loader)
            if stats is not None:
                it._dlw_stats = stats()
            i = 0
            gc.disable()
            try:
                ts[0] = clk()
                for _ in it:
                    i += 1
                    ts[i] = clk()
            finally:
                gc.enable()
            d = sorted(ts[k] - ts[k - 1] for k in range(2, n + 1))
            return {"median": d[len(d) // 2]}

        return run

    class _It:
        __slots__ = ("_dlw_stats",)

    def noop(self):
        return self

    rows = []
    had_default = "_dlw_stats" in cls.__dict__
    cls._dlw_stats = None  # the probe's class default
    try:
        from dlwatch.probe import patches

        for _ in range(5):  # the first rows must not pay for the process's warm-up
            epoch(orig, None)()
        for name, src in TRAINER.items():
            make = patches._wrap_next if src is None else _compile(src, name)["make"]
            stats = _stats_for(name)
            it = _It()
            it._dlw_stats = stats()
            alone = _alone(make(noop), noop, lambda it=it: (it,), cfg)
            fn = make(orig)
            ep = overhead.ab(epoch(orig, None), epoch(fn, stats), cfg["epoch_rounds"], warmup=2)["median"]
            rows.append({"variant": name, "alone": alone, "epoch": ep})
            print(_line(name, alone, ep), flush=True)
    finally:
        cls.__next__ = orig
        if not had_default:
            del cls._dlw_stats
    return rows


def worker_rows(cfg, torch) -> list[dict]:
    from multiprocessing.sharedctypes import RawArray

    from torch.utils.data import TensorDataset
    from torch.utils.data._utils import fetch as F
    from torch.utils.data._utils.collate import default_collate

    from dlwatch.probe import worker

    cls = F._MapDatasetFetcher
    orig = cls.__dict__["fetch"]
    per, nb = cfg["fetch_block"], cfg["fetch_blocks"]
    total = per * nb
    fetcher = cls(TensorDataset(torch.arange(total).float()), True, default_collate, False)
    idx = [[i] for i in range(total)]

    def fetch_run(f):
        def run():
            cls.fetch = f
            pos = iter(range(0, total, per))

            def block():
                k = next(pos)
                fetch = fetcher.fetch
                for b in idx[k : k + per]:
                    fetch(b)

            return overhead._blocks(block, nb, per)

        return run

    def noop(self, index):
        return index

    rows = []
    try:
        for name, src in WORKER.items():
            table = RawArray("q", worker.NFIELDS)
            view = _View(worker.as_int64_view(table))
            if src is None:

                def make(o, v, base, _t=table):
                    return worker._timed(o, v, worker.as_float64_view(_t), base)
            else:
                make = _compile(src, name)["make"]
            alone = _alone(make(noop, view.v, 0), noop, lambda: (fetcher, [0]), cfg)
            fn = make(orig, view.v, 0)
            real = overhead.ab(fetch_run(orig), fetch_run(fn), cfg["fetch_rounds"], warmup=2)["median"]
            rows.append({"variant": name, "alone": alone, "epoch": real})
            print(_line(name, alone, real), flush=True)
    finally:
        cls.fetch = orig
    return rows


class _View:
    """The int64 view of a one-worker table, keeping its RawArray reachable
    (the ctypes variant writes through the array itself)."""

    def __init__(self, view) -> None:
        self.v = view


def _line(name, alone, ctx) -> str:
    return (
        f"{name:<60} {alone['added_ns']:>+7.0f} [{alone['added_iqr_ns'][0]:+.0f}, "
        f"{alone['added_iqr_ns'][1]:+.0f}]   {ctx['added_ns']:>+7.0f} "
        f"[{ctx['added_iqr_ns'][0]:+.0f}, {ctx['added_iqr_ns'][1]:+.0f}]  {ctx['ratio']:.3f}"
    )


FULL = dict(
    rounds=20,
    blocks=20,
    block=1000,
    epoch_rounds=30,
    epoch_batches=2000,
    fetch_rounds=30,
    fetch_blocks=40,
    fetch_block=50,
)
QUICK = dict(
    rounds=6,
    blocks=10,
    block=1000,
    epoch_rounds=8,
    epoch_batches=1000,
    fetch_rounds=8,
    fetch_blocks=20,
    fetch_block=50,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", metavar="PATH")
    ap.add_argument("--only", choices=("trainer", "worker"))
    args = ap.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    os.environ["DLWATCH_DISABLE"] = "1"
    import warnings

    warnings.filterwarnings("ignore", message="Failed to initialize NumPy")
    import torch
    import torch.utils.data.dataloader as dl_mod

    torch.set_num_threads(1)
    load = os.getloadavg()
    print(
        f"hot-path variants ({'quick' if args.quick else 'full'}): {overhead.cpu_model()}, "
        f"Python {platform.python_version()}, torch {torch.__version__}; "
        f"load average {', '.join(f'{x:.1f}' for x in load)}; perf_counter_ns() "
        f"~{overhead.bench_clock():.0f} ns"
    )
    print(
        "added ns per call: median of A/B paired differences vs the unwrapped original "
        "[IQR]; ratio in the real context\n"
    )
    hdr = f"{'variant':<60} {'alone (no-op inner)':>20}   {'real context':>19}  ratio"
    out = {
        "env": {
            "cpu": overhead.cpu_model(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "loadavg": load,
            "params": cfg,
        }
    }
    if args.only in (None, "trainer"):
        print("TRAINER __next__ (real context: median batch of a bare DataLoader epoch)")
        print(hdr)
        out["trainer"] = trainer_rows(cfg, torch, dl_mod)
        print()
    if args.only in (None, "worker"):
        print("WORKER fetch (real context: _MapDatasetFetcher.fetch([i]), TensorDataset + collate)")
        print(hdr)
        out["worker"] = worker_rows(cfg, torch)
    if args.json:
        write_json(args.json, out, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
