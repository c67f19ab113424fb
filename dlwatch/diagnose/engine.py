"""From rule candidates to the hints on screen: warm-up gating and hysteresis.

The rules are instantaneous: "is the condition true in this snapshot?". Shown
as-is they would flicker, because every figure is a short-window average and
a training job is bursty (epoch boundaries, checkpoints, validation). This
layer adds the memory a human reader needs:

- a condition must hold for ``HOLD_ON_S`` before its hint appears, and be clear
  for ``HOLD_OFF_S`` before it disappears;
- a loader's rate figures are not judged while it warms up: its first
  batches (``WARMUP_RATE_S`` seconds' worth at its own batch rate, at least
  ``WARMUP_FEW_BATCHES`` and at most ``WARMUP_MIN_BATCHES``), and until
  ``WARMUP_STEADY_S`` — or the loader's own window, if longer — have passed
  since the first batch of an epoch whose workers were just spawned: the
  window then still contains the start-up stall. A job at 0.5 batch/s leaves
  warm-up after ~5 steps, one at 100 batch/s after 20 batches;
- while warming up, a hint already on screen stays and a pending one is
  forgotten (it must re-earn its hold on steady figures);
- a job that is not "live" gets no new hints; its shown ones fade after
  ``HOLD_OFF_S`` like any cleared condition, except that the hints about a
  job that has exited end with it, host-wide ones too once every job they
  name has exited;
- a loader's worker-count advice keeps its direction for a minute
  (direction.py), and whether other processes decide the counts is a held
  state (others.py);
- a loader not judged yet is listed (``judging``), so that no hint is never
  read as "nothing to fix" before the first judgement.

The only clock is ``snapshot["time"]``: replaying recorded snapshots gives the
same hints as watching them live.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from dlwatch.snapshot import set_aside, severity_rank

from . import (
    ceiling,
    direction,
    others,
    rules_cores,
    rules_epochs,
    rules_gpu,
    rules_hang,
    rules_memory,
    rules_order,
    rules_pipelines,
    rules_ranks,
    rules_sampled,
    rules_sharding,
    rules_threads,
    rules_workers,
    smoothing,
)
from .facts import (
    INACTIVE,
    STEADY,
    WARMUP,
    Context,
    MemSeries,
    as_dict,
    as_int,
    as_list,
    build_context,
    num,
)
from .registry import Rule, Scope, registry
from .render import with_tune_command

# A condition must hold this long before its hint shows: longer
# than one epoch-boundary blip, short enough to feel live.
HOLD_ON_S = 3.0
# Hints held already where they are decided: a stall is declared by the
# probe only after its own threshold (seconds of no batch), so its hint shows
# at once, beside nothing that contradicts it (quiet_beside_stall).
AT_ONCE = frozenset({"loader-stalled"})
# ... and be clear this long before the hint goes: longer than
# HOLD_ON_S so a borderline condition shows steadily instead of blinking.
HOLD_OFF_S = 5.0
# ... or this many of the loader's own windows, when longer (slow steps).
HOLD_OFF_WINDOWS = 2.0
# A loader's first batches are dominated by worker start-up and cold caches:
# a fast loader waits for 20 of them, a slow one for WARMUP_RATE_S seconds'
# worth at its own rate, but never fewer than one full window of batches
# (collect/window.py's MIN_WINDOW_BATCHES): a 2 s/step job is judged after
# 5 steps, not after 20 (40 s) nor never.
WARMUP_MIN_BATCHES = 20
WARMUP_FEW_BATCHES = 5
WARMUP_RATE_S = 10.0
# Seconds of steady batches after an epoch's first batch before its window
# figures are judged (the window, if longer, must also have slid past the stall).
WARMUP_STEADY_S = 3.0
# Snapshots further apart than this (monitor suspended, laptop asleep) say
# nothing about whether a condition held in between: pending timers restart.
STALE_GAP_S = 10.0

# Every rule, by id: each module declares its rules' scope and precedence
# (registry.py); the sets below are derived from those declarations.
REGISTRY: dict[str, Rule] = registry(
    rules_workers.RULES,
    rules_cores.RULES,
    rules_epochs.RULES,
    rules_memory.RULES,
    rules_gpu.RULES,
    rules_ranks.RULES,
    rules_sampled.RULES,
    rules_sharding.RULES,
    rules_order.RULES,
    rules_threads.RULES,
    rules_pipelines.RULES,
    rules_hang.RULES,
)


def _rate_rules(scope: Scope) -> frozenset[str]:
    return frozenset(r.id for r in REGISTRY.values() if r.rate and r.scope == scope)


# Loader-level rules that judge window rates: frozen while their loader warms up.
LOADER_RATE_RULES = _rate_rules("loader")
# Job-level rate rules: frozen while the job has no steady loader but one warming.
JOB_RATE_RULES = _rate_rules("job")
# Host-level rate rules: frozen while a loader that was steady re-warms (a
# non-persistent loader re-spawning its workers at an epoch start).
HOST_RATE_RULES = _rate_rules("host")


HintKey = tuple[str, int | None, int | None]  # (id, job_pid, loader_id)
Hint = dict[str, Any]
Fired = dict[HintKey, Hint]


@dataclass(frozen=True)
class LoaderTrack:
    epoch: int | None
    batches: int | None
    first_batch_at: float | None  # steady clock start: first batch seen this epoch
    was_steady: bool = False
    seen_at: float | None = None  # the first snapshot that held the loader
    judged_at: float | None = None  # first steady: its hints show HOLD_ON_S later


@dataclass(frozen=True)
class HintTrack:
    on_since: float | None  # condition continuously true since
    off_since: float | None  # shown, condition continuously false since
    shown: bool
    hint: dict[str, Any]
    severity_since: float | None = None  # a different severity fired continuously since


@dataclass(frozen=True)
class DiagnoseState:
    """Everything ``diagnose`` remembers between calls. Treat as opaque and
    immutable: every call returns a new one and never modifies the old."""

    time: float | None = None
    loaders: Mapping[tuple[int, int], LoaderTrack] = field(default_factory=dict)
    hints: Mapping[HintKey, HintTrack] = field(default_factory=dict)
    # (job_pid, worker_pid) -> (first_seen_t, ((t, uss, rss), ...), growth facts)
    mem: MemSeries = field(default_factory=dict)
    # rule id -> "ExcType: message" for rules that raised on the last snapshot
    rule_errors: Mapping[str, str] = field(default_factory=dict)
    # pid -> recent CPU samples (smoothing.py): CPU over the loader's window
    cpu: smoothing.History = field(default_factory=dict)
    # Whether other processes decide the worker counts (others.py), held
    others: others.OthersTrack = field(default_factory=others.OthersTrack)
    # (pid, loader id) -> the worker-count advice's direction, held (direction.py)
    directions: Mapping[tuple[int, int], direction.DirectionTrack] = field(default_factory=dict)
    # Loaders of live jobs not judged yet (their first warm-up), as ``judging`` lists them
    judging: tuple[dict[str, Any], ...] = ()
    # Loaders judged at least once: never "judging" again
    judged: frozenset[tuple[int, int]] = frozenset()


def _grace(window_s: float | None) -> float:
    return max(WARMUP_STEADY_S, window_s or 0.0)


def loader_grace(loader: Mapping[str, Any], window_s: float | None) -> float:
    """Seconds after an epoch's first batch before the loader's window has slid
    past the start-up stall: its own window (which stretches to cover enough
    batches of a slow job) when the collector says how long it is."""
    return _grace(max(window_s or 0.0, num(loader.get("window_s")) or 0.0))


def warmup_batches(loader: Mapping[str, Any]) -> int:
    """Batches a loader must have returned before its rates are judged,
    relative to its own batch rate (a rate unknown: the full count)."""
    rate = num(loader.get("batches_per_s"))
    if rate is None or rate <= 0:
        return WARMUP_MIN_BATCHES
    return max(WARMUP_FEW_BATCHES, min(WARMUP_MIN_BATCHES, math.ceil(rate * WARMUP_RATE_S)))


def _respawns_workers(loader: Mapping[str, Any]) -> bool:
    """Whether an epoch start re-creates workers (and stalls the loop)."""
    nw = as_int(loader.get("num_workers"))
    return bool(nw) and loader.get("persistent_workers") is not True


# A loader that re-spawns its workers every epoch is still judged across its
# epoch starts when its epochs are short (under this many graces: re-warming
# would leave little or no judged time in each) and each start stalls the
# loop for at most this fraction of a grace (the stall then moves a window's
# wait by at most that much). Issue 43: 3.3 s and 4.7 s epochs with ~0.2 s
# fork stalls and 41-55 % data wait showed no hint at all; spawned workers'
# seconds-long stalls (enable-persistent-workers' case) still re-warm.
EPOCH_PACE_MAX_GRACES = 2.0
EPOCH_PACE_MAX_STALL = 0.10


def _epoch_start_is_pace(loader: Mapping[str, Any], window_s: float | None) -> bool:
    """Whether the loader's epoch starts are part of its steady pace (above)."""
    grace_ms = 1000.0 * loader_grace(loader, window_s)
    epochs = [num(x) for x in as_list(loader.get("epoch_ms"))[-3:]]
    stalls = [num(x) for x in as_list(loader.get("epoch_start_ms"))[-3:]]
    if len(epochs) < 2 or not stalls or None in epochs or None in stalls:
        return False
    return max(epochs) < EPOCH_PACE_MAX_GRACES * grace_ms and max(stalls) <= EPOCH_PACE_MAX_STALL * grace_ms  # type: ignore[type-var, operator]


