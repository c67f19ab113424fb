"""Shared fixtures and the test tiers.

Unix socket paths are limited to 107 bytes, and pytest's ``tmp_path`` lives
under a long path; tests that bind sockets use ``short_tmpdir`` instead.

Every test under ``tests/e2e`` is marked ``e2e``. Tests run in parallel
(pytest-xdist), so each gets its own runtime directory (``DLWATCH_DIR``): a job
one test starts is never seen by another's collector.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent / "e2e"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def private_runtime_dir(monkeypatch):
    """A fresh DLWATCH_DIR for each test (its subprocesses inherit it)."""
    d = tempfile.mkdtemp(prefix="dlwrun", dir="/tmp")
    monkeypatch.setenv("DLWATCH_DIR", d)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def short_tmpdir():
    """A fresh private (0700) directory directly under /tmp, removed afterwards."""
    d = tempfile.mkdtemp(prefix="dlw", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
