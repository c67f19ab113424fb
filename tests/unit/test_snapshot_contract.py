"""The snapshot contract (dlwatch.snapshot): what the collector builds and what
the tests' fixtures hold satisfy the same declared types, and the JSON of a
recorded input does not drift.

``tests/data/recorded_stream.jsonl`` is the socket stream of a real demo job
(data-bound scenario, fork workers), recorded once; ``snapshot_golden.json`` is
what ``dlwatch snapshot --json`` made of it before the collector was split into
``monitor`` (scheduling) and ``model`` (the document). Keys may be added to the
schema, never renamed or changed: the golden is a subset check, in key order.
To re-record after a deliberate change of an existing key, run this file with
``DLWATCH_REGEN_GOLDEN=1`` and say why in the commit.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dlwatch import snapshot as S
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.monitor import Monitor
from tests import tui_fixtures as F
from tests.unit import test_diagnose_rules as R

DATA = Path(__file__).resolve().parent.parent / "data"
T_BUILD = 1795408912.0


class FixedProcs:
    def sample(
        self,
        pids,
        main_pids=None,
        uss_pids=None,
        force_uss=False,
        thread_pids=(),
        own_tids=None,
        active_since=None,
    ):
        return {
            p: {
                "cpu_percent": 10.0 + i,
                "rss_bytes": 1000 * (i + 1),
                "uss_bytes": 500 * (i + 1),
                "threads": 3,
                "state": "running",
                "main_thread_cpu_percent": 5.0 + i,
                "error": None,
            }
            for i, p in enumerate(sorted(pids))
        }


class FixedHost:
    def sample(self):
        return {
            "logical_cpus": 2,
            "usable_cores": 2.0,
            "cpu_percent": 55.0,
            "shm_free_bytes": 1 << 30,
            "cores_reason": "affinity",
        }


class RaisingHost:
    def sample(self):
        raise PermissionError("/proc/stat: permission denied")


def recorded_monitor(**kw) -> Monitor:
    """A monitor holding the recorded job's stream, with fixed samplers and clock."""
    m = Monitor(
        directory="/nonexistent-dlwatch",
        gpu=kw.pop("gpu", False),
        procs=FixedProcs(),
        host=kw.pop("host", FixedHost()),
        diagnoser=kw.pop("diagnoser", False),
        clock=lambda: T_BUILD,
        **kw,
    )
    m._sched = None  # run-queue wait reads /proc of the recorded PIDs: not reproducible
    c = JobConnection(2929, "/nonexistent/2929.sock")
    for msg in c.decoder.feed((DATA / "recorded_stream.jsonl").read_bytes()):
        c._on_message(msg)
    m.conns[c.pid] = c
    return m


def subset(golden, got, where="snapshot"):
    """Every key of ``golden`` is in ``got`` with the same value, in the same
    order (extra keys in ``got`` allowed: the schema only grows)."""
    if isinstance(golden, dict):
        assert isinstance(got, dict), where
        missing = [k for k in golden if k not in got]
        assert not missing, f"{where}: keys gone: {missing}"
        order = [k for k in got if k in golden]
        assert order == list(golden), f"{where}: key order changed"
        for k in golden:
            subset(golden[k], got[k], f"{where}.{k}")
    elif isinstance(golden, list):
        assert isinstance(got, list) and len(got) == len(golden), where
        for i, (a, b) in enumerate(zip(golden, got)):
            subset(a, b, f"{where}[{i}]")
    else:
        assert golden == got, f"{where}: {golden!r} became {got!r}"


def test_recorded_input_gives_the_golden_json():
    m = recorded_monitor()
    got = json.loads(json.dumps(m.build(3.0), default=str))
    path = DATA / "snapshot_golden.json"
    if os.environ.get("DLWATCH_REGEN_GOLDEN"):
        path.write_text(json.dumps(got, indent=2) + "\n")
    golden = json.loads(path.read_text())
    subset(golden, got)
    assert S.problems(got) == []


def test_what_the_monitor_builds_satisfies_the_contract():
    snap = recorded_monitor().build(3.0)
    assert S.problems(snap) == []
    ld = snap["jobs"][0]["loaders"][0]
    assert ld["num_workers"] == 2 and len(ld["workers"]) == 2
    assert 0.0 <= ld["data_wait_fraction"] <= 1.0


def test_a_one_shot_snapshot_reads_no_uss_and_says_so():
    asked = []

    class Procs(FixedProcs):
        def sample(self, pids, main_pids=None, uss_pids=None, **_):
            asked.append(uss_pids)
            return {p: dict(f, uss_bytes=None) for p, f in super().sample(pids, main_pids).items()}

    m = recorded_monitor(uss=False)
    m._procs = Procs()
    snap = m.build(3.0)
    assert asked == [()] and S.problems(snap) == []
    assert "--uss" in snap["uss_reason"]
    from dlwatch.cli.text import render_snapshot

    assert f"uss: n/a: {snap['uss_reason']}" in render_snapshot(snap)
    assert "uss_reason" not in recorded_monitor().build(3.0)  # the live view reads it


