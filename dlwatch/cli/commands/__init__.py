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
import pkgutil
from types import ModuleType


def modules() -> list[ModuleType]:
    found = []
    for info in pkgutil.iter_modules(__path__):
        if not info.name.startswith("_"):
            found.append(importlib.import_module(f"{__name__}.{info.name}"))
    return sorted(found, key=lambda m: (getattr(m, "ORDER", 100), m.NAME))
