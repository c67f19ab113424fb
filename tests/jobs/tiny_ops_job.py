"""A training loop whose step is many tiny torch ops (or a few big ones),
for profiler bursts: dispatch-bound on CPU, launch-bound / GPU-bound on CUDA.

Usage: tiny_ops_job.py [--ops N] [--big] [--device cpu|cuda] [--duration S]

Writes ``<out>.ready`` at the first batch (when --out is given).
"""

import argparse
import time

import torch
from torch.utils.data import DataLoader, TensorDataset

import dlwatch.hook  # noqa: F401


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ops", type=int, default=2000, help="tiny element-wise ops per step")
    p.add_argument("--big", action="store_true", help="a few large matmuls per step instead")
    p.add_argument("--device", default="cpu")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--out")
    a = p.parse_args()
    dev = torch.device(a.device)
    loader = DataLoader(TensorDataset(torch.arange(10**6, dtype=torch.float32)), batch_size=8)
    x = torch.zeros(4, device=dev)
    w = torch.randn(4096, 4096, device=dev) if a.big else None
    end = None
    while True:
        for (batch,) in loader:
            if end is None:
                end = time.monotonic() + a.duration
                if a.out:
                    open(a.out + ".ready", "w").close()
            if a.big:
                y = w
                for _ in range(8):
                    y = (y @ w).tanh_()
                y.sum().item()
            else:
                y = x + batch[:4].to(dev)
                for _ in range(a.ops):
                    y = y + 1
                y.sum().item()
            if time.monotonic() > end:
                return


if __name__ == "__main__":
    main()
