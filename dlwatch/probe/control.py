"""The control requests a monitor may send on the job's socket.

The publisher owns the socket and the uid check; once a client has said
hello, whatever else it sends comes here. Today that is a profiler burst of
the training loop (``profile``, ``profiler.py``). One burst runs at a time
per job; the monitor that asked gets its progress and result, and hanging up
cancels it. And a worker profile burst (``worker_profile``,
``worker_burst.py``): the busiest loader's worker processes sample their own
fetches for a few seconds. One burst of either kind at a time. Called on the
publisher's thread only.
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol

from dlwatch import wire
from dlwatch.probe import loop_follow, patches, profiler, stack_request, worker_burst


class Sender(Protocol):
    """What Control needs of the publisher that owns it (probe/publisher.py):
    named here, so that this module does not import the one that imports it."""

    directory: str | None

    def queue(self, c: Any, data: bytes) -> None: ...

    def broadcast(self, data: bytes, skip: Any = None, skip_all: Iterable[Any] = ()) -> None: ...

    def connected(self, c: Any) -> bool: ...

    def recent_batches(self) -> deque[dict[int, int]]: ...


class Control:
    def __init__(self, pub: Sender) -> None:
        self.pub = pub
        self._burst: profiler.Burst | None = None
        self._client: Any = None  # the publisher's _Client that asked
        self._wburst: worker_burst.WorkerBurst | None = None
        self._wclient: Any = None
        # The last worker profile's answer, for every monitor (live views,
        # recorders: the hints and reports quote it), new ones included.
        self._last_wprofile: bytes | None = None
        # Stacks (stack_request.py): the gathering in progress, the clients
        # that asked for it, and the last answer (every monitor gets it).
        self._stacks: stack_request.StackGather | None = None
        self._sclients: list[Any] = []
        self._last_stacks: bytes | None = None
        # Loaders that stalled while a gathering was in progress: theirs follows.
        self._stalls_next: dict[Any, dict] = {}

    def replay(self) -> list[bytes]:
        """What a newly greeted client gets after the history."""
        return [m for m in (self._last_wprofile, self._last_stacks) if m is not None]

    def features(self) -> list[str]:
        """What the hello announces."""
        profiling = [wire.FEATURE_PROFILE, wire.FEATURE_WORKER_PROFILE] if profiler.enabled() else []
        return [*profiling, wire.FEATURE_STACKS, wire.FEATURE_LAST_FRAME]

    def on_request(self, c, msg: dict) -> None:
        """A message from a greeted client; anything unknown is ignored."""
        kind = msg.get("type")
        if kind == "stacks":
            self._on_stacks(c)
            return
        if kind not in ("profile", "worker_profile"):
            return
        if not profiler.enabled():
            self._answer(
                c, "unsupported", "profiling is disabled in this job (it was started with DLWATCH_PROFILE=0)"
            )
            return
        busy = self._busy()
        if busy:
            self._answer(c, "busy", f"{busy}; try again when it is done")
        elif kind == "profile":
            self._on_profile(c, msg)
        else:
            self._on_worker_profile(c, msg)

    def _busy(self) -> str | None:
        b = self._burst
        if b is not None and b.state != profiler.DONE:
            return (
                f"another monitor's profiler burst is {b.state} in this job "
                f"({b.steps_done} of {b.steps} steps)"
            )
        w = self._wburst
        if w is not None and w.state != worker_burst.DONE:
            return "another monitor's worker profile burst is running in this job"
        return None

    def _answer(self, c, state: str, message: str) -> None:
        self.pub.queue(c, wire.encode(wire.profile_status(state, message)))

    # --- profiler bursts ------------------------------------------------------------

    def _stepping_loader(self, c):
        """The loader to profile, or None (the client was told why)."""
        st = self.busiest_loader()
        if st is None:
            self._answer(c, "rejected", "this job has no DataLoader that is stepping: nothing to profile")
        return st

    def _on_profile(self, c, msg: dict) -> None:
        st = self._stepping_loader(c)
        if st is None:
            return
        loader = _loader_ref(st)
        try:
            burst, why = profiler.start(
                st,
                msg["steps"],
                msg.get("max_s") or wire.PROFILE_MAX_SECONDS,
                msg.get("out_dir"),
                self.pub.directory,
                loader,
            )
        except Exception as e:
            self._answer(c, "rejected", f"could not arm the profiler: {type(e).__name__}: {e}")
            return
        if burst is None:
            self._answer(c, "busy", why or "busy")
            return
        self._burst, self._client = burst, c
        self.pub.queue(c, wire.encode(burst.status()))

    def _on_worker_profile(self, c, msg: dict) -> None:
        st = self._stepping_loader(c)
        if st is None:
            return
        loader = _loader_ref(st)
        if not st.num_workers or st.slots_view is None:
            self._answer(
                c,
                "rejected",
                f"{loader['name']} has no worker processes (num_workers=0): its fetches run in the "
                "training process; profile them there (dlwatch profile, or cProfile)",
            )
            return
        hz = msg.get("hz") or wire.WORKER_PROFILE_DEFAULT_HZ
        try:
            self._wburst = worker_burst.start(st, float(msg["seconds"]), int(hz), loader)
        except Exception as e:
            self._answer(c, "rejected", f"could not start the worker profile: {type(e).__name__}: {e}")
            return
        self._wclient = c
        self.pub.queue(c, wire.encode(self._wburst.status()))

    # --- stacks -----------------------------------------------------------------

    def _on_stacks(self, c) -> None:
        """Stacks asked for: join the gathering in progress, or start one."""
        if self._stacks is None:
            try:
                self._stacks = stack_request.StackGather("request")
            except Exception as e:
                self.pub.queue(c, wire.encode(wire.stacks_result({}, f"{type(e).__name__}: {e}")))
                return
        if len(self._sclients) < MAX_STACK_CLIENTS:
            self._sclients.append(c)

    def on_stall(self, loaders: list[dict]) -> None:
        """A loader has just stalled (publisher): gather the stacks for every
        monitor; after the gathering in progress, if there is one."""
        if self._stacks is not None:
            # That one shows the threads before this stall (an earlier stall's
            # gathering, or a monitor's request): this stall gets its own.
            self._stalls_next.update((ld.get("id"), ld) for ld in loaders)
            return
        try:
            self._stacks = stack_request.StackGather("stall", loaders)
        except Exception:
            self._stacks = None

    def _poll_stacks(self) -> None:
        g = self._stacks
        if g is None:
            return
        try:
            result = g.poll()
        except Exception as e:
            result, g.state = {"error": f"{type(e).__name__}: {e}"}, stack_request.DONE
        if result is None:
            return
        self._stacks = None
        asked, self._sclients = self._sclients, []
        data = _encode_stacks(result)
        for c in asked:
            if self.pub.connected(c):
                self.pub.queue(c, data)
        copy = _encode_stacks(result, broadcast=True)
        self._last_stacks = copy
        self.pub.broadcast(copy, skip_all=asked)
        if self._stalls_next:
            stalled, self._stalls_next = list(self._stalls_next.values()), {}
            self.on_stall(stalled)

    def farewell(self) -> None:
        """The job is exiting mid-burst: tell the monitor that asked, best effort."""
        w, wc = self._wburst, self._wclient
        if w is not None and wc is not None and w.state != worker_burst.DONE:
            why = "the job exited during the worker profile burst"
            _send_now(wc, [wire.worker_profile_result({}, why)])
        b, c = self._burst, self._client
        if b is None or c is None:
            return
        try:
            if b.state == profiler.DONE:  # stopped by the profiler's own exit hook
                msgs = [m for m in b.poll() if m.get("type") == "profile_result"]
            else:
                why = f"the job exited during the burst ({b.steps_done} of {b.steps} steps collected)"
                result = {"steps": b.steps_done, "steps_requested": b.steps}
                msgs = [wire.profile_result(result, why)]
            _send_now(c, msgs)
        except Exception:
            pass

    def busiest_loader(self):
        """The training loop's loader (loop_follow.pick): of the loaders with
        a live iterator or batches over the last second, the shape with the
        most batches, its busiest loader or, once that one's epoch is over,
        the newest of its shape. A loader between two epochs (the old
        iterator's workers joined, the new one's starting; with 16 workers
        on 2 cores a burst asked there was refused as "nothing to profile")
        is still the one."""
        recent = self.pub.recent_batches()
        return loop_follow.pick(patches.registry.snapshot(), recent[0] if recent else {})

    def poll(self) -> None:
        """Each tick of the publisher: forward a running burst's news."""
        if self._stacks is not None:
            self._poll_stacks()
        if self._wburst is not None:
            self._poll_workers()
        b, c = self._burst, self._client
        if b is None:
            return
        if c is not None and not self.pub.connected(c):
            b.cancel()  # the monitor that asked has gone
            c = self._client = None
        try:
            msgs = b.poll()
        except Exception:
            msgs = []
        for m in msgs:
            if c is not None:
                try:
                    self.pub.queue(c, wire.encode(m))
                except (wire.WireError, ValueError, TypeError) as e:
                    self.pub.queue(c, wire.encode(wire.profile_result({}, str(e))))
        if b.state == profiler.DONE:
            profiler.release(b)
            self._burst = self._client = None

    def _poll_workers(self) -> None:
        w, c = self._wburst, self._wclient
        if w is None:
            return
        if c is not None and not self.pub.connected(c):
            w.cancelled = True  # the monitor that asked has gone
            c = self._wclient = None
        try:
            msgs = w.poll()
        except Exception as e:
            w.state = worker_burst.DONE
            msgs = [wire.worker_profile_result({}, f"{type(e).__name__}: {e}")]
        for m in msgs:
            try:
                data = wire.encode(m)
            except (wire.WireError, ValueError, TypeError) as e:
                data = wire.encode(wire.worker_profile_result({}, str(e)))
            if c is not None:
                self.pub.queue(c, data)
            if m.get("type") == "worker_profile_result" and not m.get("error"):
                # Marked: a monitor waiting for its own answer must not take this one.
                copy = wire.encode(wire.worker_profile_result(m["result"], broadcast=True))
                self._last_wprofile = copy
                self.pub.broadcast(copy, skip=c)
        if w.state == worker_burst.DONE:
            worker_burst.release(w)
            self._wburst = self._wclient = None


