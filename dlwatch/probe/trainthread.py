"""Which threads train: the ones that step a torch optimizer.

The wait that matters is the training thread's ``next()``. A loader iterated
on another thread is a feeder, and only the thread that steps the optimizer
says which thread trains. torch (>= 2.0) has a global post-hook for every
optimizer's ``step``: one dict update per step, armed when
``torch.optim.optimizer`` is imported (never importing it ourselves).

A process that steps an optimizer is a training job even if it iterates
nothing dlwatch recognises: ``on_first_step`` (the publisher) then lists it,
"hooked; no loader seen yet", instead of leaving it invisible.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from dlwatch.probe import postimport

TARGET_MODULE = "torch.optim.optimizer"

# thread ident -> [thread name, steps, whether it is the main thread]
_steps: dict[int, list[Any]] = {}
_finder: postimport.PostImportFinder | None = None
_handle: Any = None
on_first_step: Callable[[], None] | None = None


def install() -> None:
    global _finder
    _finder = postimport.now_or_on_import(TARGET_MODULE, "Optimizer", _register, _finder)


def _register(mod) -> None:
    global _handle
    reg = getattr(mod, "register_optimizer_step_post_hook", None)
    if _handle is None and callable(reg):
        _handle = reg(_on_step)


def _on_step(optimizer, args, kwargs) -> None:
    try:
        rec = _steps.get(threading.get_ident())
        if rec is not None:
            rec[1] += 1
            return
        th = threading.current_thread()
        _steps[threading.get_ident()] = [th.name, 1, th is threading.main_thread()]
        cb = on_first_step
        if cb is not None:
            cb()
    except Exception:
        pass


def trains(ident: int | None) -> bool | None:
    """Whether thread ``ident`` steps an optimizer; None while no thread has."""
    if not _steps or ident is None:
        return None
    return ident in _steps


def summary() -> list[dict[str, Any]]:
    """The threads that step an optimizer, most steps first (at most 4)."""
    # list() first: a C-level copy, never "changed size during iteration"
    # when a new thread steps an optimizer meanwhile.
    rows = sorted(list(_steps.values()), key=lambda r: -r[1])[:4]
    return [{"thread": str(n)[:80], "steps": int(k), "main": bool(m)} for n, k, m in rows]


def uninstall() -> None:
    global _finder, _handle
    postimport.disarm(_finder)
    _finder = None
    if _handle is not None:
        try:
            _handle.remove()
        except Exception:
            pass
        _handle = None
    _steps.clear()


def forget() -> None:
    """After fork, in the child: the parent's threads are not its own."""
    _steps.clear()
