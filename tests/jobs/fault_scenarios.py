"""Small instrumented jobs for interpreter-level fault tests.

Usage: fault_scenarios.py SCENARIO [ARGS...]

Every scenario does ``import dlwatch.hook`` (a no-op under DLWATCH_DISABLE=1),
prints ``ready`` (with facts as JSON) on stdout once its loader produced
batches, and communicates with the test over stdout only.
"""

import atexit
import json
import os
import signal
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook  # noqa: F401


class Slow(Dataset):
    def __init__(self, n=100000, ms=1.0):
        self.n, self.ms = n, ms

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.ms:
            time.sleep(self.ms / 1000)
        return torch.full((4,), float(i))


def say(*parts):
    print(*parts, flush=True)


def loader(workers=2, persistent=False, ms=1.0, n=100000):
    kw = dict(batch_size=4, num_workers=workers)
    if workers:
        kw.update(persistent_workers=persistent, multiprocessing_context="fork")
    return DataLoader(Slow(n, ms), **kw)


def train(it, n, step_s=0.01):
    got = 0
    for _ in range(n):
        next(it)
        got += 1
        time.sleep(step_s)
    return got


def exit_attached(duration="2.0"):
    """Train for a while, then fall off the end of the script normally.
    Exit handlers on either side of dlwatch's own (they run last in, first
    out; dlwatch registers its handler at the first iterator) print the
    clock before and after dlwatch's part of the exit."""
    atexit.register(lambda: say("closed", time.perf_counter_ns()))
    dl = loader()
    it = iter(dl)
    atexit.register(lambda: say("closing", time.perf_counter_ns()))
    train(it, 3)
    say("ready", json.dumps({"pid": os.getpid()}))
    end = time.monotonic() + float(duration)
    while time.monotonic() < end:
        train(it, 1)
    say("last-batch", time.perf_counter_ns())


def _train_for(after_s: str) -> None:
    """Say ready after a few batches, then train ``after_s`` seconds more."""
    it = iter(loader())
    train(it, 3)
    say("ready", json.dumps({"pid": os.getpid()}))
    end = time.monotonic() + float(after_s)
    while time.monotonic() < end:
        train(it, 1)


def crash(after_s="1.5"):
    """Train, then die of an uncaught exception in the loop, as a rank does
    when its step fails."""
    _train_for(after_s)
    raise RuntimeError("boom in the step\nsecond line of the message")


def killed(after_s="1.5"):
    """Train, then die of SIGKILL (the OOM killer's signal, kill -9): no
    exception, no atexit, no last frame."""
    _train_for(after_s)
    os.kill(os.getpid(), signal.SIGKILL)


def sys_exit(after_s="1.5"):
    """Train, then leave with ``sys.exit(3)``, as a script does on a failed
    check: no exception to the excepthook, the code the parent's to read."""
    _train_for(after_s)
    sys.exit(3)


def os_exit():
    dl = loader()
    it = iter(dl)
    train(it, 5)
    say("ready", json.dumps({"pid": os.getpid()}))
    os._exit(0)  # no atexit, no finally: the socket file stays behind


def fork(child_batches="60"):
    # Iterate a loader (a whole epoch: its workers are joined, so the fork
    # inherits no multiprocessing children, which a normal exit of the child
    # would terminate with or without dlwatch), then fork while the
    # publisher thread runs.
    dl = loader(n=40)
    n = sum(1 for _ in dl)
    pid = os.fork()
    if pid == 0:
        # The child: its own loader and iterator, its own socket.
        cit = iter(loader(workers=2))
        got = train(cit, int(child_batches), 0.03)
        say("child-done", json.dumps({"pid": os.getpid(), "batches": got}))
        del cit
        # A normal exit: atexit runs in the child and must not touch the parent's socket.
        sys.exit(0)
    say("ready", json.dumps({"parent": os.getpid(), "child": pid}))
    # The parent keeps training (new epochs of its loader) while the child runs.
    status = None
    while status is None:
        for _ in dl:
            n += 1
            time.sleep(0.02)
            done, st = os.waitpid(pid, os.WNOHANG)
            if done:
                status = st
                break
    say("child-exit", os.waitstatus_to_exitcode(status))
    end = time.monotonic() + 3.0  # time for the test to check the parent's socket
    while time.monotonic() < end:
        for _ in dl:
            n += 1
            time.sleep(0.02)
            if time.monotonic() > end:
                break
    say("parent-done", json.dumps({"batches": n}))


def sigint():
    dl = loader(workers=2, ms=2.0)
    got = 0
    try:
        for epoch in range(1000):
            for _batch in dl:
                got += 1
                if got == 5:
                    say("ready", json.dumps({"pid": os.getpid(), "epoch": epoch}))
                time.sleep(0.01)
    except KeyboardInterrupt:
        say("interrupted cleanly after", "some" if got >= 5 else "few", "batches")
        sys.exit(130)
    say("never interrupted")


def abandon():
    """Break out of epochs mid-way and start new iterators; persistent too."""
    plain = loader(workers=2, n=400)
    keep = loader(workers=2, persistent=True, n=400)
    facts = {"plain_epochs": 0, "plain_batches": 0, "keep_epochs": 0, "keep_batches": 0}
    for name, dl in (("plain", plain), ("keep", keep)):
        for _ in range(3):
            for i, _b in enumerate(dl):
                facts[f"{name}_batches"] += 1
                if i == 6:
                    break  # abandon the iterator mid-epoch
            facts[f"{name}_epochs"] += 1
        # And one iterator taken but dropped before its first batch.
        it = iter(dl)
        del it
        facts[f"{name}_epochs"] += 1
    say("ready", json.dumps(facts))
    time.sleep(float(os.environ.get("HOLD_S", "4")))
    say("done")


if __name__ == "__main__":
    name, *args = sys.argv[1:]
    globals()[name](*args)
