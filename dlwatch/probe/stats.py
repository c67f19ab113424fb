"""Per-loader counters kept by the trainer's hot path, read by the publisher.

The hot path only adds to numbers and stores clock readings; everything
else (windows, rates, fractions) is derived later from cumulative counters,
by the publisher (in-progress adjustments) and by the monitor (diffs between
two frames). The publisher reads these fields from another thread without a
lock: each is a single Python object, so a read is never torn, and a frame
that straddles an update is off by one batch for one window.

Times here are float seconds of ``time.perf_counter()`` (the clock of
``perf_counter_ns``, divided by 1e9); ``frame()`` turns them into the integer
nanoseconds of the wire. Floats because they are cheaper on the hot path: a
float comes from a free list where a 2-digit int is allocated, and float
arithmetic is specialised for any value (bench/hotpath_variants.py: -36 ns of
221 per batch for the wrapper alone). The resolution is no loss: a reading a
year after boot is exact to 4 ns, and the sums are of differences.
"""

from __future__ import annotations

import multiprocessing
import sys
import threading
import weakref
from collections import deque
from time import perf_counter as _clock  # float seconds, as the hot path's
from typing import Any, NamedTuple

from dlwatch.probe import deaths
from dlwatch.probe import framework as _framework
from dlwatch.probe import handover as _handover
from dlwatch.probe import iter_in_next as _iter_in_next
from dlwatch.probe import trainthread as _trainthread
from dlwatch.probe import worker as _worker

# Recent epochs remembered per loader (epoch-start stalls, epoch durations).
EPOCH_HISTORY = 20
# Loaders remembered per process; the oldest garbage-collected ones go first.
MAX_LOADERS = 64
# A loader that was garbage-collected stays in frames this long (the monitor
# sees its final figures), then leaves them: a job that builds a DataLoader
# every epoch must not grow every frame by one loader per epoch.
DEAD_LOADER_KEEP_NS = 10 * 10**9
# Every loader's counters alive in this process (an evaluation pauses the others').
_LIVE: weakref.WeakSet[LoaderStats] = weakref.WeakSet()


def _pause_others(evaluating: LoaderStats, t: float) -> None:
    """An evaluation loader starts an epoch: the other loaders' steps pause."""
    for st in list(_LIVE):
        if st is not evaluating and st.role != "eval":
            st.pause(t)


def _pause_evaluations(training: LoaderStats, t: float) -> None:
    """A training loader takes the loop back (a new epoch, or its first batch
    after a pause): an evaluation loader whose epoch a framework left open
    (Lightning stops at the known length, without a StopIteration) is not
    stepping while the training runs (a QA run: an eval loader read "step
    8967 ms", the training between two validations)."""
    for st in list(_LIVE):
        if st is not training and st.role == "eval":
            st.pause(t)


