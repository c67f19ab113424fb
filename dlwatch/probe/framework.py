"""Which framework iterates a loader, and whether for training or evaluation.

The frameworks say which loader is which by the code that iterates it: the
HF Trainer's ``_inner_training_loop`` and ``evaluation_loop``/
``prediction_loop`` (transformers/trainer.py), Lightning's fit and
evaluation loops (lightning/pytorch/loops/), Accelerate's prepared loaders
(accelerate/data_loader.py). ``caller`` reads the stack of an ``iter()``
once per epoch (tens of frames, ~10 µs), never per batch, and never raises.
"""

from __future__ import annotations

import sys
from types import FrameType

# Frames looked at above iter(): deeper than any framework's loop nesting.
MAX_FRAMES = 80
# Of several frameworks on the stack (the Trainer runs on Accelerate), the
# one whose knobs the user sets.
PRECEDENCE = ("transformers", "lightning", "accelerate")

_EVAL_FUNCS = {"evaluation_loop", "prediction_loop", "evaluate", "predict"}


def _classify(filename: str, func: str) -> tuple[str | None, str | None]:
    """(framework, role) one frame says, either may be None."""
    f = filename.replace("\\", "/")
    if "/transformers/" in f:
        if f.endswith("/trainer.py") or "/trainer_" in f:
            if func in _EVAL_FUNCS:
                return "transformers", "eval"
            if func == "_inner_training_loop":
                return "transformers", "train"
        return "transformers", None
    if "/lightning/" in f or "/pytorch_lightning/" in f:
        if "/loops/" in f:
            if "evaluation_loop" in f or "prediction_loop" in f:
                return "lightning", "eval"
            if "fit_loop" in f or "training_epoch_loop" in f:
                return "lightning", "train"
        return "lightning", None
    if "/accelerate/" in f:
        return "accelerate", None
    return None, None


def caller(skip: int = 2) -> tuple[str | None, str | None]:
    """(framework, role) of the code iterating a loader: role "train" or
    "eval" where the framework's loop says, None where no framework does."""
    frame: FrameType | None
    try:
        frame = sys._getframe(skip)
    except ValueError:
        return None, None
    found: set[str] = set()
    role = None
    try:
        for _ in range(MAX_FRAMES):
            if frame is None:
                break
            fw, r = _classify(frame.f_code.co_filename, frame.f_code.co_name)
            if fw is not None:
                found.add(fw)
            if role is None and r is not None:
                role = r
            frame = frame.f_back
    except Exception:
        return None, None
    framework = next((f for f in PRECEDENCE if f in found), None)
    return framework, role
