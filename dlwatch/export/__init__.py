"""Consumers that hand the snapshot to other systems (``dlwatch export``).

Each reads the collector's prebuilt snapshot (``Monitor.latest()``) through
``dlwatch.snapshot`` and never talks to a job itself. The third-party library
each needs is an optional extra, imported by the module that uses it.
"""
