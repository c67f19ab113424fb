"""Probe and collector pieces for loaders in the wild: the thread that takes a
loader's batches, the user's dataset beneath wrappers, the fetch-time
histogram and its percentiles, the first-batch digests."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Subset, TensorDataset

from dlwatch import wire
from dlwatch.collect.window import hist_percentiles
from dlwatch.probe import worker
from dlwatch.probe.stats import loader_config


def _stats_of(registry, loader):
    (st,) = [s for s in registry.snapshot() if s.loader_ref() is loader]
    return st


def test_a_loader_iterated_on_a_producer_thread_says_so(probe):
    main_dl = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)
    fed_dl = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)
    list(main_dl)
    th = threading.Thread(target=lambda: list(fed_dl), name="producer")
    th.start()
    th.join()
    now = time.perf_counter_ns()
    # ("trains" joins them once some thread of the process steps an optimizer.)
    on_main = _stats_of(probe, main_dl).frame(now)["iterated_on"]
    on_producer = _stats_of(probe, fed_dl).frame(now)["iterated_on"]
    assert {k: on_main[k] for k in ("thread", "main")} == {"thread": "MainThread", "main": True}
    assert {k: on_producer[k] for k in ("thread", "main")} == {"thread": "producer", "main": False}


def test_no_thread_before_the_first_batch(probe):
    dl = DataLoader(TensorDataset(torch.zeros(8, 1)), batch_size=2)
    it = iter(dl)
    assert "iterated_on" not in _stats_of(probe, dl).frame(time.perf_counter_ns())
    del it


class Mine(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return i


def test_the_view_names_the_users_dataset_beneath_wrappers():
    dl = DataLoader(Subset(Mine(), [0, 1]), batch_size=2)
    cfg = loader_config(dl, None)
    assert cfg["dataset"] == "Mine"
    assert cfg["dataset_wrappers"] == ["Subset"]
    assert "dataset_wrappers" not in loader_config(DataLoader(Mine()), None)


def test_in_order_is_reported_for_loaders_with_workers():
    if not hasattr(DataLoader(Mine()), "in_order"):
        pytest.skip("torch < 2.6 has no in_order")
    assert loader_config(DataLoader(Mine(), num_workers=2, in_order=False), None)["in_order"] is False
    assert "in_order" not in loader_config(DataLoader(Mine()), None)


def _buckets_of(ms_values):
    """The histogram the worker's timed fetch writes for these fetch times."""
    slots = worker.make_slots(1)
    view, fview = worker.as_int64_view(slots), worker.as_float64_view(slots)
    durations = iter(ms_values)

    def fetch(self, idx):
        time.sleep(next(durations) / 1e3)
        return idx

    timed = worker._timed(fetch, view, fview, 0)
    for i in range(len(ms_values)):
        timed(None, i)
    (w,) = worker.read_workers(view, fview, 1, time.perf_counter_ns())
    return w


@pytest.mark.timing  # real 2 ms sleeps: a loaded box stretches them
def test_fetch_times_land_in_their_buckets_and_give_their_percentiles():
    w = _buckets_of([2.0] * 18 + [40.0, 40.0])
    assert w["batches"] == 20 and sum(c for _, c in w["fetch_hist"]) == 20
    p50, p95, p99 = hist_percentiles(w["fetch_hist"], None)
    # A bucket is 19 % wide; sleeps overshoot a little.
    assert 2.0 <= p50 <= 2.0 * 1.5
    assert 40.0 * 0.8 <= p95 <= 40.0 * 1.5 and 40.0 * 0.8 <= p99 <= 40.0 * 1.5


def test_percentiles_of_a_window_are_the_difference_of_two_histograms():
    old = [[10, 100]]
    new = [[10, 100], [30, 100]]
    lo, hi = wire.fetch_hist_bounds_ms(30)
    p50, _, p99 = hist_percentiles(new, old)
    assert lo <= p50 <= hi and lo <= p99 <= hi
    assert hist_percentiles(old, old) == [None, None, None]
    assert hist_percentiles([["x", 1], [999, 5], [3]], None) == [None, None, None]  # garbage: nothing


