"""Autotune: ``num_workers`` and ``prefetch_factor`` changed between epochs of
the real run (``dlwatch run --autotune``, or ``DLWATCH_AUTOTUNE=1`` with
``import dlwatch.hook``). Opt-in; without the variable nothing here runs.

Each epoch of a map-style loader is one trial of ``dlwatch tune``'s search
(``dlwatch.search``): the first is the script's own setting, the next ones
follow its diagnosis (Little's law, capped at the usable cores when the
workers are CPU-bound, past them when they sleep on I/O), a change that made
the epoch slower is left for the best one, the leaders are measured twice, and
once the search has converged the loader keeps the recommendation (the fewest
workers within noise of the fastest) for the rest of the run.

What the model sees never changes: the sampler's order is drawn from the same
random state as without autotune (a replaced persistent iterator draws its
worker base seed from a private generator, so the sampler's draw is the one it
would have been), a loader whose order or sharding depends on the number of
workers (an iterable dataset; a ``worker_init_fn``, which may read it) is left
alone with the reason, and a change that would not fit in memory is not made.

The decision runs in ``DataLoader.__iter__`` (once an epoch, never per batch)
and never raises into the job: on any failure the loader keeps its setting.
"""

from __future__ import annotations

import atexit
import os
import resource
import sys
import threading
import time
import weakref
from typing import Any

from dlwatch import search
from dlwatch.probe import postimport
from dlwatch.probe import worker as _worker

ENV_VAR = "DLWATCH_AUTOTUNE"
TARGET_MODULE = "torch.utils.data.dataloader"
# An epoch shorter than this says too little about a setting: the next one is
# measured too, with the same setting (the two are pooled).
MIN_EPOCH_BATCHES = 20
MIN_EPOCH_S = 1.0
# Memory: added workers must fit in this share of what the box has available.
MEM_SHARE = 0.5
# /dev/shm carries the prefetched batches of every worker.
SHM_MIN_FREE_PER_WORKER = 64 << 20
HISTORY = 32
# The DataLoader method that warns "This DataLoader will create N worker
# processes ..." when the workers outnumber the cores.
RATIONALITY_CHECK = "check_worker_number_rationality"
_UNSET = object()


def _no_check() -> None:
    return None


# persistent_workers cannot change after DataLoader.__init__ (torch refuses),
# and pinned batches are a property of what the model receives.
AUTOTUNE_KNOBS = ("num_workers", "prefetch_factor")

_tuners: dict[int, LoaderTuner] = {}
_lock = threading.Lock()
_orig_iter = None
_finder = None
_report_registered = False


def enabled(environ=os.environ) -> bool:
    if environ.get(ENV_VAR, "").strip().lower() not in ("1", "true", "yes", "on"):
        return False
    # A tune trial measures fixed settings: autotune would move them.
    return not environ.get("DLWATCH_OVERRIDES")


def install() -> None:
    """Patch ``DataLoader.__iter__`` now, or when torch's dataloader is imported."""
    global _finder
    _finder = postimport.now_or_on_import(TARGET_MODULE, "DataLoader", _patch, _finder)


def _patch(mod) -> None:
    global _orig_iter
    cls = getattr(mod, "DataLoader", None)
    if cls is None or _orig_iter is not None:
        return
    orig = cls.__iter__
    _orig_iter = orig

    def __iter__(self):
        try:
            changed = before_epoch(self)
        except Exception:
            changed = False
        if not changed:
            return orig(self)
        # torch warns when workers outnumber the cores; past them is autotune's
        # own measured choice for I/O-bound loading, not the script's. Its
        # check is skipped for this loader's new iterator alone (an instance
        # attribute over torch's method while it is made): catching the
        # warning would swap the process's filters, which shows every
        # once-shown warning again after it (a fork warning per epoch under
        # Python 3.12) and races with other threads' filters.
        own = self.__dict__
        had = own.get(RATIONALITY_CHECK, _UNSET)
        own[RATIONALITY_CHECK] = _no_check
        try:
            return orig(self)
        finally:
            if had is _UNSET:
                own.pop(RATIONALITY_CHECK, None)
            else:
                own[RATIONALITY_CHECK] = had

    __iter__.__doc__ = orig.__doc__
    __iter__._dlwatch_orig = orig  # type: ignore[attr-defined]  # what uninstall restores
    cls.__iter__ = __iter__


