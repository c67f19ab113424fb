"""GPU checks: what only a machine with an NVIDIA GPU can confirm (issue 31).

Run from the repository root on a box with an NVIDIA GPU and CUDA torch
(2.1 or newer; written to run on 2.11 as on the H100 box: nothing here needs
a newer API, and bf16 falls back to fp16 where the GPU lacks it):

    python bench/gpu_check.py [nvml]        # GpuSampler under a matmul load, against nvidia-smi
    python bench/gpu_check.py verdicts      # the five profiler-burst verdict cases
    python bench/gpu_check.py wait          # the hook's data wait against the loop's own
    python bench/gpu_check.py pin           # the pin-memory hint against plain runs with and without
    python bench/gpu_check.py tune          # dlwatch tune against plain runs, image pipeline on CUDA
    python bench/gpu_check.py overhead      # the hook's cost: paired, alternating runs
    python bench/gpu_check.py all --budget 420 --json gpu_check.json

Each check prints what it measured and PASS/FAIL against the bar named in
it; the last lines are a table of all. Exit status 0 when every check that
ran passed, 1 when one failed, 2 without CUDA torch. ``nvml`` with no other
argument is what bench/gpu_session.sh has always run.

A session lent a GPU has minutes, not hours: ``--budget S`` runs the checks
in the order given (``all``: verdicts, nvml, pin, tune, overhead, wait) and
skips, with a line saying so, any whose estimated time no longer fits; the
``--json`` file is rewritten after every check, so a run stopped at its limit
still leaves what it measured. The defaults are sized for that (about 7
minutes for ``all`` on a 16-core H100 box); the longer runs a release
deserves are options (``--pairs 5 --overhead-seconds 60`` and so on).

``--rehearse`` runs the same orchestration on the CPU with smaller jobs, on a
box without a GPU: it checks that every step runs and how long each takes
before device time is spent on it. Its verdicts and figures are the CPU's,
not the checks' bars: the CUDA-only cases are reported, not judged.

The image pipeline (bench/image_pipeline.py) needs Pillow; the checks that
use it say so and are skipped without it. Nothing here downloads anything.
"""

from __future__ import annotations

import argparse
import importlib.util
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
# Generated once (2048 JPEGs, ~10 s) and shared by every check that runs the pipeline.
JPEGS = os.path.join(tempfile.gettempdir(), "dlwatch-gpu-jpegs")
# Student t quantiles (two-sided 95 %) for the overhead's interval, by degrees of freedom.
T95 = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}
# "cuda", or "cpu" under --rehearse (set once in main, and in a case's child).
DEVICE = "cuda"


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


def stepping(runtime_dir: str, proc: subprocess.Popen, timeout: float) -> bool:
    """Wait until the job (started under `dlwatch run`, so with no ready
    file of its own) has a DataLoader that has returned a batch."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        r = dlwatch(runtime_dir, "snapshot", "--json", "--pid", str(proc.pid), "--window", "1", timeout=60)
        try:
            jobs = json.loads(r.stdout)["jobs"]
            if any((ld.get("batches_total") or 0) > 0 for j in jobs for ld in j["loaders"]):
                return True
        except (ValueError, KeyError, TypeError):
            pass
        time.sleep(1.0)
    return False


def prepare_jpegs() -> None:
    """Make the pipeline's JPEGs once, before any check times a run."""
    if have_pillow():
        subprocess.run(
            [*pipeline_command(0, 0.1), "--json", os.devnull], env=env_with(tempfile.mkdtemp()), timeout=600
        )


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


