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


def watch(iterable, name=None):  # noqa: ANN001, ANN201 (any iterable in, the same kind out)
    """Measure the training loop's wait on any iterable: ``for batch in
    dlwatch.watch(loader, name="train"):``.

    Returns an object that iterates as ``iterable`` does, timing the loop's
    ``next()`` on it and publishing it like a DataLoader (a generator, a
    custom prefetcher, Ray's ``iter_torch_batches``, a DALI iterator, an HF
    ``IterableDataset`` iterated directly). Each ``iter()`` of it is an epoch;
    an iterator's one epoch is its life. A no-op with ``DLWATCH_DISABLE=1``;
    never raises (the original comes back on any failure). Imports the probe
    by name, for the reason ``load_ipython_extension`` gives."""
    import importlib

    try:
        importlib.import_module("dlwatch.hook")
        consumer = importlib.import_module("dlwatch.probe.consumer")
    except Exception:
        return iterable
    return consumer.watch(iterable, name)
