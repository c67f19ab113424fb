"""WebDataset iterated directly (no DataLoader): the loop steps the iterator
that ``DataPipeline.__iter__`` returns (a generator: measured through a
proxy, consumer.py). A pipeline iterated inside a DataLoader's worker is not
the loop; one nested in another measured ``next()`` on the same thread
(``WebLoader`` over a DataLoader, a DataLoader with ``num_workers=0`` over a
``WebDataset``) is a stage of that one (stats.py: ``nested_in``). It has no
workers of its own: its knob is the DataLoader's ``num_workers`` once it is
iterated through one."""

from __future__ import annotations

from typing import Any

from dlwatch.probe import consumer, patches, stats
from dlwatch.probe.adapters.common import iter_patch

LIBRARY = "webdataset"


def _on_iter(pipe: Any, it: Any) -> Any:
    if patches._in_worker_process():
        return it
    return consumer.watch_epoch(pipe, it, _config(pipe))


_patch = iter_patch("webdataset.pipeline", "DataPipeline", _on_iter)


def install() -> None:
    stats.DATASET_BATCH.append(pipeline_batch)
    _patch.install()


def uninstall() -> None:
    while pipeline_batch in stats.DATASET_BATCH:
        stats.DATASET_BATCH.remove(pipeline_batch)
    _patch.uninstall()


def _config(pipe: Any) -> dict:
    cfg = {
        "num_workers": 0,
        "library": LIBRARY,
        "kind": "webdataset",
        "dataset": type(pipe).__name__,
        "batch_size": pipeline_batch(pipe),
    }
    # Its tar files: moved into a DataLoader's workers, a worker past them
    # gets none (and fails the run by default), so they bound the count.
    shards = stats.dataset_shards(pipe)
    if shards is not None:
        cfg["shards"], cfg["shards_of"] = shards
    return cfg


def pipeline_batch(pipe: Any, depth: int = 0) -> int | None:
    """The batch size a pipeline's last ``batched`` stage makes (OpenCLIP's
    ``wds.batched(args.batch_size)`` inside a ``WebLoader(batch_size=None)``
    read "batch n/a"); a WebLoader's DataLoader stage batches, or its
    dataset does. None where the pipeline ends unbatched or has no stages."""
    stages = getattr(pipe, "pipeline", None)
    if not isinstance(stages, list) or depth > 3:
        return None
    for stage in reversed(stages):
        name = getattr(getattr(stage, "f", None), "__name__", "")
        if name == "_batched":
            args, kw = getattr(stage, "args", ()), getattr(stage, "kw", None) or {}
            n = args[0] if args else kw.get("batchsize", 20)  # webdataset's default
            return n if isinstance(n, int) and not isinstance(n, bool) else None
        if name == "_unbatched":
            return None
        if hasattr(stage, "batch_size") and hasattr(stage, "dataset"):  # a DataLoader
            bs = stage.batch_size
            if isinstance(bs, int) and not isinstance(bs, bool):
                return bs
            return pipeline_batch(stage.dataset, depth + 1)
    return None
