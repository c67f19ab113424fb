"""The ssh reader of ``dlwatch --host`` with a stand-in for ssh.

``DLWATCH_SSH`` names a small script that answers as ssh and a remote
dlwatch would (snapshot lines on stdout, ssh's own errors on stderr, its exit
codes), so the reader thread, its backoff, ``ls --host`` and the live view
over hosts run for real without an sshd; tests/e2e/test_multinode.py has the
real one.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time

import pytest

from dlwatch.collect import remote
from dlwatch.collect.multihost import list_jobs
from dlwatch.collect.remote import RemoteHost
from tests.unit.test_remote import nodes

FAKE_SSH = textwrap.dedent(
    """
    import json, os, sys, time
    dest, command = sys.argv[sys.argv.index("--") - 1], sys.argv[-1].split()
    lines = open(os.environ["FAKE_LINES"]).read().splitlines()
    if dest == "down":
        sys.stderr.write("ssh: connect to host down port 22: Connection refused\\n"); sys.exit(255)
    if dest == "nodl":
        sys.stderr.write("bash: line 1: dlwatch: command not found\\n"); sys.exit(127)
    if dest == "once":  # a node whose runtime directory cannot be used
        print(lines[0], flush=True)
        sys.stderr.write("dlwatch: /run/user/0/dlwatch is owned by uid 1000, not 0\\n"); sys.exit(1)
    if command[1] == "ls":
        print(json.dumps({"schema_version": 1, "jobs": [{"pid": 5, "rank": 0}]})); sys.exit(0)
    if dest == "drops":
        for ln in ["garbage", "x" * 100_000, *lines]:
            print(ln, flush=True)
        sys.stderr.write("Connection to drops closed by remote host.\\n"); sys.exit(255)
    if dest[:1] == "n" and dest[1:].isdigit():
        lines = [lines[int(dest[1:]) - 1]]  # n1, n2: one node each
    for ln in lines:
        print(ln, flush=True)
    time.sleep(60)
    """
)


@pytest.fixture
def fake_ssh(tmp_path, monkeypatch):
    script = tmp_path / "fake_ssh.py"
    script.write_text(FAKE_SSH)
    lines = tmp_path / "lines.jsonl"
    lines.write_text("\n".join(json.dumps(n) for n in nodes()) + "\n")
    monkeypatch.setenv("FAKE_LINES", str(lines))
    monkeypatch.setenv("DLWATCH_SSH", f"{sys.executable} {script}")


def wait_for(cond, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False


def test_the_reader_keeps_the_newest_snapshot_and_says_why_a_host_fails(fake_ssh, monkeypatch):
    monkeypatch.setattr(remote, "MAX_LINE_BYTES", 50_000)
    hosts = {d: RemoteHost(d) for d in ("good", "down", "nodl", "drops", "once")}
    for h in hosts.values():
        h.start()
    try:
        assert wait_for(lambda: hosts["good"].status().lines == 2)
        good = hosts["good"].status()
        assert good.state == "ok" and good.snapshot is not None and good.snapshot["jobs"][0]["rank"] == 1
        assert wait_for(lambda: hosts["down"].status().state == "unreachable")
        assert hosts["down"].status().reason == "ssh: connect to host down port 22: Connection refused"
        assert wait_for(lambda: hosts["nodl"].status().state == "no-dlwatch")
        assert wait_for(lambda: hosts["drops"].status().state == "unreachable")
        drops = hosts["drops"].status()
        # Garbage and an over-long line skipped and counted; the good lines kept.
        assert drops.bad_lines == 2 and drops.lines >= 2 and drops.snapshot is not None
        assert drops.reason == "Connection to drops closed by remote host."
        assert wait_for(lambda: hosts["once"].status().state == "dropped")
        once = hosts["once"].status()
        assert once.reason == "dlwatch: /run/user/0/dlwatch is owned by uid 1000, not 0" and once.snapshot
        # It comes back by itself, after a backoff that grows while it fails
        # (a node that prints one document and exits fails too).
        assert wait_for(lambda: hosts["down"].status().connects >= 2, 5)
        assert hosts["down"].backoff_s >= 2 * remote.BACKOFF_FIRST_S
        assert wait_for(lambda: hosts["once"].backoff_s >= 2 * remote.BACKOFF_FIRST_S, 5)
    finally:
        for h in hosts.values():
            h.stop()
    assert all(h._proc is None or h._proc.poll() is not None for h in hosts.values())


def test_ls_over_hosts_lists_each_hosts_jobs_and_one_line_for_a_host_that_fails(fake_ssh):
    jobs, lines = list_jobs([{"pid": 9, "rank": None}], ["good", "down"], "dlwatch")
    assert [(j["pid"], j["host"]) for j in jobs][1:] == [(5, "good")]
    assert [(ln["host"], ln["state"]) for ln in lines][1:] == [("good", "ok"), ("down", "unreachable")]


def test_the_live_view_over_hosts_lists_each_nodes_ranks_names_the_straggler_and_says_why_a_node_is_out(
    fake_ssh, tmp_path
):
    from dlwatch.collect.monitor import Monitor
    from dlwatch.collect.multihost import MultiHost
    from dlwatch.tui.host import HostLine
    from dlwatch.tui.jobs import JobList
    from tests.tui_fixtures import make_app
    from tests.unit.test_tui import settle, sync, wait_until

    local = tmp_path / "rt"
    local.mkdir(mode=0o700)
    source = MultiHost(Monitor(directory=str(local), gpu=False), ["n1", "n2", "down"], interval=0.2)

    @sync
    async def body():
        app = make_app(source, interval=0.2)
        async with app.run_test(size=(140, 40)) as pilot:
            await settle(pilot)

            def rows() -> str:
                return "\n".join(
                    " ".join(str(c) for c in app.screen.query_one(JobList).get_row(r.key)) for r in app.rows
                )

            await wait_until(pilot, lambda: "[n2]" in rows() and "[n1]" in rows(), 10)
            await wait_until(pilot, lambda: "unreachable" in str(app.screen.query_one(HostLine).content), 5)
            host = str(app.screen.query_one(HostLine).content)
            assert "down ✖ unreachable: ssh: connect to host down port 22: Connection refused" in host, host
            assert "n2 16 cores" in host and "n1 4 cores" in host, host
            # 80x24: the other nodes on one line, the unreadable one first, with why.
            await pilot.resize_terminal(80, 24)
            await wait_until(pilot, lambda: "nodes 2/3 ok" in str(app.screen.query_one(HostLine).content), 5)
            assert "nodes 2/3 ok · down ✖ unreachable: ssh: connect" in str(
                app.screen.query_one(HostLine).content
            )
            await pilot.resize_terminal(140, 40)
            text = rows()
            assert "slowest on n2 · mean 21 % · 2 hosts · run-a" in text and "r1 40 %" in text, text
            snap = app.snapshot
            lines = {h["host"]: h for h in snap["hosts"]}
            assert lines["down"]["state"] == "unreachable" and lines["n1"]["state"] == "ok"
            await wait_until(
                pilot, lambda: any(h["id"] == "straggler-rank" for h in app.snapshot["hints"]), 8
            )
            h = next(h for h in app.snapshot["hints"] if h["id"] == "straggler-rank")
            assert h["host"] == "n2" and "(PID 77 on n2)" in h["message"]

    body()
