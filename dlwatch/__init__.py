"""dlwatch: a live monitor of PyTorch DataLoader input pipelines.

This top-level package imports nothing: the probe (``dlwatch.hook``) must stay
stdlib + torch, and the monitor's dependencies load only in ``collect``/``tui``/``cli``.
"""

__version__ = "0.1.0"