def uninstall() -> None:
    global _orig_iter, _finder
    postimport.disarm(_finder)
    _finder = None
    mod = sys.modules.get(TARGET_MODULE)
    if mod is not None and _orig_iter is not None:
        mod.DataLoader.__iter__ = _orig_iter
    _orig_iter = None
    _tuners.clear()


def before_epoch(loader) -> bool:
    """Measure the epoch that ended and decide the next one's setting; True
    when the loader runs a setting autotune chose."""
    if _in_worker_process():
        return False
    with _lock:
        t = _tuners.get(id(loader))
        if t is None or t.loader_ref() is not loader:
            t = LoaderTuner(loader)
            _tuners[id(loader)] = t
            _register_report()
    t.before_epoch(loader)
    return bool(t.config)


def tuner_of(loader) -> LoaderTuner | None:
    t = _tuners.get(id(loader))
    return t if t is not None and t.loader_ref() is loader else None


class LoaderTuner:
    def __init__(self, loader) -> None:
        self.loader_ref = weakref.ref(loader)
        self.state = "measuring"
        self.reason = ""
        self.trials: list[dict] = []
        self.history: list[dict] = []
        self.base: dict = _settings(loader)
        self.config: dict = {}  # what autotune changed, as tune's overrides
        self.best: dict | None = None
        self.epochs = 0
        self.dataset = type(getattr(loader, "dataset", None)).__name__
        self._mark: dict | None = None
        # The loop's first step (cudnn benchmark, torch.compile, AMP set-up can
        # make it seconds): timed once, left out of the first epoch's figures.
        self.first_step_s: float | None = None
        why = _left_alone(loader)
        if why:
            self.state, self.reason = "left alone", why

    # --- the decision, once an epoch ---------------------------------------------

    def before_epoch(self, loader) -> None:
        self.epochs += 1
        st = _stats_of(loader)
        if st is None:
            return  # the first epoch: its iterator (and its counters) come next
        if self.state != "left alone" and getattr(st, "batch_on_device", False):
            # Known from the first batch: no epoch needs measuring to see it
            # (a short first epoch is pooled with the next, and a decision
            # made after measuring waited for it). Another worker count would
            # put CUDA in a forked worker, which fails inside the training
            # loop ("CUDA error: initialization error").
            self.state = "left alone"
            self.reason = "its batches come out already on the GPU: worker processes cannot make them"
        if self.state == "left alone":
            self._publish(st)
            return
        now = time.perf_counter()
        figures = self._measure(st, loader, now)
        if figures is not None and _short(figures):
            # Too short to judge a setting: the next epoch (same setting) is
            # measured together with this one.
            self._pool(st, figures, now)
            self._publish(st)
            return
        if figures is not None:
            self._record(figures, loader)
        if self.state not in ("converged", "left alone"):
            self._decide(loader, st)
        self.mark(st, now)
        self._publish(st)

    def _measure(self, st: Any, loader: Any, now: float) -> dict | None:
        """The figures since the mark: the epoch that just ended, and any
        short ones before it."""
        mark = self._mark
        if mark is None or st is None or mark["stats"] is not st:
            return None
        cur = _counters(st, now)
        batches = cur["batches"] - mark["batches"]
        seconds = now - mark["t"]
        start_ms = st.epoch_start_ms[-1] if st.epoch_start_ms else None
        first_step = self.first_step_s if mark.get("first_epoch") else None
        if first_step is not None and batches > 2 and seconds > first_step:
            # A first step of seconds is no setting's pace: one batch and its step fewer.
            seconds -= first_step
            batches -= 1
        acc = mark.get("acc", {})
        start_s = start_ms / 1e3 if start_ms is not None else 0.0
        # Each epoch's start (its iterator to its first batch: workers
        # starting) is a stall more workers do not shorten; epochs pooled with
        # this one had theirs too (the job's first epoch, pooled for its first
        # step, starts the slowest).
        stall_s = acc.get("stall_s", 0.0) + start_s
        skip_s, skip_n = acc.get("skip_s", 0.0), acc.get("skip_n", 0)
        if getattr(loader, "persistent_workers", False) and start_ms is not None:
            # Persistent workers start once in a real run, not once an epoch:
            # a setting is judged from each epoch's first batch on.
            skip_s, skip_n = skip_s + start_s, skip_n + 1
            if batches > skip_n:
                seconds -= skip_s
                batches -= skip_n
        if batches <= 0 or seconds <= 0:
            return None
        # A persistent iterator's worker counters run on across epochs; a new
        # iterator's start from zero.
        same_iter = mark["iter"] is not None and mark["iter"] is cur["iter"]
        return {
            "batches": batches,
            "seconds": seconds,
            "wait_s": cur["wait_s"] - mark["wait_s"],
            "step_s": cur["step_s"] - mark["step_s"] - (first_step or 0.0),
            "worker_fetch_s": acc.get("fetch_s", 0.0)
            + cur["fetch_s"]
            - (mark["fetch_s"] if same_iter else 0.0),
            "worker_batches": acc.get("wbatches", 0)
            + cur["wbatches"]
            - (mark["wbatches"] if same_iter else 0),
            "worker_busy_s": acc.get("busy_s", 0.0) + cur["busy_s"] - (mark["busy_s"] if same_iter else 0.0),
            "worker_cpu_s": cur["cpu_s"] - mark["cpu_s"],
            "epoch_start_ms": start_ms,
            "stall_s": stall_s,
            "skip_s": skip_s,
            "skip_n": skip_n,
        }

    def _pool(self, st, figures: dict, now: float) -> None:
        """Keep the mark's loop counters and clock; carry the workers' (the
        next epoch may have a new iterator whose counters start at zero)."""
        cur = _counters(st, now)
        mark = self._mark
        assert mark is not None
        mark["acc"] = {
            "fetch_s": figures["worker_fetch_s"],
            "wbatches": figures["worker_batches"],
            "busy_s": figures["worker_busy_s"],
            "stall_s": figures["stall_s"],
            "skip_s": figures["skip_s"],
            "skip_n": figures["skip_n"],
        }
        for k in ("iter", "fetch_s", "wbatches", "busy_s"):
            mark[k] = cur[k]

    def _record(self, f: dict, loader) -> None:
        nw = int(getattr(loader, "num_workers", 0) or 0)
        rate = f["batches"] / f["seconds"]
        # Whether the loop waits is judged past the epochs' starts (workers
        # starting up): more workers do not shorten those stalls. The pace keeps them.
        wait = max(0.0, f["wait_s"] - f["stall_s"])
        loop = wait + f["step_s"]
        trial = {
            "status": "ok",
            "config": dict(self.config),
            "settings": _settings(loader),
            "batches_per_s": rate,
            "data_wait_fraction": wait / loop if loop > 0 else None,
            "step_ms_mean": f["step_s"] / f["batches"] * 1e3,
            "wait_ms_mean": f["wait_s"] / f["batches"] * 1e3,
            "worker_ms_per_batch": f["worker_fetch_s"] / f["worker_batches"] * 1e3
            if f["worker_batches"] and nw
            else None,
            "worker_cpu_share_of_busy": min(1.0, f["worker_cpu_s"] / f["worker_busy_s"])
            if nw and f["worker_busy_s"] > 0 and f["worker_cpu_s"] is not None
            else None,
            "usable_cores": usable_cores(),
            "epoch_start_ms": f["epoch_start_ms"],
            "epoch_ms": f["seconds"] * 1e3,
            "steady_s": f["seconds"],
        }
        self.trials.append(trial)
        if len(self.history) and self.history[-1].get("batches_per_s") is None:
            self.history[-1]["batches_per_s"] = round(rate, 3)

    def _decide(self, loader, st) -> None:
        measured = [t for t in self.trials if t["status"] == "ok"]
        if not measured:
            return  # a short first epoch: measure the next one too
        # Settings not made (memory) count as tried.
        config, why = search.propose(self.trials, search.Options(knobs=AUTOTUNE_KNOBS))
        if config is None:
            best = search.choose(measured)
            self.state, self.reason = "converged", why
            if best is not None:
                self.best = dict(best.config)
                self._apply(loader, st, dict(best.config), f"converged: {why}")
            return
        if config == self.config:
            return
        problem = self._does_not_fit(loader, config)
        if problem:
            # Not made: the search takes it as tried and moves on next epoch.
            self.trials.append({"status": "not made", "config": config, "reason": problem})
            self.history.append(_event(self.epochs, self.config, config, f"not made: {problem}"))
            return
        self.state = "searching"
        self._apply(loader, st, config, why)

    def _apply(self, loader, st, config: dict, why: str) -> None:
        before = _settings(loader)
        target = search.apply(self.base, config, cuda=False)
        if search.settings_key(target) == search.settings_key(before):
            self.config = dict(config)
            return
        persistent = getattr(loader, "_iterator", None) is not None
        if persistent:
            _retire_iterator(loader)
        loader.num_workers = int(target.get("num_workers") or 0)
        if loader.num_workers > 0:
            loader.prefetch_factor = target.get("prefetch_factor") or 2
        else:
            loader.prefetch_factor = None
        self.config = dict(config)
        ev = _event(self.epochs, before, _settings(loader), why)
        self.history.append(ev)
        del self.history[:-HISTORY]

    def _does_not_fit(self, loader, config: dict) -> str | None:
        cur = int(getattr(loader, "num_workers", 0) or 0)
        new = int(config.get("num_workers", cur) or 0)
        if new <= cur:
            return None
        per_worker = _worker_memory_bytes(loader)
        avail = _mem_available()
        if per_worker and avail is not None and (new - cur) * per_worker > MEM_SHARE * avail:
            return (
                f"{new - cur} more workers of ~{per_worker >> 20} MiB each would exceed "
                f"{MEM_SHARE:.0%} of the {avail >> 20} MiB available"
            )
        shm = _shm_free()
        if shm is not None and shm < new * SHM_MIN_FREE_PER_WORKER:
            return f"/dev/shm has {shm >> 20} MiB free, under {SHM_MIN_FREE_PER_WORKER >> 20} MiB a worker"
        return None

    def mark(self, st, t: float) -> None:
        """The counters at the start of an epoch (its clock ``t``)."""
        c = _counters(st, time.perf_counter())
        c["stats"] = st
        c["t"] = t
        self._mark = c

    # --- what the snapshot and the exit line show ----------------------------------

    def describe(self) -> dict:
        loader = self.loader_ref()
        current = _settings(loader) if loader is not None else {}
        return {
            "state": self.state,
            "reason": self.reason,
            "epochs": self.epochs,
            "current": {k: current.get(k) for k in ("num_workers", "prefetch_factor")},
            "original": {k: self.base.get(k) for k in ("num_workers", "prefetch_factor")},
            "changes": list(self.history),
            "epoch_batches_per_s": [round(t["batches_per_s"], 3) for t in self.trials if t["status"] == "ok"][
                -HISTORY:
            ],
        }

    def _publish(self, st) -> None:
        try:
            st.autotune = self.describe()
        except Exception:
            pass

    def summary_line(self) -> str | None:
        if self.state == "left alone":
            return f"dlwatch autotune: {self.dataset} loader left alone: {self.reason}"
        ok = [t for t in self.trials if t["status"] == "ok"]
        if not ok:
            return None
        best = search.choose(ok)
        if self.state == "converged":
            # The setting the job runs with since it converged: the epochs
            # measured after it may move choose()'s pick within noise (fresh-
            # clone run 40: "converged to num_workers=6" for a job that ran on with 7).
            best = self._running(ok) or best
        if best is None:
            return None
        s = best.settings
        nw, pf = s.get("num_workers"), s.get("prefetch_factor")
        args = f"num_workers={nw}" + (f", prefetch_factor={pf}" if nw else "")
        first = ok[0]["batches_per_s"]
        if self.state == "converged" and search.settings_key(s) == search.settings_key(ok[0]["settings"]):
            return f"dlwatch autotune: {self.dataset} loader kept DataLoader(..., {args}): {self.reason}"
        verdict = "converged to" if self.state == "converged" else "did not converge; the best so far is"
        return (
            f"dlwatch autotune: {self.dataset} loader {verdict} DataLoader(..., {args}): "
            f"{best.mean:.1f} batches/s vs {first:.1f} with the script's own setting "
            f"({best.mean / first:.2f}×, {len(ok)} epochs measured)"
        )

    def _running(self, ok: list[dict]) -> search.Group | None:
        """The measured setting the loader has now, if it has one."""
        loader = self.loader_ref()
        if loader is None:
            return None
        key = search.settings_key(_settings(loader))
        return next((g for g in search.groups(ok) if g.key == key), None)


