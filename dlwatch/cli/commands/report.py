"""``dlwatch report FILE [FILE_B]``: a recording as one self-contained HTML
file; with two recordings, the comparison of ``dlwatch compare``."""

from __future__ import annotations

import os

from dlwatch.cli.recording import add_recording_argument, load, stem, write_html

NAME = "report"
HELP = "write a recording (or two, side by side) as one self-contained HTML file"
DESCRIPTION = (
    "Write one HTML file that a person can attach to a ticket: the jobs, loader settings, data wait "
    "and batches/s over time, each worker's busy time, CPU and memory over time, the hints with "
    "their evidence, and a summary table. Inline SVG and CSS only: opening it fetches nothing. "
    "With two recordings (A B): the settings that differ, throughput, data wait and the change in "
    "each, as `dlwatch compare A B -o FILE` writes."
)
EPILOG = "example: dlwatch report before.jsonl.gz after.jsonl.gz -o fix.html"
ORDER = 70


def add_arguments(p) -> None:
    add_recording_argument(p)
    p.add_argument("other", nargs="?", help="a second recording: compare the two (A = first, B = second)")
    p.add_argument(
        "-o",
        "--output",
        metavar="FILE",
        help="HTML file to write (default: the recording's name with .html, or A-vs-B.html)",
    )


def run(args) -> int:
    prog = "dlwatch report"
    a = load(args.recording, prog)
    if isinstance(a, int):
        return a
    if args.other is None:
        from dlwatch.record.report import report_html

        out = args.output or os.path.join(os.path.dirname(args.recording), stem(args.recording) + ".html")
        return write_html(out, report_html(a), prog)
    b = load(args.other, prog)
    if isinstance(b, int):
        return b
    from dlwatch.record.compare import compare
    from dlwatch.record.report import compare_html

    out = args.output or f"{stem(args.recording)}-vs-{stem(args.other)}.html"
    return write_html(out, compare_html(compare(a, b)), prog)
