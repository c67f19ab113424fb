"""Shared fixtures.

Unix socket paths are limited to 107 bytes, and pytest's ``tmp_path`` lives
under a long path; tests that bind sockets use ``short_tmpdir`` instead.
"""

from __future__ import annotations

import shutil
import tempfile

import pytest


@pytest.fixture
def short_tmpdir():
    """A fresh private (0700) directory directly under /tmp, removed afterwards."""
    d = tempfile.mkdtemp(prefix="dlw", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)
