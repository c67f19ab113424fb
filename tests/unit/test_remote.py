"""``dlwatch --host`` without ssh: node snapshots as JSON lines through the
line check, the merge and the cross-host diagnosis (pure). The reader thread
with a stand-in for ssh is in tests/e2e/test_remote_reader.py, the real ssh
in tests/e2e/test_multinode.py.
"""

from __future__ import annotations

import json
import time

import pytest

from dlwatch.collect import merge, remote
from dlwatch.collect.remote import HostStatus
from dlwatch.diagnose import evaluate
from dlwatch.snapshot import problems

from .test_diagnose_ranks import rank
from .test_diagnose_rules import snap


def node(jobs, **kw):
    return snap(jobs, **kw)


def nodes():
    """Rank 0 on node1, rank 1 (the straggler) on node2, under the same PID:
    containers number their processes alike."""
    return (
        node([rank(0, wait=0.02, step_ms=98.0, pid=77)], usable=4.0, logical=4),
        node([rank(1, wait=0.4, step_ms=60.0, pid=77)], usable=16.0, logical=32),
    )


def merged_with(third: HostStatus) -> dict:
    """node1 (this machine) merged with node2 (ok) and ``third``."""
    local, n2 = nodes()
    return merge.merge(local, "node1", [HostStatus("node2", "ok", None, n2, 0.3), third], time.time())


def test_a_snapshot_line_is_taken_and_anything_else_is_refused_with_a_reason():
    good = json.dumps(nodes()[0])
    doc, why = remote.parse_snapshot(good)
    assert doc is not None and why is None
    for line, said in [
        ("not json", "not JSON"),
        ("[1, 2]", "a JSON list"),
        (json.dumps(dict(nodes()[0], schema_version=9)), "schema_version 9"),
        (json.dumps({k: v for k, v in nodes()[0].items() if k != "jobs"}), "missing 'jobs'"),
        ('{"__class__": "os.system"}', "schema_version None"),
    ]:
        doc, why = remote.parse_snapshot(line)
        assert doc is None and said in (why or ""), (line, why)


def test_the_ssh_command_line_is_dlwatch_ssh_split_as_a_shell_would_and_never_prompts():
    argv = remote.remote_argv(
        "me@node1", ["/opt/dl watch/bin/dlwatch", "snapshot"], {"DLWATCH_SSH": "ssh -F '/my cfg' -p 2222"}
    )
    assert argv[:5] == ["ssh", "-F", "/my cfg", "-p", "2222"]
    assert "BatchMode=yes" in argv and "-T" in argv
    assert argv[-3:] == ["me@node1", "--", "'/opt/dl watch/bin/dlwatch' snapshot"]
    assert remote.ssh_command({})[0] == "ssh"
    # The node's shell expands a leading ~ to the home there.
    assert remote.remote_argv("n", ["~/venv/bin/dlwatch", "ls"], {})[-1] == "~/venv/bin/dlwatch ls"


def test_a_failed_ssh_is_one_line_saying_why():
    state, reason = remote.failure(
        "n1", 255, "Warning: x\nssh: connect to host n1 port 22: Connection refused\n", "dlwatch"
    )
    assert (state, reason) == ("unreachable", "ssh: connect to host n1 port 22: Connection refused")
    state, reason = remote.failure("n1", 127, "bash: line 1: dlwatch: command not found", "dlwatch")
    assert state == "no-dlwatch" and "--remote-dlwatch" in reason and "\n" not in reason
    assert remote.failure("n1", 0, "", "dlwatch")[0] == "dropped"
    assert len(remote.one_line("x" * 5000)) == remote.REASON_CHARS


def test_the_merge_lists_every_hosts_jobs_and_figures_and_judges_the_run_across_hosts():
    merged = merged_with(HostStatus("node3", "unreachable", "ssh: no route", None, None))
    assert problems(merged) == []
    assert [(j["host"], j["rank"], j["pid"]) for j in merged["jobs"]] == [("node1", 0, 77), ("node2", 1, 77)]
    hosts = {h["host"]: h for h in merged["hosts"]}
    assert hosts["node1"]["local"] and hosts["node1"]["figures"]["usable_cores"] == 4.0
    assert hosts["node2"]["figures"]["logical_cpus"] == 32 and hosts["node2"]["state"] == "ok"
    assert (hosts["node3"]["state"], hosts["node3"]["reason"], hosts["node3"]["jobs"]) == (
        "unreachable",
        "ssh: no route",
        0,
    )
    (run,) = merged["runs"]
    assert run["data_wait_fraction_max"] == 0.4 and run["data_wait_fraction_mean"] == pytest.approx(0.21)
    assert run["slowest"] == {"rank": 1, "host": "node2", "pid": 77} and run["hosts"] == ["node1", "node2"]
    (h,) = merge.CrossHostJudge(evaluate).hints(merged)
    assert (h["id"], h["job_pid"], h["host"]) == ("straggler-rank", 77, "node2")
    assert "Rank 1 (PID 77 on node2)" in h["message"] and "rank 0 on node1" in h["message"]
    assert str(merge.PID_BASE)[:3] not in json.dumps(h)
    assert [(x["pid"], x["host"]) for x in h["evidence"]["ranks"]] == [(77, "node1"), (77, "node2")]


