"""Iterable datasets that are not shared out among their workers: idle-workers,
duplicated-samples.

An ``IterableDataset`` runs whole in every worker; the dataset itself must
hand each worker its part (``torch.utils.data.get_worker_info()``, or its
library's sharding: an HF datasets ``IterableDataset`` or a ``WebDataset``
gives each worker whole shards). Shared out badly, some workers get nothing
and idle while the loop waits on the one that has the data (fewer shards than
workers: HF datasets #8669, which stops the workers past its ``num_shards``;
WebDataset fails the run there unless ``empty_check=False``); not shared out
at all, every worker yields the whole stream and each sample reaches the loop
once per worker.

Where the probe read the shard count (``shards``, probe/stats.py), it also
caps the worker-count advice of rules_workers: workers past it get no data,
so a raise past it is a reshard first (``capped_by_shards``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

from dlwatch.thresholds import DATA_BOUND_WAIT

from .facts import GONE_STATES, Context, LoaderView, as_int, as_list, count_of, hint, pct, r, setting
from .registry import Rule

# A worker is idle when it delivered at most this share of the busiest
# worker's batches in the window ("far fewer than the others": with an even
# share every worker delivers about as many as the busiest).
IDLE_SHARE = 0.25
# ... and the busiest delivered at least this many: a count judged on two
# batches says nothing.
IDLE_MIN_BATCHES = 8


def _iterable_with_workers(lv: LoaderView) -> bool:
    return lv.loader.get("kind") == "iterable" and (lv.num_workers or 0) >= 2 and len(_all_workers(lv)) >= 2


def _all_workers(lv: LoaderView) -> list[dict[str, Any]]:
    """Every worker slot, those whose process exited included: a worker of
    an iterable dataset that ran out of data exits mid-epoch (unless its
    workers are persistent), and that is the idle worker this module names."""
    return [w for w in as_list(lv.loader.get("workers")) if isinstance(w, dict)]


def _name(lv: LoaderView) -> str:
    ds = lv.loader.get("dataset")
    return f"{lv.title} ({ds})" if isinstance(ds, str) and ds else lv.title


def _ids(ws: list[dict[str, Any]]) -> str:
    ids = [str(w.get("id")) for w in ws]
    return ", ".join(ids[:-1]) + " and " + ids[-1] if len(ids) > 1 else ids[0]


SHARDING_ADVICE = (
    "shard the stream across workers: in __iter__, read torch.utils.data.get_worker_info() "
    "(id, num_workers) and take every num_workers-th file or item; an HF datasets IterableDataset "
    "does this itself when it has at least num_workers shards (split_dataset_by_node splits "
    "across ranks, not workers)"
)

# Each library's name in advice, and how its dataset gets at least n shards.
_LIBRARY_NAME = {"datasets": "HF datasets", "webdataset": "WebDataset"}
_RESHARD = {
    "datasets": lambda n: (
        f"more data files (a streaming dataset has one shard per file), ds.reshard() where your "
        f"datasets release has it (Parquet: a shard per row group), "
        f"Dataset.to_iterable_dataset(num_shards={n}), or a list of {n}+ items in "
        f"IterableDataset.from_generator's gen_kwargs"
    ),
    "webdataset": lambda n: (
        f"write the data as {n}+ tar files, e.g. wds.ShardWriter with a smaller maxcount; or "
        f"WebDataset(urls, resampled=True) with .with_epoch(): each worker then draws shards at random"
    ),
}
# What WebDataset does with a worker left without a tar file (its default empty_check).
WEBDATASET_EMPTY_WORKER = 'which fails the run ("No samples found in dataset") unless empty_check=False'
# What a worker past the shard count does, in each library.
_PAST_THE_SHARDS = {
    "datasets": "stops the workers past {n}",
    "webdataset": "a worker past {n} gets none, " + WEBDATASET_EMPTY_WORKER,
}


def library_shards(lv: LoaderView) -> tuple[int, str] | None:
    """(shards, library) of an iterable dataset whose library gives each
    worker whole shards, none past the count (the probe's ``shards``: HF
    datasets, WebDataset); None where no library shares it out so."""
    n = as_int(lv.loader.get("shards"))
    if lv.loader.get("kind") != "iterable" or n is None or n <= 0:
        return None
    return n, str(lv.loader.get("shards_of") or "")


def reshard(lib: str, n: int) -> str:
    """How to give a dataset of ``lib`` at least ``n`` shards, in its terms."""
    how = _RESHARD.get(lib)
    return f"give the dataset at least {n} shards" + (f" ({how(n)})" if how else "")


def _stops(lib: str, n: int) -> str:
    who = _LIBRARY_NAME.get(lib, lib or "its library")
    past = _PAST_THE_SHARDS.get(lib, "the workers past {n} get none").format(n=n)
    return f"{who} gives each worker whole shards and {past}"


class ShardCap(NamedTuple):
    """A worker-count raise past the dataset's shards, said as a reshard."""

    sentence: str  # added to the hint's message
    suggestion: str  # replaces "set num_workers=rec"
    evidence: dict[str, Any]


def capped_by_shards(lv: LoaderView, rec: int) -> ShardCap | None:
    """Where ``rec`` workers are more than the dataset's shards: workers past
    the shard count get no data, so the raise is a reshard first (and
    render.with_tune_command verifies once resharded, from ``reshard_to``).
    None where the shards do not cap ``rec``."""
    got = library_shards(lv)
    if got is None or rec <= got[0]:
        return None
    n, lib = got
    nw = lv.num_workers or 0
    sentence = (
        f" But its dataset has {count_of(n, 'shard')}, and {_stops(lib, n)}: as it is, "
        f"{n} {'workers get' if n != 1 else 'worker gets'} data at most."
    )
    then = f"then set {setting(lv.loader, 'num_workers', rec)}"
    if nw < n:
        sugg = f"set {setting(lv.loader, 'num_workers', n)} now; for {rec}, {reshard(lib, rec)}, {then}"
    else:
        sugg = f"{reshard(lib, rec)}, {then}"
    return ShardCap(sentence, sugg, {"shards": n, "shards_of": lib or None, "reshard_to": rec})


