"""Inside a DataLoader worker: sample where its fetches spend their time.

A worker profile burst (``worker_burst.py``) writes a burst id, a rate and a
deadline into the worker's row of the shared counters; the worker's timed
fetch (``worker.py``) sees the new id at its next fetch and calls
``start``, which runs a daemon thread until the deadline. Each tick it
reads the stack of the thread that runs the fetches
(``sys._current_frames``: the interpreter's own frames, no ptrace, no
signal handler in the user's process) and counts it only if our fetch
wrapper is on it, keeping the frames above the wrapper: dataset
``__getitem__``, transforms, collate. At the deadline (or when the worker
exits first: a multiprocessing finalizer) it writes the counts to a 0600 file
in the runtime directory, named for the burst id and its pid, which the
trainer reads. No burst, no thread.

What it cannot see: a C call that holds the GIL delays the sample until it
returns, so its time lands on the Python line that follows; C functions
themselves have no frame (the calling line is kept for them).
"""

from __future__ import annotations

import json
import linecache
import os
import sys
import threading
import time
from time import perf_counter as _clock
from types import CodeType

from dlwatch import own_threads, qualnames, rundir, wire
from dlwatch.probe.worker_row import BURST_ACK, BURST_END_S, BURST_GEN, BURST_HZ, claim_tid, release_tid

# Distinct stacks kept per worker; later new ones are counted as "other".
MAX_STACKS = 4000
MAX_DEPTH = 128
MAX_LINE_CHARS = 160
SWITCH_INTERVAL_S = 0.0001

_lock = threading.Lock()
_running: set[int] = set()  # burst ids sampled by this process now


def result_path(directory: str, gen: int, pid: int) -> str:
    return os.path.join(directory, f"wprof-{gen:x}-{pid}.json")


def start(row, frow, base: int, gen: int, fetch_code, start_code=None) -> None:
    """From the fetch (the worker's loop thread): sample until the deadline.
    ``fetch_code`` is the fetch's frame's code (samples stop there);
    ``start_code`` the caller's own (worker._start_sampler), whose samples
    are the burst starting, not the dataset's work."""
    if gen == 0 or frow[base + BURST_END_S] <= _clock():
        return
    with _lock:
        if gen in _running:
            return
        _running.add(gen)
    s = _Sampler(row, frow, base, gen, fetch_code, threading.get_ident(), start_code)
    own_threads.start(s.run, "dlwatch-worker-sampler")


