"""The probe's side of "whatever feeds the loop" (issue 41), in process:
dlwatch.watch() on any iterable, a DataLoader fed to the loop through a
queue.Queue (the loop's get() timed), and the optimizer-step hook that says
which thread trains."""

from __future__ import annotations

import queue
import threading
import time
import types

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch
from dlwatch.cli.text import _loader_lines
from dlwatch.collect.model import loader_dict
from dlwatch.probe import handover, patches, trainthread
from dlwatch.snapshot import batch_word


def _frames():
    now = time.perf_counter_ns()
    return [st.frame(now) for st in patches.registry.snapshot()]


def test_watch_times_the_loops_next_and_keeps_the_iterable(monkeypatch):
    patches.registry.clear()

    def gen():
        for i in range(30):
            time.sleep(0.004)
            yield i

    seen, waited, t0 = [], 0.0, None
    it = iter(dlwatch.watch(gen(), name="tokens"))
    while True:
        a = time.perf_counter()
        t0 = a if t0 is None else t0
        try:
            x = next(it)
        except StopIteration:
            total = a - t0  # the loop's time up to the next() that ends it
            break
        waited += time.perf_counter() - a
        seen.append(x)
        time.sleep(0.004)
    assert seen == list(range(30))
    (f,) = _frames()
    assert f["dataset"] == "tokens" and f["library"] == "watch" and f["batches"] == 30
    frac = f["wait_ns"] / (f["wait_ns"] + f["step_ns"])
    assert abs(frac - waited / total) < 0.05, (frac, waited / total)
    # An iterable keeps its length and attributes; disabled, nothing is wrapped.
    data = [1, 2, 3]
    assert len(dlwatch.watch(data)) == 3 and list(dlwatch.watch(data)) == data
    monkeypatch.setenv("DLWATCH_DISABLE", "1")
    assert dlwatch.watch(data) is data


def test_a_batch_function_made_an_iterator_is_watched_call_by_call():
    # nanoGPT calls get_batch('train') at each step and iterates nothing; the
    # docs' two lines: watch(iter(lambda: get_batch(...), None)), next() it.
    patches.registry.clear()
    calls = []

    def get_batch(split):
        time.sleep(0.004)
        calls.append(split)
        return len(calls), split

    batches = dlwatch.watch(iter(lambda: get_batch("train"), None), name="get_batch")
    waited = 0.0
    t0 = time.perf_counter()
    for _ in range(25):
        a = time.perf_counter()
        x, split = next(batches)
        waited += time.perf_counter() - a
        time.sleep(0.004)
    total = time.perf_counter() - t0
    assert (x, split) == (25, "train") and calls == ["train"] * 25
    (f,) = _frames()
    assert f["dataset"] == "get_batch" and f["library"] == "watch" and f["batches"] == 25
    frac = f["wait_ns"] / (f["wait_ns"] + f["step_ns"])
    assert abs(frac - waited / total) < 0.1, (frac, waited / total)


def test_a_watched_batch_function_shows_its_tensors_rows_as_read():
    # nanoGPT's get_batch returns x, y of [batch_size, block_size]: no loader
    # declares the batch, the view once said "batch n/a".
    patches.registry.clear()

    def get_batch():
        return torch.zeros(12, 64, dtype=torch.long), torch.zeros(12, 64, dtype=torch.long)

    batches = dlwatch.watch(iter(get_batch, None), name="get_batch")
    for _ in range(3):
        next(batches)
    (f,) = _frames()
    assert f.get("batch_size") is None and f["batch_rows"] == 12 and f["batch_bytes"] == 2 * 12 * 64 * 8
    assert batch_word(f) == "12 (first dim)"
    # As the monitor reads it: no pin_memory setting (None, not "off"), the
    # text's loader line says so rather than "pin_memory off, persistent off".
    rec = loader_dict([], f, 3.0, {}, {})
    assert rec["pin_memory"] is None and rec["batch_rows"] == 12
    assert "batch 12 (first dim), no DataLoader settings" in _loader_lines(rec)[0]
    # A declared batch size is the one shown, whatever the arrays hold.
    assert batch_word({"batch_size": 32, "batch_rows": 12}) == "32"
    assert batch_word({"batch_size": None, "batch_rows": None}) == "n/a"


