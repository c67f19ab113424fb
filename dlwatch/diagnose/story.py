"""One story per loader across the hints, the profiler's and the worker
profile's verdicts, and tune's recommendation.

Each of them judges its own measurement: the hints a loader's window, a
profiler burst ten steps, a worker profile its workers' stacks, `dlwatch
tune` whole trials. They may add detail to each other, never point opposite
ways about the same knob (issue 32: the profiler's "more DataLoader workers
… pin_memory=True" right above the hints' "nothing to change in
num_workers"). The worker count is the knob they all speak about, so each
statement is read for its direction on it (``directions``) and a burst's
next step that contradicts the hints on screen defers to them
(``next_step``): the hints judge the same job over its window with the
cores' accounting a burst does not have.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from .direction import HOST_HINT, LOADER_HINTS, LOWER, NONE, OTHERS, RAISE, _of_hint
from .facts import as_dict, as_int, as_list

# How free text states a direction on the worker count (suggestions of the
# hints, the bursts' next steps, tune's recommendation).
_NONE = r"keep (dataloader_)?num_workers|nothing to change in num_workers|more workers cannot help"
_SAYS = (
    (OTHERS, re.compile(r"best num_workers depends on")),
    (NONE, re.compile(_NONE)),
    (LOWER, re.compile(r"fewer (DataLoader )?workers|(?<!no )lower num_workers")),
    (RAISE, re.compile(r"more (DataLoader )?workers(?! cannot)|raise num_workers")),
)
_SET = re.compile(r"(?:set )?num_workers=(\d+)")

# Directions that cannot both be the advice for one loader.
_OPPOSITE = {
    frozenset({RAISE, LOWER}),
    frozenset({RAISE, NONE}),
    frozenset({LOWER, NONE}),
    frozenset({RAISE, OTHERS}),
    frozenset({LOWER, OTHERS}),
}


def says(text: str, num_workers: int | None = None) -> set[str]:
    """The directions on the worker count a sentence states (empty: none).
    "set num_workers=N" reads against ``num_workers`` when it is known."""
    out = {d for d, pat in _SAYS if pat.search(text)}
    if num_workers is not None:
        for m in _SET.finditer(text):
            n = int(m.group(1))
            if n > num_workers:
                out.add(RAISE)
            elif n < num_workers:
                out.add(LOWER)
    return out


def contradicts(a: Iterable[str], b: Iterable[str]) -> bool:
    return any(frozenset({x, y}) in _OPPOSITE for x in a for y in b if x != y)


# The key of a direction a host-wide hint states for every loader.
ANY_LOADER = -1


def hint_directions(
    hints: Iterable[Mapping[str, Any]], job_pid: int | None
) -> dict[int, tuple[str, dict[str, Any]]]:
    """Each loader's direction in the worker-count hints of a job (loader id ->
    (direction, the hint saying it)); the first hint of a loader wins, as
    the views list them worst first."""
    out: dict[int, tuple[str, dict[str, Any]]] = {}
    for h in hints:
        if not isinstance(h, Mapping):
            continue
        rid, ev = h.get("id"), as_dict(h.get("evidence"))
        if rid in LOADER_HINTS and h.get("job_pid") == job_pid:
            lid = as_int(h.get("loader_id"))
            if lid is not None and lid not in out:
                out[lid] = (_of_hint(h, as_int(ev.get("num_workers"))), dict(h))
        elif rid == HOST_HINT:
            cut = False
            for e in as_list(ev.get("recommended_num_workers_by_loader")):
                e = as_dict(e)
                lid = as_int(e.get("loader_id"))
                if e.get("job_pid") == job_pid and lid is not None and lid not in out:
                    out[lid] = (LOWER, dict(h))
                    cut = True
            if not cut:
                # No lower count: said of every loader of every job.
                out.setdefault(ANY_LOADER, (NONE, dict(h)))
    return out


def next_step(doc: Mapping[str, Any], hints: Any, job_pid: int | None) -> str | None:
    """A burst's next step (``doc``: a profile or worker profile summary)
    that does not contradict the worker-count hints shown for the job: its
    own where it agrees or says nothing about the count, else the hint's."""
    own = doc.get("suggestion")
    if not isinstance(own, str) or not own:
        return None
    by_loader = hint_directions([h for h in as_list(hints) if isinstance(h, Mapping)], job_pid)
    lid = as_int(as_dict(doc.get("loader")).get("id"))
    if lid is None:
        lid = as_int(doc.get("loader_id"))
    if lid in by_loader:
        told = [(lid, *by_loader[lid])]
    else:
        told = [(k, *v) for k, v in by_loader.items() if lid is None or k in (lid, ANY_LOADER)]
    said = says(own)
    for loader_id, direction, h in told:
        if contradicts(said, {direction}):
            first = (
                "fix the input pipeline first" if doc.get("verdict") == "data-bound" else "for the workers"
            )
            said_by = f"the live view's {h.get('id')} hint says" + (
                f" for loader {loader_id}" if loader_id != ANY_LOADER else ""
            )
            return f"{first}, as {said_by}: {h.get('suggestion')}"
    return own
