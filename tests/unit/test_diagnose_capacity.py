"""CPU accounting from measurement and the predicted gain of worker-count hints.

The numbers mirror the issue's real-box findings: a trainer whose intra-op
threads use 1.7 of 2 cores has no free core for a worker; a sleeping step
leaves one; other processes' load is no one's free core."""

from __future__ import annotations

import json

import psutil
import pytest

from dlwatch.collect import host as host_mod
from dlwatch.collect.model import cpu_accounting
from dlwatch.diagnose import capacity, evaluate
from dlwatch.diagnose.engine import build_context, stateless_phases
from tests.unit.test_diagnose_rules import (
    cpu_bound_loader,
    get,
    ids,
    io_bound_loader,
    job,
    loader,
    one,
    snap,
    worker,
)


def no_workers(main_cpu, main_thread, *, wait_ms=30.0, step_ms=60.0, **snap_kw):
    wait = wait_ms / (wait_ms + step_ms)
    ld = loader(nw=0, wait=wait, step_ms=step_ms, wait_ms=wait_ms)
    return one(ld, job_kw={"main_cpu": main_cpu, "main_thread_cpu": main_thread, "cuda": False}, **snap_kw)


def beside_others(main_cpu, main_thread, *, wait_ms, step_ms, others, runqueue):
    """A 0-worker loop on 2 cores others use ``others`` of, with its main
    thread's run-queue wait: the snapshot, its context and its loader."""
    s = no_workers(
        main_cpu, main_thread, wait_ms=wait_ms, step_ms=step_ms, usable=2.0, other_cpu_cores=others,
        gpus=[], gpu_status="n/a",
    )  # fmt: skip
    s["jobs"][0]["main_runqueue_percent"] = runqueue
    ctx = build_context(s, stateless_phases(s))
    (lv,) = ctx.loaders
    return s, ctx, lv


def test_no_workers_promises_nothing_when_the_loops_threads_fill_the_cores():
    # 30 ms loading + 60 ms step on 2 intra-op threads: the step's threads use
    # 2.0 cores (120 core-ms in 60 ms), so a worker's 30 ms of CPU stretches
    # the step by as much (the sweep's finding): 1.00x, where the CPU sum
    # (150 core-ms on 2 cores) promised 1.2x.
    s = no_workers(167.0, 100.0, usable=2.0, gpus=[], gpu_status="n/a", other_cpu_cores=0.0)
    h = get(evaluate(s), "no-workers")
    ev = h["evidence"]
    # ≈ 1.00×: no setting advised (issue 32); the count weighed stays in the
    # evidence and is the one the tune command measures.
    assert ev["recommended_num_workers"] is None and ev["considered_num_workers"] == 1
    assert h["suggestion"].startswith(
        "keep num_workers=0 in DataLoader(...): 1 would gain under 10 %, expected ≈ 1.00× throughput"
    )
    assert "set num_workers" not in h["suggestion"] and "dlwatch tune --workers 0,1" in h["suggestion"]
    assert ev["expected_speedup"] == pytest.approx(1.0, abs=0.02)
    assert ev["expected_bound"] == "shared cores"
    assert h["severity"] == "info" and "expected ≈ 1.00×" in h["message"]
    assert ev["model"]["trainer_cores"] == pytest.approx(2.0, abs=0.02)
    assert ev["cpu_accounting"]["trainer_cpu_cores"] == pytest.approx(1.67)


def test_no_workers_beside_others_prices_the_share_a_worker_wins():
    # Two CPU burners on 2 cores (bench/advice_check.py --burners 2, workload
    # b): the loop loads 23 ms of CPU a batch itself beside a 30 ms sleeping
    # step, at 0.3 of a core and 19 % in the run queue. A worker is one more
    # runnable thread: it wins a share of the cores the burners hold. Priced
    # with the 0-worker job's share (0.46 cores) 1 worker read 1.36x; the
    # sweep measured 1.76x (2 and 3 workers: 2.03x, 2.14x).
    s, ctx, lv = beside_others(32.0, 31.0, wait_ms=43.0, step_ms=31.0, others=1.7, runqueue=19.0)
    m, why = capacity.cycle_model(ctx, lv)
    assert m is not None, why
    caps = [m.capacity_for(n) for n in range(4)]
    assert caps[0] == m.capacity and caps[0] < caps[1] < caps[2] < caps[3] <= 2.0, caps
    speedups = [capacity.predict(ctx, lv, n).speedup for n in (1, 2, 3)]
    assert 1.5 < speedups[0] < speedups[1] < speedups[2] < 2.4, speedups
    h = get(evaluate(s), "no-workers")
    assert h["severity"] == "warn" and h["evidence"]["recommended_num_workers"] >= 1
    assert h["evidence"]["model"]["job_capacity_cores_then"] > h["evidence"]["model"]["job_capacity_cores"]
    assert "The free cores (0.1; other processes use 1.7) allow 1." in h["message"], h["message"]


