"""Plain text of a sweep: the progress line while a trial runs, and the
table, the recommendation and the reason the search stopped at the end."""

from __future__ import annotations

from dlwatch.snapshot import num, percent


def settings_text(s: dict | None) -> str:
    if not s:
        return "n/a"
    parts = [f"num_workers={s.get('num_workers')}"]
    if s.get("num_workers") and s.get("prefetch_factor") not in (None, 2):
        parts.append(f"prefetch_factor={s['prefetch_factor']}")
    if s.get("persistent_workers"):
        parts.append("persistent_workers")
    if s.get("pin_memory"):
        parts.append("pin_memory")
    return " ".join(parts)


def config_text(config: dict) -> str:
    if not config:
        return "the script's own settings"
    return ", ".join(f"{k}={v}" for k, v in config.items())


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    s = int(round(seconds))
    return f"{s // 60}:{s % 60:02d}"


def progress_line(index: int, max_trials: int, config: dict, meter, trial_elapsed: float, sweep) -> str:
    rate, wait = meter.live_rate(), meter.live_wait()
    phase = meter.phase
    if phase == "steady":
        phase = f"steady {meter.steady_s:.0f}/{meter.trial_s:.0f} s"
    figures = "n/a" if rate is None else f"{rate:.1f} batches/s"
    if wait is not None:
        figures += f", data wait {percent(wait)}"
    left = sweep.budget_left()
    return (
        f"trial {index + 1} of at most {max_trials} ({config_text(config)}): {phase}, {figures} | "
        f"elapsed {_clock(sweep.elapsed_s)}" + (f", budget left {_clock(left)}" if left is not None else "")
    )


def _mib(v) -> str:
    v = num(v)
    return "n/a" if v is None else f"{v / (1 << 20):.0f} MiB"


def table(doc: dict) -> str:
    base = doc.get("baseline") or {}
    base_rates = [
        t["batches_per_s"]
        for t in doc.get("trials", [])
        if t.get("status") == "ok"
        and t.get("settings") == base.get("settings")
        and num(t.get("batches_per_s"))
    ]
    base_rate = sum(base_rates) / len(base_rates) if base_rates else None
    header = (
        "#",
        "settings",
        "batches/s",
        "samples/s",
        "speed-up",
        "data wait",
        "CPU cores",
        "worker USS",
        "",
    )
    rows = [header]
    for t in doc.get("trials", []):
        rate = num(t.get("batches_per_s"))
        ok = t.get("status") == "ok"
        note = "" if ok else f"{t.get('status')}: {t.get('reason', '')}"
        if t.get("index") == 0:
            note = ("baseline; " + note) if note else "baseline"
        rows.append(
            (
                str(t.get("index", "") + 1),
                settings_text(t.get("settings")) if ok else config_text(t.get("config") or {}),
                f"{rate:.1f}" if ok and rate is not None else "-",
                f"{t['samples_per_s']:.0f}" if ok and num(t.get("samples_per_s")) is not None else "-",
                f"{rate / base_rate:.2f}x" if ok and rate is not None and base_rate else "-",
                f"{percent(t['data_wait_fraction'])}"
                if ok and num(t.get("data_wait_fraction")) is not None
                else "-",
                f"{t['cpu_cores']:.1f}" if ok and num(t.get("cpu_cores")) is not None else "-",
                _mib(t.get("worker_uss_bytes")) if ok and t.get("worker_uss_bytes") else "-",
                note,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    right = {2, 3, 4, 5, 6, 7}
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells) + ("  " + r[-1] if r[-1] else ""))
    return "\n".join(line.rstrip() for line in lines)


def summary(doc: dict) -> str:
    lines = [table(doc), ""]
    for t in doc.get("trials", []):
        if t.get("status") not in ("ok",) and t.get("stderr_tail"):
            lines.append(f"trial {t['index'] + 1} ({t.get('status')}), last lines of its stderr:")
            lines.extend("    " + ln for ln in t["stderr_tail"])
            lines.append("")
    best = doc.get("best")
    if best is not None and doc.get("recommendation"):
        sp = doc.get("speedup")
        spread = doc.get("speedup_spread")
        n = len(best.get("repeats") or [])
        same = best.get("settings") == (doc.get("baseline") or {}).get("settings")
        if same:
            lines.append(
                f"Recommendation: keep your settings, {doc['recommendation']}: no setting tried was "
                "faster beyond noise."
            )
        else:
            how = f"{sp:.2f}x the baseline's batches/s" if sp is not None else "speed-up n/a"
            if spread:
                how += f" (± {percent(spread)}"
                how += f", {n} trials)" if n > 1 else ")"
            lines.append(f"Recommendation: {doc['recommendation']}")
            lines.append(f"  measured {how}")
    elif doc.get("baseline") is None or (doc.get("baseline") or {}).get("status") != "ok":
        lines.append("No recommendation: the baseline trial did not measure.")
    lines.append(f"Stopped: {doc.get('stopped_because') or 'n/a'}")
    return "\n".join(lines)
