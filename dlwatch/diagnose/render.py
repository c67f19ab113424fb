"""Plain-text rendering of hints for ``dlwatch snapshot`` (no colour, no width
assumptions beyond a readable indent)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dlwatch.snapshot import as_int, find_job, records

# Evidence keys worth a line in text output, most telling first; the rest are
# in the JSON output. Keeps a hint to three or four lines on an 80-column screen.
KEY_EVIDENCE = (
    "recommended_num_workers",
    "worker_ms_per_batch",
    "step_ms_mean",
    "data_wait_fraction",
    "usable_cores",
    "cpu_bound_reason",
    "busy_workers",
    "main_loops",
    "threads_per_worker",
    "total_worker_threads",
    "epoch_start_ms_median",
    "epoch_ms_median",
    "slope_mib_per_min_per_worker",
    "shm_free_bytes",
    "shm_needed_bytes",
    "main_thread_cpu_percent",
    "gpu_util_percent",
)
MAX_EVIDENCE_ITEMS = 5

TAGS = {"critical": "CRIT", "warn": "WARN", "info": "INFO"}


def _fmt(key: str, v) -> str:
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / (1 << 20):.0f} MiB"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def _where(h: Mapping) -> str:
    parts = []
    if h.get("job_pid") is not None:
        parts.append(f"pid {h['job_pid']}")
    if h.get("loader_id") is not None:
        parts.append(f"loader {h['loader_id']}")
    return f" ({', '.join(parts)})" if parts else ""


def format_hints(hints: Iterable[Mapping]) -> str:
    """One block per hint: ``[WARN] id (pid, loader): message``, ``→ suggestion``,
    and up to five key evidence figures. Empty input gives a one-line all-clear."""
    blocks = []
    for h in hints:
        tag = TAGS.get(h.get("severity"), str(h.get("severity", "?")).upper())
        lines = [
            f"[{tag}] {h.get('id')}{_where(h)}: {h.get('message', '')}",
            f"    → {h.get('suggestion', '')}",
        ]
        ev = h.get("evidence") or {}
        items = [f"{k}={_fmt(k, ev[k])}" for k in KEY_EVIDENCE if ev.get(k) is not None]
        if items:
            lines.append("    evidence: " + ", ".join(items[:MAX_EVIDENCE_ITEMS]))
        blocks.append("\n".join(lines))
    if not blocks:
        return "No hints: nothing in the input pipeline needs attention."
    return "\n".join(blocks)


# Hints whose advice is a DataLoader setting `dlwatch tune` can measure.
TUNABLE_HINTS = frozenset(
    {"no-workers", "add-workers", "io-bound", "pipeline-has-headroom", "enable-persistent-workers"}
)


def tune_command(job: Mapping, config: Mapping) -> str | None:
    """The ``dlwatch tune`` command line that measures ``config`` against the
    job's own settings on the job's own command (None without a command).
    ``config``: ``num_workers`` (the recommended count) and ``current`` (the
    loader's count now); without a count, the guided search (which tries
    persistent_workers and prefetch_factor itself)."""
    cmdline = job.get("cmdline")
    if not isinstance(cmdline, str) or not cmdline.strip():
        return None
    opts = ""
    rec, cur = config.get("num_workers"), config.get("current")
    if isinstance(rec, int) and isinstance(cur, int) and rec != cur:
        opts = f" --workers {','.join(str(n) for n in sorted({cur, rec}))}"
    if is_notebook_kernel(cmdline):
        # The tuner re-runs a command; a kernel's command line re-runs nothing.
        return f"%dlwatch tune{opts} train.py"
    return f"dlwatch tune{opts} -- {cmdline.strip()}"


def is_notebook_kernel(cmdline: str) -> bool:
    """A Jupyter kernel's command line (``python -m ipykernel_launcher -f ...``)."""
    return "ipykernel_launcher" in cmdline or "ipykernel.kernelapp" in cmdline


def with_tune_command(h: dict, snapshot: Mapping) -> dict:
    """``h`` with its suggestion ending in the command that verifies it."""
    if h.get("id") not in TUNABLE_HINTS or not isinstance(snapshot, Mapping):
        return h
    job = find_job(snapshot, h.get("job_pid"))
    if job is None:
        return h
    ev = h.get("evidence") or {}
    loader = next((ld for ld in records(job.get("loaders")) if ld.get("id") == h.get("loader_id")), {})
    cmd = tune_command(
        job, {"num_workers": ev.get("recommended_num_workers"), "current": as_int(loader.get("num_workers"))}
    )
    if cmd is None:
        return h
    where = " with the loop saved as train.py" if cmd.startswith("%") else ""
    return dict(h, suggestion=f"{h.get('suggestion', '')}; verify with `{cmd}`{where}")