def test_a_worker_on_cores_others_keep_busy_loads_slower_while_the_trainer_computes():
    # bench: a loop loading 95 ms of CPU a batch itself beside a 34 ms CPU
    # step, one CPU burner on the 2 cores. The job's share with a worker
    # (1.3 cores) priced 1 worker 1.33x, but a waiting trainer has no thread
    # to use it: the worker gets 2/3 of a core while the step runs, a whole
    # one only while the loop waits. Measured 1.14x and 1.37x (1 and 2
    # workers, alternated medians); OpenCLIP on webdataset beside another
    # job: 1.32x priced, 1.04x measured.
    _, ctx, lv = beside_others(97.7, 97.7, wait_ms=95.3, step_ms=33.9, others=1.02, runqueue=1.8)
    one_w, two_w = (capacity.predict(ctx, lv, n) for n in (1, 2))
    assert one_w.bound == two_w.bound == "contended cores"
    assert one_w.speedup == pytest.approx(1.14, abs=0.04) and two_w.speedup == pytest.approx(1.42, abs=0.08)
    assert "a worker gets only part of a core while the trainer computes" in one_w.phrase()
    # Alone on the box (no others to share with), the same loop is priced as before.
    alone = no_workers(97.7, 97.7, wait_ms=95.3, step_ms=33.9, usable=2.0, other_cpu_cores=0.0)
    ctx = build_context(alone, stateless_phases(alone))
    assert capacity.predict(ctx, ctx.loaders[0], 1).bound != "contended cores"


def test_no_workers_with_the_cores_full_of_its_own_threads_is_info():
    # The same loop alone, its step on 2 intra-op threads filling both cores:
    # nobody else's share to win, the worker's CPU stretches the step.
    s = no_workers(167.0, 100.0, usable=2.0, other_cpu_cores=0.0, gpus=[], gpu_status="n/a")
    h = get(evaluate(s), "no-workers")
    assert h["evidence"]["expected_speedup"] < 1.1
    assert h["severity"] == "info" and "under 10 % gain" in h["message"]
    assert "job_capacity_cores_then" not in h["evidence"]["model"]


def test_no_workers_with_a_free_core_predicts_the_hidden_wait():
    # 40 ms loading on the main thread, a 60 ms step sleeping (GPU-like): one
    # worker hides the loading: 100 ms -> 60 ms per batch.
    s = no_workers(40.0, 40.0, wait_ms=40.0, step_ms=60.0, usable=2.0, other_cpu_cores=0.0)
    h = get(evaluate(s), "no-workers")
    ev = h["evidence"]
    assert h["severity"] == "warn"
    assert ev["recommended_num_workers"] == 1 and ev["expected_speedup"] == pytest.approx(100 / 60, abs=0.02)
    assert ev["expected_bound"] in ("compute step", "workers")
    assert "other processes' CPU (host busy cores minus the jobs')" in ev["cpu_accounting"]["measured"]


def test_unmeasured_others_are_stated_as_assumed():
    ev = get(evaluate(no_workers(40.0, 40.0, usable=2.0)), "no-workers")["evidence"]
    assert ev["cpu_accounting"]["other_cpu_cores"] is None
    assert any("no other process" in a for a in ev["cpu_accounting"]["assumed"])


