"""Reading a recording back: tolerant of what a killed recorder leaves.

A torn last line (the recorder was killed mid-write, the disk filled, a gzip
stream ends without its trailer) is skipped with a warning; so is any other
line that is not a JSON object. A file without a header (a plain JSON Lines
stream of snapshots, as older tools wrote) still reads. Nothing here raises
for bad content: only a file that cannot be opened at all is an error
(``OSError``), and the caller says so in one line.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from dlwatch.record import fileformat
from dlwatch.snapshot import SCHEMA_VERSION, as_int, num


@dataclass
class Recording:
    path: str
    header: dict[str, Any] = field(default_factory=dict)
    snapshots: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def start(self) -> float | None:
        t = num(self.header.get("start_time"))
        if t is not None:
            return t
        return num(self.snapshots[0].get("time")) if self.snapshots else None

    @property
    def name(self) -> str:
        import os

        return os.path.basename(self.path)


def read(path: str) -> Recording:
    """The recording at ``path``. Raises OSError only when it cannot be opened."""
    rec = Recording(path)
    notes: list[str] = []
    pending: tuple[int, bytes] | None = None  # the newest line, judged once we know if it is the last
    n = 0
    for n, line in enumerate(_lines(path, notes), 1):
        if pending is not None:
            _take(rec, *pending, last=False)
        pending = (n, line)
    if pending is not None:
        _take(rec, *pending, last=True)
    if n == 0:
        notes.append("the file is empty")
    rec.warnings.extend(notes)
    if not rec.header:
        if n:
            rec.warnings.append("no header line: not written by `dlwatch record`; read as plain snapshots")
    else:
        version = as_int(rec.header.get(fileformat.HEADER_KEY))
        if version is None or version > fileformat.FORMAT_VERSION:
            rec.warnings.append(
                f"recording format {rec.header.get(fileformat.HEADER_KEY)!r} is newer than this "
                f"dlwatch reads ({fileformat.FORMAT_VERSION}): figures may be missing"
            )
        schema = as_int(rec.header.get("schema_version"))
        if schema is not None and schema > SCHEMA_VERSION:
            rec.warnings.append(
                f"snapshot schema {schema} is newer than this dlwatch's ({SCHEMA_VERSION}): "
                "unknown keys are ignored"
            )
    return rec


def _take(rec: Recording, n: int, line: bytes, last: bool) -> None:
    line = line.strip()
    if not line:
        return
    try:
        obj = json.loads(line)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        where = "the last line" if last else f"line {n}"
        # A last line cut mid-write is what a killed recorder leaves; a file
        # with nothing readable before it was never a recording (a QA run:
        # "hello" read as a torn recording).
        torn = last and (rec.header or rec.snapshots)
        what = "torn (the recording was cut short)" if torn else "not a JSON object"
        rec.warnings.append(f"{where} is {what}: skipped")
        return
    if fileformat.is_header(obj):
        if not rec.header and not rec.snapshots:
            rec.header = obj
        else:
            rec.warnings.append(f"line {n}: a second header (files joined?): ignored")
        return
    if not isinstance(obj.get("jobs"), list):
        # Every snapshot has its jobs, if none: a JSON object without is
        # something else (a QA run's {"a": 1} made an empty report, exit 0).
        rec.warnings.append(f'line {n} is a JSON object but no snapshot (no "jobs" list): skipped')
        return
    rec.snapshots.append(obj)


def _lines(path: str, notes: list[str]) -> Iterator[bytes]:
    """The file's lines (bytes, without the newline), streamed. A gzip stream
    cut short (no trailer, a partial block: the recorder was killed) yields
    everything that decompressed before the cut, and a note."""
    with open(path, "rb") as f:
        if fileformat.is_gzip(path):
            chunks = _gunzip(f, notes)
        else:
            chunks = iter(lambda: f.read(1 << 16), b"")
        rest = b""
        for chunk in chunks:
            rest += chunk
            *whole, rest = rest.split(b"\n")
            yield from whole
        if rest:
            yield rest


def _gunzip(f: BinaryIO, notes: list[str]) -> Iterator[bytes]:
    # zlib directly rather than gzip.GzipFile: GzipFile raises at a cut and
    # loses what it had decompressed in that read.
    d, fed = zlib.decompressobj(wbits=31), False
    while raw := f.read(1 << 16):
        while raw:
            try:
                out = d.decompress(raw)
            except zlib.error as e:
                notes.append(f"the compressed stream is corrupt ({e}): read up to there")
                return
            fed = True
            if out:
                yield out
            raw = b""
            if d.eof:  # another gzip member may follow (a file appended to)
                raw = d.unused_data
                d, fed = zlib.decompressobj(wbits=31), False
    if fed and not d.eof:
        notes.append("the compressed stream ends early (the recording was cut short): read up to the cut")
