"""The trainer-side server: one Unix socket per trainer process.

A daemon thread turns the loaders' cumulative counters into a window frame
about 10 times a second, keeps the last minute of frames, and streams them to
whoever attaches. It never blocks the training loop: sockets are
non-blocking, a client that does not keep up is dropped, and everything that
can fail is caught here and turned into "not monitoring", never into an
exception in the job.
"""

from __future__ import annotations

import atexit
import os
import selectors
import socket
import struct
import sys
import threading
import time
from collections import deque
from typing import Any

from dlwatch import own_threads, rundir, wire
from dlwatch.probe import control, exit_cause, handover, patches, stall, trainthread
from dlwatch.probe.identity import job_identity, learn_ranks

INTERVAL_S = 0.1
HISTORY_FRAMES = 600  # one minute at 10 Hz
# A client further behind than this is not reading: drop it rather than
# buffer without bound (history on attach is ~2 MB at most).
MAX_CLIENT_BACKLOG = 8 << 20
HELLO_TIMEOUT_S = 5.0
# A client whose backlog has not shrunk for this long is stopped or gone
# (SIGSTOP, a frozen terminal): drop it long before it reaches the backlog cap.
STALL_TIMEOUT_S = 30.0
MAX_CLIENTS = 32
# How often to check that our socket file still exists (someone may have
# deleted the runtime directory under a long-running job).
REBIND_CHECK_S = 2.0

_lock = threading.Lock()
_publisher: Publisher | None = None
_disabled_reason: str | None = None


def own_tids() -> list[int]:
    """The native ids of dlwatch's threads in this process (this publisher,
    the profiler's processing thread, a notebook's reader; in workers the
    stack watcher and a burst's sampler, listed in their rows instead), all
    named ``own_threads.PREFIX``…: the frame lists them (``own_tids``) and
    the monitor leaves them out of the job's threads, CPU and run-queue wait."""
    return [
        t.native_id for t in threading.enumerate() if t.native_id and t.name.startswith(own_threads.PREFIX)
    ]


def ensure_started() -> None:
    """Called on every new iterator; cheap after the first call."""
    if _publisher is not None or _disabled_reason is not None:
        return
    _start()


def _start() -> None:
    global _publisher, _disabled_reason
    with _lock:
        if _publisher is not None or _disabled_reason is not None:
            return
        pub = Publisher()
        try:
            pub.open()
        except (OSError, rundir.RuntimeDirError) as e:
            _disabled_reason = str(e)
            _say(f"dlwatch: not monitoring this job: {e}")
            return
        pub.start()
        _publisher = pub
        atexit.register(_stop_at_exit)
        try:
            exit_cause.install()
        except Exception:
            pass  # no cause in the last frame, never a broken job


def _say(msg: str) -> None:
    try:
        print(msg, file=sys.stderr, flush=True)
    except Exception:
        pass


def _stop_at_exit() -> None:
    pub = _publisher
    if pub is not None:
        pub.close()


def current() -> Publisher | None:
    return _publisher


def stop() -> None:
    """Close this process's publisher now (its last frame, its socket file);
    the next iterator starts a new one, in the runtime directory of that
    moment. For a process that hosts one job after another, each with a
    runtime directory of its own (a test runner): left running, the
    publisher would rebind in the first one's directory whenever it was
    deleted, for the life of the process."""
    global _publisher
    with _lock:
        pub, _publisher = _publisher, None
    if pub is not None:
        pub.close()


def _after_fork_in_child() -> None:
    # The child inherits our socket fds but not our thread. Close the copies
    # (the file belongs to the parent: never unlink it) and forget everything;
    # a child that trains starts its own publisher on its first iterator.
    global _publisher, _disabled_reason, _lock
    pub = _publisher
    _publisher = None
    _disabled_reason = None
    _lock = threading.Lock()
    patches.registry.clear()
    handover.forget()
    trainthread.forget()
    exit_cause.forget()
    if pub is not None:
        pub.abandon()


os.register_at_fork(after_in_child=_after_fork_in_child)


# Batches per loader over about the last second (control.py: a burst
# follows the loader that stepped most in it).
BUSY_FRAMES = 11

# Worker deaths are looked for every this many frames (a waitid per worker).
DEATH_SCAN_EVERY = 5

# A client may ask for every Nth frame only ("every" in its hello): the live
# monitor reads five a second, enough for its windows, at half the cost.
MAX_EVERY = 100


class _Client:
    __slots__ = ("sock", "decoder", "out", "greeted", "t_connect", "closing", "t_progress", "every")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.decoder = wire.FrameDecoder(wire.MAX_CLIENT_FRAME_BYTES)
        self.out = bytearray()
        self.greeted = False
        self.t_connect = time.monotonic()
        self.closing = False
        self.t_progress = self.t_connect  # last time its backlog was empty or shrank
        self.every = 1


