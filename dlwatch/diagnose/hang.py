"""Reading a hung job's stacks: where each process is blocked, and on what.

Pure: a stacks document (``probe/stack_request.py``: the trainer's threads
and each DataLoader worker's, frames outermost first as ``[function, file,
line]``, the innermost line's source in ``src``) in, plain figures out. The
live view, ``dlwatch stacks`` and the ``loader-stalled`` hint read the same
summary.

The frame that blocks is the innermost one; when that is in the standard
library or torch (a ``Condition.wait``, a queue's ``get``), the innermost
frame of the user's own code is named beside it: that is the line to read.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from typing import Any

# What a thread waits on, told from its innermost frames. Order matters: a
# DataLoader worker idle in its index queue is "idle", not "queue".
IDLE, QUEUE, LOCK, IO, COLLECTIVE, BARRIER, SLEEP, NATIVE, RUNNING = (
    "idle",
    "data-queue",
    "lock",
    "io",
    "collective",
    "barrier",
    "sleep",
    "native",
    "running",
)
# A thread whose Python frame is a plain call (no wait the frames name) but
# that is off the CPU is blocked inside that call's C code (a native lock, an
# OpenMP pool, a C library's read), not running: at most this much of a core
# over the sample (py-spy's "idle", or /proc's state S/D with its CPU time).
NATIVE_CPU_MAX = 5.0
# /proc states (and psutil's names for them) of a thread that is not running.
_OFF_CPU_STATES = frozenset({"S", "D", "I", "sleeping", "disk-sleep", "idle"})

# ``with self._lock:``, ``with store_lock:``, ``with self._rlock:``: "_"
# is a word character, so a plain \block\b missed the commonest idioms (a QA
# run read a worker on a Python lock as "blocked in C").
_LOCK_SRC = re.compile(
    r"\.acquire\(|\bwith\b[^:]*(?:\b|_)(?:r?lock|mutex|sem|semaphore)\b|\block\b[^=]*\.acquire|semaphore|\.wait\(",
    re.I,
)
_IO_SRC = re.compile(
    r"\bopen\(|\.read(?:line|lines|into|_bytes|_text)?\(|\.recv(?:_into|from)?\(|\.accept\(|"
    r"\.connect\(|select\(|\.poll\(|urlopen|requests\.|\.get_object\(|\.download|os\.read\(|\.load\("
)
_IO_FILES = ("socket.py", "ssl.py", "selectors.py", "subprocess.py", "http/client.py", "urllib/request.py")
# Libraries whose frames near the top of a stack are a read (remote stores,
# shard readers): a thread blocked there waits on I/O.
_IO_LIBS = (
    "/fsspec/",
    "/webdataset/",
    "/urllib3/",
    "/requests/",
    "/botocore/",
    "/s3fs/",
    "/gcsfs/",
    "/aiohttp/",
)
_LOCK_FUNCS = {"acquire", "_acquire_restore", "_wait_for_tstate_lock", "join"}
# A pipeline worker's own loop, waiting between items when it is the
# innermost frame outside the standard library (a queue's get or put below
# it): torchdata.nodes' ``_apply_udf`` (thread or process, waiting for an
# index or for room to hand its item over), Grain's mp_prefetch worker
# (``add_element_to_queue``: its buffer is full; the loop itself, asleep
# once its source is exhausted). A QA run read an idle nodes process worker,
# in a multiprocessing queue's poll, as "blocked in I/O".
_PIPELINE_IDLE = (
    ("_apply_udf", "/torchdata/nodes/"),
    ("add_element_to_queue", "/grain/"),
    ("_put_dataset_elements_in_buffer", "/grain/"),
)


def _where(path: str) -> str:
    """'stdlib', 'torch', 'dlwatch' or 'user' for a frame's file."""
    p = path.replace("\\", "/")
    if "/torch/" in p:
        return "torch"
    if "/dlwatch/" in p and "/tests/" not in p:
        return "dlwatch"
    if "site-packages/" in p or "dist-packages/" in p:
        return "library"
    if re.search(r"/lib/python3\.\d+/", p) or p.startswith("<frozen"):
        return "stdlib"
    return "user"


