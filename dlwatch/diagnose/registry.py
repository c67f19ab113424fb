"""What the engine needs to know about a rule, declared where the rule is.

Each ``rules_*.py`` module ends with a tuple of ``Rule`` records; the engine
reads warm-up freezing, precedence and ``dlwatch tune`` eligibility from them
instead of keeping its own lists of ids, so a renamed or new rule cannot fall
out of one of those lists unnoticed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

from .facts import Context

# Where a rule's hints live: a hint of scope "loader" carries a job_pid and a
# loader_id, "job" a job_pid only, "host" neither.
Scope = Literal["loader", "job", "host"]

RuleFn = Callable[[Context], list[dict[str, Any]]]


@dataclass(frozen=True)
class Rule:
    id: str
    check: RuleFn
    scope: Scope
    # Judges window rates: decides nothing while the figures it reads are
    # warming up (its loader; for "job", a job without a steady loader; for
    # "host", a loader that was steady and re-spawns its workers).
    rate: bool = False
    # Among hints that recommend different num_workers for one loader, the
    # lowest rank wins and the others defer to it. None: recommends no count.
    worker_count_rank: int | None = None
    # Ids of rules whose hints this one hides while it fires: everywhere for a
    # host-scoped rule, on its own loader for a loader-scoped one.
    supersedes: frozenset[str] = frozenset()
    # Its advice is a DataLoader setting that `dlwatch tune` can measure.
    tunable: bool = False


def registry(*groups: Iterable[Rule]) -> dict[str, Rule]:
    """One id → rule table from each module's rules; an id twice is a bug."""
    out: dict[str, Rule] = {}
    for group in groups:
        for rule in group:
            if rule.id in out:
                raise ValueError(f"rule id {rule.id!r} registered twice")
            out[rule.id] = rule
    return out
