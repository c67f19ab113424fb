"""Other nodes' jobs, read through the user's own ssh.

``dlwatch --host node1`` runs ``dlwatch snapshot --follow --json`` on node1
over ``ssh`` (one connection per host, kept open) and reads the JSON Lines it
prints: each line is a whole snapshot of that node, built by that node's own
collector, which is the only thing that can see its processes and sockets.
Nothing listens on a port and no credential is new: ssh's config, agent,
ProxyJump and ControlMaster apply as for any ``ssh node1``.

One ``RemoteHost`` per host: one thread that starts ssh, reads its stdout and
stderr (one selector, no second thread), keeps the newest valid snapshot and
the host's state, and restarts ssh with backoff when it ends. A line is
bounded in size, parsed with ``json`` (never evaluated) and checked against
the snapshot contract (``dlwatch.snapshot.problems``) before it is kept.
What goes wrong is the host's ``state`` and a one-line ``reason`` (ssh's own
error line where it has one), never an exception out of the thread.

``fetch_once`` is the one-shot form (``dlwatch snapshot --host``, ``ls
--host``): one ssh command, its whole output one JSON document.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import shlex
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from dlwatch.snapshot import SCHEMA_VERSION, problems

log = logging.getLogger("dlwatch.collect")

# ssh never prompts (no terminal to answer on: a prompt would hang the view),
# gives up on a dead route in 10 s, and notices a node that went away without
# closing the connection after 3 unanswered keepalives 5 s apart. Compressed:
# a node with 8 ranks x 8 workers sends 84 KB/s at the view's 0.5 s, 9 KB/s
# through zlib (bench/remote_cost.py): the snapshots repeat their keys.
SSH_OPTIONS = (
    "-T",
    "-o",
    "BatchMode=yes",
    "-o",
    "Compression=yes",
    "-o",
    "ConnectTimeout=10",
    "-o",
    "ServerAliveInterval=5",
    "-o",
    "ServerAliveCountMax=3",
)
# A snapshot line of a node running 8 ranks x 8 workers is ~45 KB (bench/
# remote_cost.py); 64 ranks with their histories stay far below 16 MiB. A
# longer line is not a snapshot: it is skipped, and counted.
MAX_LINE_BYTES = 16 * 1024 * 1024
# Backoff between ssh attempts: 1, 2, 4, ... s, at most 30 s; back to 1 s
# once an attempt delivered a stream (two snapshots or more: a node whose
# dlwatch prints one document and exits, its runtime directory unusable, is
# retried with the growing backoff, not every second).
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0
# A running ssh that delivers nothing for this long (the node hangs, or the
# network dropped without a reset before the keepalives notice): "stale".
STALE_AFTER_S = 10.0
# What a reason line may hold of ssh's stderr.
REASON_CHARS = 300
READ_CHUNK = 1 << 16

# ssh exits 255 on its own errors (cannot connect, refused key, no route);
# otherwise with the remote command's status: a POSIX shell's 127 is
# "command not found" and 126 "not executable".
SSH_ERROR = 255
NOT_FOUND = (126, 127)


def ssh_command(env: dict[str, str] | None = None) -> list[str]:
    """The ssh command line: ``DLWATCH_SSH`` (split as a shell would, as git
    splits GIT_SSH_COMMAND), else ``ssh``; then the options that make it
    safe to run unattended."""
    given = (os.environ if env is None else env).get("DLWATCH_SSH", "")
    base = shlex.split(given) or ["ssh"]
    return [*base, *SSH_OPTIONS]


def remote_argv(dest: str, remote: list[str], env: dict[str, str] | None = None) -> list[str]:
    """``ssh ... DEST -- 'dlwatch ...'``: the remote command goes to the
    node's login shell as one quoted string. A leading ``~/`` of the program
    stays unquoted, so that the node's shell expands it to the home there."""
    prog, *rest = remote
    head = "~/" + shlex.quote(prog[2:]) if prog.startswith("~/") and len(prog) > 2 else shlex.quote(prog)
    return [*ssh_command(env), dest, "--", " ".join([head, *map(shlex.quote, rest)])]


def follow_command(dlwatch: str, interval: float, window: float) -> list[str]:
    return [
        dlwatch,
        "snapshot",
        "--follow",
        "--json",
        "--interval",
        f"{interval:g}",
        "--window",
        f"{window:g}",
    ]