def run_case(case: str, seconds: float, ready: str, meter: str | None = None) -> None:
    """One verdict case's training loop (run as a child: `gpu_check.py job CASE`).

    With ``meter``, the loop's own pace: steps per second after the first
    third of the run (at most 8 s: CUDA, cudnn and the allocator settle),
    written there as JSON when the run ends. The overhead check compares it
    with and without the hook (``DLWATCH_DISABLE=1``).
    """
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, Dataset, TensorDataset

    import dlwatch.hook  # noqa: F401

    dev = torch.device(DEVICE)
    # A rehearsal on a CPU runs the same loops at sizes a CPU gets through.
    small = DEVICE == "cpu"
    end = None
    skip = min(8.0, seconds / 3)
    counted, t_count = 0, None

    def started() -> bool:
        # Called once a step, before the step's work.
        nonlocal end, counted, t_count
        now = time.monotonic()
        if end is None:
            end = now + seconds
            open(ready, "w").close()
        if now >= end:
            if meter and t_count is not None and now > t_count:
                with open(meter, "w") as f:
                    # `counted` steps began at or after t_count, and the last one has ended by now
                    json.dump({"steps_per_s": counted / (now - t_count), "steps": counted}, f)
            return False
        if now >= end - seconds + skip:
            if t_count is None:
                t_count = now
            counted += 1
        return True

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
                for _ in range(200 if small else 2000):
                    y = y + 1
                y.sum().item()
    if case == "bf16-matmul":
        bf16 = small or getattr(torch.cuda, "is_bf16_supported", lambda: False)()
        dtype = torch.bfloat16 if bf16 else torch.float16
        n = 256 if small else 8192
        w = torch.randn(n, n, device=dev, dtype=dtype) / 100
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
                side = 32 if small else 128
                return torch.randn(3, side, side), i % 10

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
    # case: (command after the interpreter, expected verdict on CUDA, or None: judged by the loop's own wait)
    "tiny-ops": (["job", "tiny-ops"], "launch-bound"),
    "bf16-matmul": (["job", "bf16-matmul"], "gpu-bound"),
    "mlp-batch-1": (["job", "mlp-batch-1"], "launch-bound"),
    "data-bound-cnn": (["job", "data-bound-cnn"], None),
    "image-pipeline-12-workers": (None, None),
}


def case_command(case: str, ready: str, seconds: float) -> list[str] | None:
    argv, _ = CASES[case]
    if argv is not None:
        rehearse = ["--rehearse"] if DEVICE == "cpu" else []
        here = os.path.abspath(__file__)
        return [sys.executable, here, *argv, "--seconds", str(seconds), "--ready", ready, *rehearse]
    if not have_pillow():
        return None
    workers = min(12, os.cpu_count() or 1)
    # The pipeline imports nothing of dlwatch: `dlwatch run` puts the hook in.
    return [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, PIPELINE, "--device", DEVICE] + [
        "--num-workers", str(workers), "--seconds", str(seconds), "--batch-size", "128", "--images", "2048",
        "--data", JPEGS,
    ]  # fmt: skip


def job_hints(snapshot: dict, pid: int) -> list[dict]:
    """A snapshot's hints about one job (a hint names its job as ``job_pid``).

    Until 2026-11-28 this read ``pid``, which no hint has: the pin check and
    the verdicts' live view saw no hint on either H100 run, whatever the rules said.
    """
    return [h for h in snapshot.get("hints") or [] if h.get("job_pid") == pid]


def check_verdict(case: str, args) -> list[dict]:
    """The burst's verdict and, for a launch-bound case, the live view's hint beside it."""
    row = verdict_row(case, args)
    if CASES[case][1] != "launch-bound" or "live" not in row:
        return [row]
    hints = row["live"].get("hints")
    ok = None if DEVICE == "cpu" or hints is None else "main-loop-cpu-bound" in hints
    return [
        row,
        result(
            f"live hint {case}",
            ok,
            f"hints {hints} (want main-loop-cpu-bound: the loop hardly waits, the host is busy, "
            f"the GPU idles); the live view read {row['live']}",
        ),
    ]


