"""Hints in words: the plain text of ``dlwatch snapshot`` (no colour, no
width assumptions beyond a readable indent), and the one rendering of a
hint's evidence that the text, the TUI and the HTML report share."""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Iterable, Mapping
from typing import Any

from dlwatch.snapshot import NA, as_int, find_job, records

# Evidence keys worth a place in a few lines of text, most telling first (the
# text and the report put them first; the rest follow in the rule's order).
# Keeps a hint to three or four lines on an 80-column screen.
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
    "autograd_cpu_percent",
    "gpu_util_percent",
)
MAX_EVIDENCE_ITEMS = 5

TAGS = {"critical": "CRIT", "warn": "WARN", "info": "INFO"}


def evidence_value(key: str, v: Any) -> str:
    """One evidence figure for people: sizes in MiB, floats to three
    significant digits, yes/no; a list or a record as JSON."""
    if v is None:
        return NA
    if isinstance(v, bool):
        return "yes" if v else "no"
    if key.endswith("_bytes") and isinstance(v, (int, float)):
        return f"{v / (1 << 20):.0f} MiB"
    if isinstance(v, float):
        if v.is_integer() and abs(v) < 1e12:
            return str(int(v))
        return f"{v:.0f}" if abs(v) >= 100 else f"{v:.3g}"
    if isinstance(v, (int, str)):
        return str(v)
    try:
        return json.dumps(v, separators=(", ", ": "), default=str)
    except (TypeError, ValueError):
        return NA


def evidence_items(
    ev: Any,
    limit: int | None = None,
    *,
    first: Iterable[str] = (),
    compact: bool = False,
    missing: bool = False,
) -> list[tuple[str, str]]:
    """(key, figure) pairs of a hint's evidence: the keys in ``first`` that it
    has, then the rest in the rule's order; at most ``limit``. ``compact``:
    one line's worth, without lists and records; ``missing``: figures the
    rule could not measure too (n/a)."""
    if not isinstance(ev, Mapping):
        return []
    keys = [k for k in first if k in ev]
    keys += [k for k in ev if k not in keys]
    out = []
    for k in keys:
        v = ev[k]
        if (v is None and not missing) or (compact and isinstance(v, (list, dict))):
            continue
        out.append((str(k), evidence_value(str(k), v)))
    return out[:limit]


def evidence_text(ev: Any, limit: int | None = None, first: Iterable[str] = ()) -> str:
    """``k=v, k=v`` for one line; "…" at the end when items were left out."""
    items = evidence_items(ev, first=first, compact=True)
    out = ", ".join(f"{k}={v}" for k, v in items[:limit])
    return out + (", …" if limit is not None and len(items) > limit else "")


def _where(h: Mapping[str, Any]) -> str:
    parts = []
    if h.get("job_pid") is not None:
        parts.append(f"pid {h['job_pid']}")
    if h.get("loader_id") is not None:
        parts.append(f"loader {h['loader_id']}")
    return f" ({', '.join(parts)})" if parts else ""


def format_hints(hints: Iterable[Mapping[str, Any]]) -> str:
    """One block per hint: ``[WARN] id (pid, loader): message``, ``→ suggestion``,
    and up to five key evidence figures. Empty input gives a one-line all-clear."""
    blocks = []
    for h in hints:
        tag = TAGS.get(str(h.get("severity")), str(h.get("severity", "?")).upper())
        lines = [
            f"[{tag}] {h.get('id')}{_where(h)}: {h.get('message', '')}",
            f"    → {h.get('suggestion', '')}",
        ]
        ev = evidence_text(h.get("evidence"), MAX_EVIDENCE_ITEMS, first=KEY_EVIDENCE)
        if ev:
            lines.append("    evidence: " + ev)
        blocks.append("\n".join(lines))
    if not blocks:
        return "No hints: nothing in the input pipeline needs attention."
    return "\n".join(blocks)


# The docs site's root, where ``docs/hints/<id>.md`` is published as
# ``hints/<id>/``; None while the site has no public address (mkdocs.yml's
# ``site_url`` says the same: tests/unit/test_docs.py checks they agree).
DOCS_SITE_URL: str | None = None


def hint_reference(hint_id: str) -> str:
    """Where a user reads what a hint means, wherever dlwatch is installed:
    ``dlwatch explain ID`` (a terminal over SSH has no browser, so first), and
    the site's page when the site has an address. Never a path into the
    repository: an installed package has no docs/."""
    ref = f"dlwatch explain {hint_id}"
    if DOCS_SITE_URL:
        ref += f" · {DOCS_SITE_URL.rstrip('/')}/hints/{hint_id}/"
    return ref


def judging_label(entry: Mapping[str, Any]) -> str:
    """ "judging… (N s)" for a loader the diagnosis has not judged yet (an
    entry of the snapshot's ``judging``)."""
    secs = entry.get("judging_s")
    return f"judging… ({secs:.0f} s)" if isinstance(secs, (int, float)) else "judging…"


