"""Replay: the selected loader serves batches it already produced, so the
training loop runs at the pace it would have if data cost nothing
(``dlwatch tune``'s ceiling trial; docs/tune.md).

Only ``overrides`` creates a ``Replay``, and only when ``DLWATCH_OVERRIDES``
asks for one: a normal run never gets here.

Phases: ``warm-up`` (``after_s`` after the loader's first batch: the loop's
own start-up, cold caches), ``caching`` (the next ``batches`` batches are
kept, as the loader returned them — pinned when it pins — until the byte
budget would be exceeded; at least one is kept), then ``replaying``: the
iterator that filled the cache returns the cached batches in turn without
asking its workers, which finish the batches already asked for and then sit
idle (never killed). Epochs keep their length (``len(loader)`` batches; an
IterableDataset without a length never ends), and a new ``iter(loader)``
returns the same iterator again, so no worker is spawned and no host-to-
device copy is skipped: what the loop does with a batch stays in the loop.

Each batch handed out is a fresh copy of its containers (dicts, lists,
tuples, named tuples) around the same tensors, so a loop that replaces an
entry (``batch["x"] = batch["x"].cuda()``) does not change what the next
replay of that batch holds. A loop that changes a CPU batch in place
(``x.sub_(mean)``) would change the cache itself, and every replay would
drift further (to denormals, which slow CPU arithmetic, and so the pace):
each tensor's version counter, which every in-place op bumps, tells. A NumPy
array has none (a ``collate_fn`` that returns NumPy, JAX-style; ``x /= 255``
on it, or on ``torch.from_numpy(x)``): 64 of its elements spread over it
stand in, which a whole-array change moves. Once a cached tensor's version
or an array's sample moves, the entries it touched are dropped, the rest
of the cache is made of copies the loop never sees, and each replay hands
out a copy of its entry (pinned where the entry is).

``status`` is a dict with a fixed set of keys, updated in place (the
publisher encodes it from another thread: its size never changes).
"""

from __future__ import annotations

import sys
import weakref
from time import perf_counter as _clock
from typing import Any

DEFAULT_BATCHES = 20
DEFAULT_MAX_BYTES = 1 << 30
DEFAULT_AFTER_S = 1.0


