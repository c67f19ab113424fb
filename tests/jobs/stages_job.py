"""A loader whose samples cost two known stages, for worker profile tests.

Each sample spends ``--a-ms`` of CPU in ``decode_like_stage`` and ``--b-ms``
in ``augment_like_stage`` (spinning on the thread's own CPU clock, so the
3:1 split of CPU holds however contended the box is; with ``--stage-log``
each worker also writes when each sample's stages began and ended, on the
monotonic clock the profile's window is given in, since on a crowded box
the wall-clock split is the scheduler's, not 3:1). It writes its first
iterator's worker PIDs next to ``--out`` and, when one of its workers is
killed, trains on with a new iterator, as a job that survives a lost worker
would.
"""

import argparse
import hashlib
import os
import signal
import time

import torch
from torch.utils.data import DataLoader, Dataset

import dlwatch.hook

DLWATCH_FILES = os.path.dirname(dlwatch.hook.__file__) + os.sep


def _spin(ms):
    end = time.thread_time() + ms / 1000
    x = 0
    while time.thread_time() < end:
        x += 1
    return x


def decode_like_stage(i, ms):
    return _spin(ms) + i


def augment_like_stage(i, ms):
    return _spin(ms) + i


class TwoStages(Dataset):
    def __init__(self, n, a_ms, b_ms, log_dir=None):
        self.n, self.a_ms, self.b_ms, self.log_dir = n, a_ms, b_ms, log_dir
        self._log = (0, -1)  # (pid, fd): a forked worker opens its own

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        t0 = time.perf_counter_ns()
        decode_like_stage(i, self.a_ms)
        t1 = time.perf_counter_ns()
        augment_like_stage(i, self.b_ms)
        t2 = time.perf_counter_ns()
        out = torch.full((4,), float(i))
        if self.log_dir:
            self._write(f"{t0} {t1} {t2} {time.perf_counter_ns()}\n")
        return out

    def _write(self, line):
        pid = os.getpid()
        if self._log[0] != pid:
            path = os.path.join(self.log_dir, str(pid))
            self._log = (pid, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
        os.write(self._log[1], line.encode())


def guard_sigchld(safe_code):
    """torch reports a killed worker from its SIGCHLD handler, raising at
    whatever line the main thread is on: outside the loop's try (between two
    passes, in the handler of the last error) the job died of it; inside a
    ``__del__`` or a library's ``except Exception`` the error was lost and the
    loop waited out torch's 5 s status check. Put a handler in front of
    torch's that lets it raise only inside ``safe_code`` (the pass, all of
    it inside the try) and otherwise keeps the signal for ``check()``, which
    the pass calls at its start and after each batch. Call after the first
    iterator with workers exists (torch installs its handler then)."""
    torch_handler = signal.getsignal(signal.SIGCHLD)
    pending = [False]
    if not callable(torch_handler):
        return lambda: None

    def handler(signum, frame):
        f = frame
        while f is not None:
            code = f.f_code
            if code.co_name == "__del__" or code.co_filename.startswith(DLWATCH_FILES):
                break  # an error raised here would be swallowed
            if code is safe_code:
                pending[0] = False
                torch_handler(signum, frame)
                return
            f = f.f_back
        pending[0] = True

    def check():
        if pending[0]:
            pending[0] = False
            torch_handler(signal.SIGCHLD, None)

    signal.signal(signal.SIGCHLD, handler)
    return check


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--start-method", default="fork")
    p.add_argument("--persistent", action="store_true")
    p.add_argument("--a-ms", type=float, default=3.0)
    p.add_argument("--b-ms", type=float, default=1.0)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--epoch-batches", type=int, default=0, help="batches per epoch (0: endless)")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--digest", help="write a digest of the batches here")
    p.add_argument("--stage-log", help="a directory: each worker writes its samples' stage times there")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    n = a.epoch_batches * a.batch_size if a.epoch_batches else 10**7
    loader = DataLoader(
        TwoStages(n, a.a_ms, a.b_ms, a.stage_log),
        batch_size=a.batch_size,
        num_workers=a.workers,
        multiprocessing_context=a.start_method,
        persistent_workers=a.persistent,
    )
    h = hashlib.sha256()
    lost = 0
    state = {"t_ready": None, "check": lambda: None}

    def one_pass() -> bool:
        """One iterator's batches; True once the duration is up."""
        state["check"]()
        t_ready = state["t_ready"]
        if t_ready is not None and time.monotonic() - t_ready >= a.duration:
            return True
        it = iter(loader)
        if t_ready is None and a.workers > 0:
            state["check"] = guard_sigchld(one_pass.__code__)
        for batch in it:
            state["check"]()
            h.update(batch.numpy().tobytes())
            if state["t_ready"] is None:
                state["t_ready"] = time.monotonic()
                with open(a.out + ".pids", "w") as f:
                    f.write(" ".join(str(w.pid) for w in getattr(it, "_workers", [])))
                open(a.out + ".ready", "w").close()
            if time.monotonic() - state["t_ready"] >= a.duration:
                return True
        return False

    while True:
        # Everything inside the try, the iterator a local of one_pass (gone
        # with its frame), and torch's SIGCHLD error raised only inside it
        # (guard_sigchld): the job survives a worker killed at any moment.
        try:
            if one_pass():
                break
        except (RuntimeError, EOFError, OSError):
            # The killed worker: train on with a fresh iterator. torch says
            # so with a RuntimeError, but a batch the worker had queued
            # before it died comes as a handle to its shared memory, fetched
            # from the worker itself (torch's file_descriptor sharing): that
            # fails as the connection's error (ConnectionResetError,
            # EOFError, ConnectionRefusedError, FileNotFoundError), and
            # more often on a loaded box, where more batches wait unread.
            lost += 1
    if a.digest:
        with open(a.digest, "w") as f:
            f.write(h.hexdigest())


if __name__ == "__main__":
    main()