class _Slow(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        time.sleep(0.006)
        return torch.tensor([float(i)])


def test_a_queue_fed_loop_is_timed_on_its_own_get():
    import dlwatch.hook  # noqa: F401  (the patches and the optimizer hook)

    patches.registry.clear()
    loader = DataLoader(_Slow(), batch_size=2, num_workers=0)
    q: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()

    def produce():
        for b in loader:
            if stop.is_set():
                break
            q.put(b)

    th = threading.Thread(target=produce, name="producer", daemon=True)
    th.start()
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waited, t0 = 0.0, time.perf_counter()
    for _ in range(40):
        a = time.perf_counter()
        b = q.get()
        waited += time.perf_counter() - a
        opt.zero_grad()
        model(b).sum().backward()
        opt.step()
        time.sleep(0.004)
    own = waited / (time.perf_counter() - t0)
    stop.set()
    (f,) = _frames()
    th.join(timeout=5)
    assert f["consumer"]["thread"] == "MainThread" and f["consumer"]["main"] is True
    assert f["feeder"]["thread"] == "producer"
    assert f["iterated_on"] == {"thread": "producer", "main": False, "trains": False}
    frac = f["wait_ns"] / (f["wait_ns"] + f["step_ns"])
    assert abs(frac - own) < 0.05, (frac, own)
    assert f["feeder"]["batches"] >= 40
    assert any(t["thread"] == "MainThread" and t["steps"] >= 40 for t in trainthread.summary())
    trainthread.forget()  # the next test in this process has stepped no optimizer
    handover.uninstall()
    assert queue.Queue.get.__name__ == "get" and not hasattr(queue.Queue, "_dlw_fed")


def _drain(it, n=None):
    out = []
    for x in it:
        out.append(x)
        if n is not None and len(out) >= n:
            break
    return out


def test_torchdata_nodes_loader_is_measured_every_epoch_with_its_knobs(monkeypatch):
    import torchdata.nodes as tn

    import dlwatch.hook  # noqa: F401

    monkeypatch.setenv("DLWATCH_AUTOTUNE", "1")
    patches.registry.clear()
    node = tn.ParallelMapper(tn.IterableWrapper(range(40)), map_fn=lambda x: x * 2, num_workers=2)
    loader = tn.Loader(tn.Prefetcher(tn.Batcher(node, batch_size=4), prefetch_factor=3))
    for _ in range(2):
        assert sum(len(b) for b in _drain(iter(loader))) == 40  # every item, in both epochs
    (f,) = _frames()
    assert f["library"] == "torchdata.nodes" and f["epoch"] == 2 and f["batches"] == 20
    assert f["knobs"] == {
        "Prefetcher.prefetch_factor": 3,
        "ParallelMapper.num_workers": 2,
        "ParallelMapper.method": "thread",
    }
    assert f["num_workers"] == 2 and f["batch_size"] == 4 and f["worker_kind"] == "thread"
    assert f["pin_memory"] is False  # no PinMemory node in the graph
    # autotune says why it leaves this pipeline alone
    assert f["autotune"]["state"] == "left alone" and "torchdata.nodes" in f["autotune"]["reason"]
    # the iterator is still the library's own type
    assert isinstance(iter(loader), tn.BaseNode)


def test_a_nodes_graph_with_a_pinmemory_node_reads_pinned(monkeypatch):
    import torch
    import torchdata.nodes as tn

    from dlwatch.probe.adapters import nodes as adapter

    # PinMemory asks CUDA for its device when built, which this CPU box has
    # not: the one call is faked; the graph is read, not iterated.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    batches = tn.Batcher(tn.IterableWrapper(range(8)), batch_size=4)
    pinned = tn.Loader(tn.Prefetcher(tn.PinMemory(batches), prefetch_factor=2))
    assert adapter.describe(pinned)["pin_memory"] is True
    assert adapter.describe(tn.Loader(tn.Prefetcher(batches, prefetch_factor=2)))["pin_memory"] is False


def test_grain_is_measured_on_every_epoch_not_only_the_first():
    import grain

    import dlwatch.hook  # noqa: F401

    patches.registry.clear()
    ds = grain.MapDataset.source(range(32)).to_iter_dataset(grain.ReadOptions(num_threads=2)).batch(8)
    for _ in range(3):
        assert len(_drain(iter(ds))) == 4
    (f,) = _frames()
    assert f["library"] == "grain" and f["epoch"] == 3 and f["batches"] == 12
    assert isinstance(iter(ds), grain.DatasetIterator)


def test_grain_before_its_output_stage_is_measured_at_the_outermost_iter():
    # Grain < 0.2.16 (0.2.13 is the last for Python 3.10) has no output
    # stage to patch. Its path, forced on the installed Grain: every
    # IterDataset class's own __iter__ wrapped, the outermost call a loop's
    # epoch; the parents' iterators, made inside it, are not loaders.
    import grain
    from grain._src.python.dataset import dataset as gd

    import dlwatch.hook  # noqa: F401
    from dlwatch.probe.adapters import grain as adapter

    meta = type(gd.IterDataset)
    had_init = "__init__" in meta.__dict__
    adapter.uninstall()
    legacy = adapter._BeforeOutputStage()
    try:
        legacy.install_on(gd.IterDataset)
        assert legacy.wrapped and "__init__" in meta.__dict__

        class DoubledIterator(grain.DatasetIterator):
            def __next__(self):
                return 2 * next(self._parent)

            def get_state(self):
                return self._parent.get_state()

            def set_state(self, state):
                self._parent.set_state(state)

        class Doubled(grain.IterDataset):  # defined after: wrapped as it is made
            def __iter__(self):
                return DoubledIterator(self._parent.__iter__())

        patches.registry.clear()
        ds = grain.MapDataset.source(range(32)).to_iter_dataset(grain.ReadOptions(num_threads=2)).batch(8)
        for _ in range(3):
            it = iter(ds)  # the last epoch's iterator, alive, is what is described
            assert len(_drain(it)) == 4
        (f,) = _frames()
        assert f["library"] == "grain" and f["epoch"] == 3 and f["batches"] == 12
        assert f["knobs"]["ReadOptions.num_threads"] == 2 and f["worker_kind"] == "thread"
        # the parents' iterators, made inside the loop's iter(), are left as Grain made them
        assert it._parents and not any(hasattr(p, "_dlw_stats") for p in it._parents)
        patches.registry.clear()
        assert sum(_drain(iter(Doubled(grain.MapDataset.source(range(4)).to_iter_dataset())))) == 12
        (g,) = _frames()
        assert g["dataset"] == "Doubled" and g["batches"] == 4
    finally:
        legacy.uninstall()
        adapter.install()
    # Grain's own methods are back, and the metaclass as it was.
    assert not legacy.wrapped and ("__init__" in meta.__dict__) == had_init
    assert not hasattr(gd.IterDataset.__dict__.get("__iter__"), "_dlwatch_orig")
    patches.registry.clear()


def _shaped_like_grain_0_2_13(event):
    # Grain < 0.2.16's mp_prefetch iterator, as far as the adapter reads it:
    # its raw MultiProcessIterator holds the event it hands to its GrainPool.
    class _MultiprocessPrefetchDatasetIterator:
        pass

    it = _MultiprocessPrefetchDatasetIterator()
    it._raw_iterator = types.SimpleNamespace(_termination_event=event)
    return it


def test_two_mp_prefetch_pipelines_of_old_grain_list_only_their_own_workers():
    # Grain < 0.2.16 keeps its pools out of the graph's reach (a local of the
    # reader thread): each is tied to its iterator by the reader's event.
    from dlwatch.probe.adapters import grain as adapter

    class GrainPool:  # kept in a weak set, as Grain's are
        def __init__(self, event, *pids):
            self._reader_termination_event = event
            self.processes = [types.SimpleNamespace(pid=p) for p in pids]

    ev_train, ev_eval = threading.Event(), threading.Event()
    pools = [GrainPool(ev_train, 101, 102), GrainPool(ev_eval, 201)]
    for pool in pools:
        adapter._pools.add(pool)
    try:
        train = adapter.describe_graph(_shaped_like_grain_0_2_13(ev_train))
        evals = adapter.describe_graph(_shaped_like_grain_0_2_13(ev_eval))
        unstarted = adapter.describe_graph(_shaped_like_grain_0_2_13(None))
    finally:
        for pool in pools:
            adapter._pools.discard(pool)
    assert [w["pid"] for w in train["pipeline_workers"]] == [101, 102]
    assert train["knobs"]["MultiprocessingOptions.num_workers"] == 2
    assert [w["pid"] for w in evals["pipeline_workers"]] == [201] and evals["num_workers"] == 1
    assert "pipeline_workers" not in unstarted  # no pool yet: no one else's workers


def test_two_real_mp_prefetch_pipelines_of_old_grain_list_only_their_own_workers():
    # The same on a Grain that has the pool (0.2.13 on Python 3.10; newer
    # Grain starts its workers another way and is covered end to end).
    pytest.importorskip("grain._src.python.grain_pool")
    import grain

    import dlwatch.hook  # noqa: F401
    from dlwatch.probe.adapters import grain as adapter
    from dlwatch.probe.adapters.common import walk

    def build(n):
        ds = grain.MapDataset.source(range(1000)).repeat().map(abs).to_iter_dataset().batch(4)
        return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=n))

    a, b = iter(build(2)), iter(build(1))
    try:
        for _ in range(3):
            next(a), next(b)
        pids_a = [w["pid"] for w in adapter.describe_graph(a)["pipeline_workers"]]
        pids_b = [w["pid"] for w in adapter.describe_graph(b)["pipeline_workers"]]
        assert len(pids_a) == 2 and len(pids_b) == 1 and not set(pids_a) & set(pids_b)
    finally:
        for it in (a, b):
            for node in walk(it, adapter._GRAPH):
                close = getattr(getattr(node, "_raw_iterator", None), "stop_prefetch", None)
                if close is not None:
                    close()


