"""Predicted vs measured speed-up of dlwatch's worker-count advice.

For each workload: run it watched by the live Monitor, take the worker-count
hint it shows (its ``expected_speedup`` and ``recommended_num_workers``),
rerun with that count, and compare the workloads' own throughput meters.
The image pipeline runs unmodified under ``dlwatch run``.

    .venv/bin/python bench/advice_check.py            # all workloads, ~3 minutes
    .venv/bin/python bench/advice_check.py --only image

With ``--timm`` (pytorch-image-models' train.py), ``--imagenet`` (pytorch/examples'
imagenet/main.py) and/or ``--dcgan`` (pytorch/examples' dcgan/main.py), or
$DLWATCH_TIMM_TRAIN / $DLWATCH_IMAGENET_MAIN / $DLWATCH_DCGAN_MAIN naming them, it then runs
those scripts unmodified and compares their live hints with a brute-force
num_workers sweep (bench/script_sweep.py; needs an interpreter with
torchvision, ``--python``; ~25 minutes for all three):

    .venv/bin/python bench/advice_check.py --only none --python /path/venv/bin/python \
        --timm pytorch-image-models/train.py --imagenet examples/imagenet/main.py \
        --dcgan examples/dcgan/main.py

Timings on a shared box follow its load: the table also prints the other
processes' CPU dlwatch measured during the first run. ``--burners N`` makes
that load on purpose, N processes spinning on a core each for the whole check
(``--burner-nice`` to start them niced), to check how the advice prices a box
others keep busy:

    .venv/bin/python bench/advice_check.py --only "free core" --burners 2

``--counts 1,2,3`` prices each of those worker counts from the watched
0-worker run (or ``--from N`` workers) and measures each, alternated over
``--rounds`` rounds, medians against the base count's (demo workloads only):

    .venv/bin/python bench/advice_check.py --only "free core" --burners 2 --counts 1,2,3

Workload d beside one burner is the "contended cores" term's check (a worker
loads slower while the trainer computes on cores others keep busy):

    .venv/bin/python bench/advice_check.py --only "d:" --burners 1 --counts 1,2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import script_sweep

from dlwatch.collect.monitor import Monitor
from dlwatch.diagnose import capacity
from dlwatch.diagnose.engine import build_context, stateless_phases

HINTS = ("no-workers", "add-workers", "io-bound", "pipeline-has-headroom", "cpu-bound-preprocessing")
DEMO = [sys.executable, "-m", "dlwatch.demo.train", "--quiet", "--hook", "--device", "cpu", "--epochs", "0"]
DEMO += ["--dataset-size", "1000000"]
WORKLOADS = {
    "a: loop fills the cores": "--batch-size 15 --sample-ms 1 --cost-kind cpu --step-ms 30 "
    "--step-kind cpu --step-threads 2",
    "b: a free core": "--batch-size 20 --sample-ms 1 --cost-kind cpu --step-ms 30 --step-kind sleep",
    "c: workers sleep on storage": "--batch-size 8 --sample-ms 10 --cost-kind sleep --step-ms 15 "
    "--step-kind sleep",
    "d: loading outweighs a CPU step": "--batch-size 30 --sample-ms 3 --cost-kind cpu --step-ms 30 "
    "--step-kind cpu --step-threads 1",
    "image: timm-style JPEG pipeline": None,
}


def demo_cmd(args: str, nw: int, seconds: float, report: str) -> list[str]:
    return [
        *DEMO,
        *args.split(),
        "--num-workers",
        str(nw),
        "--duration",
        str(seconds),
        "--report",
        report,
        "--report-interval",
        "0.5",
    ]


def image_cmd(nw: int, seconds: float, out: str) -> list[str]:
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "image_pipeline.py")
    return [
        sys.executable,
        "-m",
        "dlwatch",
        "run",
        "--",
        sys.executable,
        script,
        "--num-workers",
        str(nw),
        "--seconds",
        str(seconds),
        "--json",
        out,
    ]


def run(cmd: list[str], d: str, watch: bool, skip_s: float, report: str | None) -> tuple[dict, dict | None]:
    env = dict(os.environ, DLWATCH_DIR=d)
    if report and os.path.exists(report):
        # The previous run's last report would read as this one's early one
        # where the job starts slowly (a busy box).
        os.remove(report)
    if not watch:
        env["DLWATCH_DISABLE"] = "1"
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = Monitor(directory=d, interval=0.5) if watch else None
    if m:
        m.start()
    hints, last, early, t0 = {}, None, None, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.25)
        if report and early is None and time.monotonic() - t0 >= skip_s:
            early = _read(report)
        s = m.latest() if m else None
        if s and s["jobs"] and s["jobs"][0].get("state") == "live":
            last = s
            hints.update({h["id"]: h for h in s["hints"] if h["id"] in HINTS})
    if m:
        m.stop()
    return {"hints": hints, "snapshot": last, "early": early}, _read(report) if report else None


def _read(p: str) -> dict | None:
    try:
        with open(p) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def demo_tp(early: dict, final: dict) -> float:
    busy = final["wait_s"] + final["compute_s"] - early["wait_s"] - early["compute_s"]
    return (final["batches"] - early["batches"]) / busy


def measure(name: str, args: str | None, seconds: float) -> dict:
    d = tempfile.mkdtemp(prefix="dlwadv", dir="/tmp")
    out = os.path.join(d, "out.json")
    try:
        if args is None:
            first, _ = run(image_cmd(0, seconds, out), d, True, 0, None)
            before = _read(out)["images_per_s"]
        else:
            first, final = run(demo_cmd(args, 0, seconds, out), d, True, 5.0, out)
            before = demo_tp(first["early"], final)
        hint = next((first["hints"][h] for h in HINTS if h in first["hints"]), None)
        row = {
            "workload": name,
            "before": before,
            "hint": hint and hint["id"],
            "severity": hint and hint["severity"],
            "others": (first["snapshot"] or {}).get("host", {}).get("other_cpu_cores"),
        }
        if not hint or hint["evidence"].get("expected_speedup") is None:
            return row
        ev = hint["evidence"]
        # An info hint under the 10 % bar advises no count: the one it weighed is measured.
        n = (
            ev["recommended_num_workers"]
            if ev.get("recommended_num_workers") is not None
            else ev.get("considered_num_workers")
        )
        if args is None:
            run(image_cmd(n, seconds, out), d, False, 0, None)
            after = _read(out)["images_per_s"]
        else:
            second, final = run(demo_cmd(args, n, seconds, out), d, False, 5.0, out)
            after = demo_tp(second["early"], final)
        row.update(
            workers=n,
            predicted=ev["expected_speedup"],
            bound=ev.get("expected_bound"),
            after=after,
            measured=after / before,
        )
        return row
    finally:
        shutil.rmtree(d, ignore_errors=True)


def sweep(name: str, args: str, base: int, counts: list[int], rounds: int, seconds: float) -> list[dict]:
    """Each count priced from one watched run at ``base`` workers, then the
    base and every count measured ``rounds`` times, alternated."""
    d = tempfile.mkdtemp(prefix="dlwsweep", dir="/tmp")
    out = os.path.join(d, "out.json")
    try:
        first, final = run(demo_cmd(args, base, seconds, out), d, True, 5.0, out)
        tp: dict[int, list[float]] = {n: [] for n in counts}
        tp[base] = [demo_tp(first["early"], final)]
        s = first["snapshot"]
        ctx = build_context(s, stateless_phases(s))
        lv = ctx.loaders[0]
        priced = {n: capacity.predict(ctx, lv, n) for n in counts}
        for rnd in range(rounds):
            for n in [*counts, base] if rnd == 0 else [base, *counts]:
                if rnd == 0 and n == base:
                    continue  # the watched run is the first pass's
                got, final = run(demo_cmd(args, n, seconds, out), d, False, 5.0, out)
                tp[n].append(demo_tp(got["early"], final))
        b = statistics.median(tp[base])
        return [
            {
                "workload": name,
                "from": base,
                "workers": n,
                "predicted": getattr(priced[n], "speedup", None),
                "bound": getattr(priced[n], "bound", None),
                "capacity": _capacity_at(priced[n], n),
                "measured": statistics.median(tp[n]) / b,
                "runs": [round(x, 2) for x in tp[n]],
                "base_runs": [round(x, 2) for x in tp[base]],
                "others": s.get("host", {}).get("other_cpu_cores"),
            }
            for n in counts
        ]
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _capacity_at(p: capacity.Prediction | capacity.NoPrediction, n: int) -> float | None:
    return p.model.capacity_for(n) if isinstance(p, capacity.Prediction) else None


def print_sweep(rows: list[dict]) -> None:
    print(f"{'workload':<34} {'from':>4} {'nw':>3} {'predicted':>9} {'measured':>9} {'bound':<13} cores")
    for r in rows:
        pred = f"{r['predicted']:.2f}x" if r["predicted"] else "-"
        cap = f"{r['capacity']:.2f}" if r["capacity"] is not None else "-"
        print(
            f"{r['workload']:<34} {r['from']:>4} {r['workers']:>3} {pred:>9} {r['measured']:>8.2f}x "
            f"{r['bound'] or '-':<13} {cap}  runs {r['runs']} base {r['base_runs']} others {r['others']}"
        )


def start_burners(n: int, nice: int) -> list[subprocess.Popen]:
    code = f"import os\nos.nice({nice})\nwhile True: pass"
    return [subprocess.Popen([sys.executable, "-c", code]) for _ in range(n)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--only", help="run the workloads whose name contains this")
    p.add_argument("--json")
    script_sweep.add_arguments(p, prefix="sweep-")
    p.add_argument("--burners", type=int, default=0, help="processes spinning on a core each meanwhile")
    p.add_argument("--burner-nice", type=int, default=0, help="their nice value")
    p.add_argument("--counts", help="worker counts to price and measure, e.g. 1,2,3")
    p.add_argument("--from", dest="base", type=int, default=0, help="the watched run's worker count")
    p.add_argument("--rounds", type=int, default=2, help="alternated rounds of --counts")
    a = p.parse_args()
    burners = start_burners(a.burners, a.burner_nice)
    try:
        if a.counts:
            counts = [int(x) for x in a.counts.split(",")]
            chosen = [(n, args) for n, args in WORKLOADS.items() if args and (not a.only or a.only in n)]
            swept = [row for n, args in chosen for row in sweep(n, args, a.base, counts, a.rounds, a.seconds)]
            print_sweep(swept)
            if a.json:
                with open(a.json, "w") as f:
                    json.dump(swept, f, indent=1)
            return
        rows = [measure(n, args, a.seconds) for n, args in WORKLOADS.items() if not a.only or a.only in n]
    finally:
        for b in burners:
            b.kill()
            b.wait()
    head = f"{'workload':<34} {'hint':<12} {'sev':<5} {'nw':>3} {'predicted':>9} {'measured':>9}"
    print(f"{head} {'bound':<13} others")
    for r in rows:
        pred = f"{r['predicted']:.2f}x" if r.get("predicted") else "-"
        meas = f"{r['measured']:.2f}x" if r.get("measured") else "-"
        print(
            f"{r['workload']:<34} {r['hint'] or '-':<12} {r['severity'] or '-':<5} "
            f"{r.get('workers', '-'):>3} {pred:>9} {meas:>9} {r.get('bound') or '-':<13} {r['others']}"
        )
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    if a.timm or a.imagenet or a.dcgan or a.replay:
        script_sweep.run(a)


if __name__ == "__main__":
    main()
