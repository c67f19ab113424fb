"""The rules for pipelines other than a DataLoader's processes (issue 41),
table-tested on snapshots as the collector makes them: gil-bound-threads,
no-worker-knob, and advice in each library's own knobs."""

from __future__ import annotations

import pytest

from dlwatch.diagnose import evaluate
from tests.unit.test_diagnose_rules import get, ids, loader, one

NODES_KNOBS = {
    "ParallelMapper.num_workers": 4,
    "ParallelMapper.method": "thread",
    "Prefetcher.prefetch_factor": 2,
}


def threads(cpus):
    return [
        {"id": i, "kind": "thread", "tid": 900 + i, "name": "", "cpu_percent": c} for i, c in enumerate(cpus)
    ]


def procs(cpus):
    return [{"id": i, "kind": "process", "pid": 700 + i, "cpu_percent": c} for i, c in enumerate(cpus)]


def nodes(*, wait=0.46, cpus=(26.0, 25.0, 24.0, 25.0), kind="thread", **kw):
    ld = loader(nw=len(cpus), wait=wait, step_ms=10.0, workers=[], **kw)
    ld.update(
        library="torchdata.nodes",
        knobs=dict(NODES_KNOBS, **{"ParallelMapper.method": kind, "ParallelMapper.num_workers": len(cpus)}),
        worker_kind=kind,
        pipeline_workers=threads(cpus) if kind == "thread" else procs(cpus),
    )
    return ld


def watched(*, wait=0.36, library="watch", dataset="generator"):
    ld = loader(nw=0, wait=wait, step_ms=10.0, workers=[])
    ld.update(library=library, dataset=dataset, knobs=None)
    return ld


@pytest.mark.parametrize(
    ("ld", "hid", "fires"),
    [
        (nodes(), "gil-bound-threads", True),
        (nodes(cpus=(50.0, 50.0, 50.0, 50.0)), "gil-bound-threads", False),  # 2 cores: in parallel
        (nodes(cpus=(10.0, 10.0, 10.0, 10.0)), "gil-bound-threads", False),  # 0.4 cores: waiting on I/O
        (nodes(cpus=(26.0, 25.0, 24.0, None)), "gil-bound-threads", False),  # a thread without a figure
        (nodes(wait=0.05), "gil-bound-threads", False),  # not data-bound
        (nodes(kind="process"), "gil-bound-threads", False),
        # add-pipeline-workers: the workers are the limit, and cores are free
        (nodes(wait=0.78, cpus=(96.0,)), "add-pipeline-workers", True),
        (nodes(wait=0.78, cpus=(96.0, 95.0), kind="process"), "add-pipeline-workers", True),
        (nodes(wait=0.78, cpus=(54.0, 53.0), kind="process"), "add-pipeline-workers", False),  # not saturated
        (nodes(wait=0.05, cpus=(96.0,)), "add-pipeline-workers", False),  # not data-bound
        (nodes(), "add-pipeline-workers", False),  # GIL-bound: the GIL rule speaks
        (watched(), "no-worker-knob", True),
        (watched(library="webdataset", dataset="WebDataset"), "no-worker-knob", True),
        (watched(wait=0.05), "no-worker-knob", False),
        (nodes(), "no-worker-knob", False),  # nodes has its knob
        (loader(nw=0, wait=0.5, step_ms=10.0), "no-worker-knob", False),  # a DataLoader: no-workers says it
    ],
)
def test_rule_table(ld, hid, fires):
    assert (hid in ids(evaluate(one(ld, usable=8.0)))) is fires


def test_gil_bound_threads_names_the_librarys_process_option():
    h = get(evaluate(one(nodes(), usable=8.0)), "gil-bound-threads")
    assert h["severity"] == "warn"
    assert "4 worker threads use 1 core together on a box with 8 cores usable" in h["message"]
    assert 'method="process" in ParallelMapper(...)' in h["suggestion"]
    assert h["evidence"]["threads_cpu_cores"] == 1.0
    # On a box of one usable core, processes could not run in parallel either.
    assert "gil-bound-threads" not in ids(evaluate(one(nodes(), usable=1.0)))


def test_gil_bound_threads_needs_idle_cores_beside_the_pool():
    # The threads' one core beside another job's full core: the cores, not
    # the GIL, may be the cap (a QA run: process workers measured 0.83-1.0x).
    assert "gil-bound-threads" not in ids(evaluate(one(nodes(), usable=2.0, busy_cores=1.95)))
    h = get(evaluate(one(nodes(), usable=2.0, busy_cores=1.1)), "gil-bound-threads")
    assert "on a box with 2 cores usable, 0.9 of them idle: Python threads" in h["message"], h["message"]
    assert h["evidence"]["idle_cores"] == pytest.approx(0.9)