def judging_lines(judging: Any, job_pid: int | None = None) -> list[str]:
    """One line per loader not judged yet (of ``job_pid``, or all): what the
    hints are waiting for, so no hints never reads as "nothing to fix"."""
    out = []
    for e in records(judging):
        if job_pid is not None and e.get("job_pid") != job_pid:
            continue
        out.append(
            f"{judging_label(e)} loader {e.get('loader_id')} of PID {e.get('job_pid')}: no hints until "
            f"its rates settle ({e.get('reason') or 'warming up'})"
        )
    return out


def tune_command(job: Mapping[str, Any], config: Mapping[str, Any]) -> str | None:
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


# A script's own option for its loaders' worker count: `--workers 8`
# (OpenCLIP, timm), `-j 4` (pytorch/examples' imagenet), `--num-workers`,
# `--dataloader_num_workers` (HF), `data.num_workers=2` (Hydra overrides),
# `--model.workers 4` / `--data.num_workers 4` (LightningCLI: the init
# arguments of the LightningModule or DataModule).
_WORKERS_FLAG = re.compile(r"^(?:-j|--?(?:[\w.-]*[_.-])?(?:num[_-]?)?workers|[\w.]*num_workers)$", re.I)


def workers_option(cmdline: Any, current: int | None) -> tuple[str, str] | None:
    """The job's command-line option that sets its worker count, as written
    and as a format for the new count (``("--workers 2", "--workers {}")``):
    only a worker-count option whose value is the count measured now, and
    only one of them (a QA run: an OpenCLIP user told "num_workers=1 in
    DataLoader(...)" sets ``--workers``)."""
    if not isinstance(cmdline, str) or current is None:
        return None
    try:
        argv = shlex.split(cmdline)
    except ValueError:
        return None
    found = []
    for i, tok in enumerate(argv):
        name, eq, value = tok.partition("=")
        if eq:
            if _WORKERS_FLAG.match(name) and value == str(current):
                found.append((tok, f"{name}={{}}"))
        elif _WORKERS_FLAG.match(tok) and i + 1 < len(argv) and argv[i + 1] == str(current):
            found.append((f"{tok} {current}", f"{tok} {{}}"))
    return found[0] if len(found) == 1 else None


def with_cli_option(h: dict[str, Any], job: Mapping[str, Any], current: int | None) -> dict[str, Any]:
    """``h`` with the command-line option that sets its recommended count."""
    n = (h.get("evidence") or {}).get("recommended_num_workers")
    opt = workers_option(job.get("cmdline"), current) if isinstance(n, int) and n != current else None
    if opt is None:
        return h
    was, fmt = opt
    sugg = f"{h.get('suggestion', '')} (your command line sets it: {was} → {fmt.format(n)})"
    return dict(h, suggestion=sugg)


def with_tune_command(h: dict[str, Any], snapshot: Mapping[str, Any]) -> dict[str, Any]:
    """``h`` (a hint of a tunable rule, registry.Rule.tunable) with its
    suggestion ending in the command that verifies it."""
    if not isinstance(snapshot, Mapping):
        return h
    job = find_job(snapshot, h.get("job_pid"))
    if job is None:
        return h
    world = as_int(job.get("world_size"))
    if world is not None and world > 1:
        # A rank's command line run alone has no rendezvous (a QA run: the
        # suggested `dlwatch tune -- python -u train.py` died on "environment
        # variable RANK expected"), and tune times one process.
        return dict(
            h,
            suggestion=f"{h.get('suggestion', '')}; verify by rerunning the whole run with it and comparing "
            "batches/s (`dlwatch tune` runs one process, not a rank of a distributed run)",
        )
    ev = h.get("evidence") or {}
    loader = next((ld for ld in records(job.get("loaders")) if ld.get("id") == h.get("loader_id")), {})
    h = with_cli_option(h, job, as_int(loader.get("num_workers")))
    lib = loader.get("library")
    if lib not in (None, "torch", "monai") and loader.get("workers_from") is None:
        # tune sets a torch DataLoader's arguments (a WebLoader's stage
        # DataLoader's too); a pipeline's are the script's (a QA run: "verify
        # with dlwatch tune --workers 0,1" on a grain.DataLoader).
        return dict(
            h,
            suggestion=f"{h.get('suggestion', '')}; verify by rerunning with it under `dlwatch run --record` "
            f"and comparing with `dlwatch compare` (tune cannot set {lib}'s settings)",
        )
    # A count weighed and found not worth it is still the one to measure.
    n = ev.get("recommended_num_workers")
    n = ev.get("considered_num_workers") if n is None else n
    cmd = tune_command(job, {"num_workers": n, "current": as_int(loader.get("num_workers"))})
    if cmd is None:
        return h
    where = " with the loop saved as train.py" if cmd.startswith("%") else ""
    # tune runs the script as it is: past the dataset's shards the extra
    # workers get no data until the script reshards it (rules_sharding).
    once = "once resharded, " if isinstance(ev.get("reshard_to"), int) else ""
    return dict(h, suggestion=f"{h.get('suggestion', '')}; {once}verify with `{cmd}`{where}")
