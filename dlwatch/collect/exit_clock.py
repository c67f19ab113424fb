"""When each watched job's process ended, to within milliseconds.

Which rank of a run ended first is the run's root cause (torchrun's word),
and a job's last frame places its end only within one publishing interval
(0.1 s, more on a busy box): torchrun stops the other ranks about 0.1 s after
one fails, so a SIGKILLed rank and the ranks stopped for it read alike. A
process's pidfd (Linux ≥ 5.3, ``os.pidfd_open``) becomes readable the moment
it exits, for any process we may see, child or not; one thread waits on all
of them and notes the time. Nothing here touches the job: a pidfd only
observes (it sends no signal, takes no ptrace).

The thread runs only while some process is watched, and each pidfd is closed
once its process has ended or is forgotten, so a monitor that is never
stopped leaks nothing past its jobs. Where pidfds are missing (an old kernel,
a seccomp filter), ``watch`` returns False and the order falls back on the
frames.
"""

from __future__ import annotations

import os
import select
import threading
import time
from collections.abc import Callable

from dlwatch.collect.job_end import zombie_status


class ExitClock:
    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._fds: dict[int, int] = {}  # pid -> pidfd, owned by the thread once added
        self._add: dict[int, int] = {}  # pid -> pidfd, not yet polled
        self._drop: set[int] = set()
        self._ended: dict[int, tuple[float, int | None]] = {}  # pid -> (time, wait status)
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self.unavailable: str | None = None  # why pidfds cannot be had, once known

    def watch(self, pid: int) -> bool:
        """Note when ``pid`` ends; False where that cannot be known."""
        with self._lock:
            if pid in self._fds or pid in self._add or pid in self._ended:
                return True
            if self.unavailable is not None:
                return False
            try:
                fd = os.pidfd_open(pid)
            except AttributeError:
                self.unavailable = "os.pidfd_open is missing (Python < 3.9 or not Linux)"
                return False
            except ProcessLookupError:
                return False  # already gone: its frames are all there is
            except OSError as e:
                self.unavailable = f"pidfd_open failed: {e.strerror or e}"
                return False
            self._add[pid] = fd
            self._start_locked()
            return True

    def ended_at(self, pid: int) -> float | None:
        with self._lock:
            end = self._ended.get(pid)
        return None if end is None else end[0]

    def status(self, pid: int) -> int | None:
        """The wait status read as it ended (None: reaped before the read)."""
        with self._lock:
            end = self._ended.get(pid)
        return None if end is None else end[1]

    def forget(self, pid: int) -> None:
        with self._lock:
            self._ended.pop(pid, None)
            fd = self._add.pop(pid, None)
            if fd is not None:
                os.close(fd)
            elif pid in self._fds:
                self._drop.add(pid)
                self._wake_locked()

    def stop(self) -> None:
        with self._lock:
            self._drop.update(self._fds)
            for fd in self._add.values():
                os.close(fd)
            self._add.clear()
            self._wake_locked()
            thread = self._thread
        if thread is not None:
            thread.join(timeout=2.0)

    # --- the thread ---------------------------------------------------------------

    def _start_locked(self) -> None:
        if self._thread is not None:
            self._wake_locked()
            return
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self._thread = threading.Thread(target=self._run, name="dlwatch-exit-clock", daemon=True)
        self._thread.start()

    def _wake_locked(self) -> None:
        if self._wake_w >= 0:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass  # a full pipe already wakes it

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self._wake_r, select.POLLIN)
        by_fd: dict[int, int] = {}
        while True:
            with self._lock:
                for pid, fd in self._add.items():
                    self._fds[pid] = fd
                    by_fd[fd] = pid
                    poller.register(fd, select.POLLIN)
                self._add.clear()
                for pid in self._drop & self._fds.keys():
                    fd = self._fds.pop(pid)
                    poller.unregister(fd)
                    del by_fd[fd]
                    os.close(fd)
                self._drop.clear()
                if not self._fds:
                    # Nothing to watch: the thread ends, a later watch starts another.
                    os.close(self._wake_r)
                    os.close(self._wake_w)
                    self._wake_r = self._wake_w = -1
                    self._thread = None
                    return
            try:
                ready = poller.poll()
            except InterruptedError:
                continue
            now = self._clock()
            with self._lock:
                for fd, _ in ready:
                    if fd == self._wake_r:
                        try:
                            while os.read(fd, 64):
                                pass
                        except BlockingIOError:
                            pass
                        continue
                    if fd not in by_fd:
                        continue
                    pid = by_fd.pop(fd)
                    poller.unregister(fd)
                    os.close(fd)
                    self._fds.pop(pid, None)
                    if pid not in self._drop:  # forgotten meanwhile: nothing to keep
                        self._ended[pid] = (now, zombie_status(pid))
