"""One small adapter per pipeline library (DESIGN.md §9).

Each says, for its library: how to find the training loop's ``next()`` (the
iterator the library hands the loop, measured by probe/consumer.py), its
workers (threads or processes), its buffer, and its knobs under the
library's own names. The DataLoader's adapter is probe/patches.py; a loader
fed to the loop through a ``queue.Queue`` (MONAI's ``ThreadDataLoader``, a
producer thread) is probe/handover.py, and monai.py names MONAI's knobs.

Every adapter arms on its library's import (probe/postimport.py) and never
imports the library itself: a job that does not use it pays nothing.
"""

from __future__ import annotations

from dlwatch.probe.adapters import grain, monai, nodes, webdataset

ADAPTERS = (nodes, grain, monai, webdataset)


def install() -> None:
    for a in ADAPTERS:
        try:
            a.install()
        except Exception:
            pass


def uninstall() -> None:
    for a in ADAPTERS:
        try:
            a.uninstall()
        except Exception:
            pass
