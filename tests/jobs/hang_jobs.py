"""Jobs that hang or lose a worker, for the hang doctor's tests (docs/hangs.md).

    hang_jobs.py hang FIFO   worker 0 blocks forever opening FIFO (nobody writes it);
                             worker 1 blocks on a lock a trainer thread held at fork
    hang_jobs.py kill [GO]   worker 1 SIGKILLs itself after a few batches (given GO: once GO exists)
    hang_jobs.py shm         batches of 4 MiB after a few small ones (run under a tiny /dev/shm)
    hang_jobs.py ranks       under torchrun (2 ranks, gloo): rank 1's sampler yields fewer
                             batches; rank 0 then waits in all_reduce for a rank that has left
    hang_jobs.py spawn-ranks the same under torch.multiprocessing.spawn, init_process_group(rank=...,
                             world_size=2) and a tcp:// init_method: no RANK in the environment
    hang_jobs.py omp         pytorch#42444: the trainer's OpenMP pool is busy in its step when the
                             second epoch's workers fork; worker_init_fn raises their thread count
                             and the first parallel op of each new worker waits forever (0 % CPU)
    hang_jobs.py native-lock pytorch#75147: a trainer thread holds a native (pthread) lock when the
                             workers fork; a C call that keeps the GIL takes it in the worker
                             (the worker cannot answer on its own channel: py-spy reads it)
    hang_jobs.py barrier     mosaicml/streaming#447: workers share a barrier at the end of their
                             partitions, which are uneven; worker 0 waits there for worker 1

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
        elif self.mode == "kill" and info.id == 1 and i >= KILL_AT and go(self.arg):
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


def omp():
    torch.set_num_threads(2)  # the trainer's intra-op pool (OpenMP): two threads
    x = torch.randn(400, 400)

    def more_threads(_worker_id):
        torch.set_num_threads(2)  # "augmentation is faster with two threads"

    class Matmuls(Dataset):
        def __len__(self):
            return 16

        def __getitem__(self, i):
            y = torch.randn(64, 64)
            return (y @ y).sum()  # the first parallel op in a worker forked from a busy pool

    loader = DataLoader(
        Matmuls(), batch_size=2, num_workers=2, multiprocessing_context="fork", worker_init_fn=more_threads
    )
    for _epoch in range(2):
        for _ in loader:  # epoch 0's workers forked before the pool existed: they run
            (x @ x).sum()  # the model's step, on the pool


class _NativeLock:
    """A pthread mutex, taken through a C call that keeps the GIL (as a C
    extension that does not release it would)."""

    def __init__(self):
        import ctypes

        self.buf, self.held = ctypes.create_string_buffer(64), threading.Event()  # zeroed: unlocked
        self.libc = ctypes.CDLL(None)  # releases the GIL while it waits
        self.gil = ctypes.PyDLL(None)  # keeps it

    def hold_forever(self):
        self.libc.pthread_mutex_lock(self.buf)
        self.held.set() or time.sleep(DEADLINE_S)

    def take_keeping_the_gil(self):
        self.gil.pthread_mutex_lock(self.buf)
        self.gil.pthread_mutex_unlock(self.buf)


NATIVE = None


class NativeLocked(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        if i >= FIRST_GOOD:
            # The worker's previous batch is still being written to the
            # result queue that all workers share, by its queue's feeder
            # thread: blocked with the GIL at once, the worker would keep
            # the queue's write lock and freeze the other worker's results
            # too (the trainer then starves with worker 1 idle, not blocked
            # in C: a run of the parallel tier). A moment of I/O first.
            time.sleep(0.3)
            NATIVE.take_keeping_the_gil()  # held at fork by a thread the worker does not have
        return torch.zeros(4)


def native_lock():
    global NATIVE
    NATIVE = _NativeLock()
    threading.Thread(target=NATIVE.hold_forever, name="native-cache", daemon=True).start()
    NATIVE.held.wait(30)  # held before both workers fork (a fixed sleep raced them on a busy box)
    for _ in DataLoader(NativeLocked(), batch_size=2, num_workers=2, multiprocessing_context="fork"):
        time.sleep(0.02)


class Partitions(torch.utils.data.IterableDataset):
    """Each worker's partition, then a barrier every worker meets at its end."""

    def __init__(self, barrier):
        self.barrier = barrier

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        n = 4 if info.id == 0 else 100_000  # uneven partitions
        for i in range(n):
            time.sleep(0.01)
            yield torch.zeros(4) + 2 * i + info.id  # each worker its own items
        self.barrier.wait()  # worker 1 is nowhere near its end


def barrier():
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    loader = DataLoader(Partitions(ctx.Barrier(2)), batch_size=2, num_workers=2, multiprocessing_context=ctx)
    for _ in loader:
        time.sleep(0.02)


def _spawn_rank(rank, port):
    import torch.distributed as dist
    from torch.utils.data import TensorDataset

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    n = 24 if rank == 1 else 100_000
    loader = DataLoader(TensorDataset(torch.arange(n).float()), batch_size=2, num_workers=2)
    t = torch.zeros(1)
    for _ in loader:
        time.sleep(0.02)
        dist.all_reduce(t)
    if rank == 1:
        dist.recv(torch.zeros(1), src=0)


def spawn_ranks():
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_spawn_rank, args=(port,), nprocs=2)


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


# Below every hang: the recorded py-spy dumps (tests/data/pyspy) name lines
# above by number, and the hang doctor reads their source from this file.
def go(path):
    """The test's go-ahead: no file named, or the file exists."""
    return not path or os.path.isfile(path)


# Below the recorded dumps' lines: new modes go here.
NODES_AT = 40


