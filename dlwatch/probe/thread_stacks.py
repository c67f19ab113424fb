"""The Python stacks of this process's threads, read from inside it.

``sys._current_frames()`` is the interpreter's own table of each thread's
innermost frame: reading it from another thread of the same process needs no
ptrace, no signal and no cooperation from the thread that is stuck, only the
GIL for the few microseconds the walk takes. A thread blocked in a read, a
lock or a queue has released the GIL, so it is seen where it blocks; a thread
that holds the GIL inside a C call delays the read until that call returns
(py-spy, from outside, does not have that limit).

Bounded: at most ``MAX_THREADS`` threads and the innermost ``MAX_FRAMES``
frames of each; dlwatch's own threads are left out. Used by the trainer's
publisher (its own threads) and by a DataLoader worker's stack watcher
(``worker_watch.py``). Stdlib only.
"""

from __future__ import annotations

import linecache
import sys
import threading
from types import FrameType
from typing import Any

from dlwatch import qualnames

MAX_THREADS = 64
MAX_FRAMES = 48
MAX_SRC_CHARS = 160
# Our threads (publisher, worker sampler, stack watcher) are not the job's.
OWN_PREFIX = "dlwatch-"


_FETCH_FILE = ("_utils/fetch.py", "_utils\\fetch.py")
_BATCH_MAX = 1 << 20
_CONTIGUOUS_MAX = 1 << 16  # indices checked one by one, at a stall only


def _read_item(f: FrameType, item: dict[str, Any]) -> None:
    """What the fetch in ``f`` is on, into ``item``: a dataset's
    ``__getitem__`` index (its first argument, an int) and the indices of
    torch's fetch (``possibly_batched_index``: first, last, count). Where a
    fetch hangs, the sample is what a user looks at first (a new user's
    stall named the frame, not the sample). The innermost of each."""
    code = f.f_code
    try:
        if "index" not in item and code.co_name == "__getitem__" and code.co_argcount >= 2:
            v = f.f_locals.get(code.co_varnames[1])
            if isinstance(v, int) and not isinstance(v, bool):
                item["index"] = v
        elif "batch" not in item and code.co_name == "fetch" and code.co_filename.endswith(_FETCH_FILE):
            v = f.f_locals.get("possibly_batched_index")
            if isinstance(v, list) and 0 < len(v) <= _BATCH_MAX:
                first, last = v[0], v[-1]
                if type(first) is int and type(last) is int:
                    item["batch"] = [first, last, len(v)]
                    # A sequential sampler's batch is a range; a shuffled one's
                    # first and last say nothing of the rest.
                    item["batch_contiguous"] = len(v) <= _CONTIGUOUS_MAX and all(
                        type(b) is int and b - a == 1 for a, b in zip(v, v[1:])
                    )
    except Exception:
        pass  # a frame whose locals cannot be read says nothing of its item


def capture() -> list[dict]:
    """Every thread but ours: name, whether it is the main thread, daemon,
    frames outermost first as ``[function, file, line]``, and the source
    text of the innermost line (``src``)."""
    frames = sys._current_frames()
    # A frame's locals are read only with no tracer set: under one (a
    # debugger, coverage), CPython before 3.13 writes a frame's locals back
    # from the dict a read fills, which another thread's read can make stale.
    readable = sys.gettrace() is None and threading.gettrace() is None
    by_ident = {t.ident: t for t in threading.enumerate()}
    main_ident = threading.main_thread().ident
    out: list[dict] = []
    for ident, top in frames.items():
        t = by_ident.get(ident)
        name = t.name if t is not None else f"thread {ident}"
        if name.startswith(OWN_PREFIX):
            continue
        chain: list[list[Any]] = []
        f: FrameType | None = top
        leaf: tuple[str, int] | None = None
        item: dict[str, Any] = {}
        while f is not None and len(chain) < MAX_FRAMES:
            code = f.f_code
            if leaf is None:
                leaf = (code.co_filename, f.f_lineno or 0)
            chain.append([qualnames.of_code(code), code.co_filename, f.f_lineno or 0])
            if readable:
                _read_item(f, item)
            f = f.f_back
        chain.reverse()
        src = linecache.getline(leaf[0], leaf[1]).strip()[:MAX_SRC_CHARS] if leaf else ""
        native = getattr(t, "native_id", None) if t is not None else None
        out.append(
            {
                "name": name[:80],
                # The OS thread id: a monitor reads the thread's /proc state
                # and CPU by it (a call blocked in C sleeps at 0 % CPU).
                "tid": native if isinstance(native, int) else None,
                "main": ident == main_ident,
                "daemon": bool(t.daemon) if t is not None else None,
                "frames": chain,
                "truncated": f is not None,
                "src": src,
                **({"item": item} if item else {}),
            }
        )
        if len(out) >= MAX_THREADS:
            break
    out.sort(key=lambda th: (not th["main"], th["name"]))
    return out
