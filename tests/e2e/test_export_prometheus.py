"""``dlwatch export`` scraped by a real Prometheus server, with real jobs.

One exporter (a ``dlwatch export`` subprocess) and one Prometheus (Debian's
``/usr/bin/prometheus`` with a temp config and storage, scraping every 1 s,
on 127.0.0.1 only) serve the tests; what the tests assert is read back
through Prometheus's HTTP API, as a Grafana panel would read it. The same
Prometheus also scrapes a second ``dlwatch export`` over HTTPS (its own
runtime directory, no jobs), and, for the GPU join, the exporter's collector
on a snapshot built with NVML faked (this machine has no GPU) beside a
stand-in for dcgm-exporter's ``/metrics``.
"""

from __future__ import annotations

import http.server
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from dlwatch import wire
from dlwatch.export.prometheus import SnapshotCollector, serve
from dlwatch.tui.sources import StaticSource
from tests.e2e.test_faults_monitor import FakeJob, hello, window
from tests.e2e_util import Job, self_signed_cert, short_tmpdir, truth_in_window
from tests.unit.test_export import gpu_snapshot

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
RANKED_JOB = Path(__file__).resolve().parent.parent / "jobs" / "ranked_job.py"
GRACE_S = 2.0
# The query, verbatim: one ratio per loader series.
WAIT_RATIO = (
    "rate(dlwatch_data_wait_seconds_total[10s]) / (rate(dlwatch_data_wait_seconds_total[10s])"
    " + rate(dlwatch_step_seconds_total[10s]))"
)
PROMETHEUS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "prometheus.md"
# What dcgm-exporter serves for the two GPUs of gpu_snapshot(): its metric,
# its label names, and its values (the index as a string, NVML's UUID).
DCGM_METRICS = (
    b"# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
    b"# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
    b'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",device="nvidia0",'
    b'modelName="NVIDIA H100 80GB HBM3",Hostname="node-7"} 87\n'
    b'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-bbbb",device="nvidia1",'
    b'modelName="NVIDIA A10G",Hostname="node-7"} 0\n'
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 5.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


class DcgmStandIn(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(DCGM_METRICS)

    def log_message(self, *args):
        pass


class Stack:
    """The exporter and the Prometheus server scraping it."""

    def __init__(self) -> None:
        self.dir = short_tmpdir()
        self.work = short_tmpdir("dlwprom")
        env = dict(os.environ, DLWATCH_DIR=self.dir)
        self.exporter = subprocess.Popen(
            [sys.executable, "-m", "dlwatch", "export", "--port", "0", "--grace", str(GRACE_S)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # The HTTPS exporter: a runtime directory of its own, without jobs.
        self.cert, key = self_signed_cert(self.work)
        self.tls_dir = short_tmpdir()
        self.tls_exporter = subprocess.Popen(
            [
                sys.executable, "-m", "dlwatch", "export", "--port", "0",
                "--tls-cert", self.cert, "--tls-key", key,
            ],
            env=dict(os.environ, DLWATCH_DIR=self.tls_dir),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        self.metrics_url = self._exporter_url(self.exporter, "http")
        self.tls_url = self._exporter_url(self.tls_exporter, "https")
        gpu = gpu_snapshot()
        self.gpu_server, _ = serve(SnapshotCollector(StaticSource([gpu]), hostname="node-7"), 0)
        self.dcgm = http.server.ThreadingHTTPServer(("127.0.0.1", 0), DcgmStandIn)
        threading.Thread(target=self.dcgm.serve_forever, daemon=True).start()
        self.prom_port = free_port()
        target = urllib.parse.urlsplit(self.metrics_url).netloc
        tls_target = urllib.parse.urlsplit(self.tls_url).netloc
        gpu_target = f"127.0.0.1:{self.gpu_server.server_address[1]}"
        dcgm_target = f"127.0.0.1:{self.dcgm.server_address[1]}"
        config = os.path.join(self.work, "prometheus.yml")
        with open(config, "w") as f:
            f.write(
                "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                "scrape_configs:\n  - job_name: dlwatch\n"
                f"    static_configs:\n      - targets: ['{target}']\n"
                "  - job_name: dlwatch-tls\n    scheme: https\n"
                f"    tls_config:\n      ca_file: {self.cert}\n"
                f"    static_configs:\n      - targets: ['{tls_target}']\n"
                "  - job_name: dlwatch-gpu\n"
                f"    static_configs:\n      - targets: ['{gpu_target}']\n"
                "  - job_name: dcgm\n"
                f"    static_configs:\n      - targets: ['{dcgm_target}']\n"
            )
        self.prom_log = open(os.path.join(self.work, "prometheus.log"), "wb")
        self.prometheus = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={os.path.join(self.work, 'tsdb')}",
                f"--web.listen-address=127.0.0.1:{self.prom_port}",
                "--log.level=warn",
            ],
            stdout=self.prom_log,
            stderr=subprocess.STDOUT,
            cwd=self.work,
        )
        self._wait_prometheus()

    @staticmethod
    def _exporter_url(exporter: subprocess.Popen, scheme: str) -> str:
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: lines.put(exporter.stdout.readline()), daemon=True).start()
        try:
            line = lines.get(timeout=30)
        except queue.Empty:
            raise AssertionError("dlwatch export printed no address in 30 s") from None
        assert line.startswith(f"dlwatch export: serving {scheme}://127.0.0.1:"), (line, exporter.stderr)
        return line.split()[3]

    def _wait_prometheus(self) -> None:
        end = time.monotonic() + 30
        while time.monotonic() < end:
            if self.prometheus.poll() is not None:
                raise AssertionError(f"prometheus exited: {self.log()}")
            try:
                if http_get(f"http://127.0.0.1:{self.prom_port}/-/ready", 1) is not None:
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError(f"prometheus never got ready: {self.log()}")

    def log(self) -> str:
        with open(os.path.join(self.work, "prometheus.log"), errors="replace") as f:
            return f.read()[-2000:]

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        args = {"query": promql}
        if at is not None:
            args["time"] = f"{at:.3f}"
        url = f"http://127.0.0.1:{self.prom_port}/api/v1/query?" + urllib.parse.urlencode(args)
        body = json.loads(http_get(url))
        assert body["status"] == "success", body
        return body["data"]["result"]

    def wait_for(self, promql: str, ok, timeout: float, what: str) -> list[dict]:
        end = time.monotonic() + timeout
        result: list[dict] = []
        while time.monotonic() < end:
            result = self.query(promql)
            if ok(result):
                return result
            time.sleep(0.5)
        raise AssertionError(f"{what}: {promql} -> {result}")

    def close(self) -> int | None:
        """Stop them all; the exporters' exit status on SIGTERM (0 when both
        stopped cleanly, None when one had to be killed)."""
        for server in (self.gpu_server, self.dcgm):
            server.shutdown()
            server.server_close()
        codes = []
        for p in (self.prometheus, self.tls_exporter, self.exporter):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                    codes.append(None)
                    continue
            codes.append(p.returncode)
        self.prom_log.close()
        shutil.rmtree(self.work, ignore_errors=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        shutil.rmtree(self.tls_dir, ignore_errors=True)
        exporters = codes[1:]
        if None in exporters:
            return None
        return next((c for c in exporters if c != 0), 0)


@pytest.fixture(scope="module")
def stack():
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.skip(
            "no prometheus binary: Debian's prometheus package is not installed "
            "(.ci/run installs it; apt-get install prometheus)"
        )
    s = Stack()
    try:
        yield s
    finally:
        code = s.close()
    assert code == 0, f"dlwatch export did not stop cleanly on SIGTERM: {code}"


def by_pid(result: list[dict]) -> dict[str, float]:
    return {r["metric"]["pid"]: float(r["value"][1]) for r in result}


def test_prometheus_reads_data_wait_from_the_exporter_and_sees_jobs_come_and_go(stack):
    # A data-bound job (~40 % wait) that exits by itself, one that loads its
    # batches itself (num_workers=0, ~80 % wait: the "no-workers" hint) and is
    # killed mid-run, and two hostile sockets: garbage, then a hang-up.
    a = Job(
        "--workers", "2", "--persistent", "--sample-ms", "5", "--step-ms", "6", "--duration", "16",
        runtime_dir=stack.dir,
    )  # fmt: skip
    b = Job(
        "--workers", "0", "--sample-ms", "5", "--step-ms", "5", "--duration", "60",
        runtime_dir=stack.dir,
    )  # fmt: skip

    def garbage(conn, fake):
        conn.sendall(hello(fake.pid) + window(1))
        conn.sendall(b"\x00\xffnot json\n" + b'{"type":"window","seq":"x"}\n' + b"[" * 5000 + b"\n")
        conn.sendall(b"x" * (wire.MAX_FRAME_BYTES + 10) + b"\n" + window(2))
        fake.go.wait(60)

    def hang_up(conn, fake):
        conn.sendall(hello(fake.pid)[:10])
        conn.close()

    fakes = [FakeJob(stack.dir, garbage), FakeJob(stack.dir, hang_up)]
    try:
        a.wait_ready(settle=0)
        b.wait_ready(settle=0)
        pids = {str(a.proc.pid), str(b.proc.pid)}
        stack.wait_for(
            "dlwatch_batches_total",
            lambda r: pids <= set(by_pid(r)),
            30,
            "both jobs reach Prometheus",
        )
        t_both = time.monotonic()
        time.sleep(max(0.0, t_both + 11 - time.monotonic()))  # a full 10 s rate window of scrapes
        t_query = time.time()
        mono_at_query = time.monotonic_ns()
        ratios = by_pid(stack.query(WAIT_RATIO, at=t_query))
        # Two jobs, told apart by their pid label; the fakes' loader too.
        assert pids <= set(ratios), ratios
        batches = stack.query("dlwatch_batches_total")
        assert len({tuple(sorted(r["metric"].items())) for r in batches}) == len(batches)
        # The diagnosis reaches Prometheus too, with the job's labels. Asked
        # after the rate window: the hint shows once the loader's window is
        # past its start-up and the hint has held (4-6 s after both jobs
        # appear here, alone or beside two CPU burners; CI's parallel tier
        # once took over 10), and job a must still be running for the rates.
        stack.wait_for(
            f'dlwatch_hint_active{{hint="no-workers", pid="{b.proc.pid}"}}',
            lambda r: len(r) == 1 and r[0]["metric"]["severity"] in ("info", "warn", "critical"),
            30,
            "the no-workers hint of the job without workers",
        )
        b.kill()  # dies: no clean exit, no goodbye
        result = a.finish()
    finally:
        for f in fakes:
            f.go.set()
            f.close()
        b.cleanup()

    # The job's own data wait over the same 10 s (its clock is the monotonic
    # one); the figures Prometheus stored lag its scrapes by up to a
    # collector interval (1 s), hence the window's end half a second early.
    lag = 500_000_000
    truth = truth_in_window(
        result["recs"]["train"]["batches"], mono_at_query - lag - 10_000_000_000, mono_at_query - lag
    )
    got = ratios[str(a.proc.pid)]
    print(f"PromQL data wait {got:.4f}, the job's own {truth['data_wait_fraction']:.4f}")
    assert 0.2 < truth["data_wait_fraction"] < 0.7, truth  # the job was data-bound, as built
    assert abs(got - truth["data_wait_fraction"]) <= 0.03, (got, truth)
    assert ratios[str(b.proc.pid)] > 0.5  # the job without workers

    # Both series go: A (exited) and B (killed) within the grace period and a
    # few scrapes, after being reported down at least once.
    stack.wait_for(
        "dlwatch_batches_total",
        lambda r: not pids & set(by_pid(r)),
        GRACE_S + 15,
        "the series of exited jobs disappear",
    )
    down = by_pid(stack.query(f'min_over_time(dlwatch_job_up{{pid="{a.proc.pid}"}}[60s])'))
    assert down == {str(a.proc.pid): 0.0}
    a.cleanup()

    # The exporter lived through all of it and still answers.
    assert stack.exporter.poll() is None
    assert b"dlwatch_exporter_jobs" in http_get(stack.metrics_url)
    (up,) = stack.query('up{job="dlwatch"}')
    assert up["value"][1] == "1"


def test_prometheus_tells_the_ranks_of_two_torchrun_runs_apart(stack):
    # Two runs started without --rdzv-id: torchrun names both "none", and
    # only their rendezvous master tells them apart (the live view groups
    # ranks by both; so must the labels and the dashboard).
    work = short_tmpdir("dlwtr")
    stop = os.path.join(work, "stop")
    env = dict(os.environ, DLWATCH_DIR=stack.dir, OMP_NUM_THREADS="1")
    runs = []
    for _ in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2"]
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}"]
        runs.append(
            subprocess.Popen(
                [sys.executable, "-m", "dlwatch", "run", "--", *cmd, str(RANKED_JOB), stop],
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                cwd=work,
                start_new_session=True,
            )
        )
    try:
        ranks = stack.wait_for(
            'dlwatch_batches_total{run_id!=""} > 0',
            lambda r: len(r) == 4,
            90,
            "the four ranks of the two runs reach Prometheus",
        )
        # The dashboard's per-rank and max-across-ranks panels, on these
        # runs: one series per rank, one per run.
        for title, expr in dashboard_queries(RUNS_ROW):
            want = 4 if "per rank" in title else 2
            got = stack.wait_for(
                expr, lambda r, want=want: len(r) == want, 30, f"the panel {title!r} shows {want} series"
            )
            assert all(m["metric"].get("run_id") == "none" for m in got), (title, got)
            assert len({m["metric"]["master"] for m in got}) == 2, (title, got)
            if want == 4:
                for master in {m["metric"]["master"] for m in got}:
                    of_run = [m["metric"]["rank"] for m in got if m["metric"]["master"] == master]
                    assert sorted(of_run) == ["0", "1"], (title, got)
    finally:
        open(stop, "w").close()
        for p in runs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
    labels = [r["metric"] for r in ranks]
    assert {m["run_id"] for m in labels} == {"none"}
    by_master: dict[str, list[str]] = {}
    for m in labels:
        by_master.setdefault(m["master"], []).append(m["rank"])
    assert len(by_master) == 2 and all(sorted(r) == ["0", "1"] for r in by_master.values()), by_master
    assert len({m["pid"] for m in labels}) == 4
    assert len({m["host"] for m in labels}) == 1 and labels[0]["host"]
    assert all("worker" not in m and m["loader"] == "0" for m in labels)


DASHBOARD = Path(__file__).resolve().parents[2] / "contrib/grafana/dlwatch-dashboard.json"
RUNS_ROW = "Runs across nodes"


def dashboard_queries(row: str | None = None) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every dashboard query, Grafana's variables
    set as "All" sets them; ``row``: only the panels under the row whose
    title starts so."""
    out, in_row = [], row is None
    for p in json.loads(DASHBOARD.read_text())["panels"]:
        if p["type"] == "row":
            in_row = row is None or p["title"].startswith(row)
            continue
        for t in p["targets"] if in_row else ():
            promql = t["expr"].replace("$__rate_interval", "10s")
            for var in ("host", "run_id", "pid"):
                promql = promql.replace(f"${var}", ".*")
            out.append((p["title"], promql))
    return out


def test_every_query_of_the_grafana_dashboard_runs_on_prometheus(stack):
    queries = dashboard_queries()
    assert queries and dashboard_queries(RUNS_ROW)
    for _, promql in queries:
        stack.query(promql)  # asserts status "success": no syntax or type error


def test_prometheus_scrapes_the_exporter_over_tls(stack):
    (up,) = stack.wait_for('up{job="dlwatch-tls"} == 1', lambda r: len(r) == 1, 15, "the HTTPS target is up")
    assert up["metric"]["instance"] == urllib.parse.urlsplit(stack.tls_url).netloc
    # Its figures came through: the exporter's own series, and no job (it has none).
    stack.wait_for(
        'dlwatch_exporter_snapshot_age_seconds{job="dlwatch-tls"}', lambda r: len(r) == 1, 15, "a TLS series"
    )
    assert stack.query('dlwatch_batches_total{job="dlwatch-tls"}') == []
    # Plain HTTP on that port gets no metrics.
    with pytest.raises(OSError):
        http_get(stack.tls_url.replace("https://", "http://"), 5)


def readme_queries(marker: str) -> list[str]:
    """The PromQL of docs/prometheus.md's code block after ``marker``: one query per
    paragraph, comment lines left out."""
    text = PROMETHEUS_PAGE.read_text(encoding="utf-8")
    block = re.search(re.escape(marker) + r".*?```promql\n(.*?)```", text, re.S)
    assert block, f"docs/prometheus.md has no promql block after {marker}"
    paragraphs = block.group(1).split("\n\n")
    queries = [" ".join(ln for ln in p.splitlines() if not ln.lstrip().startswith("#")) for p in paragraphs]
    return [q.strip() for q in queries if q.strip()]


def test_the_readme_dcgm_join_runs_and_joins_a_job_with_its_gpu(stack):
    join, waiting = readme_queries("<!-- dcgm-join")
    [r] = stack.wait_for(join, lambda r: len(r) == 1, 20, "the job's GPU joined with dcgm-exporter's")
    m = r["metric"]
    # The job's labels (as dlwatch serves them), dcgm-exporter's figure for its GPU.
    assert (m["pid"], m["gpu"], m["UUID"], m["Hostname"]) == ("2929", "0", "GPU-aaaa", "node-7")
    assert float(r["value"][1]) == 87.0
    stack.query(waiting)  # runs: no syntax or type error (its result depends on the job's wait)


def test_lifetime_counters_only_rise_across_epochs_of_new_worker_processes():
    """Non-persistent workers: new processes every epoch, whose own counters
    restart at zero, and an epoch-ending next() that the job re-books from
    wait to teardown. The exporter's counters (the snapshot's lifetime keys)
    must still only rise, or Prometheus's rate() would read a reset."""
    from dlwatch.collect.monitor import Monitor

    job = Job(
        "--workers", "2", "--sample-ms", "3", "--step-ms", "3", "--epochs", "40", "--batches-per-epoch", "25",
        "--duration", "10",
    )  # fmt: skip
    m = Monitor(directory=job.dir, interval=0.2, gpu=False, diagnoser=False)
    seen: dict = {}
    worker_pids: dict = {}
    try:
        job.wait_ready(settle=0)
        m.start()
        end = time.monotonic() + 8
        while time.monotonic() < end and job.proc.poll() is None:
            snap = m.latest()
            for j in (snap or {}).get("jobs", []):
                for ld in j["loaders"]:
                    figures = {("wait", ld["id"]): ld["wait_s_total"], ("step", ld["id"]): ld["step_s_total"]}
                    for w in ld["workers"]:
                        figures[("busy", ld["id"], w["id"])] = w["busy_s_total"]
                        worker_pids.setdefault(w["id"], set()).add(w["pid"])
                    for key, v in figures.items():
                        if v is None:
                            continue
                        assert v >= seen.get(key, 0.0), (key, v, seen.get(key))
                        seen[key] = v
            time.sleep(0.1)
        result = job.finish()
    finally:
        m.stop()
        job.cleanup()
    epochs = len(result["recs"]["train"]["worker_pids"])
    assert epochs >= 4, epochs
    # Several processes held each worker slot, and the slot's counter outgrew
    # any single epoch's share.
    assert all(len(p - {0}) >= 3 for p in worker_pids.values()), worker_pids
    assert seen[("busy", 0, 0)] > 0 and seen[("wait", 0)] > 0 and seen[("step", 0)] > 0
