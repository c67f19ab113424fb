"""The subcommands: one module each.

A command module defines ``NAME`` (the word after ``dlwatch``), ``HELP`` (one
line for ``dlwatch --help``), ``ORDER`` (its place in that list),
``add_arguments(parser)`` and ``run(args) -> int`` (an exit code of
``dlwatch.cli.common``). ``main`` finds them here; nothing else registers
them. Heavy imports (Textual, psutil, torch) go inside ``run``, so that
``dlwatch --help`` and ``dlwatch run`` stay fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
from types import ModuleType


def module(name: str) -> ModuleType | None:
    """The module of command ``name`` alone, or None when there is none: a
    command's parser then needs no other module imported (``dlwatch
    snapshot`` would otherwise import ``tune``'s search machinery, ~14 ms of
    its ~0.1 s of CPU)."""
    if not name.isidentifier() or name.startswith("_"):
        return None
    try:
        if importlib.util.find_spec(f"{__name__}.{name}") is None:
            return None
    except (ImportError, ValueError):
        return None
    mod = importlib.import_module(f"{__name__}.{name}")
    return mod if getattr(mod, "NAME", None) == name else None


def modules() -> list[ModuleType]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            found.append(importlib.import_module(f"{__name__}.{info.name}"))
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))
