"""One DataLoader of the selected job: data-wait gauge with history, rates,
prefetch queue and the workers table."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.css.query import NoMatches
from textual.widgets import Digits, Static

from dlwatch.snapshot import batch_word, count_of, epoch_start_missing, pipeline_workers_line, workers_word
from dlwatch.tui import fmt
from dlwatch.tui.keyed import set_static
from dlwatch.tui.sparkline import FixedSparkline
from dlwatch.tui.textline import TextLine
from dlwatch.tui.workers import WorkersTable

QUEUE_BAR = 12


def _flag(on: Any) -> str:
    return "✓" if on is True else ("✗" if on is False else "?")


# How a loader's role reads, by the framework that said it.
_ROLES = {
    ("transformers", "eval"): "eval (Trainer)",
    ("transformers", "train"): "train (Trainer)",
    ("lightning", "eval"): "validation (Lightning)",
    ("lightning", "train"): "train (Lightning)",
}


def loader_role(ld: dict) -> str:
    """ "eval (Trainer)", "validation (Lightning)", … where the framework says; else ""."""
    role, fw = fmt.s(ld.get("role")), fmt.s(ld.get("framework"))
    if not role and fw == "accelerate":
        return "Accelerate"
    return _ROLES.get((fw, role), role)


def loader_title(ld: dict, pal: fmt.Palette) -> Text:
    nw = fmt.intval(ld.get("num_workers"))
    parts: list[Text | str] = [Text(f"loader {fmt.count(ld.get('id'))}", "bold")]
    role = loader_role(ld)
    if role:
        # The framework says which loader is which: an evaluation's pauses are not training's.
        parts.append(Text(role, f"bold {pal.info}"))
    kind = fmt.s(ld.get("kind"))
    if kind:
        parts.append(kind)
    ds = fmt.s(ld.get("dataset"))
    if ds:
        parts.append(ds)
    lib, cls = fmt.s(ld.get("library")), fmt.s(ld.get("loader_class"))
    if (lib and lib != "torch") or cls:
        # The class the script builds (litdata's StreamingDataLoader, an
        # Accelerate shard): the name the user looks for in their code.
        parts.append(Text(cls or lib, pal.info))
    fd = ld.get("feeder")
    if ld.get("loop_role") == "stage":
        parts.append(Text(f"stage of loader {fmt.count(ld.get('nested_in'))}", pal.dim))
    elif isinstance(fd, dict):
        # The loop takes from a feeder thread: the gauge is the loop's wait
        # where the hand-over was found, else n/a (the feeder's is its own).
        how = "fed by" if isinstance(ld.get("consumer"), dict) else "feeder"
        parts.append(Text(f"{how} thread {fmt.s(fd.get('thread')) or '?'}", pal.dim))
    parts.append(f"{fmt.count(nw)} workers" if nw != 1 else "1 worker")
    parts.append(f"batch {batch_word(ld)}")
    knobs = ld.get("knobs")
    if lib and lib not in ("torch", "monai") and isinstance(knobs, dict):
        # A pipeline's own settings, in its own names, not a DataLoader's (a
        # QA run read "pin off, persistent off" on a torchdata.nodes graph).
        parts.extend(f"{k}={v}" for k, v in knobs.items())
    elif ld.get("pin_memory") is not None:  # None: not a DataLoader (a watched loop)
        parts.append(f"pin {_flag(ld.get('pin_memory'))}")
        parts.append(f"persistent {_flag(ld.get('persistent_workers'))}")
        if nw:
            parts.append(f"prefetch {fmt.count(ld.get('prefetch_factor'))}")
    sm = fmt.s(ld.get("start_method"))
    if sm:
        parts.append(sm)
    if ld.get("active") is False:
        parts.append(Text("idle (no iterator)", pal.dim))
    elif ld.get("epoch_open") is False:
        parts.append(Text("idle (its epoch finished)", pal.dim))
    return fmt.join(parts, pal=pal)


def loader_stats(ld: dict, pal: fmt.Palette, wide: bool) -> Text:
    """The rates line; the epoch figures are on ``epoch_stats``'s line below
    in both layouts, so that neither is cut (at 80 columns the epoch ended
    this line and was cut: "· epoch 6 (s…")."""
    if ld.get("sampled") is True:
        return sampled_stats(ld, pal)
    parts: list[Text | str] = [
        Text.assemble((fmt.rate(ld.get("batches_per_s")), "bold"), " batch/s"),
        f"wait {fmt.ms(ld.get('wait_ms_mean'))}",
        f"step {fmt.ms(ld.get('step_ms_mean'))}",
    ]
    cover = window_note(ld)
    if cover:
        parts.append(Text(cover, pal.dim))
    reason = fmt.s(ld.get("no_batch_reason"))
    if fmt.num(ld.get("data_wait_fraction")) is None and reason:
        # Why the gauge reads n/a: a window without a batch is no figure, not 0 %.
        parts.append(Text(reason, pal.warn))
    if wide:
        parts.append(worker_time(ld))
    return fmt.join(parts, pal=pal)


def worker_time(ld: dict) -> str:
    """One batch's fetch time in a worker, or why there is none (never "n/a/batch")."""
    v = fmt.num(ld.get("worker_ms_per_batch"))
    if v is not None:
        return f"worker {fmt.ms(v)}/batch"
    if fmt.intval(ld.get("num_workers")) == 0:
        return f"worker time n/a ({workers_word(ld)}=0)"
    return "worker time n/a (no fetch timed in the window)"


