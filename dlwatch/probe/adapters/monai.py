"""MONAI: ``ThreadDataLoader`` is a torch DataLoader whose batches a
``ThreadBuffer`` thread iterates and hands to the loop through a
``queue.Queue``.

- the loop's ``next()``: the buffer's ``get`` on the training thread
  (probe/handover.py finds it for any DataLoader fed through a queue);
- workers: the DataLoader's own (``num_workers``), as for any DataLoader;
- buffer: ``buffer_size``; knobs: ``ThreadDataLoader(num_workers=…,
  buffer_size=…)``, read here so that advice names them.
"""

from __future__ import annotations

from typing import Any

from dlwatch.probe import stats

LIBRARY = "monai"


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


def uninstall() -> None:
    stats.LOADER_KNOBS.pop("ThreadDataLoader", None)
