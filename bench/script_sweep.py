"""Live hints of public training scripts against a brute-force num_workers sweep.

The scripts are run unmodified under ``dlwatch run`` on a generated JPEG
ImageFolder, watched by the live Monitor (3 s diagnosis window, as the TUI),
every snapshot kept. Each ``num_workers`` in the sweep runs twice, the passes
in opposite orders; a run's throughput is the train loader's batches per
second past its warm-up, from the snapshots' batch counters (the same clock
for every script). The hints are those a fresh Diagnoser shows on the
recorded snapshots: what the live view would have shown with this checkout's
rules, so a rule change is re-judged without re-running the sweep
(``--replay DIR``).

The scripts are not vendored: fetch them and point ``--timm`` at
pytorch-image-models' ``train.py``, ``--imagenet`` at pytorch/examples'
``imagenet/main.py`` and ``--dcgan`` at its ``dcgan/main.py``. They need
torchvision (and timm):

    flock /tmp/dlwatch-measure.lock .venv/bin/python bench/script_sweep.py \\
        --python /path/to/venv-with-torchvision/bin/python \\
        --timm train.py --imagenet main.py --dcgan dcgan/main.py --out /tmp/sweep

Figures from a shared box are what its load allowed; the table prints the
other processes' CPU dlwatch measured in each run. On a box shared with
other people's work, give the jobs a higher priority (``--priority -15``, as
root) so that their processes take less of the cores the sweep is about.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from image_folder_train import make_images  # noqa: E402

from dlwatch.diagnose import Diagnoser  # noqa: E402

WORKER_HINTS = (
    "no-workers",
    "add-workers",
    "io-bound",
    "cpu-bound-preprocessing",
    "pipeline-has-headroom",
    "workers-oversubscribe-cores",
)
# Settings: (name, script, image size of the generated JPEGs, script arguments).
# Small models and inputs so a CPU step is a fraction of a second; the heavier
# setting decodes larger JPEGs for the same step.
# The train split holds more batches than a run takes: no epoch boundary
# (validation, checkpoint) inside the measured span.
SETTINGS = {
    "timm-64": ("timm", (160, 120), 8000, "--model mobilenetv3_small_050 --img-size 64 -b 32"),
    "timm-64-big-jpeg": ("timm", (640, 480), 3200, "--model mobilenetv3_small_050 --img-size 64 -b 32"),
    "imagenet-mnv3s": ("imagenet", (320, 240), 1600, "-a mobilenet_v3_small -b 8"),
    # Two models a step (D then G), the loader decoding and resizing large JPEGs
    # to 64 px; the filter counts are cut so the CPU step is near the loading.
    "dcgan-64-big-jpeg": (
        "dcgan",
        (640, 480),
        4800,
        "--batchSize 32 --ngf 16 --ndf 16 --imageSize 64 --manualSeed 1",
    ),
}
# Seconds after the train loader's first batch that a run's throughput skips
# (worker start-up, cold caches), and the run's length after that.
WARM_S = 6.0


def dataset(root: str, size: tuple[int, int], images: int) -> str:
    d = os.path.join(root, f"jpeg-{size[0]}x{size[1]}-{images}")
    make_images(os.path.join(d, "train"), classes=4, per_class=images // 4, size=size)
    make_images(os.path.join(d, "val"), classes=4, per_class=8, size=size)
    return d


def script_cmd(kind: str, path: str, data: str, args: str, nw: int, out: str) -> list[str]:
    if kind == "timm":
        return [
            path,
            "--data-dir",
            data,
            "--train-split",
            "train",
            "--val-split",
            "val",
            "--device",
            "cpu",
            "-j",
            str(nw),
            "--epochs",
            "1",
            "--log-interval",
            "5",
            "--output",
            out,
            *args.split(),
        ]
    if kind == "dcgan":
        folder = ["--dataset", "folder", "--dataroot", os.path.join(data, "train")]
        return [path, *folder, "--workers", str(nw), "--niter", "1", "--outf", out, *args.split()]
    return [path, data, "-j", str(nw), "--epochs", "1", "-p", "5", *args.split()]


def run_job(
    python: str, cmd: list[str], seconds: float, rec: str, env_extra: dict, priority: int | None = None
) -> str:
    """Run ``cmd`` under ``dlwatch run``, watched, until the train loader has
    run ``seconds`` past warm-up; snapshots to ``rec`` (JSON Lines). Returns
    the script's stdout+stderr."""
    from dlwatch.collect.monitor import Monitor

    d = tempfile.mkdtemp(prefix="dlwsw", dir="/tmp")
    env = dict(os.environ, DLWATCH_DIR=d, **env_extra)
    log = open(rec + ".log", "w+")
    proc = subprocess.Popen(
        [python, "-m", "dlwatch", "run", "--", python, *cmd],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        cwd=os.path.dirname(rec),
    )
    if priority is not None:
        _set_priority(proc.pid, priority)
    m = Monitor(directory=d, interval=0.5, window_s=3.0)
    m.start()
    first = None
    last_t = None
    try:
        with open(rec, "w") as f:
            deadline = time.monotonic() + seconds + 180
            while proc.poll() is None and time.monotonic() < deadline:
                time.sleep(1.0)
                s = m.latest()
                if not s or s.get("time") == last_t:
                    continue
                last_t = s.get("time")
                f.write(json.dumps(s) + "\n")
                ld = _train_loader(s)
                if ld and ld.get("batches_total", 0) > 0 and first is None:
                    first = time.monotonic()
                if first is not None and time.monotonic() - first >= WARM_S + seconds:
                    break
    finally:
        m.stop()
        if proc.poll() is None:
            # SIGTERM: the scripts catch Ctrl-C to save a checkpoint, which is not measured.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    log.seek(0)
    return log.read()


