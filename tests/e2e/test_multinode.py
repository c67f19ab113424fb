"""``dlwatch --host``: one view over the nodes of a real 2-node torchrun,
through a real OpenSSH.

Two ``sshd`` on 127.0.0.1 (Debian's openssh-server; host and user keys made
here, each with its own config and port) are the two nodes; each gives its
sessions its own ``DLWATCH_DIR`` (sshd's ``SetEnv``), and one node of a
2-node torchrun (c10d rendezvous on localhost, gloo on CPU) runs under
``dlwatch run`` with that directory. Node 2's rank loads slowly and holds
node 1's rank back at the all-reduce. The monitor reads both through ``ssh
-F <the test's config>`` (``DLWATCH_SSH``) with ``--remote-dlwatch`` naming
this venv's dlwatch.

One run serves every check, in one test: xdist's worksteal may hand a
module's tests to several workers (a module fixture would then start a run
in each), and killing node 2 must come last.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.e2e_util import short_tmpdir

SSHD = "/usr/sbin/sshd"
RANKED_JOB = Path(__file__).resolve().parents[1] / "jobs" / "ranked_job.py"
DLWATCH = str(Path(sys.executable).with_name("dlwatch"))

pytestmark = pytest.mark.skipif(
    not (os.access(SSHD, os.X_OK) and shutil.which("ssh") and shutil.which("ssh-keygen")),
    reason="needs OpenSSH (apt-get install openssh-server)",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Node:
    """One sshd: a node whose sessions see their own DLWATCH_DIR."""

    def __init__(self, name: str, work: str, host_key: str, authorized: str) -> None:
        self.name, self.port = name, free_port()
        self.dir = short_tmpdir(f"dlw{name}")
        self.config = os.path.join(work, f"sshd_{name}")
        Path(self.config).write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {authorized}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            f"PidFile none\nSetEnv DLWATCH_DIR={self.dir}\nLogLevel ERROR\n"
        )
        self.sshd = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", self.config],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2):
                return
            if (
                self.sshd.poll() is not None
            ):  # this machine cannot run an sshd of ours (not root, no /run/sshd)
                pytest.skip(f"sshd cannot start here: {self.sshd.stderr.read().decode()[-500:]}")  # type: ignore[union-attr]
            time.sleep(0.05)
        raise RuntimeError(f"sshd {name} does not listen")

    def kill(self) -> None:
        """The node goes away: the listener and every session it serves."""
        try:
            procs = [psutil.Process(self.sshd.pid), *psutil.Process(self.sshd.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
        self.sshd.wait(timeout=10)


class Cluster:
    def __init__(self) -> None:
        self.work = short_tmpdir("dlwssh")
        w = self.work
        for key in ("host_key", "user_key"):
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(w, key)], check=True
            )
        authorized = os.path.join(w, "authorized_keys")
        shutil.copy(os.path.join(w, "user_key.pub"), authorized)
        with contextlib.suppress(OSError):  # sshd's privilege separation dir (root only)
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        host_pub = Path(w, "host_key.pub").read_text().split()[:2]
        self.nodes: list[Node] = []
        try:
            for n in ("node1", "node2"):
                self.nodes.append(Node(n, w, os.path.join(w, "host_key"), authorized))
        except BaseException:  # a skip or a failure: the node already started goes too
            for node in self.nodes:
                node.kill()
            shutil.rmtree(w, ignore_errors=True)
            raise
        self.ssh_config = os.path.join(w, "ssh_config")
        known = os.path.join(w, "known_hosts")
        Path(known).write_text(
            "".join(f"[127.0.0.1]:{n.port} {' '.join(host_pub)}\n" for n in self.nodes)
            + f"[127.0.0.1]:{free_port()} {' '.join(host_pub)}\n"
        )
        self.down_port = free_port()  # node3: nothing listens there
        hosts = [*((n.name, n.port) for n in self.nodes), ("node3", self.down_port)]
        Path(self.ssh_config).write_text(
            "".join(
                f"Host {name}\n  HostName 127.0.0.1\n  Port {port}\n  User {getpass.getuser()}\n"
                f"  IdentityFile {w}/user_key\n  IdentitiesOnly yes\n  UserKnownHostsFile {known}\n"
                "  StrictHostKeyChecking yes\n  LogLevel ERROR\n"
                for name, port in hosts
            )
        )
        self.env = dict(
            os.environ, DLWATCH_SSH=f"ssh -F {self.ssh_config}", DLWATCH_DIR=short_tmpdir("dlwlocal")
        )
        self.stop = os.path.join(w, "stop")
        rdzv = f"127.0.0.1:{free_port()}"
        self.launches = [
            self._launch(self.nodes[0], rdzv, "--sample-ms", "0"),
            self._launch(self.nodes[1], rdzv, "--slow-here", "--sample-ms", "25"),
        ]
        self.follow: subprocess.Popen | None = None
        self._buf = b""
        self.lines: list[dict] = []

    def _launch(self, node: Node, rdzv: str, *job: str) -> subprocess.Popen:
        env = dict(os.environ, DLWATCH_DIR=node.dir, OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "dlwatch", "run", "--", sys.executable, "-m", "torch.distributed.run"]
        cmd += ["--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", rdzv]
        cmd += [
            "--rdzv-id",
            "multinode-test",
            str(RANKED_JOB),
            self.stop,
            "--allreduce",
            "--step-ms",
            "50",
            *job,
        ]
        return subprocess.Popen(
            cmd,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.work,
            start_new_session=True,
        )

    def dlwatch(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "dlwatch", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start_follow(self) -> None:
        hosts = ["--host", "node1", "--host", "node2"]
        self.follow = subprocess.Popen(
            [sys.executable, "-m", "dlwatch", "snapshot", "--follow", "--interval", "0.5", *hosts]
            + ["--remote-dlwatch", DLWATCH],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def until(self, ok: Callable[[dict], bool], timeout: float, what: str) -> dict:
        """The first merged snapshot of the stream (from now on) that is ``ok``."""
        assert self.follow is not None and self.follow.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(self.follow.stdout, selectors.EVENT_READ)
        end = time.monotonic() + timeout
        fd = self.follow.stdout.fileno()
        while time.monotonic() < end:
            for line in self._pending():
                snap = json.loads(line)
                self.lines.append(snap)
                if ok(snap):
                    return snap
            if self.follow.poll() is not None:
                break
            if sel.select(0.5):
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    break
                self._buf += chunk
        last = self.lines[-1] if self.lines else None
        errs = [p.stderr.read().decode()[-1500:] for p in self.launches if p.poll() is not None]  # type: ignore[union-attr]
        pytest.fail(
            f"{what}: not within {timeout} s; last: {json.dumps(last)[:3000]}; exited launches: {errs}"
        )

    def _pending(self) -> list[bytes]:
        *done, self._buf = self._buf.split(b"\n")
        return [ln for ln in done if ln.strip()]

    def close(self) -> None:
        Path(self.stop).touch()
        for p in [*self.launches]:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for p in [self.follow, *(n.sshd for n in self.nodes)]:
            if p is not None and p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=10)
        shutil.rmtree(self.work, ignore_errors=True)
        for d in [self.env["DLWATCH_DIR"], *(n.dir for n in self.nodes)]:
            shutil.rmtree(d, ignore_errors=True)


def test_one_view_over_two_nodes_through_ssh():
    c = Cluster()
    try:
        c.start_follow()
        ls_lists_each_nodes_rank_and_says_why_a_node_cannot_be_read(c)
        one_view_names_the_slow_rank_and_its_node_and_the_run_waits_at_its_pace(c)
        the_live_view_shows_both_nodes_ranks_and_where_the_slowest_runs(c)
        a_node_that_goes_away_is_one_line_and_the_other_keeps_updating(c)
    finally:
        c.close()


def ranks_by_host(snap: dict) -> dict[str, dict]:
    return {j["host"]: j for j in snap["jobs"] if j.get("rank") is not None and j.get("loaders")}


def wait_of(job: dict) -> float:
    return max(job["loaders"], key=lambda ld: ld["batches_per_s"] or 0)["data_wait_fraction"]


def hint(snap: dict, hid: str) -> dict | None:
    return next((h for h in snap["hints"] if h["id"] == hid), None)


def ls_lists_each_nodes_rank_and_says_why_a_node_cannot_be_read(cluster: Cluster) -> None:
    def listed():
        p = cluster.dlwatch(
            "ls",
            "--json",
            "--remote-dlwatch",
            DLWATCH,
            "--host",
            "node1",
            "--host",
            "node2",
            "--host",
            "node3",
        )
        p.check_returncode()
        return json.loads(p.stdout)

    doc = listed()
    end = time.monotonic() + 30
    while len([j for j in doc["jobs"] if j["rank"] is not None]) < 2 and time.monotonic() < end:
        time.sleep(1)
        doc = listed()
    ranked = sorted((j["host"], j["run_id"]) for j in doc["jobs"] if j["rank"] is not None)
    assert ranked == [("node1", "multinode-test"), ("node2", "multinode-test")], doc
    lines = {h["host"]: h for h in doc["hosts"]}
    assert lines["node1"]["state"] == lines["node2"]["state"] == "ok"
    node3 = lines["node3"]
    assert node3["state"] == "unreachable" and "Connection refused" in node3["reason"], node3
    assert "\n" not in node3["reason"]
    # One measurement of every node, as text: each node's line, its ranks named with it.
    p = cluster.dlwatch(
        "snapshot", "--window", "1", "--remote-dlwatch", DLWATCH, "--host", "node1", "--host", "node3"
    )
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert "host node1: ok, 1 job," in p.stdout and "host node3: UNREACHABLE" in p.stdout, p.stdout
    assert "on node1" in p.stdout and "run multinode-test: 1/2 ranks live on node1" in p.stdout, p.stdout
    # A node without dlwatch where it was said to be: one line, and what to do.
    p = cluster.dlwatch("ls", "--host", "node1", "--remote-dlwatch", "/nonexistent/dlwatch")
    assert p.returncode == 1 and "Traceback" not in p.stdout + p.stderr
    assert "NO-DLWATCH" in p.stdout and "--remote-dlwatch" in p.stdout, p.stdout


def one_view_names_the_slow_rank_and_its_node_and_the_run_waits_at_its_pace(cluster: Cluster) -> None:
    def judged(snap):
        ranks = ranks_by_host(snap)
        return set(ranks) == {"node1", "node2"} and hint(snap, "straggler-rank") is not None

    snap = cluster.until(judged, 60, "both nodes' ranks and a straggler-rank hint")
    ranks = ranks_by_host(snap)
    assert {h["host"]: h["state"] for h in snap["hosts"]} == {
        **{h["host"]: "ok" for h in snap["hosts"] if h.get("local")},
        "node1": "ok",
        "node2": "ok",
    }
    h = hint(snap, "straggler-rank")
    slow = ranks["node2"]
    assert (h["host"], h["job_pid"]) == ("node2", slow["pid"]), h
    assert f"Rank {slow['rank']} (PID {slow['pid']} on node2)" in h["message"], h["message"]
    (run,) = [r for r in snap["runs"] if r["run_id"] == "multinode-test"]
    assert run["ranks_live"] == 2 and run["hosts"] == ["node1", "node2"]
    # The run's wait is the slow rank's, not the mean that hides it.
    assert run["slowest"]["host"] == "node2" and run["slowest"]["pid"] == slow["pid"]
    assert run["data_wait_fraction_max"] == pytest.approx(wait_of(slow), abs=1e-4)
    assert run["data_wait_fraction_max"] > run["data_wait_fraction_mean"] > wait_of(ranks["node1"])
    assert wait_of(slow) >= 0.3 and wait_of(ranks["node1"]) < 0.1
    # Each node's own figures.
    assert all(isinstance(h["figures"].get("usable_cores"), (int, float)) for h in snap["hosts"])


def a_node_that_goes_away_is_one_line_and_the_other_keeps_updating(cluster: Cluster) -> None:
    cluster.until(lambda s: set(ranks_by_host(s)) == {"node1", "node2"}, 60, "both nodes")
    cluster.nodes[1].kill()

    def node2_gone(snap):
        line = next(h for h in snap["hosts"] if h["host"] == "node2")
        return line["state"] != "ok"

    gone = cluster.until(node2_gone, 30, "node 2 shown gone")
    line = next(h for h in gone["hosts"] if h["host"] == "node2")
    assert line["reason"] and "\n" not in line["reason"], line
    node2_jobs = [j for j in gone["jobs"] if j["host"] == "node2"]
    assert node2_jobs and all(j["state"] == "unreachable" for j in node2_jobs)
    before = ranks_by_host(gone)["node1"]["loaders"][0]["batches_total"]
    later = cluster.until(
        lambda s: ranks_by_host(s)["node1"]["loaders"][0]["batches_total"] > before + 5, 20, "node 1 updating"
    )
    assert next(h for h in later["hosts"] if h["host"] == "node1")["state"] == "ok"
    # Reconnecting with backoff: ssh's own refusal is the reason now.
    refused = cluster.until(
        lambda s: (
            "Connection refused" in (next(h for h in s["hosts"] if h["host"] == "node2")["reason"] or "")
        ),
        30,
        "node 2's reconnect refused",
    )
    assert next(h for h in refused["hosts"] if h["host"] == "node2")["state"] == "unreachable"
    assert cluster.follow is not None and cluster.follow.poll() is None


def the_live_view_shows_both_nodes_ranks_and_where_the_slowest_runs(cluster: Cluster) -> None:
    """The live view itself (``dlwatch --host node1 --host node2``'s source and
    app, in this process), over the real ssh."""
    import asyncio

    from dlwatch.collect.monitor import Monitor
    from dlwatch.collect.multihost import MultiHost
    from dlwatch.tui.host import HostLine
    from dlwatch.tui.jobs import JobList
    from tests.tui_fixtures import make_app
    from tests.unit.test_tui import wait_until

    local = Monitor(directory=cluster.env["DLWATCH_DIR"], gpu=False)
    source = MultiHost(local, ["node1", "node2"], dlwatch=DLWATCH, env=cluster.env)

    async def body() -> None:
        app = make_app(source)
        async with app.run_test(size=(140, 40)) as pilot:

            def rows() -> str:
                table = app.screen.query_one(JobList)
                return "\n".join(" ".join(str(c) for c in table.get_row(r.key)) for r in app.rows)

            await wait_until(pilot, lambda: "[node1]" in rows() and "[node2]" in rows(), 30)
            await wait_until(pilot, lambda: "slowest on node2" in rows(), 15)
            host = str(app.screen.query_one(HostLine).content)
            assert "node1 " in host and "node2 " in host and "✖" not in host, host

    asyncio.run(body())
