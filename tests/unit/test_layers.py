"""The layer contracts of pyproject.toml bite: a forbidden import fails
``lint-imports`` (which .ci/run runs before the tests).

One run of the linter checks every case: a copy of the package gets all the
forbidden imports below at once, and the report must list each under the
contract it breaks, and nothing that none of them caused (so the untouched
package keeps every contract)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")

MONITOR_DEPS = "the probe side imports no monitor dependencies"
MONITOR_CODE = "the probe side imports no monitor code"
PROBE_CODE = "the monitor side imports no probe code"
LAYERS = "layers:"

# (module, the line appended to it, the contract it breaks); each imports a
# module, so the linter reports "dlwatch.<module> -> <what it imports>".
CASES = [
    ("probe/identity.py", "import textual", MONITOR_DEPS),
    ("wire.py", "import psutil", MONITOR_DEPS),
    ("probe/stats.py", "from dlwatch.collect import jobs", MONITOR_CODE),
    ("overrides.py", "from dlwatch import record", MONITOR_CODE),
    ("diagnose/facts.py", "from dlwatch.tui import fmt", LAYERS),
    ("collect/model.py", "from dlwatch.cli import common", LAYERS),
    ("tune/sweep.py", "from dlwatch.probe import overrides", PROBE_CODE),
    ("cli/text.py", "import dlwatch.hook", PROBE_CODE),
    ("export/__init__.py", "from dlwatch.probe import stats", PROBE_CODE),
    ("tui/app.py", "from dlwatch.collect import control", "the TUI asks no job for anything itself"),
    ("mcp/tools.py", "from dlwatch.tune import sweep", LAYERS),  # mcp and tune are independent
    ("mcp/server.py", "from dlwatch.probe import control", PROBE_CODE),
]


def edge(module: str, line: str) -> str:
    importer = "dlwatch." + module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    words = line.split()
    imported = words[1] if words[0] == "import" else f"{words[1]}.{words[3]}"
    return f"{importer} -> {imported}"


@pytest.fixture(scope="session")
def broken_report(tmp_path_factory) -> tuple[int, str, dict[str, str]]:
    """lint-imports on a copy of the package with every case's import added:
    its exit code, its report (one line per contract name, however long) and
    each case's reported import (by module) with the line number it got."""
    if not LINT.exists():
        pytest.skip("import-linter is not installed here")
    tree = tmp_path_factory.mktemp("layers")
    shutil.copytree(ROOT / "dlwatch", tree / "dlwatch", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tree)
    edges = {}
    for module, line, _ in CASES:
        path = tree / "dlwatch" / module
        with open(path, "a") as f:
            f.write(f"\n{line}  # deliberate violation\n")
        edges[module] = f"{edge(module, line)} (l.{len(path.read_text().splitlines())}"
    r = subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=tree,
        env=dict(os.environ, PYTHONPATH=str(tree)),
        capture_output=True,
        text=True,
        timeout=120,
    )
    return r.returncode, r.stdout, edges


def sections(report: str) -> dict[str, str]:
    """The "Broken contracts" part of the report, by contract name."""
    summary, broken = report.split("Broken contracts", 1)
    summary = summary.split("dependencies.", 1)[1].split("Contracts:", 1)[0]
    summary = re.sub(r"^-+$", "", summary, flags=re.M)
    flat = " ".join(summary.split())  # long names wrap in the report
    names = [m.group(1) for m in re.finditer(r"(.+?) (?:KEPT|BROKEN)(?: |$)", flat)]
    broken = " ".join(broken.split())
    starts = sorted((broken.find(n), n) for n in names if n in broken)
    ends = [a for a, _ in starts[1:]] + [len(broken)]
    return {n: broken[a:b] for (a, n), b in zip(starts, ends)}


def test_each_forbidden_import_breaks_its_contract_and_nothing_else_does(broken_report):
    rc, report, edges = broken_report
    assert rc == 1, report
    by_contract = sections(report)
    missing = []
    for module, _, contract in CASES:
        (name,) = [n for n in by_contract if n.startswith(contract)]
        if edges[module] not in by_contract[name]:
            missing.append(f"{edges[module]!r} not reported under {name!r}")
    assert not missing, "\n".join(missing) + "\n" + report
    # Every chain of imports the report lists runs through an injected one:
    # without them, the package keeps every contract.
    chains = re.split(r"^- ", report.split("Broken contracts", 1)[1], flags=re.M)[1:]
    stray = [c for c in chains if not any(e in " ".join(c.split()) for e in edges.values())]
    assert not stray, stray


def test_the_bootstrap_imports_only_the_stdlib_and_the_hook():
    """``dlwatch run``'s sitecustomize runs in the job's interpreters but is
    package data, not a module the linter sees: its imports are checked here."""
    tree = ast.parse((ROOT / "dlwatch" / "probe" / "bootstrap" / "sitecustomize.py").read_text())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert "dlwatch.hook" in names
    others = {n.split(".")[0] for n in names - {"dlwatch.hook"}}
    assert others <= set(sys.stdlib_module_names), others