def test_a_dataloader_inside_a_measured_next_is_a_stage_of_it():
    import dlwatch.hook  # noqa: F401

    patches.registry.clear()
    loader = DataLoader(torch.arange(12.0), batch_size=3, num_workers=0)
    outer = dlwatch.watch(loader, name="outer")
    assert len(_drain(iter(outer))) == 4
    by_lib = {f.get("library") or "torch": f for f in _frames()}
    assert by_lib["watch"].get("nested_in") is None
    assert by_lib["torch"]["nested_in"] == by_lib["watch"]["id"]


def test_a_dataloader_whose_workers_are_threads_lists_them_by_thread_id():
    # torch has proposed thread workers (worker_method="thread"): an iterator
    # whose _workers are threads is listed by thread id, never by a pid.
    from dlwatch.probe.stats import LoaderStats

    ev = threading.Event()
    ths = [threading.Thread(target=ev.wait, name=f"pt_thread_data_{i}", daemon=True) for i in range(2)]
    for t in ths:
        t.start()

    class ThreadWorkersIter:
        _workers = ths

    it = ThreadWorkersIter()
    st = LoaderStats(0, None, {"num_workers": 2})
    st.begin_epoch(it, time.perf_counter())
    f = st.frame(time.perf_counter_ns())
    ev.set()
    assert f["worker_kind"] == "thread"
    assert [(w["kind"], w["tid"], w["name"]) for w in f["pipeline_workers"]] == [
        ("thread", t.native_id, t.name) for t in ths
    ]
    assert f["workers"] == []