MAX_STACK_CLIENTS = 8


def _encode_stacks(result: dict, broadcast: bool = False) -> bytes:
    """The answer in one frame: deep stacks are cut to their innermost
    frames, then to each process's main thread, until it fits."""
    for depth, main_only in ((None, False), (16, False), (16, True), (4, True)):
        doc = _trimmed(result, depth, main_only) if depth is not None else result
        try:
            return wire.encode(wire.stacks_result(doc, broadcast=broadcast))
        except (wire.WireError, ValueError, TypeError):
            continue
    return wire.encode(wire.stacks_result({}, "the stacks do not fit in one frame", broadcast=broadcast))


def _trimmed(result: dict, depth: int, main_only: bool) -> dict:
    procs = []
    for p in result.get("processes") or []:
        threads = [
            dict(t, frames=t.get("frames", [])[-depth:], truncated=True)
            for t in p.get("threads") or []
            if not main_only or t.get("main")
        ]
        procs.append(dict(p, threads=threads))
    return dict(result, processes=procs)


def _loader_ref(st) -> dict:
    return {"id": st.id, "name": f"loader {st.id} ({st.config.get('dataset') or 'dataset'})"[:80]}


def _send_now(c, msgs: list[dict]) -> None:
    """At exit: what the client is owed, in one non-blocking send."""
    try:
        data = bytes(c.out) + b"".join(wire.encode(m) for m in msgs)
        c.sock.send(data, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
    except Exception:
        pass