# Why an epoch figure is missing: the loader has not got that far.
_EPOCH_NA = {
    "epoch_ms_last": "n/a (no epoch finished yet)",
}


def _no_workers_why(ld: dict, nw: int | None) -> str:
    """Why a loader lists no workers."""
    if nw == 0:
        feeder = ld.get("feeder") if isinstance(ld.get("consumer"), dict) else None
        if isinstance(feeder, dict) and feeder.get("thread"):
            return f"num_workers=0: thread '{feeder.get('thread')}' loads every batch, the loop takes them"
        return f"{workers_word(ld)}=0: the training loop loads every batch itself"
    if nw is None:
        return "workers: n/a (the job did not report num_workers)"
    if ld.get("active") is False:
        return f"workers: none now (num_workers={nw}: they exit with the loader's iterator)"
    return f"workers: none yet (num_workers={nw}: starting with the first batch)"


def _or_why(ld: dict, key: str) -> str:
    v = fmt.num(ld.get(key))
    if v is None and key == "epoch_start_ms_last":
        return epoch_start_missing(ld)
    return fmt.ms(v) if v is not None else _EPOCH_NA[key]


# What a figure only the hook measures reads for an attached job.
NOT_SAMPLED = "n/a (attached: sampled)"


def sampled_stats(ld: dict, pal: fmt.Palette) -> Text:
    """An attached job's rates line: the data wait's ± and sample count, and
    what sampling cannot give."""
    pm = fmt.num(ld.get("data_wait_pm"))
    parts: list[Text | str] = [
        Text.assemble(
            ("data wait ", "bold"),
            f"{fmt.pct(ld.get('data_wait_fraction'))}" + ("" if pm is None else f" ± {pm * 100:.0f}"),
        ),
        f"{fmt.count(ld.get('data_wait_samples'))} samples over {fmt.duration(ld.get('window_s'))}",
        Text(f"batch/s, wait, step, epoch: {NOT_SAMPLED}", pal.dim),
    ]
    return fmt.join(parts, pal=pal)


def _last_epoch_batches(ld: dict) -> str:
    """The last finished epoch's own count, ", 46 batches" (``epoch_batches``)."""
    counts = fmt.lst(ld.get("epoch_batches"))
    n = fmt.intval(counts[-1]) if counts else None
    return "" if n is None else f", {count_of(n, 'batch')}"


def epoch_stats(ld: dict, pal: fmt.Palette, wide: bool = True) -> Text:
    """The epoch line. Compact (80 columns): the same figures in fewer words,
    "epoch 6 · start 1.2 s · last 26 s, 46 batches · 144 batches in all",
    so that the last epoch's figures fit."""
    if ld.get("sampled") is True:
        return Text(f"epoch, epoch start, batches: {NOT_SAMPLED}: only the hook counts batches", pal.dim)
    start, last = ("epoch start", "last epoch") if wide else ("start", "last")
    return fmt.join(
        [
            f"epoch {fmt.count(ld.get('epoch'))}",
            f"{start} {_or_why(ld, 'epoch_start_ms_last')}",
            f"{last} {_or_why(ld, 'epoch_ms_last')}" + _last_epoch_batches(ld),
            # The running total, said as such (issue 43: "last epoch 26 s · 144
            # batches" read as that epoch's count).
            f"{count_of(fmt.count(ld.get('batches_total')), 'batch')} in all",
        ],
        pal=pal,
    )


def window_note(ld: dict) -> str:
    """What the rate figures cover, when the collector says: a slow job's
    window stretches to five batches, so "over 10 s · 5 batches"."""
    span, n = fmt.num(ld.get("window_s")), fmt.intval(ld.get("window_batches"))
    if span is None or n is None:
        return ""
    return f"over {span:.0f} s · {n} batch{'es' if n != 1 else ''}"