def verdict_row(case: str, args) -> dict:
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    ready = os.path.join(d, "ready")
    cmd = case_command(case, ready, args.job_seconds)
    if cmd is None:
        return result(f"verdict {case}", None, "needs Pillow (bench/image_pipeline.py)")
    proc = subprocess.Popen(
        cmd, env=env_with(d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        started = wait_for(ready, proc, 120) if CASES[case][0] is not None else stepping(d, proc, 120)
        if not started:
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
    loop_wait, live = None, {}
    try:
        sdoc = json.loads(snap.stdout)
        jobs = sdoc["jobs"]
        loop_wait = max(ld["data_wait_fraction"] or 0.0 for j in jobs for ld in j["loaders"])
        # What the live view said beside the burst: the host threads it read
        # (autograd's backward thread is on its own on CUDA) and its hints.
        job = next(j for j in jobs if j["pid"] == proc.pid)
        live = {
            "gpu_util_percent": [g.get("util_window_percent") for g in sdoc.get("gpus") or []],
            "main_thread_cpu_percent": job.get("main_thread_cpu_percent"),
            "autograd_cpu_percent": job.get("autograd_cpu_percent"),
            "hints": sorted({h["id"] for h in job_hints(sdoc, proc.pid)}),
        }
    except (ValueError, KeyError, TypeError, StopIteration):
        pass
    want = CASES[case][1]
    if want is not None and DEVICE == "cpu":
        want = "(a CUDA verdict: not judged on a CPU)"
    elif want is None:
        # Judged by the loop's own wait before the burst (the snapshot): the
        # verdict must be data-bound exactly when that wait is >= 30 %.
        want = "data-bound" if loop_wait is not None and loop_wait >= 0.30 else "not data-bound"
    got = doc.get("verdict")
    ok: bool | None = got == want or (want == "not data-bound" and got not in (None, "data-bound"))
    if want.startswith("(a CUDA"):
        ok = None
    plain = doc.get("unprofiled") or {}
    return result(
        f"verdict {case}",
        ok,
        f"{got} (want {want}); loop wait before the burst {loop_wait}, around it "
        f"{plain.get('data_wait_fraction')}, in it {doc.get('data_wait_fraction')}; {doc.get('reason')}; "
        f"the live view: {live}",
        verdict=got,
        want=want,
        loop_wait=loop_wait,
        live=live,
        doc=doc,
    )


# --------------------------------------------------------------------- data wait vs the loop's own


def check_wait(args) -> list[dict]:
    from tests.e2e_util import Job, snapshot_json, truth_in_window

    out = []
    for pin in (False, True):
        job = Job(
            *(["--cuda"] if DEVICE == "cuda" else []),
            "--workers", "2", "--sample-ms", "4", "--step-ms", "3", "--duration", "15",
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


# --------------------------------------------------------------------- pipelines fed by threads

# demo/ scripts whose loop is fed by threads (issue 41), with a CUDA step:
# the host thread idles in CUDA synchronisation there, which is where a
# feeder's figures used to pass for the loop's wait.
PIPELINE_CASES = (
    ("torchdata.nodes, 2 thread workers", ["nodes_pipeline.py"], "torchdata"),
    ("grain, ReadOptions(num_threads=2)", ["grain_pipeline.py"], "grain"),
    ("MONAI ThreadDataLoader, 2 workers", ["monai_thread.py"], "monai"),
    ("DataLoader behind a producer thread", ["dataloader_thread.py"], "torch"),
)


def check_pipelines(args) -> list[dict]:
    """Each thread-fed pipeline's data wait against the loop's own meter over
    the same window (bar: 3 points), one job at a time."""
    from tests.e2e_util import short_tmpdir, snapshot_json, truth_in_window

    demo = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo")
    out = []
    for name, script, package in PIPELINE_CASES:
        if importlib.util.find_spec(package) is None:
            # The device image has torch, not the pipeline libraries: carry their wheels (docs/gpu.md).
            out.append(result(f"pipeline: {name}", None, f"skipped: {package} is not installed here"))
            continue
        rt = short_tmpdir()
        spans, stop_file = os.path.join(rt, "spans.json"), os.path.join(rt, "stop")
        cmd = [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, os.path.join(demo, *script)]
        cmd += ["--step", "cuda" if DEVICE == "cuda" else "idle", "--seconds", "60"]
        cmd += ["--spans", spans, "--stop-file", stop_file]
        proc = subprocess.Popen(
            cmd,
            env=env_with(rt),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            line = ""
            deadline = time.monotonic() + 60
            while not line.startswith("ready ") and time.monotonic() < deadline and proc.poll() is None:
                line = proc.stdout.readline() if proc.stdout else ""
            time.sleep(args.settle)
            snap = snapshot_json(rt, "--window", "3")
            open(stop_file, "w").close()
            proc.communicate(timeout=60)
            with open(spans) as f:
                own = json.load(f)["spans"]
        except Exception as e:  # noqa: BLE001 - one case's failure must not lose the others
            stop(proc)
            out.append(result(f"pipeline: {name}", False, f"the run failed: {type(e).__name__}: {e}"))
            continue
        loops = [
            ld for j in snap["jobs"] for ld in j["loaders"] if ld.get("loop_role") == "loop" and ld["active"]
        ]
        if len(loops) != 1:
            out.append(result(f"pipeline: {name}", False, f"{len(loops)} loop loaders in the snapshot"))
            continue
        ld = loops[0]
        truth = truth_in_window(own, *ld["window_mono_ns"])["data_wait_fraction"]
        got = ld["data_wait_fraction"]
        out.append(
            result(
                f"pipeline: {name}",
                got is not None and truth is not None and abs(got - truth) <= 0.03,
                f"dlwatch {got} vs the loop's {truth:.4f} (bar: within 0.03); hints "
                f"{sorted(h['id'] for h in snap['hints'])}",
                library=ld.get("library"),
                knobs=ld.get("knobs"),
                feeder=ld.get("feeder"),
            )
        )
    return out


# --------------------------------------------------------------------- tune vs plain runs


def pipeline_pace(workers: int, seconds: float, hook: bool, pin: bool = False) -> float | None:
    """img/s of the image pipeline on DEVICE, plain (or under `dlwatch run`)."""
    out = os.path.join(tempfile.mkdtemp(prefix="dlw-gpu-"), "meter.json")
    cmd = pipeline_command(workers, seconds, pin) + ["--json", out]
    if hook:
        cmd = [sys.executable, "-m", "dlwatch", "run", "--", *cmd]
    env = env_with(tempfile.mkdtemp(prefix="dlw-gpu-"), **({} if hook else {"DLWATCH_DISABLE": "1"}))
    subprocess.run(cmd, env=env, capture_output=True, timeout=seconds + 300)
    try:
        with open(out) as f:
            return json.load(f)["images_per_s"]
    except (OSError, ValueError, KeyError):
        return None


def pipeline_command(workers: int, seconds: float, pin: bool = False) -> list[str]:
    # The meter skips the first third (at most 8 s): CUDA and cudnn set-up,
    # the workers' first wave, the page cache.
    return [
        sys.executable, PIPELINE, "--device", DEVICE, "--num-workers", str(workers),
        "--seconds", str(seconds), "--skip-seconds", str(min(8.0, seconds / 3)),
        "--data", JPEGS, "--batch-size", "128", "--images", "2048",
        *(["--pin-memory"] if pin else []),
    ]  # fmt: skip


def plain_paces(runs: list[tuple[int, bool]], seconds: float) -> dict[tuple[int, bool], list[float]]:
    """Plain runs of the pipeline ((num_workers, pin_memory) each), in the order given."""
    paces: dict[tuple[int, bool], list[float]] = {}
    for workers, pin in runs:
        ips = pipeline_pace(workers, seconds, False, pin)
        print(f"  plain run, num_workers={workers}, pin_memory={pin}: {ips} img/s", flush=True)
        if ips:
            paces.setdefault((workers, pin), []).append(ips)
    return paces


def base_workers() -> int:
    # The field's case: a 16-core box started at 4 workers. A rehearsal on a
    # 2-core box starts at 1 so that tune has somewhere to go.
    return 4 if (os.cpu_count() or 1) >= 8 else 1


def check_tune(args) -> list[dict]:
    if not have_pillow():
        return [result("tune vs plain runs", None, "needs Pillow (bench/image_pipeline.py)")]
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    base = base_workers()
    t0 = time.monotonic()
    r = dlwatch(
        d, "tune", "--json", "--trial-seconds", str(args.trial_seconds), "--max-trials", str(args.max_trials),
        "--budget", str(args.tune_budget), "--",
        *pipeline_command(base, 100000),
        timeout=args.tune_budget + 300,
    )  # fmt: skip
    print(f"  tune took {time.monotonic() - t0:.0f} s", flush=True)
    try:
        doc = json.loads(r.stdout)
    except ValueError:
        return [result("tune vs plain runs", False, f"tune printed no JSON: {r.stderr[-300:]}")]
    best = (doc.get("best") or {}).get("settings") or {}
    nw = best.get("num_workers")
    if nw is None or doc.get("speedup") is None:
        return [result("tune vs plain runs", False, f"no best setting: {doc.get('recommendation')}")]
    nw = int(nw)
    # Plain runs at the baseline (first and last: the box drifts) and at
    # tune's pick; --sweep-top adds one at as many workers as there are cores.
    top_n = os.cpu_count() or 1
    runs = [(base, False), (nw, False)]
    runs += ([(top_n, False)] if args.sweep_top and top_n not in (base, nw) else []) + [(base, False)]
    paces = plain_paces(runs, args.sweep_seconds)
    sweep = {n: statistics.mean(v) for (n, _), v in paces.items()}
    base_ips, top = sweep.get(base), sweep.get(nw)
    if not base_ips or not top:
        return [result("tune vs plain runs", False, "a plain run gave no meter")]
    plain_gain = top / base_ips
    best_n = max(sweep, key=lambda n: sweep[n])
    ok = abs(doc["speedup"] / plain_gain - 1) <= 0.25
    return [
        result(
            "tune vs plain runs",
            ok,
            f"tune {doc['speedup']:.2f}x at num_workers={nw} (from {base}); plain runs {top:.0f} vs "
            f"{base_ips:.0f} img/s = {plain_gain:.2f}x (bar: within 25 %); the best plain run: "
            f"{sweep[best_n] / base_ips:.2f}x at {best_n}; tune's trials: "
            + ", ".join(
                f"{(t.get('settings') or {}).get('num_workers')}w {t.get('batches_per_s')}/s "
                f"{t.get('status')}"
                for t in doc.get("trials") or []
            ),
            tune_speedup=doc["speedup"],
            plain_gain=plain_gain,
            sweep={str(n): v for n, v in sweep.items()},
            baseline_runs=paces.get((base, False)),
            tune=doc,
        )
    ]


# --------------------------------------------------------------------- pin memory


def check_pin(args) -> list[dict]:
    """The pin-memory hint on the image pipeline (25 MiB batches), against plain runs with and without.

    The hint is judged by what pin_memory=True buys in plain runs: a WARN
    needs a gain of at least 5 %, and a gain of 10 % or more needs a hint.
    """
    if not have_pillow():
        return [result("pin-memory hint vs plain runs", None, "needs Pillow (bench/image_pipeline.py)")]
    workers = min(8, os.cpu_count() or 1)
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    seconds = 60.0  # stopped once the snapshot is taken
    cmd = [sys.executable, "-m", "dlwatch", "run", "--", *pipeline_command(workers, seconds)]
    proc = subprocess.Popen(
        cmd, env=env_with(d), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    hints, ld, seen = [], {}, {}
    try:
        if not stepping(d, proc, 60):
            return [result("pin-memory hint vs plain runs", False, "the job never reached its first batch")]
        time.sleep(12.0)  # past the rules' warm-up, with a window of steady batches
        snap = dlwatch(d, "snapshot", "--json", "--pid", str(proc.pid), "--window", "5")
        try:
            doc = json.loads(snap.stdout)
            job = next(j for j in doc["jobs"] if j["pid"] == proc.pid)
            ld = max(job["loaders"], key=lambda x: x.get("batches_total") or 0)
            hints = [h for h in job_hints(doc, proc.pid) if h["id"] == "enable-pin-memory"]
            # What the rule weighed, for a run where it stayed silent (the H100
            # run of 2026-11-27 kept none of this, and read its hints under a
            # key they do not have: job_hints).
            seen = {
                "cuda_initialized": job.get("cuda_initialized"),
                "gpu_status": doc.get("gpu_status"),
                "pin_memory": ld.get("pin_memory"),
                "batches_total": ld.get("batches_total"),
                "wait_ms_mean": ld.get("wait_ms_mean"),
                "step_ms_mean": ld.get("step_ms_mean"),
                "batch_size": ld.get("batch_size"),
                "hints": sorted({h["id"] for h in job_hints(doc, proc.pid)}),
            }
        except (ValueError, KeyError, StopIteration):
            why = f"no snapshot of the job: {snap.stderr[-300:]}"
            return [result("pin-memory hint vs plain runs", False, why)]
    finally:
        stop(proc)
    # ABBA: a drift of the box falls on both arms alike.
    order = [(workers, False), (workers, True), (workers, True), (workers, False)]
    paces = plain_paces(order, args.pin_seconds)
    plain, pinned = paces.get((workers, False)), paces.get((workers, True))
    if not plain or not pinned:
        return [result("pin-memory hint vs plain runs", False, "a plain run gave no meter")]
    gain = statistics.mean(pinned) / statistics.mean(plain)
    severity = hints[0]["severity"] if hints else None
    ev = hints[0].get("evidence", {}) if hints else {}
    if DEVICE == "cpu":
        ok: bool | None = None if hints else True  # no CUDA, no hint: the one thing a CPU can check
    else:
        ok = not (severity == "warn" and gain < 1.05) and not (gain >= 1.10 and not hints)
    return [
        result(
            "pin-memory hint vs plain runs",
            ok,
            f"hint {severity or 'none'} (copy estimate {ev.get('copy_ms_estimate')} ms, "
            f"{ev.get('copy_share_of_batch_time')} of the batch time; batch {ld.get('batch_bytes')} bytes, "
            f"wait {ld.get('data_wait_fraction')}); plain runs: pin_memory=True gains {gain:.3f}x "
            f"({statistics.mean(pinned):.0f} vs {statistics.mean(plain):.0f} img/s) "
            "(bar: a WARN needs >= 1.05x, a gain >= 1.10x needs a hint)"
            + ("" if hints else f"; the rule saw {seen}"),
            hint=hints[0] if hints else None,
            seen=seen,
            gain=gain,
            plain=plain,
            pinned=pinned,
        )
    ]


# --------------------------------------------------------------------- overhead


def case_pace(case: str, seconds: float, hook: bool) -> float | None:
    """Steps per second of a verdict case's loop, with the hook or without (``DLWATCH_DISABLE=1``)."""
    d = tempfile.mkdtemp(prefix="dlw-gpu-")
    meter = os.path.join(d, "meter.json")
    cmd = case_command(case, os.path.join(d, "ready"), seconds) or []
    env = env_with(d, **({} if hook else {"DLWATCH_DISABLE": "1"}))
    subprocess.run([*cmd, "--meter", meter], env=env, capture_output=True, timeout=seconds + 300)
    try:
        with open(meter) as f:
            return json.load(f)["steps_per_s"]
    except (OSError, ValueError, KeyError):
        return None


def check_overhead(args) -> list[dict]:
    job = args.overhead_job
    if job == "pipeline" and not have_pillow():
        return [result("hook overhead", None, "needs Pillow (bench/image_pipeline.py)")]
    workers = min(8, os.cpu_count() or 1)
    if job == "pipeline":
        unit, what = "img/s", f"the image pipeline, {workers} workers"

        def pace_of(seconds: float, hook: bool) -> float | None:
            return pipeline_pace(workers, seconds, hook)

    else:
        unit, what = "steps/s", f"the {job} loop"

        def pace_of(seconds: float, hook: bool) -> float | None:
            return case_pace(job, seconds, hook)

    pace_of(15, False)  # JPEGs on disk and in the page cache, CUDA warm
    ratios = []
    for i in range(args.pairs):
        # Alternate which goes first: drift (clocks, page cache) falls on both sides.
        order = (False, True) if i % 2 == 0 else (True, False)
        pace = {hook: pace_of(args.overhead_seconds, hook) for hook in order}
        plain, hooked = pace[False], pace[True]
        if not plain or not hooked:
            return [result("hook overhead", False, f"pair {i + 1} gave no meter")]
        ratios.append(plain / hooked - 1)  # slowdown with the hook
        print(
            f"  pair {i + 1}: plain {plain:.1f}, hooked {hooked:.1f} {unit}: {ratios[-1] * 100:+.2f} %",
            flush=True,
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
            mean + half <= 0.01 if math.isfinite(half) and DEVICE == "cuda" else None,
            f"{mean * 100:+.2f} % ± {half * 100:.2f} (95 %, {len(ratios)} paired alternating runs of "
            f"{args.overhead_seconds:.0f} s, {what}; goal: <= 1 %)",
            overhead_job=job,
            overhead_mean=mean,
            overhead_ci95=half,
            pairs=ratios,
        )
    ]


# --------------------------------------------------------------------- budget


def estimate_s(check: str, args) -> float:
    """Seconds a check is expected to take on the H100 box (a rehearsal on 2 cores takes longer)."""
    start = 8.0  # a Python that imports torch and starts CUDA
    if check == "nvml":
        return args.seconds + start + 4
    if check == "verdicts":
        return len(verdict_cases(args)) * (start + args.settle + 12)
    if check == "wait":
        return 2 * (15 + start)
    if check == "pin":
        return start + 4 + 12 + 4 * (args.pin_seconds + start)
    if check == "tune":
        return args.tune_budget + 15 + (4 if args.sweep_top else 3) * (args.sweep_seconds + start)
    if check == "overhead":
        return 15 + start + 2 * args.pairs * (args.overhead_seconds + start)
    if check == "pipelines":
        return len(PIPELINE_CASES) * (start + 4 + args.settle + 3)
    return 0.0


# --------------------------------------------------------------------- main


def main() -> int:
    global DEVICE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    checks = ["nvml", "verdicts", "wait", "pin", "tune", "overhead", "pipelines"]
    ap.add_argument("check", nargs="?", default="nvml", choices=[*checks, "all", "job"])
    ap.add_argument("case", nargs="?", help="with `job`: the verdict case to run (internal)")
    ap.add_argument("--seconds", type=float, default=6.0, help="nvml: seconds of load; job: its duration")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--ready", help="job: the file to create at the first batch (internal)")
    ap.add_argument("--meter", help="job: where to write its steps per second (internal)")
    ap.add_argument("--job-seconds", type=float, default=90.0, help="verdicts: longest a case job runs")
    ap.add_argument("--cases", help=f"verdicts: these cases only, comma-separated ({', '.join(CASES)})")
    ap.add_argument("--settle", type=float, default=6.0, help="verdicts: seconds after the first batch")
    ap.add_argument("--pin-seconds", type=float, default=12.0, help="pin: seconds per plain run")
    ap.add_argument("--trial-seconds", type=float, default=10.0, help="tune: its --trial-seconds")
    ap.add_argument("--max-trials", type=int, default=4, help="tune: its --max-trials")
    ap.add_argument("--tune-budget", type=float, default=100.0, help="tune: its --budget")
    ap.add_argument("--sweep-seconds", type=float, default=15.0, help="tune: seconds per plain run")
    ap.add_argument("--sweep-top", action="store_true", help="tune: a plain run at one worker per core too")
    ap.add_argument("--pairs", type=int, default=4, help="overhead: paired runs")
    ap.add_argument(
        "--overhead-job",
        default="pipeline",
        choices=["pipeline", *(c for c, (argv, _) in CASES.items() if argv is not None)],
        help="overhead: the image pipeline (8 workers) or a verdict case's loop (mlp-batch-1: the "
        "hook's cost per step is largest where steps are shortest, and one thread sets the pace)",
    )
    ap.add_argument("--overhead-seconds", type=float, default=15.0, help="overhead: seconds per run")
    ap.add_argument("--budget", type=float, help="skip a check whose estimate no longer fits (seconds)")
    ap.add_argument("--only", help="with `all`: these checks, comma-separated, in this order")
    ap.add_argument("--rehearse", action="store_true", help="run on the CPU, smaller, to time the steps")
    ap.add_argument("--json", metavar="PATH", help="write every check's figures here (after each check)")
    args = ap.parse_args()
    DEVICE = "cpu" if args.rehearse else "cuda"

    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if DEVICE == "cuda" and not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device (--rehearse runs on the CPU)", file=sys.stderr)
        return 2
    if args.check == "job":
        run_case(args.case or "", args.seconds, args.ready or os.devnull, args.meter)
        return 0
    name = torch.cuda.get_device_name(args.device) if DEVICE == "cuda" else "a CPU rehearsal"
    print(f"torch {torch.__version__}, {name}, {os.cpu_count()} cores", flush=True)
    if args.check != "all":
        wanted = [args.check]
    elif args.only:
        wanted = [c.strip() for c in args.only.split(",") if c.strip()]
        unknown = sorted(set(wanted) - set(checks))
        if unknown:
            ap.error(f"--only: unknown checks {unknown} (choose from {checks})")
    else:
        # The order a lent session wants them in: what only a GPU can show first.
        wanted = ["verdicts", "nvml", "pin", "tune", "overhead", "pipelines", "wait"]
    if args.cases and set(verdict_cases(args)) - set(CASES):
        ap.error(f"--cases: unknown cases {sorted(set(verdict_cases(args)) - set(CASES))}")
    if DEVICE == "cpu" and "nvml" in wanted:
        wanted.remove("nvml")
        print("nvml: skipped in a rehearsal (no GPU)", flush=True)
    began = time.monotonic()
    results: list[dict] = []
    if set(wanted) & {"verdicts", "pin", "tune", "overhead"}:
        prepare_jpegs()
        print(f"JPEGs ready in {time.monotonic() - began:.0f} s", flush=True)

    def save() -> None:
        if args.json:
            doc = {"torch": torch.__version__, "device": name, "rehearsal": args.rehearse, "results": results}
            with open(args.json + ".tmp", "w") as f:
                json.dump(doc, f, indent=1, default=str)
            os.replace(args.json + ".tmp", args.json)

    for check in wanted:
        est = estimate_s(check, args)
        left = None if args.budget is None else args.budget - (time.monotonic() - began)
        if left is not None and est > left:
            results.append(
                result(check, None, f"skipped: needs about {est:.0f} s, {max(left, 0):.0f} s of budget left")
            )
            save()
            continue
        t0 = time.monotonic()
        print(f"== {check} (estimate {est:.0f} s)", flush=True)
        try:
            got = run_check(check, args)
        except Exception as e:  # noqa: BLE001 - one check's failure must not lose the others' figures
            got = [result(check, False, f"the check itself failed: {type(e).__name__}: {e}")]
        took = time.monotonic() - t0
        print(f"   {check} took {took:.0f} s (estimate {est:.0f} s)", flush=True)
        for r in got:
            r["check_seconds"] = round(took, 1)
        results += got
        save()
    print("\n| check | result | figures |\n| --- | --- | --- |")
    for r in results:
        unjudged = "skipped" if DEVICE == "cuda" else "rehearsed"
        mark = {True: "pass", False: "FAIL", None: unjudged}[r["passed"]]
        print(f"| {r['check']} | {mark} | {r['summary']} |")
    print(f"all checks: {time.monotonic() - began:.0f} s")
    return 1 if any(r["passed"] is False for r in results) else 0


def verdict_cases(args) -> list[str]:
    return [c.strip() for c in args.cases.split(",") if c.strip()] if args.cases else list(CASES)


def run_check(check: str, args) -> list[dict]:
    if check == "nvml":
        return check_nvml(args)
    if check == "verdicts":
        return [r for c in verdict_cases(args) for r in check_verdict(c, args)]
    if check == "wait":
        return check_wait(args)
    if check == "pin":
        return check_pin(args)
    if check == "tune":
        return check_tune(args)
    if check == "pipelines":
        return check_pipelines(args)
    return check_overhead(args)


if __name__ == "__main__":
    sys.exit(main())
