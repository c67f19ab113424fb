"""The rules for loaders as they are in the wild, table-tested: idle-workers,
duplicated-samples, head-of-line-blocking, thread-fed-loader; and how they sit
beside the worker-count rules (never contradicting them)."""

from __future__ import annotations

import pytest

from dlwatch.diagnose import evaluate
from dlwatch.diagnose.rules_order import predicted_speedup
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

# --- factories ------------------------------------------------------------------


def iterable(counts, *, wait=0.5, gone=(), digests=None, kind="iterable", **kw):
    """An iterable loader whose workers delivered ``counts`` batches in the window."""
    ws = []
    for i, c in enumerate(counts):
        extra = {"window_batches": c}
        if digests is not None and digests[i] is not None:
            extra["first_batch_digest"], extra["second_batch_digest"] = digests[i]
        ws.append(
            worker(
                i,
                busy=0.95 if c else 0.0,
                cpu=10.0 if c else 0.0,
                fetch_ms=40.0,
                state="gone" if i in gone else "sleeping",
                **extra,
            )
        )
    return loader(nw=len(counts), wait=wait, step_ms=10.0, worker_ms=40.0, workers=ws, kind=kind, **kw)


def slow_tail(*, hol=0.23, wait=0.27, busy=0.26, in_order=True, p99=340.0, bps=35.0, **kw):
    ws = [
        worker(i, busy=busy, cpu=5.0, fetch_ms=14.0, fetch_ms_p50=14.0, fetch_ms_p95=20.0, fetch_ms_p99=25.0)
        for i in range(3)
    ]
    ws.append(
        worker(3, busy=busy, cpu=5.0, fetch_ms=70.0, fetch_ms_p50=14.0, fetch_ms_p95=330.0, fetch_ms_p99=p99)
    )
    ld = loader(
        nw=4,
        wait=wait,
        step_ms=20.0,
        worker_ms=28.0,
        workers=ws,
        head_of_line_fraction=hol,
        in_order=in_order,
        **kw,
    )
    ld["batches_per_s"] = bps
    return ld


def producer(wait=0.75, main=False, nw=0, consumer=False):
    """A DataLoader iterated on thread 'producer', as the collector gives it
    (collect/loop_role.py): with the queue hand-over found (``consumer``) its
    figures are the loop's; without it, a feeder's, the loop's wait n/a."""
    if main:
        return loader(nw=nw, wait=wait, step_ms=6.0, iterated_on={"thread": "MainThread", "main": True})
    fd = {"thread": "producer", "wait_fraction": wait, "wait_ms_mean": 18.0, "handover_ms_mean": 6.0}
    if consumer:
        return loader(
            nw=nw,
            wait=0.02,
            step_ms=6.0,
            iterated_on={"thread": "producer", "main": False},
            loop_role="loop",
            feeder=fd,
            consumer={"thread": "MainThread", "main": True, "via": "queue.Queue"},
        )
    ld = loader(nw=nw, wait=wait, step_ms=6.0, iterated_on={"thread": "producer", "main": False})
    ld.update(loop_role="feeder", feeder=fd, data_wait_fraction=None, wait_ms_mean=None, step_ms_mean=None)
    ld["no_batch_reason"] = "loader 0 is iterated on thread 'producer', not the training thread"
    return ld


D = (11, 22)  # two batches' digests


@pytest.mark.parametrize(
    "ld, hid, fires",
    [
        # idle-workers: one worker has the only shard (HF datasets #8669)
        (iterable([170, 0, 0], gone=(1, 2)), "idle-workers", True),
        (iterable([170, 0, 0]), "idle-workers", True),  # persistent workers: idle, alive
        (iterable([170, 40, 160]), "idle-workers", True),  # far fewer (≤ 25 % of the busiest)
        (iterable([170, 165, 172]), "idle-workers", False),  # sharded
        (iterable([170, 0, 0], wait=0.02), "idle-workers", False),  # the loop does not wait: no harm
        (iterable([5, 0, 0]), "idle-workers", False),  # too few batches to judge
        (iterable([170, 0, 0], kind="map"), "idle-workers", False),  # a map dataset shares by sampler
        (iterable([170, 0, 0], steady_history=False, batches=3), "idle-workers", False),  # warming up
        # duplicated-samples: every worker yields the same stream
        (iterable([170, 170, 170], digests=[D, D, D]), "duplicated-samples", True),
        (iterable([170, 170, 170], digests=[D, D, (33, 44)]), "duplicated-samples", True),
        (iterable([170, 170, 170], digests=[D, (33, 44), (55, 66)]), "duplicated-samples", False),
        (iterable([170, 170], digests=[(7, 7), (7, 7)]), "duplicated-samples", False),  # constant data
        (iterable([170, 170], digests=[D, None]), "duplicated-samples", False),
        # head-of-line-blocking
        (slow_tail(), "head-of-line-blocking", True),
        (slow_tail(in_order=False), "head-of-line-blocking", False),
        (slow_tail(in_order=None), "head-of-line-blocking", False),  # torch < 2.6: no in_order
        (slow_tail(hol=0.02), "head-of-line-blocking", False),
        (slow_tail(busy=0.95), "head-of-line-blocking", False),  # saturated: throughput, not order
        (slow_tail(p99=30.0), "head-of-line-blocking", False),  # no slow tail
        (slow_tail(wait=0.05, hol=0.05), "head-of-line-blocking", False),  # not data-bound
        # thread-fed-loader
        (producer(), "thread-fed-loader", True),
        (producer(wait=0.05), "thread-fed-loader", True),  # the loop's wait is unknown either way
        (producer(main=True), "thread-fed-loader", False),
        (producer(consumer=True), "thread-fed-loader", False),  # the loop's side of the queue is timed
    ],
)
def test_rule_table(ld, hid, fires):
    assert (hid in ids(evaluate(one(ld)))) is fires