def test_no_knob_never_advises_num_workers_and_says_the_ceiling():
    hints = evaluate(one(watched(), usable=8.0))
    assert ids(hints) == {"no-worker-knob"}
    h = hints[0]
    assert h["severity"] == "warn" and "up to ≈ 1.56× throughput" in h["message"]
    assert "num_workers=" not in h["suggestion"].split("(")[0]
    wds = get(evaluate(one(watched(library="webdataset"))), "no-worker-knob")
    assert "DataLoader(dataset, batch_size=None, num_workers=N)" in wds["suggestion"]
    assert "at most" not in wds["suggestion"]  # its tar files unknown
    ld = watched(library="webdataset")
    ld["shards"] = 4
    wds = get(evaluate(one(ld)), "no-worker-knob")
    assert wds["suggestion"].endswith(
        '; N at most 4, its tar files: a worker past them gets none, which fails the run ("No samples '
        'found in dataset") unless empty_check=False'
    )
    assert wds["evidence"]["shards"] == 4
    assert get(evaluate(one(watched(wait=0.15))), "no-worker-knob")["severity"] == "info"


def test_worker_advice_names_the_pipelines_own_knob():
    from dlwatch.diagnose.facts import setting

    assert setting(nodes(), "num_workers", 6) == "num_workers=6 in ParallelMapper(...)"
    grain = {
        "library": "grain",
        "knobs": {"ReadOptions.num_threads": 2, "ReadOptions.prefetch_buffer_size": 8},
    }
    assert setting(grain, "num_workers", 4) == "num_threads=4 in ReadOptions(...)"
    assert setting(grain, "prefetch_factor", 16) == "prefetch_buffer_size=16 in ReadOptions(...)"
    monai = {
        "library": "monai",
        "knobs": {"ThreadDataLoader.num_workers": 0, "ThreadDataLoader.buffer_size": 1},
    }
    assert setting(monai, "num_workers", 2) == "num_workers=2 in ThreadDataLoader(...)"
    assert setting({}, "num_workers", 2) == "num_workers=2 in DataLoader(...)"
    # MONAI's ThreadDataLoader with no workers: no-workers, in MONAI's words.
    ld = loader(nw=0, wait=0.5, step_ms=10.0)
    ld.update(library="monai", knobs=monai["knobs"], loader_class="ThreadDataLoader")
    h = get(evaluate(one(ld)), "no-workers")
    assert "in ThreadDataLoader(...)" in h["suggestion"]


def test_add_pipeline_workers_names_the_count_the_knob_and_its_bound():
    s = one(nodes(wait=0.78, cpus=(96.0,)), usable=2.0, busy_cores=1.1)
    h = get(evaluate(s), "add-pipeline-workers")
    assert h["severity"] == "warn"
    assert h["evidence"]["recommended_num_workers"] == 2 and h["evidence"]["free_cores"] == 0.9
    assert "num_workers=2 in ParallelMapper(...)" in h["suggestion"]
    assert "its 1 worker thread uses 1 core" in h["message"] and "up to ≈ 2.00×" in h["message"]
    assert h["evidence"]["speedup_bound"].startswith("upper")
    # No free core: nothing to add.
    assert "add-pipeline-workers" not in ids(
        evaluate(one(nodes(wait=0.78, cpus=(96.0,)), usable=2.0, busy_cores=2.0))
    )
    # Processes: an expected gain, not a bound; Grain's knob.
    g = nodes(wait=0.6, cpus=(95.0,), kind="process")
    g.update(library="grain", knobs={"MultiprocessingOptions.num_workers": 1})
    h = get(evaluate(one(g, usable=8.0, busy_cores=1.5)), "add-pipeline-workers")
    assert "num_workers=3 in MultiprocessingOptions(...)" in h["suggestion"]
    assert "expected ≈ 2.50× throughput" in h["message"] and h["evidence"]["speedup_bound"] == "expected"


@pytest.mark.parametrize(
    ("cpu", "process", "kind", "fires"),
    [
        (79.0, 104.0, "thread", True),  # the 2-core box's ParallelMapper thread (2026-11-28)
        (63.0, 111.0, "thread", True),  # the lowest it read there
        (79.0, 85.0, "thread", False),  # the process under the GIL's ceiling: it waits on something else
        (40.0, 104.0, "thread", False),  # under half a core: the main thread holds the GIL, not the pool
        (79.0, 104.0, "process", False),  # a process has a GIL of its own: 0.79 core is not saturated
    ],
)
def test_a_worker_thread_held_under_the_bar_by_the_gil_is_still_the_limit(cpu, process, kind, fires):
    """One worker thread whose process's threads use the GIL's one core
    together: its CPU is what the GIL left it beside the loop's and the
    graph's threads (a second thread measured 1.23-1.32x there)."""
    s = one(
        nodes(wait=0.93, cpus=(cpu,), kind=kind), usable=2.0, busy_cores=1.2, job_kw={"main_cpu": process}
    )
    hints = evaluate(s)
    assert ("add-pipeline-workers" in ids(hints)) is fires, hints
    if fires:
        h = get(hints, "add-pipeline-workers")
        assert "num_workers=2 in ParallelMapper(...)" in h["suggestion"]
        assert "as far as the GIL lets it" in h["message"] and "up to ≈ 2.00×" in h["message"]
        assert h["evidence"]["process_cpu_cores_gil_capped"] == round(process / 100, 2)