class LoaderStats:
    __slots__ = (
        "id",
        "loader_ref",
        "config",
        "epoch",
        "batches",
        "wait_s",
        "step_s",
        "teardown_s",
        "t_enter",
        "t_last",
        "iter_t0",
        "epoch_t0",
        "paused_t",
        "first_pending",
        "epoch_start_ms",
        "epoch_ms",
        "epoch_b0",
        "epoch_batches",
        "iter_ref",
        "slots",
        "slots_view",
        "slots_fview",
        "num_workers",
        "dead_since",
        "thread_name",
        "thread_main",
        "samples",
        "wait_samples",
        "hol_samples",
        "autotune",
        "batch_bytes",
        "batch_on_device",
        "batch_rows",
        "deaths",
        "error",
        "procs",
        "framework",
        "role",
        "thread_ident",
        "consumer",
        "nested_in",
        "describe",
        "pipeline_procs",
        "handover_q",
        "internal",
        "next_cpu_s",
        "next_cpu_n",
        "__weakref__",
    )

    def __init__(self, loader_id: int, loader, config: dict) -> None:
        self.id = loader_id
        self.loader_ref = _weak(loader)
        self.config = config
        self.epoch = 0
        self.batches = 0
        self.wait_s = 0.0  # completed time blocked in __next__
        self.step_s = 0.0  # completed time between batches (the loop's work)
        self.teardown_s = 0.0  # __next__ calls that ended the epoch
        # The loop thread's CPU inside __next__ on the batches it was read
        # for (patches.HANDOVER_EVERY), and how many: the handover's cost.
        self.next_cpu_s = 0.0
        self.next_cpu_n = 0
        self.t_enter = 0.0  # clock at the last entry into __next__ (in progress if > t_last)
        self.t_last = 0.0  # clock when the last batch was returned; 0 until an epoch's first
        # Clock at iter() when that ran inside the loop's next() (a generator
        # around the DataLoader's __iter__: probe/iter_in_next.py), until the
        # epoch's first batch folds it into the wait; else 0.
        self.iter_t0 = 0.0
        self.epoch_t0 = 0.0
        self.paused_t = 0.0  # clock when an evaluation paused this loader's open epoch
        self.first_pending = False
        self.epoch_start_ms: deque[float] = deque(maxlen=EPOCH_HISTORY)
        self.epoch_ms: deque[float] = deque(maxlen=EPOCH_HISTORY)
        self.epoch_b0 = 0  # self.batches when the epoch began
        self.epoch_batches: deque[int] = deque(maxlen=EPOCH_HISTORY)  # beside epoch_ms
        self.iter_ref = None
        self.slots: Any = None  # the workers' shared table (a ctypes array)
        self.slots_view: memoryview[int] | None = None  # int64 view of the workers' table
        self.slots_fview: memoryview[float] | None = None  # float64 view of the same table
        self.num_workers = int(config.get("num_workers") or 0)
        self.dead_since = 0  # clock when the publisher first saw the loader gone
        # The thread that took the current epoch's first batch: a loader fed
        # from a producer thread is not the training loop's (None: no batch yet).
        self.thread_name: str | None = None
        self.thread_main: bool | None = None
        # The publisher's samples of this loader (one a frame while an
        # iterator is alive), those that found the loop inside __next__, and
        # those that found it there while later batches sat ready in the
        # reorder buffer of an in-order loader (head-of-line blocking).
        self.samples = 0
        self.wait_samples = 0
        self.hol_samples = 0
        self.autotune: dict | None = None  # what autotune decided (probe/autotune.py), when it is on
        # Bytes of host (CPU) tensors in the batch, read at each epoch's first
        # batch (never on the per-batch path): what a .to('cuda') copies.
        self.batch_bytes: int | None = None
        # Whether the batch holds tensors already on an accelerator (a dataset
        # or collate_fn that moves them): no worker process can make those,
        # and there is no host copy to pin.
        self.batch_on_device = False
        # The first dimension the batch's arrays share, read with its bytes:
        # shown where the loader declares no batch size (a watched
        # get_batch(), a pipeline without a batching stage), as read.
        self.batch_rows: int | None = None
        self.deaths: list[dict] = []  # workers that died (deaths.py), the last MAX_DEATHS
        self.error: str | None = None  # the last exception __next__ raised (not StopIteration)
        # The current iterator's worker Process objects: a worker's exit
        # status stays readable after torch dropped the iterator (the job
        # crashing on the death).
        self.procs: list = []
        # The framework iterating it and what for ("train" | "eval"), from
        # the code that calls iter() (probe/framework.py); None: not known.
        self.framework: str | None = None
        self.role: str | None = None
        # The thread that took the epoch's first batch (threading.get_ident()).
        self.thread_ident: int | None = None
        # The training loop's side of a hand-over: a thread that takes this
        # loader's batches from a queue (probe/handover.py). Its counters are
        # the loop's wait; this loader's own are its feeder thread's.
        self.consumer: LoaderStats | None = None
        # The loader whose __next__ this one's ran inside, on the same thread
        # (a DataLoader under WebDataset's WebLoader): a stage of that one.
        self.nested_in: int | None = None
        # An adapter's reader of the pipeline's knobs, workers and buffer
        # (probe/adapters): called from the publisher thread, never raises.
        self.describe: Any = None
        # An adapter's reader of the pipeline's worker Process objects
        # (torchdata.nodes' method="process", Grain's mp_prefetch): what the
        # death scan and a stack request read where ``it._workers`` is not.
        self.pipeline_procs: Any = None
        # A consumer's: the serial of the queue its open wait is on (handover.py).
        self.handover_q: int | None = None
        # A library's own plumbing: measured inside another loader of the same
        # library (Grain's mp_prefetch builds pipelines of its own): not shown.
        self.internal = False
        _LIVE.add(self)

    # --- called from the patched iterator (trainer main thread) -------------

    def begin_epoch(self, it, t0: float) -> None:
        # A new iter() while the previous epoch is open (its loop left with
        # ``break`` and kept the iterator, or a persistent iterator's _reset):
        # the replacement ends it.
        self.cut_epoch(t0)
        try:
            framework, role = _framework.caller(3)
            self.framework = framework or self.framework
            self.role = role or self.role
            if self.role == "eval":
                _pause_others(self, t0)
            elif self.role == "train":
                _pause_evaluations(self, t0)
        except Exception:
            pass
        self.epoch += 1
        self.epoch_t0 = t0
        self.paused_t = 0.0
        self.epoch_b0 = self.batches
        self.first_pending = True
        self.t_last = 0.0
        self.t_enter = 0.0
        self.iter_t0 = 0.0
        if _iter_in_next.called_from_a_generator(3):  # never raises
            # The loop is already inside its next(): waiting from now.
            self.iter_t0 = self.t_enter = t0
        self.iter_ref = _weak(it, self._iterator_dropped)

    def _iterator_dropped(self, ref) -> None:
        # weakref callback: the epoch's iterator was garbage-collected (a loop
        # that left with ``break``: steps-per-epoch limits, Lightning's
        # limit_train_batches). Runs after the iterator's __del__, so a
        # non-persistent loader's worker shutdown counts in the epoch, as
        # iter() (worker start) does. Never raises into the job.
        try:
            if ref is self.iter_ref:
                self.cut_epoch(_clock())
        except Exception:
            pass

    def cut_epoch(self, t: float) -> None:
        """End the open epoch at ``t`` without a StopIteration. The loop's
        work after its last batch counts as step time, as end_epoch does. An
        epoch that never produced a batch is not an epoch worth a duration."""
        if not self.epoch_t0 or self.first_pending or t < self.epoch_t0:
            return
        if self.t_last and self.t_enter <= self.t_last and t > self.t_last:
            self.step_s += t - self.t_last
        self.epoch_ms.append((t - self.epoch_t0) * 1e3)
        self.epoch_batches.append(self.batches - self.epoch_b0)
        self.t_last = 0.0
        self.t_enter = 0.0
        self.epoch_t0 = 0.0
        self.iter_t0 = 0.0
        self.paused_t = 0.0

    def pause(self, t: float) -> None:
        """Another loader of the job (an evaluation) starts iterating while
        this one is between batches: the loop's work up to ``t`` is its step,
        the evaluation is not. Its next batch is then taken like one after an
        epoch's end (no start stall)."""
        if self.t_last and self.t_enter <= self.t_last and t > self.t_last:
            self.step_s += t - self.t_last
            self.t_last = 0.0
            self.t_enter = 0.0
            # Where its idle time starts for the stall check: not the
            # epoch's start (a QA run of Lightning: a train loader paused
            # for validation read "no batch for 25 s", its whole epoch).
            self.paused_t = t

    def first_batch(self, t1: float, data: Any = None) -> None:
        # The hot path calls this for any batch returned while t_last is 0:
        # an epoch's first, or one after end_epoch (a next() past the end
        # that a custom iterator answered). Only the first is a start stall.
        if not self.first_pending and self.paused_t and self.role == "train":
            # Back from a validation inside the epoch (val_check_interval).
            try:
                _pause_evaluations(self, t1)
            except Exception:
                pass
        if self.first_pending:
            self.first_pending = False
            if self.iter_t0:
                # iter() ran inside the loop's next(): from there to this
                # __next__'s entry (t_enter) the loop waited too. Two stores,
                # no call between them: a publisher reads both or neither.
                self.wait_s += max(0.0, self.t_enter - self.iter_t0)
                self.iter_t0 = 0.0
            self.epoch_start_ms.append((t1 - self.epoch_t0) * 1e3)
            if data is not None:
                self.batch_bytes, self.batch_on_device, self.batch_rows = batch_footprint(data)
            th = threading.current_thread()
            self.thread_name = th.name
            self.thread_main = th is threading.main_thread()
            self.thread_ident = th.ident
            outer = _outer_meter(self)
            self.nested_in = outer.id if outer is not None else None
            lib = self.config.get("library")
            self.internal = bool(outer is not None and lib and outer.config.get("library") == lib)
            exact = self.consumer is not None and self.consumer.handover_q == _handover.EXACT
            if not self.thread_main and self.nested_in is None and self.id >= 0 and not exact:
                # Iterated off the main thread: perhaps a feeder handing its
                # batches to the training loop through a queue (not when an
                # adapter already times the loop's own iterator: MONAI's).
                _handover.note_feeder(self)

    def end_epoch(self, t0: float, t1: float) -> None:
        # The __next__ that raises StopIteration joins non-persistent workers:
        # teardown, not data wait. The loop's work before it still counts.
        if self.t_last:
            self.step_s += t0 - self.t_last
        self.teardown_s += t1 - t0
        if self.epoch_t0:
            self.epoch_ms.append((t0 - self.epoch_t0) * 1e3)
            self.epoch_batches.append(self.batches - self.epoch_b0)
        self.t_last = 0.0
        self.t_enter = 0.0
        self.epoch_t0 = 0.0
        self.first_pending = False
        self.iter_t0 = 0.0
        self.paused_t = 0.0

    def raised(self, it, e: BaseException, t0: float | None = None, t1: float | None = None) -> None:
        """``__next__`` raised ``e`` (not StopIteration) after waiting from
        ``t0`` to ``t1``: a worker's exception or death, as torch reports it.
        Off the hot path: errors only. The wait is the loop's (a QA run: a
        loop that caught torch's 6 s timeout read it as 6 s of its step, and
        a data wait of 0 %)."""
        if t0 is not None and t1 is not None and t1 > t0:
            self.wait_s += t1 - t0
            if self.t_last:
                self.t_last = t1
        if isinstance(e, Exception):
            if self.pipeline_procs is not None and self.procs:
                # The pipeline may have dropped a dead worker before raising
                # (Grain stops it): its Process object, as last scanned,
                # still has its exit status.
                try:
                    deaths.scan(self.procs, self.deaths)
                except Exception:
                    pass
            self.error = deaths.from_error(it, e, self.deaths)

    # --- called from the publisher thread -------------------------------------

    def scan_deaths(self) -> None:
        it = self.iter_ref() if self.iter_ref is not None else None
        if self.pipeline_procs is not None:
            # A pipeline's process workers, as its adapter finds them ([]
            # while it shuts them down: exits then are its own).
            procs = self.pipeline_procs()
            if procs:
                self.procs = procs
                deaths.scan(procs, self.deaths)
            return
        if it is not None:
            # Read here, not at iter(): torch starts the workers after the
            # base __init__ that our patch follows.
            self.procs = list(getattr(it, "_workers", ()) or ())
        if self.procs and not getattr(it, "_shutdown", False):
            deaths.scan(self.procs, self.deaths)

    def counters(self, now: float) -> tuple[float, float, bool]:
        """(wait, step, inside ``__next__``) up to ``now``: the completed
        sums plus the call or the step in progress.

        The loop adds a batch's wait, and the step before it, when the batch
        returns; the four fields are read with no call in between, so no other
        thread runs among them (they are one state). ``now`` is read a little
        earlier, by the publisher: should the loop have returned a batch since
        (a publisher descheduled on a busy box), that batch is taken back to
        ``now`` (a recorded 1 s window once read 0.504 against the loop's 0.525)."""
        wait = self.wait_s
        step = self.step_s
        t_enter = self.t_enter
        t_last = self.t_last
        iter_t0 = self.iter_t0
        if iter_t0:
            # iter() ran inside the loop's next() and the first batch has not
            # folded that wait in yet: the part of it before `now`.
            wait += max(0.0, min(t_enter, now) - iter_t0)
        if t_last > now and t_enter <= t_last:
            # The last batch returned after `now`; t_enter is still its entry.
            if t_enter <= now:  # waiting at `now`: its step before was complete
                return wait - (t_last - now), step, True
            # Begun after `now` too: between batches then (the step it closed
            # ran from the batch before, which ended before `now`).
            return wait - (t_last - t_enter), step - (t_enter - now), False
        if t_enter > t_last:  # inside __next__ (or, past `now`, entered after it)
            gap = t_enter - t_last if t_last else 0.0  # the step that ended there: not yet added
            if t_enter <= now:
                return wait + now - t_enter, step + gap, True
            if t_last and t_last <= now:
                return wait, step + now - t_last, False
            return wait, step, False
        if t_last:  # between batches: the loop's work
            step += now - t_last
        return wait, step, False

    def frame(self, now_ns: int) -> dict:
        now = now_ns / 1e9  # the hot path's clock, in seconds
        wait, step, inside = self.counters(now)
        t_last = self.t_last
        consumer = self.consumer
        if consumer is not None:
            # The loop takes this loader's batches from a queue: its wait is
            # the loop's; this loader's own figures are its feeder's.
            feeder = {
                "thread": self.thread_name or "?",
                "main": bool(self.thread_main),
                "wait_ns": _ns(wait),
                "step_ns": _ns(step),
                "batches": self.batches,
            }
            wait, step, inside = consumer.counters(now)
            t_last = consumer.t_last
        it = self.iter_ref() if self.iter_ref is not None else None
        queue, buffered = _queue_state(it, self.num_workers)
        if it is not None and (inside or t_last):
            self.samples += 1
            if inside:
                self.wait_samples += 1
                if buffered > 0:
                    self.hol_samples += 1
        workers: list[dict[str, Any]] = []
        view = self.slots_view
        fview = self.slots_fview
        if view is not None and fview is not None and it is not None:
            pids = _worker_pids(it)
            workers = _worker.read_workers(view, fview, self.num_workers, now_ns, pids)
        loader_alive = self.loader_ref() is not None if self.loader_ref is not None else False
        if not loader_alive and it is None and not self.dead_since:
            self.dead_since = now_ns
        # An epoch runs: begun, not yet exhausted or dropped (an exhausted
        # iterator may stay alive, a finished loader's is).
        epoch_open = bool(self.epoch_t0 or t_last or inside)
        out = dict(self.config)
        out.update(
            {
                "id": self.id,
                "epoch": self.epoch,
                "batches": self.batches if consumer is None else consumer.batches,
                "wait_ns": _ns(wait),
                "step_ns": _ns(step),
                "teardown_ns": _ns(self.teardown_s),
                # `for b in DataLoader(...)`: nothing holds the loader, its
                # iterator is the loop's (a QA run read "idle: no iterator
                # now" at a 62 % wait, and no hint ever came).
                "active": it is not None and (loader_alive or epoch_open),
                "epoch_open": epoch_open,
                "epoch_start_ms": [round(x, 3) for x in self.epoch_start_ms],
                "epoch_ms": [round(x, 3) for x in self.epoch_ms],
                "epoch_batches": list(self.epoch_batches),
                "queue": queue,
                "workers": workers,
                "samples": self.samples,
                "wait_samples": self.wait_samples,
                "hol_samples": self.hol_samples,
            }
        )
        if self.thread_name is not None:
            on: dict[str, Any] = {"thread": self.thread_name, "main": bool(self.thread_main)}
            trains = _trainthread.trains(self.thread_ident)
            if trains is not None:
                on["trains"] = trains
            out["iterated_on"] = on
        if consumer is not None:
            out["feeder"] = feeder
            out["consumer"] = {
                "thread": consumer.thread_name or "?",
                "main": bool(consumer.thread_main),
                "via": str(consumer.config.get("via") or "queue.Queue"),
            }
        if self.nested_in is not None:
            out["nested_in"] = self.nested_in
        if consumer is None and self.next_cpu_n:
            # The loop's own next() (a feeder's is the feeder's): its CPU.
            out["next_cpu_ns"] = _ns(self.next_cpu_s)
            out["next_cpu_batches"] = self.next_cpu_n
        if self.describe is not None:
            try:
                out.update(self.describe())
            except Exception:
                pass
        elif it is not None and self.num_workers > 0:
            threads = thread_workers(it)
            if threads:
                # A DataLoader whose workers are threads (proposed for torch as
                # worker_method="thread"): listed by thread id for their CPU.
                out["pipeline_workers"] = threads
                out["worker_kind"] = "thread"
        if self.autotune is not None:
            out["autotune"] = self.autotune
        if self.batch_bytes is not None:
            out["batch_bytes"] = self.batch_bytes
        if self.batch_rows is not None:
            out["batch_rows"] = self.batch_rows
        if self.deaths:
            out["worker_deaths"] = [dict(d) for d in self.deaths]
        if self.error is not None:
            out["last_error"] = self.error
        if self.framework is not None:
            out["framework"] = self.framework
        if self.role is not None:
            out["role"] = self.role
        return out