def test_idle_workers_names_the_idle_ones_with_their_counts():
    h = get(evaluate(one(iterable([170, 0, 0], gone=(1, 2)))), "idle-workers")
    assert h["severity"] == "warn"
    assert "worker 1: 0 (exited), worker 2: 0 (exited); worker 0: 170" in h["message"]
    assert "get_worker_info()" in h["suggestion"]
    # split_dataset_by_node splits across ranks: never the workers' fix.
    assert "split_dataset_by_node splits across ranks, not workers" in h["suggestion"]
    assert [w["id"] for w in h["evidence"]["idle_workers"]] == [1, 2]
    assert "num_workers=1" in h["suggestion"]


def test_duplicated_samples_says_how_many_copies():
    h = get(evaluate(one(iterable([170, 170, 170], digests=[D, D, D]))), "duplicated-samples")
    assert h["evidence"]["duplicated_workers"] == [[0, 1, 2]]
    assert "up to 3 times an epoch" in h["message"]


def test_head_of_line_gives_the_tail_and_the_gain():
    h = get(evaluate(one(slow_tail())), "head-of-line-blocking")
    assert h["severity"] == "warn"
    assert "worker 3: 14 ms / 330 ms / 340 ms" in h["message"]
    assert "in_order=False" in h["suggestion"]
    ev = h["evidence"]
    assert ev["expected_speedup"] == pytest.approx(1 / (1 - 0.23), abs=0.01)
    assert ev["fetch_ms_tail"][3] == {"id": 3, "p50_ms": 14.0, "p95_ms": 330.0, "p99_ms": 340.0}


def test_head_of_line_names_the_worker_whose_ratio_it_quotes():
    # Worker 3 has the highest p99 (340 ms over 14: 24x), worker 0 the highest
    # ratio (200 ms over 4: 50x): the message pairs the ratio with worker 0.
    ld = slow_tail()
    ld["workers"][0].update(fetch_ms_p50=4.0, fetch_ms_p95=150.0, fetch_ms_p99=200.0)
    h = get(evaluate(one(ld)), "head-of-line-blocking")
    assert "worker 0's p99 is 50× its median" in h["message"], h["message"]
    assert h["evidence"]["tail_ratio_p99_p50"] == 50.0


def test_head_of_line_promise_is_bounded_by_the_ceiling_in_its_message_too():
    from dlwatch.diagnose import ceiling

    h = get(evaluate(one(slow_tail())), "head-of-line-blocking")
    promised = h["evidence"]["expected_speedup"]
    capped = ceiling.bound(h, wait=0.1)  # a ceiling of 1.11x, under the promise
    assert capped["evidence"]["expected_speedup"] < promised
    assert f"{promised:.2f}×" not in capped["message"]
    assert "expected ≈ 1.11× throughput (the ceiling" in capped["message"]


def test_head_of_line_gain_is_capped_by_the_workers():
    # 4 workers at 100 ms a batch deliver one every 25 ms; the loop takes one
    # every 50 ms now, 80 % of it blocked: it cannot get faster than 25 ms.
    assert predicted_speedup(0.8, 20.0, 100.0, 4) == pytest.approx(2.0)
    assert predicted_speedup(0.2, 50.0, None, 4) == pytest.approx(1.25)


