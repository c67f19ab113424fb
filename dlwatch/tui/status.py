"""The status line at the top, and the single-line job header."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.text import Text

from dlwatch.collect.co_iterated import describe as describe_loop
from dlwatch.tui import fmt
from dlwatch.tui.jobs import JobRow, stalled


def status_text(
    *,
    version: str,
    snapshot: dict | None,
    rows: list[JobRow],
    interval: float,
    paused: bool,
    now: float,
    time_format: Callable[[float], str],
    pal: fmt.Palette,
    source_error: str | None = None,
    replay: str | None = None,
) -> Text:
    """The top line. ``replay``: the replay's position and state; it takes
    the place of the refresh interval, and a recorded snapshot's age is not
    staleness."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(f"dlwatch {version}", "bold")
    parts: list[Text | str] = [t]
    jobs = [r for r in rows if r.kind == "job"]
    if snapshot is not None:
        jt = Text(f"{len(jobs)} job{'s' if len(jobs) != 1 else ''}")
        # Each state by its own name: a stalled or unreachable job is still
        # running, and calling it exited hid the one that needs attention.
        counts: dict[str, int] = {}
        for r in jobs:
            if r.state != "live":
                word = r.state.lower()
                counts[word] = counts.get(word, 0) + 1
        if counts:
            order = ("stalled", "unreachable", "exited")
            said = sorted(counts, key=lambda w: (order.index(w) if w in order else len(order), w))
            jt.append(" (" + ", ".join(f"{counts[w]} {w}" for w in said) + ")", pal.dim)
        parts.append(jt)
    if replay is not None:
        parts.append(Text(replay, f"bold reverse {pal.info}"))
    else:
        parts.append(f"every {interval:g} s")
    if paused:
        parts.append(Text("⏸ PAUSED (p resumes)", f"bold reverse {pal.warn}"))
    if source_error:
        parts.append(Text(f"✖ source: {source_error}", pal.bad))
    faults = [e for e in fmt.lst(fmt.d(snapshot).get("errors")) if isinstance(e, str)]
    if faults:
        # The newest fault; the rest are in `dlwatch snapshot` and the JSON.
        more = f" (+{len(faults) - 1})" if len(faults) > 1 else ""
        parts.append(Text(f"✖ collector: {faults[-1]}{more}", pal.bad))
    if snapshot is None:
        parts.append(Text("waiting for data…", pal.dim))
    else:
        ts = fmt.num(snapshot.get("time"))
        if ts is None:
            parts.append(Text("updated n/a", pal.dim))
        else:
            try:
                stamp = time_format(ts)
            except (ValueError, OverflowError, OSError):
                stamp = fmt.NA
            parts.append(Text(f"{'recorded' if replay is not None else 'updated'} {stamp}", pal.dim))
            age = now - ts
            # Freshness bar is 1 s; several missed samples mean the collector
            # is stuck, which must not look like a quiet job.
            if replay is None and age > max(3.0, 5 * interval):
                parts.append(Text(f"⚠ STALE {fmt.duration(age)} old", f"bold {pal.warn}"))
    return fmt.join(parts, pal=pal)


def job_header(job: Any, pal: fmt.Palette, wide: bool) -> Text:
    job = fmt.d(job)
    state = fmt.s(job.get("state"), "live") or "live"
    parts: list[Text | str] = []
    pid = Text(f"pid {fmt.count(job.get('pid'))}", "bold")
    parts.append(pid)
    rank, ws = fmt.intval(job.get("rank")), fmt.intval(job.get("world_size"))
    if rank is not None:
        parts.append(f"rank {rank}/{ws if ws is not None else '?'}")
    if state == "live" and stalled(job):
        parts.append(Text(f"■ STALLED (live {fmt.duration(job.get('age_s'))}; S: stacks)", f"bold {pal.bad}"))
    elif state == "live":
        parts.append(Text(f"● live {fmt.duration(job.get('age_s'))}", pal.good))
    else:
        reason = fmt.s(job.get("state_reason"))
        parts.append(Text(f"■ {state.upper()}" + (f" ({reason})" if reason else ""), f"bold {pal.warn}"))
        parts.append(Text("last figures; d dismisses", pal.dim))
    if job.get("sampled") is True:
        # Attached without the hook: figures are shares of stack samples.
        parts.append(Text("◌ sampled (attached, no hook)", f"bold {pal.warn}"))
    parts.append(f"main CPU {fmt.pct100(job.get('main_cpu_percent'))}")
    if wide:
        parts.append(f"main thread {fmt.pct100(job.get('main_thread_cpu_percent'))}")
        parts.append(f"RSS {fmt.size(job.get('rss_bytes'))}")
        parts.append(f"torch {fmt.s(job.get('torch_version'), fmt.NA)}")
        parts.append(fmt.s(job.get("start_method"), fmt.NA))
    out = fmt.join(parts, pal=pal)
    if wide:
        out.append("\n")
        out.append(fmt.s(job.get("cmdline"), fmt.NA), pal.dim)
    for loop in fmt.lst(job.get("loops")):
        if isinstance(loop, dict):
            # zip(a, b): each loader's gauge is its own share, the loop's wait their sum.
            out.append("\n")
            out.append(describe_loop(loop), f"bold {pal.info}")
    return out