# --------------------------------------------------------------------- helpers


def _short(f: dict) -> bool:
    return f["batches"] < MIN_EPOCH_BATCHES or f["seconds"] < MIN_EPOCH_S


def _settings(loader) -> dict:
    nw = int(getattr(loader, "num_workers", 0) or 0)
    pf = getattr(loader, "prefetch_factor", None)
    return {
        "num_workers": nw,
        "prefetch_factor": (pf if isinstance(pf, int) else 2) if nw else None,
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
    }


def _event(epoch: int, before: dict, after: dict, why: str) -> dict:
    keys = ("num_workers", "prefetch_factor")
    return {
        "epoch": epoch,
        "from": {k: before.get(k) for k in keys},
        "to": {k: after.get(k) for k in keys},
        "why": why,
        "batches_per_s": None,  # the epoch's pace, filled in when it ends
    }


def _left_alone(loader) -> str | None:
    from torch.utils.data import IterableDataset

    if isinstance(getattr(loader, "dataset", None), IterableDataset):
        return "an iterable dataset: its sharding depends on num_workers, so batches would change"
    if getattr(loader, "worker_init_fn", None) is not None:
        return "it has a worker_init_fn, which may depend on num_workers or the worker count"
    if getattr(loader, "_dataset_kind", 0) != 0:
        return "not a map-style dataset"
    return None