def test_grains_prefetch_buffer_counts_only_the_done_fetches_at_its_head_as_ready():
    # Its buffer holds a future per submitted fetch: its length is no count
    # of ready batches (a QA run: "ready 16 / 16" with both threads deadlocked).
    from concurrent.futures import Future

    from dlwatch.probe.adapters.grain import _ready_in_order

    def fut(done):
        f = Future()
        if done:
            f.set_result(1)
        return f

    assert _ready_in_order([fut(True), fut(True), fut(False), fut(True)]) == (2, 2)
    assert _ready_in_order([fut(False)] * 16) == (0, 16)
    assert _ready_in_order([]) == (0, 0)


class _Records:
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return i


@pytest.mark.parametrize("workers", [0, 1])
def test_a_grain_dataloader_is_described_by_its_own_arguments(workers):
    # A QA run of a public trainer on grain.DataLoader(worker_count=1,
    # read_options=ReadOptions(prefetch_buffer_size=16)) listed
    # MultiprocessingOptions.num_workers and ThreadPrefetchIterDataset's
    # buffer, classes the script never names, and no batch size.
    grain = pytest.importorskip("grain.python")
    from dlwatch.probe.adapters import grain as adapter

    dl = grain.DataLoader(
        data_source=_Records(),
        sampler=grain.IndexSampler(64, grain.NoSharding(), shuffle=False, num_epochs=1, seed=0),
        operations=[grain.Batch(8)],
        worker_count=workers,
        worker_buffer_size=3,
        read_options=grain.ReadOptions(num_threads=2, prefetch_buffer_size=4),
    )
    import dlwatch.hook  # noqa: F401

    it = iter(dl)
    try:
        next(it)
        # The iterator the loop's next() steps, which the loader's frames describe.
        (measured,) = [x for x in [it._iterator] if hasattr(x, "_dlw_stats")]
        d = adapter.describe_graph(measured)
    finally:
        del it
    assert d["batch_size"] == 8
    if workers:
        assert d["knobs"] == {"DataLoader.worker_count": 1, "DataLoader.worker_buffer_size": 3}
        assert d["worker_kind"] == "process" and d["num_workers"] == 1
    else:
        # The operations run in the loop's thread: no workers; the ReadOptions
        # threads read ahead and are listed for their CPU.
        assert list(d["knobs"]) == [
            "DataLoader.worker_count",
            "ReadOptions.num_threads",
            "ReadOptions.prefetch_buffer_size",
        ]
        assert d["num_workers"] == 0 and d["worker_kind"] == "thread" and len(d["pipeline_workers"]) == 2
        # Their buffer holds records the loop's maps have yet to turn into
        # batches: no prefetch queue of the loop's (it read "ready 16/16"
        # beside a 50 % wait), and the live view says so in Grain's words.
        assert d["queue"] == {"ready": None, "in_flight": None, "capacity": None}
        from dlwatch.tui import fmt
        from dlwatch.tui.loader import queue_line

        line = queue_line({**d, "active": True}, fmt.Palette()).plain
        assert line == "queue n/a (worker_count=0: the loop loads each batch itself)", line
    from dlwatch.diagnose.facts import knob

    assert knob({"knobs": d["knobs"]}, "num_workers") == "DataLoader.worker_count"
    assert knob({"knobs": d["knobs"]}, "prefetch_factor") == (
        "DataLoader.worker_buffer_size" if workers else "ReadOptions.prefetch_buffer_size"
    )