def test_cores_used_by_other_processes_are_not_free():
    # 1 worker, trainer at 10 %, 2 cores: a second worker fits on an idle box,
    # not beside another process using a core.
    idle = one(cpu_bound_loader(nw=1), job_kw={"main_cpu": 10.0}, usable=2.0, other_cpu_cores=0.0)
    assert get(evaluate(idle), "add-workers")["evidence"]["recommended_num_workers"] == 2
    busy = one(cpu_bound_loader(nw=1), job_kw={"main_cpu": 10.0}, usable=2.0, other_cpu_cores=1.0)
    hints = evaluate(busy)
    assert "add-workers" not in ids(hints)
    h = get(hints, "cpu-bound-preprocessing")
    assert "other processes 1" in h["message"]


def test_trainer_threads_count_in_full_not_as_one_core():
    # A trainer at 180 % (intra-op pool) on 4 cores with 1 busy worker: 1.2
    # cores free, so 1 more worker at most (one core per main loop said 2).
    s = one(cpu_bound_loader(nw=1), job_kw={"main_cpu": 180.0}, usable=4.0, other_cpu_cores=0.0)
    ev = get(evaluate(s), "add-workers")["evidence"]
    assert ev["recommended_num_workers"] == 2 and ev["free_cores"] == pytest.approx(2.2 - 0.0, abs=0.05)


def test_trainer_runqueue_wait_is_demand():
    s = one(
        cpu_bound_loader(nw=1),
        job_kw={"main_cpu": 100.0, "main_runqueue_percent": 100.0},
        usable=4.0,
        other_cpu_cores=0.0,
    )
    ev = get(evaluate(s), "add-workers")["evidence"]
    assert ev["cpu_accounting"]["trainer_runqueue_cores"] == 1.0
    assert ev["free_cores"] == pytest.approx(2.0)


def test_add_workers_carries_expected_speedup():
    h = get(evaluate(one(cpu_bound_loader(), other_cpu_cores=0.0)), "add-workers")
    ev = h["evidence"]
    # 2 -> 4 workers at 40 ms a batch: 10 ms per batch, the step's pace; now 20 ms.
    assert ev["expected_speedup"] == pytest.approx(2.0, abs=0.05)
    assert "expected ≈ 2.00×" in h["message"]


def test_multithreaded_workers_say_threads_not_a_share_above_one():
    ws = [worker(i, pid=5000 + i, cpu=171.0, busy=1.0, fetch_ms=40.0) for i in range(2)]
    s = one(loader(nw=2, wait=0.5, step_ms=10.0, worker_ms=40.0, workers=ws), usable=16.0)
    for h in evaluate(s):
        ev = h["evidence"]
        if "worker_cpu_share_of_busy" in ev:
            assert ev["worker_cpu_share_of_busy"] <= 1.0
            assert ev["threads_cores_while_busy"] == pytest.approx(1.71)
            assert "several threads" in ev.get("cpu_bound_reason", "several threads")


def test_no_gpu_advice_without_a_gpu():
    kw = dict(job_kw={"main_cpu": 10.0}, usable=2.0, other_cpu_cores=1.0)
    s = one(cpu_bound_loader(nw=1), gpus=[], gpu_status="n/a: NVML not found", **kw)
    h = get(evaluate(s), "cpu-bound-preprocessing")
    assert "GPU" not in h["suggestion"] and "CUDA" not in h["suggestion"]
    with_gpu = get(evaluate(one(cpu_bound_loader(nw=1), **kw)), "cpu-bound-preprocessing")
    assert "GPU" in with_gpu["suggestion"]


def oversubscribed(rq):
    # 8 workers at 50 % + a trainer at 90 % on 4 cores: 4.9 cores wanted,
    # clear of the rule's 4.5 (usable + slack). At 45 % the sum sat on that
    # bar, and the verdict flipped with float rounding: Python 3.12's sum()
    # is compensated and gives exactly 3.6 for 8 x 0.45, 3.11's 3.6000000000000005.
    return one(
        loader(nw=8, ready=16, worker_kw=dict(cpu=50.0, busy=0.1, fetch_ms=5.0, runqueue_percent=rq)),
        job_kw={"main_cpu": 90.0},
        usable=4.0,
        other_cpu_cores=0.0,
    )