def _frames(thread: Mapping[str, Any]) -> list[list[Any]]:
    out = []
    for f in thread.get("frames") or []:
        if isinstance(f, (list, tuple)) and len(f) >= 3:
            out.append([str(f[0]), str(f[1]), int(f[2]) if isinstance(f[2], int) else 0])
    return out


def frame_text(f: Sequence[Any]) -> str:
    return f"{f[0]}, {os.path.basename(str(f[1]))}:{f[2]}"


def off_cpu(thread: Mapping[str, Any]) -> bool:
    """Whether the thread was seen off the CPU: py-spy called it idle, or
    /proc says it sleeps and it used under ``NATIVE_CPU_MAX`` % of a core."""
    if thread.get("active") is False:
        return True
    cpu = thread.get("cpu_percent")
    return thread.get("state") in _OFF_CPU_STATES and isinstance(cpu, (int, float)) and cpu < NATIVE_CPU_MAX


def _is_barrier(frames: list[list[Any]]) -> bool:
    """A barrier's wait (``threading.Barrier``, ``multiprocessing``'s, a
    library's shared barrier) among the innermost frames."""
    for f in frames[-10:]:
        if "barrier" in f[0].lower() or "barrier" in os.path.basename(f[1]).lower():
            return True
    return False


def wait_kind(thread: Mapping[str, Any], role: str = "trainer") -> str:
    """What ``thread`` is waiting on, from its innermost frames and source,
    and (``native``) whether a plain call is blocked off the CPU."""
    kind = frame_kind(thread, role)
    if kind == RUNNING and _frames(thread) and off_cpu(thread):
        return NATIVE
    return kind


def frame_kind(thread: Mapping[str, Any], role: str = "trainer") -> str:
    """What the frames alone say the thread waits on (no CPU or state)."""
    frames = _frames(thread)
    if not frames:
        return RUNNING
    names = [f[0].rsplit(".", 1)[-1] for f in frames]
    files = [f[1].replace("\\", "/") for f in frames]
    leaf_name, leaf_file = names[-1], files[-1]
    src = str(thread.get("src") or "")
    if role == "worker" and "_worker_loop" in names and "fetch" not in names:
        return IDLE  # between tasks, waiting for an index
    if _pipeline_idle(frames):
        return IDLE
    if any("/torch/distributed/" in p for p in files[-6:]):
        return COLLECTIVE
    if _is_barrier(frames):
        return BARRIER
    if any(n in ("_try_get_data", "_get_data") for n in names[-12:]):
        return QUEUE
    if any(n == "get" and p.endswith("/queue.py") for n, p in zip(names[-4:], files[-4:])):
        # queue.Queue.get: waiting for an item (a batch a feeder thread puts),
        # not a lock of the user's (a QA run: "blocked on a lock in
        # Condition.wait" for every thread-fed loop).
        return QUEUE
    if any(n == "get" and p.endswith("/multiprocessing/queues.py") for n, p in zip(names[-8:], files[-8:])):
        # A multiprocessing queue's get(): waiting for an item another
        # process puts (a QA run: a worker waiting for an end-of-data
        # sentinel read as "blocked in C" in Connection._recv).
        return QUEUE
    if leaf_name == "sleep" or "time.sleep(" in src:
        return SLEEP
    if leaf_file.endswith("threading.py") and leaf_name in _LOCK_FUNCS | {"wait"}:
        return LOCK
    if any(leaf_file.endswith(s) for s in _IO_FILES) or _IO_SRC.search(src):
        return IO
    if _library_read(frames):
        return IO
    if _LOCK_SRC.search(src):
        return LOCK
    return RUNNING


# webdataset's own modules that decode or transform, not read: a QA run's
# worker decoding JPEGs under its autodecode read "blocked in I/O".
_NOT_READING = ("/webdataset/autodecode.py", "/webdataset/filters.py", "/webdataset/compat.py")


def _library_read(frames: list[list[Any]]) -> bool:
    """The innermost frame outside the standard library belongs to a
    library that reads (``_IO_LIBS``): decoding a shard's JPEG with PIL
    under webdataset is PIL's work, not a read."""
    for f in reversed(frames[-6:]):
        path = f[1].replace("\\", "/")
        if _where(path) == "stdlib":
            continue
        return any(lib in path for lib in _IO_LIBS) and not path.endswith(_NOT_READING)
    return False


