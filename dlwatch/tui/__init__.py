"""Textual views of the snapshot (dlwatch/snapshot.py).

Public API: ``DlwatchApp``, ``run_tui`` (dlwatch.tui.app) and the sources
``Source``, ``StaticSource``, ``ReplaySource`` (dlwatch.tui.sources). They
load lazily so that importing the sources does not import Textual.
"""

from __future__ import annotations

__all__ = ["DlwatchApp", "run_tui", "Source", "StaticSource", "ReplaySource"]


def __getattr__(name: str):
    if name in ("DlwatchApp", "run_tui"):
        from dlwatch.tui import app

        return getattr(app, name)
    if name in ("Source", "StaticSource", "ReplaySource"):
        from dlwatch.tui import sources

        return getattr(sources, name)
    raise AttributeError(f"module 'dlwatch.tui' has no attribute {name!r}")
