#!/usr/bin/env python
"""Truth: what dlwatch reports against what the training loop measured itself.

    python bench/accuracy.py                  # 6 scenarios x 5 snapshots, one at a time (~1.5 min)
    python bench/accuracy.py --quick          # 6 scenarios x 2 snapshots, 3 at a time (~30 s)
    python bench/accuracy.py --json out.json  # the table, plus every snapshot's figures

docs/ARCHITECTURE.md §4: data-wait fraction within ±2 percentage points of what the loop
itself measures; per-worker busy fraction within ±5 points.

Each scenario runs ``tests/jobs/timed_job.py`` (sleep-based costs, so the
figures do not depend on how busy the 2-core box is), which logs every
``next()`` of its loop and every sample its workers fetch on its own clock.
Several ``dlwatch snapshot --json --window 2`` are taken while it runs (the
real CLI, a fresh process each); afterwards the job's logs are cut to each
snapshot's exact window (``window_mono_ns``) with ``tests.e2e_util``'s
``truth_in_window`` / ``worker_truth``, and the errors are:

- data wait: |reported - truth| in percentage points (pp);
- worker busy: |reported - truth| in pp, every worker of every snapshot;
- batch rate: |reported - truth| / truth.

Per scenario the table shows the median and the max over its snapshots.
Exit status 0 whatever the numbers unless ``--strict``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from common import write_json  # noqa: E402

from tests.e2e_util import Job, snapshot_json, truth_in_window, worker_truth  # noqa: E402

TARGET_WAIT_PP = 2.0
TARGET_BUSY_PP = 5.0
TARGET_RATE_REL = 0.10  # what tests/test_e2e_snapshot.py holds it to; not a quality bar
WINDOW_S = 2.0

# name, job args, batch size, what the scenario is
SCENARIOS = [
    (
        "fork data-bound",
        ["--start-method", "fork"],
        4,
        "2 fork workers, 4 x 5 ms samples, 5 ms step: ~50 % wait",
    ),
    ("spawn", ["--start-method", "spawn"], 4, "as above, spawn workers"),
    (
        "loop-bound",
        ["--start-method", "fork", "--step-ms", "20"],
        4,
        "20 ms step: loop-bound, ~10 % wait (the queue hand-off itself), workers ~50 % busy",
    ),
    (
        "num_workers=0",
        ["--workers", "0", "--sample-ms", "2", "--step-ms", "8"],
        4,
        "the loop loads 4 x 2 ms itself, 8 ms step: ~50 % wait",
    ),
    ("iterable", ["--iterable", "--start-method", "fork"], 4, "IterableDataset, 2 fork workers"),
    (
        "persistent multi-epoch",
        ["--persistent", "--epochs", "100000", "--batches-per-epoch", "30", "--step-ms", "10"],
        4,
        "persistent workers, epochs of 30 batches (~0.4 s)",
    ),
]


def _loader(snap: dict, pid: int) -> dict | None:
    for j in snap.get("jobs", []):
        if j["pid"] == pid:
            for ld in j["loaders"]:
                if ld["id"] == 0:
                    return ld
    return None


def run_scenario(name: str, args: list[str], bs: int, n_snaps: int, settle: float, gap: float) -> dict:
    # Long enough for every snapshot (each ~1 s of CLI) plus a margin.
    duration = settle + n_snaps * (gap + 1.4) + 1.5
    job = Job(*args, "--duration", f"{duration:.0f}")
    snaps = []
    try:
        job.wait_ready(settle)
        for _ in range(n_snaps):
            t0 = time.monotonic()
            snap = snapshot_json(job.dir, "--window", str(WINDOW_S))
            snaps.append((snap, time.monotonic() - t0))
            time.sleep(gap)
        result = job.finish(timeout=duration + 60)
    finally:
        job.cleanup()
    rows = []
    for snap, took in snaps:
        ld = _loader(snap, job.proc.pid)
        if ld is None:
            rows.append({"error": "loader not in the snapshot", "cli_s": took})
            continue
        start, end = ld["window_mono_ns"]
        truth = truth_in_window(result["recs"]["train"]["batches"], start, end)
        row = {
            "cli_s": took,
            "window_s": (end - start) / 1e9,
            "wait": ld["data_wait_fraction"],
            "wait_truth": truth["data_wait_fraction"],
            "rate": ld["batches_per_s"],
            "rate_truth": truth["batches_per_s"],
            "workers": [],
        }
        if row["wait"] is not None and row["wait_truth"] is not None:
            row["wait_err_pp"] = abs(row["wait"] - row["wait_truth"]) * 100
        if row["rate_truth"]:
            row["rate_rel_err"] = abs(row["rate"] - row["rate_truth"]) / row["rate_truth"]
        for w in ld["workers"]:
            spans = result["traces"].get(w["pid"])
            wr = {"pid": w["pid"], "busy": w["busy_fraction"], "fetch_ms": w["fetch_ms_mean"]}
            if spans and w["busy_fraction"] is not None:
                wt = worker_truth(spans, start, end, bs)
                wr.update(
                    busy_truth=wt["busy_fraction"],
                    fetch_ms_truth=wt["fetch_ms"],
                    busy_err_pp=abs(w["busy_fraction"] - wt["busy_fraction"]) * 100,
                )
            row["workers"].append(wr)
        rows.append(row)

    def agg(vals: list[float]) -> dict | None:
        vals = [v for v in vals if v is not None]
        if not vals:
            return None
        return {"median": statistics.median(vals), "max": max(vals), "n": len(vals)}

    return {
        "name": name,
        "args": args,
        "snapshots": rows,
        "wait_err_pp": agg([r.get("wait_err_pp") for r in rows]),
        "busy_err_pp": agg([w.get("busy_err_pp") for r in rows for w in r.get("workers", [])]),
        "rate_rel_err": agg([r.get("rate_rel_err") for r in rows]),
        "wait_mean": agg([r.get("wait") for r in rows]),
        "busy_mean": agg([w.get("busy") for r in rows for w in r.get("workers", [])]),
        "cli_s": agg([r["cli_s"] for r in rows]),
    }


def _fmt(a: dict | None, key: str, scale: float = 1.0, digits: int = 2) -> str:
    if a is None:
        return "n/a"
    return f"{a[key] * scale:.{digits}f}"


def table(results: list[dict]) -> str:
    head = (
        "scenario",
        "snaps",
        "wait",
        "wait err med/max pp",
        "busy",
        "busy err med/max pp",
        "rate err med/max %",
    )
    lines = [head]
    for r in results:
        lines.append(
            (
                r["name"],
                str(len(r["snapshots"])),
                f"{_fmt(r['wait_mean'], 'median', 100, 1)} %",
                f"{_fmt(r['wait_err_pp'], 'median')} / {_fmt(r['wait_err_pp'], 'max')}",
                f"{_fmt(r['busy_mean'], 'median', 100, 1)} %" if r["busy_mean"] else "n/a",
                f"{_fmt(r['busy_err_pp'], 'median')} / {_fmt(r['busy_err_pp'], 'max')}",
                f"{_fmt(r['rate_rel_err'], 'median', 100, 1)} / {_fmt(r['rate_rel_err'], 'max', 100, 1)}",
            )
        )
    widths = [max(len(x[i]) for x in lines) for i in range(len(head))]
    out = ["  ".join(c.ljust(w) for c, w in zip(x, widths)).rstrip() for x in lines]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def summarize(results: list[dict]) -> dict:
    waits = [r["wait_err_pp"]["max"] for r in results if r["wait_err_pp"]]
    busys = [r["busy_err_pp"]["max"] for r in results if r["busy_err_pp"]]
    rates = [r["rate_rel_err"]["max"] for r in results if r["rate_rel_err"]]
    wmed = [r["wait_err_pp"]["median"] for r in results if r["wait_err_pp"]]
    bmed = [r["busy_err_pp"]["median"] for r in results if r["busy_err_pp"]]
    return {
        "wait_err_pp_max": max(waits) if waits else None,
        "wait_err_pp_median_of_medians": statistics.median(wmed) if wmed else None,
        "busy_err_pp_max": max(busys) if busys else None,
        "busy_err_pp_median_of_medians": statistics.median(bmed) if bmed else None,
        "rate_rel_err_max": max(rates) if rates else None,
        "checks": {
            "data_wait_within_2pp": bool(waits)
            and max(waits) <= TARGET_WAIT_PP
            and len(waits) == len(results),
            "worker_busy_within_5pp": bool(busys) and max(busys) <= TARGET_BUSY_PP,
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="2 snapshots per scenario instead of 5")
    p.add_argument("--snapshots", type=int, help="snapshots per scenario")
    p.add_argument(
        "--parallel",
        type=int,
        help="scenarios run at once (default 1, --quick 3: sleep-based costs keep the"
        " truth independent of the load, the errors stay comparable)",
    )
    p.add_argument("--only", action="append", help="run only scenarios whose name contains this")
    p.add_argument("--json", metavar="PATH")
    p.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    a = p.parse_args(argv)
    n = a.snapshots or (2 if a.quick else 5)
    t_start = time.monotonic()
    parallel = a.parallel or (3 if a.quick else 1)
    todo = [s for s in SCENARIOS if not a.only or any(o in s[0] for o in a.only)]

    def one(sc):
        name, args, bs, what = sc
        t = time.monotonic()
        settle = 4.0 if "persistent" in name else 2.5
        r = run_scenario(name, args, bs, n, settle, gap=0.3)
        r["what"] = what
        r["seconds"] = time.monotonic() - t
        print(f"  {name}: {r['seconds']:.1f} s", file=sys.stderr, flush=True)
        return r

    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=parallel) as ex:
        results = list(ex.map(one, todo))
    summary = summarize(results)
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    print(
        f"dlwatch accuracy ({'quick' if a.quick else 'full'}): {n} snapshots per scenario, "
        f"{parallel} scenario(s) at a time, "
        f"`dlwatch snapshot --json --window {WINDOW_S:g}` vs the loop's own log over the same window; "
        f"load average {', '.join(f'{x:.1f}' for x in load) if load else 'n/a'}\n"
    )
    print(table(results))
    print()
    for r in results:
        print(f"- {r['name']}: {r['what']}")
    print(
        f"\nworst data-wait error {summary['wait_err_pp_max']:.2f} pp (target <= {TARGET_WAIT_PP:g}),"
        f" worst worker-busy error {summary['busy_err_pp_max']:.2f} pp (target <= {TARGET_BUSY_PP:g}),"
        f" worst batch-rate error {summary['rate_rel_err_max'] * 100:.1f} %"
    )
    for k, v in summary["checks"].items():
        print(f"  {'PASS' if v else 'MISS'}  {k}")
    print(f"\ntotal {time.monotonic() - t_start:.1f} s")
    if a.json:
        write_json(
            a.json,
            {
                "mode": "quick" if a.quick else "full",
                "snapshots_per_scenario": n,
                "parallel": parallel,
                "seconds": time.monotonic() - t_start,
                "window_s": WINDOW_S,
                "loadavg": load,
                "targets": {
                    "wait_pp": TARGET_WAIT_PP,
                    "busy_pp": TARGET_BUSY_PP,
                    "rate_rel": TARGET_RATE_REL,
                },
                "summary": summary,
                "scenarios": results,
            },
        )
    return 1 if a.strict and not all(summary["checks"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
