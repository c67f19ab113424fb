"""Diagnosis: the snapshot's hints for the selected job (and box-wide ones),
worst first, each with its measured evidence and one next step."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.binding import Binding
from textual.widgets import Static

from dlwatch.diagnose.render import evidence_items, evidence_text, hint_reference, judging_lines
from dlwatch.snapshot import unmeasured_jobs, unmeasured_line
from dlwatch.tui import fmt
from dlwatch.tui.keyed import set_static
from dlwatch.tui.textmodal import TextModal


def relevant_hints(hints: Any, job_pid: int | None, host: str | None = None) -> tuple[list[dict], int]:
    """(hints about this job or the whole box, number about other jobs).
    ``host``: the job's node in a ``dlwatch --host`` view, where two nodes may
    run the same PID; a hint of another node is another job's. A box-wide
    hint whose evidence names its jobs (``jobs``) is about those: beside a
    job that has exited, the cores its successor fills are another job's."""
    mine, others = [], 0
    for h in fmt.lst(hints):
        if not isinstance(h, dict):
            continue
        pid = h.get("job_pid")
        ev = fmt.d(h.get("evidence"))
        named = [p for p in fmt.lst(ev.get("jobs")) if isinstance(p, int)]
        # straggler-rank is keyed to the slow rank, and is about every rank
        # of its run: a fast rank loses its time waiting for it (a QA run:
        # the fast rank read "no hints for this job" while it lost 86 %).
        ranks = [fmt.d(x).get("pid") for x in fmt.lst(ev.get("ranks"))]
        if host and h.get("host") not in (None, host):
            others += 1
        elif pid is None and named and job_pid is not None and job_pid not in named:
            others += 1
        elif pid is None or job_pid is None or pid == job_pid or job_pid in ranks:
            mine.append(h)
        else:
            others += 1
    mine.sort(key=lambda h: fmt.severity_rank(h.get("severity")))
    return mine, others


# In the compact layout a hint's message gets at most this many lines of the
# pane, so that its next step ("→") shows under it (`e` shows it in full).
COMPACT_MESSAGE_LINES = 2


def hint_text(h: dict, pal: fmt.Palette, wide: bool, width: int | None = None) -> Text:
    """One hint: severity, id, message, "→ next step", evidence. ``width``:
    the pane's, in the compact layout, where a long message is cut to
    ``COMPACT_MESSAGE_LINES`` lines so that the next step stays in sight."""
    sev = fmt.s(h.get("severity"), "info")
    level = fmt.HINT_LEVEL.get(sev, fmt.INFO)
    t = Text()
    t.append(fmt.HINT_LABEL.get(sev, f"? {sev.upper() or 'HINT'}"), f"bold {pal.level(level)}")
    t.append(f" {fmt.s(h.get('id'), '?')}", "bold")
    if h.get("job_pid") is None:
        t.append(" (all jobs)", pal.dim)
    elif fmt.intval(h.get("loader_id")) not in (None, 0):
        t.append(f" (loader {fmt.count(h.get('loader_id'))})", pal.dim)
    message = ": " + fmt.s(h.get("message"), fmt.NA)
    if not wide and width:
        # Characters, not wrapped lines: a word wrapped early costs a few
        # cells, so a margin of a few per line keeps it within the lines.
        message = fmt.truncate(message, COMPACT_MESSAGE_LINES * (width - 4) - len(t.plain))
    t.append(message)
    suggestion = fmt.s(h.get("suggestion"))
    ev = evidence_text(h.get("evidence"), limit=6 if wide else 3)
    if suggestion:
        t.append("\n  → ", f"bold {pal.level(level)}")
        t.append(suggestion)
    if ev:
        t.append("\n  evidence: " if wide else ("  [" if suggestion else "\n  ["), pal.dim)
        t.append(ev, pal.dim)
        if not wide:
            t.append("]", pal.dim)
    return t


