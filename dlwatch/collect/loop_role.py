"""Whose wait a loader's figures are: the training loop's, a feeder's, a stage's.

Pure: from what the probe says of a loader (probe/stats.py ``frame``) and of
the job's threads. The wait that matters is the training thread's blocking
``next()`` (DESIGN.md §9):

- ``loop``: the loader's main figures are the loop's wait. The loader is
  iterated by the thread that trains (the main thread, or the thread that
  steps the optimizer), or it feeds that thread through a queue the probe
  found, and then the main figures are already the loop's side of it.
- ``feeder``: iterated on another thread, and how its batches reach the loop
  is not seen: its figures are the feeder's own (how busy that thread is),
  and the loop's wait is n/a, with the reason and the one line that fixes it.
- ``stage``: its ``next()`` ran inside another measured loader's on the same
  thread (a DataLoader under WebDataset's ``WebLoader``): the outer one is
  the loop's.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

LOOP, FEEDER, STAGE = "loop", "feeder", "stage"
WATCH_FIX = "wrap what the training loop iterates with dlwatch.watch(...)"


def loop_role(
    ld: Mapping[str, Any], train_threads: Sequence[Mapping[str, Any]] = ()
) -> tuple[str, str | None]:
    """(role, why the loop's wait is n/a for it, or None)."""
    lid = ld.get("id")
    outer = ld.get("nested_in")
    if isinstance(outer, int) and not isinstance(outer, bool):
        return STAGE, (
            f"loader {lid} runs inside loader {outer}'s next() on the same thread: it is a stage of "
            f"loader {outer}, whose wait is the loop's"
        )
    if isinstance(ld.get("consumer"), Mapping):
        return LOOP, None
    on = ld.get("iterated_on")
    if not isinstance(on, Mapping) or on.get("main") is not False:
        return LOOP, None
    trains = on.get("trains")
    if trains is True:
        return LOOP, None
    thread = str(on.get("thread") or "?")
    steppers = [str(t.get("thread")) for t in train_threads if isinstance(t, Mapping) and t.get("thread")]
    if trains is False and steppers:
        who = f"thread '{steppers[0]}' steps the optimizer"
    else:
        who = "no thread has stepped a torch optimizer yet, so which one trains is not known"
    return FEEDER, (
        f"loader {lid} is iterated on thread '{thread}', not the training thread ({who}), and its "
        f"batches reach the loop some way dlwatch does not see (not a queue.Queue): the figures are "
        f"that feeder's; {WATCH_FIX}"
    )


def no_loader_yet(job: Mapping[str, Any]) -> str:
    """What a hooked job that has iterated nothing dlwatch recognises says
    (the TUI and the text views alike)."""
    steppers = [t for t in job.get("train_threads") or [] if isinstance(t, dict)]
    if steppers:
        t = steppers[0]
        return (
            f"hooked; training (thread '{t.get('thread')}' has stepped the optimizer {t.get('steps')} times) "
            "but no loader seen yet: wrap what the loop iterates with dlwatch.watch(...), or a function it "
            "calls for each batch as an iterator: dlwatch.watch(iter(lambda: get_batch(...), None))"
        )
    return (
        "hooked; no loader seen yet: figures appear at the first iter(loader), or wrap the iterable "
        "with dlwatch.watch(...)"
    )