def _pipeline_idle(frames: list[list[Any]]) -> bool:
    """The innermost frame outside the standard library is a pipeline
    worker's own loop (``_PIPELINE_IDLE``): it waits on its queues."""
    for f in reversed(frames):
        if _where(f[1]) == "stdlib":
            continue
        path = f[1].replace("\\", "/")
        name = f[0].rsplit(".", 1)[-1]
        return any(name == fn and lib in path for fn, lib in _PIPELINE_IDLE)
    return False


def blocked_at(thread: Mapping[str, Any]) -> dict[str, Any] | None:
    """The innermost frame, and the innermost of the user's own code when
    that is a different one (``user``)."""
    frames = _frames(thread)
    if not frames:
        return None
    leaf = frames[-1]
    out: dict[str, Any] = {
        "function": leaf[0],
        "file": leaf[1],
        "line": leaf[2],
        "src": str(thread.get("src") or "")[:160],
        "text": frame_text(leaf),
    }
    if _where(leaf[1]) != "user":
        for f in reversed(frames[:-1]):
            if _where(f[1]) == "user":
                out["user"] = {"function": f[0], "file": f[1], "line": f[2], "text": frame_text(f)}
                break
    item = item_text(thread.get("item"))
    if item:
        out["item"] = item
    return out


def item_text(item: Any) -> str:
    """ "at sample 37 of a batch of 32 (indices 32…63)": what the fetch was
    on (probe/thread_stacks.py reads it); "" when not read."""
    if not isinstance(item, Mapping):
        return ""
    idx, batch = item.get("index"), item.get("batch")
    out = f"at sample {idx}" if type(idx) is int else ""
    if isinstance(batch, list) and len(batch) == 3 and all(type(x) is int for x in batch):
        first, last, n = batch
        if n <= 1:
            span = f"a batch of index {first}"
        elif item.get("batch_contiguous") is True:
            span = f"a batch of {n} (indices {first}…{last})"
        else:
            # A shuffled batch: "indices 426…2109" read as a range that did
            # not hold its own sample 4163.
            span = f"a batch of {n} (shuffled indices, the first {first})"
        out = f"{out} of {span}" if out else f"at {span}"
    return out


_VERB = {
    IDLE: "idle, waiting for work",
    QUEUE: "waiting for a batch",
    LOCK: "blocked on a lock",
    IO: "blocked in I/O",
    COLLECTIVE: "waiting in a collective",
    BARRIER: "waiting at a barrier",
    SLEEP: "sleeping",
    NATIVE: "blocked in C",
    RUNNING: "in",
}


def _native_note(thread: Mapping[str, Any]) -> str:
    """ "(0 % CPU, sleeping)": what says a thread is blocked in C."""
    bits = []
    cpu = thread.get("cpu_percent")
    if isinstance(cpu, (int, float)):
        bits.append(f"{cpu:.0f} % CPU")
    state = thread.get("state")
    if state in ("S", "sleeping", "I", "idle"):
        bits.append("sleeping")
    elif state in ("D", "disk-sleep"):
        bits.append("in uninterruptible sleep")
    elif thread.get("active") is False:
        bits.append("idle to py-spy")
    return f" ({', '.join(bits)})" if bits else ""


def thread_line(thread: Mapping[str, Any], role: str = "trainer") -> str:
    kind = wait_kind(thread, role)
    at = blocked_at(thread)
    if at is None:
        return "no Python frame"
    where = at["text"]
    if "user" in at:
        where += f" (from {at['user']['text']})"
    if "item" in at:
        where += f", {at['item']}"
    if kind == RUNNING:
        return f"in {where}"
    if kind == IDLE:
        return _VERB[IDLE]
    if kind == NATIVE:
        return f"{_VERB[kind]}{_native_note(thread)} in {where}"
    if kind == IO and _on_cpu(thread):
        # A read served by the page cache, or a decoder behind a read call,
        # runs: "blocked in I/O" beside a hint that called the same threads
        # CPU-bound read as a contradiction (a QA run, cached JPEGs).
        return f"reading, on a CPU{_native_note(thread)}, in {where}"
    return f"{_VERB[kind]} in {where}"