def rule_idle_workers(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if not lv.steady or not _iterable_with_workers(lv):
            continue
        if lv.wait is None or lv.wait < DATA_BOUND_WAIT:
            continue
        maybe = [(w, as_int(w.get("window_batches"))) for w in _all_workers(lv)]
        counts = [(w, c) for w, c in maybe if c is not None]
        if len(counts) < len(maybe):
            continue
        top = max(c for _, c in counts)
        if top < IDLE_MIN_BATCHES:
            continue
        idle = [(w, c) for w, c in counts if c <= IDLE_SHARE * top]
        if not idle:
            continue
        working = [(w, c) for w, c in counts if c > IDLE_SHARE * top]
        n_idle = len(idle)
        window = lv.loader.get("window_s")
        span = f"in the last {window:.0f} s" if isinstance(window, (int, float)) else "in the window"
        gone = {id(w) for w, _ in idle if w.get("state") in GONE_STATES}
        idle_txt = ", ".join(
            f"worker {w.get('id')}: {c}" + (" (exited)" if id(w) in gone else "") for w, c in idle
        )
        work_txt = ", ".join(f"worker {w.get('id')}: {c}" for w, c in working)
        msg = (
            f"{_name(lv)} waits for data {pct(lv.wait)} of the time while {n_idle} of its "
            f"{len(counts)} workers deliver (almost) no batches {span} ({idle_txt}; {work_txt}): "
            f"the iterable dataset hands {'them' if n_idle > 1 else 'it'} no data, so "
            f"{len(working)} worker{'s' if len(working) != 1 else ''} do{'es' if len(working) == 1 else ''} "
            f"all the loading."
        )
        sugg = SHARDING_ADVICE + f"; or set num_workers={len(working)} to stop paying for idle ones"
        got = library_shards(lv)
        nw = lv.num_workers or 0
        if got is not None and got[0] < nw:
            # The cause, in the library's terms: HF datasets stopped them.
            n, lib = got
            msg += f" Its dataset has {count_of(n, 'shard')} for {nw} workers, and {_stops(lib, n)}."
            sugg = (
                f"{reshard(lib, nw)}; or set {setting(lv.loader, 'num_workers', n)} to stop paying "
                f"for idle ones"
            )
        ev: dict[str, Any] = {
            "data_wait_fraction": r(lv.wait),
            "num_workers": lv.num_workers,
            "idle_workers": [
                {
                    "id": w.get("id"),
                    "pid": w.get("pid"),
                    "window_batches": c,
                    "batches": w.get("batches"),
                    "exited": w.get("state") in GONE_STATES,
                }
                for w, c in idle
            ],
            "working_workers": [{"id": w.get("id"), "window_batches": c} for w, c in working],
            "idle_share": IDLE_SHARE,
            "shards": lv.loader.get("shards"),
        }
        dup = duplicated_groups(lv)
        if dup:
            ev["duplicated_first_batches"] = dup
        out.append(hint("idle-workers", "warn", lv.pid, lv.lid, msg, sugg, ev))
    return out


def duplicated_groups(lv: LoaderView) -> list[list[int]]:
    """Workers whose first two batches were the same as another's (ids,
    grouped). A worker whose two batches are alike (constant data) proves
    nothing and is left out."""
    groups: dict[tuple[int, int], list[int]] = {}
    for w in lv.workers:
        a, b, wid = (
            as_int(w.get("first_batch_digest")),
            as_int(w.get("second_batch_digest")),
            as_int(w.get("id")),
        )
        if a is None or b is None or wid is None or a == b:
            continue
        groups.setdefault((a, b), []).append(wid)
    return sorted(sorted(g) for g in groups.values() if len(g) > 1)


def rule_duplicated_samples(ctx: Context) -> list[dict[str, Any]]:
    out = []
    for lv in ctx.loaders:
        if lv.phase == "inactive" or not _iterable_with_workers(lv):
            continue
        groups = duplicated_groups(lv)
        if not groups:
            continue
        copies = max(len(g) for g in groups)
        msg = (
            f"{_name(lv)}: workers {'; '.join(_ids([{'id': i} for i in g]) for g in groups)} delivered "
            f"the same first two batches: the iterable dataset is not shared out among its "
            f"workers, so each of them yields the same stream and every sample reaches the "
            f"loop up to {copies} times an epoch."
        )
        ev = {
            "num_workers": lv.num_workers,
            "duplicated_workers": groups,
            "copies_per_sample": copies,
            "detected_by": "equal digests of each worker's first two batches (workers/first_batch_digest)",
        }
        out.append(hint("duplicated-samples", "warn", lv.pid, lv.lid, msg, SHARDING_ADVICE, ev))
    return out


# Until the iterable dataset is shared out among its workers, more workers
# would idle too, or yield yet more copies of every sample.
MORE_WORKERS = frozenset({"add-workers", "io-bound", "cpu-bound-preprocessing"})

RULES = (
    Rule("idle-workers", rule_idle_workers, "loader", rate=True, supersedes=MORE_WORKERS),
    Rule("duplicated-samples", rule_duplicated_samples, "loader", supersedes=MORE_WORKERS),
)