def test_a_feeder_gets_no_data_bound_hint():
    # The producer waits 75 % with num_workers=0: on the main thread this is no-workers.
    assert "no-workers" in ids(evaluate(one(producer(main=True))))
    hints = evaluate(one(producer()))
    assert ids(hints) == {"thread-fed-loader"}
    h = hints[0]
    assert h["severity"] == "info"
    assert "'producer'" in h["message"] and "does not see" in h["message"]
    assert "feeder's figure, not the loop's" in h["message"]
    assert "dlwatch.watch(" in h["suggestion"]
    assert h["evidence"]["feeder_wait_fraction"] == 0.75
    # Nor add-workers / io-bound for a feeder with saturated workers.
    ld = io_bound_loader(iterated_on={"thread": "feeder", "main": False})
    ld.update(loop_role="feeder", data_wait_fraction=None, feeder={"thread": "feeder", "wait_fraction": 0.6})
    assert ids(evaluate(one(ld))) == {"thread-fed-loader"}


def test_a_loop_fed_through_a_queue_is_judged_by_its_own_wait():
    # The producer waits 75 %, the loop 2 %: no hint at all.
    assert ids(evaluate(one(producer(consumer=True)))) == set()


@pytest.mark.parametrize(
    "ld",
    [
        # 8 workers, one idle: the others' busy mean is still ≥ 80 %, which
        # alone would say "add workers"
        iterable([170] * 7 + [0]),
        iterable([170] * 3, digests=[D, D, D]),
    ],
)
def test_sharding_hints_supersede_the_advice_to_add_workers(ld):
    got = ids(evaluate(one(ld)))
    assert got & {"idle-workers", "duplicated-samples"}
    assert not got & {"add-workers", "io-bound", "cpu-bound-preprocessing"}, got


def test_head_of_line_and_worker_count_rules_exclude_each_other():
    for busy in (0.5, 0.79, 0.8, 0.95):
        got = ids(evaluate(one(slow_tail(busy=busy))))
        assert not ({"head-of-line-blocking"} <= got and got & {"add-workers", "io-bound"}), (busy, got)


FED = {"thread": "MainThread", "main": True, "via": "queue.Queue"}
STEPPER = [{"thread": "MainThread", "steps": 40, "main": True}]


@pytest.mark.parametrize(
    ("ld", "steppers", "role"),
    [
        ({"id": 0}, [], "loop"),  # no batch yet
        ({"id": 0, "iterated_on": {"thread": "MainThread", "main": True}}, [], "loop"),
        # a thread that trains itself (Ray Train runs the loop on a thread)
        ({"id": 0, "iterated_on": {"thread": "train", "main": False, "trains": True}}, STEPPER, "loop"),
        # another thread steps the optimizer, the hand-over is not seen
        ({"id": 0, "iterated_on": {"thread": "producer", "main": False, "trains": False}}, STEPPER, "feeder"),
        # no optimizer step yet: which thread trains is not known
        ({"id": 0, "iterated_on": {"thread": "producer", "main": False}}, [], "feeder"),
        # the loop's side of a queue.Queue was found: the figures are the loop's
        ({"id": 0, "iterated_on": {"thread": "producer", "main": False}, "consumer": FED}, [], "loop"),
        # inside another measured next() on the same thread
        ({"id": 1, "nested_in": 0, "iterated_on": {"thread": "MainThread", "main": True}}, [], "stage"),
    ],
)
def test_whose_wait_a_loaders_figures_are(ld, steppers, role):
    from dlwatch.collect.loop_role import loop_role

    got, why = loop_role(ld, steppers)
    assert got == role
    assert (why is None) is (role == "loop")
    if role == "feeder":
        assert "dlwatch.watch(" in why
        assert ("steps the optimizer" in why) is bool(steppers)


def test_views_name_the_dataset_and_a_producer_thread():
    from dlwatch.cli.text import _loader_lines
    from dlwatch.tui.fmt import DEFAULT_PALETTE
    from dlwatch.tui.loader import loader_title

    ld = producer()
    ld["dataset"] = "SleepyText"
    title = loader_title(ld, DEFAULT_PALETTE).plain
    assert "SleepyText" in title and "feeder thread producer" in title
    text = "\n".join(_loader_lines(ld))
    assert "SleepyText" in text and "feeder thread 'producer' waits 75.0 %" in text
    assert "data wait n/a: loader 0 is iterated on thread 'producer'" in text
    fed = producer(consumer=True)
    assert "fed by thread producer" in loader_title(fed, DEFAULT_PALETTE).plain
    assert "the wait above is the loop's (thread 'MainThread')" in "\n".join(_loader_lines(fed))
    main = producer(main=True)
    assert "thread" not in loader_title(main, DEFAULT_PALETTE).plain
    assert "feeder" not in "\n".join(_loader_lines(main))


