"""A torchrun-launched loop: each rank iterates a DataLoader until the stop
file appears.

    ranked_job.py STOP                      no process group (ranks independent)
    ranked_job.py STOP --allreduce [--sample-ms MS] [--slow-rank R | --slow-here] [--step-ms MS]

With ``--allreduce`` the ranks form a gloo process group and all-reduce a
tensor after every step, as DDP does with gradients: a rank whose loader is
slow (``--slow-rank``: its samples cost ``--sample-ms`` each, the others'
nothing; without it every rank's do) holds back every other rank.
``--slow-here``: this launch's ranks are the slow ones, whatever rank the
rendezvous gives them (a multi-node run: one node's ranks slow).
"""

import argparse
import os
import time

import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset


class Sleepy(Dataset):
    def __init__(self, n, sample_ms):
        self.n, self.sample_ms = n, sample_ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.sample_ms:
            time.sleep(self.sample_ms / 1000)
        return torch.full((8,), float(i))


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("stop")
    p.add_argument("--allreduce", action="store_true")
    p.add_argument("--sample-ms", type=float, default=0.0)
    p.add_argument("--slow-rank", type=int, default=None)
    p.add_argument("--slow-here", action="store_true")
    p.add_argument("--step-ms", type=float, default=10.0)
    a = p.parse_args()
    deadline = time.monotonic() + 60
    if not a.allreduce:
        dl = DataLoader(TensorDataset(torch.arange(64).float()), batch_size=4)
        while not os.path.exists(a.stop) and time.monotonic() < deadline:
            for _ in dl:
                time.sleep(a.step_ms / 1000)
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        if a.slow_here or a.slow_rank is not None:
            cost = a.sample_ms if a.slow_here or a.slow_rank == rank else 0.0
        else:
            cost = a.sample_ms
        dl = DataLoader(Sleepy(100000, cost), batch_size=4)
        grad = torch.zeros(1024)
        stop = torch.zeros(1)
        for _ in dl:
            time.sleep(a.step_ms / 1000)  # the backward pass
            dist.all_reduce(grad)  # gradients: every rank meets here each step
            # Stop together (a rank that left alone would hang the other).
            stop.fill_(float(os.path.exists(a.stop) or time.monotonic() > deadline))
            dist.all_reduce(stop)
            if stop.item():
                break
        dist.destroy_process_group()
