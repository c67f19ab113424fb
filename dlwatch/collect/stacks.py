"""py-spy's raw output, parsed: which stacks each thread of each process was
seen in, and how often.

``py-spy record --format raw --threads --idle --subprocesses`` writes one
line per distinct stack, folded as flame-graph tools read them::

    process 10:"python t.py";process 12:"python t.py";thread (12): MainThread;<module> (t.py:9);... 37

- each ``process PID:"CMDLINE"`` is one process of the chain from the
  sampled root down to the process the stack belongs to (the last one);
  without ``--subprocesses`` there is none and the stack is the root's;
- ``thread (TID): NAME`` is the OS thread id (and its name, where py-spy
  could read it);
- then the frames, outermost first, each ``function (file:line)``;
- the last field is the number of samples that saw exactly this stack.

A command line may itself hold ``;`` or spaces (a spawn worker's ``-c
"...; spawn_main(...)"``), so the fields are found by their markers, not by
splitting blindly. Nothing here does I/O.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PROCESS = re.compile(r'process (\d+):"')
_THREAD = re.compile(r"(?:^|;)thread \((0x[0-9a-fA-F]+|\d+)\)(?:: ([^;]*))?(?=;|$)")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


@dataclass(frozen=True)
class Stack:
    """One distinct stack and how many samples saw it."""

    pids: tuple[int, ...]  # the process chain from the sampled root; the owner is the last
    tid: int | None
    thread: str  # the thread's name, "" when py-spy did not give one
    frames: tuple[str, ...]  # outermost first, "function (file:line)"
    count: int
    # The command line of each process of ``pids`` (py-spy names each one).
    cmdlines: tuple[str, ...] = ()

    @property
    def pid(self) -> int | None:
        return self.pids[-1] if self.pids else None


@dataclass(frozen=True)
class Frame:
    func: str  # "Class.method" or "function"
    file: str
    line: int | None


def parse_frame(text: str) -> Frame:
    m = _FRAME.match(text)
    if m is None:
        return Frame(text, "", None)
    line = m.group("line")
    return Frame(m.group("func"), m.group("file"), int(line) if line else None)


def parse_raw(text: str, root_pid: int | None = None) -> tuple[list[Stack], int]:
    """The stacks of a raw py-spy file and the number of lines that did not
    parse (skipped: one torn line costs that line). ``root_pid`` owns the
    stacks that name no process (a recording without ``--subprocesses``)."""
    out: list[Stack] = []
    bad = 0
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        st = parse_line(line, root_pid)
        if st is None:
            bad += 1
        else:
            out.append(st)
    return out, bad


def parse_line(line: str, root_pid: int | None = None) -> Stack | None:
    body, _, count_text = line.rpartition(" ")
    try:
        count = int(count_text)
    except ValueError:
        return None
    if count < 0 or not body:
        return None
    pids, cmdlines, rest = _processes(body)
    if pids is None:
        return None
    if not pids and root_pid is not None:
        pids = (root_pid,)
        cmdlines = ("",)
    tid, name, frames_text = None, "", rest
    m = _THREAD.search(rest)
    if m is not None and m.start() == 0:
        raw = m.group(1)
        tid = int(raw, 16) if raw.lower().startswith("0x") else int(raw)
        name = (m.group(2) or "").strip()
        frames_text = rest[m.end() :].lstrip(";")
    frames = tuple(f for f in frames_text.split(";") if f) if frames_text else ()
    return Stack(pids=pids, tid=tid, thread=name, frames=frames, count=count, cmdlines=cmdlines)


def _processes(body: str) -> tuple[tuple[int, ...] | None, tuple[str, ...], str]:
    """The leading ``process PID:"CMDLINE";`` fields (their PIDs and command
    lines) and what follows them. A command line ends at the ``";`` that
    starts the next field (another process or the thread), which is what
    makes a ``;`` inside it harmless."""
    pids: list[int] = []
    cmds: list[str] = []
    rest = body
    while True:
        m = _PROCESS.match(rest)
        if m is None:
            return tuple(pids), tuple(cmds), rest
        pids.append(int(m.group(1)))
        after = rest[m.end() :]
        nxt = _next_field(after)
        if nxt is None:
            return None, (), ""
        cmds.append(after[: nxt - 2])
        rest = after[nxt:]


def _next_field(after_quote: str) -> int | None:
    """Index just past the ``";`` closing a command line: the earliest one
    followed by the next process or the thread field."""
    first = after_quote.find('";')
    if first < 0:
        return None
    j = first
    while j >= 0:
        tail = after_quote[j + 2 :]
        if _PROCESS.match(tail) or tail.startswith("thread ("):
            return j + 2
        j = after_quote.find('";', j + 1)
    # No thread field (recorded without --threads): the frames follow.
    return first + 2
