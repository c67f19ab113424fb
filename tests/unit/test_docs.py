"""The docs pages made from the source: one page per registered rule, the
key tables, the site's home page; `dlwatch explain`; a page that no longer
matches its rule fails the check that `mkdocs build` runs first."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlwatch.diagnose import pages
from dlwatch.diagnose.engine import REGISTRY
from dlwatch.diagnose.registry import Rule
from tests.e2e_util import dlwatch, short_tmpdir

ROOT = Path(__file__).resolve().parents[2]


def _gendocs():
    spec = importlib.util.spec_from_file_location("gendocs", ROOT / "tools" / "gendocs.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_rule_has_a_page_and_every_page_a_rule():
    assert pages.check_pages() == []
    assert pages.prose_ids() == set(REGISTRY)


def test_the_generated_pages_are_current():
    # A rule added, renamed or re-declared without `python tools/gendocs.py`.
    assert _gendocs().stale() == []


def test_a_page_carries_the_rules_declaration_and_its_rules_md_row():
    text = pages.page("workers-oversubscribe-cores")
    assert text.splitlines()[2] == "# `workers-oversubscribe-cores`"
    # The registry's declaration: it hides the per-loader advice it overrides.
    assert "it hides [`add-workers`](add-workers.md)" in text and "everywhere" in text
    # RULES.md's row: the severity column and an evidence key.
    assert "recommended_num_workers_by_loader" in text
    # And the other side: add-workers says what hides it and whom it defers to.
    add = pages.page("add-workers")
    assert "Hidden while" in add and "[`workers-oversubscribe-cores`]" in add
    assert "defers to [`workers-oversubscribe-cores`](workers-oversubscribe-cores.md), [`no-workers`]" in add


def test_a_rule_without_prose_or_a_row_is_reported():
    fake = dict(REGISTRY)
    fake["made-up-rule"] = Rule("made-up-rule", lambda ctx: [], "loader")
    problems = pages.check_pages(fake)
    assert any("made-up-rule" in p and "no page" in p for p in problems), problems
    assert any("made-up-rule" in p and "RULES.md" in p for p in problems), problems
    with pytest.raises(pages.MissingPage, match="hints/made-up-rule.md"):
        pages.page("made-up-rule", registry=fake)


def test_rules_rows_reads_both_rows_of_an_id():
    md = (
        "| id | severity | fires when | key evidence |\n|---|---|---|---|\n"
        "| `no-workers` | warn | steady | `a` |\n"
        "| `no-workers` (attached, `rules_sampled.py`) | info | sampled | `b` |\n"
        "| `no-workers-x` | warn | other | `c` |\n"
    )
    rows = pages.rules_rows(md, "no-workers")
    assert [r[0] for r in rows] == ["", "attached, `rules_sampled.py`"]
    assert [r[3] for r in rows] == ["`a`", "`b`"]


def test_explain_prints_the_page_and_refuses_an_unknown_hint():
    d = short_tmpdir()
    r = dlwatch("explain", "add-workers", runtime_dir=d)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("# `add-workers`") and "## What to do" in r.stdout
    assert "<!--" not in r.stdout
    r = dlwatch("explain", runtime_dir=d)
    assert r.returncode == 0 and len(r.stdout.splitlines()) == len(REGISTRY)
    r = dlwatch("explain", "add-worker", runtime_dir=d)
    assert r.returncode == 2 and "no hint 'add-worker'" in r.stderr and "add-workers" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(
    shutil.which("mkdocs") is None and importlib.util.find_spec("mkdocs") is None,
    reason="mkdocs is not installed (pip install -e '.[docs]')",
)
def test_a_stale_hint_page_fails_the_strict_build(tmp_path):
    # The site's sources copied aside, one hint page edited by hand: the
    # build's first step (tools/gendocs.py's hook) must refuse it.
    for name in ("docs", "tools", "dlwatch", "mkdocs.yml", "README.md"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    page = tmp_path / "docs" / "hints" / "add-workers.md"
    page.write_text(page.read_text() + "\nedited by hand\n")
    r = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )  # fmt: skip
    assert r.returncode != 0
    out = r.stdout + r.stderr  # MkDocs prints an Abort on stdout
    assert "stale generated docs" in out and "docs/hints/add-workers.md" in out, out


def _relative_links(text: str) -> list[str]:
    import re

    targets = [t.split("#")[0] for t in re.findall(r"\]\(([^)\s]+)\)", text)]
    return [t for t in targets if t and "://" not in t and not t.startswith("mailto:")]


def test_every_file_the_front_page_and_the_docs_link_is_in_the_repository():
    # A fresh clone has only what git tracks: an image the .gitignore hides
    # (the live view's screenshot once was) is a broken link there, though
    # the file is on the disk of whoever made it.
    missing = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in _relative_links(page.read_text()):
            path = (page.parent / target).resolve()
            if not path.exists():
                missing.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
                continue
            ignored = subprocess.run(
                ["git", "-C", str(ROOT), "check-ignore", "-q", str(path)], capture_output=True
            ).returncode
            if ignored == 0:
                missing.append(f"{page.relative_to(ROOT)}: {target} (ignored by git)")
    assert missing == []