class _Sampler:
    def __init__(self, row, frow, base: int, gen: int, fetch_code, tid: int, start_code=None) -> None:
        self.row, self.frow, self.base, self.gen = row, frow, base, gen
        self.fetch_code = fetch_code
        self.start_code = start_code
        self.tid = tid
        self.stacks: dict[tuple, int] = {}
        self.codes: dict[int, CodeType] = {}  # id -> code: keeps the ids valid
        self.samples = 0
        self.in_fetch = 0
        self.other = 0
        self.t0 = _clock()
        self.cpu0 = 0.0
        # The sampler thread's own CPU over the burst, set by that thread when
        # its loop ends; the finalizer runs in the worker's main thread, whose
        # thread_time is the fetch's CPU, never the sampler's cost.
        self.cpu_s: float | None = None
        self.native_id = 0
        self.done = threading.Event()
        self.stopped = threading.Event()
        self.written = False
        self.wlock = threading.Lock()

    def run(self) -> None:
        fin = None
        # Listed in the worker's row while it runs: the monitor leaves this
        # thread out of the worker's thread count, CPU and run-queue wait.
        slot = claim_tid(self.row, self.base)
        try:
            from multiprocessing import util

            # A worker that exits before the deadline (the epoch of a
            # non-persistent loader ends) still reports what it saw.
            fin = util.Finalize(None, self._at_exit, exitpriority=100)
            self.native_id = threading.get_native_id()
            self.cpu0 = time.thread_time()
            self.row[self.base + BURST_ACK] = self.gen
            switch = sys.getswitchinterval()
            # A sampler that wakes must wait for the GIL, and gets it soonest
            # where the fetch releases it (a torch op, I/O): with the default
            # 5 ms wait, most samples would land there. A short interval
            # during the burst makes the wait, and that bias, small.
            sys.setswitchinterval(min(switch, SWITCH_INTERVAL_S))
            try:
                self._loop()
            finally:
                self.cpu_s = time.thread_time() - self.cpu0
                self.stopped.set()
                if sys.getswitchinterval() == min(switch, SWITCH_INTERVAL_S):
                    sys.setswitchinterval(switch)
            if self.row[self.base + BURST_GEN] == self.gen:  # else cancelled
                self.write()
        except Exception:
            pass
        finally:
            self.done.set()
            self.stopped.set()
            if fin is not None:
                fin.cancel()
            with _lock:
                _running.discard(self.gen)
            release_tid(self.row, slot)

    def _loop(self) -> None:
        row, frow, base, gen = self.row, self.frow, self.base, self.gen
        hz = int(row[base + BURST_HZ]) or wire.WORKER_PROFILE_DEFAULT_HZ
        hz = min(wire.WORKER_PROFILE_MAX_HZ, max(1, hz))
        period = 1.0 / hz
        end = frow[base + BURST_END_S]
        nxt = _clock()
        while not self.done.is_set():
            now = _clock()
            if now >= end or row[base + BURST_GEN] != gen:
                return
            self._sample()
            nxt += period
            if nxt < now:
                nxt = now + period  # fell behind (a long GIL hold): no catch-up burst
            # An event, not a sleep: the exit finalizer's done.set() wakes the
            # loop at once, so the thread can record its CPU and stop.
            self.done.wait(max(0.0, min(nxt, end) - _clock()))

    def _sample(self) -> None:
        f = sys._current_frames().get(self.tid)
        self.samples += 1
        chain = []
        leaf_line = f.f_lineno if f is not None else 0
        while f is not None:
            code = f.f_code
            if code is self.fetch_code:
                break
            chain.append(code)
            f = f.f_back
        else:
            return  # not inside a fetch: the worker is idle
        if chain and self.start_code is not None and chain[-1] is self.start_code:
            return  # our own start, inside the fetch that saw the burst
        self.in_fetch += 1
        if len(chain) > MAX_DEPTH:
            chain = chain[:MAX_DEPTH]  # keep the leaf end
        key = (*(id(c) for c in reversed(chain)), leaf_line)
        n = self.stacks.get(key)
        if n is not None:
            self.stacks[key] = n + 1
        elif len(self.stacks) < MAX_STACKS:
            self.stacks[key] = 1
            for c in chain:
                self.codes[id(c)] = c
        else:
            self.other += 1

    def _at_exit(self) -> None:
        self.done.set()
        # The loop wakes on done and records its CPU; bounded, the worker is exiting.
        self.stopped.wait(0.25)
        self.write()

    def sampler_cpu_s(self) -> float | None:
        """The sampler thread's CPU since the burst began, whichever thread asks."""
        if self.cpu_s is not None:
            return self.cpu_s
        if self.native_id and threading.get_native_id() == self.native_id:
            return time.thread_time() - self.cpu0
        # Still running (it did not stop in time): its kernel counters, by native id.
        try:
            with open(f"/proc/self/task/{self.native_id}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            ticks = int(fields[11]) + int(fields[12])  # utime, stime
            return max(0.0, ticks / os.sysconf("SC_CLK_TCK") - self.cpu0)
        except (OSError, ValueError, IndexError):
            return None  # unknown, never another thread's figure

    def write(self) -> None:
        # The whole write under the lock: the exit finalizer and the sampler
        # thread may both get here, and the one that comes second must return
        # only once the file is in place (the worker exits right after).
        with self.wlock:
            if self.written:
                return
            self.written = True
            doc = self.document()
            path = result_path(rundir.runtime_dir(), self.gen, os.getpid())
            tmp = path + ".tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, separators=(",", ":"))
            os.replace(tmp, path)

    def document(self) -> dict:
        index: dict[int, int] = {}
        frames: list[list] = []
        stacks = []
        src: dict[str, str] = {}
        for key, n in list(self.stacks.items()):
            idx = []
            for cid in key[:-1]:
                i = index.get(cid)
                if i is None:
                    code = self.codes[cid]
                    i = index[cid] = len(frames)
                    name = qualnames.of_code(code)
                    frames.append([name, code.co_filename, code.co_firstlineno])
                idx.append(i)
            line = key[-1]
            if idx:
                k = f"{idx[-1]}:{line}"
                if k not in src:
                    text = linecache.getline(frames[idx[-1]][1], line).strip()
                    src[k] = text[:MAX_LINE_CHARS]
            stacks.append([n, idx, line])
        return {
            "pid": os.getpid(),
            "samples": self.samples,
            "in_fetch": self.in_fetch,
            "other": self.other,
            "wall_s": round(_clock() - self.t0, 3),
            "sampler_cpu_s": None if (cpu := self.sampler_cpu_s()) is None else round(cpu, 4),
            "frames": frames,
            "stacks": stacks,
            "src": src,
        }
