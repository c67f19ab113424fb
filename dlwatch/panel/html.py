"""The notebook panel as HTML (and a plain-text twin), from one snapshot.

Pure: a snapshot (``dlwatch.snapshot`` document) and the panel's state in,
strings out. No JavaScript and no ``<style>`` block: a saved notebook and
viewers that strip scripts and style sheets (GitHub's) still show every figure,
so gauges and the history are text (block characters) and colour is only an
inline hint on top of words that say the same thing.
"""

from __future__ import annotations

import html
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from dlwatch.diagnose.render import judging_lines
from dlwatch.snapshot import (
    as_dict,
    as_int,
    batch_word,
    find_job,
    num,
    records,
    severity_rank,
    unmeasured_jobs,
)

NA = "n/a"
BLOCKS = "▁▂▃▄▅▆▇█"
GAUGE_CELLS = 20
HISTORY_POINTS = 60
MAX_LOADERS = 3
MAX_WORKERS = 8
MAX_HINTS = 6
# The live view's levels (docs/live-view.md): < 10 % fine, 10–30 % warn, more is bad.
WAIT_WARN = 0.10
WAIT_BAD = 0.30
COLOURS = {"ok": "#2e7d32", "warn": "#b26a00", "bad": "#c62828", "info": "#1565c0"}
SEVERITY_WORD = {"critical": "CRITICAL", "warn": "WARN", "info": "INFO"}

# Panel states: what the heading says.
WAITING, LIVE, FINISHED, STOPPED, ENDED = "waiting", "live", "finished", "stopped", "ended"


@dataclass
class LoaderSummary:
    """One loader's figures over the whole loop, for the frozen panel."""

    loader_id: int
    dataset: str
    batches: int
    epochs: int
    wait_fraction: float | None  # over the loop, from the lifetime counters
    batches_per_s: float | None  # over the seconds it delivered batches
    wait_ms_mean: float | None = None  # per batch, over the loop
    step_ms_mean: float | None = None


@dataclass
class Summary:
    """The loop's figures from its first batch to its last (``seconds``),
    shown once it stops or stands idle; ``idle_since``: the panel's clock
    (epoch seconds) at its last batch."""

    seconds: float
    loaders: list[LoaderSummary] = field(default_factory=list)
    idle_since: float | None = None

    def loader(self, loader_id: object) -> LoaderSummary | None:
        return next((ls for ls in self.loaders if ls.loader_id == loader_id), None)


def pct(frac: object, digits: int = 0) -> str:
    v = num(frac)
    return NA if v is None else f"{v * 100:.{digits}f} %"


def ms(v: object) -> str:
    x = num(v)
    if x is None:
        return NA
    return f"{x:.1f} ms" if x < 100 else f"{x:.0f} ms"


def mib(v: object) -> str:
    x = num(v)
    return NA if x is None else f"{x / (1 << 20):.0f} MiB"


def level(frac: object) -> str:
    v = num(frac)
    if v is None:
        return "info"
    return "bad" if v > WAIT_BAD else "warn" if v >= WAIT_WARN else "ok"


def gauge(frac: object, cells: int = GAUGE_CELLS) -> str:
    v = num(frac)
    if v is None:
        return "·" * cells
    filled = round(max(0.0, min(1.0, v)) * cells)
    return "█" * filled + "░" * (cells - filled)


def sparkline(values: object, points: int = HISTORY_POINTS) -> str:
    """The last ``points`` fractions (0..1) as block characters; a gap for a
    window without a batch."""
    out = []
    for v in (values if isinstance(values, list) else [])[-points:]:
        x = num(v)
        out.append(" " if x is None else BLOCKS[min(len(BLOCKS) - 1, int(max(0.0, x) * len(BLOCKS)))])
    return "".join(out)


def _e(text: object) -> str:
    return html.escape(str(text), quote=True)