def history_says_steady(loader: Mapping[str, Any], window_s: float | None) -> bool:
    """Stateless warm-up test: enough batches (``warmup_batches``), and the
    current epoch's first batch is older than the loader's window
    (``epoch_first_batch_age_s``): the window holds no start-up stall.
    Snapshots from before that key: batches flowed in each of the last few
    one-second history samples."""
    batches = as_int(loader.get("batches_total"))
    if batches is None or batches < warmup_batches(loader):
        return False
    if "epoch_first_batch_age_s" in loader:
        age = num(loader.get("epoch_first_batch_age_s"))
        if age is not None and age >= loader_grace(loader, window_s):
            return True
        # A persistent loader's later epochs start without a re-spawn: no stall to wait out.
        epoch = as_int(loader.get("epoch"))
        # Nor one whose short epochs start cheaply (_epoch_start_is_pace).
        respawn_stall = _respawns_workers(loader) and not _epoch_start_is_pace(loader, window_s)
        return age is not None and not respawn_stall and epoch is not None and epoch > 1
    rates = [num(x) for x in as_list(as_dict(loader.get("history")).get("batches_per_s"))]
    need = math.ceil(_grace(window_s))
    recent = rates[-need:]
    return len(recent) >= need and all(v is not None and v > 0 for v in recent)


