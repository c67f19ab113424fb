"""The control requests a monitor may send on the job's socket.

The publisher owns the socket and the uid check; once a client has said
hello, whatever else it sends comes here. Today that is a profiler burst of
the training loop (``profile``, ``profiler.py``). One burst runs at a time
per job; the monitor that asked gets its progress and result, and hanging up
cancels it. Called on the publisher's thread only.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

from dlwatch import wire
from dlwatch.probe import patches, profiler

if TYPE_CHECKING:
    from dlwatch.probe.publisher import Publisher


class Control:
    def __init__(self, pub: Publisher) -> None:
        self.pub = pub
        self._burst: profiler.Burst | None = None
        self._client: Any = None  # the publisher's _Client that asked

    def features(self) -> list[str]:
        """What the hello announces."""
        return [wire.FEATURE_PROFILE] if profiler.enabled() else []

    def on_request(self, c, msg: dict) -> None:
        """A message from a greeted client; anything unknown is ignored."""
        if msg.get("type") == "profile":
            self._on_profile(c, msg)

    def _answer(self, c, state: str, message: str) -> None:
        self.pub.queue(c, wire.encode({"type": "profile_status", "state": state, "message": message}))

    # --- profiler bursts ------------------------------------------------------------

    def _on_profile(self, c, msg: dict) -> None:
        if not profiler.enabled():
            self._answer(
                c, "unsupported", "profiling is disabled in this job (it was started with DLWATCH_PROFILE=0)"
            )
            return
        if self._burst is not None and self._burst.state != profiler.DONE:
            b = self._burst
            self._answer(
                c,
                "busy",
                f"another monitor's profiler burst is {b.state} in this job "
                f"({b.steps_done} of {b.steps} steps); try again when it is done",
            )
            return
        st = self.busiest_loader()
        if st is None:
            self._answer(c, "rejected", "this job has no DataLoader that is stepping: nothing to profile")
            return
        loader = {"id": st.id, "name": f"loader {st.id} ({st.config.get('dataset') or 'dataset'})"[:80]}
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

    def farewell(self) -> None:
        """The job is exiting mid-burst: tell the monitor that asked, best effort."""
        b, c = self._burst, self._client
        if b is None or c is None:
            return
        try:
            if b.state == profiler.DONE:  # stopped by the profiler's own exit hook
                msgs = [m for m in b.poll() if m.get("type") == "profile_result"]
            else:
                why = f"the job exited during the burst ({b.steps_done} of {b.steps} steps collected)"
                result = {"steps": b.steps_done, "steps_requested": b.steps}
                msgs = [{"type": "profile_result", "result": result, "error": why}]
            data = bytes(c.out) + b"".join(wire.encode(m) for m in msgs)
            c.sock.send(data, socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
        except Exception:
            pass

    def busiest_loader(self):
        """The live loader with the most batches over the last second (ties:
        the one that returned a batch last)."""
        live = [
            st for st in patches.registry.snapshot() if st.iter_ref is not None and st.iter_ref() is not None
        ]
        if not live:
            return None
        recent = self.pub.recent_batches()
        old = recent[0] if recent else {}
        return max(live, key=lambda st: (st.batches - old.get(st.id, 0), st.t_last))

    def poll(self) -> None:
        """Each tick of the publisher: forward a running burst's news."""
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
                    self.pub.queue(c, wire.encode({"type": "profile_result", "result": {}, "error": str(e)}))
        if b.state == profiler.DONE:
            profiler.release(b)
            self._burst = self._client = None
