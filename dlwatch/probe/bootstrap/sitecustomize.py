"""dlwatch bootstrap for ``dlwatch run``: put first on PYTHONPATH so every
Python process the command starts (torchrun ranks, spawn workers included)
activates ``dlwatch.hook``, then hands over to whatever ``sitecustomize`` the
environment already had."""

import os as _os
import sys as _sys


def _dlwatch_bootstrap():
    here = _os.path.dirname(_os.path.abspath(__file__))
    try:
        import dlwatch.hook  # noqa: F401
    except ImportError:
        # Another interpreter than the one dlwatch is installed in: load the
        # package from its own folder without putting that env's
        # site-packages on sys.path (it could shadow this env's torch).
        pkg = _os.environ.get("DLWATCH_PKG_DIR")
        if pkg and _os.path.isfile(_os.path.join(pkg, "__init__.py")):
            try:
                import importlib.util

                spec = importlib.util.spec_from_file_location(
                    "dlwatch", _os.path.join(pkg, "__init__.py"), submodule_search_locations=[pkg]
                )
                if spec is None or spec.loader is None:
                    raise ImportError(f"dlwatch cannot be loaded from {pkg}")
                mod = importlib.util.module_from_spec(spec)
                _sys.modules["dlwatch"] = mod
                spec.loader.exec_module(mod)
                import dlwatch.hook  # noqa: F401,F811
            except Exception:
                _sys.modules.pop("dlwatch", None)
    except Exception:
        pass
    # Chain to the next sitecustomize on the path, as if we were not here.
    ours = _sys.modules.pop("sitecustomize", None)
    saved = list(_sys.path)
    _sys.path[:] = [p for p in _sys.path if _os.path.abspath(p or _os.curdir) != here]
    try:
        import importlib

        importlib.import_module("sitecustomize")
    except ImportError as e:
        if e.name != "sitecustomize":
            raise
        if ours is not None:
            _sys.modules["sitecustomize"] = ours
    finally:
        _sys.path[:] = saved


_dlwatch_bootstrap()
del _dlwatch_bootstrap