# The code objects of every measured ``__next__`` (patches.py, consumer.py):
# a first batch taken while one of them is on the same thread's stack is a
# stage of that outer loader, not the loop's own.
METER_CODES: set = set()
# How far up the stack a first batch looks for an outer meter.
MAX_NEST_DEPTH = 60


def _outer_meter(st: LoaderStats) -> LoaderStats | None:
    """The loader whose measured ``__next__`` is running further up this
    thread's stack, if any. Off the hot path: an epoch's first batch."""
    try:
        f: Any = sys._getframe(1)
        for _ in range(MAX_NEST_DEPTH):
            if f is None:
                return None
            if f.f_code in METER_CODES:
                outer = f.f_locals.get("self")
                ost = getattr(outer, "_dlw_stats", None) if outer is not None else None
                if isinstance(ost, LoaderStats) and ost is not st:
                    return ost
            f = f.f_back
    except Exception:
        pass
    return None


# The walk over a batch stops here: a batch of thousands of tensors (a list
# of variable-length samples) is counted as far as this goes.
MAX_BATCH_ITEMS = 4096
MAX_BATCH_DEPTH = 6


def host_bytes(data: Any) -> int | None:
    """Bytes of the CPU tensors in a batch (tensors, and lists, tuples, dicts
    and dataclass-like objects of them): 0 when every tensor is already on a
    device (nothing to copy), None when it holds none or cannot be read.
    Never raises."""
    return batch_footprint(data)[0]


