"""``dlwatch explain [HINT]``: a hint's page in the terminal — what it means,
when it fires, its evidence, where its thresholds come from and what to do —
the same text as the docs site's page (``dlwatch/diagnose/pages.py``)."""

from __future__ import annotations

from dlwatch.cli.common import EXIT_OK, EXIT_USAGE, fail

NAME = "explain"
HELP = "what a hint means and what to do about it (the hint's docs page, in the terminal)"
ORDER = 85
PROG = "dlwatch explain"


def add_arguments(p) -> None:
    p.add_argument(
        "hint", nargs="?", metavar="HINT", help="a hint id, as the view shows it (omit: list them all)"
    )


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
    # The HTML comment is for the docs site's source, not for a reader.
    print("\n".join(line for line in text.splitlines() if not line.startswith("<!--")).strip())
    return EXIT_OK