@pytest.mark.parametrize("rq", [0.0, 20.0])
def test_oversubscription_that_fewer_workers_would_not_fix_is_info(rq):
    # Run-queue wait or not, the cycle model prices no lower count faster:
    # no "lower", no warning (the sweep found none either).
    h = get(evaluate(oversubscribed(rq)), "workers-oversubscribe-cores")
    assert h["severity"] == "info" and h["evidence"]["costs_throughput"] is False
    assert h["evidence"]["recommended_num_workers_by_loader"] == []
    assert not h["suggestion"].startswith("lower") and "num_workers=" not in h["suggestion"]
    assert "no lower count is predicted faster" in h["message"]
    assert "fewer workers are not predicted to help (num_workers=" in h["message"]
    if rq:
        assert h["evidence"]["runqueue_cores"] == pytest.approx(1.6)


def _priced(speedups):
    """capacity.predict pricing each count by ``speedups[n]`` (the rest 1.0)."""
    model = capacity.CycleModel(100.0, 50.0, 1.0, 50.0, 20.0, 0.0, 4.0, 8)

    def predict(ctx, lv, n):
        sp = speedups.get(n, 1.0)
        return capacity.Prediction(sp, 100.0, 100.0 / sp, "CPU", model)

    return predict


def test_oversubscription_warns_only_for_a_lower_count_priced_10_percent_faster(monkeypatch):
    monkeypatch.setattr(capacity, "predict", _priced({4: 1.25, 3: 1.2}))
    hints = evaluate(oversubscribed(20.0))
    h = get(hints, "workers-oversubscribe-cores")
    assert h["severity"] == "warn" and h["evidence"]["costs_throughput"] is True
    (entry,) = h["evidence"]["recommended_num_workers_by_loader"]
    assert entry["recommended_num_workers"] == 4 and "num_workers=4" in h["suggestion"]
    assert "expected ≈ 1.25×" in h["message"]
    # One count per loader: the headroom hint defers to it.
    head = get(hints, "pipeline-has-headroom")
    assert head["evidence"]["defers_to"] == "workers-oversubscribe-cores"
    assert head["evidence"]["recommended_num_workers"] == 4 and head["severity"] == "info"
    # 9 % is not enough, and the current count (8) or more is never "lower".
    monkeypatch.setattr(capacity, "predict", _priced({4: 1.09, 8: 1.5, 9: 2.0}))
    h = get(evaluate(oversubscribed(20.0)), "workers-oversubscribe-cores")
    assert h["severity"] == "info" and h["evidence"]["recommended_num_workers_by_loader"] == []


def test_oversubscription_whose_fewer_workers_cannot_be_priced_sends_the_user_to_measure(monkeypatch):
    """A QA run of timm's train.py with one worker on 2 cores: the model
    could not price 0 workers, and the hint said "no lower num_workers is
    predicted faster"; 0 workers measured 1.24x, and `dlwatch tune` said
    so."""

    def unpriced(ctx, lv, n):
        return capacity.NoPrediction(
            "its CPU figures would make each batch take 2051 ms, yet it takes 1350 ms now"
        )

    monkeypatch.setattr(capacity, "predict", unpriced)
    s = oversubscribed(20.0)
    s["jobs"][0]["cmdline"] = "python train.py -j 8"
    h = get(evaluate(s), "workers-oversubscribe-cores")
    assert h["severity"] == "info" and h["evidence"]["recommended_num_workers_by_loader"] == []
    assert "no lower" not in h["message"] + h["suggestion"]
    assert "Fewer workers may be faster here; only a measurement can say." in h["message"]
    assert h["suggestion"].endswith("; `dlwatch tune --workers 7,8 -- python train.py -j 8`"), h["suggestion"]


class _Conn:
    def __init__(self, pid, workers, live=True):
        self.pid, self.live = pid, live
        self.frames = [{"loaders": [{"workers": [{"pid": w} for w in workers]}]}]