def one_line(text: str) -> str:
    """The last non-empty line of ``text`` (ssh's error, a shell's "command
    not found"), trimmed: a reason fits on one line of the view."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = lines[-1] if lines else ""
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 1] + "…"


def failure(dest: str, code: int | None, stderr: str, dlwatch: str) -> tuple[str, str]:
    """(state, reason) for an ssh that ended with ``code``."""
    said = one_line(stderr)
    if code in NOT_FOUND:
        return (
            "no-dlwatch",
            f"{dlwatch!r} not found on {dest} (the PATH of a non-interactive ssh shell); "
            "give its path with --remote-dlwatch" + (f" [{said}]" if said else ""),
        )
    if code == SSH_ERROR:
        return "unreachable", said or f"ssh to {dest} failed (exit {code})"
    if code is None or code < 0:
        return "dropped", said or f"ssh to {dest} ended by signal {-(code or 0)}"
    return "dropped", said or f"dlwatch on {dest} exited with status {code}"


def parse_snapshot(line: bytes | str) -> tuple[dict[str, Any] | None, str | None]:
    """A snapshot from one line, or (None, why not). JSON only, then the
    contract: a line that is not a snapshot is never half-used."""
    try:
        doc = json.loads(line)
    except (ValueError, UnicodeDecodeError) as e:
        return None, f"not JSON: {e}"[:REASON_CHARS]
    if not isinstance(doc, dict):
        return None, f"not a snapshot: a JSON {type(doc).__name__}"
    if doc.get("schema_version") != SCHEMA_VERSION:
        return None, f"schema_version {doc.get('schema_version')!r}, this dlwatch reads {SCHEMA_VERSION}"
    bad = problems(doc)
    if bad:
        return None, f"breaks the snapshot contract: {bad[0]}"[:REASON_CHARS]
    return doc, None


@dataclass
class HostStatus:
    """What the view knows of one host, at one moment (``RemoteHost.status``)."""

    host: str
    state: str  # "connecting" | "ok" | "stale" | "unreachable" | "no-dlwatch" | "dropped"
    reason: str | None
    snapshot: dict[str, Any] | None  # the newest valid one (kept after a drop: last figures)
    age_s: float | None  # since it arrived
    lines: int = 0
    bytes: int = 0
    bad_lines: int = 0
    connects: int = 0

    def as_dict(self) -> dict[str, Any]:
        """The host's line of the merged snapshot's ``hosts`` (its figures
        are added by the merge)."""
        return {
            "host": self.host,
            "state": self.state,
            "reason": self.reason,
            "age_s": None if self.age_s is None else round(self.age_s, 1),
            "lines": self.lines,
            "bytes": self.bytes,
            "bad_lines": self.bad_lines,
            "connects": self.connects,
        }


@dataclass
class _Attempt:
    proc: subprocess.Popen
    out: bytearray = field(default_factory=bytearray)
    err: deque[str] = field(default_factory=lambda: deque(maxlen=20))
    skipping: bool = False  # inside an over-long line: drop up to its newline
    snapshots: int = 0

    @property
    def delivered(self) -> bool:
        return self.snapshots >= 2


class RemoteHost:
    """One host's stream: ``start()``, then ``status()`` from any thread."""

    def __init__(
        self,
        dest: str,
        dlwatch: str = "dlwatch",
        interval: float = 1.0,
        window: float = 1.0,
        env: dict[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dest = dest
        self.dlwatch = dlwatch
        self.argv = remote_argv(dest, follow_command(dlwatch, interval, window), env)
        self.interval = interval
        self.clock = clock
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen | None = None
        self._state: str = "connecting"
        self._reason: str | None = None
        self._snapshot: dict[str, Any] | None = None
        self._got_at: float | None = None
        self.lines = self.bytes = self.bad_lines = self.connects = 0
        self.backoff_s = BACKOFF_FIRST_S

    # --- the thread ------------------------------------------------------------------

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"dlwatch-ssh-{self.dest}", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._end(self._proc)
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                delivered = self._attempt()
            except Exception as e:  # never out of the thread: the host's line says it
                log.debug("ssh to %s failed", self.dest, exc_info=e)
                self._set("dropped", f"{type(e).__name__}: {e}")
                delivered = False
            if delivered:
                self.backoff_s = BACKOFF_FIRST_S
            if self._stop.wait(self.backoff_s):
                return
            if not delivered:
                self.backoff_s = min(BACKOFF_MAX_S, self.backoff_s * 2)

    def _attempt(self) -> bool:
        with self._lock:
            # The state stays what the last attempt left (its reason on screen) until this one says.
            self.connects += 1
        try:
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # Ctrl-C in the view is not ssh's
            )
        except OSError as e:
            self._set("unreachable", f"cannot start {self.argv[0]}: {e.strerror or e}")
            return False
        self._proc = proc
        att = _Attempt(proc)
        try:
            self._read(att)
        finally:
            self._end(proc)
            for f in (proc.stdout, proc.stderr):
                if f is not None:
                    f.close()
        if self._stop.is_set():
            return att.delivered
        code = proc.poll()
        self._set(*failure(self.dest, code, "\n".join(att.err), self.dlwatch))
        return att.delivered

    def _read(self, att: _Attempt) -> None:
        """Lines from stdout until ssh closes it (or ``stop()``); stderr kept
        meanwhile for the reason line. Once stdout is closed ssh is ending:
        its last words are read, without waiting on a stderr that something
        else may hold open."""
        proc = att.proc
        assert proc.stdout is not None and proc.stderr is not None
        out, err = proc.stdout.fileno(), proc.stderr.fileno()
        sel = selectors.DefaultSelector()
        try:
            for fd in (out, err):
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            while out in sel.get_map() and not self._stop.is_set():
                for key, _ in sel.select(timeout=1.0):
                    chunk = _read_some(key.fd)
                    if chunk is None:
                        continue
                    if not chunk:
                        sel.unregister(key.fd)
                    elif key.fd == out:
                        self._feed(att, chunk)
                    else:
                        att.err.extend(chunk.decode(errors="replace").splitlines())
                self._check_stale()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=2)
            while err in sel.get_map() and (chunk := _read_some(err)):
                att.err.extend(chunk.decode(errors="replace").splitlines())
        finally:
            sel.close()

    def _feed(self, att: _Attempt, chunk: bytes) -> None:
        """Split ``chunk`` into lines (the part of a line held from earlier
        chunks first); each newline is searched once, and a line past
        ``MAX_LINE_BYTES`` is dropped as it comes, never held whole."""
        with self._lock:
            self.bytes += len(chunk)
        start = 0
        while True:
            nl = chunk.find(b"\n", start)
            if nl < 0:
                rest = chunk[start:]
                if not att.skipping and len(att.out) + len(rest) > MAX_LINE_BYTES:
                    att.out.clear()
                    att.skipping = True
                elif not att.skipping:
                    att.out += rest
                return
            piece, start = chunk[start:nl], nl + 1
            if att.skipping:
                att.skipping = False
                self._bad(f"a line over {MAX_LINE_BYTES} bytes (skipped)")
                continue
            line = bytes(att.out) + piece if att.out else piece
            att.out.clear()
            if line.strip():
                att.snapshots += self._take(line)

    def _take(self, line: bytes) -> bool:
        doc, why = parse_snapshot(line)
        if doc is None:
            self._bad(why or "?")
            return False
        with self._lock:
            self.lines += 1
            self._snapshot, self._got_at = doc, self.clock()
            self._state, self._reason = "ok", None
        return True

    def _bad(self, why: str) -> None:
        with self._lock:
            self.bad_lines += 1
            self._reason = f"bad line from {self.dest}: {why}"

    def _check_stale(self) -> None:
        with self._lock:
            if self._state == "ok" and self._got_at is not None:
                quiet = self.clock() - self._got_at
                if quiet > max(STALE_AFTER_S, 5 * self.interval):
                    self._state, self._reason = "stale", f"no snapshot from {self.dest} for {quiet:.0f} s"

    def _set(self, state: str, reason: str | None) -> None:
        with self._lock:
            self._state, self._reason = state, reason

    def _end(self, proc: subprocess.Popen | None) -> None:
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=2)
            except (OSError, subprocess.TimeoutExpired):
                pass

    # --- what the view reads -------------------------------------------------------

    def status(self) -> HostStatus:
        with self._lock:
            age = None if self._got_at is None else max(0.0, self.clock() - self._got_at)
            state, reason = self._state, self._reason
            if state == "ok" and age is not None and age > max(STALE_AFTER_S, 5 * self.interval):
                state, reason = "stale", f"no snapshot from {self.dest} for {age:.0f} s"
            return HostStatus(
                host=self.dest,
                state=state,
                reason=reason,
                snapshot=self._snapshot,
                age_s=age,
                lines=self.lines,
                bytes=self.bytes,
                bad_lines=self.bad_lines,
                connects=self.connects,
            )