def _bad_at_3(x):
    if x == 3:
        raise ValueError("corrupt record 3")
    return x


def _pipelines():
    """Each measured kind of pipeline whose map raises at record 3: the
    class-swapped iterators (nodes, Grain) and the proxies (a WebDataset
    generator, watch() of a generator)."""
    import grain
    import torchdata.nodes as tn
    import webdataset as wds

    def gen():
        for i in range(10):
            yield _bad_at_3(i)

    yield "nodes", lambda: tn.Loader(tn.Mapper(tn.IterableWrapper(range(10)), map_fn=_bad_at_3))
    yield "grain", lambda: grain.MapDataset.source(range(10)).map(_bad_at_3).to_iter_dataset()
    yield "webdataset", lambda: wds.DataPipeline(lambda: iter(range(10)), wds.map(_bad_at_3))
    yield "watch", lambda: dlwatch.watch(gen(), name="gen")


@pytest.mark.parametrize("kind", ["nodes", "grain", "webdataset", "watch"])
def test_a_pipelines_exception_shows_no_dlwatch_frame_and_is_unchanged(kind):
    # People blame the file they see: the timed next() reads as the
    # library's own code (or the user's generator), as without dlwatch.
    import dlwatch.hook  # noqa: F401

    patches.registry.clear()
    make = dict(_pipelines())[kind]
    it = iter(make())
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(ValueError, match="corrupt record 3") as info:
        next(it)
    assert any(fr.name == "_bad_at_3" for fr in info.traceback)
    assert not [fr for fr in info.traceback if "/dlwatch/" in str(fr.path)], info.traceback
    assert info.value.__cause__ is None
    (f,) = _frames()  # measured all the same
    assert f["batches"] == 3, f


