"""One story per loader (diagnose/story.py): over every combination the
worker-count rules look at, the hints of a loader, the profiler's verdict
and a worker profile's verdict never point opposite ways on the worker
count; a burst's next step that would defers to the hints."""

from __future__ import annotations

import pytest

from dlwatch.diagnose import direction, evaluate, profile, story, worker_profile
from dlwatch.diagnose.story import LOWER, NONE, OTHERS, RAISE, contradicts, says
from tests.unit.test_diagnose_one_story import GRID, case

COUNT_HINTS = direction.COUNT_HINTS


def _profile_doc(wait: float) -> dict:
    """A profiler burst of loader 0 over the same figures as the hints."""
    fig = {"steps": 10, "step_ms_mean": 20.0 / (1 - wait), "data_wait_fraction": wait, "loader": {"id": 0}}
    return profile.summary(1000, fig, None)


def _worker_profile_docs() -> list[dict]:
    """The verdicts a worker profile gives: one stage dominating, or none."""
    docs = []
    for kinds in ({"decode": 0.7, "other": 0.3}, {"decode": 0.2, "transform": 0.2, "other": 0.6}):
        stages = [{"stage": k, "kind": k, "share": v} for k, v in kinds.items()]
        v = worker_profile.verdict({"samples": 100, "stages": stages, "kinds": kinds})
        assert v is not None
        docs.append(dict(v, loader={"id": 0}))
    return docs


def _stated(hints: list[dict], nw: int) -> list[tuple[str, set[str]]]:
    return [(h["id"], says(h["suggestion"], nw)) for h in hints if h["id"] in COUNT_HINTS]


def test_the_reader_of_directions():
    assert says("set num_workers=4 in DataLoader(...)", 2) == {RAISE}
    assert says("keep num_workers=0 in DataLoader(...): 1 would gain under 10 %", 0) == {NONE}
    assert says("lower num_workers=0 for loader 0 of PID 1", 2) == {LOWER}
    assert says("nothing to change in num_workers; … `dlwatch tune` measures it", 2) == {NONE}
    assert says("no lower num_workers is predicted faster; … `dlwatch tune` measures it", 2) == set()
    assert OTHERS in says("the best num_workers depends on them: measure with `dlwatch tune`")
    assert says("fix the input pipeline first: more DataLoader workers, a cheaper collate") == {RAISE}
    assert says("make each batch cheaper: decode once and cache it", 2) == set()
    assert contradicts({RAISE}, {NONE}) and contradicts({OTHERS}, {RAISE})
    assert not contradicts({RAISE}, {RAISE})


@pytest.mark.parametrize("usable", [2.0, 8.0])
def test_hints_and_both_bursts_tell_one_story(usable):
    wdocs = _worker_profile_docs()
    checked = 0
    for c in (c for c in GRID if c[5] == usable):
        nw, wait = c[0], c[1]
        hints = evaluate(case(*c))
        stated = _stated(hints, nw)
        where = f"case {c}: " + " | ".join(f"{h['id']}: {h['suggestion']}" for h in hints)
        # The hints of the loader among themselves.
        for i, (a, da) in enumerate(stated):
            for b, db in stated[i + 1 :]:
                assert not contradicts(da, db), f"{a} vs {b}: {where}"
        # The bursts' next steps, as the live view shows them beside the hints.
        docs = [_profile_doc(wait)] + wdocs
        for doc in docs:
            step = story.next_step(doc, hints, 1000)
            if step is None:
                continue
            for hid, d in stated:
                assert not contradicts(says(step, nw), d), f"{doc.get('verdict')} vs {hid}: {step} | {where}"
            checked += 1
    assert checked > 100


def test_the_field_case_the_profilers_data_bound_verdict_defers_to_the_hint():
    # Issue 32: "data-bound … more DataLoader workers … pin_memory=True" above
    # "nothing to change in num_workers".
    hints = [
        {
            "id": "workers-oversubscribe-cores",
            "severity": "info",
            "job_pid": None,
            "loader_id": None,
            "suggestion": "no lower num_workers is predicted faster; … `dlwatch tune` measures it",
            "evidence": {"recommended_num_workers_by_loader": []},
        },
        {
            "id": "cpu-bound-preprocessing",
            "severity": "warn",
            "job_pid": 1000,
            "loader_id": 0,
            "suggestion": "make each batch cheaper: decode/resize once and cache the result",
            "evidence": {"num_workers": 2, "recommended_num_workers": None},
        },
        {
            "id": "cores-shared-with-others",
            "severity": "warn",
            "job_pid": 1000,
            "loader_id": 1,
            "suggestion": "other processes use 1.4 of the 2 cores; the best num_workers depends on them",
            "evidence": {"num_workers": 2, "others_decide": True},
        },
    ]
    doc = _profile_doc(0.5)
    assert "more DataLoader workers" in doc["suggestion"]
    step = story.next_step(doc, hints, 1000)
    assert step == (
        "fix the input pipeline first, as the live view's cpu-bound-preprocessing hint says for "
        "loader 0: make each batch cheaper: decode/resize once and cache the result"
    )
    doc1 = dict(doc, loader={"id": 1})
    assert "depends on them" in (story.next_step(doc1, hints, 1000) or "")
    # No hint about the job: the burst's own words.
    assert story.next_step(doc, [], 1000) == doc["suggestion"]