class Footprint(NamedTuple):
    """What an epoch's first batch is made of (``batch_footprint``)."""

    # Bytes of its CPU tensors: what pin_memory=True pins, what DataLoader
    # workers hand over through /dev/shm, what a .to('cuda') copies. Not NumPy
    # arrays (neither pins nor shares them): a batch of those reads 0. None: it
    # holds no array, or unread.
    host_bytes: int | None
    on_device: bool  # an array in it lives on an accelerator
    # The first dimension its arrays share (a loop over tensors of [B, ...]:
    # B); None where they disagree, or it holds no array with one.
    rows: int | None


def _device_kind(device: Any) -> str | None:
    """ "cpu", "cuda", ...: a torch device's ``type``, a JAX device's
    ``platform``, or the string NumPy >= 2 answers (``ndarray.device``)."""
    if isinstance(device, str):
        return device
    kind = getattr(device, "type", None)
    if not isinstance(kind, str):
        kind = getattr(device, "platform", None)
    return kind if isinstance(kind, str) else None


def batch_footprint(data: Any) -> Footprint:
    """The host tensor bytes, whether an array is on a device, and the first
    dimension the arrays share, of a batch: tensors or NumPy arrays, and
    lists, tuples and dicts of them. Reads metadata only: nothing touches a
    device or waits for one. Never raises."""
    on_device = False
    rows: set[int] = set()
    try:
        total, seen = 0, 0
        stack = [(data, 0)]
        found = False
        while stack and seen < MAX_BATCH_ITEMS:
            obj, depth = stack.pop()
            seen += 1
            nbytes = getattr(obj, "nbytes", None)
            shape = getattr(obj, "shape", None)
            if isinstance(nbytes, int) and (shape is not None or hasattr(obj, "device")):
                device = getattr(obj, "device", None)
                # An array but no CPU tensor reads 0 bytes, not "unknown":
                # pin_memory=True would pin nothing of it.
                found = True
                # A NumPy array (no device before NumPy 2, the string "cpu"
                # since) is host memory, never "on a device", and not counted:
                # only torch's devices have a .type.
                if _device_kind(device) not in (None, "cpu"):
                    on_device = True
                elif isinstance(getattr(device, "type", None), str):
                    total += nbytes
                if isinstance(shape, tuple) and shape and isinstance(shape[0], int):
                    rows.add(shape[0])
                continue
            if depth >= MAX_BATCH_DEPTH or isinstance(obj, (str, bytes)):
                continue
            if isinstance(obj, dict):
                stack.extend((v, depth + 1) for v in obj.values())
            elif isinstance(obj, (list, tuple)):
                stack.extend((v, depth + 1) for v in obj)
        return Footprint(total if found else None, on_device, rows.pop() if len(rows) == 1 else None)
    except Exception:
        return Footprint(None, on_device, None)