def _iter_loaders(snapshot: Mapping[str, Any]) -> Iterator[tuple[dict[str, Any], int, dict[str, Any], int]]:
    for job in as_list(snapshot.get("jobs")):
        if not isinstance(job, dict):
            continue
        pid = as_int(job.get("pid"))
        if pid is None:
            continue
        for ld in as_list(job.get("loaders")):
            lid = as_int(as_dict(ld).get("id"))
            if lid is not None:
                yield job, pid, ld, lid


def _taken_from(ld: Mapping[str, Any], job: Mapping[str, Any]) -> bool:
    """Whether the loop takes from the loader now: an iterator with an epoch
    open, not one the loop left for another (snapshot.set_aside)."""
    if ld.get("active") is False or ld.get("epoch_open") is False:
        return False
    return not set_aside(ld, as_list(job.get("loaders")))


def stateless_phases(snapshot: Mapping[str, Any]) -> dict[tuple[int, int], str]:
    window = num(snapshot.get("window_s"))
    out = {}
    for job, pid, ld, lid in _iter_loaders(snapshot):
        if ld.get("sampled") is True:
            # Attached to a running job: no batch clock to judge warm-up by,
            # and the job was running before anyone looked.
            out[(pid, lid)] = STEADY
        elif not _taken_from(ld, job):
            out[(pid, lid)] = INACTIVE
        else:
            out[(pid, lid)] = STEADY if history_says_steady(ld, window) else WARMUP
    return out


def _track_loaders(
    snapshot: Mapping[str, Any], old: Mapping[tuple[int, int], LoaderTrack], t: float
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], LoaderTrack]]:
    """Advance each loader's warm-up clock; return (phases, new tracks)."""
    window = num(snapshot.get("window_s"))
    phases: dict[tuple[int, int], str] = {}
    tracks: dict[tuple[int, int], LoaderTrack] = {}
    for job, pid, ld, lid in _iter_loaders(snapshot):
        key = (pid, lid)
        epoch = as_int(ld.get("epoch"))
        batches = as_int(ld.get("batches_total"))
        tr = old.get(key)
        if tr is None:
            # Attached mid-run: trust the job's own recent history rather than
            # making the user wait through a warm-up that already happened.
            start = t - loader_grace(ld, window) if history_says_steady(ld, window) else None
            tr = LoaderTrack(epoch, batches, start, seen_at=t)
        elif epoch != tr.epoch and _respawns_workers(ld) and not _epoch_start_is_pace(ld, window):
            tr = LoaderTrack(epoch, batches, None, tr.was_steady, tr.seen_at, tr.judged_at)
        else:
            start = tr.first_batch_at
            if start is None and batches is not None and tr.batches is not None and batches > tr.batches:
                start = t
            tr = LoaderTrack(epoch, batches, start, tr.was_steady, tr.seen_at, tr.judged_at)
        steady = (
            batches is not None
            and batches >= warmup_batches(ld)
            and tr.first_batch_at is not None
            and t - tr.first_batch_at >= loader_grace(ld, window)
        )
        if steady and not tr.was_steady:
            tr = replace(tr, was_steady=True, judged_at=t)
        tracks[key] = tr
        if ld.get("sampled") is True:
            phases[key] = STEADY  # as in stateless_phases
        elif not _taken_from(ld, job):
            phases[key] = INACTIVE
        else:
            phases[key] = STEADY if steady else WARMUP
    return phases, tracks