@pytest.mark.parametrize(
    ("steps", "batches", "active", "fires", "why"),
    [
        (1201, 16, False, True, "itertools.cycle: 75 steps a batch, no iterator"),
        (1201, 16, True, False, "an iterator is alive: the loop takes from it"),
        (78, 314, False, False, "gradient accumulation: fewer steps than batches"),
        (600, 300, False, False, "a GAN: two optimizers step twice a batch"),
        (40, 5, False, False, "too early to say"),
    ],
)
def test_a_loop_that_steps_on_without_its_loaders(steps, batches, active, fires, why):
    ld = loader(
        0,
        wait=0.54,
        active=active,
        batches_total=batches,
        iterated_on={"thread": "MainThread", "main": True},
        epoch_open=active,
    )
    s = snap([job(loaders=[ld], train_threads=[{"thread": "MainThread", "steps": steps, "main": True}])])
    got = [h for h in evaluate(s) if h["id"] == "loop-off-its-loaders"]
    assert bool(got) is fires, why
    if fires:
        assert got[0]["evidence"]["steps_per_batch"] == round(steps / batches, 1)
        said = "Thread 'MainThread' of PID 1000 has stepped the optimizer 1201 times"
        assert got[0]["message"].startswith(said)


def test_num_workers_0_behind_a_producer_thread_is_sized_on_that_threads_loading():
    # The producer thread loads 40 ms a batch while the loop computes 20 ms and
    # waits 20: one worker process would only move that work (a QA run: the
    # hint said "num_workers=1, ≈ 1.30×", measured 1.0×); two load two at once.
    fd = {"thread": "producer", "wait_fraction": 0.97, "wait_ms_mean": 40.0, "handover_ms_mean": 1.0}
    ld = loader(
        nw=0, wait=0.5, step_ms=20.0, wait_ms=20.0,
        iterated_on={"thread": "producer", "main": False}, feeder=fd,
        consumer={"thread": "MainThread", "main": True, "via": "queue.Queue"},
    )  # fmt: skip
    s = one(
        ld, job_kw={"main_cpu": 40.0, "main_thread_cpu": 30.0, "cuda": False}, usable=4.0, other_cpu_cores=0.0
    )
    h = get(evaluate(s), "no-workers")
    ev = h["evidence"]
    assert ev["recommended_num_workers"] == 2 and ev["expected_speedup"] == pytest.approx(2.0, abs=0.05), ev
    assert "thread 'producer' loads every batch itself (40 ms a batch" in h["message"], h["message"]
    assert "the training loop loads" not in h["message"]
    from dlwatch.diagnose import capacity
    from dlwatch.diagnose.engine import build_context, stateless_phases

    ctx = build_context(s, stateless_phases(s))
    assert capacity.predict(ctx, ctx.loaders[0], 1).speedup == pytest.approx(1.0, abs=0.02)


def test_a_loop_stepping_on_after_its_pipelines_epoch_ended_is_told_so():
    # Grain's iterator stays alive after its epoch (active, epoch_open false):
    # a QA run had 3370 optimizer steps on 300 batches and no hint.
    ld = loader(nw=2, wait=0.67, step_ms=20.0, batches=300, epoch_open=False, loop_role="loop")
    ld["iterated_on"] = {"thread": "MainThread", "main": True}
    j = job(loaders=[ld], train_threads=[{"thread": "MainThread", "main": True, "steps": 3370}])
    h = get(evaluate(snap([j])), "loop-off-its-loaders")
    assert "none has an epoch open now" in h["message"] and h["evidence"]["optimizer_steps"] == 3370
    ld["epoch_open"] = True
    assert "loop-off-its-loaders" not in ids(evaluate(snap([j])))


# --- a library that shards among workers itself (HF datasets) -------------------

HF = dict(kind="iterable", shards_of="datasets")


def test_idle_workers_of_an_hf_dataset_with_fewer_shards_say_reshard_in_its_terms():
    h = get(evaluate(one(iterable([170, 0, 0], gone=(1, 2), shards=1, shards_of="datasets"))), "idle-workers")
    assert "Its dataset has 1 shard for 3 workers" in h["message"]
    assert "HF datasets gives each worker whole shards and stops the workers past 1" in h["message"]
    assert h["suggestion"].startswith("give the dataset at least 3 shards (")
    assert (
        "to_iterable_dataset(num_shards=3)" in h["suggestion"] and "get_worker_info()" not in h["suggestion"]
    )
    assert "num_workers=1 in DataLoader(...) to stop paying" in h["suggestion"]
    assert h["evidence"]["shards"] == 1


