"""The notebook panel's collector: a child process of the kernel.

``python -m dlwatch.panel.feed --pid KERNEL_PID`` runs the ordinary collector
(``dlwatch.collect.Monitor``, the same diagnosis as the terminal view) on that
one job and prints one JSON line per change, about once a second::

    {"state": "live", "html": "<div ...>", "text": "dlwatch · ..."}

It lives outside the kernel so that sampling /proc, reading the socket,
diagnosing and rendering take no GIL time from the training loop. It ends when
its stdin closes (the kernel is gone or stopped it), when ``stop`` arrives on
stdin (after one last frame, state "stopped"), or when the kernel's process
exits.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Mapping

from dlwatch.collect.jobs import pid_alive
from dlwatch.collect.monitor import Monitor
from dlwatch.panel import html
from dlwatch.snapshot import as_int, find_job, num, records

# A loop is taken as stopped after this many seconds without a batch, or three
# of its own steps when those are slower (a slow step is not the end of a loop).
IDLE_S = 3.0
IDLE_STEPS = 3
# Before that, a frame with no batch for this long (or two of the loop's
# steps, when slower) already shows the training's figures instead of the
# window's: the window's fill with the idle time (a cell that trained 25 s at
# 75 % wait, then slept, was saved showing "14 % of the loop (last 3.1 s)"),
# and a cell may end before the loop counts as stopped.
HOLD_S = 0.9
HOLD_STEPS = 2
NICE = 5


class Tracker:
    """Whether the kernel's loop is running, and its figures since it began.

    Fed one snapshot at a time; pure apart from the clock it is given."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.state = html.WAITING
        self.last_batch_at: float | None = None
        self.started_at: float | None = None
        self.active_s = 0.0
        self._prev: float | None = None
        self._totals: dict[int, int] = {}
        self._first: dict[int, dict] = {}
        self._last_loaders: dict[int, dict] = {}
        # Each loader as of the frame before its last batch (_idle_tail).
        self._before_last: dict[int, dict] = {}
        self._seen: dict[int, dict] = {}
        self._step_s = 0.0
        self.hints: list[dict] = []
        # The last snapshot in which the loop moved: what a frozen panel shows.
        self.last_live: Mapping | None = None
        self.summary: html.Summary | None = None

    def update(self, snapshot: Mapping | None, now: float) -> str:
        job = find_job(snapshot, self.pid) if isinstance(snapshot, Mapping) else None
        # A new loop counts from the loaders as last seen (idle time between
        # loops counts as a step in the lifetime counters, so not as of their
        # last batch).
        before = dict(self._seen)
        last_batch = dict(self._last_loaders)
        moved = False
        for ld in records((job or {}).get("loaders")):
            lid = as_int(ld.get("id"))
            total = as_int(ld.get("batches_total"))
            if lid is None or total is None:
                continue
            if total > self._totals.get(lid, 0):
                moved = True
                rate = num(ld.get("batches_per_s"))
                if rate:  # the pace while it steps: an idle window's rate only falls
                    self._step_s = 1.0 / rate
                # Its figures as of its last batch: once the loop stops, the
                # idle time would count as a step in later snapshots.
                if lid in self._last_loaders:
                    self._before_last[lid] = self._last_loaders[lid]
                self._last_loaders[lid] = dict(ld)
            self._totals[lid] = max(total, self._totals.get(lid, 0))
            self._seen[lid] = dict(ld)
        if moved:
            if self.state != html.LIVE:
                self._begin(now, before, last_batch)
            if self._prev is not None:
                self.active_s += now - self._prev
            self.last_batch_at = now
            if isinstance(snapshot, Mapping):
                self.hints = html.job_hints(snapshot, self.pid)
                self.last_live = snapshot
            self.summary = None
        elif self.state == html.LIVE and self.last_batch_at is not None:
            idle = now - self.last_batch_at
            if idle >= max(IDLE_S, IDLE_STEPS * self._step_s):
                self.state = html.FINISHED
                self.summary = self.make_summary(now)
            elif idle >= max(HOLD_S, HOLD_STEPS * self._step_s):
                self.summary = self.make_summary(now)  # held: live again at the next batch
        self._prev = now
        return self.state

    def _begin(self, now: float, before: dict[int, dict], last_batch: dict[int, dict]) -> None:
        self.state = html.LIVE
        self.started_at = self._prev if self._prev is not None else now
        self.active_s = 0.0
        self.summary = None
        # The loop's figures count from the loaders as they were before it
        # began, its steps as last seen (the idle time between loops left
        # out), its wait as of their last batch: a frame counts the fetch in
        # progress as wait, and a wait that grew with no batch is the new
        # loop's first fetch (its workers starting), which the loop's own
        # clock counts too. A loader first seen now counts from zero.
        self._first = {}
        for lid, ld in before.items():
            self._first[lid] = {**ld, "wait_s_total": last_batch.get(lid, {}).get("wait_s_total", 0.0)}

    def make_summary(self, now: float) -> html.Summary | None:
        if self.started_at is None:
            return None
        out = html.Summary(
            seconds=(self.last_batch_at or now) - self.started_at, idle_since=self.last_batch_at
        )
        for lid, last in sorted(self._last_loaders.items()):
            first = self._first.get(lid, {})
            batches = (as_int(last.get("batches_total")) or 0) - (as_int(first.get("batches_total")) or 0)
            if batches <= 0:
                continue
            wait = _delta(last, first, "wait_s_total")
            step = _delta(last, first, "step_s_total")
            if step is not None:
                step -= _idle_tail(first, self._before_last.get(lid), last)
            loop_s = wait + step if wait is not None and step is not None and wait + step > 0 else None
            frac = wait / loop_s if wait is not None and loop_s else None
            # Epochs the cell iterated: those begun in it, and the one it found
            # open (a QA run: "2 epoch(s)" for one iterator, the loader line
            # saying epoch 1; the start knew no loader).
            e0, e1 = as_int(first.get("epoch")) or 0, as_int(last.get("epoch")) or 0
            open_at_start = e0 > 0 and (first.get("epoch_open") is True or first.get("active") is True)
            epochs = e1 - e0 + (1 if open_at_start else 0)
            # The pace on the job's own clock, over the same batches: the
            # panel's clock starts at the frame that first showed the loop,
            # when some of its batches may be done already.
            if loop_s:
                bps: float | None = batches / loop_s
            else:
                bps = batches / self.active_s if self.active_s > 0 else None
            ls = html.LoaderSummary(lid, str(last.get("dataset") or "DataLoader"), batches, epochs, frac, bps)
            if wait is not None and step is not None:
                ls.wait_ms_mean, ls.step_ms_mean = wait / batches * 1e3, max(0.0, step) / batches * 1e3
            out.loaders.append(ls)
        return out


