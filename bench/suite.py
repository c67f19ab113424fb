#!/usr/bin/env python
"""Every dlwatch benchmark in one command, with one summary against docs/ARCHITECTURE.md §4.

    python bench/suite.py                     # full: under 10 minutes
    python bench/suite.py --quick             # smoke sizes: under 3 minutes
    python bench/suite.py --json PATH         # default bench/results/suite.json
    python bench/suite.py --only accuracy,freshness

It runs, one after another (never at once: they measure time on a small box),
as subprocesses with ``--json`` (and ``--quick`` when given):

    overhead       bench/overhead.py       the probe's cost per batch, trainer and worker
    accuracy       bench/accuracy.py       data wait / worker busy against the loop's own log
    freshness      bench/freshness.py      change in the job -> visible in the monitor
    scale          bench/scale.py          8 jobs x 16 workers; 50k batches/s; 1-32 fake jobs
    tui_footprint  bench/tui_footprint.py  the live TUI's CPU and memory
    export_footprint bench/export_footprint.py  the Prometheus exporter's CPU and scrape latency

Each script's table goes to ``bench/results/<name>.txt`` and its JSON into
the combined file; then one table: metric, value, target, PASS/MISS (INFO for
figures without a bar). Exit status 0 whatever the numbers unless
``--strict`` (timings on a shared box are not a test verdict), 1 if a
benchmark itself failed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

from common import text_table, write_json

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
RESULTS = os.path.join(BENCH, "results")

# name, script, timeout full, timeout quick (seconds)
STEPS = [
    ("overhead", "overhead.py", 150, 40),
    ("accuracy", "accuracy.py", 180, 60),
    ("freshness", "freshness.py", 150, 60),
    ("scale", "scale.py", 300, 110),
    ("tui_footprint", "tui_footprint.py", 240, 80),
    ("export_footprint", "export_footprint.py", 180, 90),
]


def run_step(name: str, script: str, quick: bool, timeout: float, out_dir: str) -> dict:
    json_path = os.path.join(out_dir, f"{name}.json")
    txt_path = os.path.join(out_dir, f"{name}.txt")
    try:
        os.unlink(json_path)
    except OSError:
        pass
    cmd = [sys.executable, os.path.join(BENCH, script), "--json", json_path]
    if quick:
        cmd.append("--quick")
    t = time.monotonic()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
        rc, stdout, stderr = r.returncode, r.stdout, r.stderr
    except subprocess.TimeoutExpired as e:
        rc = None
        stdout = (
            (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        )
        stderr = (
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        )
        stderr += f"\n[suite] timed out after {timeout:g} s"
    secs = time.monotonic() - t
    with open(txt_path, "w") as f:
        f.write(stdout)
        if stderr.strip():
            f.write("\n--- stderr ---\n" + stderr)
    data = None
    if os.path.exists(json_path):
        try:
            with open(json_path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            data = None
    return {
        "cmd": cmd[1:],
        "rc": rc,
        "seconds": secs,
        "result": data,
        "table": txt_path,
        "stderr_tail": stderr[-2000:] if rc != 0 else "",
    }


# ------------------------------------------------------------ summary rows


def _row(metric: str, value: str, target: str, ok: bool | None) -> dict:
    return {
        "metric": metric,
        "value": value,
        "target": target,
        "status": "INFO" if ok is None else ("PASS" if ok else "MISS"),
    }


def rows_overhead(d: dict) -> list[dict]:
    r = d["results"]
    tr, fe = r["trainer"]["median"], r["fetch"]["median"]
    t = d["targets"]
    out = [
        _row(
            "overhead: trainer added per batch (median batch)",
            f"{tr['added_ns']:+.0f} ns",
            f"<= {t['trainer_added_ns']:g} ns",
            tr["added_ns"] <= t["trainer_added_ns"],
        ),
        _row(
            "overhead: trainer time ratio with/without",
            f"{tr['ratio']:.3f}",
            f"<= {t['trainer_ratio']:g}",
            tr["ratio"] <= t["trainer_ratio"],
        ),
        _row(
            "overhead: worker fetch added per batch (median)",
            f"{fe['added_ns']:+.0f} ns",
            f"<= {t['worker_added_ns']:g} ns",
            fe["added_ns"] <= t["worker_added_ns"],
        ),
    ]
    pub = r.get("publisher")
    if pub:
        out.append(
            _row(
                "overhead: publisher thread (10 Hz)", f"{pub['cpu_fraction'] * 100:.3f} % of a core", "", None
            )
        )
    return out


def rows_accuracy(d: dict) -> list[dict]:
    s, t = d["summary"], d["targets"]
    n = len(d["scenarios"])
    return [
        _row(
            f"truth: data wait |error|, worst of {n} scenarios",
            f"{s['wait_err_pp_max']:.2f} pp",
            f"<= {t['wait_pp']:g} pp",
            s["checks"]["data_wait_within_2pp"],
        ),
        _row("truth: data wait |error|, median", f"{s['wait_err_pp_median_of_medians']:.2f} pp", "", None),
        _row(
            "truth: worker busy |error|, worst",
            f"{s['busy_err_pp_max']:.2f} pp",
            f"<= {t['busy_pp']:g} pp",
            s["checks"]["worker_busy_within_5pp"],
        ),
        _row("truth: worker busy |error|, median", f"{s['busy_err_pp_median_of_medians']:.2f} pp", "", None),
        _row(
            "truth: batch rate |error|, worst",
            f"{s['rate_rel_err_max'] * 100:.1f} %",
            f"<= {t['rate_rel'] * 100:g} % (tests)",
            s["rate_rel_err_max"] <= t["rate_rel"],
        ),
    ]


def rows_freshness(d: dict) -> list[dict]:
    out = []
    for s in d["settings"]:
        label = f"interval {s['interval_s']:g} s, window {s['window_s']:g} s"
        default = s.get("default", False)
        v = (
            "n/a"
            if s["screen_median_s"] is None
            else (
                f"{s['up_median_s']:.2f} s model, ~{s['screen_median_s']:.2f} s on screen "
                f"(worst {s['screen_worst_s']:.2f})"
            )
        )
        out.append(
            _row(
                f"freshness{' (defaults)' if default else ''}: {label}",
                v,
                "<= 1 s on screen (median)",
                s["meets_1s_median"],
            )
        )
    return out


def rows_scale(d: dict) -> list[dict]:
    out = []
    m = d.get("many")
    if m:
        tag = f"{m['jobs']} jobs x {m['workers_per_job']} workers"
        out.append(
            _row(
                f"scale: dlwatch snapshot --json, {tag}",
                f"{m['cli_snapshot_s_median']:.2f} s",
                "<= 1.5 s ('about a second')",
                m["cli_snapshot_s_median"] <= 1.5,
            )
        )
        mon = m["monitor"]
        out.append(
            _row(
                f"scale: Monitor CPU, {tag}",
                f"{mon['cpu_percent_of_core']:.1f} % of a core",
                "<= 2 % ('a few %')",
                mon["cpu_percent_of_core"] <= 2.0,
            )
        )
        out.append(_row(f"scale: Monitor RSS, {tag}", f"{mon['rss_mib']:.0f} MiB", "", None))
    f = d.get("fast")
    if f:
        out.append(
            _row(
                "scale: real job bs=1 nw=0, batches/s without / with hook",
                f"{f['batches_per_s_without_median']:,.0f} / {f['batches_per_s_with_median']:,.0f}",
                "",
                None,
            )
        )
        out.append(
            _row(
                "scale: same, added loop CPU per batch (paired rounds)",
                f"{f['cpu_added_ns_per_batch_median']:+.0f} ns",
                "INFO (noisy; see overhead)",
                None,
            )
        )
    for r in d.get("fake", []):
        if r["rate"] >= 1000:
            out.append(
                _row(
                    f"scale: Monitor CPU, {r['fake_jobs']} fake jobs x {r['rate']:,.0f} batches/s",
                    f"{r['cpu_percent_of_core']:.1f} % of a core, {r['rss_mib']:.0f} MiB",
                    "<= 2 %" if r["fake_jobs"] <= 8 else "",
                    r["cpu_percent_of_core"] <= 2.0 if r["fake_jobs"] <= 8 else None,
                )
            )
    if "fake_rate_cpu_ratio_8_jobs" in d:
        x = d["fake_rate_cpu_ratio_8_jobs"]
        out.append(
            _row(
                "scale: Monitor CPU at 50k vs 10 batches/s (8 jobs)",
                f"{x:.2f}x",
                "~1 (rate-independent)",
                0.5 <= x <= 1.5,
            )
        )
    return out


def rows_tui(d: dict) -> list[dict]:
    out = []
    t = d["target_cpu_percent_of_core"]
    for r in d["results"]:
        out.append(
            _row(
                f"footprint: TUI ({r['mode']}), {d['jobs']} jobs x {d['workers_per_job']} workers, "
                f"refresh {d['refresh_s']:g} s",
                f"{r['cpu_percent_of_core']:.2f} % of a core, {r['peak_rss_mib']:.0f} MiB peak",
                f"<= {t:g} %",
                r["cpu_percent_of_core"] <= t,
            )
        )
    return out


def rows_export(d: dict) -> list[dict]:
    t = d["target_cpu_percent_of_core"]
    tag = f"{d['jobs']} jobs x {d['workers']} workers"
    out = []
    for r in d["rows"]:
        if r["phase"] == "scraped":
            out.append(
                _row(
                    f"footprint: dlwatch export scraped every 1 s, {tag}",
                    f"{r['cpu_percent']:.2f} % of a core, {d['rss_mib']:.0f} MiB peak",
                    f"<= {t:g} %",
                    r["cpu_percent"] <= t,
                )
            )
            out.append(
                _row(
                    f"footprint: dlwatch export scrape latency, {tag}",
                    f"median {r['latency_ms_median']:.1f} ms, max {r['latency_ms_max']:.1f} ms",
                    "",
                    None,
                )
            )
        else:
            out.append(
                _row(f"footprint: dlwatch export not scraped, {tag}", f"{r['cpu_percent']:.2f} %", "", None)
            )
    return out


SUMMARIZERS = {
    "overhead": rows_overhead,
    "accuracy": rows_accuracy,
    "freshness": rows_freshness,
    "scale": rows_scale,
    "tui_footprint": rows_tui,
    "export_footprint": rows_export,
}


def _table(rows: list[dict]) -> str:
    return text_table(
        ("metric", "value", "target", ""), [(r["metric"], r["value"], r["target"], r["status"]) for r in rows]
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="every benchmark's --quick (under 3 minutes)")
    p.add_argument("--json", metavar="PATH", default=os.path.join(RESULTS, "suite.json"))
    p.add_argument("--only", help="comma-separated subset of: " + ", ".join(s[0] for s in STEPS))
    p.add_argument("--strict", action="store_true", help="exit 1 when any target is missed")
    a = p.parse_args(argv)
    only = set(a.only.split(",")) if a.only else None
    if only and only - {s[0] for s in STEPS}:
        p.error(f"unknown benchmark(s): {', '.join(sorted(only - {s[0] for s in STEPS}))}")
    out_dir = os.path.dirname(os.path.abspath(a.json))
    os.makedirs(out_dir, exist_ok=True)
    t0 = time.monotonic()
    doc: dict = {
        "mode": "quick" if a.quick else "full",
        "time": time.time(),
        "env": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
        },
        "steps": {},
        "summary": [],
    }
    failed = []
    for name, script, t_full, t_quick in STEPS:
        if only and name not in only:
            continue
        print(f"[suite] {name} ...", end=" ", flush=True)
        r = run_step(name, script, a.quick, t_quick if a.quick else t_full, out_dir)
        doc["steps"][name] = r
        ok = r["rc"] == 0 and r["result"] is not None
        print(
            f"{'ok' if ok else 'FAILED (rc ' + str(r['rc']) + ')'} in {r['seconds']:.0f} s "
            f"(table: {os.path.relpath(r['table'], ROOT)})",
            flush=True,
        )
        if ok:
            try:
                doc["summary"] += SUMMARIZERS[name](r["result"])
            except (KeyError, TypeError, ValueError) as e:
                doc["summary"].append(_row(f"{name}: summary failed", f"{type(e).__name__}: {e}", "", False))
                failed.append(name)
        else:
            failed.append(name)
            doc["summary"].append(_row(f"{name}: benchmark failed", f"rc {r['rc']}", "", False))
            print(r["stderr_tail"][-1500:], file=sys.stderr)
    doc["seconds"] = time.monotonic() - t0
    doc["env"]["loadavg_end"] = os.getloadavg()
    doc["misses"] = [r["metric"] for r in doc["summary"] if r["status"] == "MISS"]
    write_json(a.json, doc)
    la = doc["env"]
    print(
        f"\ndlwatch benchmark suite ({doc['mode']}), {doc['seconds']:.0f} s; {la['cpus']} CPUs, load "
        f"average {la['loadavg_start'][0]:.1f} at start, {la['loadavg_end'][0]:.1f} at end\n"
    )
    print(_table(doc["summary"]))
    n_pass = sum(r["status"] == "PASS" for r in doc["summary"])
    print(
        f"\n{n_pass} PASS, {len(doc['misses'])} MISS; tables in {os.path.relpath(out_dir, ROOT)}/,"
        f" everything in {os.path.relpath(a.json, ROOT)}"
    )
    if failed:
        return 1
    return 1 if a.strict and doc["misses"] else 0


if __name__ == "__main__":
    sys.exit(main())