def _samples():
    return iter([(float(i),) for i in range(64)])


def test_a_webdataset_pipeline_that_batches_itself_has_that_batch_size():
    # OpenCLIP: wds.batched(args.batch_size) in the pipeline, iterated by a
    # WebLoader(batch_size=None, num_workers=N); its loaders read "batch n/a".
    import webdataset as wds

    import dlwatch.hook  # noqa: F401

    patches.registry.clear()
    pipe = wds.DataPipeline(_samples, wds.batched(8))
    direct = DataLoader(pipe, batch_size=None, num_workers=0)
    assert len(_drain(direct)) == 8
    unbatched = wds.DataPipeline(_samples, wds.batched(8), wds.unbatched())
    assert len(_drain(unbatched)) == 64
    loader = wds.WebLoader(pipe, batch_size=None, num_workers=1).unbatched().batched(16)
    assert len(_drain(loader)) == 4
    got = sorted(((f.get("library") or "torch", f["dataset"], f["batch_size"]) for f in _frames()), key=str)
    assert got == [
        ("torch", "DataPipeline", 8),  # a DataLoader with batch_size=None over it
        ("torch", "DataPipeline", 8),  # the WebLoader's stage
        ("webdataset", "DataPipeline", 8),  # the inner pipeline, iterated in-process
        ("webdataset", "DataPipeline", None),  # ends unbatched
        ("webdataset", "WebLoader", 16),
    ], got


def test_a_webdataset_iterated_directly_carries_its_tar_files(tmp_path):
    """Moved into a DataLoader's workers, a worker past its tar files gets
    none: no-worker-knob's N is bounded by them (rules_pipelines)."""
    import webdataset as wds

    import dlwatch.hook  # noqa: F401

    urls = []
    for s in range(3):
        urls.append(str(tmp_path / f"{s}.tar"))
        with wds.TarWriter(urls[-1]) as w:
            for i in range(4):
                w.write({"__key__": f"{s}-{i}", "cls": str(i).encode()})
    patches.registry.clear()
    assert len(_drain(iter(wds.WebDataset(urls, shardshuffle=False)))) == 12
    (f,) = _frames()
    assert (f["library"], f["shards"], f["shards_of"]) == ("webdataset", 3, "webdataset"), f
