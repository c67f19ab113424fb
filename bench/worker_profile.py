"""Worker profile bursts on the real PIL pipeline (bench/image_folder_train.py):
what a burst costs the workers, that it changes no batch, and how its stage
shares compare with cProfile of the same ``__getitem__`` in one process.

    flock /tmp/dlwatch-measure.lock .venv/bin/python bench/worker_profile.py [--rounds 4] [--seconds 4]

This process is the training job (the hook is imported, 2 persistent fork
workers, no step time: the workers are the bottleneck) and its own monitor
(``request_worker_profile`` over its own socket, from a side thread).

- **cost**: windows of ``--seconds`` with a burst (at the default rate) and
  without, alternated; per window the workers' CPU (/proc utime+stime) per
  batch. Reported: medians of each arm and the paired ratio, plus the
  sampler threads' own CPU as the workers measured it.
- **batches**: a sha256 over every batch of a fixed-seed epoch, once with a
  burst running through it and once without.
- **shares**: the buckets both tools can name (decode incl. the file reads,
  Image.convert, Image.resize, Image.transpose, Image.tobytes, the rest of
  ``__getitem__``), from the burst's stages and from cProfile's cumulative
  times over the same samples in this process; normalised without collate.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import os
import pstats
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from image_folder_train import DEFAULT_DATA, ImageFolder, make_images  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import dlwatch.hook  # noqa: E402,F401  (the job side)
from dlwatch.collect.control import request_worker_profile  # noqa: E402
from dlwatch.diagnose.worker_profile import summary_lines  # noqa: E402

BUCKETS = ("decode", "Image.convert", "Image.resize", "Image.transpose", "Image.tobytes", "rest")


def proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def loader(ds, seed: int = 0) -> DataLoader:
    return DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        generator=torch.Generator().manual_seed(seed),
    )


def run_window(it, pids, seconds: float, burst: bool) -> tuple[float, int, dict | None]:
    box: dict = {}
    t = None
    if burst:
        t = threading.Thread(
            target=lambda: box.update(doc=request_worker_profile(os.getpid(), seconds)), daemon=True
        )
        t.start()
        time.sleep(0.2)  # the request reaches the workers at their next fetch
    cpu0 = sum(proc_cpu(p) for p in pids)
    n, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        next(it)
        n += 1
    cpu = sum(proc_cpu(p) for p in pids) - cpu0
    if t is not None:
        while t.is_alive():
            next(it)  # keep the loop going until the answer is in
        t.join()
    return cpu, n, box.get("doc")


def digest(ds, burst_at: int | None) -> str:
    dl = loader(ds, seed=7)
    h = hashlib.sha256()
    th = None
    for i, (x, y) in enumerate(dl):
        if i == burst_at:
            th = threading.Thread(target=request_worker_profile, args=(os.getpid(), 2.0), daemon=True)
            th.start()
        h.update(x.numpy().tobytes())
        h.update(y.numpy().tobytes())
    if th is not None:
        th.join()
    return h.hexdigest()


def sampler_buckets(doc: dict) -> dict:
    out = dict.fromkeys(BUCKETS, 0.0)
    for s in doc["stages"]:
        name, kind = s["stage"], s["kind"]
        if kind in ("collate", "other"):
            continue
        if kind in ("decode", "read"):
            out["decode"] += s["share"]
        elif name.startswith("PIL ") and name[4:] in out:
            out[name[4:]] += s["share"]
        else:
            out["rest"] += s["share"]
    total = sum(out.values()) or 1.0
    return {k: v / total for k, v in out.items()}


def cprofile_buckets(ds, n: int) -> dict:
    prof = cProfile.Profile()
    prof.enable()
    for i in range(n):
        ds[i % len(ds)]
    prof.disable()
    st = pstats.Stats(prof).stats  # (file, line, name) -> (cc, nc, tt, ct, callers)

    def cum(name: str, file_end: str) -> float:
        return sum(v[3] for k, v in st.items() if k[2] == name and k[0].endswith(file_end))

    total = cum("__getitem__", "image_folder_train.py")
    load = cum("load", "ImageFile.py")
    got = {
        "decode": cum("open", "PIL/Image.py") + load,
        "Image.convert": cum("convert", "PIL/Image.py") - load,
        "Image.resize": cum("resize", "PIL/Image.py"),
        "Image.transpose": cum("transpose", "PIL/Image.py"),
        "Image.tobytes": cum("tobytes", "PIL/Image.py"),
    }
    got["rest"] = total - sum(got.values())
    return {k: v / total for k, v in got.items()}


CLOCKED = ("open", "load", "convert", "resize", "transpose", "tobytes", "total")


def install_clocks(add) -> list:
    """A clock around each PIL call of the pipeline (a wrapper costs ~1 µs a
    call: none of a profiler's per-call distortion): ``add(i, seconds)`` for
    CLOCKED[i]. Returns what to put back."""
    from PIL import Image, ImageFile

    owners = [Image, ImageFile.ImageFile, Image.Image, Image.Image, Image.Image, Image.Image]
    saved = [(owner, name, getattr(owner, name)) for owner, name in zip(owners, CLOCKED)]

    def clocked(orig, i):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return orig(*args, **kwargs)
            finally:
                add(i, time.perf_counter() - t0)

        return wrapper

    for i, (owner, name, orig) in enumerate(saved):
        setattr(owner, name, clocked(orig, i))
    return saved


def clocked_shares(spent: list[float]) -> dict:
    t = dict(zip(CLOCKED, spent))
    got = {
        "decode": t["open"] + t["load"],
        "Image.convert": t["convert"] - t["load"],  # every load() here runs inside convert()
        "Image.resize": t["resize"],
        "Image.transpose": t["transpose"],
        "Image.tobytes": t["tobytes"],
    }
    got["rest"] = t["total"] - sum(got.values())
    return {k: v / t["total"] for k, v in got.items()}


class Clocked(ImageFolder):
    """The same dataset; each worker adds its clocked times to a shared table."""

    def __init__(self, root: str, table) -> None:
        super().__init__(root)
        self.table = table

    def add(self, i: int, seconds: float) -> None:
        info = torch.utils.data.get_worker_info()
        k = (info.id if info else 0) * len(CLOCKED) + i
        self.table[k] += seconds

    def __getitem__(self, i: int):
        t0 = time.perf_counter()
        try:
            return super().__getitem__(i)
        finally:
            self.add(len(CLOCKED) - 1, time.perf_counter() - t0)


def timed_buckets(ds, n: int) -> dict:
    """The same samples in this one process, clocked."""
    spent = [0.0] * len(CLOCKED)

    def add(i, s):
        spent[i] += s

    saved = install_clocks(add)
    try:
        t0 = time.perf_counter()
        for i in range(n):
            ds[i % len(ds)]
        spent[-1] = time.perf_counter() - t0
    finally:
        for owner, name, orig in saved:
            setattr(owner, name, orig)
    return clocked_shares(spent)


def in_worker_comparison(seconds: float) -> tuple[dict, dict]:
    """A burst over workers that clock their own PIL calls meanwhile: the
    sampler against exact times of the same calls in the same processes."""
    from multiprocessing.sharedctypes import RawArray

    table = RawArray("d", 2 * len(CLOCKED))
    ds = Clocked(DEFAULT_DATA, table)
    dl = DataLoader(
        ds,
        batch_size=16,
        shuffle=True,
        num_workers=2,
        persistent_workers=True,
        worker_init_fn=lambda _wid: install_clocks(ds.add),
    )

    def endless():
        while True:
            yield from dl

    it = endless()
    for _ in range(10):
        next(it)
    for k in range(len(table)):
        table[k] = 0.0
    _cpu, _n, doc = run_window(it, [w.pid for w in dl._iterator._workers], seconds, True)
    n = len(CLOCKED)
    spent = [table[i] + table[n + i] for i in range(n)]
    return sampler_buckets(doc), clocked_shares(spent)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=4.0)
    a = p.parse_args()
    make_images(DEFAULT_DATA)
    torch.set_num_threads(1)
    ds = ImageFolder(DEFAULT_DATA)

    dl = loader(ds)
    it = iter(dl)
    for _ in range(20):
        next(it)  # warm up (and start the publisher)
    pids = [w.pid for w in dl._iterator._workers]

    def endless():
        while True:
            yield from dl

    it = endless()
    per_batch = {False: [], True: []}
    ratios, sampler_cpu, last, samples = [], [], None, []
    for r in range(a.rounds):
        pair = {}
        for burst in (False, True) if r % 2 == 0 else (True, False):
            cpu, n, doc = run_window(it, pids, a.seconds, burst)
            pair[burst] = cpu / n
            per_batch[burst].append(cpu / n)
            if doc is not None:
                last = doc
                samples.append(doc["samples"])
                sampler_cpu += [w["sampler_cpu_percent"] for w in doc["workers"] if w["sampler_cpu_percent"]]
        ratios.append(pair[True] / pair[False])
    off, on = statistics.median(per_batch[False]), statistics.median(per_batch[True])
    print(f"workers' CPU per batch of 16, median of {a.rounds} windows of {a.seconds:g} s each arm")
    print(f"  without a burst {off * 1e3:8.1f} ms")
    print(f"  with a burst    {on * 1e3:8.1f} ms   paired ratio median {statistics.median(ratios):.3f}")
    print(f"  per-round ratios {', '.join(f'{x:.3f}' for x in ratios)}")
    print(f"  sampler threads' own CPU: median {statistics.median(sampler_cpu):.2f} % of a core per worker")
    print(f"  samples inside fetches per burst: {samples}")
    same = digest(ds, burst_at=3) == digest(ds, burst_at=None)
    print(f"batches with a burst through the epoch vs without: {'identical' if same else 'DIFFERENT'}")

    timed = timed_buckets(ds, 300)
    prof = cprofile_buckets(ds, 300)
    ours = sampler_buckets(last)
    print("\nstage shares of __getitem__ (collate left out): the worker profile, and the same samples in")
    print("this one process clocked around each PIL call and under cProfile (points of difference)")
    print(f"  {'stage':<16} {'workers':>8} {'clocked':>8} {'diff':>6} {'cProfile':>9} {'diff':>6}")
    for k in BUCKETS:
        print(
            f"  {k:<16} {ours[k]:8.1%} {timed[k]:8.1%} {100 * (ours[k] - timed[k]):+6.1f} "
            f"{prof[k]:9.1%} {100 * (ours[k] - prof[k]):+6.1f}"
        )
    ours, clocked = in_worker_comparison(a.seconds)
    print("\nthe same, a burst over workers that clock their own PIL calls at the same time")
    print(f"  {'stage':<16} {'workers':>8} {'clocked':>8} {'diff':>6}")
    for k in BUCKETS:
        print(f"  {k:<16} {ours[k]:8.1%} {clocked[k]:8.1%} {100 * (ours[k] - clocked[k]):+6.1f}")
    print("\nthe last burst, as `dlwatch profile --workers` prints it:")
    print("\n".join(summary_lines(last)))


if __name__ == "__main__":
    main()
