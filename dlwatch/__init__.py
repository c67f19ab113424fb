"""dlwatch: a live monitor of PyTorch DataLoader input pipelines.

This top-level package imports nothing: the probe (``dlwatch.hook``) must stay
stdlib + torch, and the monitor's dependencies load only in ``collect``/``tui``/``cli``.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # noqa: ANN001 (IPython's shell)
    """``%load_ext dlwatch``: registers the ``%dlwatch`` magic (dlwatch.notebook)."""
    from dlwatch.notebook import load_ipython_extension as load

    load(ipython)