def _coloured(text: str, lvl: str, bold: bool = False) -> str:
    weight = "font-weight:bold;" if bold else ""
    return f'<span style="color:{COLOURS.get(lvl, "inherit")};{weight}">{_e(text)}</span>'


def main_loaders(job: Mapping) -> list[dict]:
    """The loaders worth showing, the one the loop waits on most first."""
    lds = records(job.get("loaders"))
    lds.sort(key=lambda ld: (not ld.get("active", True), -(num(ld.get("data_wait_fraction")) or 0.0)))
    return lds[:MAX_LOADERS]


def job_hints(snapshot: Mapping, pid: int) -> list[dict]:
    """Hints about this job or the whole box, worst first."""
    hints = [h for h in records(snapshot.get("hints")) if h.get("job_pid") in (None, pid)]
    hints.sort(key=lambda h: severity_rank(h.get("severity")))
    return hints


# ----------------------------------------------------------------- sections


def _loader_lines(ld: Mapping, over: LoaderSummary | None = None, seconds: float = 0.0) -> list[str]:
    """(html rows) for one loader: gauge, history, rates, queue, workers.
    ``over``: the loop's own figures over its ``seconds`` of training, in
    place of the window's (the loop is idle: the window holds idle time)."""
    if over is not None:
        ld = {
            **ld,
            "data_wait_fraction": over.wait_fraction,
            "batches_per_s": over.batches_per_s,
            "wait_ms_mean": over.wait_ms_mean,
            "step_ms_mean": over.step_ms_mean,
        }
    wait = ld.get("data_wait_fraction")
    lvl = level(wait)
    name = ld.get("dataset") or "DataLoader"
    head = (
        f"<b>loader {_e(as_int(ld.get('id')) or 0)}</b> · {_e(name)} · "
        f"num_workers={_e(ld.get('num_workers'))} · batch_size={_e(batch_word(ld))} · "
        f"epoch {_e(ld.get('epoch'))} · {_e(ld.get('batches_total'))} batches"
    )
    if wait is None:
        reason = ld.get("no_batch_reason") or "no batch in the window"
        gauge_row = f"data wait <code>{gauge(None)}</code> {NA} ({_e(reason)})"
    else:
        span = f"its last {seconds:.0f} s of training" if over is not None else f"last {_window(ld)}"
        gauge_row = (
            f"data wait <code>{_coloured(gauge(wait), lvl)}</code> "
            f"{_coloured(pct(wait), lvl, bold=True)} of the loop ({_e(span)})"
        )
    hist = as_dict(ld.get("history")).get("data_wait_fraction")
    rows = [
        head,
        gauge_row,
        f"history <code>{_e(sparkline(hist))}</code> (about 1 point/s, 0–100 %)",
        f"{_e(_rate(ld.get('batches_per_s')))} · wait {_e(ms(ld.get('wait_ms_mean')))} · "
        f"step {_e(ms(ld.get('step_ms_mean')))} · epoch start {_e(ms(ld.get('epoch_start_ms_last')))}",
    ]
    q = as_dict(ld.get("queue"))
    if as_int(ld.get("num_workers")):
        rows.append(
            f"queue: {_e(_n(q.get('ready')))} ready · {_e(_n(q.get('in_flight')))} in flight · "
            f"capacity {_e(_n(q.get('capacity')))}"
        )
    return [f"<div>{r}</div>" for r in rows] + _workers_table(ld)


def _window(ld: Mapping) -> str:
    span = ld.get("window_mono_ns")
    if isinstance(span, list) and len(span) == 2 and all(isinstance(x, int) for x in span):
        return f"{(span[1] - span[0]) / 1e9:.1f} s"
    return "window"


def _rate(v: object) -> str:
    x = num(v)
    return f"{NA} batches/s" if x is None else f"{x:.1f} batches/s"


def _n(v: object) -> str:
    x = as_int(v)
    return NA if x is None else str(x)


