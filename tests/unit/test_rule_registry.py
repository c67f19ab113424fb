"""Every rule id named anywhere is a registered rule, and each rule's
declaration (scope, precedence) matches the hints it emits."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import dlwatch.diagnose as diagnose_pkg
from dlwatch.demo.scenarios.catalog import SCENARIOS
from dlwatch.diagnose import engine, registry
from dlwatch.diagnose.registry import Rule

DIAGNOSE = Path(diagnose_pkg.__file__).parent
RULE_ID = re.compile(r"^[a-z]+(-[a-z]+)+$")


def _string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _emitted(path: Path) -> dict[str, set[str]]:
    """The ids a module's rules emit (first argument of ``hint(...)``), each
    with the scopes its job_pid and loader_id arguments allow."""
    out: dict[str, set[str]] = {}
    for n in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "hint"):
            continue
        rid, _severity, pid, lid = (a.value if isinstance(a, ast.Constant) else a for a in n.args[:4])
        scope = "host" if pid is None and lid is None else "job" if lid is None else "loader"
        out.setdefault(rid, set()).add(scope)
    return out


def test_every_id_the_engine_names_is_registered():
    # Anything in the engine or the renderer shaped like a rule id must be one:
    # a list of ids kept there by hand would drift from the rules.
    named = set()
    for module in ("engine.py", "render.py", "registry.py"):
        named |= {s for s in _string_constants(DIAGNOSE / module) if RULE_ID.match(s)}
    assert named - set(engine.REGISTRY) == set()
    derived = (engine.LOADER_RATE_RULES | engine.JOB_RATE_RULES | engine.HOST_RATE_RULES) | set(
        engine.WORKER_COUNT_PRECEDENCE
    )
    assert derived <= set(engine.REGISTRY)
    for rule in engine.REGISTRY.values():
        assert rule.supersedes <= set(engine.REGISTRY), rule.id


def test_each_module_registers_exactly_the_ids_it_emits():
    for path in sorted(DIAGNOSE.glob("rules_*.py")):
        module = getattr(__import__(f"dlwatch.diagnose.{path.stem}").diagnose, path.stem)
        emitted = _emitted(path)
        assert {r.id for r in module.RULES} == set(emitted), path.name
        for r in module.RULES:
            assert emitted[r.id] == {r.scope}, r.id
        assert all(r.id in engine.REGISTRY for r in module.RULES)


def test_rules_md_and_demo_scenarios_name_registered_rules():
    table = re.findall(r"^\| `([a-z-]+)` \|", (DIAGNOSE / "RULES.md").read_text(), re.M)
    assert set(table) == set(engine.REGISTRY)
    hints = {s.hint for s in SCENARIOS.values() if s.hint}
    assert hints <= set(engine.REGISTRY)


def test_declared_precedence():
    ranks = [engine.REGISTRY[rid].worker_count_rank for rid in engine.WORKER_COUNT_PRECEDENCE]
    assert ranks == sorted(ranks) and len(set(ranks)) == len(ranks)
    # The host-wide oversubscription count is measured on all loaders at once: it wins.
    assert engine.WORKER_COUNT_PRECEDENCE[0] == "workers-oversubscribe-cores"
    assert engine.JOB_RATE_RULES == {"main-loop-cpu-bound"}
    assert engine.HOST_RATE_RULES == {"workers-oversubscribe-cores"}


def test_an_id_registered_twice_is_refused():
    def check(ctx):
        return []

    with pytest.raises(ValueError, match="no-workers"):
        registry.registry([Rule("no-workers", check, "loader")], [Rule("no-workers", check, "host")])
