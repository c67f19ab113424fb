"""Whether a DataLoader's ``iter()`` runs inside the training loop's ``next()``.

A plain loop calls ``iter(loader)`` itself, outside any ``next()``: starting
the workers is the epoch's start, and its first ``next()`` waits only for the
first batch. A loader whose ``__iter__`` is a generator around torch's
(litdata's and Mosaic's ``StreamingDataLoader``, Accelerate's prepared
loaders) starts the workers in the loop's first ``next()`` of the epoch
instead: the loop is blocked from that moment, and the wait that matters
begins there. Read once an epoch, never per batch, and never raises.
"""

from __future__ import annotations

import inspect
import sys
from types import FrameType

# Frames from the iterator's constructor up to torch's DataLoader.__iter__
# (a subclass's _get_iterator, the iterator classes' __init__ chain).
MAX_FRAMES = 24
_TORCH_LOADER = "torch.utils.data.dataloader"


def _module(frame: FrameType) -> str:
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else ""


def _is_generator(frame: FrameType) -> bool:
    return bool(frame.f_code.co_flags & inspect.CO_GENERATOR)


def called_from_a_generator(skip: int = 2) -> bool:
    """Whether the code that asked for the iterator is a generator, resumed
    by the loop's ``next()``. The frame ``skip`` levels up must be inside
    torch's ``DataLoader.__iter__``; above it, ``__iter__`` methods that only
    pass an iterator on (a subclass's ``return super().__iter__()``) and
    dlwatch's own wrappers (autotune's, replay's) are iter()'s plumbing, not
    its caller."""
    try:
        frame: FrameType | None = sys._getframe(skip)
        for _ in range(MAX_FRAMES):
            if frame is None:
                return False
            if frame.f_code.co_name == "__iter__" and _module(frame) == _TORCH_LOADER:
                break
            frame = frame.f_back
        else:
            return False
        up = frame.f_back if frame is not None else None
        for _ in range(MAX_FRAMES):
            if up is None:
                return False
            name = up.f_code.co_name
            # A generator expression is drained where it is made
            # (``tuple(iter(x) for x in loaders)``): plumbing too.
            if _is_generator(up) and name != "<genexpr>":
                return True
            if not (_module(up).startswith("dlwatch.") or name in ("__iter__", "<genexpr>")):
                return False
            up = up.f_back
    except Exception:
        pass
    return False
