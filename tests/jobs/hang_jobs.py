"""Jobs that hang or lose a worker, for the hang doctor's tests (docs/hangs.md).

    hang_jobs.py hang FIFO   worker 0 blocks forever opening FIFO (nobody writes it);
                             worker 1 blocks on a lock a trainer thread held at fork
    hang_jobs.py kill        worker 1 SIGKILLs itself after a few batches
    hang_jobs.py shm         batches of 4 MiB after a few small ones (run under a tiny /dev/shm)
    hang_jobs.py ranks       under torchrun (2 ranks, gloo): rank 1's sampler yields fewer
                             batches; rank 0 then waits in all_reduce for a rank that has left

Every mode takes a few batches first, so a monitor sees the loader step
before it stops. Each job ends by itself within DEADLINE_S at the latest.
"""

import os
import signal
import sys
import threading
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401

DEADLINE_S = 120
FIRST_GOOD = 16  # items served before the trouble starts
KILL_AT = 200  # ... and before a worker dies: ~2 s, for a monitor to connect first
LOCK = threading.Lock()


def read_remote_shard(path):
    with open(path, "rb") as f:  # a FIFO nobody writes: blocks here forever
        return f.read()


class Shards(Dataset):
    def __init__(self, mode, arg=None):
        self.mode, self.arg = mode, arg

    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        info = torch.utils.data.get_worker_info()
        time.sleep(0.01)
        if i < FIRST_GOOD:
            return torch.zeros(4)
        if self.mode == "hang":
            if info.id == 0:
                read_remote_shard(self.arg)
            else:
                with LOCK:
                    pass
        elif self.mode == "kill" and info.id == 1 and i >= KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self.mode == "shm" and i >= KILL_AT:
            return torch.zeros(1 << 20)
        return torch.zeros(4)


def cache_refresher():
    with LOCK:  # held while the workers fork: they inherit it held, with no thread to release it
        time.sleep(DEADLINE_S)


def run(mode, arg=None):
    if mode == "hang":
        threading.Thread(target=cache_refresher, name="cache-refresher", daemon=True).start()
        time.sleep(0.1)
    loader = DataLoader(Shards(mode, arg), batch_size=2, num_workers=2, multiprocessing_context="fork")
    end = time.monotonic() + DEADLINE_S
    for _ in loader:
        time.sleep(0.02)
        if time.monotonic() > end:
            break


def ranks():
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    # Rank 1 has 12 batches, rank 0 as many as it can take: the sampler
    # split the data unevenly.
    n = 24 if rank == 1 else 100_000
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=2, num_workers=2)
    t = torch.zeros(1)
    for _ in loader:
        time.sleep(0.02)
        dist.all_reduce(t)  # as DDP's gradients: every rank meets here each step
    if rank == 1:
        # Done with its epoch, rank 1 waits for a word from rank 0 that never comes.
        dist.recv(torch.zeros(1), src=0)


if __name__ == "__main__":
    timer = threading.Timer(DEADLINE_S, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    if sys.argv[1] == "ranks":
        ranks()
    else:
        run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
