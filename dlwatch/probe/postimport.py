"""Run a callback right after a module is imported, without importing it.

``dlwatch run`` activates the probe in every Python process and most of them
never touch torch, so the probe's patches wait for torch's own import instead
of causing it. ``arm(name, callback)`` puts a finder first on
``sys.meta_path``: it finds ``name``'s spec through the other finders and
wraps its loader, so ``callback(module)`` runs right after the module's body.
An exception from the callback is swallowed: the import itself always
completes as it would without us.

Stdlib only (probe side).
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from collections.abc import Callable
from types import ModuleType


class PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, fullname: str, callback: Callable[[ModuleType], None]) -> None:
        self.fullname = fullname
        self.callback = callback
        # Two armed finders for the same module (the patches and the tune
        # overrides) ask each other while looking for the spec: each one's
        # own guard ends the recursion. Per thread: imports of other modules
        # may run at the same time on other threads.
        self._busy = threading.local()

    def find_spec(self, fullname, path, target=None):
        if fullname != self.fullname or getattr(self._busy, "on", False):
            return None
        self._busy.on = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                        spec.loader = _CallbackLoader(spec.loader, self.callback)
                    return spec
        finally:
            self._busy.on = False
        return None


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, inner, callback: Callable[[ModuleType], None]) -> None:
        self._inner = inner
        self._callback = callback

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        try:
            self._callback(module)
        except Exception:
            pass

    def __getattr__(self, name):
        # The import system and tools such as pkgutil ask loaders for more
        # than create/exec (get_source, is_package, ...): the real loader answers.
        return getattr(self._inner, name)


def arm(fullname: str, callback: Callable[[ModuleType], None]) -> PostImportFinder:
    """Call ``callback(module)`` once ``fullname`` is imported; the finder
    returned is what ``disarm`` takes."""
    finder = PostImportFinder(fullname, callback)
    sys.meta_path.insert(0, finder)
    return finder


def now_or_on_import(
    fullname: str, ready_attr: str, callback: Callable[[ModuleType], None], finder: PostImportFinder | None
) -> PostImportFinder | None:
    """``callback(module)`` now if ``fullname`` is imported (and defines
    ``ready_attr``), else once it is; ``finder`` is the one armed before, if
    any (a second call arms none). Returns the finder to keep."""
    mod = sys.modules.get(fullname)
    if mod is not None and hasattr(mod, ready_attr):
        callback(mod)
        return finder
    return finder if finder is not None else arm(fullname, callback)


def disarm(finder: PostImportFinder | None) -> None:
    """Remove ``finder`` from ``sys.meta_path``; None or one already gone is fine."""
    if finder is None:
        return
    try:
        sys.meta_path.remove(finder)
    except ValueError:
        pass
