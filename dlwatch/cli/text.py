"""Plain-text rendering of snapshots for ``dlwatch snapshot`` and ``dlwatch ls``."""

from __future__ import annotations

from typing import Any

from dlwatch.snapshot import num, percent


def _pct(x: Any, nd: int = 1) -> str:
    return percent(x, nd)


def _num(x, fmt="{:.1f}", unit="") -> str:
    if isinstance(x, bool) or num(x) is None:
        return "n/a"
    return fmt.format(x) + unit


def human_bytes(n) -> str:
    if n is None:
        return "n/a"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def _short(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "…"


def render_ls(jobs: list[dict]) -> str:
    rows = [("PID", "RANK", "AGE", "LOADERS", "STATE", "COMMAND")]
    for j in jobs:
        rank = "-" if j.get("rank") is None else f"{j['rank']}/{j.get('world_size') or '?'}"
        rows.append(
            (
                str(j["pid"]),
                rank,
                f"{j.get('age_s') or 0:.0f}s",
                str(j["loaders"]),
                j.get("state", ""),
                _short(j.get("cmdline", ""), 60),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def render_snapshot(snap: dict) -> str:
    h = snap.get("host", {})
    shm = human_bytes(h.get("shm_free_bytes"))
    lines = [
        f"dlwatch snapshot  window {snap.get('window_s', 0):.1f} s",
        f"host: {h.get('logical_cpus')} logical CPUs, {_num(h.get('usable_cores'))} usable cores"
        + (f" ({h['cores_reason']})" if h.get("cores_reason") else "")
        + f", CPU {_num(h.get('cpu_percent'), unit=' %')}, /dev/shm free {shm}",
    ]
    if snap.get("gpu_status") == "ok":
        for g in snap.get("gpus", []):
            util = _num(g.get("util_percent"), "{:.0f}", " %")
            used, total = human_bytes(g.get("mem_used_bytes")), human_bytes(g.get("mem_total_bytes"))
            lines.append(f"GPU {g['index']} {g.get('name', '')}: util {util}, memory {used} / {total}")
    else:
        lines.append(f"GPU: {snap.get('gpu_status')}")
    for j in snap.get("jobs", []):
        rank = "" if j.get("rank") is None else f"  rank {j['rank']}/{j.get('world_size') or '?'}"
        main_cpu = _num(j.get("main_cpu_percent"), "{:.0f}", " %")
        lines.append("")
        lines.append(
            f"job {j['pid']}{rank}  [{j.get('state')}]  torch {j.get('torch_version')}  "
            f"main CPU {main_cpu}  {_short(j.get('cmdline', ''), 70)}"
        )
        if j.get("state_reason"):
            lines.append(f"  {j['state_reason']}")
        if not j.get("loaders"):
            lines.append("  no DataLoader iterated yet")
        for ld in j.get("loaders", []):
            lines.extend(_loader_lines(ld))
    lines.append("")
    for fault in snap.get("errors") or []:
        lines.append(f"collector error: {fault}")
    hints = snap.get("hints") or []
    if snap.get("hints_error") and not hints:
        lines.append(f"hints: n/a: {snap['hints_error']}")
    elif hints:
        try:
            from dlwatch.diagnose import format_hints

            lines.append(format_hints(hints))
        except ImportError:
            for hint in hints:
                lines.append(f"[{hint['severity']}] {hint['message']}\n    → {hint['suggestion']}")
    else:
        lines.append("hints: none")
    return "\n".join(lines)


def _loader_lines(ld: dict) -> list[str]:
    cfg = (
        f"workers {ld['num_workers']}"
        + (f" ({ld['start_method']})" if ld.get("start_method") else "")
        + f", batch {ld.get('batch_size')}, pin_memory {'on' if ld.get('pin_memory') else 'off'}, "
        f"persistent {'on' if ld.get('persistent_workers') else 'off'}"
        + (f", prefetch {ld['prefetch_factor']}" if ld.get("prefetch_factor") else "")
    )
    wait, step = _num(ld.get("wait_ms_mean"), unit=" ms"), _num(ld.get("step_ms_mean"), unit=" ms")
    start = _num(ld.get("epoch_start_ms_last"), "{:.0f}", " ms")
    lines = [
        f"  loader {ld['id']} ({ld.get('kind', 'map')}, {ld.get('dataset') or '?'}): {cfg}",
        f"    data wait {_pct(ld.get('data_wait_fraction'))}   {ld.get('batches_per_s', 0):.1f} batches/s   "
        f"wait {wait}   step {step}   epoch {ld.get('epoch')}   epoch start {start}",
    ]
    span, n = num(ld.get("window_s")), ld.get("window_batches")
    if span is not None and isinstance(n, int):
        lines[-1] += f"   (over {span:.0f} s, {n} batch{'es' if n != 1 else ''})"
    if num(ld.get("data_wait_fraction")) is None and ld.get("no_batch_reason"):
        lines.append(f"    data wait n/a: {ld['no_batch_reason']}")
    q = ld.get("queue", {})
    if q.get("capacity") is not None:
        lines.append(
            f"    prefetch queue: ready {_num(q.get('ready'), '{}')} / in flight "
            f"{_num(q.get('in_flight'), '{}')} / capacity {q.get('capacity')}"
        )
    if ld.get("workers"):
        lines.append(
            "    worker  pid      cpu %  busy %  fetch ms  batches  rss        uss        thr  state"
        )
        lines.extend(_worker_line(w) for w in ld["workers"])
    return lines


def _worker_line(w: dict) -> str:
    busy = num(w.get("busy_fraction"))
    busy_pct = _num(None if busy is None else busy * 100, "{:6.0f}")
    return (
        f"    {w['id']:<6}  {w['pid']:<7}  {_num(w.get('cpu_percent'), '{:5.0f}')}  {busy_pct}  "
        f"{_num(w.get('fetch_ms_mean'), '{:8.1f}')}  {w.get('batches', 0):<7}  "
        f"{human_bytes(w.get('rss_bytes')):<9}  {human_bytes(w.get('uss_bytes')):<9}  "
        f"{_num(w.get('threads'), '{}'):<3}  {w.get('state', '')}"
        + (f"  ({w['error']})" if w.get("error") else "")
    )
