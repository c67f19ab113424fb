"""The layer contracts of pyproject.toml bite: a forbidden import fails
``lint-imports`` (which .ci/run runs before the tests)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed here")


def lint(tree: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(tree))
    return subprocess.run(
        [str(LINT), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree(tmp_path):
    shutil.copytree(ROOT / "dlwatch", tmp_path / "dlwatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    return tmp_path


@pytest.mark.parametrize(
    "module,line,contract",
    [
        ("probe/identity.py", "import textual", "the probe side imports no monitor dependencies"),
        ("wire.py", "import psutil", "the probe side imports no monitor dependencies"),
        ("probe/stats.py", "from dlwatch.collect import jobs", "the probe side imports no monitor code"),
        ("diagnose/facts.py", "from dlwatch.tui import fmt", "layers"),
        ("collect/model.py", "from dlwatch.cli import common", "layers"),
    ],
)
def test_a_forbidden_import_breaks_a_contract(tree, module, line, contract):
    assert lint(tree).returncode == 0
    with open(tree / "dlwatch" / module, "a") as f:
        f.write(f"\n{line}  # deliberate violation\n")
    r = lint(tree)
    assert r.returncode == 1, r.stdout
    # Long contract names wrap in the report: read it as one line.
    report = " ".join(r.stdout.split())
    assert re.search(re.escape(contract) + r"(?:(?!KEPT).)*?BROKEN", report), r.stdout
