"""Check the real GpuSampler on a GPU machine while the GPU is kept busy.

Run from the repository root on a box with an NVIDIA GPU and CUDA torch:

    python bench/gpu_check.py [--seconds 6] [--device 0]

A thread runs a CUDA matmul loop; meanwhile the sampler reads NVML a few
times and prints what it sees. Exit status 0 when the status is "ok" and
the loaded device shows non-zero utilization, 1 otherwise (2: no CUDA torch).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dlwatch.collect.gpu import GpuSampler  # noqa: E402


def matmul_loop(device: int, stop: threading.Event, ready: threading.Event, n: int = 4096) -> None:
    import torch

    dev = torch.device("cuda", device)
    a = torch.randn(n, n, device=dev)
    b = torch.randn(n, n, device=dev)
    torch.cuda.synchronize(dev)
    ready.set()
    while not stop.is_set():
        for _ in range(20):
            a = (a @ b).tanh_()
        # Without a sync the queue grows unbounded and stop would wait for all of it.
        torch.cuda.synchronize(dev)


def fmt(g: dict) -> str:
    def mib(x: int | None) -> str:
        return "?" if x is None else f"{x / 2**20:.0f}"

    return (
        f"gpu{g['index']} {g['name']!s:<26} util {g['util_percent']!s:>5}%  "
        f"mem {mib(g['mem_used_bytes'])}/{mib(g['mem_total_bytes'])} MiB  "
        f"temp {g['temperature_c']} C  power {g['power_w']} W  procs {g['processes']}"
        + (f"  errors: {g['error']}" if g["error"] else "")
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--device", type=int, default=0)
    args = ap.parse_args()

    try:
        import torch
    except ImportError:
        print("torch is not installed", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print(f"torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2

    sampler = GpuSampler()
    t0 = time.perf_counter()
    status, gpus = sampler.sample()
    print(f"idle sample ({(time.perf_counter() - t0) * 1e3:.1f} ms incl. nvmlInit): {status}")
    for g in gpus:
        print("  " + fmt(g))

    stop, ready = threading.Event(), threading.Event()
    worker = threading.Thread(target=matmul_loop, args=(args.device, stop, ready), daemon=True)
    worker.start()
    if not ready.wait(60):
        print("CUDA warm-up did not finish in 60 s", file=sys.stderr)
        return 1
    time.sleep(1.0)  # NVML utilization is averaged over the last ~1 s or less

    utils: list[float] = []
    statuses: set[str] = set()
    our_pid_seen = False
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        t0 = time.perf_counter()
        status, gpus = sampler.sample()
        dt_ms = (time.perf_counter() - t0) * 1e3
        statuses.add(status)
        print(f"busy sample ({dt_ms:.2f} ms): {status}")
        for g in gpus:
            print("  " + fmt(g))
            if g["index"] == args.device and g["util_percent"] is not None:
                utils.append(g["util_percent"])
            if g["processes"] and os.getpid() in g["processes"]:
                our_pid_seen = True
        time.sleep(0.5)

    stop.set()
    worker.join(30)
    sampler.close()

    print(f"\nstatuses: {sorted(statuses)}")
    print(f"gpu{args.device} utilization while loaded: {utils}")
    # Inside a container NVML reports host PIDs, so not seeing ours is only a note.
    print(f"our pid {os.getpid()} listed as a compute process: {our_pid_seen}")
    if statuses != {"ok"}:
        print("FAIL: status was not always ok", file=sys.stderr)
        return 1
    if not utils or max(utils) <= 0:
        print("FAIL: utilization stayed 0 under a matmul loop", file=sys.stderr)
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