class Replay:
    def __init__(self, spec: dict, loader) -> None:
        self.batches = int(spec.get("batches", DEFAULT_BATCHES))
        self.max_bytes = int(spec.get("max_bytes", DEFAULT_MAX_BYTES))
        self.after_s = float(spec.get("after_s", DEFAULT_AFTER_S))
        self.cache: list[Any] = []
        # Per cache entry: its CPU tensors and NumPy arrays, each with what
        # tells an in-place change (``_token``) as cached.
        self.versions: list[list[tuple[Any, Any]]] = []
        # The loop changes batches in place: cache and hand out copies.
        self.copies = False
        self.pos = 0
        self.t_first: float | None = None
        self.it: Any = None  # the iterator that replays, once replaying
        self.attached = False  # an iterator of its loader has been routed through it
        self.epoch_len = _length(loader)
        self.status: dict[str, Any] = {
            "state": "warm-up",
            "batches_cached": 0,
            "bytes_cached": 0,
            "batches_wanted": self.batches,
            "max_bytes": self.max_bytes,
            "limited_by": None,
            "in_place": False,
        }

    @property
    def replaying(self) -> bool:
        return self.it is not None

    def move_to(self, loader) -> None:
        """Serve ``loader`` instead of the loader it was made for, which was
        never iterated (a framework iterates one it built over the same
        dataset): its epochs keep ``loader``'s length."""
        self.epoch_len = _length(loader)
        loader._dlw_replay = self

    def attach(self, it) -> None:
        """Route ``it``'s batches through the replay (once per iterator).

        The wrapper, kept on ``it``, holds ``it`` and this replay weakly: a
        strong hold would make a reference cycle, and an iterator in one is
        freed by the garbage collector, at whatever allocation in the loop
        sets it off (a worker forked later inherits the cycle too), not
        where the loop drops it. Dropped mid-epoch, its workers still up,
        their shutdown there waited torch's 5 s join timeout: a script that
        caps its steps per epoch and collects at each epoch's end took 5.15 s
        an epoch, not 0.16 s."""
        self.attached = True
        own = it.__dict__.get("_next_data")  # a wrapper already on this iterator, if any
        tag = getattr(own, "_dlw_replay", None)
        if tag is not None and tag() is self:
            return
        # The class's function (given ``it`` from the weak reference), or
        # the wrapper already there, bound as it was.
        cls_next = type(it)._next_data
        it_ref, rep_ref = weakref.ref(it), weakref.ref(self)

        def _next_data():
            me, rep = it_ref(), rep_ref()
            if rep is not None and me is not None and rep.it is me:
                return rep.serve(me)
            data = cls_next(me) if own is None else own()
            if rep is not None:
                try:
                    rep.observe(data, me)
                except Exception:
                    pass
            return data

        _next_data._dlw_replay = rep_ref  # type: ignore[attr-defined]
        it._next_data = _next_data

    def observe(self, data, it) -> None:
        if self.replaying:
            return
        now = _clock()
        if self.t_first is None:
            self.t_first = now
        if now - self.t_first < self.after_s:
            return
        st = self.status
        size = nbytes(data)
        self._drop_changed(range(len(self.cache)), keep_one=False)
        if self.cache and st["bytes_cached"] + size > self.max_bytes:
            st["limited_by"] = "max_bytes"
            self._start(it)
            return
        # The loop may replace entries of the batch it gets, or change it in place.
        entry = fresh(data, copy_cpu=self.copies)
        self.cache.append(entry)
        self.versions.append([] if self.copies else versions(entry))
        st["bytes_cached"] += size
        st["batches_cached"] = len(self.cache)
        st["state"] = "caching"
        if len(self.cache) >= self.batches:
            self._start(it)
        elif st["bytes_cached"] >= self.max_bytes:
            st["limited_by"] = "max_bytes"
            self._start(it)

    def _start(self, it) -> None:
        self.status["state"] = "replaying"
        self.it = it

    def serve(self, it):
        # Inside the job's next(): only StopIteration (the epoch's end) may leave here.
        if self.epoch_len is not None and getattr(it, "_num_yielded", 0) >= self.epoch_len:
            raise StopIteration
        if not self.copies:
            # The batch about to go out, and the last few that went (a loop
            # may hold one or two while it asks for the next).
            n = len(self.cache)
            self._drop_changed({(self.pos - k) % n for k in range(4)}, keep_one=True)
        data = self.cache[self.pos % len(self.cache)]
        self.pos = (self.pos + 1) % len(self.cache)
        return fresh(data, copy_cpu=self.copies)

    def _drop_changed(self, which, keep_one: bool) -> None:
        """Drop the cache entries the loop changed in place and switch to
        copies. While replaying one entry is kept, changed or not: the loop
        must get a batch."""
        try:
            vs = self.versions

            def moved(i: int) -> bool:
                return any(_token(t) != v for t, v in vs[i])

            if not any(moved(i) for i in which):
                return
            changed = [i for i in range(len(vs)) if moved(i)]
        except Exception:
            return  # a tensor without a version counter (inference mode): leave it
        self.copies = True
        self.status["in_place"] = True
        keep = [i for i in range(len(self.cache)) if i not in changed]
        if not keep and keep_one:
            keep = [changed[-1]]
        self.cache = [self.cache[i] for i in keep]
        self.cache = [fresh(e, copy_cpu=True) for e in self.cache]  # unchanged so far: copy them now
        self.versions = [[] for _ in self.cache]
        st = self.status
        st["batches_cached"] = len(self.cache)
        st["bytes_cached"] = sum(nbytes(e) for e in self.cache)
        self.pos = self.pos % len(self.cache) if self.cache else 0

    def new_epoch(self) -> object:
        """The replaying iterator, ready for another epoch (what ``iter(loader)`` returns)."""
        it = self.it
        it._num_yielded = 0
        st = getattr(it, "_dlw_stats", None)
        if st is not None:
            st.begin_epoch(it, _clock())
        return it


