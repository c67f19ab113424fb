"""Plain text of a sweep: the progress line while a trial runs, and the
table, the recommendation and the reason the search stopped at the end."""

from __future__ import annotations

from dlwatch.snapshot import as_int, num, percent
from dlwatch.tune.sweep import pace_note


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
    if "replay" in config:
        return "the script's own settings, data for free (replay)"
    return ", ".join(f"{k}={v}" for k, v in config.items())


def trial_name(index: int, max_trials: int) -> str:
    return "ceiling trial" if index < 0 else f"trial {index + 1} of at most {max_trials}"


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
        if meter.steady_s >= meter.trial_s:
            phase = f"steady {meter.steady_s:.0f} s, settling (at most {meter.bound_s:.0f} s in all)"
        left = sum(p["s"] for p in meter.left_out)
        if left:
            phase += f", its first {left:.0f} s left out: slower"
    figures = "n/a" if rate is None else f"{rate:.1f} batches/s"
    if wait is not None:
        figures += f", data wait {percent(wait)}"
    left = sweep.budget_left()
    return (
        f"{trial_name(index, max_trials)} ({config_text(config)}): {phase}, {figures} | "
        f"elapsed {_clock(sweep.elapsed_s)}" + (f", budget left {_clock(left)}" if left is not None else "")
    )


def _mib(v) -> str:
    v = num(v)
    return "n/a" if v is None else f"{v / (1 << 20):.0f} MiB"


def _group_rates(trials: list[dict]) -> dict[tuple, list[float]]:
    """The batches/s of each setting's ok trials (repeats included)."""
    rates: dict[tuple, list[float]] = {}
    for t in trials:
        rate = num(t.get("batches_per_s"))
        if t.get("status") == "ok" and rate is not None:
            rates.setdefault(_key(t.get("settings")), []).append(rate)
    return rates


def _key(settings) -> tuple:
    return tuple(sorted((settings or {}).items()))


def _pct(v) -> str:
    return "-" if num(v) is None else percent(v)


def _row(t: dict, number: str, label: str, speedup: str, note: str) -> tuple:
    ok = t.get("status") == "ok"
    rate = num(t.get("batches_per_s"))
    return (
        number,
        label,
        f"{rate:.1f}" if ok and rate is not None else "-",
        f"{t['samples_per_s']:.0f}" if ok and num(t.get("samples_per_s")) is not None else "-",
        speedup,
        _pct(t.get("data_wait_fraction")) if ok else "-",
        f"{t['cpu_cores']:.1f}" if ok and num(t.get("cpu_cores")) is not None else "-",
        _mib(t.get("worker_uss_bytes")) if ok and t.get("worker_uss_bytes") else "-",
        note,
    )


def table(doc: dict) -> str:
    """One row per trial, then the ceiling's. A trial's speed-up is its
    setting's mean over the baseline setting's mean, repeats included: the
    figure the recommendation states, and 1.00x for the baseline by definition."""
    base = doc.get("baseline") or {}
    trials = doc.get("trials", [])
    rates = _group_rates(trials)
    means = {k: sum(v) / len(v) for k, v in rates.items()}
    base_rate = means.get(_key(base.get("settings"))) if base.get("status") == "ok" else None
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
    best_sp = num(doc.get("speedup"))
    best_key = _key((doc.get("best") or {}).get("settings"))
    for t in trials:
        ok = t.get("status") == "ok"
        note = "" if ok else f"{t.get('status')}: {t.get('reason', '')}"
        if ok and pace_note(t):
            note = pace_note(t)
        if t.get("index") == 0:
            note = ("baseline; " + note) if note else "baseline"
        n = len(rates.get(_key(t.get("settings")), ())) if ok else 0
        if n > 1 and _key(t.get("settings")) != _key(base.get("settings")):
            # A new user read two rows of one setting, 19.9 and 22.1 batches/s,
            # both "1.15x", as an error: the speed-up is the setting's mean.
            note = f"{note}; speed-up: its {n} trials' mean" if note else f"speed-up: its {n} trials' mean"
        mean = means.get(_key(t.get("settings"))) if ok else None
        speedup = f"{mean / base_rate:.2f}x" if mean is not None and base_rate else "-"
        if ok and best_sp is not None and _key(t.get("settings")) == best_key:
            # The recommendation's own figure, over the same trials it chose
            # from (a QA run: 2.28x in the row, "measured 2.27x" below it).
            speedup = f"{best_sp:.2f}x"
        label = settings_text(t.get("settings")) if ok else config_text(t.get("config") or {})
        rows.append(_row(t, str(t.get("index", 0) + 1), label, speedup, note))
    c = doc.get("ceiling")
    if c is not None:
        t = c.get("trial") or {}
        sp = num(c.get("speedup"))
        note = "" if t.get("status") == "ok" else f"{t.get('status')}: {t.get('reason', '')}"
        if t.get("status") == "ok":
            note = _replay_note(c)
        rows.append(_row(t, "-", "data is free: ceiling", f"{sp:.2f}x" if sp is not None else "-", note))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    right = {2, 3, 4, 5, 6, 7}
    lines = []
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells) + ("  " + r[-1] if r[-1] else ""))
    return "\n".join(line.rstrip() for line in lines)