def _frozen_keys(ctx: Context, tracks: Mapping[tuple[int, int], LoaderTrack]) -> set[HintKey]:
    frozen: set[HintKey] = set()
    rewarming = False
    for job in ctx.live_jobs:
        pid = int(job["pid"])
        views = ctx.loaders_of(pid)
        warming = [lv for lv in views if lv.phase == WARMUP]
        for lv in warming:
            frozen.update((rid, pid, lv.lid) for rid in LOADER_RATE_RULES)
            tr = tracks.get((pid, lv.lid))
            rewarming = rewarming or bool(tr and tr.was_steady)
        if warming and not any(lv.steady for lv in views):
            frozen.update((rid, pid, None) for rid in JOB_RATE_RULES)
    if rewarming:
        frozen.update((rid, None, None) for rid in HOST_RATE_RULES)
    return frozen


def _run_rules(ctx: Context) -> tuple[Fired, dict[str, str]]:
    """All candidates keyed by hint key, plus rule errors (a buggy rule must
    not take the monitor down; its error is kept in the state for tests/logs)."""
    fired: Fired = {}
    errors: dict[str, str] = {}
    waits = {(lv.pid, lv.lid): lv.wait for lv in ctx.loaders}
    for rid, rule in REGISTRY.items():
        try:
            for h in rule.check(ctx):
                h = ceiling.bound_in(h, waits)
                if rule.tunable:
                    h = with_tune_command(h, ctx.snapshot)
                fired[(h["id"], h["job_pid"], h["loader_id"])] = h
        except Exception as e:  # noqa: BLE001 - see docstring
            errors[rid] = f"{type(e).__name__}: {e}"
    quiet = quiet_beside_stall(fired, ctx)
    fired = {k: h for k, h in fired.items() if k not in quiet}
    return _precedence(_only_sampled_inputs(fired, ctx)), errors


def quiet_beside_stall(keys: Mapping[HintKey, Any], ctx: Context) -> set[HintKey]:
    """The hints to keep off screen beside a stall: while a loader is stalled
    (``stalled_s``), the load and thread advice about it and its workers
    (``rules_hang.QUIET_WHILE_STALLED``) was read from windows in which
    nothing moved (idle workers at 0 % CPU, the cores busy with others) and
    only distracts from ``loader-stalled``. A host-wide one goes only when
    every loader it is about (its evidence's loaders, else every loader) is
    stalled. One step for the rules' candidates and the hints on screen."""
    stalled = {(lv.pid, lv.lid) for lv in ctx.loaders if num(lv.loader.get("stalled_s")) is not None}
    if not stalled:
        return set()
    everyone = {(lv.pid, lv.lid) for lv in ctx.loaders if lv.phase != INACTIVE}
    out: set[HintKey] = set()
    for key, item in keys.items():
        rid, pid, lid = key
        if rid not in rules_hang.QUIET_WHILE_STALLED:
            continue
        if pid is not None and lid is not None:
            if (pid, lid) in stalled:
                out.add(key)
            continue
        hint = item.hint if isinstance(item, HintTrack) else item
        ev = as_dict(as_dict(hint).get("evidence"))
        about: set[tuple[int, int]] = set()
        for e in map(as_dict, as_list(ev.get("recommended_num_workers_by_loader"))):
            jp, el = as_int(e.get("job_pid")), as_int(e.get("loader_id"))
            if jp is not None and el is not None:
                about.add((jp, el))
        if pid is not None:  # a job's: its own loaders
            about = about or {k for k in everyone if k[0] == pid}
        about = about or everyone
        if about and about <= stalled:
            out.add(key)
    return out


def _only_sampled_inputs(fired: Fired, ctx: Context) -> Fired:
    """An attached (sampled) job gets hints only from the rules whose inputs
    it has; the rest would read figures it does not have as if measured."""
    sampled = {as_int(j.get("pid")) for j in ctx.live_jobs if j.get("sampled") is True}
    if not sampled:
        return fired
    return {k: h for k, h in fired.items() if k[1] not in sampled or k[0] in rules_sampled.SAMPLED_RULE_IDS}


