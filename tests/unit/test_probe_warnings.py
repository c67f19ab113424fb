"""Warnings torch raises inside our patched iterator methods keep torch's
attribution: a user reading (or filtering) them must never be sent to dlwatch."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import dlwatch
from dlwatch.probe import patches

DLWATCH_DIR = os.path.dirname(os.path.abspath(dlwatch.__file__))


@pytest.fixture
def patched():
    was = patches.installed()
    patches.install()
    assert patches.installed()
    yield
    if not was:
        patches.uninstall()


def _pin_memory_warnings(num_workers: int) -> list[warnings.WarningMessage]:
    loader = DataLoader(
        TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True, num_workers=num_workers
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        it = iter(loader)
        next(it)
        del it
    return [w for w in caught if "pin_memory" in str(w.message)]


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the warning is about a box without accelerator")
@pytest.mark.parametrize("num_workers", [0, 1])
def test_pin_memory_warning_points_at_torch_not_dlwatch(patched, num_workers):
    caught = _pin_memory_warnings(num_workers)
    assert caught, "torch no longer warns about pin_memory without an accelerator"
    for w in caught:
        path = os.path.abspath(w.filename)
        assert not path.startswith(DLWATCH_DIR + os.sep), f"warning attributed to {w.filename}:{w.lineno}"
        assert path in (os.path.abspath(torch.utils.data.dataloader.__file__), os.path.abspath(__file__))


@pytest.mark.skipif(torch.accelerator.is_available(), reason="the warning is about a box without accelerator")
def test_same_attribution_as_without_the_patch(patched):
    hooked = [(w.filename, w.lineno) for w in _pin_memory_warnings(0)]
    patches.uninstall()
    try:
        plain = [(w.filename, w.lineno) for w in _pin_memory_warnings(0)]
    finally:
        patches.install()
    assert [f for f, _ in hooked] == [f for f, _ in plain]


def test_module_filters_for_torch_still_apply(patched):
    # A user's filter by module (the usual way to silence torch) matches.
    loader = DataLoader(TensorDataset(torch.arange(8.0)), batch_size=4, pin_memory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", module=r"torch\.utils\.data")
        next(iter(loader))
    assert not [w for w in caught if "pin_memory" in str(w.message)]