def _stats_of(loader):
    from dlwatch.probe.patches import registry

    st = registry._by_loader.get(id(loader))
    if st is None or st.loader_ref is None or st.loader_ref() is not loader:
        return None
    return st


def _counters(st, now: float) -> dict:
    it = st.iter_ref() if st.iter_ref is not None else None
    fetch = busy = 0.0
    wbatches = 0
    pids = []
    if st.slots_view is not None and st.slots_fview is not None:
        rows = _worker.read_workers(st.slots_view, st.slots_fview, st.num_workers, int(now * 1e9))
        for r in rows:
            fetch += r["fetch_ns"] / 1e9
            busy += r["busy_ns"] / 1e9
            wbatches += r["batches"]
            pids.append(r["pid"])
    return {
        "iter": it,
        "batches": st.batches,
        "wait_s": st.wait_s,
        "step_s": st.step_s,
        "fetch_s": fetch,
        "busy_s": busy,
        "wbatches": wbatches,
        "cpu_s": _workers_cpu_s(pids),
    }


def _children_cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _workers_cpu_s(pids) -> float:
    """CPU of the workers: live ones from /proc, exited (joined) ones through
    the trainer's reaped-children total."""
    total = _children_cpu_s()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / _TICK
        except (OSError, IndexError, ValueError):
            pass
    return total