def _workers_table(ld: Mapping) -> list[str]:
    workers = records(ld.get("workers"))
    if not workers:
        return []
    cells = "".join(
        f"<th>{h}</th>" for h in ("worker", "pid", "busy", "CPU", "fetch", "USS", "RSS", "threads")
    )
    rows = [f"<table><tr>{cells}</tr>"]
    for w in workers[:MAX_WORKERS]:
        cpu = num(w.get("cpu_percent"))
        vals = (
            _n(w.get("id")),
            _n(w.get("pid")),
            pct(w.get("busy_fraction")),
            NA if cpu is None else f"{cpu:.0f} %",
            ms(w.get("fetch_ms_mean")),
            mib(w.get("uss_bytes")),
            mib(w.get("rss_bytes")),
            _n(w.get("threads")),
        )
        rows.append("<tr>" + "".join(f"<td>{_e(v)}</td>" for v in vals) + "</tr>")
    rows.append("</table>")
    if len(workers) > MAX_WORKERS:
        rows.append(f"<div>… and {len(workers) - MAX_WORKERS} more workers</div>")
    return rows


def _gpu_line(snapshot: Mapping) -> str:
    gpus = records(snapshot.get("gpus"))
    if not gpus:
        return f"GPU: {NA} ({_e(snapshot.get('gpu_status') or 'no GPU figures')})"
    parts = []
    for g in gpus:
        util = num(g.get("util_percent"))
        parts.append(
            f"GPU {_e(g.get('index'))}: {NA if util is None else f'{util:.0f} %'} busy, "
            f"{_e(mib(g.get('mem_used_bytes')))} of {_e(mib(g.get('mem_total_bytes')))}"
        )
    return " · ".join(parts)


def _hint_lines(hints: list[dict], judging: list[str] | None = None, unmeasured: bool = False) -> list[str]:
    if not hints and judging:
        # Not judged yet: no hint is not "nothing to fix".
        return [f"<div>{_e(line)}</div>" for line in judging]
    if not hints and unmeasured:
        # Nor is a kernel with no loader measured (none iterated yet, or one dlwatch does not see).
        return ["<div>No hints: no loader of this kernel measured yet, so its data wait is not judged.</div>"]
    if not hints:
        return ["<div>No hints: nothing in the input pipeline needs attention.</div>"]
    out = ["<ul>"]
    for h in hints[:MAX_HINTS]:
        sev = str(h.get("severity") or "info")
        lvl = {"critical": "bad", "warn": "warn"}.get(sev, "info")
        where = f" (loader {h['loader_id']})" if h.get("loader_id") not in (None, 0) else ""
        out.append(
            f"<li>{_coloured(SEVERITY_WORD.get(sev, sev.upper()), lvl, bold=True)} "
            f"<b>{_e(h.get('id'))}</b>{_e(where)}: {_e(h.get('message', ''))}"
            f"<br>→ {_e(h.get('suggestion', ''))}</li>"
        )
    out.append("</ul>")
    if len(hints) > MAX_HINTS:
        out.append(f"<div>… and {len(hints) - MAX_HINTS} more hints</div>")
    return out


def _summary_lines(summary: Summary) -> list[str]:
    rows = [f"<div><b>Final summary</b> ({summary.seconds:.0f} s of training watched)</div><ul>"]
    for ls in summary.loaders:
        rate = NA if ls.batches_per_s is None else f"{ls.batches_per_s:.1f} batches/s"
        waited = _coloured(pct(ls.wait_fraction), level(ls.wait_fraction))
        rows.append(
            f"<li>loader {ls.loader_id} · {_e(ls.dataset)}: {ls.batches} batches, {ls.epochs} epoch(s), "
            f"{_e(rate)}; the loop waited for data {waited} of the time</li>"
        )
    rows.append("</ul>")
    return rows


HEADINGS = {
    WAITING: "waiting for the first DataLoader iterator in this kernel",
    LIVE: "live",
    FINISHED: "the loop has stopped: final figures (goes live again when a loop starts)",
    STOPPED: "stopped by %dlwatch stop: figures as they were",
    ENDED: "the collector has ended",
}