def _ns(seconds: float) -> int:
    return round(seconds * 1e9)


def _weak(obj, callback=None):
    try:
        return weakref.ref(obj, callback)
    except TypeError:
        return None


def workers_of(objs: list[Any]) -> list[dict[str, Any]]:
    """Thread or process workers as the wire carries them (``pipeline_workers``):
    a thread by its native id (its CPU is read from /proc/PID/task/TID), a
    process by pid."""
    out: list[dict[str, Any]] = []
    for i, w in enumerate(objs):
        tid = getattr(w, "native_id", None)
        pid = getattr(w, "pid", None) if tid is None else None
        if isinstance(tid, int):
            out.append({"id": i, "kind": "thread", "tid": tid, "name": str(getattr(w, "name", ""))[:80]})
        elif isinstance(pid, int):
            out.append({"id": i, "kind": "process", "pid": pid})
    return out


def thread_workers(it) -> list[dict[str, Any]]:
    """An iterator's ``_workers`` when they are threads; [] for processes (or
    anything unreadable)."""
    try:
        ws = list(getattr(it, "_workers", ()) or ())
        if not ws or not all(isinstance(w, threading.Thread) for w in ws):
            return []
        return workers_of(ws)
    except Exception:
        return []


def _worker_pids(it) -> list[int]:
    try:
        return [int(w.pid or 0) for w in list(getattr(it, "_workers", ()) or ())]
    except Exception:
        return []


