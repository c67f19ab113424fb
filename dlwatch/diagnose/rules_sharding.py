"""Iterable datasets that are not shared out among their workers: idle-workers,
duplicated-samples.

An ``IterableDataset`` runs whole in every worker; the dataset itself must
hand each worker its part (``torch.utils.data.get_worker_info()``, or a
library's sharding such as ``datasets.distributed.split_dataset_by_node``).
Shared out badly, some workers get nothing and idle while the loop waits on
the one that has the data (fewer shards than workers: HF datasets #8669); not
shared out at all, every worker yields the whole stream and each sample
reaches the loop once per worker.
"""

from __future__ import annotations

from typing import Any

from dlwatch.thresholds import DATA_BOUND_WAIT

from .facts import GONE_STATES, Context, LoaderView, as_int, as_list, hint, pct, r
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
    "(id, num_workers) and take every num_workers-th file or item, or with HF datasets use "
    "split_dataset_by_node / a dataset with at least num_workers shards"
)


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
