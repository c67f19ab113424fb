"""Worker-count advice that does not change direction every few windows.

Each rule judges one window, and a loader near a threshold (a predicted gain
around 1.10×, the free cores around a whole one) reads one way in one window
and the other way in the next: the field case of issue 32 said "nothing to
lower", "lower num_workers=0" and "nothing to change" within two minutes.
The hint hysteresis (engine.py) holds a hint's presence and severity for
seconds; this holds the *direction* of a loader's worker-count advice —
``raise``, ``lower``, ``none`` (a hint that says nothing to change) or
``others`` (other processes decide, others.py) — for a minute:

- a loader's first direction is taken as it comes, and until a hint that
  carries it is on screen it follows the rules freely (holding a direction
  nobody has read would keep the first hint off the screen: a no-workers
  hint whose gain crossed the bar every second on a busy box showed nothing
  for the whole minute);
- another direction replaces it only once it has held ``CONFIRM_S`` and the
  shown one has been shown ``DWELL_S``; meanwhile the hints that carry the
  shown direction stay as they were and the new ones wait;
- ``others`` is taken at once (its own state already held ``others.ENTER_S``
  and is released slowly): it is the advice that does not move.

A loader without any worker-count hint has no direction to hold: its hints
come and go by the ordinary hysteresis.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .facts import Context, as_dict, as_int, as_list

# A shown direction stays at least this long: advice that flips inside a
# minute is not advice (issue 32).
DWELL_S = 60.0
# A new direction must hold this long, continuously, before it replaces the
# shown one (several 3 s windows: one window near a threshold is not news).
CONFIRM_S = 20.0

RAISE, LOWER, NONE, OTHERS = "raise", "lower", "none", "others"

# Hints that carry a loader's worker-count direction (the oversubscription
# hint carries it for every loader it names).
LOADER_HINTS = frozenset(
    {
        "no-workers",
        "add-workers",
        "io-bound",
        "cpu-bound-preprocessing",
        "pipeline-has-headroom",
        "cores-shared-with-others",
    }
)
HOST_HINT = "workers-oversubscribe-cores"
OTHERS_HINT = "cores-shared-with-others"
# Every hint that speaks about a loader's worker count.
COUNT_HINTS = LOADER_HINTS | {HOST_HINT}

LoaderKey = tuple[int, int]
HintKey = tuple[str, int | None, int | None]


@dataclass(frozen=True)
class DirectionTrack:
    shown: str
    shown_since: float
    pending: str | None = None
    pending_since: float | None = None


def _of_hint(h: Mapping[str, Any], nw: int | None) -> str:
    """The direction one hint states: its recommended count against the
    current one. A count hint whose gain is under the bar recommends none
    (rules_workers._nothing_to_gain), so it reads as "none"."""
    ev = as_dict(h.get("evidence"))
    if ev.get("others_decide") is True:
        return OTHERS
    rec = as_int(ev.get("recommended_num_workers"))
    if rec is None or nw is None or rec == nw:
        return NONE
    return RAISE if rec > nw else LOWER


def candidates(fired: Mapping[HintKey, Mapping[str, Any]], ctx: Context) -> dict[LoaderKey, str]:
    """Each steady loader's worker-count direction in this snapshot's hints."""
    nws = {(lv.pid, lv.lid): lv.num_workers for lv in ctx.loaders if lv.steady}
    found: dict[LoaderKey, set[str]] = {}
    for (rid, pid, lid), h in fired.items():
        if rid in LOADER_HINTS and pid is not None and lid is not None and (pid, lid) in nws:
            found.setdefault((pid, lid), set()).add(_of_hint(h, nws[(pid, lid)]))
    host = fired.get((HOST_HINT, None, None))
    if host is not None:
        by_loader = as_list(as_dict(host.get("evidence")).get("recommended_num_workers_by_loader"))
        cut = {(as_int(as_dict(e).get("job_pid")), as_int(as_dict(e).get("loader_id"))) for e in by_loader}
        for key, nw in nws.items():
            if nw:
                found.setdefault(key, set()).add(LOWER if key in cut else NONE)
    out = {}
    for key, dirs in found.items():
        # One count per loader (engine precedence) leaves raise and lower apart;
        # a loader the others decide has that one story.
        out[key] = next(d for d in (OTHERS, RAISE, LOWER, NONE) if d in dirs)
    return out


def displayed(shown: set[HintKey], ctx: Context) -> set[LoaderKey]:
    """The loaders whose worker-count direction is on screen: a shown hint
    carries it (the host-wide oversubscription hint: every loader with
    workers)."""
    out: set[LoaderKey] = set()
    for rid, pid, lid in shown:
        if rid in LOADER_HINTS and pid is not None and lid is not None:
            out.add((pid, lid))
    if any(rid == HOST_HINT for rid, _pid, _lid in shown):
        out |= {(lv.pid, lv.lid) for lv in ctx.loaders if lv.num_workers}
    return out


def step(
    old: Mapping[LoaderKey, DirectionTrack],
    cands: Mapping[LoaderKey, str],
    t: float,
    on_screen: set[LoaderKey] | None = None,
) -> tuple[dict[LoaderKey, DirectionTrack], set[LoaderKey]]:
    """New tracks, and the loaders whose shown direction holds against this
    snapshot's (their direction-carrying hints stay as shown). ``on_screen``:
    the loaders whose direction a shown hint carries (None: all); the others'
    directions follow their candidates."""
    new: dict[LoaderKey, DirectionTrack] = {}
    held: set[LoaderKey] = set()
    for key in set(old) | set(cands):
        tr, cand = old.get(key), cands.get(key)
        if tr is None or (on_screen is not None and key not in on_screen):
            if cand is not None:
                new[key] = tr if tr is not None and tr.shown == cand else DirectionTrack(cand, t)
            elif tr is not None:
                new[key] = DirectionTrack(tr.shown, tr.shown_since)
            continue
        if cand is None or cand == tr.shown:
            new[key] = DirectionTrack(tr.shown, tr.shown_since)
            continue
        since = tr.pending_since if tr.pending == cand and tr.pending_since is not None else t
        if cand == OTHERS or (t - since >= CONFIRM_S and t - tr.shown_since >= DWELL_S):
            new[key] = DirectionTrack(cand, t)
        else:
            new[key] = DirectionTrack(tr.shown, tr.shown_since, cand, since)
            held.add(key)
    return new, held


def held_keys(fired: Mapping[HintKey, Any], shown: set[HintKey], held: set[LoaderKey]) -> set[HintKey]:
    """The hint keys that carry a held loader's direction, fired now or shown."""
    out: set[HintKey] = set()
    if not held:
        return out
    for key in set(fired) | shown:
        rid, pid, lid = key
        if rid in LOADER_HINTS and (pid, lid) in held:
            out.add(key)
        elif rid == HOST_HINT:
            out.add(key)
    return out


def without_faded_rivals(
    hints: Mapping[HintKey, Any], fired: Mapping[HintKey, Any], dirs: Mapping[LoaderKey, DirectionTrack]
) -> dict[HintKey, Any]:
    """Once a loader's "others decide" hint shows, the hints of the direction
    it replaced go at once instead of fading beside it for the hold-off: two
    stories on screen for seconds is what the state is there to prevent.
    ``hints``: the engine's hint tracks (``.shown``)."""
    told = {
        key
        for key, tr in dirs.items()
        if tr.shown == OTHERS and getattr(hints.get((OTHERS_HINT, *key)), "shown", False)
    }
    if not told:
        return dict(hints)
    out = {}
    for key, tr in hints.items():
        rid, pid, lid = key
        rival = key not in fired and rid != OTHERS_HINT
        if rival and ((rid in LOADER_HINTS and (pid, lid) in told) or (rid == HOST_HINT and told)):
            continue
        out[key] = tr
    return out