def _queue_state(it, num_workers: int) -> tuple[dict[str, int | None], int]:
    """Prefetch queue, read from torch's private iterator fields defensively,
    and how many of its ready batches sit in the reorder buffer (arrived
    before the batch the loop must take next)."""
    q: dict[str, int | None] = {"ready": None, "in_flight": None, "capacity": None}
    buffered = 0
    if it is None or num_workers <= 0:
        return q, buffered
    try:
        pf = getattr(it, "_prefetch_factor", None)
        if isinstance(pf, int):
            q["capacity"] = pf * num_workers
        outstanding = getattr(it, "_tasks_outstanding", None)
        task_info = getattr(it, "_task_info", None)
        if getattr(it, "_shutdown", False):
            return q, buffered
        queued = None
        dq = getattr(it, "_data_queue", None)
        if dq is not None:
            try:
                queued = int(dq.qsize())
            except (NotImplementedError, OSError, AttributeError, ValueError):
                queued = None  # macOS has no sem_getvalue
        if isinstance(outstanding, int):
            # Items sitting in the data queue still count as outstanding until
            # __next__ takes them; out-of-order batches wait in _task_info.
            buffered = max(0, len(task_info) - outstanding) if isinstance(task_info, dict) else 0
            if queued is not None:
                q["ready"] = max(0, queued) + buffered
                q["in_flight"] = max(0, outstanding - queued)
            else:
                q["in_flight"] = max(0, outstanding)
    except Exception:
        pass
    return q, buffered


# DataLoader subclasses of other libraries whose knobs have their own names
# (adapters register them: MONAI's ThreadDataLoader): class name ->
# (library, reader of the knobs).
LOADER_KNOBS: dict[str, tuple[str, Any]] = {}


# Readers of the batch a dataset makes itself, for a DataLoader with
# batch_size=None over it (a WebDataset pipeline ending in ``batched``),
# registered by the adapters.
DATASET_BATCH: list[Any] = []


def _dataset_batch(ds) -> int | None:
    for read in DATASET_BATCH:
        try:
            n = read(ds)
        except Exception:
            n = None
        if isinstance(n, int):
            return n
    return None