def test_model_others_are_host_busy_minus_the_jobs():
    host = {"busy_cores": 1.9, "affinity_cores": 2, "usable_cores": 2.0}
    procs = {10: {"cpu_percent": 60.0}, 11: {"cpu_percent": 40.0}}
    acc = cpu_accounting(host, [_Conn(10, [11])], procs)
    assert acc == {"jobs_cpu_cores": 1.0, "other_cpu_cores": 0.9, "other_niced_cpu_cores": None}
    # /proc/stat's nice time is the others' at a positive nice, less a niced job's own.
    niced = dict(host, niced_busy_cores=1.2)
    assert cpu_accounting(niced, [_Conn(10, [11])], procs)["other_niced_cpu_cores"] == 0.9
    procs_niced = {10: {"cpu_percent": 60.0, "nice": 10}, 11: {"cpu_percent": 40.0, "nice": 10}}
    assert cpu_accounting(niced, [_Conn(10, [11])], procs_niced)["other_niced_cpu_cores"] == 0.2
    # Under a 1-core quota on 2 CPUs, others count only past the idle time we could not use anyway.
    acc = cpu_accounting(dict(host, usable_cores=1.0), [_Conn(10, [11])], procs)
    assert acc["other_cpu_cores"] == 0.0
    assert cpu_accounting(host, [_Conn(10, [11])], {10: {"cpu_percent": None}})["other_cpu_cores"] is None
    # The monitor's own process is no other's load.
    assert cpu_accounting(dict(host, monitor_cores=0.3), [_Conn(10, [11])], procs)["other_cpu_cores"] == 0.6


CPU_TIMES = type(psutil.cpu_times())


def test_host_busy_cores_only_on_affinity_cpus():
    def cpu(user, idle):
        return CPU_TIMES(**{f: {"user": user, "idle": idle}.get(f, 0.0) for f in CPU_TIMES._fields})

    seq = iter([[cpu(0, 0), cpu(0, 0)], [cpu(10, 0), cpu(0, 10)]])
    s = host_mod.HostSampler(percpu_times=lambda: next(seq), affinity=lambda: {0, 1})
    assert s.sample()["busy_cores"] == pytest.approx(1.0)
    seq2 = iter([[cpu(0, 0), cpu(0, 0)], [cpu(0, 10), cpu(10, 0)]])
    s = host_mod.HostSampler(percpu_times=lambda: next(seq2), affinity=lambda: {0})
    assert s.sample()["busy_cores"] == pytest.approx(0.0)


def test_host_niced_cores_are_the_nice_time_of_the_affinity_cpus():
    def cpu(user, nice, idle):
        vals = {"user": user, "nice": nice, "idle": idle}
        return CPU_TIMES(**{f: vals.get(f, 0.0) for f in CPU_TIMES._fields})

    seq = iter([[cpu(0, 0, 0), cpu(0, 0, 0)], [cpu(2, 8, 0), cpu(0, 5, 5)]])
    got = host_mod.HostSampler(percpu_times=lambda: next(seq), affinity=lambda: {0, 1}).sample()
    assert got["busy_cores"] == pytest.approx(1.5) and got["niced_busy_cores"] == pytest.approx(1.3)


def test_other_jobs_trainers_are_demand_too():
    other = job(2000, loaders=[loader(nw=0, pid_base=6000)], main_cpu=150.0)
    s = snap([job(loaders=[cpu_bound_loader(nw=1)], main_cpu=10.0), other], usable=4.0, other_cpu_cores=0.0)
    ev = get(evaluate(s), "add-workers")["evidence"]
    assert ev["free_cores"] == pytest.approx(4.0 - 0.1 - 1.5, abs=0.01)


def _sleeping_worker_on_a_box_others_fill(other_cores):
    # The QA run's rank: 1 worker at 83 ms a batch (10 ms sleeps, 4 % CPU),
    # a 33 ms step, the loop waiting 59 %; the trainer at 5 % of a core.
    ld = io_bound_loader(
        nw=1, wait=0.59, step_ms=33.0, worker_ms=83.0,
        worker_kw=dict(cpu=4.0, busy=1.0, fetch_ms=83.0, runqueue_percent=1.0),
    )  # fmt: skip
    return one(
        ld, job_kw={"main_cpu": 5.0, "main_thread_cpu": 4.0, "cuda": False}, usable=2.0,
        other_cpu_cores=other_cores, gpus=[], gpu_status="n/a",
    )  # fmt: skip


