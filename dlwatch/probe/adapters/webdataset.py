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

from dlwatch.probe import consumer, patches
from dlwatch.probe.adapters.common import iter_patch

LIBRARY = "webdataset"


def _on_iter(pipe: Any, it: Any) -> Any:
    if patches._in_worker_process():
        return it
    return consumer.watch_epoch(pipe, it, _config(pipe))


_patch = iter_patch("webdataset.pipeline", "DataPipeline", _on_iter)
install, uninstall = _patch.install, _patch.uninstall


def _config(pipe: Any) -> dict:
    return {"num_workers": 0, "library": LIBRARY, "kind": "webdataset", "dataset": type(pipe).__name__}
