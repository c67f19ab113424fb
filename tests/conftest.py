"""Shared fixtures and the test tiers.

Unix socket paths are limited to 107 bytes, and pytest's ``tmp_path`` lives
under a long path; tests that bind sockets use ``short_tmpdir`` instead.

Every test under ``tests/e2e`` is marked ``e2e``. Tests run in parallel
(pytest-xdist), so each gets its own runtime directory (``DLWATCH_DIR``): a job
one test starts is never seen by another's collector.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

E2E = Path(__file__).resolve().parent / "e2e"

# The suite starts hundreds of Python processes (the parallel tier alone ~140
# that import torch and ~90 `dlwatch snapshot`s), each importing dlwatch from
# this checkout. A machine that sets
# PYTHONDONTWRITEBYTECODE (CI's does) would have every one of them compile the
# modules it imports anew (~0.1 s of CPU each), and every pytest process
# rewrite the test modules' asserts anew (~7 s a collection). Byte-code is
# written under __pycache__ (git ignores it); what runs is the same.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# Unit tests fork DataLoader workers from this long-lived process, and torch's
# worker loop seeds numpy.random first thing: imported in the child unless the
# parent has it, which depended on what earlier tests in the same xdist worker
# happened to import. A forked worker once died in that import with a KeyError
# from importlib's module-lock bookkeeping (CPython 3.11 does not survive a
# re-entrant import there, gh-91351). Import it here, as any script that uses
# numpy has, so every worker starts from the same imports whatever ran before.
try:
    import numpy.random  # noqa: F401
except ImportError:  # the monitor-only tests run without numpy
    pass


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        if E2E in Path(item.path).resolve().parents:
            item.add_marker(pytest.mark.e2e)


# A hooked job recreates its runtime directory when it is deleted under it
# (probe/publisher.py: REBIND_CHECK_S): one that is back after its test
# removed it belongs to a job that outlived its test (an empty dlwrun*
# directory was left in /tmp by every fresh-clone run up to 65: the probe's
# publisher that a unit test had started in an xdist worker). Each test's
# directory is logged here, with the test's id, and the controller looks for
# them again at the end.
_RUNDIR_LOG = "DLWATCH_TEST_RUNDIR_LOG"
_RUNDIRS_BACK: list[tuple[str, str]] = []


def pytest_configure(config):
    # Before xdist starts its workers: they inherit the variable.
    if not hasattr(config, "workerinput") and _RUNDIR_LOG not in os.environ:
        fd, path = tempfile.mkstemp(prefix="dlwtest-rundirs-", dir="/tmp")
        os.close(fd)
        os.environ[_RUNDIR_LOG] = path


@pytest.fixture(autouse=True)
def private_runtime_dir(monkeypatch, request):
    """A fresh DLWATCH_DIR for each test (its subprocesses inherit it)."""
    d = tempfile.mkdtemp(prefix="dlwrun", dir="/tmp")
    log = os.environ.get(_RUNDIR_LOG)
    if log:
        with open(log, "a") as f:  # one short append per test: whole lines under xdist
            f.write(f"{d}\t{request.node.nodeid}\n")
    monkeypatch.setenv("DLWATCH_DIR", d)
    try:
        yield d
    finally:
        # A test that trained in this process started the probe's publisher
        # here, in this directory: stopped, or it would recreate it.
        publisher = sys.modules.get("dlwatch.probe.publisher")
        if publisher is not None:
            publisher.stop()
        shutil.rmtree(d, ignore_errors=True)


def _rundirs_back() -> list[tuple[str, str]]:
    """(directory, test id) of the tests' runtime directories that exist
    again, each removed; the log too."""
    log = os.environ.get(_RUNDIR_LOG)
    if not log:
        return []
    try:
        with open(log) as f:
            rows = [line.rstrip("\n").split("\t", 1) for line in f if "\t" in line]
        os.unlink(log)
    except OSError:
        return []
    back = [(d, nodeid) for d, nodeid in rows if os.path.isdir(d)]
    for d, _ in back:
        shutil.rmtree(d, ignore_errors=True)
    return back


@pytest.fixture
def short_tmpdir():
    """A fresh private (0700) directory directly under /tmp, removed afterwards."""
    d = tempfile.mkdtemp(prefix="dlw", dir="/tmp")
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


# What a test run may add to the checkout's top level: pytest's and
# hypothesis's caches. Anything else is a test's output written into the
# working directory (a command's default: `dlwatch profile`'s trace, the
# view's screenshot), which a test must direct into a directory of its own.
ROOT = Path(__file__).resolve().parent.parent
RUN_CACHES = {".pytest_cache", ".hypothesis", "__pycache__"}
_ROOT_BEFORE: set[str] = set()
_LEFT_IN_ROOT: list[str] = []


def _is_controller(session) -> bool:
    """The process that runs the whole session (not an xdist worker)."""
    return not hasattr(session.config, "workerinput")


def pytest_sessionstart(session):
    if _is_controller(session):
        _ROOT_BEFORE.update(os.listdir(ROOT))


def pytest_sessionfinish(session):
    from tests import e2e_util

    for d in e2e_util.MADE_DIRS:
        shutil.rmtree(d, ignore_errors=True)
    if not _is_controller(session):
        return
    _LEFT_IN_ROOT[:] = sorted(set(os.listdir(ROOT)) - _ROOT_BEFORE - RUN_CACHES)
    _RUNDIRS_BACK[:] = _rundirs_back()
    if _LEFT_IN_ROOT or _RUNDIRS_BACK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# A timing-tier test that needed its one rerun is a defect to fix by design
# (docs/development.md); pytest-rerunfailures lists it (-rR) but drops the
# first failure's traceback. Keep each first failure and print its end in the
# summary, so a CI log says why the rerun was needed.
_RERUN_REPORTS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    if report.outcome == "rerun":
        _RERUN_REPORTS.append((report.nodeid, report.longreprtext[-3000:]))


def pytest_terminal_summary(terminalreporter):
    if _LEFT_IN_ROOT:
        terminalreporter.section("files the tests left in the checkout", red=True)
        terminalreporter.write_line(
            f"{', '.join(_LEFT_IN_ROOT)} in {ROOT}: a test's output belongs in its own directory"
        )
    if _RUNDIRS_BACK:
        terminalreporter.section("jobs that outlived their test", red=True)
        for d, nodeid in _RUNDIRS_BACK:
            terminalreporter.write_line(f"{nodeid}: a job of this test recreated its runtime directory {d}")
    if not _RERUN_REPORTS:
        return
    terminalreporter.section("why each rerun was needed (the first failure's end)")
    for nodeid, text in _RERUN_REPORTS:
        terminalreporter.write_line(f"--- {nodeid}")
        for line in text.splitlines()[-25:]:
            terminalreporter.write_line(line)
