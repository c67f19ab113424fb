"""``dlwatch compare A B``: two recordings side by side ("before/after")."""

from __future__ import annotations

from dlwatch.cli.common import EXIT_OK
from dlwatch.cli.recording import load, write_html

NAME = "compare"
HELP = "compare two recordings: settings that differ, throughput, data wait, the change in each"
DESCRIPTION = (
    "Compare the main loader (the one that moved the most batches) of two recordings: the loader "
    "settings that differ, throughput, data wait, step and wait times, worker busy/CPU/memory and "
    "the change in each (B relative to A), and the hints only one of them showed. Prints a table; "
    "-o also writes the HTML comparison (as `dlwatch report A B`)."
)
EPILOG = "example: dlwatch compare before.jsonl.gz after.jsonl.gz"
ORDER = 75


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="the first recording (before)")
    p.add_argument("b", metavar="B", help="the second recording (after)")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the comparison as HTML")


def run(args) -> int:
    prog = "dlwatch compare"
    a = load(args.a, prog)
    if isinstance(a, int):
        return a
    b = load(args.b, prog)
    if isinstance(b, int):
        return b
    from dlwatch.record.compare import compare, text

    c = compare(a, b)
    print(text(c))
    if args.output:
        from dlwatch.record.report import compare_html

        return write_html(args.output, compare_html(c), prog)
    return EXIT_OK
