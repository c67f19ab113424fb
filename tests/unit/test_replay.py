"""The replay override (dlwatch tune's ceiling trial): real DataLoaders, real
workers; the loop must receive the structures the loader produced, epochs
keep their length, no worker is spawned once replaying, and a normal run
never replays."""

from __future__ import annotations

import gc
import hashlib
import os
import weakref
from collections import namedtuple

import numpy as np
import pytest

from dlwatch import overrides as fmt
from dlwatch.probe import overrides
from dlwatch.probe.replay import fresh, nbytes, versions

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, Dataset, IterableDataset  # noqa: E402

Pair = namedtuple("Pair", "image label")


class Dicts(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return {"image": torch.full((3, 2), float(i)), "label": i, "meta": {"ids": [i, -i]}}


class Tuples(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return Pair(torch.full((2,), float(i)), torch.tensor(i))


class Stream(IterableDataset):
    def __iter__(self):
        for i in range(24):
            yield torch.full((2,), float(i)), i


def structure(obj):
    """Types and shapes, containers included: what the loop sees besides values."""
    if isinstance(obj, dict):
        return (type(obj).__name__, {k: structure(v) for k, v in obj.items()})
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [structure(v) for v in obj])
    if isinstance(obj, torch.Tensor):
        return ("Tensor", tuple(obj.shape), str(obj.dtype))
    return type(obj).__name__


def digest(obj) -> str:
    h = hashlib.sha256(repr(structure(obj)).encode())

    def walk(o):
        if isinstance(o, dict):
            for k in sorted(o):
                h.update(str(k).encode())
                walk(o[k])
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
        elif isinstance(o, torch.Tensor):
            h.update(o.contiguous().numpy().tobytes())
        else:
            h.update(repr(o).encode())

    walk(obj)
    return h.hexdigest()


@pytest.fixture
def replay_env():
    def arm(**replay):
        os.environ[fmt.ENV_VAR] = fmt.encode({"replay": {"after_s": 0, **replay}})
        overrides.install()

    yield arm
    overrides.uninstall()
    os.environ.pop(fmt.ENV_VAR, None)


def run_epochs(loader, epochs: int):
    """Digests and structures per epoch, the iterator of each epoch, and
    whether the loop's own mutation of a batch survived into the cache."""
    seen, iters = [], []
    for _ in range(epochs):
        it = iter(loader)
        iters.append(it)
        ep = []
        for b in it:
            ep.append((digest(b), structure(b)))
            if isinstance(b, dict):
                b["image"] = None  # the loop replaces an entry, as `batch["x"] = batch["x"].cuda()` does
        seen.append(ep)
    return seen, iters


@pytest.mark.parametrize(
    "ds,kwargs",
    [
        (Dicts(), {"num_workers": 1}),
        (Tuples(), {"num_workers": 1, "persistent_workers": True}),
    ],
    ids=["dicts-1-worker", "namedtuples-persistent"],
)
def test_the_loop_receives_the_cached_batches_in_turn_with_their_structure(replay_env, ds, kwargs):
    twin = [(digest(b), structure(b)) for b in DataLoader(ds, batch_size=4, **kwargs)]
    replay_env(batches=3)
    loader = DataLoader(ds, batch_size=4, **kwargs)
    seen, iters = run_epochs(loader, 3)
    rep = loader._dlw_replay
    assert rep.status["state"] == "replaying" and rep.status["batches_cached"] == 3
    assert rep.status["in_place"] is False  # replacing an entry is no change in place: no copies
    # Epoch 1: the first 3 batches as the loader made them, then the cache in turn.
    first = seen[0]
    assert first[:3] == twin[:3]
    cycle = [twin[i % 3] for i in range(3, 3 + len(twin) * 2)]
    assert [b for ep in seen for b in ep][3 : 3 + len(cycle)] == cycle[: sum(map(len, seen)) - 3]
    assert [len(ep) for ep in seen] == [len(twin)] * 3  # epochs keep their length
    assert iters[1] is iters[0] and iters[2] is iters[0]  # no new iterator, no worker spawned
    if kwargs.get("num_workers"):
        assert all(w.is_alive() for w in iters[0]._workers)  # idle, not killed


@pytest.mark.parametrize("when", ["caching", "replaying"])
def test_a_loop_that_changes_its_batch_in_place_sees_the_loaders_values_in_every_replay(replay_env, when):
    """A CPU loop normalising in place (x.sub_(mean)) would change the cache
    itself and drift further with every replay: it must see each replayed
    batch as the loader made it."""
    twin = [digest(b) for b in DataLoader(Tuples(), batch_size=4)]
    replay_env(batches=3)
    loader = DataLoader(Tuples(), batch_size=4, num_workers=1)
    seen = []
    for _ in range(3):
        for b in loader:
            seen.append(digest(b))
            if when == "caching" or len(seen) > 6:
                b.image.mul_(-3.0).add_(1.0)  # in place, as a CPU loop's normalisation
    rep = loader._dlw_replay
    assert rep.status["in_place"] is True and rep.status["state"] == "replaying"
    # Caught while caching, the changed batch is cached no more and the next
    # one takes its place; caught while replaying, the batch the loop changed
    # first is gone (no copy of it was kept) and the rest replay.
    kept = 3 if when == "caching" else 2
    assert rep.status["batches_cached"] == kept == len(rep.cache)
    assert rep.status["bytes_cached"] == sum(nbytes(e) for e in rep.cache)
    assert seen[:3] == twin[:3]
    # Every batch the loop got is one the loader made, unchanged: no drift.
    assert set(seen) <= set(twin), [i for i, d in enumerate(seen) if d not in twin]
    # Replays keep their turn: the same batches over and over.
    replayed = seen[9:]
    assert len(set(replayed)) == kept
    assert all(replayed[i] == replayed[i % kept] for i in range(len(replayed))), replayed


class Arrays(Dataset):
    def __len__(self):
        return 24

    def __getitem__(self, i):
        return np.full((3, 2), float(i), dtype=np.float32)


def numpy_collate(samples):
    return {"image": np.stack(samples), "label": np.arange(len(samples))}


@pytest.mark.parametrize("when", ["caching", "replaying"])
def test_a_loop_that_changes_its_numpy_batch_in_place_sees_the_loaders_values_in_every_replay(
    replay_env, when
):
    """JAX-style: a collate_fn that returns NumPy, normalised in place by the
    loop (x -= mean). An array has no version counter: its sampled values
    tell the replay it changed, and no replay drifts."""
    twin = [digest(b) for b in DataLoader(Arrays(), batch_size=4, collate_fn=numpy_collate)]
    replay_env(batches=3)
    loader = DataLoader(Arrays(), batch_size=4, num_workers=1, collate_fn=numpy_collate)
    seen = []
    for _ in range(3):
        for b in loader:
            seen.append(digest(b))
            if when == "caching" or len(seen) > 6:
                b["image"] *= -3.0  # in place, on the array the loader handed out
                b["image"] += 1.0
    rep = loader._dlw_replay
    assert rep.status["in_place"] is True and rep.status["state"] == "replaying"
    kept = 3 if when == "caching" else 2
    assert rep.status["batches_cached"] == kept == len(rep.cache)
    assert seen[:3] == twin[:3]
    assert set(seen) <= set(twin), [i for i, d in enumerate(seen) if d not in twin]
    replayed = seen[9:]
    assert len(set(replayed)) == kept
    assert all(replayed[i] == replayed[i % kept] for i in range(len(replayed))), replayed


def test_versions_and_copies_of_cpu_tensors():
    t, u = torch.zeros(2), torch.ones(3)
    batch = {"x": [t, Pair(u, 7)]}
    vs = versions(batch)
    assert [(a is t or a is u) for a, _ in vs] == [True, True] and len(vs) == 2
    t.add_(1)
    assert any(a._version != v for a, v in vs)
    out = fresh(batch, copy_cpu=True)
    assert type(out["x"][1]) is Pair and out["x"][1].label == 7
    assert out["x"][0] is not t and torch.equal(out["x"][0], t)
    assert out["x"][1].image is not u and torch.equal(out["x"][1].image, u)
    assert fresh(batch)["x"][0] is t  # without copy_cpu: the same tensors


def test_an_iterable_dataset_without_length_replays_past_its_end(replay_env):
    twin = [(digest(b), structure(b)) for b in DataLoader(Stream(), batch_size=4)]
    replay_env(batches=2)
    got = []
    for i, b in enumerate(DataLoader(Stream(), batch_size=4, num_workers=1)):
        got.append((digest(b), structure(b)))
        if i == 20:
            break
    # 6 batches in the stream; without a length the epoch never ends under replay.
    assert got == [twin[i % 2] for i in range(21)]


def test_a_batch_over_the_byte_budget_replays_fewer_batches_and_says_so(replay_env):
    one = nbytes(next(iter(DataLoader(Dicts(), batch_size=4))))
    replay_env(batches=5, max_bytes=int(one * 2.5))
    loader = DataLoader(Dicts(), batch_size=4)
    for _ in zip(range(10), loader):
        pass
    st = loader._dlw_replay.status
    assert st["batches_cached"] == 2 and st["limited_by"] == "max_bytes" and st["state"] == "replaying"
    assert st["bytes_cached"] == 2 * one <= st["max_bytes"]


def test_a_single_batch_larger_than_the_budget_is_still_replayed(replay_env):
    replay_env(batches=5, max_bytes=1)
    loader = DataLoader(Dicts(), batch_size=4)
    xs = [int(b["image"][0, 0, 0]) for _, b in zip(range(5), loader)]
    assert xs == [0, 0, 0, 0, 0]
    assert loader._dlw_replay.status["batches_cached"] == 1
    assert loader._dlw_replay.status["limited_by"] == "max_bytes"


def test_only_the_selected_loader_replays(replay_env):
    os.environ[fmt.ENV_VAR] = fmt.encode(
        {"loader": {"index": 0, "dataset": "Tuples"}, "replay": {"after_s": 0, "batches": 1}}
    )
    overrides.install()
    a, b = DataLoader(Dicts(), batch_size=4), DataLoader(Tuples(), batch_size=4)
    assert not hasattr(a, "_dlw_replay") and hasattr(b, "_dlw_replay")
    assert len({digest(x) for x in a}) == 6 and len({digest(x) for x in b}) == 1


def test_a_loader_built_from_the_selected_one_over_its_dataset_takes_its_replay(replay_env):
    # Accelerate's prepare() (and the HF Trainer through it) iterates a new
    # DataLoader over the script's dataset; the script's own is never iterated.
    os.environ[fmt.ENV_VAR] = fmt.encode(
        {"loader": {"index": 0, "dataset": "Tuples"}, "replay": {"after_s": 0, "batches": 1}}
    )
    overrides.install()
    ds = Tuples()
    mine = DataLoader(ds, batch_size=4)
    other = DataLoader(Tuples(), batch_size=4)  # another dataset: never adopts it
    assert len({digest(x) for x in other}) == 6
    built = DataLoader(mine.dataset, batch_size=4)
    assert len({digest(x) for x in built}) == 1 and built._dlw_replay is mine._dlw_replay
    assert mine._dlw_replay.status["state"] == "replaying"
    # Adopted once: a later loader over the same dataset is not.
    later = DataLoader(ds, batch_size=4)
    assert len({digest(x) for x in later}) == 6


def test_fresh_copies_containers_not_tensors():
    t = torch.zeros(2)
    batch = {"x": [t, Pair(t, {"y": t})]}
    out = fresh(batch)
    assert out == batch and out is not batch and out["x"] is not batch["x"]
    assert out["x"][1] is not batch["x"][1] and out["x"][1].label is not batch["x"][1].label
    assert out["x"][0] is t and type(out["x"][1]) is Pair


def test_fresh_copies_a_tensor_on_the_gpu_so_in_place_ops_leave_the_cache_alone():
    class OnGpu:  # what fresh reads of a CUDA tensor (this machine has none)
        is_cuda = True

        def clone(self):
            return ("clone of", self)

    t = OnGpu()
    out = fresh({"x": t, "y": [t]})
    assert out == {"x": ("clone of", t), "y": [("clone of", t)]}


def test_replay_is_never_active_in_a_normal_run():
    # Without the variable: tests/unit/test_tune.py's subprocess check (DataLoader's
    # __init__ and __iter__ are torch's own). Other overrides without "replay":
    os.environ[fmt.ENV_VAR] = fmt.encode({"num_workers": 0})
    try:
        overrides.install()
        loader = DataLoader(Dicts(), batch_size=4)
        assert DataLoader.__iter__.__module__ == "torch.utils.data.dataloader"
        assert not hasattr(loader, "_dlw_replay")
        assert len({digest(b) for b in loader}) == 6
    finally:
        overrides.uninstall()
        os.environ.pop(fmt.ENV_VAR, None)
    assert DataLoader.__init__.__module__ == "torch.utils.data.dataloader"


def test_parse_rejects_a_malformed_replay():
    assert fmt.parse('{"replay": {}}')["replay"] == {}
    assert fmt.parse('{"replay": {"batches": 5, "max_bytes": 10, "after_s": 2}}')["replay"] == {
        "batches": 5, "max_bytes": 10, "after_s": 2.0,
    }  # fmt: skip
    for bad in ('{"replay": true}', '{"replay": {"batches": 0}}', '{"replay": {"max_bytes": -1}}',
                '{"replay": {"after_s": "1"}}', '{"replay": {"n": 1}}'):  # fmt: skip
        with pytest.raises(fmt.OverrideError):
            fmt.parse(bad)


def test_accelerates_prepared_loader_replays_the_selected_one(replay_env):
    # The ceiling trial of a job that hands its DataLoader to prepare(): the
    # loop iterates a DataLoader Accelerate builds over the same dataset.
    accelerate = pytest.importorskip("accelerate")
    os.environ[fmt.ENV_VAR] = fmt.encode(
        {"loader": {"index": 0, "dataset": "Tuples"}, "replay": {"after_s": 0, "batches": 2}}
    )
    overrides.install()
    mine = DataLoader(Tuples(), batch_size=4)
    prepared = accelerate.Accelerator(cpu=True).prepare(mine)
    seen = [digest(b) for b in prepared]
    assert len(seen) == 6 and len(set(seen)) == 2, seen
    assert mine._dlw_replay.status["state"] == "replaying"


@pytest.mark.parametrize("state", ["caching", "replaying"])
def test_an_iterator_the_loop_drops_is_freed_then_not_by_the_garbage_collector(replay_env, state):
    """An iterator in a reference cycle is freed when the collector runs, at
    whatever allocation of the loop sets it off (or in a worker forked
    later): its workers' shutdown then waited torch's 5 s join there. Without
    the collector, the dropped iterator goes at once and its worker exits."""
    replay_env(batches=2 if state == "replaying" else 50)
    loader = DataLoader(Tuples(), batch_size=4, num_workers=1)
    it = iter(loader)
    for _ in range(3):
        next(it)
    assert loader._dlw_replay.status["state"] == state
    gone, worker = weakref.ref(it), it._workers[0]
    gc.disable()
    try:
        del it
        if state == "replaying":  # the replay keeps its iterator for the next epoch
            overrides.uninstall()
            del loader
        assert gone() is None
        worker.join(timeout=3.0)
        assert worker.exitcode is not None
    finally:
        gc.enable()