def _set_priority(pid: int, nice: int) -> None:
    """The job's session's scheduling weight. With autogroup scheduling (the
    Linux default on desktops and many servers) each session competes as one
    group whatever its processes' own nice values, so a job in a new session
    is given its weight through /proc/PID/autogroup (a negative value needs
    root). Best effort: without it the sweep runs at the default weight."""
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(nice))
    except OSError as e:
        print(f"  (priority not set: {e})", file=sys.stderr)


def _train_loader(snap: dict) -> dict | None:
    """The loader with the most batches (the train loader) of the first live job."""
    for job in snap.get("jobs") or []:
        lds = [ld for ld in job.get("loaders") or [] if isinstance(ld, dict)]
        if lds:
            return max(lds, key=lambda ld: ld.get("batches_total") or 0)
    return None


def read_snaps(rec: str) -> list[dict]:
    with open(rec) as f:
        return [json.loads(line) for line in f if line.strip()]


def throughput(snaps: list[dict]) -> tuple[float | None, float | None, float | None]:
    """(batches/s, data wait, other processes' CPU) of the train loader from
    WARM_S after its first batch to the end: rate from the batch counter,
    wait from the loader's lifetime wait/step totals over the same span."""
    pts = []
    for s in snaps:
        ld = _train_loader(s)
        if ld and (ld.get("batches_total") or 0) > 0:
            pts.append((s["time"], ld, s.get("host", {}).get("other_cpu_cores")))
    if len(pts) < 3:
        return None, None, None
    t_first = pts[0][0]
    steady = [p for p in pts if p[0] >= t_first + WARM_S] or pts[len(pts) // 2 :]
    (t0, a, _), (t1, b, _) = steady[0], steady[-1]
    if t1 <= t0:
        return None, None, None
    rate = (b["batches_total"] - a["batches_total"]) / (t1 - t0)
    wait = step = None
    if a.get("wait_s_total") is not None and b.get("wait_s_total") is not None:
        wait = b["wait_s_total"] - a["wait_s_total"]
        step = b["step_s_total"] - a["step_s_total"]
    others = [p[2] for p in steady if isinstance(p[2], (int, float))]
    return (
        rate,
        wait / (wait + step) if wait is not None and wait + step > 0 else None,
        sorted(others)[len(others) // 2] if others else None,
    )


def replay_hints(snaps: list[dict]) -> dict:
    """The worker-count hints a fresh Diagnoser shows on the recorded
    snapshots past warm-up: per id, the severities, expected speed-ups and
    recommended counts seen, and how often it switched on or off."""
    d = Diagnoser()
    seen: dict[str, dict] = {}
    prev: set = set()
    switches = 0
    judged = 0
    t_first = None
    for s in snaps:
        hints = d.update(s)
        ld = _train_loader(s)
        if t_first is None and ld and (ld.get("batches_total") or 0) > 0:
            t_first = s["time"]
        if t_first is None or s["time"] < t_first + WARM_S:
            prev = {(h["id"], h["severity"]) for h in hints if h["id"] in WORKER_HINTS}
            continue
        judged += 1
        now = {(h["id"], h["severity"]) for h in hints if h["id"] in WORKER_HINTS}
        switches += len(now ^ prev)
        prev = now
        for h in hints:
            if h["id"] not in WORKER_HINTS:
                continue
            e = seen.setdefault(h["id"], {"severity": {}, "speedup": [], "rec": set(), "message": ""})
            e["severity"][h["severity"]] = e["severity"].get(h["severity"], 0) + 1
            ev = h.get("evidence") or {}
            if ev.get("expected_speedup") is not None:
                e["speedup"].append(ev["expected_speedup"])
            rec = ev.get("recommended_num_workers")
            if rec is None:
                rec = ev.get("considered_num_workers")  # weighed, under the 10 % bar
            if rec is None and h["id"] == "workers-oversubscribe-cores":
                recs = ev.get("recommended_num_workers_by_loader") or []
                rec = recs[0]["recommended_num_workers"] if recs else None
            if rec is not None:
                e["rec"].add(rec)
            e["message"] = h["message"]
            e["suggestion"] = h["suggestion"]
    for e in seen.values():
        e["rec"] = sorted(e["rec"])
        sp = sorted(e["speedup"])
        e["speedup_median"] = sp[len(sp) // 2] if sp else None
        e["shown_of"] = judged
    return {"hints": seen, "switches": switches, "judged": judged}


def script_meter(log: str, kind: str) -> tuple[float | None, float | None]:
    """The script's own data-time fraction: as it prints it (its running
    averages since the epoch's first batch, worker start-up included), and
    between its first printed line from the 10th step and its last (from
    avg × count, so the first batches drop out)."""
    if kind == "dcgan":  # it prints losses, not times
        return None, None
    rows = []
    if kind == "imagenet":
        pat = re.compile(
            r"\[\s*(\d+)/\s*\d+\].*?Time\s+[\d.]+ \(\s*([\d.]+)\)"  # "[ 11/125]  Time 0.1 ( 0.2)"
            r".*?Data\s+[\d.]+ \(\s*([\d.]+)\)"
        )
        for m in pat.finditer(log):
            rows.append((int(m.group(1)), float(m.group(2)), float(m.group(3))))
    else:
        pat = re.compile(
            # "Train: 0 [   5/50 ...] Time: 0.1s, ... (0.2s, ...) ... Data: 0.003 (0.020)"
            r"Train: \d+ \[\s*(\d+)/\d+.*?Time: [\d.]+s,.*?\(([\d.]+)s,"
            r".*?Data: [\d.]+ \(([\d.]+)\)"
        )
        for m in pat.finditer(log):
            rows.append((int(m.group(1)) + 1, float(m.group(2)), float(m.group(3))))
    printed = rows[-1][2] / rows[-1][1] if rows and rows[-1][1] > 0 else None
    rows = [r for r in rows if r[0] >= 10]
    if len(rows) < 2:
        return printed, None
    (n0, t0, d0), (n1, t1, d1) = rows[0], rows[-1]
    dt = t1 * n1 - t0 * n0
    dd = d1 * n1 - d0 * n0
    return printed, (dd / dt if n1 > n0 and dt > 0 else None)


def sweep_order(workers: Iterable[int], passes: int) -> list[int]:
    ws = list(workers)
    out: list[int] = []
    for p in range(passes):
        out += ws if p % 2 == 0 else ws[::-1]
    return out


def add_arguments(p: argparse.ArgumentParser, prefix: str = "") -> None:
    """The sweep's options (``prefix`` for another benchmark's parser)."""
    p.add_argument("--python", default=sys.executable, help="interpreter with torchvision (and timm)")
    p.add_argument(
        "--timm",
        default=os.environ.get("DLWATCH_TIMM_TRAIN"),
        help="pytorch-image-models' train.py (default: $DLWATCH_TIMM_TRAIN)",
    )
    p.add_argument(
        "--imagenet",
        default=os.environ.get("DLWATCH_IMAGENET_MAIN"),
        help="pytorch/examples' imagenet/main.py (default: $DLWATCH_IMAGENET_MAIN)",
    )
    p.add_argument(
        "--dcgan",
        default=os.environ.get("DLWATCH_DCGAN_MAIN"),
        help="pytorch/examples' dcgan/main.py (default: $DLWATCH_DCGAN_MAIN)",
    )
    p.add_argument(f"--{prefix}only", dest="sweep_only", help="settings whose name contains this")
    p.add_argument("--workers", default="0,1,2,3,4")
    p.add_argument("--passes", type=int, default=2)
    p.add_argument(
        f"--{prefix}seconds",
        dest="sweep_seconds",
        type=float,
        default=12.0,
        help="measured seconds per run, past warm-up",
    )
    p.add_argument("--out", default=os.path.join(tempfile.gettempdir(), "dlwatch-script-sweep"))
    p.add_argument(
        "--priority",
        type=int,
        help="autogroup nice of each job's session (e.g. -15 as root on a shared box: other "
        "sessions' processes then take less of the cores the sweep is about)",
    )
    p.add_argument(
        "--replay", action="store_true", help="judge the recorded runs in --out again, run nothing"
    )


def run(a: argparse.Namespace) -> None:
    os.makedirs(a.out, exist_ok=True)
    scripts = {"timm": a.timm, "imagenet": a.imagenet, "dcgan": a.dcgan}
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [_repo(), os.environ.get("PYTHONPATH")]))}
    workers = [int(x) for x in a.workers.split(",")]
    for name, (kind, size, images, args) in SETTINGS.items():
        if a.sweep_only and a.sweep_only not in name:
            continue
        path = scripts[kind]
        if not a.replay and (not path or not os.path.exists(path)):
            print(f"{name}: skipped (no --{kind} script)")
            continue
        if not a.replay:
            data = dataset(a.out, size, images)
            for i, nw in enumerate(sweep_order(workers, a.passes)):
                rec = os.path.join(a.out, f"{name}-nw{nw}-run{i}.jsonl")
                out_dir = os.path.join(a.out, "output")
                os.makedirs(out_dir, exist_ok=True)
                cmd = script_cmd(kind, path, data, args, nw, out_dir)
                log = run_job(a.python, cmd, a.sweep_seconds, rec, env, a.priority)
                rate, _, _ = throughput(read_snaps(rec))
                print(f"  {name} num_workers={nw}: {rate or 0:.2f} batches/s", flush=True)
                if rate is None:
                    print(log[-2000:])
        report(a.out, name, kind, workers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(p)
    run(p.parse_args())


def _repo() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def report(out: str, name: str, kind: str, workers: list[int]) -> None:
    runs: dict[int, list] = {}
    for f in sorted(os.listdir(out)):
        m = re.fullmatch(rf"{re.escape(name)}-nw(\d+)-run(\d+)\.jsonl", f)
        if m:
            rec = os.path.join(out, f)
            snaps = read_snaps(rec)
            try:
                log = open(rec + ".log").read()
            except OSError:
                log = ""
            runs.setdefault(int(m.group(1)), []).append(
                {"snaps": snaps, "tp": throughput(snaps), "meter": script_meter(log, kind)}
            )
    if not runs:
        return
    rate = {nw: _mean([r["tp"][0] for r in rs]) for nw, rs in runs.items()}
    best = max((nw for nw in rate if rate[nw]), key=lambda nw: rate[nw], default=None)
    print(f"\n{name}: sweep (batches/s, mean of passes; each pass)")
    for nw in sorted(rate):
        each = ", ".join(f"{r['tp'][0]:.2f}" for r in runs[nw] if r["tp"][0])
        print(f"  nw={nw}: {rate[nw] or 0:.2f} ({each})  {'<- best' if nw == best else ''}")
    print(f"{name}: hints (first pass of each setting, replayed through this checkout's rules)")
    for nw in sorted(runs):
        r0 = runs[nw][0]
        h = replay_hints(r0["snaps"])
        rate_now, wait, others = r0["tp"]
        printed, steady = r0["meter"]
        print(
            f"  nw={nw}: wait {_p(wait)} (script's meter as printed {_p(printed)}, past its 10th step "
            f"{_p(steady)}), others {others} cores, "
            f"{h['switches']} on/off switches in {h['judged']} s"
        )
        for hid, e in sorted(h["hints"].items()):
            sev = "/".join(f"{k}:{v}" for k, v in sorted(e["severity"].items()))
            sp = e["speedup_median"]
            truth = ""
            if e["rec"] and rate.get(nw):
                n = e["rec"][0]
                if n in rate and rate[n]:
                    truth = f" sweep {rate[n] / rate[nw]:.2f}x for nw={n}"
            print(f"    {hid} [{sev} of {e['shown_of']}] rec={e['rec']} expected={sp}{truth}")
            print(f"      {e['message'][:300]}")
    with open(os.path.join(out, f"{name}-summary.json"), "w") as f:
        json.dump({"rate": rate, "best": best}, f)


def _mean(xs):
    xs = [x for x in xs if x]
    return sum(xs) / len(xs) if xs else None


def _p(x):
    return "-" if x is None else f"{x * 100:.1f} %"


if __name__ == "__main__":
    main()
