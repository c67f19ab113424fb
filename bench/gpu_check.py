"""GPU checks: what only a machine with an NVIDIA GPU can confirm (issue 31).

Run from the repository root on a box with an NVIDIA GPU and CUDA torch
(2.1 or newer; written to run on 2.11 as on the H100 box: nothing here needs
a newer API, and bf16 falls back to fp16 where the GPU lacks it):

    python bench/gpu_check.py [nvml]        # GpuSampler under a matmul load, against nvidia-smi
    python bench/gpu_check.py verdicts      # the five profiler-burst verdict cases
    python bench/gpu_check.py wait          # the hook's data wait against the loop's own
    python bench/gpu_check.py tune          # dlwatch tune against plain runs, image pipeline on CUDA
    python bench/gpu_check.py overhead      # the hook's cost: paired, alternating runs
    python bench/gpu_check.py all --json gpu_check.json

Each check prints what it measured and PASS/FAIL against the bar named in
it; the last lines are a table of all. Exit status 0 when every check that
ran passed, 1 when one failed, 2 without CUDA torch. ``nvml`` with no other
argument is what bench/gpu_session.sh has always run.

The image pipeline (bench/image_pipeline.py) needs Pillow; the checks that
use it say so and are skipped without it. Nothing here downloads anything.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from dlwatch.collect.gpu import GpuSampler  # noqa: E402

PIPELINE = os.path.join(ROOT, "bench", "image_pipeline.py")
TIMED_JOB = os.path.join(ROOT, "tests", "jobs", "timed_job.py")
# Student t quantiles (two-sided 95 %) for the overhead's interval, by degrees of freedom.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}


# --------------------------------------------------------------------- helpers


def env_with(runtime_dir: str, **extra: str) -> dict:
    e = dict(os.environ)
    e["DLWATCH_DIR"] = runtime_dir
    e["PYTHONPATH"] = ROOT + (os.pathsep + e["PYTHONPATH"] if e.get("PYTHONPATH") else "")
    e.update(extra)
    return e


def dlwatch(runtime_dir: str, *args: str, timeout: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dlwatch", *args],
        env=env_with(runtime_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(path: str, proc: subprocess.Popen, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


def have_pillow() -> bool:
    try:
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


def result(name: str, passed: bool | None, summary: str, **figures) -> dict:
    mark = {True: "PASS", False: "FAIL", None: "SKIP"}[passed]
    print(f"[{mark}] {name}: {summary}", flush=True)
    return {"check": name, "passed": passed, "summary": summary, **figures}


# --------------------------------------------------------------------- nvml


def matmul_loop(device: int, stop_ev: threading.Event, ready: threading.Event, n: int = 4096) -> None:
    import torch

    dev = torch.device("cuda", device)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    torch.cuda.synchronize(dev)
    ready.set()
    while not stop_ev.is_set():
        for _ in range(20):
            a = (a @ b).tanh_()
        # Without a sync the queue grows unbounded and stop would wait for all of it.
        torch.cuda.synchronize(dev)
        time.sleep(0.01)  # a GPU not quite always busy: the mean is worth checking


def nvidia_smi(device: int) -> tuple[float, float] | None:
    """(utilization %, memory used MiB) as nvidia-smi reports them."""
    if shutil.which("nvidia-smi") is None:
        return None
    r = subprocess.run(
        ["nvidia-smi", "-i", str(device), "--query-gpu=utilization.gpu,memory.used"]
        + ["--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    try:
        util, mem = (float(x) for x in r.stdout.strip().splitlines()[0].split(","))
    except (ValueError, IndexError):
        return None
    return util, mem


def check_nvml(args) -> list[dict]:
    sampler = GpuSampler()
    status, gpus = sampler.sample()
    print(f"idle sample: {status}")
    stop_ev, ready = threading.Event(), threading.Event()
    worker = threading.Thread(target=matmul_loop, args=(args.device, stop_ev, ready), daemon=True)
    worker.start()
    if not ready.wait(60):
        return [result("nvml", False, "CUDA warm-up did not finish in 60 s")]
    time.sleep(1.0)
    ours, smi_util, smi_mem, our_mem, sources, statuses = [], [], [], [], set(), set()
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        status, gpus = sampler.sample()
        statuses.add(status)
        smi = nvidia_smi(args.device)
        for g in gpus:
            if g["index"] != args.device:
                continue
            print(
                f"  dlwatch util {g['util_percent']} % ({g.get('util_source')}, "
                f"{g.get('util_samples')} samples, "
                f"{g.get('util_min_percent')}-{g.get('util_max_percent')}) mem {g['mem_used_bytes']}"
                + (f" | nvidia-smi util {smi[0]:.0f} % mem {smi[1]:.0f} MiB" if smi else "")
            )
            if g["util_percent"] is not None:
                ours.append(g["util_percent"])
                sources.add(g.get("util_source"))
            if g["mem_used_bytes"] is not None:
                our_mem.append(g["mem_used_bytes"] / 2**20)
        if smi:
            smi_util.append(smi[0])
            smi_mem.append(smi[1])
        time.sleep(1.0)
    stop_ev.set()
    worker.join(30)
    sampler.close()
    out = []
    if statuses != {"ok"} or not ours:
        return [result("nvml", False, f"statuses {sorted(statuses)}, {len(ours)} utilization figures")]
    out.append(
        result(
            "nvml: utilization under load",
            max(ours) > 0,
            f"mean {statistics.mean(ours):.1f} % over {len(ours)} figures, "
            f"sources {sorted(map(str, sources))}",
        )
    )
    if not smi_util:
        out.append(result("nvml vs nvidia-smi", None, "nvidia-smi not found"))
        return out
    du = statistics.mean(ours) - statistics.mean(smi_util)
    dm = statistics.median(our_mem) - statistics.median(smi_mem) if our_mem else math.nan
    # Bars: utilization means within 10 points (the two sample the same
    # counter over slightly different periods); memory within 64 MiB (the
    # field's v1 figure was +480 MiB).
    out.append(
        result(
            "nvml vs nvidia-smi",
            abs(du) <= 10.0 and abs(dm) <= 64.0,
            f"utilization mean {statistics.mean(ours):.1f} vs {statistics.mean(smi_util):.1f} % "
            f"({du:+.1f}); memory used {dm:+.0f} MiB against nvidia-smi",
            util_delta=du,
            mem_delta_mib=dm,
        )
    )
    return out


# --------------------------------------------------------------------- the five verdict cases


def run_case(case: str, seconds: float, ready: str) -> None:
    """One verdict case's training loop (run as a child: `gpu_check.py job CASE`)."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    import dlwatch.hook  # noqa: F401

    dev = torch.device("cuda")
    end = None

    def started() -> bool:
        nonlocal end
        if end is None:
            end = time.monotonic() + seconds
            open(ready, "w").close()
        return time.monotonic() < end

    def train(net, opt, loader) -> None:
        while True:
            for x, y in loader:
                if not started():
                    return
                loss = nn.functional.cross_entropy(net(x.to(dev)), y.to(dev))
                opt.zero_grad()
                loss.backward()
                opt.step()

    if case == "tiny-ops":
        loader = DataLoader(TensorDataset(torch.arange(10**6, dtype=torch.float32)), batch_size=8)
        x = torch.zeros(4, device=dev)
        while True:
            for (batch,) in loader:
                if not started():
                    return
                y = x + batch[:4].to(dev)
                for _ in range(2000):
                    y = y + 1
                y.sum().item()
    if case == "bf16-matmul":
        bf16 = getattr(torch.cuda, "is_bf16_supported", lambda: False)()
        dtype = torch.bfloat16 if bf16 else torch.float16
        w = torch.randn(8192, 8192, device=dev, dtype=dtype) / 100
        loader = DataLoader(TensorDataset(torch.arange(10**6, dtype=torch.float32)), batch_size=8)
        while True:
            for _batch in loader:
                if not started():
                    return
                y = w
                for _ in range(8):
                    y = (y @ w).tanh_()
                y.float().sum().item()
    if case == "mlp-batch-1":
        net = nn.Sequential(
            nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
        net = net.to(dev)
        opt = torch.optim.Adam(net.parameters())
        data = TensorDataset(torch.randn(10**5, 256), torch.randint(0, 10, (10**5,)))
        loader = DataLoader(data, batch_size=1)
        train(net, opt, loader)
        return
    if case == "data-bound-cnn":

        class Slow(Dataset):
            def __len__(self):
                return 10**6

            def __getitem__(self, i):
                time.sleep(0.0015)  # storage: 48 ms a batch of 32 in one worker
                return torch.randn(3, 128, 128), i % 10

        net = nn.Sequential(
            nn.Conv2d(3, 64, 3, 2, 1), nn.ReLU(), nn.Conv2d(64, 128, 3, 2, 1), nn.ReLU(),
            nn.Conv2d(128, 256, 3, 2, 1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 10),
        ).to(dev)  # fmt: skip
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        loader = DataLoader(Slow(), batch_size=32, num_workers=2, persistent_workers=True)
        train(net, opt, loader)
        return
    raise SystemExit(f"unknown case {case}")


CASES = {
    # case: (command after the interpreter, expected verdict or None: judged by the loop's own wait)
    "tiny-ops": (["job", "tiny-ops"], "launch-bound"),
    "bf16-matmul": (["job", "bf16-matmul"], "gpu-bound"),
    "mlp-batch-1": (["job", "mlp-batch-1"], "launch-bound"),
    "data-bound-cnn": (["job", "data-bound-cnn"], None),
    "image-pipeline-12-workers": (None, None),
}


def case_command(case: str, ready: str, seconds: float) -> list[str] | None:
    argv, _ = CASES[case]
    if argv is not None:
        return [sys.executable, os.path.abspath(__file__), *argv, "--seconds", str(seconds), "--ready", ready]
    if not have_pillow():
        return None
    workers = min(12, os.cpu_count() or 1)
    # The pipeline imports nothing of dlwatch: `dlwatch run` puts the hook in.
    return [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, PIPELINE, "--device", "cuda"] + [
        "--num-workers", str(workers), "--seconds", str(seconds), "--batch-size", "128", "--images", "2048",
    ]  # fmt: skip


def check_verdict(case: str, args) -> dict:
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    ready = os.path.join(d, "ready")
    cmd = case_command(case, ready, args.job_seconds)
    if cmd is None:
        return result(f"verdict {case}", None, "needs Pillow (bench/image_pipeline.py)")
    proc = subprocess.Popen(
        cmd, env=env_with(d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        if CASES[case][0] is not None and not wait_for(ready, proc, 120):
            err = proc.stderr.read().decode()[-500:] if proc.poll() is not None and proc.stderr else ""
            return result(f"verdict {case}", False, f"the job never reached its first batch {err}")
        time.sleep(args.settle)  # cudnn, allocator, workers: past the start
        snap = dlwatch(d, "snapshot", "--json", "--pid", str(proc.pid), "--window", "5")
        prof = dlwatch(d, "profile", "--pid", str(proc.pid), "--steps", "20", "--json", "--out", d)
    finally:
        stop(proc)
    if prof.returncode != 0:
        return result(f"verdict {case}", False, f"profile failed: {prof.stderr.strip()[-300:]}")
    doc = json.loads(prof.stdout)
    loop_wait = None
    try:
        jobs = json.loads(snap.stdout)["jobs"]
        loop_wait = max(ld["data_wait_fraction"] or 0.0 for j in jobs for ld in j["loaders"])
    except (ValueError, KeyError, TypeError):
        pass
    want = CASES[case][1]
    if want is None:
        # Judged by the loop's own wait before the burst (the snapshot): the
        # verdict must be data-bound exactly when that wait is >= 30 %.
        want = "data-bound" if loop_wait is not None and loop_wait >= 0.30 else "not data-bound"
    got = doc.get("verdict")
    ok = got == want or (want == "not data-bound" and got not in (None, "data-bound"))
    plain = doc.get("unprofiled") or {}
    return result(
        f"verdict {case}",
        ok,
        f"{got} (want {want}); loop wait before the burst {loop_wait}, around it "
        f"{plain.get('data_wait_fraction')}, in it {doc.get('data_wait_fraction')}; {doc.get('reason')}",
        verdict=got,
        want=want,
        loop_wait=loop_wait,
        doc=doc,
    )


# --------------------------------------------------------------------- data wait vs the loop's own


def check_wait(args) -> list[dict]:
    from tests.e2e_util import Job, snapshot_json, truth_in_window

    out = []
    for pin in (False, True):
        job = Job(
            "--cuda", "--workers", "2", "--sample-ms", "4", "--step-ms", "3", "--duration", "20",
            *(["--pin-memory"] if pin else []),
        )  # fmt: skip
        try:
            job.wait_ready(5.0)
            snap = snapshot_json(job.dir, "--window", "5")
            res = job.finish()
        finally:
            job.cleanup()
        ld = next(j for j in snap["jobs"] if j["pid"] == job.proc.pid)["loaders"][0]
        start, end = ld["window_mono_ns"]
        truth = truth_in_window(res["recs"]["train"]["batches"], start, end)["data_wait_fraction"]
        got = ld["data_wait_fraction"]
        out.append(
            result(
                f"data wait vs the loop's own (pin_memory={pin})",
                got is not None and abs(got - truth) <= 0.02,
                f"dlwatch {got} vs the loop's {truth:.4f} (bar: within 0.02)",
            )
        )
    return out


# --------------------------------------------------------------------- tune vs plain runs


def pipeline_pace(workers: int, seconds: float, hook: bool, data: str) -> float | None:
    """img/s of the image pipeline on CUDA, plain (or under `dlwatch run`)."""
    out = os.path.join(tempfile.mkdtemp(prefix="dlw-gpu-"), "meter.json")
    cmd = [
        sys.executable,
        PIPELINE,
        "--device",
        "cuda",
        "--num-workers",
        str(workers),
        "--seconds",
        str(seconds),
    ]
    cmd += [
        "--skip-seconds",
        str(min(10.0, seconds / 3)),
        "--json",
        out,
        "--data",
        data,
        "--batch-size",
        "128",
    ]
    cmd += ["--images", "2048"]
    if hook:
        cmd = [sys.executable, "-m", "dlwatch", "run", "--", *cmd]
    env = env_with(tempfile.mkdtemp(prefix="dlw-gpu-"), **({} if hook else {"DLWATCH_DISABLE": "1"}))
    subprocess.run(cmd, env=env, capture_output=True, timeout=seconds + 300)
    try:
        with open(out) as f:
            return json.load(f)["images_per_s"]
    except (OSError, ValueError, KeyError):
        return None


def check_tune(args) -> list[dict]:
    if not have_pillow():
        return [result("tune vs plain runs", None, "needs Pillow (bench/image_pipeline.py)")]
    data = os.path.join(tempfile.gettempdir(), "dlwatch-gpu-jpegs")
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    r = dlwatch(
        d, "tune", "--json", "--trial-seconds", "15", "--max-trials", "5", "--",
        sys.executable, PIPELINE, "--device", "cuda", "--num-workers", "4", "--seconds", "100000",
        "--data", data, "--batch-size", "128", "--images", "2048",
        timeout=3600,
    )  # fmt: skip
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        return [result("tune vs plain runs", False, f"tune printed no JSON: {r.stderr[-300:]}")]
    best = (doc.get("best") or {}).get("settings") or {}
    nw = best.get("num_workers")
    if nw is None or doc.get("speedup") is None:
        return [result("tune vs plain runs", False, f"no best setting: {doc.get('recommendation')}")]
    # The sweep: plain runs at the baseline, tune's pick and a ladder of counts.
    cores = os.cpu_count() or 1
    ladder = sorted({4, int(nw), *(n for n in (2, 8, 12, 16, 24) if n <= cores)})
    sweep = {n: pipeline_pace(n, 40, False, data) for n in ladder}
    for n, ips in sweep.items():
        print(f"  plain run, num_workers={n}: {ips} img/s")
    base, top = sweep.get(4), sweep.get(int(nw))
    if not base or not top:
        return [result("tune vs plain runs", False, "a plain run gave no meter")]
    plain_gain = top / base
    best_n = max((n for n in sweep if sweep[n]), key=lambda n: sweep[n] or 0.0)
    sweep_gain = (sweep[best_n] or 0.0) / base
    ok = abs(doc["speedup"] / plain_gain - 1) <= 0.25
    return [
        result(
            "tune vs plain runs",
            ok,
            f"tune {doc['speedup']:.2f}x at num_workers={nw}; plain runs {top:.0f} vs {base:.0f} img/s = "
            f"{plain_gain:.2f}x (bar: within 25 %); the sweep's best: {sweep_gain:.2f}x at {best_n}",
            tune_speedup=doc["speedup"],
            plain_gain=plain_gain,
            sweep={str(n): v for n, v in sweep.items()},
        )
    ]


# --------------------------------------------------------------------- overhead


def check_overhead(args) -> list[dict]:
    if not have_pillow():
        return [result("hook overhead", None, "needs Pillow (bench/image_pipeline.py)")]
    data = os.path.join(tempfile.gettempdir(), "dlwatch-gpu-jpegs")
    workers = min(8, os.cpu_count() or 1)
    pipeline_pace(workers, 20, False, data)  # JPEGs on disk and in the page cache, CUDA warm
    ratios = []
    for i in range(args.pairs):
        # Alternate which goes first: drift (clocks, page cache) falls on both sides.
        order = (False, True) if i % 2 == 0 else (True, False)
        pace = {hook: pipeline_pace(workers, args.overhead_seconds, hook, data) for hook in order}
        if not pace[False] or not pace[True]:
            return [result("hook overhead", False, f"pair {i + 1} gave no meter")]
        ratios.append(pace[False] / pace[True] - 1)  # slowdown with the hook
        print(
            f"  pair {i + 1}: plain {pace[False]:.1f}, hooked {pace[True]:.1f} img/s: "
            f"{ratios[-1] * 100:+.2f} %"
        )
    mean = statistics.mean(ratios)
    half = (
        T95.get(len(ratios) - 1, 2.0) * statistics.stdev(ratios) / math.sqrt(len(ratios))
        if len(ratios) > 1
        else math.inf
    )
    return [
        result(
            "hook overhead",
            mean + half <= 0.01 if math.isfinite(half) else None,
            f"{mean * 100:+.2f} % ± {half * 100:.2f} (95 %, {len(ratios)} paired alternating runs, "
            f"{workers} workers; goal: <= 1 %)",
            overhead_mean=mean,
            overhead_ci95=half,
            pairs=ratios,
        )
    ]


# --------------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "check",
        nargs="?",
        default="nvml",
        choices=["nvml", "verdicts", "wait", "tune", "overhead", "all", "job"],
    )
    ap.add_argument("case", nargs="?", help="with `job`: the verdict case to run (internal)")
    ap.add_argument("--seconds", type=float, default=6.0, help="nvml: seconds of load; job: its duration")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--ready", help="job: the file to create at the first batch (internal)")
    ap.add_argument("--job-seconds", type=float, default=90.0, help="verdicts: each case job's duration")
    ap.add_argument("--settle", type=float, default=20.0, help="verdicts: seconds before the burst")
    ap.add_argument("--pairs", type=int, default=5, help="overhead: paired runs")
    ap.add_argument("--overhead-seconds", type=float, default=60.0, help="overhead: seconds per run")
    ap.add_argument("--json", metavar="PATH", help="write every check's figures here")
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    if args.check == "job":
        run_case(args.case or "", args.seconds, args.ready or os.devnull)
        return 0
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(args.device)}")
    results: list[dict] = []
    wanted = ["nvml", "verdicts", "wait", "tune", "overhead"] if args.check == "all" else [args.check]
    for check in wanted:
        if check == "nvml":
            results += check_nvml(args)
        elif check == "verdicts":
            results += [check_verdict(c, args) for c in CASES]
        elif check == "wait":
            results += check_wait(args)
        elif check == "tune":
            results += check_tune(args)
        elif check == "overhead":
            results += check_overhead(args)
    print("\n| check | result | figures |\n| --- | --- | --- |")
    for r in results:
        mark = {True: "pass", False: "FAIL", None: "skipped"}[r["passed"]]
        print(f"| {r['check']} | {mark} | {r['summary']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "results": results}, f, indent=1, default=str)
    return 1 if any(r["passed"] is False for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
