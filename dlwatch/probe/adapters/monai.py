"""MONAI: ``ThreadDataLoader`` is a torch DataLoader whose batches a
``ThreadBuffer`` thread iterates and hands to the loop through a
``queue.Queue``.

- the loop's ``next()``: the generator ``ThreadDataLoader.__iter__``
  returns, timed where the loop steps it (the DataLoader inside is iterated
  by the buffer's thread: its figures are the feeder's). probe/handover.py
  would find the buffer's queue too, but a queue made every epoch starts
  its first wait before any batch marks it: timing the loop's own iterator
  is exact;
- workers: the DataLoader's own (``num_workers``), as for any DataLoader;
- buffer: ``buffer_size``; knobs: ``ThreadDataLoader(num_workers=…,
  buffer_size=…)``, read here so that advice names them.
"""

from __future__ import annotations

from typing import Any

from dlwatch.probe import consumer, stats
from dlwatch.probe.adapters.common import iter_patch

LIBRARY = "monai"


_patch = iter_patch(
    "monai.data.thread_buffer",
    "ThreadDataLoader",
    lambda loader, it: consumer.consumer_iter(loader, it, "ThreadDataLoader"),
)


def knobs(loader: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"ThreadDataLoader.num_workers": int(getattr(loader, "num_workers", 0) or 0)}
    bs = getattr(loader, "buffer_size", None)
    if isinstance(bs, int):
        out["ThreadDataLoader.buffer_size"] = bs
    rep = getattr(loader, "repeats", None)
    if isinstance(rep, int):
        out["ThreadDataLoader.repeats"] = rep
    return out


def install() -> None:
    stats.LOADER_KNOBS["ThreadDataLoader"] = (LIBRARY, knobs)
    _patch.install()


def uninstall() -> None:
    stats.LOADER_KNOBS.pop("ThreadDataLoader", None)
    _patch.uninstall()