def _mean_batch(loader) -> int | None:
    """A batch_sampler without a batch_size (a bucketing sampler): its mean
    batch, the dataset's length over the sampler's number of batches; None
    when either has no length."""
    try:
        n, batches = len(loader.dataset), len(loader.batch_sampler)
        return max(1, round(n / batches)) if batches > 0 and n > 0 else None
    except Exception:
        return None


def loader_config(loader, it) -> dict:
    cfg: dict = {}
    try:
        nw = int(getattr(loader, "num_workers", 0) or 0)
        cfg["num_workers"] = nw
        bs = getattr(loader, "batch_size", None)
        if not isinstance(bs, int):
            # batch_sampler= (Accelerate's shards, bucketing samplers) leaves
            # DataLoader.batch_size None; the sampler usually knows.
            bs = getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
        if not isinstance(bs, int) and getattr(loader, "batch_sampler", None) is None:
            bs = _dataset_batch(getattr(loader, "dataset", None))
        if not isinstance(bs, int):
            bs = _mean_batch(loader)
        cfg["batch_size"] = bs if isinstance(bs, int) and not isinstance(bs, bool) else None
        cfg["pin_memory"] = bool(getattr(it, "_pin_memory", getattr(loader, "pin_memory", False)))
        cfg["persistent_workers"] = bool(getattr(loader, "persistent_workers", False))
        pf = getattr(loader, "prefetch_factor", None)
        cfg["prefetch_factor"] = pf if nw > 0 and isinstance(pf, int) else None
        cfg["start_method"] = _start_method(loader) if nw > 0 else None
        in_order = getattr(loader, "in_order", None)  # torch >= 2.6
        if isinstance(in_order, bool) and nw > 0:
            cfg["in_order"] = in_order
        ds = getattr(loader, "dataset", None)
        cfg["kind"] = "iterable" if _is_iterable(ds) else "map"
        user, wrappers = _user_dataset(ds)
        cfg["dataset"] = type(user).__name__
        if wrappers:
            cfg["dataset_wrappers"] = wrappers
        if cfg["kind"] == "iterable" and nw > 0:
            shards = dataset_shards(user)
            if shards is not None:
                cfg["shards"], cfg["shards_of"] = shards
        cfg["iterator"] = type(it).__name__
        if type(loader).__name__ != "DataLoader":
            # A subclass: the class the script builds, named in advice
            # (litdata's StreamingDataLoader, torchdata's StatefulDataLoader).
            cfg["loader_class"] = type(loader).__name__[:80]
        special = LOADER_KNOBS.get(type(loader).__name__)
        if special is not None:
            cfg["library"] = special[0]
            cfg["knobs"] = special[1](loader)
        rep = getattr(loader, "_dlw_replay", None)  # only with DLWATCH_OVERRIDES' replay
        if rep is not None:
            cfg["replay"] = rep.status
    except Exception:
        cfg.setdefault("num_workers", 0)
    return cfg


# Packages whose dataset classes wrap the user's dataset (``.dataset``):
# sharding for processes (Accelerate's IterableDatasetShard, transformers'),
# torch's own Subset. The view names the user's dataset beneath them.
_WRAPPER_PACKAGES = ("accelerate", "transformers", "lightning", "pytorch_lightning", "torch", "torchdata")
_MAX_WRAPPERS = 4


def _user_dataset(ds):
    """The dataset the user wrote beneath frameworks' wrappers, and the
    wrappers' class names, outermost first."""
    wrappers: list[str] = []
    while len(wrappers) < _MAX_WRAPPERS:
        inner = getattr(ds, "dataset", None)
        pkg = (type(ds).__module__ or "").split(".")[0]
        if inner is None or pkg not in _WRAPPER_PACKAGES:
            break
        wrappers.append(type(ds).__name__)
        ds = inner
    return ds, wrappers


# Iterable datasets whose library shares whole shards out among a loader's
# workers, so that a worker past the shard count gets no data: HF datasets'
# IterableDataset (``_iter_pytorch`` logs "Too many dataloader workers" and
# stops it) and WebDataset (``split_by_worker`` hands it no tar file, and its
# default ``empty_check`` then fails the run: "No samples found in dataset").
# The worker-count advice is capped by that count, and raising it means
# resharding. Keyed by the top-level package of the dataset's class.
# HF datasets: the attributes tried in order (``n_shards``: older releases).
_HF_SHARD_ATTRS = ("num_shards", "n_shards")


def _hf_shards(ds) -> int | None:
    for name in _HF_SHARD_ATTRS:
        try:
            n = getattr(ds, name, None)
        except Exception:
            continue
        if isinstance(n, int) and not isinstance(n, bool) and n > 0:
            return n
    return None


def _stage_name(stage) -> str:
    return str(getattr(stage, "__name__", None) or type(stage).__name__)


