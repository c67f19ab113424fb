"""straggler-rank: the ranks of one run side by side."""

from __future__ import annotations

from dlwatch.diagnose import evaluate

from .test_diagnose_rules import get, ids, job, loader, snap


def rank(r, *, wait, step_ms, rate=10.0, run_id="run-a", world=2, pid=None, **kw):
    wait_ms = step_ms * wait / (1 - wait)
    ld = loader(wait=wait, step_ms=step_ms, wait_ms=wait_ms, batches_per_s=rate, pid_base=6000 + 10 * r, **kw)
    return job(
        pid or 2000 + r, loaders=[ld], rank=r, local_rank=r, world_size=world, run_id=run_id, cuda=False
    )


def straggling():
    # Rank 1 waits 40 ms a batch on a 60 ms compute; rank 0 computes 60 ms too
    # but its step reads 98 ms: 38 ms a step waiting for rank 1 at the all-reduce.
    return [rank(0, wait=0.02, step_ms=98.0), rank(1, wait=0.4, step_ms=60.0)]


def test_the_slow_rank_is_named_with_what_the_others_lose():
    hints = evaluate(snap(straggling()))
    h = get(hints, "straggler-rank")
    assert h["severity"] == "warn"
    assert (h["job_pid"], h["loader_id"]) == (2001, 0)
    ev = h["evidence"]
    assert ev["slow_rank"] == 1 and ev["slow_pid"] == 2001
    assert ev["data_wait_fraction"] == 0.4 and ev["wait_ms_mean"] == 40.0
    assert ev["fastest_compute_ms"] == 60.0 and ev["others_lost_ms_per_step"] == 38.0
    assert [x["rank"] for x in ev["ranks"]] == [0, 1]
    assert "Rank 1 (PID 2001)" in h["message"] and "38 ms a step" in h["message"]
    assert "40 %" in h["message"] and "rank 0" in h["message"]
    assert "PID 2001" in h["suggestion"] and "num_workers=2" in h["suggestion"]


def test_balanced_ranks_get_no_straggler():
    both_wait = [rank(0, wait=0.35, step_ms=60.0), rank(1, wait=0.4, step_ms=60.0)]
    assert "straggler-rank" not in ids(evaluate(snap(both_wait)))
    healthy = [rank(0, wait=0.01, step_ms=60.0), rank(1, wait=0.02, step_ms=61.0)]
    assert "straggler-rank" not in ids(evaluate(snap(healthy)))


def test_ranks_whose_pipelines_are_all_at_capacity_get_no_straggler():
    # Equal pipelines, both workers saturated: which rank arrives last is the
    # phase of the two (a QA run saw the blame switch ranks every few seconds).
    both_full = {"worker_kw": {"busy": 0.97, "cpu": 3.0}}
    jobs = [rank(0, wait=0.02, step_ms=81.0, **both_full), rank(1, wait=0.59, step_ms=33.0, **both_full)]
    assert "straggler-rank" not in ids(evaluate(snap(jobs)))
    # The fast rank's workers with headroom: rank 1 is the one to fix.
    jobs = [
        rank(0, wait=0.02, step_ms=81.0, worker_kw={"busy": 0.35}),
        rank(1, wait=0.59, step_ms=33.0, **both_full),
    ]
    assert get(evaluate(snap(jobs)), "straggler-rank")["evidence"]["slow_rank"] == 1


def test_ranks_not_in_lockstep_or_of_other_runs_are_not_compared():
    apart = [rank(0, wait=0.02, step_ms=98.0, rate=20.0), rank(1, wait=0.4, step_ms=60.0, rate=10.0)]
    assert "straggler-rank" not in ids(evaluate(snap(apart)))
    two_runs = [rank(0, wait=0.02, step_ms=98.0, run_id="a"), rank(1, wait=0.4, step_ms=60.0, run_id="b")]
    assert "straggler-rank" not in ids(evaluate(snap(two_runs)))
    # torchrun's --rdzv-id is "none" unless given: the rendezvous tells the runs apart.
    none = [rank(0, wait=0.02, step_ms=98.0, run_id="none"), rank(1, wait=0.4, step_ms=60.0, run_id="none")]
    none[0]["master"], none[1]["master"] = "10.0.0.1:29500", "10.0.0.2:29500"
    assert "straggler-rank" not in ids(evaluate(snap(none)))
    for j in none:
        j["master"] = "10.0.0.1:29500"
    assert "straggler-rank" in ids(evaluate(snap(none)))
    # The others lose nothing: a slow loader, but no rank waits for it.
    nobody_waits = [rank(0, wait=0.02, step_ms=60.0), rank(1, wait=0.4, step_ms=60.0)]
    assert "straggler-rank" not in ids(evaluate(snap(nobody_waits)))


def test_a_warming_or_gone_rank_is_not_judged():
    jobs = straggling()
    jobs[0]["loaders"][0]["batches_total"] = 3  # still warming up
    assert "straggler-rank" not in ids(evaluate(snap(jobs)))
    jobs = straggling()
    jobs[0]["state"] = "exited"
    assert "straggler-rank" not in ids(evaluate(snap(jobs)))


def test_a_run_partly_on_other_machines_says_what_is_compared():
    jobs = [rank(0, wait=0.02, step_ms=98.0, world=8), rank(1, wait=0.4, step_ms=60.0, world=8)]
    h = get(evaluate(snap(jobs)), "straggler-rank")
    assert "Only the 2 of 8 ranks on this machine are compared." in h["message"]


def test_across_hosts_the_straggler_and_the_others_are_named_with_their_host():
    jobs = straggling()
    jobs[0]["host"], jobs[1]["host"] = "node1", "node2"
    h = get(evaluate(snap(jobs)), "straggler-rank")
    assert "Rank 1 (PID 2001 on node2)" in h["message"] and "rank 0 on node1" in h["message"]
    assert "PID 2001 on node2" in h["suggestion"]
    ev = h["evidence"]
    assert ev["slow_host"] == "node2"
    assert [(x["rank"], x["host"]) for x in ev["ranks"]] == [(0, "node1"), (1, "node2")]
    jobs = [rank(0, wait=0.02, step_ms=98.0, world=8), rank(1, wait=0.4, step_ms=60.0, world=8)]
    jobs[0]["host"] = jobs[1]["host"] = "node1"
    h = get(evaluate(snap(jobs)), "straggler-rank")
    assert "Only the 2 of 8 ranks in sight are compared." in h["message"]


def test_the_straggler_hint_is_shown_with_every_rank_of_the_run():
    # Keyed to the slow rank; a fast rank loses its time waiting for it (a QA
    # run: the fast rank's view read "no hints for this job").
    from dlwatch.tui.hints import relevant_hints

    h = get(evaluate(snap(straggling())), "straggler-rank")
    assert relevant_hints([h], 2000) == ([h], 0)
    assert relevant_hints([h], 2001) == ([h], 0)
    assert relevant_hints([h], 3000) == ([], 1)
