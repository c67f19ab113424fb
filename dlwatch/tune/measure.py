"""What one trial measured, from the stream of snapshots of its job.

``TrialMeter`` is fed every snapshot the trial's collector builds and decides
when warm-up is over, when the steady state has lasted long enough (or is
stable), and what the figures are. Pure: the only clock is the snapshots'
own (their ``time`` and each loader's ``window_mono_ns``, the job's monotonic
clock at the end of its window), so a test drives it with made-up snapshots.

Throughput is the difference of a loader's cumulative batch counter between
the first and the last steady snapshot, over the job's own clock between the
two frames: exact to the batch, whatever the collector's jitter. Epoch
starts inside the steady state are part of it on purpose: they are what
``persistent_workers`` saves.

A trial times the settled pace (``pace``): when its steady state would end
while the pace is still rising (the later part faster than the earlier by
more than ``RISE_TOLERANCE``: a second epoch faster than the first, whose
reads a cold page cache served, or a pace that climbs through the window),
the slower start is left out and the trial runs on, at most
``SETTLE_EXTRA_SHARE`` of ``trial_s`` longer; one still rising then is
reported as not settled. The baseline also waits, within that bound, for its
first epoch to end: a first pass over the data on a cold cache is even and
slow, and the trials after it read a warm one (issue 43: a baseline caught
in its first epoch, 2.0-2.2 batches/s against 2.62 over the run, made
num_workers=2 read 1.23x where two minutes of it gave 1.09x).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dlwatch.diagnose.facts import mean, median
from dlwatch.snapshot import (
    PERCENT_PER_CORE,
    as_dict,
    as_int,
    as_list,
    is_live,
    live_workers,
    num,
    numbers,
    records,
)
from dlwatch.thresholds import DATA_BOUND_WAIT

# After the first batch, the queue fills and the first window still holds
# the start-up stall: steady state starts this much later.
WARMUP_AFTER_FIRST_BATCH_S = 2.0
# The warm-up is counted from the end of the loop's first step too (its first
# batch after the first), and steady state opens only at a snapshot where the
# loop is stepping at its pace: a first step of seconds (cudnn benchmark,
# torch.compile, AMP set-up) must not enter a trial. timm's train.py took
# 14 s over its first step on an H100; a baseline that opened 2 s after the
# first batch read 0.0 batches/s for its first windows, a mean step of
# 1802 ms (steady: about 65 ms) and a 6.04x gain where plain runs gave
# 3.1-3.6x. "At its pace": the loop advanced no longer ago than twice its
# typical gap between advancing snapshots, or this long.
SETTLE_MIN_GAP_S = 1.0
# A trial that has produced no batch this long after its start is reported
# as such rather than waited on forever.
FIRST_BATCH_TIMEOUT_S = 120.0
# ... and one that steps the optimizer this often with no loader in sight is
# a script without a DataLoader (a QA run waited the whole timeout on one).
NO_LOADER_STEPS = 50
# (and for this long: a warm-up on dummy tensors before the loader is made
# steps the optimizer too)
NO_LOADER_S = 20.0
# Early stop: the two halves of the steady state agree within this, and at
# least this share of --trial-seconds has passed.
STABLE_TOLERANCE = 0.02
STABLE_MIN_SHARE = 0.5
STABLE_MIN_S = 3.0
# A replay (ceiling) trial whose loader has not started replaying this long
# after its first batch is reported rather than waited on (the warm-up and
# the cached batches take seconds; a loop that never iterates the selected
# loader again would take forever).
REPLAY_START_TIMEOUT_S = 60.0
# The settled pace: a part of the steady state faster than the part before it
# by more than this is a pace still rising (two halves of one even pace
# differ by a few per cent; a cold first epoch ran 20-25 % slower).
RISE_TOLERANCE = 0.08
# Each part compared holds at least this many batches (a count is exact to
# one batch: 5 % at 20) and this many seconds.
PART_MIN_BATCHES = 20
PART_MIN_S = 2.0
# Past trial_s of steady state, a trial still rising (or a baseline still in
# its first epoch) runs on at most this share of trial_s longer.
SETTLE_EXTRA_SHARE = 1.0


@dataclass
class _Point:
    """One steady snapshot of one loader."""

    t: float  # snapshot time (collector clock)
    mono_ns: int | None  # the job's clock at the end of the loader's window
    batches: int
    epoch: int
    wait: float | None
    wait_ms: float | None
    step_ms: float | None
    worker_ms: float | None
    busy: float | None  # mean over live workers
    cpu_per_worker: float | None  # cores
    rq_per_worker: float  # cores' worth of run-queue wait


@dataclass
class _Job:
    cpu_cores: list[tuple[float, float]] = field(default_factory=list)  # (time, cores)
    # Other processes' CPU on the job's cores (the host's busy time less the
    # trial's job and the monitor): a trial measured beside them is measured
    # on fewer cores than the next one may get.
    others: list[tuple[float, float]] = field(default_factory=list)  # (time, cores)
    worker_uss: int | None = None
    worker_rss: int | None = None


def job_of(snapshot: Mapping) -> dict | None:
    """The trial's trainer: the live job with loaders (the first by rank when
    a launcher starts several)."""
    jobs = [j for j in records(snapshot.get("jobs")) if is_live(j) and records(j.get("loaders"))]
    if not jobs:
        return None
    return min(jobs, key=lambda j: (as_int(j.get("rank")) or 0, as_int(j.get("pid")) or 0))


def loader_settings(ld: Mapping) -> dict:
    """The four knobs as the probe read them from the DataLoader."""
    nw = as_int(ld.get("num_workers")) or 0
    return {
        "num_workers": nw,
        "prefetch_factor": as_int(ld.get("prefetch_factor")) if nw else None,
        "pin_memory": ld.get("pin_memory") is True,
        "persistent_workers": ld.get("persistent_workers") is True and nw > 0,
    }


class TrialMeter:
    """Feed snapshots in time order; read ``phase``, ``done`` and ``figures()``.

    ``loader_id``: the loader to measure (later trials); None: every loader
    is followed and the busiest (the most loop time spent on it) is reported.
    ``replay``: a ceiling trial: the steady state starts once the loader
    replays (its ``replay.state`` read "replaying" in an earlier snapshot,
    so no window of the steady state holds a batch that was loaded).
    """

    def __init__(
        self,
        trial_s: float,
        loader_id: int | None = None,
        warmup_s: float | None = None,
        replay: bool = False,
        first_epoch: bool = False,
    ) -> None:
        """``first_epoch``: wait (within the bound) for the loader's first
        epoch to end and compare it with the next (the baseline's: the first
        pass over the data of the whole sweep)."""
        self.trial_s = trial_s
        self.wait_first_epoch = first_epoch
        self.loader_id = loader_id
        self.replay = replay
        self.replaying_at: float | None = None
        self.warmup_s = WARMUP_AFTER_FIRST_BATCH_S if warmup_s is None else warmup_s
        self.started: float | None = None
        self.first_batch_at: float | None = None
        self.steady_from: float | None = None
        self.steady_began: float | None = None  # steady_from before any part was left out
        self.last_t: float | None = None
        self._done = False
        self.settled: bool | None = None  # at the end: the pace no longer rose
        self.pace_rise: float | None = None  # later part's rate / earlier part's, last judged
        self.left_out: list[dict] = []  # parts left out as not yet settled
        self.first_epochs: dict[int, int] = {}  # each loader's epoch at its first steady point
        self.advances: list[float] = []  # snapshot times the loop stepped, after its first batch
        self._count = 0
        self.points: dict[int, list[_Point]] = {}
        self.loaders: dict[int, dict] = {}  # the last record of each loader
        self.job: dict | None = None
        self._loaderless_steps = 0
        self.usable_cores: float | None = None
        self.hint_ids: set[str] = set()
        self.hints: dict[str, dict] = {}
        self._job = _Job()

    # --- feeding ---------------------------------------------------------------

    def feed(self, snapshot: Mapping) -> None:
        t = num(snapshot.get("time"))
        if t is None:
            return
        if self.started is None:
            self.started = t
        self.last_t = t
        uc = num(as_dict(snapshot.get("host")).get("usable_cores"))
        if uc is not None and uc > 0:
            self.usable_cores = uc
        job = job_of(snapshot)
        if job is None:
            # A live job that trains with no loader in sight (its optimizer steps).
            for j in records(snapshot.get("jobs")):
                if is_live(j) and not records(j.get("loaders")):
                    steps = max(
                        (as_int(t.get("steps")) or 0 for t in records(j.get("train_threads"))), default=0
                    )
                    self._loaderless_steps = max(self._loaderless_steps, steps)
            return
        self.job = job
        lds = {lid: ld for ld in records(job.get("loaders")) if (lid := as_int(ld.get("id"))) is not None}
        self.loaders.update(lds)
        watched = [lds[self.loader_id]] if self.loader_id in lds else list(lds.values())
        if self.loader_id is not None and self.loader_id not in lds:
            watched = []
        count = sum(as_int(ld.get("batches_total")) or 0 for ld in watched)
        stepped, self._count = count > self._count, max(self._count, count)
        if self.first_batch_at is None:
            if count > 0:
                self.first_batch_at = t
            return
        if stepped:
            self.advances.append(t)
        if self.steady_from is None:
            if self.replay and not self._replay_started(watched, t):
                return
            if t - self.first_batch_at < self.warmup_s or not self._settled(t):
                return
            self.steady_from = self.steady_began = t
        for ld in watched:
            p = _point(t, ld)
            self.points.setdefault(as_int(ld["id"]) or 0, []).append(p)  # keys of lds: ints
            self.first_epochs.setdefault(as_int(ld["id"]) or 0, p.epoch)
        for h in records(snapshot.get("hints")):
            if as_int(h.get("job_pid")) == as_int(job.get("pid")) and isinstance(h.get("id"), str):
                self.hint_ids.add(h["id"])
                self.hints[h["id"]] = h
        theirs = num(as_dict(snapshot.get("host")).get("other_cpu_cores"))
        if theirs is not None:
            self._job.others.append((t, theirs))
        cpu = num(job.get("main_cpu_percent"))
        ws = [w for ld in lds.values() for w in live_workers(ld)]
        wcpu = numbers(w.get("cpu_percent") for w in ws)
        if cpu is not None:
            self._job.cpu_cores.append((t, (cpu + sum(wcpu)) / PERCENT_PER_CORE))
        uss = numbers(w.get("uss_bytes") for w in ws)
        rss = numbers(w.get("rss_bytes") for w in ws)
        if uss:
            self._job.worker_uss = max(self._job.worker_uss or 0, int(sum(uss)))
        if rss:
            self._job.worker_rss = max(self._job.worker_rss or 0, int(sum(rss)))
        self._judge()

    def _settled(self, t: float) -> bool:
        """The loop has finished its first steps and steps at its pace now."""
        adv = self.advances
        if len(adv) < 2 or t - adv[0] < self.warmup_s:
            return False
        gaps = sorted(b - a for a, b in zip(adv, adv[1:]))
        typical = gaps[len(gaps) // 2]
        return t - adv[-1] <= max(SETTLE_MIN_GAP_S, 2 * typical)

    def _replay_started(self, watched: list, t: float) -> bool:
        if self.replaying_at is not None:
            return True
        if any(as_dict(ld.get("replay")).get("state") == "replaying" for ld in watched):
            self.replaying_at = t
        return False

    # --- state -----------------------------------------------------------------

    @property
    def batches_seen(self) -> int:
        """The most batches the watched loader had delivered in any snapshot."""
        return self._count

    @property
    def phase(self) -> str:
        if self.first_batch_at is None:
            return "starting"
        if self.steady_from is None:
            return "warm-up"
        return "steady"

    @property
    def steady_s(self) -> float:
        if self.steady_from is None or self.last_t is None:
            return 0.0
        return self.last_t - self.steady_from

    @property
    def done(self) -> bool:
        """Enough steady state of a settled pace (``_judge``)."""
        return self._done

    @property
    def bound_s(self) -> float:
        """The most steady state a trial runs, parts left out included."""
        return self.trial_s * (1.0 + SETTLE_EXTRA_SHARE)

    def _measured(self) -> list[_Point]:
        lid = self.busiest() if self.loader_id is None else self.loader_id
        return self.points.get(lid, []) if lid is not None else []

    def _enough(self, pts: list[_Point]) -> bool:
        """``trial_s`` of steady state, or stable figures after half of it;
        after a part was left out, half of it whose pace is judged below."""
        s = self.steady_s
        if s >= self.trial_s:
            return True
        if s < max(STABLE_MIN_S, STABLE_MIN_SHARE * self.trial_s):
            return False
        if self.left_out:
            return True
        half = len(pts) // 2
        if half < 2:
            return False
        a, b = _rate(pts[: half + 1]), _rate(pts[half:])
        return (
            a is not None and b is not None and max(a, b) > 0 and abs(a - b) / max(a, b) <= STABLE_TOLERANCE
        )

    def _judge(self) -> None:
        """Once there is enough steady state: done if its pace has settled;
        else the slower start is left out and the trial runs on, until the
        bound, where it is done and marked as not settled."""
        if self._done or self.steady_from is None or self.steady_began is None or self.last_t is None:
            return
        pts = self._measured()
        at_bound = self.last_t - self.steady_began >= self.bound_s
        if not (at_bound or self._enough(pts)):
            return
        lid = self.busiest()
        first = self.first_epochs.get(lid) if lid is not None else None
        # A cold cache slows the loader, not the step: a loop that does not
        # wait for data is not slowed by it, and tune stops after its baseline.
        wait = mean(numbers(p.wait for p in pts))
        cold_matters = self.wait_first_epoch and wait is not None and wait >= DATA_BOUND_WAIT
        verdict = pace(pts, first if cold_matters else None)
        self.pace_rise = verdict.rise if verdict.rise is not None else self.pace_rise
        if verdict.state == "rising" and verdict.split is not None:
            # The later part is the best figure of the pace, settled or not.
            self._leave_out(pts[verdict.split].t, verdict)
        if verdict.state == "settled" or (verdict.state == "short" and self.steady_s >= self.trial_s):
            self._done, self.settled = True, True
        elif at_bound:
            # Settled unless the pace was seen rising and not seen level
            # since; a first epoch that outlasts the bound is reported as
            # such (``first_epoch_only``).
            rose = verdict.state == "rising" or (
                bool(self.left_out) and self.left_out[-1]["cause"] == "trend"
            )
            self._done, self.settled = True, not rose

    def _leave_out(self, t: float, verdict: Pace) -> None:
        """Measure from ``t`` on: what came before was not the settled pace."""
        assert self.steady_from is not None
        self.left_out.append(
            {"s": round(t - self.steady_from, 2), "cause": verdict.cause, "rise": _round(verdict.rise, 3)}
        )
        self.steady_from = t
        self.points = {lid: [p for p in pts if p.t >= t] for lid, pts in self.points.items()}
        self._job.cpu_cores = [(u, c) for u, c in self._job.cpu_cores if u >= t]
        self._job.others = [(u, c) for u, c in self._job.others if u >= t]

    @property
    def stuck(self) -> bool:
        return self.stuck_reason is not None

    @property
    def stuck_reason(self) -> str | None:
        if self.started is None or self.last_t is None:
            return None
        if self.first_batch_at is None:
            steps = self._steps_without_a_loader()
            if steps >= NO_LOADER_STEPS and self.last_t - self.started >= NO_LOADER_S:
                return (
                    f"the script trains (the optimizer stepped {steps} times) but iterates no DataLoader: "
                    "tune sets a DataLoader's settings, and there is none to set (a loop over another "
                    "iterable is measured by dlwatch.watch(...), not tuned)"
                )
            if self.last_t - self.started > FIRST_BATCH_TIMEOUT_S:
                return "no batch within the first-batch timeout"
        elif (
            self.replay
            and self.replaying_at is None
            and self.last_t - self.first_batch_at > REPLAY_START_TIMEOUT_S
        ):
            return f"the loader did not start replaying within {REPLAY_START_TIMEOUT_S:.0f} s"
        return None

    def _steps_without_a_loader(self) -> int:
        """Optimizer steps of a job that has shown no loader at all (0 once one is seen)."""
        return 0 if self.loaders else self._loaderless_steps

    def busiest(self) -> int | None:
        """The loader the loop spent the most time on over the steady state
        (batches x (wait + step) per batch)."""
        if self.loader_id is not None:
            return self.loader_id
        best, best_s = None, -1.0
        for lid, pts in self.points.items():
            spent = 0.0
            for p0, p1 in zip(pts, pts[1:]):
                per = (p1.wait_ms or 0.0) + (p1.step_ms or 0.0)
                spent += max(0, p1.batches - p0.batches) * per
            if spent > best_s or (spent == best_s and best is not None and lid < best):
                best, best_s = lid, spent
        return best

    def live_rate(self) -> float | None:
        """batches/s of the measured loader over the steady state so far (the
        last window's rate before that)."""
        lid = self.busiest()
        pts = self.points.get(lid) if lid is not None else None
        if pts and len(pts) >= 2:
            return _rate(pts)
        ld = self.loaders.get(lid) if lid is not None else None
        if ld is None and self.loaders:
            ld = max(self.loaders.values(), key=lambda x: num(x.get("batches_per_s")) or 0.0)
        return num(ld.get("batches_per_s")) if ld else None

    def live_wait(self) -> float | None:
        lid = self.busiest()
        pts = self.points.get(lid) if lid is not None else None
        if pts:
            return mean(numbers(p.wait for p in pts))
        ld = self.loaders.get(lid) if lid is not None else None
        return num(ld.get("data_wait_fraction")) if ld else None

    # --- the result ------------------------------------------------------------

    def figures(self) -> dict:
        """The trial's figures (docs/tune.md); None where not measured."""
        lid = self.busiest()
        pts = self.points.get(lid, []) if lid is not None else []
        ld = self.loaders.get(lid, {}) if lid is not None else {}
        rate = _rate(pts) if len(pts) >= 2 else None
        bs = as_int(ld.get("batch_size"))
        workers = [p for p in pts if p.cpu_per_worker is not None]
        busy = mean(numbers(p.busy for p in workers))
        cpu_w = mean([p.cpu_per_worker for p in workers])  # type: ignore[misc]
        rq_w = mean([p.rq_per_worker for p in workers])
        share = None
        if busy and cpu_w is not None and busy > 0:
            share = (cpu_w + (rq_w or 0.0)) / busy
        starts = numbers(as_list(ld.get("epoch_start_ms")))
        epochs = numbers(as_list(ld.get("epoch_ms")))
        return {
            "loader_id": lid,
            "loader": {
                "dataset": ld.get("dataset"),
                "batch_size": bs,
                **loader_settings(ld),
                # What feeds the loop: tune sets a torch DataLoader's settings only.
                "library": ld.get("library") or "torch",
                "knobs": as_dict(ld.get("knobs")) or None,
                # The class the script builds, where no framework builds it
                # (Accelerate's DataLoaderShard is not the user's to write).
                "loader_class": None if ld.get("framework") else ld.get("loader_class"),
                # ...and the framework that builds it, whose terms the recommendation uses.
                "framework": ld.get("framework"),
            }
            if ld
            else None,
            "batches_per_s": _round(rate, 3),
            "samples_per_s": _round(rate * bs, 1) if rate is not None and bs else None,
            "data_wait_fraction": _round(mean(numbers(p.wait for p in pts)), 4),
            "cpu_cores": _round(mean([c for _, c in self._job.cpu_cores]), 2),
            "other_cpu_cores": _round(mean([c for _, c in self._job.others]), 2),
            "worker_uss_bytes": self._job.worker_uss,
            "worker_rss_bytes": self._job.worker_rss,
            "epoch_start_ms": _round(median(starts[1:] or starts), 1),
            "first_epoch_start_ms": _round(starts[0], 1) if starts else None,
            "epoch_ms": _round(median(epochs), 1),
            "epochs": (pts[-1].epoch - pts[0].epoch) if len(pts) >= 2 else 0,
            "batches": (pts[-1].batches - pts[0].batches) if len(pts) >= 2 else 0,
            "steady_s": _round(self.steady_s, 2),
            # The measured window on the job's own monotonic clock (the frames'
            # ``window_mono_ns``), so a pace can be checked against the loop's
            # own record of the same seconds.
            "window_mono_ns": [pts[0].mono_ns, pts[-1].mono_ns]
            if len(pts) >= 2 and pts[0].mono_ns is not None and pts[-1].mono_ns is not None
            else None,
            "warmup_s": _round(self.steady_from - self.started, 2)
            if self.steady_from is not None and self.started is not None
            else None,
            # The settled pace (``pace``): False when it still rose at the
            # bound; the parts left out as slower; the loader's first epoch only.
            "settled": self.settled,
            "pace_rise": _round(self.pace_rise, 3),
            "left_out": list(self.left_out),
            "first_epoch_only": bool(pts) and pts[-1].epoch == self.first_epochs.get(lid, -1)
            if lid is not None
            else False,
            "wait_ms_mean": _round(mean(numbers(p.wait_ms for p in pts)), 2),
            "step_ms_mean": _round(mean(numbers(p.step_ms for p in pts)), 2),
            "worker_ms_per_batch": _round(mean(numbers(p.worker_ms for p in pts)), 2),
            "worker_busy_fraction": _round(busy, 3),
            "worker_cpu_share_of_busy": _round(share, 3),
            "usable_cores": self.usable_cores,
            "cuda_initialized": (self.job or {}).get("cuda_initialized"),
            "replay": as_dict(ld.get("replay")) or None,
            "hints": sorted(self.hint_ids),
            # What each worker-count hint promised (the last one seen), for the
            # ceiling to bound (sweep).
            "hint_speedups": {
                k: num(as_dict(h.get("evidence")).get("expected_speedup"))
                for k, h in sorted(self.hints.items())
                if num(as_dict(h.get("evidence")).get("expected_speedup")) is not None
            },
            "loaders_seen": [
                {
                    "id": i,
                    "dataset": x.get("dataset"),
                    "batch_size": as_int(x.get("batch_size")),
                    "num_workers": as_int(x.get("num_workers")),
                }
                for i, x in sorted(self.loaders.items())
            ],
        }


def _point(t: float, ld: Mapping) -> _Point:
    ws = live_workers(ld)
    busy = numbers(w.get("busy_fraction") for w in ws)
    cpu = numbers(w.get("cpu_percent") for w in ws)
    rq = numbers(w.get("runqueue_percent") for w in ws)
    mono = as_list(ld.get("window_mono_ns"))
    return _Point(
        t=t,
        mono_ns=as_int(mono[1]) if len(mono) == 2 else None,
        batches=as_int(ld.get("batches_total")) or 0,
        epoch=as_int(ld.get("epoch")) or 0,
        wait=num(ld.get("data_wait_fraction")),
        wait_ms=num(ld.get("wait_ms_mean")),
        step_ms=num(ld.get("step_ms_mean")),
        worker_ms=num(ld.get("worker_ms_per_batch")),
        busy=mean(busy),
        cpu_per_worker=(mean(cpu) / PERCENT_PER_CORE) if cpu else None,  # type: ignore[operator]
        rq_per_worker=(sum(rq) / PERCENT_PER_CORE / len(ws)) if rq and ws else 0.0,
    )


def _rate(pts: list[_Point]) -> float | None:
    """batches/s between the first and last point, on the job's clock when
    both frames carry it (else the collector's)."""
    if len(pts) < 2:
        return None
    a, b = pts[0], pts[-1]
    if a.mono_ns is not None and b.mono_ns is not None and b.mono_ns > a.mono_ns:
        dt = (b.mono_ns - a.mono_ns) / 1e9
    else:
        dt = b.t - a.t
    return (b.batches - a.batches) / dt if dt > 0 else None


@dataclass(frozen=True)
class Pace:
    """``pace``'s verdict. ``state``: "settled"; "rising" (from point
    ``split`` on the pace is ``rise`` times the pace before it); "short"
    (halves too short to compare: as good as settled once the window is
    ``trial_s`` long); "first-epoch"
    (the window has not left the loader's first epoch, or holds too little
    of the next to compare). ``cause`` of a rise: "first-epoch" (the next
    epoch ran faster) or "trend" (the later half ran faster)."""

    state: str
    split: int | None = None
    rise: float | None = None
    cause: str | None = None


def _comparable(pts: list[_Point]) -> bool:
    return len(pts) >= 2 and pts[-1].batches - pts[0].batches >= PART_MIN_BATCHES and _span(pts) >= PART_MIN_S


def _span(pts: list[_Point]) -> float:
    a, b = pts[0], pts[-1]
    if a.mono_ns is not None and b.mono_ns is not None:
        return (b.mono_ns - a.mono_ns) / 1e9
    return b.t - a.t


def _ratio(before: list[_Point], after: list[_Point]) -> float | None:
    a, b = _rate(before), _rate(after)
    return b / a if a and b is not None and a > 0 else None


def pace(pts: list[_Point], first_epoch: int | None = None) -> Pace:
    """Whether the steady points ``pts`` ran at a settled pace. With
    ``first_epoch`` (the loader's epoch at the first steady point): while
    the window starts in that epoch, it must have run into the next, and
    the next must be no faster than it. Then the later half must be no
    faster than the earlier, where both hold as many epoch starts. Halves too short to compare
    (``PART_MIN_BATCHES``, ``PART_MIN_S``) are "short": a pace that cannot
    be told from noise is not extended for, once the window is full."""
    if first_epoch is not None and pts and pts[0].epoch == first_epoch:
        split = next((i for i, p in enumerate(pts) if p.epoch > first_epoch), None)
        if split is None:
            return Pace("first-epoch")  # the window has not left the loader's first epoch
        before, after = pts[:split], pts[split:]
        if not _comparable(after):
            return Pace("first-epoch", split)  # too little of the next epoch to compare yet
        rise = _ratio(before, after) if len(before) >= 2 else None
        if rise is not None and rise > 1.0 + RISE_TOLERANCE:
            return Pace("rising", split, rise, "first-epoch")
    half = len(pts) // 2
    before, after = pts[: half + 1], pts[half:]
    if not (_comparable(before) and _comparable(after)):
        return Pace("short")
    if before[-1].epoch - before[0].epoch != after[-1].epoch - after[0].epoch:
        # An epoch start (its stall: what persistent_workers saves) in one
        # half and not the other is the pace, not a rise to leave out.
        return Pace("settled")
    rise = _ratio(before, after)
    if rise is not None and rise > 1.0 + RISE_TOLERANCE:
        return Pace("rising", half, rise, "trend")
    return Pace("settled", rise=rise)


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)