# A thread in a read call using this much of a core, or running, is not
# waiting on storage at that instant.
READ_ON_CPU_MIN = 50.0


def _on_cpu(thread: Mapping[str, Any]) -> bool:
    cpu = thread.get("cpu_percent")
    if isinstance(cpu, (int, float)):
        return cpu >= READ_ON_CPU_MIN
    return thread.get("state") in ("R", "running")


def main_thread(proc: Mapping[str, Any]) -> Mapping[str, Any] | None:
    threads = [t for t in proc.get("threads") or [] if isinstance(t, dict)]
    for t in threads:
        if t.get("main"):
            return t
    return threads[0] if threads else None


def is_pin_thread(t: Mapping[str, Any]) -> bool:
    """The DataLoader's pin-memory thread (CUDA jobs with pin_memory=True).
    "pt_data_pin" is only its OS name; Python knows it as "Thread-N
    (_pin_memory_loop)", and its frames say so whatever its name."""
    name = str(t.get("name") or t.get("thread") or "")
    if name == "pt_data_pin" or "_pin_memory_loop" in name:
        return True
    return any(f[0] == "_pin_memory_loop" for f in _frames(t))


def _notable(t: Any) -> bool:
    """A trainer thread worth a line: the pin-memory thread, and threads
    running code of the user's (not multiprocessing's queue feeders)."""
    if not isinstance(t, dict):
        return False
    return is_pin_thread(t) or any(_where(f[1]) == "user" for f in _frames(t))


def process_name(proc: Mapping[str, Any]) -> str:
    pid = proc.get("pid")
    if proc.get("role") == "worker":
        return f"worker {proc.get('worker_id')} (pid {pid})"
    return f"trainer (pid {pid})"


# Said before the stack of a thread /proc reads stopped ("T": SIGSTOP, ctrl-Z,
# a debugger; not "t", py-spy's own instant).
STOPPED_NOTE = "stopped (SIGSTOP or a debugger); where it stopped: "