def nodes_map(how, i):
    if i == NODES_AT:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(DEADLINE_S)
    return torch.zeros(4) + i


def nodes_process(how):
    """hang_jobs.py nodes-process stuck|kill: torchdata.nodes,
    ParallelMapper(method="process"), two workers; the one that maps item
    NODES_AT sleeps for good in the map (stuck) or SIGKILLs itself (kill).
    nodes waits for that item forever either way. (Documented here, not in
    the module's docstring: the recorded dumps name this file's lines.)"""
    import functools

    import torchdata.nodes as tn
    from torch.utils.data import SequentialSampler

    node = tn.SamplerWrapper(SequentialSampler(range(100_000)))
    node = tn.ParallelMapper(
        node,
        map_fn=functools.partial(nodes_map, how),
        num_workers=2,
        method="process",
        multiprocessing_context="fork",
    )
    for _ in tn.Loader(tn.Batcher(node, batch_size=2)):
        time.sleep(0.02)


class Stream(torch.utils.data.IterableDataset):
    """Items from a queue the trainer filled, until an end-of-data sentinel."""

    def __init__(self, q):
        self.q = q

    def __iter__(self):
        while True:
            item = self.q.get()
            if item is None:
                return
            yield torch.zeros(2) + item


def sentinel():
    """hang_jobs.py sentinel: two workers read one queue, and the trainer
    put one end-of-data sentinel for both (Lightning-AI/pytorch-lightning
    #6810): the worker that did not get it waits in the queue's get()."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    for i in range(FIRST_GOOD * 2):
        q.put(i)
    q.put(None)
    for _ in DataLoader(Stream(q), batch_size=2, num_workers=2, multiprocessing_context=ctx):
        time.sleep(0.02)


class OnDisk(Dataset):
    """Samples in sqlite; worker 0 writes a note at its first item and never
    commits (pyg-team/pytorch_geometric#8661): its open write transaction
    locks the file, and worker 1's first write waits in sqlite's busy
    handler (C, asleep) for as long as the timeout allows."""

    def __init__(self, path):
        self.path, self.db = path, None

    def __len__(self):
        return 1000

    def __getitem__(self, i):
        import sqlite3

        if self.db is None:
            self.db = sqlite3.connect(self.path, timeout=DEADLINE_S)
        self.db.execute("INSERT INTO seen VALUES (?)", (i,))  # no commit
        return torch.zeros(2) + i


def sqlite(path):
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE IF NOT EXISTS seen (i INTEGER)")
    loader = DataLoader(OnDisk(path), batch_size=2, num_workers=2, multiprocessing_context="fork")
    for _ in loader:
        time.sleep(0.02)


class Steady(Dataset):
    def __len__(self):
        return 1_000_000

    def __getitem__(self, i):
        time.sleep(0.005)
        return torch.zeros(2) + i


def steady():
    """hang_jobs.py steady: two fork workers that load at a steady pace and
    never hang by themselves (a test stops one with SIGSTOP, then resumes it)."""
    loader = DataLoader(Steady(), batch_size=4, num_workers=2, multiprocessing_context="fork")
    for _ in loader:
        time.sleep(0.01)


class Prefetching(Dataset):
    """Each item through a thread pool the dataset made in the trainer (a
    zarr-style reader, fsspec's IO loop: datachain-ai/datachain#691): a fork
    worker inherits the executor without its threads, and its first
    submit()'s result never comes."""

    def __init__(self):
        from concurrent.futures import ThreadPoolExecutor

        self.pool = ThreadPoolExecutor(2, thread_name_prefix="reader")
        list(self.pool.map(abs, range(4)))  # its threads run in the trainer

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.zeros(2) + self.pool.submit(abs, i).result()


def executor():
    """hang_jobs.py executor: the dataset's executor, made in the trainer,
    used in two fork workers."""
    for _ in DataLoader(Prefetching(), batch_size=2, num_workers=2, multiprocessing_context="fork"):
        time.sleep(0.02)


def _cat_batches(q=None):
    data = [torch.rand(256, 256) for _ in range(40)]
    for _ in DataLoader(data, batch_size=20, num_workers=0, collate_fn=lambda items: torch.cat(items)):
        time.sleep(0.02)
    if q is not None:
        q.put("done")


def forked_loop():
    """hang_jobs.py forked-loop: pyg-team/pytorch_geometric#3565. The
    trainer's loader concatenates its batches on two OpenMP threads, then
    runs the same loader (num_workers=0) in a forked multiprocessing.Process:
    the child's first torch.cat waits for the pool threads fork left behind."""
    import multiprocessing

    torch.set_num_threads(2)
    for _ in range(3):
        _cat_batches()
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_cat_batches, args=(q,), daemon=True)
    child.start()
    print("child", child.pid, flush=True)
    q.get(timeout=DEADLINE_S)


if __name__ == "__main__":
    timer = threading.Timer(DEADLINE_S, lambda: os._exit(3))
    timer.daemon = True
    timer.start()
    modes = {"ranks": ranks, "spawn-ranks": spawn_ranks, "omp": omp, "native-lock": native_lock}
    modes["barrier"] = barrier
    if sys.argv[1] == "nodes-process":
        modes["nodes-process"] = lambda: nodes_process(sys.argv[2])
    modes["sentinel"] = sentinel
    modes["steady"] = steady
    modes["executor"] = executor
    modes["forked-loop"] = forked_loop
    if sys.argv[1] == "sqlite":
        modes["sqlite"] = lambda: sqlite(sys.argv[2])
    if sys.argv[1] in modes:
        modes[sys.argv[1]]()
    else:
        run(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