def render(
    snapshot: Mapping | None,
    pid: int,
    state: str,
    *,
    hints: list[dict] | None = None,
    summary: Summary | None = None,
    note: str = "",
    now: float | None = None,
) -> str:
    """The panel's HTML. ``hints``: the hints to show (the live ones, or the
    last ones seen while the loop ran, for a frozen panel)."""
    snap = snapshot if isinstance(snapshot, Mapping) else {}
    job = find_job(snap, pid) or {}
    stamp = time.strftime("%H:%M:%S", time.localtime(now if now is not None else time.time()))
    parts = [
        '<div class="dlwatch-panel" style="font-family:monospace;font-size:12px;line-height:1.35">',
        f"<div><b>dlwatch</b> · kernel pid {pid} · {_e(HEADINGS.get(state, state))} · {stamp}</div>",
    ]
    if note:
        parts.append(f"<div>{_e(note)}</div>")
    if summary is not None:
        parts.append(f"<div>{_e(idle_line(summary))}</div>")
    if summary is not None and summary.loaders and state != LIVE:
        parts += _summary_lines(summary)
    for ld in main_loaders(job):
        over = summary.loader(as_int(ld.get("id"))) if summary is not None else None
        parts += _loader_lines(ld, over, summary.seconds if summary is not None else 0.0)
    if job:
        main_cpu = num(job.get("main_cpu_percent"))
        cpu_text = NA if main_cpu is None else f"{main_cpu:.0f} %"
        host = as_dict(snap.get("host"))
        parts.append(
            f"<div>kernel CPU {_e(cpu_text)} (100 % = one core) · usable cores "
            f"{_e(host.get('usable_cores', NA))} · /dev/shm free {_e(mib(host.get('shm_free_bytes')))}</div>"
        )
    if snap:
        parts.append(f"<div>{_gpu_line(snap)}</div>")
        shown = hints if hints is not None else job_hints(snap, pid)
        parts.append("<div><b>Hints</b></div>")
        unmeasured = bool(unmeasured_jobs(snap.get("jobs"), pid))
        parts += _hint_lines(shown, judging_lines(snap.get("judging"), pid), unmeasured)
    parts.append("</div>")
    return "\n".join(parts)


def idle_line(summary: Summary) -> str:
    """Since when the loop stands idle, and what the figures below cover."""
    since = NA
    if summary.idle_since is not None:
        since = time.strftime("%H:%M:%S", time.localtime(summary.idle_since))
    return f"loop idle since {since}; figures from its last {summary.seconds:.0f} s of training"


def render_text(
    snapshot: Mapping | None,
    pid: int,
    state: str,
    *,
    hints: list[dict] | None = None,
    summary: Summary | None = None,
) -> str:
    """A plain-text twin for frontends without HTML (a terminal console)."""
    snap = snapshot if isinstance(snapshot, Mapping) else {}
    job = find_job(snap, pid) or {}
    lines = [f"dlwatch · kernel pid {pid} · {HEADINGS.get(state, state)}"]
    if summary is not None:
        lines.append(idle_line(summary))
    for ld in main_loaders(job):
        over = summary.loader(as_int(ld.get("id"))) if summary is not None else None
        wait = ld.get("data_wait_fraction") if over is None else over.wait_fraction
        rate = ld.get("batches_per_s") if over is None else over.batches_per_s
        lines.append(
            f"loader {as_int(ld.get('id')) or 0} ({ld.get('dataset') or 'DataLoader'}): data wait "
            f"{gauge(wait)} {pct(wait)} · {_rate(rate)} · "
            f"num_workers={ld.get('num_workers')}"
        )
    for h in (hints if hints is not None else job_hints(snap, pid))[:MAX_HINTS]:
        sev = SEVERITY_WORD.get(str(h.get("severity")), "INFO")
        lines.append(f"[{sev}] {h.get('id')}: {h.get('message', '')} → {h.get('suggestion', '')}")
    return "\n".join(lines)
