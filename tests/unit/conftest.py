"""Fixtures of the unit tests that run the probe in this process."""

from __future__ import annotations

import pytest

from dlwatch.probe import patches


@pytest.fixture
def probe():
    """The probe's patches installed for the test (and removed after, unless
    they were already in); yields the loader registry."""
    was = patches.installed()
    patches.install()
    yield patches.registry
    if not was:
        patches.uninstall()
