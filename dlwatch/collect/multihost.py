"""``dlwatch --host``: this machine's collector and one ssh stream per host,
as one snapshot source.

``MultiHost`` is a ``dlwatch.snapshot.SnapshotSource``: the live view, the
recorder and ``snapshot --follow`` read it as they read ``Monitor``. It
builds nothing of its own: each time this machine's collector has built a
snapshot (its clock is the view's), the newest snapshot of every host is
merged in (``merge.py``) and the cross-host diagnosis runs on the result.
A host's stream lives in its own thread (``remote.RemoteHost``); reading its
state is a lock and a copy, so a slow or dead host never holds the view up.

``one_shot`` and ``list_jobs`` are ``dlwatch snapshot --host`` and
``dlwatch ls --host``: every host asked at once, each within a time limit.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dlwatch.collect import merge
from dlwatch.collect.remote import HostStatus, RemoteHost, fetch_once
from dlwatch.snapshot import problems, records

log = logging.getLogger("dlwatch.collect")
# Once a second, as this machine's own diagnosis (monitor.DIAGNOSE_EVERY_S).
JUDGE_EVERY_S = 1.0
# A one-shot answer from a host: ssh's connect timeout (remote.SSH_OPTIONS)
# plus the remote measurement and a margin.
ONE_SHOT_SLACK_S = 15.0


def local_name() -> str:
    return socket.gethostname() or "localhost"


class MultiHost:
    """``local`` (this machine's ``Monitor``) and one ``RemoteHost`` per
    host, read as one ``SnapshotSource``; ``interval``/``window``: those the
    nodes build their snapshots with (the view's, at least 0.5 s)."""

    def __init__(
        self,
        local: Any,
        hosts: Sequence[str],
        dlwatch: str = "dlwatch",
        interval: float = 0.5,
        window: float = 1.0,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from dlwatch.diagnose import Diagnoser

        self.local = local
        self.directory = getattr(local, "directory", None)
        self.local_host = local_name()
        self.remotes = [
            RemoteHost(h, dlwatch, interval=max(interval, 0.5), window=window, env=env) for h in hosts
        ]
        self.clock = clock
        self.judge = merge.CrossHostJudge(Diagnoser().update)
        self._cross: list[dict[str, Any]] = []
        self._cross_error: str | None = None
        self._judged_at: float | None = None
        self._latest: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._listeners: list[Callable[[], None]] = []
        self.errors: deque[str] = deque(maxlen=5)
        local.subscribe(self._on_local)

    def start(self) -> None:
        for r in self.remotes:
            r.start()
        self.local.start()

    def stop(self) -> None:
        self.local.stop()
        for r in self.remotes:
            r.stop()

    def subscribe(self, callback: Callable[[], None]) -> None:
        self._listeners.append(callback)

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self._latest

    def dismiss(self, job_pid: int) -> None:
        self.local.dismiss(job_pid)

    def statuses(self) -> list[HostStatus]:
        return [r.status() for r in self.remotes]

    def build(self) -> dict[str, Any]:
        """The merged snapshot now, from the local collector's newest."""
        merged = merge.merge(self.local.latest(), self.local_host, self.statuses(), self.clock())
        t = time.monotonic()
        if self._judged_at is None or t - self._judged_at >= JUDGE_EVERY_S:
            try:
                self._cross, self._cross_error = self.judge.hints(merged), None
            except Exception as e:  # the rest of the view stays; the fault is said
                self._cross = []
                self._cross_error = f"cross-host diagnosis failed: {type(e).__name__}: {e}"
            self._judged_at = t
        merged["hints"] = self._cross + merged["hints"]
        if self._cross_error:
            merged["hints_error"] = self._cross_error
        return merged

    def _on_local(self) -> None:
        try:
            snap = self.build()
        except Exception as e:  # never out of the collector's thread, never a frozen view
            log.debug("merging the hosts failed", exc_info=e)
            self.errors.append(f"merging the hosts failed: {type(e).__name__}: {e}")
            snap = dict(self.local.latest() or merge.empty_local(self.clock()))
            snap["errors"] = [*(snap.get("errors") or ()), *self.errors]
        with self._lock:
            self._latest = snap
        for callback in list(self._listeners):
            try:
                callback()
            except Exception:
                pass


def _ask_all(hosts: Sequence[str], ask: Callable[[str], Any]) -> list[Any]:
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(32, len(hosts))) as pool:
        return list(pool.map(ask, hosts))


def one_shot(
    local: Callable[[], dict[str, Any] | None],
    hosts: Sequence[str],
    dlwatch: str,
    window_s: float,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """``dlwatch snapshot --host``: this machine's measurement (``local()``)
    and every host's, taken at the same time, merged and judged across hosts."""
    from dlwatch.diagnose import evaluate

    def ask(dest: str) -> HostStatus:
        cmd = [dlwatch, "snapshot", "--json", "--window", f"{window_s:g}"]
        doc, state, reason = fetch_once(dest, cmd, window_s + ONE_SHOT_SLACK_S, env, dlwatch)
        if doc is not None:
            bad = problems(doc)
            if bad:
                doc, state, reason = None, "dropped", f"not a snapshot from {dest}: {bad[0]}"
        return HostStatus(dest, state, reason, doc, 0.0 if doc is not None else None)

    with ThreadPoolExecutor(max_workers=1) as pool:
        mine = pool.submit(local)
        theirs = _ask_all(hosts, ask)
        merged = merge.merge(mine.result(), local_name(), theirs, time.time())
    merged["hints"] = merge.CrossHostJudge(evaluate).hints(merged) + merged["hints"]
    return merged


def list_jobs(
    local: list[dict[str, Any]],
    hosts: Sequence[str],
    dlwatch: str,
    env: dict[str, str] | None = None,
    local_problem: str | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``dlwatch ls --host``: (every host's jobs, each with ``host``; one line
    per host with its state and reason)."""

    def ask(dest: str) -> tuple[str, dict[str, Any] | None, str, str | None]:
        doc, state, reason = fetch_once(dest, [dlwatch, "ls", "--json"], ONE_SHOT_SLACK_S, env, dlwatch)
        return dest, doc, state, reason

    name = local_name()
    jobs = [dict(j, host=name) for j in local]
    lines: list[dict[str, Any]] = [
        {"host": name, "state": "ok", "reason": None, "local": True, "jobs": len(jobs)}
    ]
    for dest, doc, state, reason in _ask_all(hosts, ask):
        theirs = [dict(j, host=dest) for j in records((doc or {}).get("jobs"))]
        jobs += theirs
        lines.append({"host": dest, "state": state, "reason": reason, "local": False, "jobs": len(theirs)})
    return jobs, lines