def summarize(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One entry per process (and per notable trainer thread: the
    pin-memory thread and any the user started), with its one line."""
    out: list[dict[str, Any]] = []
    for proc in doc.get("processes") or []:
        if not isinstance(proc, dict):
            continue
        role = str(proc.get("role") or "trainer")
        name = process_name(proc)
        base = {
            "role": role,
            "pid": proc.get("pid"),
            "worker_id": proc.get("worker_id"),
            "loader_id": proc.get("loader_id"),
            "in_fetch_s": proc.get("in_fetch_s"),
        }
        if proc.get("via"):
            base["via"] = proc["via"]
        if _has_threads(proc):
            # Every Python thread of the process, by name: what fork left
            # behind (a worker with its MainThread alone, a trainer running
            # an executor's or an event loop's threads).
            alive = [t for t in proc.get("threads") or [] if isinstance(t, dict)]
            base["thread_names"] = [str(t.get("name") or "?") for t in alive][:32]
            pools = [str(t.get("name") or "?") for t in alive if _runs_executor(t)]
            if pools:
                base["executor_threads"] = pools[:32]
        if not _has_threads(proc):
            why = proc.get("error") or "no Python thread"
            out.append({**base, "thread": None, "kind": None, "at": None, "line": f"{name}: {why}"})
            continue
        main = main_thread(proc)
        threads = [main] if main is not None else []
        if role == "trainer":
            threads += [t for t in proc.get("threads") or [] if t is not main and _notable(t)]
        elif main is not None and _awaits_future(main):
            # A pipeline's worker process whose main thread waits for a
            # thread pool's result (Grain's ReadOptions threads inside an
            # mp_prefetch worker): the thread that runs the user's code is
            # where the worker is (a QA run: "blocked on a lock in
            # Condition.wait" for a worker whose thread slept in the map).
            busy = [t for t in proc.get("threads") or [] if t is not main and _notable(t)]
            threads = busy[:1] or threads
        for t in threads:
            tname = str(t.get("name") or "?")
            label = name if t is main else f"{name} thread {tname}"
            if role == "trainer" and t is main:
                label = f"main thread (pid {proc.get('pid')})"
            line = thread_line(t, role)
            if t.get("state") == "T":
                # Its stack is where it stopped: "idle, waiting for work" read
                # as a worker with nothing to do (a QA run, kill -STOP).
                line = f"{STOPPED_NOTE}{line}"
            out.append(
                {
                    **base,
                    "thread": tname,
                    "tid": t.get("tid"),
                    "kind": wait_kind(t, role),
                    "at": blocked_at(t),
                    "line": f"{label}: {line}",
                    "awaits_future": _awaits_future(t),
                    "forked_child": _forked_child(t),
                }
            )
    return out


def _awaits_future(t: Mapping[str, Any]) -> bool:
    """The thread waits in a ``concurrent.futures`` result."""
    return any(
        f[0].rsplit(".", 1)[-1] == "result" and "concurrent/futures" in f[1].replace("\\", "/")
        for f in _frames(t)[-4:]
    )


def _forked_child(t: Mapping[str, Any]) -> bool:
    """The thread is the main thread of a process that multiprocessing
    forked from a Python parent (``Popen._launch`` in ``popen_fork.py``, then
    ``BaseProcess._bootstrap``): it runs with whatever the parent had."""
    return any(
        f[0].rsplit(".", 1)[-1] == "_launch"
        and f[1].replace("\\", "/").endswith("multiprocessing/popen_fork.py")
        for f in _frames(t)
    )


def _runs_executor(t: Mapping[str, Any]) -> bool:
    """A thread of a ``concurrent.futures`` pool or an asyncio event loop:
    what completes the futures other threads wait for."""
    for f in _frames(t):
        name, path = f[0].rsplit(".", 1)[-1], f[1].replace("\\", "/")
        if (name == "_worker" and path.endswith("concurrent/futures/thread.py")) or (
            name == "run_forever" and "/asyncio/" in path
        ):
            return True
    return False


def _has_threads(proc: Mapping[str, Any]) -> bool:
    """The stacks (the job's, or py-spy's read from outside) come before any
    error: a process py-spy could read is described by its threads."""
    return any(isinstance(t, dict) for t in proc.get("threads") or [])


def lines(doc: Mapping[str, Any]) -> list[str]:
    return [s["line"] for s in summarize(doc)]


def render(doc: Mapping[str, Any], full: bool = True) -> list[str]:
    """Text: the one-line summary, then (``full``) every thread's stack,
    innermost last, as ``py-spy dump`` and tracebacks print them."""
    out = [*lines(doc)]
    if not full:
        return out
    for proc in doc.get("processes") or []:
        if not isinstance(proc, dict) or not _has_threads(proc):
            continue
        out.append("")
        via = " (read by py-spy from outside)" if proc.get("via") == "py-spy" else ""
        out.append(f"== {process_name(proc)}{via}")
        for t in proc.get("threads") or []:
            if not isinstance(t, dict):
                continue
            flag = " (main)" if t.get("main") else ""
            how = _native_note(t) if wait_kind(t, str(proc.get("role") or "trainer")) == NATIVE else ""
            out.append(f"  thread {t.get('name')}{flag}{how}:")
            for f in _frames(t):
                out.append(f"    {f[0]} ({f[1]}:{f[2]})")
            if t.get("src"):
                out.append(f"      > {t['src']}")
    return out


def _gib(n: Any) -> str:
    return f"{n / 2**30:.1f}" if isinstance(n, (int, float)) and n >= 2**28 else f"{(n or 0) / 2**20:.0f} Mi"


def _span(s: Any) -> str:
    if not isinstance(s, (int, float)):
        return ""
    return f" in {s / 60:.0f} min" if s >= 90 else f" in {s:.0f} s"


def death_cause(d: Mapping[str, Any]) -> str:
    """ "oom", "shm", "segfault", "exception", "signal", "exit" or "unknown":
    what the record shows. A SIGKILL is the OOM killer's when the cgroup
    counted a kill since the job was first seen; a full /dev/shm shows as
    torch's "unable to allocate shared memory" / "No space left" in the
    worker, or as SIGBUS (a write past what tmpfs could back)."""
    exc = str(d.get("exception") or "")
    sig = d.get("signal")
    kills, at_start = d.get("oom_kills"), d.get("oom_kills_at_start")
    if sig == "SIGKILL" and isinstance(kills, int) and kills > (at_start if isinstance(at_start, int) else 0):
        return "oom"
    if sig == "SIGBUS" or re.search(r"shared memory|/dev/shm|\bshm\b|No space left on device", exc):
        return "shm"
    if sig == "SIGSEGV":
        return "segfault"
    if exc:
        return "exception"
    if sig:
        return "signal"
    return "exit" if d.get("exit_code") is not None else "unknown"


_CAUSE_NOTE = {
    "oom": "the OOM killer (memory limit)",
    "shm": "/dev/shm is full: enlarge it (docker --shm-size) or lower num_workers × prefetch_factor",
}


def death_line(d: Mapping[str, Any]) -> str:
    """One line for a worker that died: how, the cgroup's OOM kills, its RSS.

    "worker 2 (pid 4712) was killed by SIGKILL; the cgroup counted 1 OOM
    kill; its RSS grew 1.2 → 7.8 GiB in 4 min"."""
    who = f"worker {d.get('id') if d.get('id') is not None else '?'} (pid {d.get('pid')})"
    if d.get("signal"):
        how = f"was killed by {d['signal']}"
    elif d.get("exception"):
        how = f"raised {d['exception']}"
    elif d.get("exit_code") is not None:
        how = f"exited with code {d['exit_code']}"
    else:
        how = "died (how is not known: not our child)"
    parts = [f"{who} {how}"]
    kills, at_start = d.get("oom_kills"), d.get("oom_kills_at_start")
    # A worker's own exception weighs no OOM count (a QA run: "raised
    # ValueError …; the cgroup counted 0 OOM kills").
    if not d.get("exception") or d.get("signal"):
        if isinstance(kills, int):
            n = kills - at_start if isinstance(at_start, int) and kills >= at_start else kills
            since = " since dlwatch first saw the job" if isinstance(at_start, int) else ""
            parts.append(f"the cgroup counted {n} OOM kill{'s' if n != 1 else ''}{since}")
        elif d.get("oom_kills_reason"):
            parts.append(f"OOM kills n/a: {d['oom_kills_reason']}")
    first, last = d.get("rss_first_bytes"), d.get("rss_last_bytes")
    # A worker that raised lives on (torch catches its fetch's exception):
    # its memory says nothing of why.
    raised_only = d.get("exception") and not d.get("signal") and d.get("exit_code") in (None, 0)
    if isinstance(first, int) and isinstance(last, int) and not raised_only:
        unit = "GiB" if max(first, last) >= 2**28 else "MiB"
        a, b = _gib(first).removesuffix(" Mi"), _gib(last).removesuffix(" Mi")
        verb = "grew" if last > first * 1.05 else "was"
        rng = f"{a} → {b}" if verb == "grew" else b
        parts.append(f"its RSS {verb} {rng} {unit}{_span(d.get('rss_span_s')) if verb == 'grew' else ''}")
    note = _CAUSE_NOTE.get(death_cause(d))
    if (
        note
        and d.get("signal") == "SIGBUS"
        and not re.search(r"shared memory|/dev/shm|No space", str(d.get("exception")))
    ):
        # A SIGBUS alone is a write past what a mapping could back: most
        # often /dev/shm, not certainly (a QA run: "/dev/shm is full" beside
        # 23.5 GiB free, the kill sent by hand).
        note = (
            "a SIGBUS is most often /dev/shm running out: enlarge it (docker --shm-size) or lower "
            "num_workers × prefetch_factor"
        )
    if note:
        parts.append(note)
    return "; ".join(parts)


def stall_line(ld: Mapping[str, Any]) -> str | None:
    """ "STALLED: no batch for 42 s (threshold 10 s), inside next()", or None."""
    s = ld.get("stalled_s")
    if not isinstance(s, (int, float)):
        return None
    thr = ld.get("stall_threshold_s")
    where = "inside next()" if ld.get("in_next") else "the loop outside the loader"
    t = f" (threshold {thr:.0f} s)" if isinstance(thr, (int, float)) else ""
    return f"STALLED: no batch for {s:.0f} s{t}, {where}"
