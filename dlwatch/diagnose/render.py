"""Plain-text rendering of hints for ``dlwatch snapshot`` (no colour, no width
assumptions beyond a readable indent)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

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
