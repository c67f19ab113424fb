"""The job list: one row per job, ranks of one torchrun run grouped under an
aggregate row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dlwatch.snapshot import run_key
from dlwatch.tui import fmt
from dlwatch.tui.linetable import Column, LineTable


def job_key(job: Any, index: int) -> str:
    pid = fmt.intval(fmt.d(job).get("pid"))
    # Two nodes of `dlwatch --host` may run the same PIDs: the host is part of the key.
    host = fmt.s(fmt.d(job).get("host"))
    where = f"{host}:" if host else ""
    # A job without a pid (malformed) still gets a stable-enough row.
    return f"job:{where}{pid}" if pid is not None else f"job:?{index}"


def remote_hosts(snapshot: Any) -> set[str]:
    """The other nodes of a ``dlwatch --host`` view (none on one machine)."""
    return {
        fmt.s(h.get("host"))
        for h in fmt.lst(fmt.d(snapshot).get("hosts"))
        if isinstance(h, dict) and not h.get("local")
    }


def primary_loader(job: Any) -> dict:
    """The loader that stands for the job in one-line summaries: the one
    moving the most batches (the training loader, not an idle validation one)."""
    loaders = [ld for ld in fmt.lst(fmt.d(job).get("loaders")) if isinstance(ld, dict)]
    if not loaders:
        return {}
    return max(loaders, key=lambda ld: fmt.num(ld.get("batches_per_s")) or -1.0)


def job_wait(job: Any) -> float | None:
    """The job's data wait in one figure: the loop's where it takes from
    several loaders at once (zip: the sum of their parts, the job's
    ``loops``), else its primary loader's."""
    ld = primary_loader(job)
    for loop in fmt.lst(fmt.d(job).get("loops")):
        if isinstance(loop, dict) and ld.get("id") in fmt.lst(loop.get("loaders")):
            return fmt.num(loop.get("data_wait_fraction"))
    return fmt.num(ld.get("data_wait_fraction"))


def stalled(job: Any) -> bool:
    """Some loader of the job has delivered no batch past its stall threshold."""
    return any(
        isinstance(ld, dict) and fmt.num(ld.get("stalled_s")) is not None
        for ld in fmt.lst(fmt.d(job).get("loaders"))
    )


def job_state(job: Any) -> str:
    return fmt.s(fmt.d(job).get("state"), "live") or "live"


@dataclass
class JobRow:
    key: str
    kind: str  # "run" (aggregate of ranks) or "job"
    jobs: list[dict] = field(default_factory=list)
    index: int = 0  # position of the job in the snapshot (for key of pid-less jobs)
    run_id: str = ""
    world_size: int | None = None

    @property
    def job(self) -> dict:
        return self.jobs[0] if self.jobs else {}

    @property
    def selectable(self) -> bool:
        return self.kind == "job"

    @property
    def data_wait(self) -> float | None:
        """The job's figure; for a run, its slowest rank's (the one every rank
        waits for at the collective), not a mean that hides it."""
        slowest = self.slowest
        return None if slowest is None else job_wait(slowest)

    @property
    def slowest(self) -> dict | None:
        """The job whose loader waits the most (None: no figure anywhere)."""
        best, best_v = None, None
        for j in self.jobs:
            v = job_wait(j)
            if v is not None and (best_v is None or v > best_v):
                best, best_v = j, v
        return best

    @property
    def data_wait_mean(self) -> float | None:
        """The mean wait of a run's ranks: beside the slowest's, it says how
        much the slowest stands out."""
        vals = [v for j in self.jobs if (v := job_wait(j)) is not None]
        return sum(vals) / len(vals) if vals else None

    @property
    def batches_per_s(self) -> float | None:
        vals = [v for j in self.jobs if (v := fmt.num(primary_loader(j).get("batches_per_s"))) is not None]
        return sum(vals) if vals else None

    @property
    def state(self) -> str:
        if any(job_state(j) == "live" and stalled(j) for j in self.jobs):
            return "STALLED"
        states = {job_state(j) for j in self.jobs}
        if len(states) == 1:
            return states.pop()
        return "live" if "live" in states else "mixed"


def group_jobs(jobs: Any) -> list[JobRow]:
    """Rows in display order: jobs in snapshot order, except that ranks of one
    run (same run_id and master, world_size > 1) follow their aggregate row,
    by rank."""
    rows: list[JobRow] = []
    runs: dict[tuple[str, str, int], JobRow] = {}
    members: dict[str, list[tuple[int, dict]]] = {}
    for i, job in enumerate(fmt.lst(jobs)):
        if not isinstance(job, dict):
            continue
        rk = run_key(job)
        ws = fmt.intval(job.get("world_size"))
        if rk is not None and ws and ws > 1:
            run_id, master = rk
            gk = (run_id, master, ws)
            if gk not in runs:
                key = f"run:{run_id}:{ws}" + (f"@{master}" if master else "")
                runs[gk] = JobRow(key=key, kind="run", run_id=run_id, world_size=ws)
                rows.append(runs[gk])
                members[key] = []
            members[runs[gk].key].append((i, job))
        else:
            rows.append(JobRow(key=job_key(job, i), kind="job", jobs=[job], index=i))
    out: list[JobRow] = []
    for row in rows:
        out.append(row)
        if row.kind == "run":
            ranked = sorted(
                members[row.key],
                key=lambda m: (fmt.intval(m[1].get("rank")) is None, fmt.intval(m[1].get("rank")) or 0),
            )
            row.jobs = [j for _, j in ranked]
            for i, j in ranked:
                out.append(
                    JobRow(
                        key=job_key(j, i),
                        kind="job",
                        jobs=[j],
                        index=i,
                        run_id=row.run_id,
                        world_size=row.world_size,
                    )
                )
    return out