def hang_text(ld: dict, pal: fmt.Palette) -> Text:
    """A stall (red) with where each process of it is stuck, and the workers
    that died (docs/hangs.md). Empty for a healthy loader."""
    from dlwatch.diagnose.hang import death_line, stall_line

    t = Text()
    stall = stall_line(ld)
    if stall:
        t.append(stall, f"bold {pal.bad}")
        stacks = fmt.d(ld.get("job_stacks"))
        for e in fmt.lst(stacks.get("summary")):
            if not isinstance(e, dict):
                continue
            lid = fmt.intval(e.get("loader_id"))
            if e.get("role") == "worker" and lid != fmt.intval(ld.get("id")):
                continue
            t.append(
                "\n  " + fmt.s(e.get("line")), pal.bad if e.get("kind") not in (None, "idle") else pal.dim
            )
        if not stacks:
            t.append("\n  stacks: being gathered (S asks again)", pal.dim)
    for d in fmt.lst(ld.get("worker_deaths")):
        if isinstance(d, dict):
            t.append(("\n" if t else "") + "✖ " + death_line(d), pal.bad)
    err = fmt.s(ld.get("last_error"))
    if err:
        t.append(("\n" if t else "") + "the loader raised " + fmt.truncate(err, 200), pal.warn)
    return t


def queue_line(ld: dict, pal: fmt.Palette) -> Text:
    q = fmt.d(ld.get("queue"))
    ready, flight, cap = q.get("ready"), q.get("in_flight"), q.get("capacity")
    t = Text("queue ", "bold")
    capacity = fmt.intval(cap)
    if capacity is None or capacity <= 0:
        if ld.get("sampled") is True:
            t.append(f"{NOT_SAMPLED}: the prefetch queue is only read by the hook", pal.dim)
        elif fmt.intval(ld.get("num_workers")) == 0:
            t.append(f"n/a ({workers_word(ld)}=0: the loop loads each batch itself)", pal.dim)
        elif ld.get("active") is False:
            t.append("n/a (no iterator: the queue lives while an epoch runs)", pal.dim)
        else:
            t.append("n/a (not reported by the job yet)", pal.dim)
        return t
    t.append_text(fmt.queue_bar(ready, flight, cap, QUEUE_BAR, pal))
    t.append(f" {fmt.count(ready)} ready █ · {fmt.count(flight)} in flight ▒ / {fmt.count(cap)}")
    return t


def autotune_line(ld: dict, pal: fmt.Palette) -> Text | None:
    """What `dlwatch run --autotune` did to this loader (None: it is off)."""
    at = ld.get("autotune")
    if not isinstance(at, dict):
        return None
    t = Text("autotune ", "bold")
    state = fmt.s(at.get("state"), "?")
    cur, orig = fmt.d(at.get("current")), fmt.d(at.get("original"))
    t.append(state, pal.info if state != "left alone" else pal.dim)
    if state == "left alone":
        t.append(f": {fmt.s(at.get('reason'))}", pal.dim)
        return t
    t.append(
        f" · num_workers {fmt.count(orig.get('num_workers'))} → {fmt.count(cur.get('num_workers'))}"
        f" · prefetch_factor {fmt.count(cur.get('prefetch_factor'))}"
    )
    paces = [p for p in fmt.lst(at.get("epoch_batches_per_s")) if fmt.num(p) is not None]
    if len(paces) >= 2 and paces[0] > 0:
        t.append(f" · last epoch {fmt.rate(paces[-1])} batches/s ({paces[-1] / paces[0]:.2f}× the first)")
    changes = [c for c in fmt.lst(at.get("changes")) if isinstance(c, dict)]
    if changes:
        t.append(f" · {len(changes)} change{'s' if len(changes) != 1 else ''}", pal.dim)
    return t


