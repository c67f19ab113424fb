"""``dlwatch compare A B``: two recordings side by side ("before/after"),
and with ``--max-regression`` a CI gate on them."""

from __future__ import annotations

import json

from dlwatch.cli.common import EXIT_ERROR, EXIT_OK, EXIT_REGRESSION, EXIT_USAGE, fail, number
from dlwatch.cli.recording import load, write_html

NAME = "compare"
HELP = "compare two recordings: settings that differ, throughput, data wait, the change in each"
DESCRIPTION = (
    "Compare the main loader (the one that moved the most batches) of two recordings: the loader "
    "settings that differ, throughput, data wait, step and wait times, worker busy/CPU/memory and "
    "the change in each (B relative to A), and the hints only one of them showed. Prints a table; "
    "-o also writes the HTML comparison (as `dlwatch report A B`). With --max-regression it is a "
    "CI gate: exit 3 when B's throughput (batches/s, and samples/s where the batch size is known) "
    "is more than PCT % below A's, 0 when not, 1 when a recording cannot say; the figures and "
    "the verdict are printed either way."
)
EPILOG = "example: dlwatch compare baseline.jsonl.gz this-run.jsonl.gz --max-regression 10"
ORDER = 75
PROG = "dlwatch compare"


def add_arguments(p) -> None:
    p.add_argument("a", metavar="A", help="the first recording (before; the baseline)")
    p.add_argument("b", metavar="B", help="the second recording (after)")
    p.add_argument("-o", "--output", metavar="FILE", help="also write the comparison as HTML")
    p.add_argument(
        "--json", action="store_true", help="print the comparison (and the gate's verdict) as JSON"
    )
    p.add_argument(
        "--max-regression",
        type=number,
        metavar="PCT",
        help="exit 3 when B's throughput is more than PCT %% below A's",
    )
    p.add_argument(
        "--max-wait-increase",
        type=number,
        metavar="POINTS",
        help="exit 3 when B's mean data wait is more than POINTS percentage points above A's",
    )


def run(args) -> int:
    for flag, value in (
        ("--max-regression", args.max_regression),
        ("--max-wait-increase", args.max_wait_increase),
    ):
        if value is not None and not 0 <= value <= 100:
            return fail(f"{flag} must be between 0 and 100, not {value:g}", EXIT_USAGE, PROG)
    a = load(args.a, PROG)
    if isinstance(a, int):
        return a
    b = load(args.b, PROG)
    if isinstance(b, int):
        return b
    from dlwatch.record.compare import as_json, compare, judge, text, verdict_text

    c = compare(a, b)
    verdict = None
    status = EXIT_OK
    if args.max_regression is not None or args.max_wait_increase is not None:
        verdict = judge(c, args.max_regression, args.max_wait_increase)
        if verdict.problem:
            status = EXIT_ERROR
        elif verdict.failed:
            status = EXIT_REGRESSION
    if args.output:
        from dlwatch.record.report import compare_html

        written = write_html(args.output, compare_html(c), PROG)
        status = status or written
    if args.json:
        print(json.dumps(as_json(c, verdict, status), indent=2, default=str))
    else:
        print(text(c))
        if verdict is not None and not verdict.problem:
            print()
            print(verdict_text(verdict, c))
    if verdict is not None and verdict.problem:
        fail(f"cannot judge: {verdict.problem}", EXIT_ERROR, PROG)
    return status