@pytest.mark.parametrize(
    "shards, starts, capped",
    [
        (2, "give the dataset at least 4 shards (", True),  # already at its shards: reshard first
        (3, "set num_workers=3 in DataLoader(...) now; for 4, give the dataset at least 4 shards", True),
        (4, "set num_workers=4 in DataLoader(...)", False),  # enough shards: the plain raise
        (None, "set num_workers=4 in DataLoader(...)", False),  # no library shards it
    ],
)
def test_add_workers_past_the_shards_of_an_hf_dataset_is_a_reshard_first(shards, starts, capped):
    h = get(evaluate(one(cpu_bound_loader(shards=shards, **HF))), "add-workers")
    assert h["suggestion"].startswith(starts), h["suggestion"]
    assert ("then set num_workers=4 in DataLoader(...)" in h["suggestion"]) is capped
    # tune runs the script as it is: its extra workers would get no data yet.
    assert ("once resharded, verify with `dlwatch tune --workers 2,4" in h["suggestion"]) is capped
    assert (f"But its dataset has {shards} shards" in h["message"]) is capped
    assert (h["evidence"].get("reshard_to") == 4) is capped
    assert h["evidence"]["recommended_num_workers"] == 4  # the count the prediction prices


def test_a_map_dataset_is_never_capped_by_shards():
    h = get(evaluate(one(cpu_bound_loader(shards=1, shards_of="datasets"))), "add-workers")
    assert h["suggestion"].startswith("set num_workers=4") and "shard" not in h["message"]


def test_io_bound_past_the_shards_reshards_or_caches():
    h = get(evaluate(one(io_bound_loader(shards=2, **HF))), "io-bound")
    rec = h["evidence"]["recommended_num_workers"]
    assert rec > 2 and h["evidence"]["reshard_to"] == rec
    assert h["suggestion"].startswith(f"give the dataset at least {rec} shards (")
    assert "or cache the dataset on local SSD / in RAM" in h["suggestion"]


def test_no_workers_on_a_one_shard_hf_dataset_gets_one_worker_now():
    h = get(evaluate(one(loader(nw=0, wait=0.8, shards=1, **HF))), "no-workers")
    rec = h["evidence"]["recommended_num_workers"]
    assert rec >= 2, h
    assert h["suggestion"].startswith(
        f"set num_workers=1 in DataLoader(...) now; for {rec}, give the dataset"
    )
    assert "so batches load in the background" in h["suggestion"]


def test_one_more_worker_that_helps_is_a_reshard_when_the_shards_are_taken():
    ld = cpu_bound_loader(
        nw=1, worker_ms=20.0, worker_kw=dict(cpu=60.0, busy=0.95, fetch_ms=20.0), shards=1, **HF
    )
    h = get(evaluate(one(ld, usable=2.0, logical=2, other_cpu_cores=0.5)), "cpu-bound-preprocessing")
    assert "One more worker still helps" in h["message"] and "its dataset has 1 shard" in h["message"]
    assert h["suggestion"].startswith("give the dataset at least 2 shards (")
    assert (
        "then set num_workers=2 in DataLoader(...); beyond that, make each batch cheaper" in h["suggestion"]
    )


# --- WebDataset: split_by_worker hands each worker whole tar files ---------------

WDS = dict(kind="iterable", shards_of="webdataset")


def test_add_workers_past_a_webdatasets_tar_files_says_the_run_would_fail():
    # Raised past its 2 tar files, WebDataset's default empty_check fails the
    # run in the third worker: the raise is a reshard first, in its terms.
    h = get(evaluate(one(cpu_bound_loader(shards=2, **WDS))), "add-workers")
    said = "But its dataset has 2 shards, and WebDataset gives each worker whole shards and a worker past 2"
    assert said in h["message"]
    assert 'fails the run ("No samples found in dataset") unless empty_check=False' in h["message"]
    assert h["suggestion"].startswith("give the dataset at least 4 shards (write the data as 4+ tar files")
    assert "resampled=True" in h["suggestion"] and "to_iterable_dataset" not in h["suggestion"]
    assert h["evidence"]["shards_of"] == "webdataset" and h["evidence"]["reshard_to"] == 4


def test_idle_workers_of_a_webdataset_without_empty_check_say_reshard_in_its_terms():
    ld = iterable([170, 0, 0], gone=(1, 2), shards=1, shards_of="webdataset")
    h = get(evaluate(one(ld)), "idle-workers")
    assert "Its dataset has 1 shard for 3 workers, and WebDataset gives each worker" in h["message"]
    assert h["suggestion"].startswith("give the dataset at least 3 shards (write the data as 3+ tar files")