def _worker_memory_bytes(loader) -> int | None:
    """Private memory of one worker: the largest of the live ones (USS from
    smaps_rollup), else the peak RSS of a reaped child (an upper bound)."""
    st = _stats_of(loader)
    best = 0
    if st is not None and st.slots_view is not None:
        for r in _worker.read_workers(st.slots_view, st.slots_fview, st.num_workers, 0):
            best = max(best, _uss(r["pid"]) or 0)
    if best:
        return best
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return peak_kib * 1024 if peak_kib else None


def _uss(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            total = 0
            for line in f:
                if line.startswith(("Private_Clean:", "Private_Dirty:")):
                    total += int(line.split()[1]) * 1024
            return total
    except (OSError, ValueError):
        return None


def _mem_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def _shm_free() -> int | None:
    try:
        s = os.statvfs("/dev/shm")
        return s.f_bavail * s.f_frsize
    except OSError:
        return None


def usable_cores() -> float:
    """Cores this process may use: its CPU affinity, capped by a cgroup v2 quota."""
    try:
        cores = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = float(os.cpu_count() or 1)
    try:
        with open("/sys/fs/cgroup/cpu.max") as f:
            quota, period = f.read().split()[:2]
        if quota != "max":
            cores = min(cores, int(quota) / int(period))
    except (OSError, ValueError):
        pass
    return cores


def _retire_iterator(loader) -> None:
    """Shut down a persistent iterator's workers so the next ``iter()`` starts
    new ones with the new setting, without moving the sampler's random state."""
    it = loader._iterator
    loader._iterator = None
    try:
        it._shutdown_workers()
    except Exception:
        pass
    # The new iterator draws its worker base seed from loader.generator before
    # the sampler draws its order; with no fresh iterator in the untouched run,
    # that draw would shift the order. It comes from a private generator
    # (seeded from the old base seed: deterministic) for this one creation.
    import torch

    saved = loader.generator
    private = torch.Generator()
    private.manual_seed(int(getattr(it, "_base_seed", 0)) & 0x7FFFFFFFFFFFFFFF)
    _pending_generator_restore[id(loader)] = saved
    loader.generator = private


# loader id -> the generator to put back once the replacing iterator exists.
_pending_generator_restore: dict[int, object] = {}


def after_new_iterator(it, loader, st) -> None:
    """The patches call this for each new iterator while autotune is on."""
    if id(loader) in _pending_generator_restore:
        loader.generator = _pending_generator_restore.pop(id(loader))
    t = tuner_of(loader)
    if t is None:
        return
    if t.state != "left alone":
        # The stats keep the settings of the loader's first iterator: refresh them.
        cfg = dict(st.config)
        cfg["num_workers"] = int(getattr(loader, "num_workers", 0) or 0)
        pf = getattr(loader, "prefetch_factor", None)
        cfg["prefetch_factor"] = pf if cfg["num_workers"] and isinstance(pf, int) else None
        st.config = cfg
    if t._mark is None:
        # The loader's first epoch: counted from its iterator's creation.
        t.mark(st, st.epoch_t0 or time.perf_counter())
        if t._mark is not None:
            t._mark["first_epoch"] = True
        if t.state != "left alone":
            _time_first_step(t, st)
    t._publish(st)


def _time_first_step(tuner: LoaderTuner, st: Any) -> None:
    """Time the loop's first step of this loader: from the first batch's
    return to the next ``__next__``. As a profiler burst does, the iterator
    class's ``__next__`` is wrapped only until then (no cost afterwards); a
    wrapper another swap has covered stays as a pass-through."""
    mod = sys.modules.get(TARGET_MODULE)
    cls: Any = getattr(mod, "_BaseDataLoaderIter", None) if mod is not None else None
    prev = cls.__dict__.get("__next__") if cls is not None else None
    if prev is None:
        return
    done = False

    def __next__(self):
        nonlocal done
        mine: bool = getattr(self, "_dlw_stats", None) is st
        if not done and mine and st.batches >= 1 and st.t_last:
            done = True
            tuner.first_step_s = max(0.0, time.perf_counter() - st.t_last)
            if cls.__dict__.get("__next__") is __next__:
                cls.__next__ = prev
        return prev(self)

    __next__.__doc__ = getattr(prev, "__doc__", None)
    __next__._dlwatch_orig = prev  # type: ignore[attr-defined]  # what uninstall restores
    cls.__next__ = __next__


def _in_worker_process() -> bool:
    w = sys.modules.get("torch.utils.data._utils.worker")
    return w is not None and getattr(w, "_worker_info", None) is not None


def _register_report() -> None:
    global _report_registered
    if not _report_registered:
        _report_registered = True
        atexit.register(report)


def report(stream=None) -> None:
    """One line a tuned loader on stderr at exit: the setting to paste."""
    try:
        lines = [t.summary_line() for t in list(_tuners.values())]
        text = "\n".join(x for x in lines if x)
        if text:
            print(text, file=stream or sys.stderr, flush=True)
    except Exception:
        pass