def test_very_short_and_very_long_fetches_stay_in_the_table():
    slots = worker.make_slots(1)
    view, fview = worker.as_int64_view(slots), worker.as_float64_view(slots)
    clock = iter([0.0, 0.0, 1.0, 1.0 + 5000.0])  # a 0 s and a 5000 s fetch
    orig_clock = worker._clock
    worker._clock = lambda: next(clock)
    try:
        timed = worker._timed(lambda self, i: i, view, fview, 0)
        timed(None, 0)
        timed(None, 1)
    finally:
        worker._clock = orig_clock
    hist = dict(map(tuple, worker.read_workers(view, fview, 1, 0)[0]["fetch_hist"]))
    assert hist == {0: 1, wire.FETCH_HIST_BUCKETS - 1: 1}


def test_digest_is_deterministic_and_tells_batches_apart():
    a = {"x": torch.arange(10), "y": ["a", "b"]}
    assert worker.digest(a) == worker.digest({"x": torch.arange(10), "y": ["a", "b"]})
    assert worker.digest(a) != worker.digest({"x": torch.arange(1, 11), "y": ["a", "b"]})
    assert worker.digest([]) != 0 and worker.digest(torch.zeros(10**6)) != 0


class Stream(IterableDataset):
    def __init__(self, shard):
        self.shard = shard

    def __iter__(self):
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        start, step = (info.id, info.num_workers) if self.shard and info else (0, 1)
        return iter(range(start, 64, step))


@pytest.mark.parametrize("shard", [False, True])
def test_workers_of_an_iterable_dataset_report_their_first_two_batches(probe, shard):
    dl = DataLoader(Stream(shard), batch_size=4, num_workers=2, multiprocessing_context="fork")
    it = iter(dl)
    got = [next(it) for _ in range(6)]
    assert got
    frame = _stats_of(probe, dl).frame(time.perf_counter_ns())
    del it
    digests = [(w.get("first_batch_digest"), w.get("second_batch_digest")) for w in frame["workers"]]
    assert all(a and b and a != b for a, b in digests), digests
    assert (digests[0] == digests[1]) is (not shard)


def test_accelerates_shard_of_an_iterable_dataset_is_seen_through():
    shard_mod = pytest.importorskip("accelerate.data_loader")
    ds = shard_mod.IterableDatasetShard(Stream(False), batch_size=4, num_processes=2, process_index=0)
    cfg = loader_config(DataLoader(ds, batch_size=4), None)
    assert cfg["dataset"] == "Stream" and cfg["dataset_wrappers"] == ["IterableDatasetShard"]
    assert cfg["kind"] == "iterable"


def _hf_stream(shards: int):
    datasets = pytest.importorskip("datasets")
    return datasets.Dataset.from_dict({"x": list(range(64))}).to_iterable_dataset(num_shards=shards)


@pytest.mark.parametrize("shards", [1, 3])
def test_the_shards_of_an_hf_iterable_dataset_are_read(shards):
    """HF datasets gives each worker whole shards and stops the rest: the
    shard count is what caps the workers that get data."""
    ds = _hf_stream(shards).map(lambda row: row)  # a pipeline on it keeps its shards
    cfg = loader_config(DataLoader(ds, batch_size=4, num_workers=2), None)
    assert cfg["kind"] == "iterable"
    assert (cfg["shards"], cfg["shards_of"]) == (shards, "datasets")
    assert all(
        isinstance(cfg[k], t) for k, t in (("shards", wire.LOADER_OPTIONAL["shards"]), ("shards_of", str))
    )


def test_shards_are_read_only_where_workers_share_them():
    # Without workers the loop reads every shard itself; a map dataset is
    # shared out by the sampler; torch's own IterableDataset has no shards.
    assert "shards" not in loader_config(DataLoader(_hf_stream(3), batch_size=4), None)
    hf_map = pytest.importorskip("datasets").Dataset.from_dict({"x": list(range(8))})
    assert "shards" not in loader_config(DataLoader(hf_map, batch_size=4, num_workers=2), None)
    assert "shards" not in loader_config(DataLoader(Stream(True), batch_size=4, num_workers=2), None)