def test_workers_that_seldom_want_a_core_are_not_held_by_others_load():
    # Others keep 1.9 of 2 cores busy: 0.06 cores are "free", but the job's
    # threads get the cores when they want them (hardly any run-queue wait),
    # and its fair share is about a core. A QA run: the hint said "keep
    # num_workers=1 … ≈ 1.00× (the job's CPU work then fills the 0.1 cores
    # it can have)"; 2 workers measured 2.15×.
    hints = evaluate(_sleeping_worker_on_a_box_others_fill(1.9))
    (h,) = [h for h in hints if h["id"] in ("io-bound", "add-workers")]
    ev = h["evidence"]
    assert ev["recommended_num_workers"] >= 2 and ev["expected_speedup"] > 1.8, (h["message"], ev)
    assert ev["expected_bound"] != "CPU", ev
    assert ev["model"]["job_capacity_cores"] > 0.5, ev["model"]


def test_a_job_whose_threads_want_the_cores_gets_about_what_it_uses():
    # CPU-bound workers that wait in the run queue as long as they run: the
    # others run about as many threads, and the fair share is what it has.
    ld = cpu_bound_loader(nw=2, worker_kw=dict(cpu=50.0, busy=0.95, fetch_ms=40.0, runqueue_percent=50.0))
    s = one(ld, job_kw={"main_cpu": 20.0, "main_thread_cpu": 20.0}, usable=2.0, other_cpu_cores=0.9)
    ctx = build_context(s, stateless_phases(s))
    (lv,) = ctx.loaders
    assert capacity.job_cpu(ctx, lv) == pytest.approx(1.2)
    assert capacity.share_of(ctx, lv, 0.9).cores(lv.num_workers) == pytest.approx(1.2, abs=0.15)


def test_others_at_a_positive_nice_weigh_their_kernel_weight_in_the_fair_share():
    # The same contested job beside others at nice 10: they yield a
    # contested core to nice-0 threads, so the job's share is near all.
    ld = cpu_bound_loader(nw=2, worker_kw=dict(cpu=50.0, busy=0.95, fetch_ms=40.0, runqueue_percent=50.0))
    plain = one(ld, job_kw={"main_cpu": 20.0, "main_thread_cpu": 20.0}, usable=2.0, other_cpu_cores=0.9)
    niced = one(
        ld, job_kw={"main_cpu": 20.0, "main_thread_cpu": 20.0}, usable=2.0, other_cpu_cores=0.9,
        other_niced_cpu_cores=0.9,
    )  # fmt: skip
    shares = []
    for s in (plain, niced):
        ctx = build_context(s, stateless_phases(s))
        (lv,) = ctx.loaders
        shares.append(capacity.share_of(ctx, lv, 0.9).cores(lv.num_workers))
    assert shares[0] == pytest.approx(1.2, abs=0.15)
    assert shares[1] > 1.85, shares


def test_no_workers_prices_a_worker_on_part_of_a_free_core():
    # A QA run of the HF Trainer: CPU-bound loading on the main thread (80 ms
    # a batch, a 12 ms step), 1.55 cores free beside other processes. Capped
    # at whole cores the hint said "keep 0: 1 would gain under 10 %"; 2
    # workers measured 2.13x (and dlwatch tune found 2.16x).
    s = no_workers(
        100.0, 96.0, wait_ms=80.0, step_ms=12.0, usable=2.0, other_cpu_cores=0.35, gpus=[], gpu_status="n/a"
    )
    h = get(evaluate(s), "no-workers")
    ev = h["evidence"]
    assert ev["core_cap"] == 2 and ev["recommended_num_workers"] == 2, ev
    assert 1.5 < ev["expected_speedup"] < 2.2 and h["severity"] == "warn", (h["message"], ev)
    # A quarter of a core is not worth a worker.
    assert capacity_cap(1.2) == 1 and capacity_cap(1.3) == 2 and capacity_cap(0.1) == 0


def capacity_cap(free: float) -> int:
    from dlwatch.diagnose.facts import cores_to_try

    return cores_to_try(free)