def _read_some(fd: int) -> bytes | None:
    """Up to READ_CHUNK bytes from a non-blocking ``fd``: b"" at its end,
    None when nothing is there yet."""
    try:
        return os.read(fd, READ_CHUNK)
    except BlockingIOError:
        return None


def fetch_once(
    dest: str, remote: list[str], timeout: float, env: dict[str, str] | None = None, dlwatch: str = "dlwatch"
) -> tuple[dict[str, Any] | None, str, str | None]:
    """Run ``remote`` (a dlwatch command that prints one JSON document) on
    ``dest``: (document, state, reason). Bounded in time and size."""
    argv = remote_argv(dest, remote, env)
    try:
        p = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, start_new_session=True
        )
    except subprocess.TimeoutExpired:
        return None, "unreachable", f"no answer from {dest} within {timeout:g} s"
    except OSError as e:
        return None, "unreachable", f"cannot start {argv[0]}: {e.strerror or e}"
    err = p.stderr.decode(errors="replace")
    if not p.stdout.strip() or len(p.stdout) > MAX_LINE_BYTES:
        return None, *failure(dest, p.returncode, err, dlwatch)
    try:
        doc = json.loads(p.stdout)
    except ValueError as e:
        return None, "dropped", f"not JSON from {dest}: {e}"[:REASON_CHARS]
    if not isinstance(doc, dict):
        return None, "dropped", f"not a JSON object from {dest}"
    return doc, "ok", None