def test_a_host_that_went_away_keeps_its_ranks_listed_as_unreachable_and_unjudged():
    local, n2 = nodes()
    n2["hints"] = [
        {
            "id": "straggler-rank",
            "severity": "warn",
            "job_pid": 77,
            "loader_id": 0,
            "message": "m",
            "suggestion": "s",
            "evidence": {},
        }
    ]
    gone = HostStatus("node2", "dropped", "Connection to node2 closed by remote host.", n2, 30.0)
    merged = merge.merge(local, "node1", [gone], time.time())
    theirs = [j for j in merged["jobs"] if j["host"] == "node2"]
    assert theirs[0]["state"] == "unreachable"
    assert theirs[0]["state_reason"] == "host node2 dropped: Connection to node2 closed by remote host."
    assert merged["hints"] == [] and merge.CrossHostJudge(evaluate).hints(merged) == []
    assert merged["runs"][0]["ranks_live"] == 1


def test_text_and_the_hints_panel_keep_two_nodes_jobs_of_one_pid_apart():
    from dlwatch.cli.text import render_ls, render_snapshot
    from dlwatch.tui.hints import relevant_hints
    from dlwatch.tui.jobs import group_jobs

    merged = merged_with(HostStatus("node3", "no-dlwatch", "'dlwatch' not found", None, None))
    merged["hints"] = merge.CrossHostJudge(evaluate).hints(merged)
    text = render_snapshot(merged)
    assert "host node3: NO-DLWATCH, 0 jobs -- 'dlwatch' not found" in text
    assert "host node2: ok, 1 job, 16 usable cores of 32 logical" in text
    assert (
        "run run-a: 2/2 ranks live on node1, node2; data wait max 40.0 % (rank 1 on node2), mean 21.0 %"
        in text
    )
    assert "rank 1/2  on node2" in text
    ls = render_ls(
        [
            {"pid": 77, "rank": 0, "loaders": 1, "host": "node1"},
            {"pid": 77, "rank": 1, "loaders": 1, "host": "node2"},
        ]
    )
    assert ls.splitlines()[0].startswith("HOST ") and ls.splitlines()[2].startswith("node2 ")
    # Same PID on both nodes: separate rows, and the hint is node 2's job's only.
    rows = group_jobs(merged["jobs"])
    assert [r.key for r in rows] == ["run:run-a:2", "job:node1:77", "job:node2:77"]
    assert relevant_hints(merged["hints"], 77, "node2")[0][0]["id"] == "straggler-rank"
    assert relevant_hints(merged["hints"], 77, "node1") == ([], 1)


def test_runs_of_one_run_id_at_two_rendezvous_are_two_groups():
    from dlwatch.tui.jobs import group_jobs

    jobs = [dict(rank(r, wait=0.1, step_ms=50.0, run_id="none"), master=f"10.0.0.{r}:29500") for r in (0, 1)]
    assert [(g["run_id"], g["master"], g["ranks_seen"]) for g in merge.run_groups(jobs)] == [
        ("none", "10.0.0.0:29500", 1),
        ("none", "10.0.0.1:29500", 1),
    ]
    assert [r.key for r in group_jobs(jobs) if r.kind == "run"] == [
        "run:none:2@10.0.0.0:29500",
        "run:none:2@10.0.0.1:29500",
    ]


def test_lines_are_cut_from_chunks_as_they_come_and_an_over_long_one_is_dropped_as_it_comes(monkeypatch):
    monkeypatch.setattr(remote, "MAX_LINE_BYTES", 10_000)
    host = remote.RemoteHost("n1")
    att = remote._Attempt(proc=None)  # type: ignore[arg-type]
    line = json.dumps(nodes()[1]).encode() + b"\n"
    assert len(line) < 10_000
    stream = b"garbage\n" + line + b"y" * 25_000 + b"\n" + line
    for i in range(0, len(stream), 777):  # chunks that cut lines anywhere
        host._feed(att, stream[i : i + 777])
    st = host.status()
    assert (st.lines, st.bad_lines, att.snapshots, st.bytes) == (2, 2, 2, len(stream))
    assert st.state == "ok" and st.snapshot == nodes()[1] and len(att.out) == 0


def test_the_live_view_with_hosts_reads_every_node_and_a_failed_merge_is_said_not_frozen(
    monkeypatch, tmp_path
):
    from dlwatch.cli import common
    from dlwatch.cli.main import build_parser
    from dlwatch.collect.multihost import MultiHost

    got = {}
    monkeypatch.setattr(
        "dlwatch.tui.app.run_tui", lambda source, **kw: got.setdefault("source", source) and 0
    )
    args = build_parser().parse_args(
        ["--host", "n1", "--host", "n2", "--host", "n1", "--remote-dlwatch", "/opt/dlw"]
    )
    assert common.open_live_view(args) == 0
    source = got["source"]
    assert isinstance(source, MultiHost) and [r.dest for r in source.remotes] == ["n1", "n2"]
    assert all(r.argv[-1].startswith("/opt/dlw snapshot --follow --json") for r in source.remotes)

    class Local:  # this machine's collector, as far as MultiHost reads it
        def subscribe(self, cb):
            self.cb = cb

        def latest(self):
            return nodes()[0]

    seen = []
    multi = MultiHost(Local(), [])
    multi.subscribe(lambda: seen.append(multi.latest()))
    monkeypatch.setattr(merge, "merge", lambda *a: 1 / 0)
    multi.local.cb()
    (snap,) = seen
    assert snap["jobs"] == nodes()[0]["jobs"]
    assert snap["errors"] == ["merging the hosts failed: ZeroDivisionError: division by zero"]


def test_host_is_taken_before_or_after_the_subcommand():
    from dlwatch.cli.main import build_parser

    p = build_parser()
    for argv in (["--host", "n1", "ls"], ["ls", "--host", "n1"], ["snapshot", "--host", "n1"]):
        args = p.parse_args(argv)
        assert (args.host, args.remote_dlwatch) == (["n1"], "dlwatch"), argv
    assert p.parse_args(["ls"]).host is None