class WaitGauge(Horizontal):
    """Headline: share of the loop's time spent waiting for data."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._digits = Digits("", id="wait-digits")
        self._label = TextLine(id="wait-label")
        self._spark = FixedSparkline(top=100.0, id="wait-history")
        self._axis = TextLine(id="wait-axis")

    @property
    def ready(self) -> bool:
        return self._axis.is_mounted

    def compose(self) -> ComposeResult:
        yield self._digits
        yield self._label
        with Vertical(id="wait-graph"):
            yield self._spark
            yield self._axis

    def show(self, ld: dict, pal: fmt.Palette, wide: bool, history: bool = True) -> None:
        frac = fmt.num(ld.get("data_wait_fraction"))
        level = fmt.wait_level(frac)
        style = pal.level(level) if level else pal.dim
        digits = self._digits
        value = "--" if frac is None else f"{frac * 100:.0f}"
        if digits.value != value:
            digits.update(value)
        for lv in (fmt.GOOD, fmt.WARN, fmt.BAD):
            digits.set_class(level == lv, f"-{lv}")
        label = Text()
        if wide:
            label.append("% waiting\n", "bold")
            label.append("for data\n", "bold")
        else:
            label.append("DATA WAIT ", "bold")
            label.append(f"{fmt.pct(frac):>5}", f"bold {style}")
            label.append(" ")
        label.append(fmt.LEVEL_LABEL[level] if level else "n/a", f"bold {style}")
        label.append(" ")
        set_static(self._label, label)
        if not history:
            return  # the history moves once a second: drawn with the rest of the screen
        spark = self._spark
        points = [fmt.num(v) for v in fmt.lst(fmt.d(ld.get("history")).get("data_wait_fraction"))]
        percents = [None if v is None else v * 100 for v in points]
        spark.set_values(percents, lambda v: pal.level(fmt.wait_level(v / 100) or "") or "", pal)
        set_static(self._axis, Text("history, 1 sample/s, fixed scale 0–100 %", pal.dim))


class LoaderPanel(Vertical):
    """Shows one loader dict; keeps the last one so it can (re)draw once its
    children exist (a freshly mounted panel has none yet)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._pending: tuple[dict, fmt.Palette, bool] | None = None
        self._composed = False
        # Kept as attributes: looking them up on every refresh costs more than drawing them.
        self._title = TextLine(id="loader-title", classes="line")
        self._gauge = WaitGauge(id="wait-gauge")
        self._stats = TextLine(id="loader-stats", classes="line")
        self._epochs = TextLine(id="loader-epochs", classes="line")
        self._queue = TextLine(id="loader-queue", classes="line")
        self._autotune = TextLine(id="loader-autotune", classes="line")
        self._hang = Static(id="loader-hang")
        self._table = WorkersTable(id="workers")
        self._no_workers = TextLine(id="no-workers", classes="line")
        self._notes = Static(id="worker-notes")

    def compose(self) -> ComposeResult:
        yield from (
            self._title,
            self._hang,
            self._gauge,
            self._stats,
            self._epochs,
            self._queue,
            self._autotune,
            self._table,
            self._no_workers,
            self._notes,
        )

    def on_mount(self) -> None:
        self._composed = True
        if self._pending:
            self.show(*self._pending)

    def show(self, ld: Any, pal: fmt.Palette, wide: bool = False) -> None:
        ld = dict(fmt.d(ld))
        self._pending = (ld, pal, wide)
        if not self._composed:
            return
        try:
            self._apply(ld, pal, wide)
        except NoMatches:
            # A grandchild (the gauge's parts) can still be mounting right
            # after this panel was mounted; draw again once it is there.
            self.call_after_refresh(self._retry)

    def show_headline(self, ld: Any, pal: fmt.Palette, wide: bool) -> None:
        """Only what moves with every snapshot: data wait, rates, queue."""
        ld = fmt.d(ld)
        if self._pending is not None:
            # A full draw still to come (this panel or its gauge is mounting,
            # a retry is queued) must draw this figure, not the older one it
            # was given: the app counts this snapshot as drawn. The full
            # draw's own keys (job_stacks) stay.
            self._pending = ({**self._pending[0], **ld}, pal, wide)
        if not self._composed or not self._gauge.ready:
            return
        self._headline(ld, pal, wide, history=False)

    def _headline(self, ld: dict, pal: fmt.Palette, wide: bool, history: bool) -> None:
        self._gauge.show(ld, pal, wide, history)
        set_static(self._stats, loader_stats(ld, pal, wide))
        set_static(self._epochs, epoch_stats(ld, pal, wide))
        set_static(self._queue, queue_line(ld, pal))

    def _retry(self) -> None:
        if self._pending and self.is_attached:
            self.show(*self._pending)

    def _apply(self, ld: dict, pal: fmt.Palette, wide: bool) -> None:
        if not self._gauge.ready:
            raise NoMatches("the gauge is still mounting")
        set_static(self._title, loader_title(ld, pal))
        hang = hang_text(ld, pal)
        self._hang.display = bool(hang)
        set_static(self._hang, hang)
        self._headline(ld, pal, wide, history=True)
        at = autotune_line(ld, pal)
        self._autotune.display = at is not None
        if at is not None:
            set_static(self._autotune, at)
        workers = [w for w in fmt.lst(ld.get("workers")) if isinstance(w, dict)]
        table = self._table
        table.show(workers, pal)
        table.display = bool(workers)
        no_workers = self._no_workers
        no_workers.display = not workers
        if not workers:
            nw = fmt.intval(ld.get("num_workers"))
            # A pipeline's own workers (nodes', Grain's threads) are listed
            # as the snapshot text lists them (a QA run: "none yet" after
            # 1519 batches while the snapshot named both threads).
            pw = pipeline_workers_line(ld)
            set_static(no_workers, Text(pw if pw is not None else _no_workers_why(ld, nw), pal.dim))
        notes = Text()
        for w in workers:
            err = fmt.s(w.get("error"))
            if err:
                if notes:
                    notes.append("\n")
                notes.append(f"! worker {fmt.count(w.get('id'))}: {err}", pal.warn)
        set_static(self._notes, notes)
        self._notes.display = bool(notes)