class Publisher:
    def __init__(self, directory: str | None = None, interval: float = INTERVAL_S) -> None:
        self.directory = directory
        self.interval = interval
        self.path: str | None = None
        self._inode: tuple[int, int] | None = None
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
        self._clients: dict[int, _Client] = {}
        self._history: deque[bytes] = deque(maxlen=HISTORY_FRAMES)
        self._seq = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._job: dict = {}
        self._last_rebind_check = 0.0
        self.frames_built = 0
        self.clients_dropped = 0
        self._recent: deque[dict[int, int]] = deque(maxlen=BUSY_FRAMES)
        self._control = control.Control(self)
        self._stall = stall.StallWatch()
        self._stalled: set[int] = set()  # loader ids stalled at the last frame

    # --- lifecycle ------------------------------------------------------------

    def open(self) -> None:
        self.directory = rundir.ensure_dir(self.directory or rundir.runtime_dir())
        self._bind()
        self._job = job_identity()

    def _bind(self) -> None:
        path = rundir.socket_path(self.directory or rundir.runtime_dir(), os.getpid())
        if os.path.lexists(path):
            os.unlink(path)  # a stale socket of a dead process with our pid
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            # No umask games (the umask is process-wide and the training code
            # runs other threads): the directory is 0700, so nobody else can
            # reach the socket in the moment before the chmod.
            sock.bind(path)
            os.chmod(path, 0o600)
            sock.listen(16)
            sock.setblocking(False)
        except BaseException:
            sock.close()
            raise
        st = os.stat(path)
        self._inode = (st.st_dev, st.st_ino)
        self.path = path
        old_sock = self._sock
        self._sock = sock
        if self._sel is not None:
            if old_sock is not None:
                try:
                    self._sel.unregister(old_sock)
                except (KeyError, ValueError):
                    pass
                old_sock.close()
            self._sel.register(sock, selectors.EVENT_READ, None)

    @property
    def _selector(self) -> selectors.BaseSelector:
        if self._sel is None:
            raise RuntimeError("the publisher is not started")
        return self._sel

    @property
    def _listener(self) -> socket.socket:
        if self._sock is None:
            raise RuntimeError("the publisher is not open")
        return self._sock

    def start(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._thread = own_threads.start(self._run, "dlwatch-publisher")

    def close(self) -> None:
        self._stop.set()
        t = self._thread
        if t is not None and t.is_alive() and t is not threading.current_thread():
            t.join(timeout=1.0)
        if t is not None and not t.is_alive():
            self._greet_latecomers()
        self._last_frame()
        self._control.farewell()
        self._close_sockets()
        self._unlink_own()

    def _greet_latecomers(self) -> None:
        """At exit, once the thread has stopped: a monitor that connected in
        the job's last moments (its hello not read yet) still gets the hello
        and the last frame. Non-blocking, one pass; requests of monitors
        already greeted are not served now (nothing is started at exit)."""
        try:
            sel = self._selector
            for key, _mask in sel.select(0):
                if key.data is None:
                    self._accept()
            for key, mask in sel.select(0):
                c = key.data
                if c is not None and not c.greeted:
                    self._service(c, mask & selectors.EVENT_READ)
        except Exception:
            return

    def _last_frame(self) -> None:
        """At exit: one more frame, so that what ended the job (a worker
        that died, the error the loader raised) reaches the monitors."""
        try:
            frame = self.build_frame(scan=True)
            frame.setdefault("main", {})["at_exit"] = True
            data = wire.encode(frame)
        except Exception:
            return
        for c in list(self._clients.values()):
            if c.greeted and not c.closing:
                try:
                    c.out += data
                    c.sock.send(bytes(c.out), socket.MSG_NOSIGNAL | socket.MSG_DONTWAIT)
                    c.out.clear()
                except OSError:
                    pass

    def abandon(self) -> None:
        """In a forked child: drop the inherited fds, leave the file alone."""
        self._stop.set()
        self._close_sockets()

    def _close_sockets(self) -> None:
        for c in list(self._clients.values()):
            try:
                c.sock.close()
            except OSError:
                pass
        self._clients.clear()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        if self._sel is not None:
            try:
                self._sel.close()
            except (OSError, RuntimeError):
                pass

    def _unlink_own(self) -> None:
        if not self.path:
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                os.unlink(self.path)
        except OSError:
            pass

    # --- the thread -------------------------------------------------------------

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                timeout = max(0.0, next_tick - time.monotonic())
                for key, mask in self._selector.select(timeout):
                    if key.data is None:
                        self._accept()
                    else:
                        self._service(key.data, mask)
                now = time.monotonic()
                if now >= next_tick:
                    self._tick()
                    next_tick += self.interval
                    if next_tick < now:
                        next_tick = now + self.interval
                    self._reap(now)
                    if now - self._last_rebind_check >= REBIND_CHECK_S:
                        self._last_rebind_check = now
                        self._check_socket_file()
            except Exception:
                # A bug here must cost us monitoring, never the job; back off.
                if self._stop.wait(self.interval):
                    break

    def _tick(self) -> None:
        if learn_ranks(self._job):
            # torch.distributed came up after the hello (mp.spawn's ranks):
            # the monitors learn the rank from a second hello.
            self._greet_again()
        frame = self.build_frame()
        try:
            data = wire.encode(frame)
        except (wire.WireError, ValueError, TypeError):
            return
        self._history.append(data)
        self.frames_built += 1
        for c in list(self._clients.values()):
            if c.greeted and not c.closing and self._seq % c.every == 0:
                self.queue(c, data)
        self._control.poll()

    def _greet_again(self) -> None:
        hello = wire.encode(wire.server_hello(self._job, 0, self._control.features()))
        for c in list(self._clients.values()):
            if c.greeted and not c.closing:
                self.queue(c, hello)

    def build_frame(self, scan: bool = False) -> dict:
        self._seq += 1
        loaders = []
        batches: dict[int, int] = {}
        sts = patches.registry.snapshot(time.perf_counter_ns())
        if scan or self._seq % DEATH_SCAN_EVERY == 0:
            for st in sts:
                try:
                    st.scan_deaths()
                except Exception:
                    continue
        # The frame's time is read right before the loaders' counters: the
        # loop goes on meanwhile, and a batch it completes between this clock
        # and the counters is counted whole while the frame says `now`. The
        # registry's lock, the death scans (/proc reads) and the stall check
        # used to sit in between; on a loaded box (fresh-clone run 26) a
        # recorded 1 s window read 0.5025 where the loop's own clock said 0.529.
        now = time.perf_counter_ns()
        for st in sts:
            try:
                fr = st.frame(now)
                loaders.append(fr)
                batches[st.id] = st.batches
            except Exception:
                continue
        try:
            stalls = self._stall.check(sts, now / 1e9)
        except Exception:
            stalls = {}
        for fr in loaders:
            fr.update(stalls.get(fr["id"]) or {})
        self._recent.append(batches)
        self._note_stalls(loaders)
        torch = sys.modules.get("torch")
        cuda_init = None
        try:
            if torch is not None:
                cuda_init = bool(torch.cuda.is_initialized())
        except Exception:
            cuda_init = None
        main: dict[str, Any] = {
            "cuda_initialized": cuda_init,
            "py_threads": threading.active_count(),
            "own_tids": own_tids(),
        }
        steppers = trainthread.summary()
        if steppers:
            main["train_threads"] = steppers
        ended_by = exit_cause.last()
        if ended_by is not None:
            main["exit_exception"] = ended_by
        exit_call = exit_cause.exit_call()
        if exit_call is not None:
            main["exit_call"] = exit_call
        return wire.window(self._seq, time.time(), now, loaders, main)

    def _note_stalls(self, loaders: list[dict]) -> None:
        """A loader that has just stalled: gather the stacks, once a stall."""
        stalled = {ld["id"] for ld in loaders if ld.get("stalled_s") is not None}
        new = stalled - self._stalled
        self._stalled = stalled
        if new:
            keys = ("id", "stalled_s", "stall_threshold_s", "in_next", "batches", "epoch", "num_workers")
            self._control.on_stall([{k: ld.get(k) for k in keys} for ld in loaders if ld["id"] in new])

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            if not self._peer_allowed(conn) or len(self._clients) >= MAX_CLIENTS:
                conn.close()
                continue
            conn.setblocking(False)
            c = _Client(conn)
            self._clients[conn.fileno()] = c
            self._selector.register(conn, selectors.EVENT_READ, c)

    @staticmethod
    def _peer_allowed(conn: socket.socket) -> bool:
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
        except OSError:
            return False
        return uid == os.getuid()

    def _service(self, c: _Client, mask: int) -> None:
        if mask & selectors.EVENT_READ:
            try:
                data = c.sock.recv(4096)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError:
                self._drop(c)
                return
            if data == b"":
                self._drop(c)
                return
            if data:
                for msg in c.decoder.feed(data):
                    self._on_message(c, msg)
                    if c.closing:
                        break
        if mask & selectors.EVENT_WRITE and c.sock.fileno() >= 0:
            self._flush(c)

    def _on_message(self, c: _Client, msg) -> None:
        if isinstance(msg, wire.WireError):
            self._fail(c, str(msg))
            return
        if c.greeted:
            self._control.on_request(c, msg)
            return
        if msg.get("type") != "hello" or "job" in msg:
            self._fail(c, "expected a client hello first")
            return
        try:
            wire.check_protocol(msg)
        except wire.WireError as e:
            self._fail(c, str(e))
            return
        c.greeted = True
        every = msg.get("every")
        if isinstance(every, int) and not isinstance(every, bool) and 1 <= every <= MAX_EVERY:
            c.every = every
        want = msg.get("history_frames")
        history = list(self._history)
        if c.every > 1:
            # The same frames a live client of this pace would have had
            # (the history holds frames up to self._seq, newest last).
            first = (len(history) - 1 - self._seq % c.every) % c.every if history else 0
            history = history[first :: c.every]
        if isinstance(want, int) and not isinstance(want, bool) and want >= 0:
            history = history[len(history) - min(len(history), want) :]
        # Replay only the newest frames that fit in half the backlog: a big
        # history must not get a client that reads normally dropped at once.
        budget, keep = MAX_CLIENT_BACKLOG // 2, 0
        for frame in reversed(history):
            if budget - len(frame) < 0:
                break
            budget -= len(frame)
            keep += 1
        history = history[len(history) - keep :]
        hello = wire.server_hello(self._job, len(history), self._control.features())
        self.queue(c, wire.encode(hello))
        for frame in history:
            if c.closing:
                break
            self.queue(c, frame)
        for data in self._control.replay():
            self.queue(c, data)

    def _fail(self, c: _Client, message: str) -> None:
        """Tell the client why, best effort, then hang up."""
        try:
            c.out += wire.encode(wire.error(message))
        except wire.WireError:
            pass
        c.closing = True
        self._flush(c)
        self._drop(c)

    def queue(self, c: _Client, data: bytes) -> None:
        if c.closing:
            return
        if len(c.out) + len(data) > MAX_CLIENT_BACKLOG:
            self.clients_dropped += 1
            c.closing = True
            self._drop(c)
            return
        c.out += data
        self._flush(c)

    def _flush(self, c: _Client) -> None:
        try:
            while c.out:
                # MSG_NOSIGNAL: a monitor that hung up must never SIGPIPE a
                # job that restored SIGPIPE's default action.
                n = c.sock.send(c.out, socket.MSG_NOSIGNAL)
                if n <= 0:
                    break
                del c.out[:n]
                c.t_progress = time.monotonic()
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(c)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if c.out else 0)
        try:
            self._selector.modify(c.sock, want, c)
        except (KeyError, ValueError, OSError):
            pass

    def _drop(self, c: _Client) -> None:
        try:
            fd = c.sock.fileno()
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                self._selector.unregister(c.sock)
            except (KeyError, ValueError):
                pass
            self._clients.pop(fd, None)
        else:
            for k, v in list(self._clients.items()):
                if v is c:
                    del self._clients[k]
        try:
            c.sock.close()
        except OSError:
            pass

    def _reap(self, now: float) -> None:
        for c in list(self._clients.values()):
            if not c.greeted and now - c.t_connect > HELLO_TIMEOUT_S:
                self._fail(c, f"no hello within {HELLO_TIMEOUT_S:.0f} s")
            elif c.out and now - c.t_progress > STALL_TIMEOUT_S:
                self.clients_dropped += 1
                self._drop(c)

    def _check_socket_file(self) -> None:
        # Never once closed: close() waits 1 s at most for this thread (a job's
        # exit must not hang on it), and a thread that outlived that wait on a
        # loaded box found the socket close() had unlinked "deleted" and bound
        # a new one, its directory too (a test run's check of runtime
        # directories caught one at -n 5).
        if self.path is None or self._stop.is_set():
            return
        try:
            st = os.stat(self.path)
            if (st.st_dev, st.st_ino) == self._inode:
                return
        except OSError:
            pass
        if self._stop.is_set():
            return
        try:
            rundir.ensure_dir(self.directory)
            self._bind()
        except (OSError, rundir.RuntimeDirError):
            pass  # try again at the next check; the job trains on regardless

    def broadcast(self, data: bytes, skip: _Client | None = None, skip_all=()) -> None:
        for c in list(self._clients.values()):
            if c.greeted and not c.closing and c is not skip and c not in skip_all:
                self.queue(c, data)

    def connected(self, c: _Client) -> bool:
        return c in self._clients.values()

    def recent_batches(self) -> deque[dict[int, int]]:
        """Batches per loader id in the last BUSY_FRAMES frames, oldest first."""
        return self._recent

    @property
    def clients(self) -> int:
        return len(self._clients)