def _idle_tail(first: Mapping, prior: Mapping | None, last: Mapping) -> float:
    """Seconds of the last batch's frame that came after the loop ended.

    A frame counts the time since the last batch as the loop's step, so the
    frame that saw the last batches also holds up to a frame's interval of
    the loop standing idle (in a kernel, 0.9 s of a 12 s loop: 39 % wait
    shown where the loop's own clock said 42 %). The batches of that frame
    are taken at the loop's pace so far (from the frame before); what the
    step grew beyond that is the idle tail. A loop whose last batches were
    slower loses up to that frame's interval of steps; one that ran steadily
    loses none."""
    if prior is None:
        return 0.0
    b0, b1, b2 = (as_int(x.get("batches_total")) or 0 for x in (first, prior, last))
    w0, w1, w2 = (num(x.get("wait_s_total")) for x in (first, prior, last))
    s0, s1, s2 = (num(x.get("step_s_total")) for x in (first, prior, last))
    if b1 <= b0 or b2 <= b1 or w1 is None or w2 is None or s1 is None or s2 is None:
        return 0.0
    per_batch = ((w1 - (w0 or 0.0)) + (s1 - (s0 or 0.0))) / (b1 - b0)
    expected_step = max(0.0, (b2 - b1) * per_batch - (w2 - w1))
    return max(0.0, (s2 - s1) - expected_step)


def _delta(last: Mapping, first: Mapping, key: str) -> float | None:
    a, b = num(last.get(key)), num(first.get(key))
    if a is None:
        return None
    return a - (b or 0.0)


def frame(tracker: Tracker, snapshot: Mapping | None, now: float, note: str = "") -> dict:
    state = tracker.state
    # Frozen, or live with the loop idle for now: the training's figures,
    # the snapshot and hints of its last batch, not those of the idle time.
    held = state in (html.FINISHED, html.STOPPED, html.ENDED) or tracker.summary is not None
    hints = tracker.hints if held else None
    if held and tracker.last_live is not None:
        snapshot = tracker.last_live
    summary = tracker.summary
    return {
        "state": state,
        "html": html.render(snapshot, tracker.pid, state, hints=hints, summary=summary, note=note, now=now),
        "text": html.render_text(snapshot, tracker.pid, state, hints=hints, summary=summary),
    }


def _emit(doc: dict) -> bool:
    try:
        sys.stdout.write(json.dumps(doc) + "\n")
        sys.stdout.flush()
        return True
    except (BrokenPipeError, OSError, ValueError):
        return False


def _watch_stdin(stop: threading.Event, asked: threading.Event) -> None:
    try:
        for line in sys.stdin:
            if line.strip() == "stop":
                asked.set()
                break
    except (OSError, ValueError):
        pass
    stop.set()


def run(pid: int, interval: float, directory: str | None) -> int:
    # The panel must not compete with the training loop it watches when the
    # cores are short: it yields to it.
    try:
        os.nice(NICE)
    except OSError:
        pass
    monitor = Monitor(directory=directory, only_pid=pid, interval=min(0.5, interval))
    tracker = Tracker(pid)
    stop, asked = threading.Event(), threading.Event()
    threading.Thread(target=_watch_stdin, args=(stop, asked), daemon=True, name="dlwatch-panel-stdin").start()
    monitor.start()
    last_html = None
    snap: Mapping | None = None
    try:
        while not stop.is_set() and pid_alive(pid):
            now = time.time()
            snap = monitor.latest()
            tracker.update(snap, now)
            doc = frame(tracker, snap, now)
            # The clock in the heading changes every second; only a change in
            # the figures is worth a message to the kernel.
            body = doc["html"].split("\n", 2)[-1]
            if body != last_html:
                if not _emit(doc):
                    return 0
                last_html = body
            stop.wait(interval)
        now = time.time()
        if asked.is_set():
            if tracker.state == html.LIVE:
                tracker.summary = tracker.make_summary(now)
            tracker.state = html.STOPPED
            _emit(frame(tracker, snap, now))
        elif not pid_alive(pid):
            tracker.state = html.ENDED
            _emit(frame(tracker, snap, now, note="the kernel's process has exited"))
    finally:
        monitor.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dlwatch.panel.feed", description=__doc__.splitlines()[0])
    p.add_argument("--pid", type=int, required=True, help="the kernel's process id")
    p.add_argument("--interval", type=float, default=1.0, help="seconds between frames (default 1)")
    p.add_argument("--dir", default=None, help="runtime directory (default: as dlwatch)")
    args = p.parse_args(argv)
    if not 0 < args.interval < float("inf"):  # NaN fails this too
        p.error("--interval must be > 0")
    return run(args.pid, args.interval, args.dir)


if __name__ == "__main__":
    sys.exit(main())
