"""The Prometheus exporter: lifetime counters in the snapshot (collect/totals.py,
collect/model.py), the metric families of a snapshot (export/prometheus.py),
read back with prometheus_client's own parser, and ``dlwatch export``'s
argument and start-up errors. The end-to-end test against a real Prometheus
server is tests/e2e/test_export_prometheus.py."""

from __future__ import annotations

import copy
import socket
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from dlwatch.cli.main import main
from dlwatch.collect import model
from dlwatch.collect.jobs import JobConnection
from dlwatch.collect.totals import Totals
from dlwatch.export.prometheus import SnapshotCollector
from dlwatch.tui.sources import StaticSource
from tests import tui_fixtures as F

DATA = Path(__file__).resolve().parent.parent / "data"


# ------------------------------------------------------------- lifetime counters


def frame(wait_ns: int, step_ns: int, workers: list[tuple[int, int, int]], loader_id: int = 0) -> dict:
    return {
        "loaders": [
            {
                "id": loader_id,
                "wait_ns": wait_ns,
                "step_ns": step_ns,
                "workers": [{"id": i, "pid": pid, "busy_ns": busy} for i, pid, busy in workers],
            }
        ]
    }


def test_loader_counters_hold_their_high_water_mark_through_the_teardown_dip():
    # The frame counts the __next__ in progress as wait; when that call ends
    # the epoch the probe books it as teardown and wait_ns steps back.
    t = Totals()
    t.add(frame(2_000_000_000, 3_000_000_000, []))
    t.add(frame(2_400_000_000, 3_000_000_000, []))  # inside the epoch's last __next__
    t.add(frame(2_000_000_000, 3_000_000_000, []))  # booked as teardown
    assert t.loader(0) == {"wait_s_total": 2.4, "step_s_total": 3.0}
    t.add(frame(2_500_000_000, 3_100_000_000, []))
    assert t.loader(0) == {"wait_s_total": 2.5, "step_s_total": 3.1}


def test_a_worker_slot_adds_up_the_processes_that_held_it():
    t = Totals()
    t.add(frame(0, 0, [(0, 100, 1_000_000_000), (1, 101, 900_000_000)]))
    t.add(frame(0, 0, [(0, 100, 2_000_000_000), (1, 101, 1_900_000_000)]))
    # Next epoch (non-persistent workers): new processes, counters from zero.
    t.add(frame(0, 0, [(0, 200, 500_000_000), (1, 201, 0)]))
    assert t.worker_busy_s(0, 0) == 2.5
    assert t.worker_busy_s(0, 1) == 1.9
    # A read mid-update dips one frame; the same process's mark holds.
    t.add(frame(0, 0, [(0, 200, 400_000_000), (1, 201, 300_000_000)]))
    assert t.worker_busy_s(0, 0) == 2.5
    assert t.worker_busy_s(0, 1) == 2.2
    assert t.worker_busy_s(0, 7) is None and t.worker_busy_s(3, 0) is None


def test_a_loader_that_left_the_frames_is_forgotten():
    t = Totals()
    t.add(frame(1, 1, [(0, 5, 1)], loader_id=0))
    t.add(frame(1, 1, [(0, 5, 1)], loader_id=1))
    assert t.loader(0) is None and t.loader(1) is not None


def test_the_snapshot_counters_of_a_recorded_job_never_go_down():
    """Build the job's record after every frame of a real job's stream: the
    lifetime counters only ever rise, and end at the stream's own totals."""
    c = JobConnection(2929, "/nonexistent/2929.sock")
    prev: dict = {}
    built = 0
    for msg in c.decoder.feed((DATA / "recorded_stream.jsonl").read_bytes()):
        c._on_message(msg)
        if not c.frames:
            continue
        job = model.job_dict(c, 3.0, {}, 1795408912.0, history=False)
        built += 1
        for ld in job["loaders"]:
            figures = {
                ("wait", ld["id"]): ld["wait_s_total"],
                ("step", ld["id"]): ld["step_s_total"],
                ("batches", ld["id"]): ld["batches_total"],
            }
            figures.update({("busy", ld["id"], w["id"]): w["busy_s_total"] for w in ld["workers"]})
            for key, v in figures.items():
                assert v is not None and v >= prev.get(key, 0), (key, v, prev.get(key))
            prev.update(figures)
    assert built > 50
    last = c.frames[-1]["loaders"][0]
    assert prev[("wait", 0)] >= last["wait_ns"] / 1e9 > 0
    assert prev[("step", 0)] == pytest.approx(last["step_ns"] / 1e9, abs=1e-6)
    assert job["hostname"] == "vm"


# ------------------------------------------------------------- the metrics


