"""``dlwatch explain [HINT]``: a hint's page in the terminal — what it means,
when it fires, its evidence, where its thresholds come from and what to do —
the same text as the docs site's page (``dlwatch/diagnose/pages.py``).

On a terminal the page is rendered (rich: headings, lists and the rule table
laid out to the width, where its raw row runs to ~600 characters); piped or
redirected it stays Markdown, plain text that greps and pastes."""

from __future__ import annotations

import re

from dlwatch.cli.common import EXIT_OK, EXIT_USAGE, fail

NAME = "explain"
HELP = "what a hint means and what to do about it (the hint's docs page, in the terminal)"
ORDER = 85
PROG = "dlwatch explain"

# A link to another page of the site (``[`io-bound`](io-bound.md)``,
# ``(../tune.md)``): the words stay, the target goes: outside the site it
# names a file the user does not have. A hint named so is ``dlwatch explain``'s.
_RELATIVE_LINK = re.compile(r"\[([^\]]+)\]\((?![a-z][a-z0-9+.-]*:)[^)]*\)")


def add_arguments(p) -> None:
    p.add_argument(
        "hint", nargs="?", metavar="HINT", help="a hint id, as the view shows it (omit: list them all)"
    )


def for_reader(page: str) -> str:
    """The page as a reader outside the site gets it: no HTML comment (for
    the site's source), no relative link targets."""
    text = "\n".join(line for line in page.splitlines() if not line.startswith("<!--")).strip()
    return _RELATIVE_LINK.sub(r"\1", text)


def _terminal_markdown():
    """rich's Markdown, its tables folding a long word (an evidence key, a
    formula) onto the next line where rich would cut it with "…": at 80
    columns the rule table's cells lost ~20 words that way over the pages."""
    from rich.markdown import Markdown, TableElement
    from rich.table import Table

    class FoldedTable(TableElement):
        def __rich_console__(self, console, options):
            for part in super().__rich_console__(console, options):
                if isinstance(part, Table):
                    for column in part.columns:
                        column.overflow = "fold"
                yield part

    class TerminalMarkdown(Markdown):
        elements = {**Markdown.elements, "table_open": FoldedTable}

    return TerminalMarkdown


def show(text: str, console=None) -> None:
    """``text`` (Markdown) rendered on a terminal, else printed as it is."""
    from rich.console import Console

    console = console or Console()
    if console.is_terminal and not console.is_dumb_terminal:
        console.print(_terminal_markdown()(text, hyperlinks=False))
    else:
        print(text)


def run(args) -> int:
    from dlwatch.diagnose import pages
    from dlwatch.diagnose.engine import REGISTRY

    if not args.hint:
        width = max(map(len, REGISTRY))
        for rid in sorted(REGISTRY):
            summary = " ".join(pages.prose(rid).strip().split("\n\n", 1)[0].split())
            print(f"{rid:<{width}}  {summary}")
        return EXIT_OK
    try:
        text = pages.page(args.hint.strip().strip("`"))
    except pages.MissingPage as e:
        return fail(str(e), EXIT_USAGE, PROG)
    show(for_reader(text))
    return EXIT_OK