@pytest.mark.parametrize(
    "name,snap",
    [
        ("tui data_bound", F.data_bound(with_gpu=True)),
        ("tui several_jobs", F.several_jobs()),
        ("tui with_exited", F.with_exited(F.data_bound())),
        ("rules io_bound", R.one(R.io_bound_loader())),
        ("rules cpu_bound", R.one(R.cpu_bound_loader(), gpus=[R.gpu()])),
    ],
)
def test_fixtures_satisfy_the_contract(name, snap):
    """The fixtures the view and rule tests use are real snapshots: if the
    contract grows a required key, they must grow it too."""
    assert S.problems(snap) == [], name


def test_problems_names_what_is_wrong():
    snap = F.data_bound()
    snap["jobs"][0]["loaders"][0]["workers"][0]["pid"] = "4301"
    del snap["host"]["usable_cores"]
    snap["hints"][0]["severity"] = "fatal"
    got = S.problems(snap)
    assert "jobs[0].loaders[0].workers[0].pid: '4301' is not <class 'int'>" in got
    assert "host: missing 'usable_cores'" in got
    assert any(p.startswith("hints[0].severity: 'fatal'") for p in got)
    assert S.problems([]) == ["snapshot: expected an object, got list"]


def test_accessors_never_raise_on_garbage():
    for bad in (None, "x", float("nan"), float("inf"), True, [], {}):
        assert S.num(bad) is None
        assert S.as_int(bad) is None
    assert S.num(3) == 3.0 and S.as_int(2.0) == 2 and S.as_int(2.5) is None
    assert S.as_list((1, 2)) == [1, 2] and S.as_list("ab") == [] and S.as_dict([1]) == {}
    assert S.records([{"a": 1}, None, 3]) == [{"a": 1}]
    ranks = sorted(["info", "bogus", "critical", "warn"], key=S.severity_rank)
    assert ranks == ["critical", "warn", "info", "bogus"]


def test_a_sampler_fault_is_recorded_not_swallowed(caplog):
    """A sampler that raises costs its figures, and the snapshot says why."""
    m = recorded_monitor(host=RaisingHost())
    with caplog.at_level("DEBUG", logger="dlwatch.collect"):
        snap = m.build(3.0)
    assert snap["host"]["usable_cores"] is None
    assert m.error_counts == {"host": 1}
    assert snap["errors"] == ["host: PermissionError: /proc/stat: permission denied"]
    assert "host failed" in caplog.text
    assert S.problems(snap) == []
    # A healthy collector's document has no "errors" key at all.
    assert "errors" not in recorded_monitor().build(3.0)


class RaisingDiagnoser:
    def update(self, snapshot):
        raise KeyError("loaders")


def test_a_broken_diagnosis_is_an_error_not_no_hints(monkeypatch):
    """A diagnoser that raises, or one that cannot be made, leaves the hints
    empty with the reason beside them (``hints_error``), in the snapshot and
    in ``dlwatch snapshot``'s text, never a silent "no hints"."""
    from dlwatch.cli.text import render_snapshot
    from dlwatch.collect import monitor as monitor_mod

    m = recorded_monitor()
    m._diagnoser = RaisingDiagnoser()
    snap = m.build(3.0)
    assert snap["hints"] == [] and snap["hints_error"] == "diagnosis failed: KeyError: 'loaders'"
    assert snap["errors"] == ["diagnosis: KeyError: 'loaders'"]
    assert m.error_counts == {"diagnosis": 1}
    assert S.problems(snap) == []
    text = render_snapshot(snap)
    assert "hints: n/a: diagnosis failed: KeyError: 'loaders'" in text
    assert "hints: none" not in text

    def missing():
        raise ImportError("No module named 'dlwatch.diagnose'")

    monkeypatch.setattr(monitor_mod, "_default_diagnoser", missing)
    m = Monitor(directory="/nonexistent-dlwatch", gpu=False, procs=False, host=False)
    why = "diagnosis could not start: ImportError: No module named 'dlwatch.diagnose'"
    for _ in range(2):  # in every snapshot, not only the first
        snap = m.build(3.0)
        assert snap["hints_error"] == why and snap["errors"] == [why]
    assert f"hints: n/a: {why}" in render_snapshot(snap)
    m.stop()
    monkeypatch.undo()
    # A working diagnosis has no hints_error.
    assert "hints_error" not in recorded_monitor(diagnoser=None).build(3.0)


def test_the_collector_is_the_snapshot_source_every_consumer_reads():
    # The TUI, the recorder and the exporter are typed on SnapshotSource alone.
    m = recorded_monitor()
    assert isinstance(m, S.SnapshotSource)
    m.stop()
