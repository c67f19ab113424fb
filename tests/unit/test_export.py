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
    base = {"host": "node-7", "pid": "4242", "rank": "", "run_id": "", "master": "", "loader": "0"}
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


def gpu_snapshot(fail: dict | None = None) -> dict:
    """What the monitor builds of the recorded job (pid 2929) with two GPUs,
    NVML faked at the boundary: GPU 0 runs the job and another process."""
    from dlwatch.collect.gpu import GpuSampler
    from tests.unit.test_collect_gpu import FakeNvml, two_gpus
    from tests.unit.test_snapshot_contract import recorded_monitor

    devices = two_gpus()
    devices[0]["pids"] = [2929, 77]
    return recorded_monitor(gpu=GpuSampler(nvml=FakeNvml(devices, fail))).build(3.0)


def test_gpu_series_carry_dcgm_exporters_labels_and_say_which_job_uses_which_gpu():
    """The collector's own GPU path (GpuSampler in the Monitor), NVML faked
    at the boundary: the labels dcgm-exporter puts on DCGM_FI_DEV_* series."""
    snap = gpu_snapshot()
    got = scrape(SnapshotCollector(StaticSource([snap]), hostname="node-7"))
    util = {s.labels["gpu"]: s for s in got["dlwatch_gpu_utilization_ratio"]}
    assert util["0"].labels == {
        "gpu": "0",
        "UUID": "GPU-aaaa",  # NVML's bytes, as text
        "Hostname": "node-7",
        "modelName": "NVIDIA H100 80GB HBM3",
    }
    assert util["0"].value == 0.87 and util["1"].value == 0.0
    assert util["1"].labels["UUID"] == "GPU-bbbb"
    mem = {s.labels["gpu"]: s.value for s in got["dlwatch_gpu_memory_used_bytes"]}
    assert mem == {"0": 40 * 2**20, "1": 0}
    [used] = got["dlwatch_job_gpu"]
    assert used.value == 1
    assert used.labels == {
        "host": "node-7",
        "pid": "2929",
        "rank": "",
        "run_id": "",
        "master": "",
        "gpu": "0",
        "UUID": "GPU-aaaa",
        "Hostname": "node-7",
        "modelName": "NVIDIA H100 80GB HBM3",
    }
    # A GPU whose UUID NVML would not give keeps its other figures.
    snap = gpu_snapshot(fail={("uuid", 1): nvml_error()})
    got = scrape(SnapshotCollector(StaticSource([snap]), hostname="node-7"))
    assert [s.labels["UUID"] for s in got["dlwatch_gpu_utilization_ratio"]] == ["GPU-aaaa", ""]
    # Without a GPU (this machine, and CI): no GPU series at all.
    from tests.unit.test_snapshot_contract import recorded_monitor

    snap = recorded_monitor().build(3.0)
    got = scrape(SnapshotCollector(StaticSource([snap])))
    assert "dlwatch_gpu_utilization_ratio" not in got and "dlwatch_job_gpu" not in got


def nvml_error():
    import pynvml

    return pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)


# ------------------------------------------------------------- TLS


def test_tls_serves_https_and_an_idle_connection_stalls_no_scrape(short_tmpdir):
    import ssl
    import urllib.request

    from dlwatch.export.prometheus import serve, tls_problem
    from tests.e2e_util import self_signed_cert

    cert, key = self_signed_cert(short_tmpdir)
    assert tls_problem(cert, key) is None
    snap = with_totals(F.data_bound())
    server, _ = serve(collector_of(snap)[0], 0, tls=(cert, key))
    port = server.server_address[1]
    try:
        # A client that connects and says nothing (a port scan, a TCP
        # health check) holds its own thread, not the one that accepts.
        with socket.create_connection(("127.0.0.1", port)):
            ctx = ssl.create_default_context(cafile=cert)
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", timeout=10, context=ctx) as r:
                body = r.read().decode()
        assert "dlwatch_batches_total{" in body
        # Plain HTTP gets no metrics.
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    finally:
        server.shutdown()
        server.server_close()


def test_tls_files_that_cannot_serve_are_one_line_errors(short_tmpdir, monkeypatch, capsys):
    from tests.e2e_util import self_signed_cert

    cert, key = self_signed_cert(short_tmpdir)
    other = Path(short_tmpdir, "other")
    other.mkdir()
    _, other_key = self_signed_cert(str(other))
    garbage = str(Path(short_tmpdir, "garbage.pem"))
    Path(garbage).write_text("not a certificate\n")
    missing = str(Path(short_tmpdir, "missing.pem"))
    rt = Path(short_tmpdir, "rt")
    rt.mkdir(mode=0o700)
    monkeypatch.setenv("DLWATCH_DIR", str(rt))
    for argv, needle in (
        (
            ["--tls-cert", missing, "--tls-key", key],
            f"cannot read --tls-cert {missing}: No such file or directory",
        ),
        (
            ["--tls-cert", cert, "--tls-key", missing],
            f"cannot read --tls-key {missing}: No such file or directory",
        ),
        (
            ["--tls-cert", short_tmpdir, "--tls-key", key],
            f"cannot read --tls-cert {short_tmpdir}: Is a directory",
        ),
        (["--tls-cert", garbage, "--tls-key", key], "are not a PEM certificate and its key"),
        (["--tls-cert", cert, "--tls-key", other_key], "are not a PEM certificate and its key"),
    ):
        assert main(["export", "--port", "0", *argv]) == 1, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("dlwatch export: ") and needle in err, err
    assert main(["export", "--port", "0", "--tls-cert", cert]) == 2
    assert "--tls-cert and --tls-key go together" in capsys.readouterr().err
    # A prometheus_client older than the extra asks for (no TLS in it).
    import dlwatch.export.prometheus as P

    monkeypatch.setattr(P, "start_http_server", lambda port, addr="", registry=None: None)
    assert main(["export", "--port", "0", "--tls-cert", cert, "--tls-key", key]) == 1
    assert "needs prometheus_client 0.19 or newer" in capsys.readouterr().err


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
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]  # a row has none
    exprs += [v["definition"] for v in dash["templating"]["list"] if "definition" in v]
    used = {m for e in exprs for m in re.findall(r"\bdlwatch_[a-z_]+", e)}
    snap = with_totals(F.several_jobs())
    snap["jobs"][0]["hostname"] = "node-1"
    served = {name for name in scrape(collector_of(snap)[0]) if name != "__types__"}
    assert used and used <= served, used - served
    core = {"dlwatch_data_wait_seconds_total", "dlwatch_worker_busy_seconds_total", "dlwatch_hint_active"}
    assert core <= used


def test_two_runs_that_share_the_run_id_none_are_told_apart_by_their_master():
    # torchrun names every run "none" unless --rdzv-id is given: the run is
    # the run id and the rendezvous master together, as the live view has it.
    snap = F.several_jobs()
    ranks = [j for j in snap["jobs"] if j.get("run_id")]
    for job, master in zip(ranks, ("10.0.0.1:29500", "10.0.0.2:29500")):
        job["run_id"], job["master"] = "none", master
    got = scrape(collector_of(with_totals(snap))[0])
    ranked = [s.labels for s in got["dlwatch_batches_total"] if s.labels["rank"]]
    runs = {(labels["run_id"], labels["master"]) for labels in ranked}
    assert runs == {("none", "10.0.0.1:29500"), ("none", "10.0.0.2:29500")}