def scrape(collector: SnapshotCollector) -> dict[str, list]:
    """name -> samples, as Prometheus would read /metrics."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    out: dict[str, list] = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    out["__types__"] = [types]  # type: ignore[list-item]
    return out


def collector_of(*snaps: dict, **kw) -> tuple[SnapshotCollector, list]:
    """A collector reading ``snaps`` in turn (each scrape the next one)."""
    feed = list(snaps)
    current = [feed[0]]

    class Feed(StaticSource):
        def latest(self):
            return current[0]

    c = SnapshotCollector(Feed(), wall=lambda: F.T0 + 0.5, **kw)
    return c, current


def with_totals(snap: dict) -> dict:
    for j in snap["jobs"]:
        for ld in j["loaders"]:
            ld.update(wait_s_total=12.5, step_s_total=20.25)
            for w in ld["workers"]:
                w["busy_s_total"] = 30.0 + w["id"]
                w["runqueue_percent"] = 12.5
    return snap


def labels_of(samples: list, **match) -> list[dict]:
    return [s.labels for s in samples if all(s.labels.get(k) == v for k, v in match.items())]


def test_a_data_bound_job_reads_as_prometheus_names_types_and_units():
    snap = with_totals(F.data_bound())
    got = scrape(collector_of(snap, hostname="node-7")[0])
    types = got["__types__"][0]
    for counter in (
        "dlwatch_data_wait_seconds",
        "dlwatch_step_seconds",
        "dlwatch_batches",
        "dlwatch_worker_busy_seconds",
    ):
        assert types[counter] == "counter", counter
        assert counter + "_total" in got, counter
    for gauge in (
        "dlwatch_data_wait_ratio",
        "dlwatch_prefetch_queue_batches",
        "dlwatch_worker_cpu_ratio",
        "dlwatch_worker_uss_bytes",
        "dlwatch_hint_active",
    ):
        assert types[gauge] == "gauge", gauge
    assert types["dlwatch_loader_info"] == "gauge"  # an info metric, in the text format
    base = {"host": "node-7", "pid": "4242", "rank": "", "run_id": "", "loader": "0"}
    (wait,) = got["dlwatch_data_wait_seconds_total"]
    assert wait.labels == base and wait.value == 12.5
    assert got["dlwatch_step_seconds_total"][0].value == 20.25
    assert got["dlwatch_batches_total"][0].value == 1234
    assert got["dlwatch_data_wait_ratio"][0].value == 0.62
    queue = {s.labels["state"]: s.value for s in got["dlwatch_prefetch_queue_batches"]}
    assert set(queue) == {"ready", "in_flight", "capacity"}
    # Workers by index, never by PID; CPU as a ratio of one core.
    busy = {s.labels["worker"]: s.value for s in got["dlwatch_worker_busy_seconds_total"]}
    assert busy == {"0": 30.0, "1": 31.0, "2": 32.0, "3": 33.0}
    cpu = {s.labels["worker"]: s.value for s in got["dlwatch_worker_cpu_ratio"]}
    assert cpu["0"] == pytest.approx(0.97)
    # Worker 2's USS is unreadable (None): no sample rather than a made-up 0.
    assert sorted(s.labels["worker"] for s in got["dlwatch_worker_uss_bytes"]) == ["0", "1", "3"]
    (info,) = got["dlwatch_loader_info"]
    assert info.labels["num_workers"] == "4" and info.labels["pin_memory"] == "true"
    assert info.labels["batch_size"] == "64" and info.labels["prefetch_factor"] == "2"
    hints = {s.labels["hint"]: s.labels for s in got["dlwatch_hint_active"]}
    assert hints["add-workers"]["severity"] == "warn" and hints["add-workers"]["pid"] == "4242"
    assert got["dlwatch_job_up"][0].value == 1
    assert got["dlwatch_host_usable_cores"][0].value == 4.0
    assert got["dlwatch_exporter_snapshot_age_seconds"][0].value == pytest.approx(0.5)
    # Prometheus rewrites a target's "job" label: none of ours is called that.
    for name, samples in got.items():
        if name != "__types__":
            assert all("job" not in s.labels for s in samples), name


def test_ranks_and_jobs_are_told_apart_by_labels():
    got = scrape(collector_of(with_totals(F.several_jobs()))[0])
    waits = got["dlwatch_data_wait_seconds_total"]
    keys = {(s.labels["pid"], s.labels["rank"], s.labels["run_id"]) for s in waits}
    assert keys == {("5001", "0", "a1b2c3"), ("5002", "1", "a1b2c3"), ("4242", "", ""), ("6001", "", "")}
    ratio = {s.labels["rank"]: s.value for s in labels_and_values(got["dlwatch_data_wait_ratio"], "a1b2c3")}
    assert ratio == {"0": 0.40, "1": 0.20}
    (info,) = [s for s in got["dlwatch_job_info"] if s.labels["pid"] == "5002"]
    assert info.labels["world_size"] == "2" and info.labels["local_rank"] == "1"
    # The host-wide hint belongs to no job.
    (host_hint,) = labels_of(got["dlwatch_hint_active"], hint="workers-oversubscribe-cores")
    assert host_hint["pid"] == "" and host_hint["severity"] == "critical"


def labels_and_values(samples: list, run_id: str) -> list:
    return [s for s in samples if s.labels["run_id"] == run_id]


def test_an_exited_job_stays_for_the_grace_period_then_its_series_go():
    live = with_totals(F.several_jobs(with_gpu=False))
    collector, current = collector_of(live, grace_s=10.0)
    assert "4242" in pids_in(scrape(collector))

    def at(t: float, snap: dict) -> dict:
        return dict(snap, time=F.T0 + t)

    exited = F.with_exited(live, pid=4242)
    current[0] = at(1, exited)
    got = scrape(collector)
    up = {s.labels["pid"]: s.value for s in got["dlwatch_job_up"]}
    assert up["4242"] == 0 and up["5001"] == 1
    assert "4242" in pids_in(got)  # its last counters are still scraped
    current[0] = at(11, exited)
    assert "4242" in pids_in(scrape(collector))  # 10 s after it was first seen ended
    current[0] = at(11.5, exited)
    got = scrape(collector)
    assert "4242" not in pids_in(got)
    assert "4242" not in {s.labels["pid"] for s in got["dlwatch_hint_active"]}
    assert {"5001", "5002", "6001"} <= pids_in(got)
    exporter_jobs = {s.labels["state"]: s.value for s in got["dlwatch_exporter_jobs"]}
    assert exporter_jobs == {"live": 3, "exited": 1}
    # Once the collector forgets the job, so does the exporter's bookkeeping.
    current[0] = at(12, dict(live, jobs=[j for j in live["jobs"] if j["pid"] != 4242]))
    scrape(collector)
    assert collector._ended == {}


def pids_in(got: dict) -> set[str]:
    return {s.labels["pid"] for s in got.get("dlwatch_batches_total", [])}


def test_garbage_and_no_snapshot_yet_still_scrape():
    for snap in (None, F.malformed(), F.empty(), {"jobs": "x", "hints": 5}, [], "x"):
        got = scrape(collector_of(snap)[0])  # type: ignore[arg-type]
        assert "__types__" in got
    got = scrape(collector_of(F.malformed())[0])
    # The well-formed parts still show: job 2's loader 0 with its worker 0.
    assert {s.labels["pid"] for s in got["dlwatch_job_up"]} >= {"1", "2"}
    snap = copy.deepcopy(F.data_bound())
    snap["jobs"][0]["loaders"][0]["workers"][0]["busy_s_total"] = float("nan")
    snap["jobs"][0]["loaders"][0]["wait_s_total"] = "12"
    got = scrape(collector_of(snap)[0])
    assert "dlwatch_data_wait_seconds_total" not in got
    assert "0" not in {s.labels["worker"] for s in got.get("dlwatch_worker_busy_seconds_total", [])}


def test_the_host_label_is_the_jobs_own_hostname_unless_overridden():
    snap = with_totals(F.data_bound())
    snap["jobs"][0]["hostname"] = "trainer-pod-1"
    got = scrape(collector_of(snap)[0])
    assert got["dlwatch_batches_total"][0].labels["host"] == "trainer-pod-1"
    got = scrape(collector_of(snap, hostname="node-3")[0])
    assert got["dlwatch_batches_total"][0].labels["host"] == "node-3"


# ------------------------------------------------------------- the command


def test_export_rejects_bad_arguments(capsys):
    for argv, needle in (
        (["export", "--port", "70000"], "--port must be 0..65535"),
        (["export", "--interval", "0"], "--interval must be positive"),
        (["export", "--grace", "-1"], "--grace must be 0 or more"),
    ):
        assert main(argv) == 2
        assert needle in capsys.readouterr().err


def test_export_without_prometheus_client_names_the_extra(monkeypatch, capsys):
    for name in [m for m in sys.modules if m.split(".")[0] == "prometheus_client"]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "dlwatch.export.prometheus", raising=False)
    assert main(["export", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert "pip install 'dlwatch[export]'" in err and "Traceback" not in err


def test_export_on_a_taken_port_says_so(monkeypatch, tmp_path, capsys):
    d = tmp_path / "rt"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("DLWATCH_DIR", str(d))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["export", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "in use" in err


def test_export_is_listed_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "export" in capsys.readouterr().out


def test_the_grafana_dashboard_uses_only_metrics_the_exporter_serves():
    import json
    import re

    path = Path(__file__).resolve().parents[2] / "contrib" / "grafana" / "dlwatch-dashboard.json"
    dash = json.loads(path.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in re.findall(r"\bdlwatch_[a-z_]+", e)}
    snap = with_totals(F.several_jobs())
    snap["jobs"][0]["hostname"] = "node-1"
    served = {name for name in scrape(collector_of(snap)[0]) if name != "__types__"}
    assert used and used <= served, used - served
    core = {"dlwatch_data_wait_seconds_total", "dlwatch_worker_busy_seconds_total", "dlwatch_hint_active"}
    assert core <= used
