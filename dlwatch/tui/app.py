"""The live TUI: `DlwatchApp(source)` and the `run_tui` entry point.

The event loop never does I/O: it asks the source for its prebuilt latest
snapshot when the source says one is ready (or on its timer, for sources that
do not) and redraws from it. Every panel is drawn inside its own guard, so a
snapshot the code did not expect costs a status line, not the screen.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from rich.style import Style
from rich.text import Text
from textual.app import App, ComposeResult, SystemCommand
from textual.command import CommandPalette
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Static

from dlwatch import __version__
from dlwatch.collect.loop_role import no_loader_yet
from dlwatch.snapshot import SnapshotSource
from dlwatch.tui import fmt
from dlwatch.tui.gpu import GpuPanel
from dlwatch.tui.help import HelpScreen
from dlwatch.tui.hints import HintDetailScreen, HintsPanel
from dlwatch.tui.host import HostLine
from dlwatch.tui.jobs import JobList, JobRow, follow_living, group_jobs, job_state, remote_hosts
from dlwatch.tui.keyed import set_static
from dlwatch.tui.keys import APP_KEYS, SCREEN_KEYS, footer_text, palette_keys
from dlwatch.tui.loader import LoaderPanel
from dlwatch.tui.profile import ProfileScreen, Runner
from dlwatch.tui.sources import ReplayControls
from dlwatch.tui.stacks import StacksRunner, StacksScreen
from dlwatch.tui.status import job_header, status_text
from dlwatch.tui.textline import TextLine

W = TypeVar("W")
_R = TypeVar("_R")

# The headline (data wait, rates, prefetch queue) and the job list are drawn
# from every snapshot; the panels fed by once-a-second samples (workers' CPU
# and memory, host, GPU, hints) and the status line at most this often. Half
# of the TUI's refreshes then redraw a few lines instead of the screen.
FULL_REDRAW_S = 0.95

# Below this size everything collapses to one line per section (80×24 is the
# design's floor); from here up the gauge gets big digits and GPUs a graph.
WIDE_MIN = (120, 35)
# From this height the data-wait history gets 6 rows instead of 2 (at 120×40
# the wide layout otherwise leaves ~10 blank lines under one loader).
TALL_MIN_H = 40


def local_time(ts: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(ts))


class SnapshotReady(Message):
    """The source has a new snapshot (posted from the source's own thread)."""


class MonitorScreen(Screen):
    """The main screen. Job switching is bound here, not on the app, so that
    tab/j/k stay ordinary keys in the command palette and the help screen."""

    BINDINGS = [k.binding() for k in SCREEN_KEYS]

    def compose(self) -> ComposeResult:
        yield TextLine(id="status")
        yield Static(id="error")
        yield JobList(id="jobs")
        with VerticalScroll(id="main", can_focus=False):
            yield TextLine(id="job-header")
            yield Static(id="message")
            yield Vertical(id="loaders")
        yield GpuPanel(id="gpu")
        yield HostLine(id="host", classes="line")
        with VerticalScroll(id="hints-box", can_focus=False):
            yield HintsPanel(id="hints")
        yield TextLine(id="footer")

    def action_page(self, direction: int) -> None:
        main = self.query_one("#main", VerticalScroll)
        if direction > 0:
            main.scroll_page_down(animate=False)
        else:
            main.scroll_page_up(animate=False)

    def action_hints_page(self, direction: int) -> None:
        box = self.query_one("#hints-box", VerticalScroll)
        if direction > 0:
            box.scroll_page_down(animate=False)
        else:
            box.scroll_page_up(animate=False)
        self.call_after_refresh(self.draw_hints_title)

    def draw_hints_title(self) -> None:
        """The hints pane says, on its top border, that it holds more than it
        shows and which keys scroll it (at 80×24 it has a few lines)."""
        box = self.query_one("#hints-box", VerticalScroll)
        more = box.max_scroll_y > 0
        below, above = box.scroll_y < box.max_scroll_y, box.scroll_y > 0
        where = "more below" if below and not above else "more above" if above and not below else "more"
        box.border_title = f"{where}: [ ] scroll · e all in full" if more else None

    def draw_footer(self) -> None:
        app = self.app
        replay = isinstance(app, DlwatchApp) and app.is_replay
        style = f"bold {app.palette.accent}" if isinstance(app, DlwatchApp) else "bold"
        set_static(self.query_one("#footer", TextLine), footer_text(self.size.width, replay, style))

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ready = False
        self._refs: dict[str, object] = {}

    def ref(self, selector: str, kind: type[W]) -> W:
        """``query_one``, remembered: this screen's widgets stay for its life,
        and a DOM query on every refresh is a measurable share of the TUI's CPU."""
        widget = self._refs.get(selector)
        if widget is None:
            widget = self._refs[selector] = self.query_one(selector)
        if not isinstance(widget, kind):
            raise TypeError(f"{selector} is a {type(widget).__name__}, not a {kind.__name__}")
        return widget

    def on_mount(self) -> None:
        self.ready = True
        self.draw_footer()
        # The app's first tick may come before this screen exists.
        app = self.app
        if isinstance(app, DlwatchApp):
            app.redraw()

    def on_resize(self) -> None:
        w, h = self.size
        wide = w >= WIDE_MIN[0] and h >= WIDE_MIN[1]
        tall = wide and h >= TALL_MIN_H
        # A high terminal lists more jobs whatever its width (a QA run: 4 rows
        # of the job list at 100x30 and at 100x70 alike).
        high = h >= TALL_MIN_H
        changed = (
            wide != self.has_class("-wide")
            or tall != self.has_class("-tall")
            or high != self.has_class("-high")
        )
        self.set_class(wide, "-wide")
        self.set_class(tall, "-tall")
        self.set_class(high, "-high")
        self.draw_footer()
        app = self.app
        if isinstance(app, DlwatchApp):
            app.resize_columns(w)
            if changed:
                app.redraw()


class ClosingPalette(CommandPalette):
    """Textual's command palette, saying how to close it like every modal of
    ours (q is a letter of the search here, so escape and ctrl+p close it:
    the app's ctrl+p, a priority binding, toggles it)."""

    CLOSES = "escape or ctrl+p closes · ↑↓ choose · enter runs"

    def on_mount(self) -> None:
        self.query_one("#--input").border_title = self.CLOSES


class DlwatchApp(App):
    CSS_PATH = "app.tcss"
    TITLE = "dlwatch"

    BINDINGS = [k.binding() for k in APP_KEYS]

    def __init__(
        self,
        source: SnapshotSource,
        interval: float = 0.5,
        *,
        runtime_dir: str | None = None,
        clock: Callable[[], float] = time.time,
        time_format: Callable[[float], str] = local_time,
        version: str = __version__,
        profiler: Runner | None = None,
        worker_profiler: Runner | None = None,
        stacker: StacksRunner | None = None,
        follow_pid: int | None = None,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.source = source
        self.interval = max(0.05, float(interval))
        self.runtime_dir = runtime_dir
        self.clock = clock
        self.time_format = time_format
        self.version = version
        self.profiler = profiler
        self.worker_profiler = worker_profiler
        self.stacker = stacker
        self.paused = False
        self.snapshot: dict | None = None
        self.rows: list[JobRow] = []
        self.selected_key: str | None = None
        self.palette = fmt.DEFAULT_PALETTE
        self.errors: dict[str, str] = {}
        self.source_error: str | None = None
        self._dismissed: set[int] = set()
        # The selectable rows of the last redraw (None: none drawn yet), and
        # whether the user chose the selected job after it had exited: the
        # selection then stays on it when a new job starts (jobs.follow_living).
        self._seen_keys: set[str] | None = None
        self._chosen_exited = False
        # The job the view was opened for (`dlwatch demo`'s): selected whenever
        # it is listed, until the user moves the selection.
        self._prefer_key: str | None = f"job:{follow_pid}" if follow_pid is not None else None
        self._drawn: dict | None = None
        self._full_at: float | None = None  # monotonic time of the last full redraw
        self._full_shape: tuple | None = None  # what the screen was laid out for then
        self._partial = False  # the last redraw left the once-a-second panels as they were

    # ------------------------------------------------------------ lifecycle

    def get_default_screen(self) -> Screen:
        return MonitorScreen(id="monitor")

    def _monitor(self) -> MonitorScreen:
        for screen in self.screen_stack:
            if isinstance(screen, MonitorScreen):
                return screen
        raise RuntimeError("monitor screen not mounted")

    def on_mount(self) -> None:
        self.palette = self._theme_palette()
        self.theme_changed_signal.subscribe(self, self._on_theme_changed)
        try:
            self.source.start()
        except Exception as e:  # the screen still explains what is wrong
            self.source_error = f"could not start: {type(e).__name__}: {e}"
        # A source that announces its snapshots (the collector) is drawn as
        # soon as each one is built; the timer then only keeps the status
        # line honest (staleness). Polling alone would add up to one more
        # period between the job and the screen.
        try:
            self.source.subscribe(self._snapshot_ready)
        except Exception:
            pass  # the timer still polls
        self.set_interval(self.interval, self.tick, name="dlwatch-refresh")
        self.tick()

    def _snapshot_ready(self) -> None:
        # Called from the source's thread: post_message is thread-safe.
        try:
            self.post_message(SnapshotReady())
        except Exception:
            pass

    def on_snapshot_ready(self, _message: SnapshotReady) -> None:
        self.tick()

    def on_unmount(self) -> None:
        try:
            self.source.stop()
        except Exception:
            pass

    def _on_theme_changed(self, _theme) -> None:
        self.palette = self._theme_palette()
        self.redraw(full=True)

    def _theme_palette(self) -> fmt.Palette:
        variables = self.get_css_variables()

        def style(name: str, fallback: str) -> str:
            value = variables.get(name, "")
            try:
                Style.parse(value)
            except Exception:
                return fallback
            return value or fallback

        return fmt.Palette(
            good=style("success", "green"),
            warn=style("warning", "yellow"),
            bad=style("error", "red"),
            info=style("primary", "cyan"),
            dim="dim",
            accent=style("primary", "bold"),
        )

    # ------------------------------------------------------------ data flow

    def tick(self) -> None:
        """Timer: take the source's newest snapshot and redraw if it changed."""
        if not self.paused:
            try:
                snap = self.source.latest()
                self.source_error = None
            except Exception as e:
                self.source_error = f"{type(e).__name__}: {e}"
                snap = self.snapshot
            if snap is not None and not isinstance(snap, dict):
                self.source_error = f"not a snapshot: {type(snap).__name__}"
                snap = self.snapshot
            self.snapshot = snap
        if self.snapshot is not self._drawn:
            self.redraw()
        elif (
            self._partial
            and self._full_at is not None
            and time.monotonic() - self._full_at >= FULL_REDRAW_S + self.interval
        ):
            # The source went quiet after a partial redraw (paused, stalled,
            # a job that ended): finish it rather than leave panels behind.
            self.redraw(full=True)
        else:
            self._guard("status", self._draw_status)

    def visible_snapshot(self) -> dict | None:
        snap = self.snapshot
        if snap is None or not self._dismissed:
            return snap
        jobs = [
            j
            for j in fmt.lst(snap.get("jobs"))
            if not (isinstance(j, dict) and j.get("pid") in self._dismissed and job_state(j) != "live")
        ]
        return {**snap, "jobs": jobs}

    def redraw(self, full: bool = False) -> None:
        try:
            screen = self._monitor()
        except RuntimeError:
            return
        if not screen.ready:
            return  # not composed yet; its on_mount redraws
        self._drawn = self.snapshot
        snap = self.visible_snapshot()
        rows = self._guard("jobs", group_jobs, (snap or {}).get("jobs")) or []
        self.rows = rows
        self._fix_selection()
        self._seen_keys = {r.key for r in rows if r.selectable}
        wide = screen.has_class("-wide")
        pal = self.palette
        job = self.selected_job()
        now = time.monotonic()
        # A change of jobs, states, selection or layout is drawn in full at once.
        shape = (
            tuple((r.key, r.state) for r in rows),
            self.selected_key,
            wide,
            pal,
            snap is None,
            len(fmt.lst(job.get("loaders"))) if job else -1,
        )
        if not (
            full or self._full_at is None or now - self._full_at >= FULL_REDRAW_S or shape != self._full_shape
        ):
            self._guard("job list", screen.ref("#jobs", JobList).show, rows, self.selected_key, pal)
            self._guard("job", self._draw_headline, screen, job, pal, wide)
            self._partial = True
            return
        self._full_at, self._full_shape, self._partial = now, shape, False
        self.errors.clear()
        self._guard("job list", screen.ref("#jobs", JobList).show, self.rows, self.selected_key, pal)
        self._guard("job", self._draw_job, screen, snap, job, pal, wide)
        screen.ref("#gpu", GpuPanel).display = snap is not None
        self._guard("gpu", screen.ref("#gpu", GpuPanel).show, snap or {}, pal, wide)
        self._guard("host", self._draw_host, screen, snap, pal, wide)
        pid = fmt.intval(job.get("pid")) if job else None
        host = fmt.s(fmt.d(job).get("host")) or None
        ended = job is not None and job_state(job) == "exited"
        self._guard("hints", screen.ref("#hints", HintsPanel).show, snap, pid, pal, wide, host, ended)
        self._guard("footer", screen.draw_footer)
        # The pane's size follows its new text after the next layout.
        screen.call_after_refresh(self._guard, "hints", screen.draw_hints_title)
        self._guard("status", self._draw_status)

    def _guard(self, what: str, fn: Callable, *args):
        try:
            return fn(*args)
        except Exception as e:
            self.errors[what] = f"{type(e).__name__}: {e}"
            self.log.error(f"dlwatch: drawing {what} failed", exc_info=True)
            return None

    def _draw_status(self) -> None:
        screen = self._monitor()
        set_static(
            screen.ref("#status", TextLine),
            status_text(
                version=self.version,
                snapshot=self.snapshot,
                rows=self.rows,
                interval=self.interval,
                paused=self.paused,
                now=self.clock(),
                time_format=self.time_format,
                pal=self.palette,
                source_error=self.source_error,
                replay=self._replay_status(),
            ),
        )
        error = screen.ref("#error", Static)
        error.display = bool(self.errors)
        if self.errors:
            what, msg = next(iter(self.errors.items()))
            more = f" (+{len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
            set_static(
                error, Text(f"✖ could not draw {what}: {msg}{more}; the rest is live", self.palette.bad)
            )

    def _draw_host(self, screen: MonitorScreen, snap: dict | None, pal: fmt.Palette, wide: bool) -> None:
        host = screen.ref("#host", HostLine)
        host.display = snap is not None
        if snap is not None:
            host.show(snap, pal, wide)

    def _draw_headline(self, screen: MonitorScreen, job: dict | None, pal: fmt.Palette, wide: bool) -> None:
        loaders = [ld for ld in fmt.lst((job or {}).get("loaders")) if isinstance(ld, dict)]
        panels = list(screen.ref("#loaders", Vertical).query_children(LoaderPanel))
        for panel, ld in zip(panels, loaders):
            panel.show_headline(ld, pal, wide)

    def _draw_job(
        self, screen: MonitorScreen, snap: dict | None, job: dict | None, pal: fmt.Palette, wide: bool
    ) -> None:
        header = screen.ref("#job-header", TextLine)
        message = screen.ref("#message", Static)
        loaders_box = screen.ref("#loaders", Vertical)
        screen.ref("#jobs", JobList).display = bool(self.rows)
        if snap is None or job is None:
            header.display = False
            loaders_box.display = False
            message.display = True
            set_static(message, self._empty_message(snap, pal))
            return
        header.display = True
        set_static(header, job_header(job, pal, wide))
        stacks = job.get("stacks")
        loaders = [
            {**ld, "job_stacks": stacks} if stacks and fmt.num(ld.get("stalled_s")) is not None else ld
            for ld in fmt.lst(job.get("loaders"))
            if isinstance(ld, dict)
        ]
        message.display = not loaders
        if not loaders:
            why = no_loader_yet(job)
            if job.get("sampled") is True and fmt.s(job.get("state_reason")):
                why = f"{job['state_reason']} (sampled from outside)"  # what the samples saw
            set_static(message, Text(why, pal.dim))
        loaders_box.display = bool(loaders)
        panels = list(loaders_box.query_children(LoaderPanel))
        # Panels are reused by position: switching jobs updates them in place.
        for panel in panels[len(loaders) :]:
            panel.remove()
        for i, ld in enumerate(loaders):
            if i < len(panels):
                panels[i].show(ld, pal, wide)
            else:
                panel = LoaderPanel(classes="loader")
                panel.show(ld, pal, wide)  # kept until mounted
                loaders_box.mount(panel)

    def _empty_message(self, snap: dict | None, pal: fmt.Palette) -> Text:
        if snap is None:
            if self.source_error:
                return Text(f"no data from the collector: {self.source_error}", pal.bad)
            return Text("waiting for data…", pal.dim)
        if self.is_replay:
            return Text("no job was recorded at this moment of the recording (→ or n moves on)", pal.dim)
        where = self.runtime_dir
        if where is None:
            try:
                from dlwatch.rundir import runtime_dir

                where = runtime_dir()
            except Exception:
                where = "the runtime directory"
        t = Text()
        t.append(f"no jobs found in {where}\n\n", "bold")
        t.append("start a job with ")
        t.append("`import dlwatch.hook`", "bold")
        t.append(" in the training script, or ")
        t.append("`dlwatch run -- python train.py`", "bold")
        t.append("\nthis screen picks it up at its first DataLoader iterator.", pal.dim)
        return t

    def resize_columns(self, width: int) -> None:
        try:
            table = self._monitor().ref("#jobs", JobList)
        except Exception:
            return
        table.fit_command_column(width)

    # ------------------------------------------------------------ selection

    def _fix_selection(self) -> None:
        key = follow_living(
            self.rows, self.selected_key, self._seen_keys, self._chosen_exited, prefer=self._prefer_key
        )
        if key != self.selected_key:
            self.selected_key = key
            self._chosen_exited = False

    def selected_row(self) -> JobRow | None:
        for r in self.rows:
            if r.key == self.selected_key:
                return r
        return None

    def selected_job(self) -> dict | None:
        row = self.selected_row()
        return row.job if row else None

    def _move(self, step: int) -> None:
        keys = [r.key for r in self.rows if r.selectable]
        if not keys:
            return
        i = keys.index(self.selected_key) if self.selected_key in keys else -step
        self.selected_key = keys[(i + step) % len(keys)]
        self._prefer_key = None  # the user's choice from now on
        row = self.selected_row()
        self._chosen_exited = row is not None and job_state(row.job) != "live"
        self._drawn = None  # force a redraw even when paused
        self.redraw(full=True)

    # ------------------------------------------------------------ actions

    def action_next_job(self) -> None:
        self._move(1)

    def action_prev_job(self) -> None:
        self._move(-1)

    def action_toggle_pause(self) -> None:
        if self.is_replay:
            # Replay pauses the playback itself: the display keeps following
            # it, so seeking while paused shows where it lands.
            self._replay_control(lambda r: r.toggle_pause())
            return
        self.paused = not self.paused
        self._guard("status", self._draw_status)
        if not self.paused:
            self.tick()

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen(replay=self.is_replay))

    # ------------------------------------------------------------ replay

    @property
    def is_replay(self) -> bool:
        """The source plays a recording (``ReplaySource``): no job is reachable,
        and the replay keys move through it."""
        return self._replay() is not None

    def _replay(self) -> ReplayControls | None:
        source = self.source
        return source if isinstance(source, ReplayControls) and source.replay is True else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action.startswith("replay_"):
            return self.is_replay
        if action in ("profile", "worker_profile"):
            return not self.is_replay  # a recording has no job to ask
        return True

    def _replay_status(self) -> str | None:
        replay = self._replay()
        if replay is None:
            return None
        try:
            return str(replay.status())
        except Exception as e:
            return f"replay ({type(e).__name__}: {e})"

    def _replay_control(self, control: Callable[[ReplayControls], _R]) -> _R | None:
        replay = self._replay()
        if replay is None:
            return None
        try:
            result = control(replay)
        except Exception as e:
            self.notify(f"replay: {type(e).__name__}: {e}", severity="error")
            return None
        self.tick()
        self._guard("status", self._draw_status)
        return result

    def action_replay_seek(self, seconds: float) -> None:
        self._replay_control(lambda r: r.seek(float(seconds)))

    def action_replay_step(self, lines: int) -> None:
        self._replay_control(lambda r: r.step(int(lines)))

    def action_replay_edge(self, end: int) -> None:
        self._replay_control(lambda r: r.step((1 if end else -1) * (1 << 40)))

    def action_replay_speed(self, factor: float) -> None:
        self._replay_control(lambda r: r.set_speed(float(r.speed) * float(factor)))

    def action_replay_hint(self, direction: int) -> None:
        ids = self._replay_control(lambda r: r.jump_hint(int(direction)))
        if ids is None:
            self.notify(f"no {'later' if direction > 0 else 'earlier'} hint in this recording", timeout=3)
        else:
            self.notify(f"{', '.join(ids)} starts here", title="hint", timeout=3)

    def action_hint_detail(self) -> None:
        if isinstance(self.screen, HintDetailScreen):
            return
        job = self.selected_job()
        pid = fmt.intval(job.get("pid")) if job else None
        host = fmt.s(fmt.d(job).get("host")) or None
        self.push_screen(HintDetailScreen(self.snapshot, pid, self.palette, host))

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """``s``: an SVG of the screen, in the working directory unless told."""
        try:
            path = self.save_screenshot(filename, path=path or os.getcwd())
        except OSError as e:
            self.notify(f"screenshot failed: {e.strerror or e}", severity="error")
            return
        self.notify(f"saved {path}", title="screenshot")

    def action_dismiss_job(self) -> None:
        job = self.selected_job()
        if job is None:
            self.notify("no job selected", severity="warning")
            return
        pid = fmt.intval(job.get("pid"))
        state = job_state(job)
        if state == "live":
            self.notify("only an exited job can be dismissed", severity="warning")
            return
        if pid is None:
            self.notify("this job has no pid to dismiss", severity="warning")
            return
        try:
            self.source.dismiss(pid)
        except Exception as e:
            self.notify(f"dismiss failed: {e}", severity="error")
            return
        self._dismissed.add(pid)
        self.notify(f"dismissed job {pid}")
        self._drawn = None
        self.redraw(full=True)

    def action_profile(self) -> None:
        pid = self._profilable_pid(self.profiler)
        if pid is not None and self.profiler is not None:
            self.push_screen(ProfileScreen(pid, self.profiler))

    def action_worker_profile(self) -> None:
        pid = self._profilable_pid(self.worker_profiler)
        if pid is not None and self.worker_profiler is not None:
            self.push_screen(ProfileScreen(pid, self.worker_profiler, workers=True))

    def action_stacks(self) -> None:
        """``S``: the job's stacks; the live view asks the job for fresh ones."""
        if isinstance(self.screen, StacksScreen):
            return
        job = self.selected_job()
        pid = fmt.intval(job.get("pid")) if job else None
        if job is None or pid is None:
            self.notify("no job selected", severity="warning")
            return
        live = job_state(job) == "live" and not self.is_replay
        stacks = job.get("stacks")
        self.push_screen(
            StacksScreen(pid, stacks if isinstance(stacks, dict) else None, self.stacker if live else None)
        )

    def _profilable_pid(self, runner: Runner | None) -> int | None:
        job = self.selected_job()
        pid = fmt.intval(job.get("pid")) if job else None
        if pid is None:
            self.notify("no job selected", severity="warning")
            return None
        if job_state(job) != "live":
            self.notify("only a live job can be profiled", severity="warning")
            return None
        host = fmt.s(fmt.d(job).get("host"))
        if host in remote_hosts(self.snapshot):
            # The burst goes over this machine's sockets: a job of another node is out of reach.
            self.notify(f"profile it with dlwatch on {host}", severity="warning")
            return None
        if runner is None:
            # A replay, or a view built without a way to reach the jobs.
            self.notify("profiling needs the live view (dlwatch top)", severity="warning")
            return None
        if isinstance(self.screen, ProfileScreen):
            return None
        return pid

    def action_command_palette(self) -> None:
        if isinstance(self.screen, ClosingPalette):
            self.screen._action_escape()
        elif self.use_command_palette and not CommandPalette.is_open(self):
            self.push_screen(ClosingPalette(id="--command-palette"))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        # Ours replace Textual's "Keys" and "Screenshot", which do the same
        # thing differently (a side panel; a file name we do not notify).
        for command in super().get_system_commands(screen):
            if command.title not in ("Keys", "Screenshot"):
                yield command
        for key in palette_keys():
            yield SystemCommand(key.command, key.command_help, getattr(self, key.method))


LIVE_INSTEAD = (
    "for figures in a pipe or a file use `dlwatch snapshot` (text, or --json), "
    "`dlwatch snapshot --follow` (JSON Lines) or `dlwatch record`"
)


def terminal_problem(
    stdin: Any = None, stdout: Any = None, instead: str = LIVE_INSTEAD, term: str | None = None
) -> str | None:
    """Why the live view cannot draw here, or None. It draws a full screen
    and reads keys: into a pipe or a file it would write escape codes until
    killed (a QA run: ``dlwatch > out.txt`` grew forever)."""
    stdin = sys.stdin if stdin is None else stdin
    stdout = sys.stdout if stdout is None else stdout
    for name, stream in (("output", stdout), ("input", stdin)):
        try:
            tty = stream is not None and stream.isatty()
        except (AttributeError, ValueError, OSError):
            tty = False
        if not tty:
            return f"the live view needs a terminal, and its {name} is not one: {instead}"
    term = os.environ.get("TERM", "") if term is None else term
    if term == "dumb":
        # An editor's shell buffer: escape codes would show as text.
        return f"the live view needs a terminal that draws, and TERM is 'dumb' here: {instead}"
    return None


def run_tui(
    source: SnapshotSource,
    interval: float = 0.5,
    profiler: Runner | None = None,
    worker_profiler: Runner | None = None,
    stacker: StacksRunner | None = None,
    follow_pid: int | None = None,
) -> int:
    """Run the TUI until the user quits; the CLI's exit code. ``profiler``
    runs a burst on a job, ``worker_profiler`` a worker profile (the CLI
    passes the collector's; None: no bursts). ``follow_pid``: the job to
    select whenever it is listed (``dlwatch demo``'s own)."""
    problem = terminal_problem()
    if problem is not None:
        print(f"dlwatch: {problem}", file=sys.stderr)
        return 2
    app = DlwatchApp(
        source,
        interval=interval,
        profiler=profiler,
        worker_profiler=worker_profiler,
        stacker=stacker,
        follow_pid=follow_pid,
    )
    app.run()
    return 0 if app.return_code in (None, 0) else int(app.return_code)