def _length(loader) -> int | None:
    try:
        return int(len(loader))
    except Exception:
        return None


def nbytes(obj, _depth: int = 0) -> int:
    """Bytes of the tensors (and arrays, bytes, strings) in a batch."""
    if _depth > 16:
        return 0
    if isinstance(obj, dict):
        return sum(nbytes(v, _depth + 1) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes(v, _depth + 1) for v in obj)
    if isinstance(obj, (bytes, bytearray, str)):
        return len(obj)
    try:
        return int(obj.element_size() * obj.nelement())  # a tensor
    except Exception:
        pass
    n = getattr(obj, "nbytes", None)  # a numpy array
    return n if isinstance(n, int) else 0


def fresh(obj, _depth: int = 0, copy_cpu: bool = False):
    """``obj`` with new containers around the same leaves (falls back to the
    object itself for containers it cannot rebuild). A leaf already on the
    GPU is copied there: ``.to('cuda')`` makes no copy of it, so a loop that
    changes its batch in place (``x.sub_(mean)``) would change the cached
    batch too, and every replay would drift further. With ``copy_cpu``, CPU
    tensors are copied too, pinned where the original is (the loop's
    ``.cuda(non_blocking=True)`` then costs what it cost on the original)."""
    if _depth > 16:
        return obj
    try:
        if getattr(obj, "is_cuda", False) is True:
            return obj.clone()  # on the device, asynchronous: nothing waits
        if copy_cpu and _is_cpu_tensor(obj):
            return _copy_cpu(obj)
        if copy_cpu and _is_ndarray(obj):
            return obj.copy()
        d = _depth + 1
        if type(obj) is dict:
            return {k: fresh(v, d, copy_cpu) for k, v in obj.items()}
        if type(obj) is list:
            return [fresh(v, d, copy_cpu) for v in obj]
        if type(obj) is tuple:
            return tuple(fresh(v, d, copy_cpu) for v in obj)
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(fresh(v, d, copy_cpu) for v in obj))
        if isinstance(obj, dict):
            out = obj.copy()
            for k, v in obj.items():
                out[k] = fresh(v, d, copy_cpu)
            return out
    except Exception:
        return obj
    return obj


def _is_cpu_tensor(obj) -> bool:
    return getattr(getattr(obj, "device", None), "type", None) == "cpu" and hasattr(obj, "_version")


def _is_ndarray(obj) -> bool:
    np = sys.modules.get("numpy")  # a batch of arrays means numpy is imported
    return np is not None and isinstance(obj, np.ndarray)


# Elements of a NumPy array read to tell an in-place change (it has no version
# counter): spread over the whole array, so ``x /= 255`` or ``x -= mean`` move them.
ARRAY_SAMPLE = 64


def _token(obj) -> Any:
    """What tells whether the loop changed a leaf in place since: a CPU
    tensor's version counter, a NumPy array's sampled bytes."""
    if _is_ndarray(obj):
        n = obj.size
        if n == 0:
            return b""
        step = max(1, n // ARRAY_SAMPLE)
        return obj.flat[0:n:step].tobytes()  # a copy of the sample only, whatever the layout
    return int(obj._version)


def _copy_cpu(t):
    try:
        pinned = bool(t.is_pinned())
    except Exception:
        pinned = False
    if not pinned:
        return t.clone()
    import torch

    out = torch.empty_like(t, pin_memory=True)
    out.copy_(t)
    return out


def versions(obj, _depth: int = 0) -> list[tuple[Any, Any]]:
    """The CPU tensors and NumPy arrays in a batch, each with its ``_token``
    (a tensor's version counter, which every in-place op bumps; an array's
    sampled bytes), to tell later whether the loop changed them. Empty where
    a tensor has no counter (inference mode)."""
    out: list[tuple[Any, Any]] = []
    if _depth > 16:
        return out
    try:
        if _is_cpu_tensor(obj) or _is_ndarray(obj):
            return [(obj, _token(obj))]
        if isinstance(obj, dict):
            for v in obj.values():
                out.extend(versions(v, _depth + 1))
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                out.extend(versions(v, _depth + 1))
    except Exception:
        return []
    return out
