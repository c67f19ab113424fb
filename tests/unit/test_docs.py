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


def _explain(*args: str, tty: bool) -> str:
    """``dlwatch explain ARGS``'s output, its stdout a pipe or a 100×40 terminal."""
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "TTY_COMPATIBLE", "COLUMNS")}
    cmd = [sys.executable, "-m", "dlwatch", "explain", *args]
    if not tty:
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        return r.stdout
    import fcntl
    import pty
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
    env["TERM"] = "xterm-256color"
    proc = subprocess.Popen(cmd, env=env, stdout=slave, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: the other side closed
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
    return out.decode()


def test_explain_renders_markdown_on_a_terminal_and_stays_markdown_in_a_pipe():
    """Issue 43: `dlwatch explain` printed raw Markdown, a ~600-character
    table row included, to a terminal."""
    import re

    piped = _explain("io-bound", tty=False)
    assert piped.startswith("# `io-bound`") and "\n| | severity | fires when | key evidence |" in piped
    assert "\x1b[" not in piped
    # A link to another page keeps its words, not a path the user does not have.
    assert "defers to `workers-oversubscribe-cores`" in piped and ".md)" not in piped
    shown = _explain("io-bound", tty=True)
    assert "\x1b[" in shown  # styled
    plain = re.sub(r"\x1b\[[0-9;]*m", "", shown).replace("\r", "")
    lines = plain.splitlines()
    assert all(len(line) <= 100 for line in lines), max(lines, key=len)
    assert "# `io-bound`" not in plain and "|---|" not in plain and "**" not in plain
    assert any("severity" in line and "fires when" in line for line in lines)  # the table, laid out
    assert "What it means" in plain


def test_explain_show_renders_for_a_terminal_console_only():
    from rich.console import Console

    from dlwatch.cli.commands import explain

    text = explain.for_reader(pages.page("add-workers"))
    console = Console(force_terminal=True, width=80, color_system=None)
    with console.capture() as captured:
        explain.show(text, console)
    out = captured.get()
    assert "What to do" in out and "## " not in out and "| hooked job |" not in out
    assert max(map(len, out.splitlines())) <= 80
    # No word of any page is cut ("…") to fit the rule table into 80 columns.
    for rid in REGISTRY:
        text = explain.for_reader(pages.page(rid))
        with console.capture() as captured:
            explain.show(text, console)
        assert captured.get().count("…") <= text.count("…"), rid


def test_no_hint_text_shown_to_users_names_a_path_in_the_repository():
    """Issue 43: a hint's reference `docs/hints/….md` resolved only from a
    checkout. What the views show of a hint comes from the rules and the
    views' code (string literals, not docstrings or comments) and from the
    pages `dlwatch explain` prints; none may name a docs/ path."""
    import ast

    from dlwatch.diagnose.render import DOCS_SITE_URL, hint_reference

    found = []
    for folder in ("dlwatch/diagnose", "dlwatch/tui"):
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            docstrings = {
                id(n.body[0].value)
                for n in ast.walk(tree)
                if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                and n.body
                and isinstance(n.body[0], ast.Expr)
                and isinstance(n.body[0].value, ast.Constant)
            }
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and id(node) not in docstrings
                    and "docs/" in node.value
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value!r}")
    for rid in REGISTRY:
        if "docs/" in _explain_text(rid):
            found.append(f"dlwatch explain {rid}")
    assert found == []
    assert hint_reference("io-bound").startswith("dlwatch explain io-bound")
    assert ("/hints/io-bound/" in hint_reference("io-bound")) == bool(DOCS_SITE_URL)


def _explain_text(rid: str) -> str:
    from dlwatch.cli.commands import explain

    return explain.for_reader(pages.page(rid))


def test_the_site_address_the_hints_name_is_the_sites():
    import yaml

    from dlwatch.diagnose.render import DOCS_SITE_URL

    class Loader(yaml.SafeLoader):
        pass

    # mkdocs.yml's !!python/name tags (none today) must not stop the read.
    Loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda loader, suffix, node: None)
    config = yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=Loader)
    assert (config.get("site_url") or None) == DOCS_SITE_URL


def test_identifiers_never_render_as_emphasis_on_the_site():
    """Issue 43: `__getitem__` rendered as a bold "getitem" on the live-view
    page (its key table is generated from the help text)."""
    gendocs = _gendocs()
    assert gendocs.emphasis_problems("which stage of __getitem__ costs _what_") == ["__getitem__", "_what_"]
    assert gendocs.emphasis_problems("`__getitem__`, num_workers, [x](a-__b__-c), \\_\\_x") == []
    assert gendocs.emphasis_problems("```\n__init__\n```\n") == []
    assert "`__getitem__`" in gendocs.code_identifiers("which stage of __getitem__ costs what")
    assert gendocs.markdown_problems() == []


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