def _webdataset_shards(ds) -> int | None:
    """The tar files this rank's workers share: a pipeline that starts from
    a fixed list (``SimpleShardList``, what ``WebDataset(urls)`` builds) and
    splits it by worker. A resampled one (``ResampledShards``) draws shards
    at random in every worker, and a custom splitter's share is its own:
    None for those."""
    stages = getattr(ds, "pipeline", None)
    if not isinstance(stages, list) or not stages:
        return None
    names = [_stage_name(st) for st in stages]
    urls = getattr(stages[0], "urls", None)
    if names[0] != "SimpleShardList" or "split_by_worker" not in names or not isinstance(urls, list):
        return None
    n = len(urls)
    if "split_by_node" in names:  # this rank's share first: urls[rank::world_size]
        # webdataset's own reading of the rank (its module is loaded: the
        # dataset is one of its own), None where it is not there to ask.
        info = getattr(sys.modules.get("webdataset.utils"), "pytorch_worker_info", None)
        if info is None:
            return None
        rank, world = info()[:2]
        n = len(range(rank, n, max(1, world)))
    return n if n > 0 else None


_SHARDED_BY_LIBRARY = {"datasets": _hf_shards, "webdataset": _webdataset_shards}


def dataset_shards(ds) -> tuple[int, str] | None:
    """(shards, library) of an iterable dataset its library shards among
    workers by itself; None for any other. Never raises: a dataset whose
    shards fail to count is one dlwatch cannot size, not an error in the job."""
    pkg = (type(ds).__module__ or "").split(".")[0]
    count = _SHARDED_BY_LIBRARY.get(pkg)
    if count is None:
        return None
    try:
        n = count(ds)
    except Exception:
        return None
    return (n, pkg) if n is not None else None


def _is_iterable(ds) -> bool:
    try:
        from torch.utils.data import IterableDataset

        return isinstance(ds, IterableDataset)
    except Exception:
        return False


def _start_method(loader) -> str | None:
    ctx = getattr(loader, "multiprocessing_context", None)
    try:
        if ctx is not None:
            return str(ctx.get_start_method())
        return (
            multiprocessing.get_start_method(allow_none=True)
            or multiprocessing.get_context().get_start_method()
        )
    except Exception:
        return None


class Registry:
    """The loaders of this process, in the order they were first iterated."""

    def __init__(self) -> None:
        self._by_loader: dict[Any, LoaderStats] = {}
        self._next_id = 0
        self._lock = threading.Lock()

    def for_iterator(self, it, loader) -> LoaderStats:
        key = id(loader)
        st = self._by_loader.get(key)
        if st is not None and st.loader_ref is not None and st.loader_ref() is loader:
            return st
        with self._lock:
            st = LoaderStats(self._next_id, loader, loader_config(loader, it))
            self._next_id += 1
            self._by_loader[key] = st
            self._trim()
        return st

    def for_source(self, source, config: dict, key: Any = None) -> LoaderStats:
        """The counters of a pipeline that is not a torch DataLoader (an
        adapter's or ``dlwatch.watch()``'s): one per source object, or one
        per ``key`` (a pipeline rebuilt every epoch: its shape), whose
        newest source then stands for it."""
        # Never a DataLoader's key (id(loader)): a watched DataLoader is two
        # loaders, the watch and the DataLoader inside it (a stage of it).
        k = ("source", id(source)) if key is None else ("key", key)
        st = self._by_loader.get(k)
        if st is not None and key is not None:
            ref = _weak(source)
            st.loader_ref = ref if ref is not None else (lambda: source)
            return st
        if st is not None and st.loader_ref is not None and st.loader_ref() is source:
            return st
        with self._lock:
            st = LoaderStats(self._next_id, source, config)
            if st.loader_ref is None:
                # Not weakly referable (a list): held for the stats' life.
                st.loader_ref = lambda: source
            self._next_id += 1
            self._by_loader[k] = st
            self._trim()
        return st

    def _trim(self) -> None:
        if len(self._by_loader) <= MAX_LOADERS:
            return
        dead = [k for k, s in self._by_loader.items() if s.loader_ref is None or s.loader_ref() is None]
        for k in dead[: len(self._by_loader) - MAX_LOADERS]:
            del self._by_loader[k]
        while len(self._by_loader) > MAX_LOADERS:
            del self._by_loader[next(iter(self._by_loader))]

    def snapshot(self, now_ns: int | None = None) -> list[LoaderStats]:
        """Loaders in id order; with ``now_ns``, first forgets those dead for
        longer than DEAD_LOADER_KEEP_NS."""
        with self._lock:
            if now_ns is not None:
                gone = [
                    k
                    for k, s in self._by_loader.items()
                    if s.dead_since and now_ns - s.dead_since > DEAD_LOADER_KEEP_NS
                ]
                for k in gone:
                    del self._by_loader[k]
            return sorted((s for s in self._by_loader.values() if not s.internal), key=lambda s: s.id)

    def clear(self) -> None:
        self._by_loader = {}
        self._next_id = 0
        self._lock = threading.Lock()