# One worker count per loader: where two hints recommend different counts for
# the same loader, the one of lowest ``Rule.worker_count_rank`` wins and the
# other defers to it (its evidence says so, its suggestion repeats the
# winner's count). Cores first (a count measured on starved workers is not one
# to follow), then the data-bound rules, then the advice to save resources.
WORKER_COUNT_PRECEDENCE = tuple(
    r.id
    for r in sorted(REGISTRY.values(), key=lambda r: (r.worker_count_rank or 0, r.id))
    if r.worker_count_rank is not None
)


def _precedence(fired: Fired) -> Fired:
    """Drop the hints a firing rule supersedes (registry.Rule.supersedes)."""
    hidden: set[HintKey] = set()  # (rule id, pid, lid); pid = lid = None: everywhere
    for (rid, pid, lid), h in fired.items():
        rule = REGISTRY.get(rid)
        if rule is None:
            continue
        covered = as_dict(h.get("evidence")).get("loaders_covered")
        if rule.scope == "host" and isinstance(covered, list):
            # A host hint that says which loaders it stands for hides theirs only.
            for e in covered:
                e = as_dict(e)
                hidden.update((sup, e.get("job_pid"), e.get("loader_id")) for sup in rule.supersedes)
            continue
        where = (None, None) if rule.scope == "host" else (pid, lid if rule.scope == "loader" else None)
        hidden.update((sup, *where) for sup in rule.supersedes)
    if hidden:
        fired = {
            k: h
            for k, h in fired.items()
            if not any((k[0], p, lid) in hidden for p, lid in ((None, None), (k[1], None), (k[1], k[2])))
        }
    return _one_count_per_loader(fired)


def _one_count_per_loader(fired: Fired) -> Fired:
    rank = {rid: i for i, rid in enumerate(WORKER_COUNT_PRECEDENCE)}
    counts: dict[tuple[Any, ...], list[tuple[int, str, int]]] = {}
    for (rid, pid, lid), h in fired.items():
        ev = as_dict(h.get("evidence"))
        if rid in rank and REGISTRY[rid].scope == "host":
            for e in as_list(ev.get("recommended_num_workers_by_loader")):
                e = as_dict(e)
                n = as_int(e.get("recommended_num_workers"))
                if n is not None:
                    counts.setdefault((e.get("job_pid"), e.get("loader_id")), []).append((rank[rid], rid, n))
        elif rid in rank:
            n = as_int(ev.get("recommended_num_workers"))
            if n is not None:
                counts.setdefault((pid, lid), []).append((rank[rid], rid, n))
    out = dict(fired)
    for (pid, lid), cands in counts.items():
        cands.sort()
        _, winner, n_win = cands[0]
        for _, rid, n in cands[1:]:
            if n == n_win:
                continue
            key = (rid, pid, lid)
            h = _copy_hint(out[key])
            h["evidence"].update(
                defers_to=winner, own_recommended_num_workers=n, recommended_num_workers=n_win
            )
            h["severity"] = "info"
            h["suggestion"] = (
                f"num_workers={n_win}, as {winner} recommends for this loader (it takes "
                f"precedence; on its own this hint would say num_workers={n})"
            )
            out[key] = h
    return out


