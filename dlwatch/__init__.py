"""dlwatch: a live monitor of PyTorch DataLoader input pipelines.

This top-level package imports nothing: the probe (``dlwatch.hook``) must stay
stdlib + torch, and the monitor's dependencies load only in ``collect``/``tui``/``cli``.
"""

__version__ = "0.1.0"


def load_ipython_extension(ipython):  # noqa: ANN001 (IPython's shell)
    """``%load_ext dlwatch``: registers the ``%dlwatch`` magic (dlwatch.notebook).

    Imported by name: every module of both sides imports this package (for
    ``__version__``), and IPython is the only caller of this function, so the
    package itself must not carry an import of the kernel-side code."""
    import importlib

    importlib.import_module("dlwatch.notebook").load_ipython_extension(ipython)