def test_no_workers_on_short_epochs_asks_for_persistent_workers_too():
    # A QA run of MONAI's ThreadDataLoader: 16-batch epochs of 0.6 s, and
    # num_workers=3 without persistent workers measured 0.47-0.75x: three
    # workers forked and joined at every epoch.
    s = no_workers(40.0, 40.0, wait_ms=40.0, step_ms=60.0, usable=2.0, other_cpu_cores=0.0)
    ld = s["jobs"][0]["loaders"][0]
    ld.update(epoch_ms=[640.0, 610.0, 650.0], persistent_workers=False)
    h = get(evaluate(s), "no-workers")
    assert h["suggestion"].startswith("set num_workers=1 in DataLoader(...) so batches load"), h["suggestion"]
    assert "with persistent_workers=True in DataLoader(...): its epochs last 640 ms" in h["suggestion"]
    assert h["evidence"]["short_epoch_ms"] == 640.0
    ld.update(epoch_ms=[5400.0])
    h = get(evaluate(s), "no-workers")
    assert "persistent_workers" not in h["suggestion"] and h["evidence"]["short_epoch_ms"] is None
    # Under spawn a worker re-imports the script: 5.4 s epochs are short.
    ld["start_method"] = "spawn"
    assert "persistent_workers=True" in get(evaluate(s), "no-workers")["suggestion"]


def test_idle_workers_have_no_cpu_share_of_their_busy_time():
    # A QA run (MONAI's validation loader, workers idle): 16.56 cores "while
    # busy" on a 2-core box, a ratio of two near-zero figures.
    ld = io_bound_loader(nw=4, wait=0.02, worker_kw=dict(cpu=1.0, busy=0.001))
    s = one(ld, usable=2.0)
    ctx = build_context(s, stateless_phases(s))
    assert ctx.loaders[0].cpu_share_of_busy is None
    assert "threads_cores_while_busy" not in json.dumps(evaluate(s))


def _fast_io(**kw):
    """The HF stream of RULES.md "Predicted gain": 2 I/O-bound workers at
    17.2 ms a batch (1.3 ms of it CPU), a 3.2 ms sleeping step, 63 % wait."""
    wait_ms = 5.34
    ld = io_bound_loader(
        wait=wait_ms / (wait_ms + 3.2),
        wait_ms=wait_ms,
        step_ms=3.2,
        worker_ms=17.2,
        worker_kw=dict(cpu=7.0, busy=0.98, fetch_ms=17.2),
        **kw,
    )
    return one(ld, usable=2.0, logical=2, job_kw={"main_cpu": 12.0, "main_thread_cpu": 12.0, "cuda": False})


def test_the_loops_cpu_taking_each_batch_bounds_what_more_workers_give():
    # Measured on that stream: 6 workers 1.87-2.24x. Without the loop's
    # handover the model priced 2.48x ("the loop's own step then sets the pace").
    blind = get(evaluate(_fast_io()), "io-bound")["evidence"]
    seen = get(evaluate(_fast_io(next_cpu_ms_mean=1.07)), "io-bound")
    ev = seen["evidence"]
    assert blind["recommended_num_workers"] == ev["recommended_num_workers"] == 6
    # Above every measured run without the term, inside their range with it.
    assert blind["expected_bound"] == "compute step" and blind["expected_speedup"] > 2.24
    assert ev["expected_bound"] == "handover" and 1.87 <= ev["expected_speedup"] <= 2.24, ev
    assert ev["model"]["handover_cpu_ms_per_batch"] == 1.07
    assert "the 1.1 ms of its own CPU that taking each batch from the workers costs" in seen["message"]


def test_the_handover_is_no_term_without_workers_or_past_the_wait():
    # With no workers next() is the loading itself, priced as such.
    s = no_workers(100.0, 95.0)
    s["jobs"][0]["loaders"][0]["next_cpu_ms_mean"] = 20.0
    ctx = build_context(s, stateless_phases(s))
    m, _ = capacity.cycle_model(ctx, ctx.loaders[0])
    assert m is not None and m.handover == 0.0
    # A reading above the wait it is part of counts as the wait.
    s = _fast_io(next_cpu_ms_mean=50.0)
    ctx = build_context(s, stateless_phases(s))
    m, _ = capacity.cycle_model(ctx, ctx.loaders[0])
    assert m is not None and m.handover == pytest.approx(5.34)