def _sorted(hints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    def key(h: Hint) -> tuple[int, int, int, str]:
        return (
            severity_rank(h["severity"]),
            h["job_pid"] if h["job_pid"] is not None else -1,
            h["loader_id"] if h["loader_id"] is not None else -1,
            h["id"],
        )

    return sorted(hints, key=key)


def _copy_hint(h: dict[str, Any]) -> dict[str, Any]:
    out = dict(h)
    out["evidence"] = dict(h.get("evidence") or {})
    return out


def evaluate(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Instantaneous hints for one snapshot: no hysteresis, no slopes.

    For one-shot callers (``dlwatch snapshot``), whose window already averages
    over several seconds. Warm-up is judged from the loader's own history.
    """
    ctx = build_context(snapshot, stateless_phases(snapshot))
    fired, _ = _run_rules(ctx)
    return _sorted([_copy_hint(h) for h in fired.values()])


def _hold_off(snapshot: Mapping[str, Any]) -> dict[tuple[int, int] | None, float]:
    """Seconds a shown hint of each loader (key (pid, lid); host-wide: None)
    stays after its condition clears: ``HOLD_OFF_S``, or two of the loader's
    windows when they are longer (a 0.9 s/step job's 5-batch window is 4.5 s:
    one slow window must not blink its hints off and on)."""
    out: dict[tuple[int, int] | None, float] = {}
    for _job, pid, ld, lid in _iter_loaders(snapshot):
        out[(pid, lid)] = max(HOLD_OFF_S, HOLD_OFF_WINDOWS * (num(ld.get("window_s")) or 0.0))
    out[None] = max(out.values(), default=HOLD_OFF_S)
    return out


def _step_hysteresis(
    old: Mapping[HintKey, HintTrack],
    fired: Mapping[HintKey, Hint],
    frozen: set[HintKey],
    t: float,
    restart: bool,
    hold_off: Mapping[tuple[int, int] | None, float] | None = None,
    prev_t: float | None = None,
) -> dict[HintKey, HintTrack]:
    hold_off = hold_off or {}
    new: dict[HintKey, HintTrack] = {}
    for key in set(old) | set(fired):
        tr = old.get(key)
        pid, lid = key[1], key[2]
        off_s = hold_off.get((pid, lid) if pid is not None and lid is not None else None, HOLD_OFF_S)
        if key in fired:
            on = tr.on_since if (tr and tr.on_since is not None and not restart) else t
            shown = bool(tr and tr.shown) or t - on >= HOLD_ON_S or key[0] in AT_ONCE
            hint, since = fired[key], None
            if tr and tr.shown and not restart and hint["severity"] != tr.hint["severity"]:
                # A shown hint changes severity only once the new one has held
                # (HOLD_ON_S up, the hold-off down): a steady job's warning does
                # not blink to info and back on one window. Critical is news at once.
                since = tr.severity_since if tr.severity_since is not None else t
                up = severity_rank(hint["severity"]) < severity_rank(tr.hint["severity"])
                hold = 0.0 if hint["severity"] == "critical" else HOLD_ON_S if up else off_s
                if t - since < hold:
                    hint = tr.hint
                else:
                    since = None
            new[key] = HintTrack(on, None, shown, hint, since)
        elif tr is None:  # every key is fired or old: for the type checker
            continue
        elif key in frozen:
            if tr.shown:
                new[key] = tr
            elif tr.on_since is not None and prev_t is not None and not restart:
                # A pending hint's timer pauses rather than restarts: a loader
                # whose epochs re-spawn workers re-warms every epoch, and with
                # epochs shorter than its grace + HOLD_ON_S no hint ever showed
                # (issue 43: 4.7 s epochs, 55 % wait, "no hints"). Only judged
                # seconds count towards HOLD_ON_S.
                new[key] = replace(tr, on_since=tr.on_since + (t - prev_t))
        elif tr.shown:
            off = tr.off_since if tr.off_since is not None else t
            if t - off < off_s:
                new[key] = HintTrack(None, off, True, tr.hint)
    return new


def _end_with_their_jobs(
    hints: Mapping[HintKey, HintTrack], fired: Mapping[HintKey, Hint], snapshot: Mapping[str, Any]
) -> dict[HintKey, HintTrack]:
    """``hints`` without the ones fading about jobs that have exited: a hint
    about a dead job (a host-wide one: every job its evidence names under
    ``jobs``) is not held off beside the figures of the job that replaced it.
    A job unreachable or missing from one snapshot may be back: its hints
    fade as before."""
    exited = {
        pid
        for j in as_list(snapshot.get("jobs"))
        if as_dict(j).get("state") == "exited" and (pid := as_int(as_dict(j).get("pid"))) is not None
    }
    if not exited:
        return dict(hints)

    def ended(key: HintKey, hint: Mapping[str, Any]) -> bool:
        if key[1] is not None:
            return key[1] in exited
        named = [p for p in as_list(as_dict(hint.get("evidence")).get("jobs")) if isinstance(p, int)]
        return bool(named) and exited.issuperset(named)

    return {k: tr for k, tr in hints.items() if k in fired or not ended(k, tr.hint)}


# A loader's first judgement waits at most this long after its first steady
# figures for a pending hint to show (a condition that keeps flickering
# under its hold must not keep it "judging" forever).
JUDGING_MAX_PENDING_S = 15.0


def _judging(
    ctx: Context,
    tracks: Mapping[tuple[int, int], LoaderTrack],
    hints: Mapping[HintKey, HintTrack],
    judged: frozenset[tuple[int, int]],
    t: float,
    others_entering: bool = False,
) -> tuple[tuple[dict[str, Any], ...], frozenset[tuple[int, int]]]:
    """The live loaders not judged yet, and the loaders judged so far. A
    loader is judged once a hint about it (or its job, or the box) shows, or
    once its figures have been steady for HOLD_ON_S with no hint pending
    about it: until then no hint is not "nothing to fix". One state per
    loader at a time (issue 42: "judging… no hints until its rates settle"
    printed above the critical loader-stalled of the same loader): a shown
    hint of the loader itself, or a critical one of its job, judges it
    whether or not its rates ever settled (a loader stalled at start-up
    never does). A job-level warning or a box hint judges only a loader
    whose rates are steady: it says nothing about them. While the others'
    state (others.py) is entering, the box has a condition pending: the
    hints it decides come ENTER_S later, and a one-shot that stopped before
    printed "no hints" beside a loop waiting 60 % for cores the others held
    (fresh-clone CI of stop 50, test_mcp; reproduced beside six burners)."""
    shown: set[tuple[int | None, int | None]] = set()
    pending: set[tuple[int | None, int | None]] = {(None, None)} if others_entering else set()
    critical_jobs: set[int | None] = set()
    for (_rid, pid, lid), ht in hints.items():
        (shown if ht.shown else pending).add((pid, lid))
        if ht.shown and lid is None and ht.hint.get("severity") == "critical":
            critical_jobs.add(pid)
    out = []
    done = set(judged)
    for lv in ctx.loaders:
        key = (lv.pid, lv.lid)
        tr = tracks.get(key)
        if key in done or tr is None or lv.phase == INACTIVE:
            continue
        if key in shown or lv.pid in critical_jobs:
            done.add(key)
            continue
        about = {key, (lv.pid, None), (None, None)}
        if tr.was_steady and tr.judged_at is not None:
            held = t - tr.judged_at
            if about & shown or (held >= HOLD_ON_S and not about & pending) or held >= JUDGING_MAX_PENDING_S:
                done.add(key)
                continue
        since = tr.seen_at if tr.seen_at is not None else t
        why = f"a condition must hold {HOLD_ON_S:.0f} s before its hint shows" if tr.was_steady else None
        out.append(judging_entry(lv.pid, lv.lid, t - since, lv.loader, why))
    judged_now = frozenset(k for k in done if k in tracks)
    named = {pid for (pid, _lid) in shown} | _named_finished(hints)
    return (*out, *between_epochs(ctx.snapshot, judged_now, named)), judged_now


def _named_finished(hints: Mapping[HintKey, HintTrack]) -> set[int | None]:
    """The jobs a shown hint names as ranks that finished their epoch
    (``uneven-ranks``' ``finished_ranks``): their verdict is that hint. A
    one-shot of a DDP hang otherwise listed the finished rank as judging
    ("no epoch open") beside the hint that explains it, and watched the
    whole judge cap (7 s) for an epoch that never begins."""
    return {
        pid
        for ht in hints.values()
        if ht.shown
        for r in as_list(as_dict(ht.hint.get("evidence")).get("finished_ranks"))
        if isinstance(pid := as_dict(r).get("pid"), int)
    }


def between_epochs(
    snapshot: Mapping[str, Any], judged: frozenset[tuple[int, int]], named: set[int | None]
) -> list[dict[str, Any]]:
    """Live jobs not judged yet whose loaders have no epoch open (the last
    one ended, the next has not begun): no closed loader is judging, and a
    one-shot taken there (a non-persistent job's workers exiting at an
    epoch's end: "gone (process 8039 exited)") printed a bare "hints: none".
    One entry for the job's newest loader says why there is no verdict yet;
    a job with a judged loader or a shown hint (``named``) has one."""
    out = []
    for j in as_list(snapshot.get("jobs")):
        if not isinstance(j, dict) or j.get("state", "live") != "live" or j.get("pid") in named:
            continue
        lds = [
            ld for ld in as_list(j.get("loaders")) if isinstance(ld, dict) and ld.get("sampled") is not True
        ]
        if not lds or any(ld.get("active") is not False and ld.get("epoch_open") is not False for ld in lds):
            continue
        if any((j.get("pid"), ld.get("id")) in judged for ld in lds):
            continue
        ld = max(lds, key=lambda d: d["id"] if isinstance(d.get("id"), int) else -1)
        # Only a DataLoader says persistent_workers (False, with workers):
        # Grain's, nodes' or WebDataset's loaders (None) re-spawn nothing.
        respawn = (
            ", its workers exiting with it (persistent_workers off)"
            if ld.get("persistent_workers") is False and (as_int(ld.get("num_workers")) or 0) > 0
            else ""
        )
        why = (
            f"no epoch open: the last one ended{respawn} and the next has not started; "
            "its rates are judged while an epoch runs"
        )
        out.append({"job_pid": j.get("pid"), "loader_id": ld.get("id"), "judging_s": None, "reason": why})
    return out


def judging_entry(
    pid: int, lid: int, seconds: float | None, loader: Mapping[str, Any], why: str | None = None
) -> dict[str, Any]:
    """One loader's warm-up as the snapshot's ``judging`` lists it."""
    need = warmup_batches(loader)
    have = as_int(loader.get("batches_total")) or 0
    if why is None:
        started = "its window still holds the epoch's start-up"
        why = f"{have} of the {need} batches its rates are judged after" if have < need else started
    return {
        "job_pid": pid,
        "loader_id": lid,
        "judging_s": None if seconds is None else round(seconds, 1),
        "reason": why,
    }


def judging(snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Stateless ``judging`` for one-shot callers: the loaders of live jobs
    whose own history says they are still warming up (``judging_s``: since
    the epoch's first batch, when the loader says)."""
    ctx = build_context(snapshot, stateless_phases(snapshot))
    return [
        judging_entry(lv.pid, lv.lid, num(lv.loader.get("epoch_first_batch_age_s")), lv.loader)
        for lv in ctx.loaders
        if lv.phase == WARMUP
    ]


def diagnose(
    snapshot: Mapping[str, Any], state: DiagnoseState | None = None
) -> tuple[list[dict[str, Any]], DiagnoseState]:
    """Hints to show for ``snapshot`` given the state of the previous call.

    Pure: reads nothing but its arguments, never modifies them, and returns a
    new state. Hints are fresh dicts, sorted critical → warn → info.
    """
    state = state or DiagnoseState()
    t = num(snapshot.get("time")) if isinstance(snapshot, Mapping) else None
    if t is None:
        # No clock, no hold times: keep showing what was shown.
        shown = [_copy_hint(tr.hint) for tr in state.hints.values() if tr.shown]
        return _sorted(shown), state
    restart = state.time is None or t < state.time or t - state.time > STALE_GAP_S
    phases, tracks = _track_loaders(snapshot, state.loaders, t)
    mem = rules_memory.update_mem_series(dict(state.mem), snapshot, t)
    judged, cpu = smoothing.smooth_cpu(snapshot, {} if restart else state.cpu, t)
    ctx = build_context(judged, phases, mem)
    held_others = others.step(state.others, ctx, t, restart)
    ctx = replace(ctx, others_decide=held_others.on, others_peak=held_others.peak if held_others.on else None)
    fired, errors = _run_rules(ctx)
    frozen = _frozen_keys(ctx, tracks)
    # A rule that raised says nothing: keep its shown hints as they were.
    frozen.update(k for k in state.hints if k[0] in errors)
    # A loader's worker-count advice keeps its direction (direction.py): the
    # hints that would turn it wait, the shown ones stay as they were.
    shown_keys = {k for k, tr in state.hints.items() if tr.shown}
    on_screen = direction.displayed(shown_keys, ctx)
    dirs, held = direction.step(state.directions, direction.candidates(fired, ctx), t, on_screen)
    dirs = {k: v for k, v in dirs.items() if k in tracks}  # bounded: the loaders of this snapshot
    waiting = direction.held_keys(fired, shown_keys, held)
    fired = {k: h for k, h in fired.items() if k not in waiting}
    frozen |= waiting
    hints = _step_hysteresis(state.hints, fired, frozen, t, restart, _hold_off(judged), state.time)
    hints = direction.without_faded_rivals(hints, fired, dirs)
    # A hint shown before the stall goes at once, not after its hold-off.
    quiet = quiet_beside_stall(hints, ctx)
    hints = {k: tr for k, tr in hints.items() if k not in quiet}
    hints = _end_with_their_jobs(hints, fired, snapshot)
    entering = not held_others.on and held_others.since is not None
    judging_now, judged_loaders = _judging(ctx, tracks, hints, state.judged, t, entering)
    new_state = DiagnoseState(
        time=t,
        loaders=tracks,
        hints=hints,
        mem=mem,
        rule_errors=errors,
        cpu=cpu,
        others=held_others,
        directions=dirs,
        judging=judging_now,
        judged=judged_loaders,
    )
    shown = [_copy_hint(tr.hint) for tr in hints.values() if tr.shown]
    return _sorted(shown), new_state


class Diagnoser:
    """Stateful convenience wrapper: feed snapshots in time order."""

    def __init__(self) -> None:
        self.state = DiagnoseState()

    def update(self, snapshot: Mapping[str, Any]) -> list[dict[str, Any]]:
        hints, self.state = diagnose(snapshot, self.state)
        return hints

    def judging(self) -> list[dict[str, Any]]:
        """The loaders the last ``update`` had not judged yet (the snapshot's
        ``judging``): views say "judging… (N s)", never "nothing to fix"."""
        return [dict(e) for e in self.state.judging]

    def reset(self) -> None:
        self.state = DiagnoseState()