def test_a_worker_thread_over_the_bar_is_saturated_on_its_own_figure():
    h = get(evaluate(one(nodes(wait=0.93, cpus=(96.0,)), usable=2.0, busy_cores=1.2)), "add-pipeline-workers")
    assert "GIL lets it" not in h["message"] and h["evidence"]["process_cpu_cores_gil_capped"] is None


def grain_dataloader(*, wait=0.48, step_ms=23.7, wait_ms=21.0, **kw):
    """A grain.DataLoader(worker_count=0) as its adapter describes it: the
    operations run in the loop's thread, the ReadOptions threads read ahead."""
    ld = loader(nw=0, wait=wait, step_ms=step_ms, wait_ms=wait_ms, workers=[], persistent=None, **kw)
    ld.update(
        library="grain",
        dataset="grain.DataLoader",
        knobs={
            "DataLoader.worker_count": 0,
            "ReadOptions.num_threads": 16,
            "ReadOptions.prefetch_buffer_size": 16,
        },
        worker_kind="thread",
        pipeline_workers=threads([2.0] * 16),
    )
    return ld


def test_a_grain_dataloader_that_runs_its_operations_in_the_loop_is_told_worker_count():
    # A public trainer on grain.DataLoader(worker_count=0) (CatGPT, tiny model):
    # the loop waited 50 %, its own thread running the maps and Batch inside
    # next(); it read "nothing to fix". worker_count=1 measured 1.14x there.
    s = one(
        grain_dataloader(), usable=2.0, busy_cores=1.0, job_kw={"main_cpu": 97.0, "main_thread_cpu": 72.0}
    )
    h = get(evaluate(s), "no-workers")
    assert "with worker_count=0: the training loop loads every batch itself" in h["message"]
    assert h["suggestion"].startswith("set worker_count=")
    assert "in DataLoader(...)" in h["suggestion"] and "persistent_workers" not in h["suggestion"]
    # tune sets a torch DataLoader's arguments only: a recording compares the change.
    assert "dlwatch tune" not in h["suggestion"] and "dlwatch compare" in h["suggestion"]


def test_a_webloaders_stage_dataloader_is_one_tune_can_set():
    # WebLoader(dataset, num_workers=0) shows its stage DataLoader's workers
    # and knob: tune's overrides reach that DataLoader, so tune measures it.
    from dlwatch.diagnose.render import with_tune_command

    ld = loader(nw=0, wait=0.6, step_ms=20.0, wait_ms=30.0, library="webdataset", workers_from=1)
    s = one(ld)
    h = {"id": "no-workers", "job_pid": s["jobs"][0]["pid"], "loader_id": 0, "suggestion": "x",
         "evidence": {"recommended_num_workers": 2}}  # fmt: skip
    assert "dlwatch tune --workers 0,2" in with_tune_command(h, s)["suggestion"]
    del ld["workers_from"]
    assert "tune cannot set webdataset's settings" in with_tune_command(h, s)["suggestion"]


def test_enable_pin_memory_speaks_of_a_pinmemory_node_to_a_nodes_graph():
    # A torchdata.nodes graph has no pin_memory argument: it pins in a
    # PinMemory node, which the probe reads from the graph (pin_memory).
    h = get(evaluate(one(nodes(wait=0.3, pin=False))), "enable-pin-memory")
    assert "(no PinMemory node in its graph)" in h["message"], h["message"]
    assert "pin_memory=False" not in h["message"]
    assert h["suggestion"].startswith("add a PinMemory node over the batches (PinMemory(Batcher(...))")
    assert "DataLoader" not in h["suggestion"] and "pin_memory=True" not in h["suggestion"]
    assert "enable-pin-memory" not in ids(evaluate(one(nodes(wait=0.3, pin=True))))
    # A nodes frame from a probe that did not read the graph's pinning: nothing said.
    assert "enable-pin-memory" not in ids(evaluate(one(nodes(wait=0.3, pin=None))))
    # A DataLoader keeps its own words.
    dl = get(evaluate(one(loader(pin=False, wait=0.3))), "enable-pin-memory")
    assert "(pin_memory=False)" in dl["message"]
    assert "set pin_memory=True in DataLoader(...)" in dl["suggestion"]