def follow_living(
    rows: list[JobRow],
    selected_key: str | None,
    seen: set[str] | None,
    chosen_exited: bool,
    prefer: str | None = None,
) -> str | None:
    """The row to select once ``rows`` replace the rows whose selectable keys
    were ``seen`` (None: the first rows of the view).

    ``prefer``: the job the view was opened for (``dlwatch demo``'s own job),
    selected whenever it is in the list, however many other jobs run or
    start; the app drops it once the user moves the selection.

    Otherwise the selection stays where it is, whatever starts beside it,
    except that a selected job that has exited (not one stalled or out of
    reach for now) gives way to a job that has just started (the first new
    live one, in display order), unless the user chose the exited job after
    it had exited (``chosen_exited``): a restarted script is what the view
    follows. A selection that is gone, or none yet, falls to the first live
    job, else the first job.
    """
    jobs = [r for r in rows if r.selectable]
    keys = [r.key for r in jobs]
    if prefer is not None and prefer in keys:
        return prefer
    live = [r.key for r in jobs if job_state(r.job) == "live"]
    if selected_key not in keys:
        return live[0] if live else (keys[0] if keys else None)
    selected = next(r for r in jobs if r.key == selected_key)
    if job_state(selected.job) != "exited" or chosen_exited or seen is None:
        return selected_key
    new = [k for k in live if k not in seen]
    return new[0] if new else selected_key


STATE_STYLE = {"live": "good", "exited": "dim", "unreachable": "warn", "mixed": "warn", "STALLED": "bad"}


class JobList(LineTable):
    """Rows are never focused by the user directly: the app moves the cursor
    (tab/j/k) so that the same keys work whatever has focus."""

    COLUMNS = ("job", "command", "state", "wait", "batch/s")
    WIDTHS = {"job": 14, "command": 30, "state": 8, "wait": 9, "batch/s": 7}

    def __init__(self, **kwargs) -> None:
        super().__init__(
            [Column(c, c, self.WIDTHS[c], "right" if c == "batch/s" else "left") for c in self.COLUMNS],
            cursor=True,
            **kwargs,
        )
        self.rows_model: list[JobRow] = []

    def on_mount(self) -> None:
        self.fit_command_column(self.app.size.width)

    def fit_command_column(self, screen_width: int) -> None:
        """Give the command column whatever the fixed columns leave."""
        fixed = sum(c.width for c in self.columns if c.key != "command")
        padding = 2 * len(self.columns)
        self.set_column_width("command", max(12, screen_width - fixed - padding - 2))

    def show(self, rows: list[JobRow], selected_key: str | None, pal: fmt.Palette) -> None:
        self.rows_model = rows
        self.set_rows([(r.key, self._cells(r, pal)) for r in rows], cursor_key=selected_key)

    def _cells(self, row: JobRow, pal: fmt.Palette) -> list:
        # Plain strings and (text, style) runs: see linetable.Cell.
        job = row.job
        if row.kind == "run":
            n = len(row.jobs)
            label = f"▾ run ×{n}"
            if row.world_size and n != row.world_size:
                label += f"/{row.world_size}"
            label_cell: tuple | str = ((label, "bold"),)
            cmd = f"{row.run_id} · "
            hosts = sorted({fmt.s(j.get("host")) for j in row.jobs} - {""})
            if hosts:
                # Across nodes: where the slowest rank runs and the mean beside
                # its wait, first, so that 80 columns still show them.
                where = fmt.s(fmt.d(row.slowest).get("host"))
                mean = fmt.pct(row.data_wait_mean)
                cmd = f"slowest on {where or fmt.NA} · mean {mean} · {len(hosts)} hosts · " + cmd
            cmd = fmt.truncate(cmd + fmt.short_command(job.get("cmdline")), 200)
            slowest = fmt.intval(fmt.d(row.slowest).get("rank"))
            # The slowest rank's wait, named: "r1 38%".
            wait_prefix = f"r{slowest} " if slowest is not None else ""
        else:
            pid = fmt.intval(job.get("pid"))
            rank = fmt.intval(job.get("rank"))
            if row.run_id:
                label_cell = f"  r{rank if rank is not None else '?'} {pid if pid is not None else '?'}"
            else:
                label_cell = str(pid) if pid is not None else fmt.NA
            cmd = fmt.short_command(job.get("cmdline"))
            if fmt.s(job.get("host")):
                cmd = f"[{fmt.s(job.get('host'))}] " + cmd
            if job.get("sampled") is True:
                cmd = "[sampled] " + cmd
            wait_prefix = ""
        state = row.state
        wait = row.data_wait
        level = fmt.wait_level(wait)
        wait_text = wait_prefix + fmt.pct(wait)
        if level in (fmt.WARN, fmt.BAD):
            wait_text += " " + fmt.LEVEL_LABEL[level][0]  # ▲/✖ so severity survives NO_COLOR
        return [
            label_cell,
            cmd,
            ((state, pal.level(STATE_STYLE.get(state, "dim")) or pal.dim),),
            ((wait_text, pal.level(level) if level else pal.dim),),
            fmt.rate(row.batches_per_s),
        ]