class _BrokenShards(IterableDataset):
    """A class of the datasets package whose shard count fails to compute."""

    __module__ = "datasets.iterable_dataset"

    @property
    def num_shards(self):
        raise RuntimeError("no shards for you")

    n_shards = 0

    def __iter__(self):
        return iter(())


def test_a_shard_count_that_fails_is_left_out_and_the_rest_is_read():
    cfg = loader_config(DataLoader(_BrokenShards(), batch_size=4, num_workers=2), None)
    assert "shards" not in cfg
    assert cfg["kind"] == "iterable" and cfg["num_workers"] == 2 and cfg["batch_size"] == 4


def _tar_shards(tmp_path, n: int) -> list[str]:
    wds = pytest.importorskip("webdataset")
    urls = []
    for s in range(n):
        urls.append(str(tmp_path / f"shard-{s}.tar"))
        with wds.TarWriter(urls[-1]) as w:
            for i in range(4):
                w.write({"__key__": f"{s}-{i}", "cls": str(i).encode()})
    return urls


def test_the_tar_files_of_a_webdataset_are_its_shards(tmp_path):
    """WebDataset's split_by_worker gives each worker whole tar files: a
    worker past their count gets none (and fails the run by default)."""
    wds = pytest.importorskip("webdataset")
    urls = _tar_shards(tmp_path, 3)
    built = {
        "WebDataset, composed": wds.WebDataset(urls, shardshuffle=False).decode().shuffle(8).batched(2),
        "DataPipeline": wds.DataPipeline(
            wds.SimpleShardList(urls), wds.split_by_worker, wds.tarfile_to_samples()
        ),
        "split by node on one rank": wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node),
    }
    for name, ds in built.items():
        cfg = loader_config(DataLoader(ds, batch_size=None, num_workers=2), None)
        assert (cfg.get("shards"), cfg.get("shards_of")) == (3, "webdataset"), name
    # Resampled: every worker draws shards at random, none runs dry; and a
    # pipeline that does not split by worker gives every worker every file.
    for ds in (
        wds.WebDataset(urls, resampled=True, shardshuffle=False),
        wds.DataPipeline(wds.SimpleShardList(urls), wds.tarfile_to_samples()),
    ):
        assert "shards" not in loader_config(DataLoader(ds, batch_size=None, num_workers=2), None)


def test_a_webloader_lends_its_stages_shards_with_its_workers():
    """OpenCLIP's WebLoader(WebDataset, num_workers=N): the wrapper is the
    loop's loader and shows its DataLoader stage's workers; the stage's tar
    files cap them, so the wrapper carries them too (the advice's shard cap)."""
    from dlwatch.collect.model import lend_stage_workers

    outer = {"id": 0, "library": "webdataset", "loop_role": "loop", "num_workers": 0}
    stage = {"id": 1, "library": "torch", "loop_role": "stage", "nested_in": 0, "num_workers": 4}
    stage.update(kind="iterable", shards=2, shards_of="webdataset", workers=[{"id": i} for i in range(4)])
    lend_stage_workers([outer, stage])
    assert (outer["num_workers"], outer["workers_from"]) == (4, 1)
    assert (outer["kind"], outer["shards"], outer["shards_of"]) == ("iterable", 2, "webdataset")


def test_a_webdataset_split_by_node_counts_this_ranks_tar_files(tmp_path, monkeypatch):
    # Rank 1 of 2 reads urls[1::2]: one of the three files, for its workers.
    wds = pytest.importorskip("webdataset")
    urls = _tar_shards(tmp_path, 3)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = wds.WebDataset(urls, shardshuffle=False, nodesplitter=wds.split_by_node)
    cfg = loader_config(DataLoader(ds, batch_size=None, num_workers=2), None)
    assert (cfg["shards"], cfg["shards_of"]) == (1, "webdataset")