def _replay_note(c: dict) -> str:
    n, want = c.get("batches_cached"), c.get("batches_wanted")
    note = f"{n} cached batches replayed"
    if c.get("limited_by") == "max_bytes":
        note += f" (of {want}: the byte budget, {_mib(c.get('bytes_cached'))} cached, was reached)"
    if c.get("in_place"):
        note += "; the loop changes its batches in place: each replay was a copy"
    return note


def no_recommendation(doc: dict) -> str | None:
    """When no setting but the baseline's was measured: why, in place of "keep
    your settings … no setting tried was faster" (a QA run: every setting with
    workers crashed, and Ctrl-C before a second trial, both read as advice)."""
    trials = [t for t in doc.get("trials") or [] if t.get("index") != 0]
    base = (doc.get("baseline") or {}).get("settings")
    if any(t.get("status") == "ok" and t.get("settings") != base for t in trials):
        return None
    failed = [t for t in trials if t.get("status") in ("crashed", "exited", "no-batches", "failed")]
    refused = refused_rerun(doc, failed)
    if refused:
        return refused
    if failed:
        which = ", ".join(
            f"trial {t.get('index', 0) + 1} ({config_text(t.get('config') or {})})" for t in failed
        )
        early = all("before dlwatch saw a batch" in str(t.get("reason") or "") for t in failed)
        rerun = (
            " If it fails the same way when simply run twice (a run name or output folder its first run "
            "made), put {trial} in the command where a fresh name helps: each run gets its number."
            if early and "{trial}" not in " ".join(str(a) for a in doc.get("command") or [])
            else ""
        )
        return (
            f"No recommendation: every other setting tried failed: {which}. The last lines of their stderr "
            f"are above: the script breaks with those settings (a worker that cannot start or load), not "
            f"on speed. Fix that, then tune again.{rerun}"
        )
    if doc.get("interrupted"):
        return "No recommendation: no setting but your own was measured before Ctrl-C."
    stopped = str(doc.get("stopped_because") or "")
    if not trials and stopped.startswith(("--max-trials", "--budget")):
        # A QA run: --max-trials 1 read "keep your settings … no setting tried
        # was faster" beside a loop that waited 83 % (ceiling 5.81x).
        return (
            f"No recommendation: only your own settings were measured ({stopped}); "
            "allow more trials for other settings to be tried."
        )
    return None  # the search saw nothing likely faster: "keep your settings" is its verdict


def refused_rerun(doc: dict, failed: list[dict]) -> str | None:
    """Every trial after a baseline that ran failed the same way before any
    batch, whatever its settings: the script refuses to run again with the
    same arguments (an output folder the first run made), not to run with
    workers. A QA run of OpenCLIP read "the script breaks with those
    settings" for its "Experiment already exists"."""
    base = doc.get("baseline") or {}
    # One failure cannot tell a setting's from a rerun's (a crash job's
    # "cannot run with num_workers=2"); two settings failing alike can.
    configs = {config_text(t.get("config") or {}) for t in failed}
    if base.get("status") != "ok" or len(configs) < 2:
        return None
    lasts = set()
    for t in failed:
        tail = [ln for ln in t.get("stderr_tail") or [] if ln.strip()]
        if "before dlwatch saw a batch" not in str(t.get("reason") or "") or not tail:
            return None
        lasts.add(tail[-1].strip())
    if len(lasts) != 1:
        return None
    cmd = " ".join(str(a) for a in doc.get("command") or [])
    fresh = (
        "the command has {trial} already: does the script keep its state somewhere else?"
        if "{trial}" in cmd
        else "put {trial} in the command where a fresh name helps (dlwatch tune -- python train.py "
        "--name tune{trial}): each run gets its number"
    )
    return (
        f"No recommendation: your settings ran, then every other trial ended before its first batch "
        f"with the same error ({lasts.pop()[:160]}), whatever its settings. The script likely refuses "
        f"to run again with the same arguments (an output folder or run name the first run made): "
        f"{fresh}."
    )