class HintsPanel(Static):
    _shown_for: tuple | None = None

    def show(
        self,
        snapshot: dict | None,
        job_pid: int | None,
        pal: fmt.Palette,
        wide: bool,
        host: str | None = None,
        ended: bool = False,
    ) -> None:
        """``ended``: the job has exited (its hints ended with it)."""
        # The collector re-judges once a second and hands the same list over
        # in between: nothing to format again.
        hints_obj = snapshot.get("hints") if isinstance(snapshot, dict) else None
        judging_obj = snapshot.get("judging") if isinstance(snapshot, dict) else None
        width = self._width()
        key = (hints_obj, job_pid, pal, wide, host, ended, width, judging_obj)
        if (
            hints_obj is not None
            and self._shown_for is not None
            and self._shown_for[0] is hints_obj
            and self._shown_for[-1] is judging_obj
            and self._shown_for[1:-1] == key[1:-1]
        ):
            return
        self._shown_for = key
        if snapshot is None:
            set_static(self, Text("hints: waiting for data…", pal.dim))
            return
        hints, others = relevant_hints(snapshot.get("hints"), job_pid, host)
        out = Text()
        broken = fmt.s(snapshot.get("hints_error"))
        # A loader in its first warm-up is not judged yet: no hints is not "nothing to fix".
        judging = judging_lines(snapshot.get("judging"), job_pid)
        if broken and not hints:
            # No hints from a diagnosis that did not run is not "nothing to fix".
            out.append(f"✖ no hints: {broken}", pal.bad)
        elif judging:
            out.append("\n".join(judging), pal.dim)
            if hints:
                out.append("\n")
        elif not hints and ended:
            # Not "nothing to fix": a dead job is not judged at all.
            out.append("no hints: the job has exited (hints are about running jobs)", pal.dim)
        elif not hints and not snapshot.get("jobs"):
            # No job, nothing judged: a green tick read as an all-clear.
            out.append("no hints: no job to judge yet", pal.dim)
        elif not hints and (unmeasured := unmeasured_jobs(snapshot.get("jobs"), job_pid)):
            # A job training on something dlwatch does not see is not judged either.
            out.append(unmeasured_line(unmeasured), pal.dim)
        elif not hints:
            out.append("✓ no hints" + (" for this job" if others else ""), pal.good)
            out.append(" — nothing to fix in the input pipeline right now" if not others else "", pal.dim)
        for i, h in enumerate(hints):
            if i:
                out.append("\n")
            out.append_text(hint_text(h, pal, wide, width))
        if others:
            out.append(
                f"\n+{others} hint{'s' if others > 1 else ''} about other jobs (tab to switch)", pal.dim
            )
        set_static(self, out)

    def _width(self) -> int:
        """The cells a line of the pane has (before the first layout: the
        screen's, less the pane's padding and scroll bar)."""
        width = self.size.width
        return width if width > 0 else max(20, self.app.size.width - 3)


def hint_detail(h: dict, pal: fmt.Palette) -> Text:
    """One hint in full: the message, the next step and every evidence item
    on its own line (the panel shows the first few, cut to the width)."""
    t = hint_text({k: v for k, v in h.items() if k != "evidence"}, pal, wide=True)
    items = evidence_items(h.get("evidence"), missing=True)
    if items:
        t.append("\n  evidence:", "bold")
        for k, v in items:
            t.append(f"\n    {k} = ", pal.dim)
            t.append(v)
    hid = h.get("id")
    if isinstance(hid, str) and hid:
        # Where to read what the hint means and what to do, without a checkout.
        t.append("\n  about this hint: ", pal.dim)
        t.append(hint_reference(hid))
    return t


class HintDetailScreen(TextModal):
    """``e``: every hint of the selected job in full, scrollable."""

    BINDINGS = [Binding("e", "dismiss", "close", show=False)]

    def __init__(
        self, snapshot: dict | None, job_pid: int | None, pal: fmt.Palette, host: str | None = None
    ) -> None:
        hints, _ = relevant_hints(fmt.d(snapshot).get("hints"), job_pid, host)
        body = Text("no hints for this job right now", pal.dim) if not hints else Text()
        for i, h in enumerate(hints):
            if i:
                body.append("\n\n")
            body.append_text(hint_detail(h, pal))
        title = "hints" + (f" · PID {job_pid}" if job_pid is not None else "")
        super().__init__(body, title=title, closes="escape, q or e closes", body_id="hint-detail", width=100)