# Other processes' CPU during a trial at or past this (cores): the settings
# were measured on fewer cores than the job has alone (a new user's tune
# beside another job of theirs measured 3.06x; 1.15x on the quiet box).
BUSY_OTHERS_CORES = 0.5


def load_note(doc: dict) -> str | None:
    """Why the figures may not hold: other processes used the cores while
    trials ran (each trial's ``other_cpu_cores``); None on a quiet box."""
    seen = [
        (as_int(t.get("index")), c)
        for t in doc.get("trials") or []
        if t.get("status") == "ok" and (c := num(t.get("other_cpu_cores"))) is not None
    ]
    if not seen or max(c for _, c in seen) < BUSY_OTHERS_CORES:
        return None
    each = ", ".join(f"trial {(i or 0) + 1} {c:.1f}" for i, c in seen)
    return (
        f"Other processes used these cores while the trials ran ({each} cores): each setting was "
        "measured on fewer cores than the job has alone, and not under the same load, so these figures "
        "may not hold on a quiet box. Tune again once the other work has stopped (`dlwatch ls` lists "
        "your other jobs)."
    )


def annotate(doc: dict) -> dict:
    """``doc`` with ``no_recommendation`` beside ``recommendation`` (then the
    baseline's settings) when no other setting was measured: what `dlwatch
    tune --json` and the MCP tool both answer."""
    none = no_recommendation(doc)
    if none:
        doc["no_recommendation"] = none
    busy = load_note(doc)
    if busy:
        doc["load_note"] = busy
    return doc


def summary(doc: dict) -> str:
    lines = [table(doc), ""]
    for t in doc.get("trials", []):
        if t.get("status") not in ("ok",) and t.get("stderr_tail"):
            lines.append(f"trial {t['index'] + 1} ({t.get('status')}), last lines of its stderr:")
            lines.extend("    " + ln for ln in t["stderr_tail"])
            lines.append("")
    busy = load_note(doc)
    if busy:
        lines.extend([busy, ""])
    best = doc.get("best")
    if best is not None and doc.get("recommendation"):
        sp = doc.get("speedup")
        n = len(best.get("repeats") or [])
        same = best.get("settings") == (doc.get("baseline") or {}).get("settings")
        unmeasured = no_recommendation(doc)
        if same and unmeasured:
            lines.append(unmeasured)
        elif same:
            lines.append(
                f"Recommendation: keep your settings, {doc['recommendation']}: no setting tried was "
                "faster beyond noise."
            )
        else:
            how = f"{sp:.2f}x the baseline's batches/s" if sp is not None else "speed-up n/a"
            ceiling = doc.get("ceiling") or {}
            share, csp = num(ceiling.get("best_share")), num(ceiling.get("speedup"))
            if sp is not None and share is not None and csp is not None:
                how += f" = {percent(share)} of the ceiling {csp:.2f}x"
            if n > 1:
                how += f" ({n} trials)"
            lines.append(f"Recommendation: {doc['recommendation']}")
            lines.append(f"  measured {how}")
            lines.extend(f"  {n}" for n in doc.get("speedup_notes") or [])
        if len(doc.get("trials") or []) > 1:
            lines.append(noise_line(doc))
    elif doc.get("baseline") is None or (doc.get("baseline") or {}).get("status") != "ok":
        lines.append("No recommendation: the baseline trial did not measure.")
    for h in (doc.get("ceiling") or {}).get("hints") or []:
        if num(h.get("promised")) is not None and h["expected_speedup"] < h["promised"]:
            lines.append(
                f"  the baseline's {h['id']} hint promised {h['promised']:.2f}x: at most "
                f"{h['expected_speedup']:.2f}x, the measured ceiling"
            )
    lines.append(f"Stopped: {doc.get('stopped_because') or 'n/a'}")
    return "\n".join(lines)


def noise_line(doc: dict) -> str:
    """The noise the sweep measured between repeats of one setting, and the
    allowance the recommendation used."""
    nz = doc.get("noise") or {}
    allow = num(nz.get("allowance"))
    measured = num(nz.get("measured"))
    reps = [f"{x:.1f}" for x in nz.get("repeats") or []]
    if measured is None:
        text = "  noise: no setting was repeated"
    else:
        text = (
            f"  noise: repeats of {settings_text(nz.get('settings'))} measured {' vs '.join(reps)} "
            f"batches/s ({percent(measured)} apart)"
        )
    if allow is not None:
        text += f"; settings within {percent(allow)} of the fastest count as equal"
    return text
