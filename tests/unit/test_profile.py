"""Profiler bursts, the pure parts: figures from profiler rows (CUDA rows
included: this box has no GPU), the verdict table, the summary document, the
wire messages, and the monitor's request against fake job servers."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from dlwatch import wire
from dlwatch.collect.control import ProfileError, request_profile
from dlwatch.diagnose.profile import VERDICTS, summary, summary_lines, verdict
from dlwatch.probe.profile_figures import summarize
from tests.e2e_util import short_tmpdir

US = 1000
MS = 1000 * US

# --- figures from rows ------------------------------------------------------------------


def step_rows(steps: int, step_ns: int, t0: int = 10**12, tid: int = 1) -> list[tuple]:
    return [
        (f"ProfilerStep#{k}", "user_annotation", t0 + k * step_ns, t0 + (k + 1) * step_ns, tid)
        for k in range(steps)
    ]


def test_nested_ops_count_once_and_self_time_excludes_children():
    t0 = 10**12
    rows = step_rows(2, 10 * MS, t0)
    for k in range(2):
        s = t0 + k * 10 * MS
        # aten::add (4 ms) calls aten::empty (1 ms): one top-level op, 3 + 1 ms of self time.
        rows += [
            ("aten::add", "cpu_op", s + 1 * MS, s + 5 * MS, 1),
            ("aten::empty", "cpu_op", s + 2 * MS, s + 3 * MS, 1),
            ("enumerate(DataLoader)#_X.__next__", "user_annotation", s, s + 1 * MS, 1),
        ]
    fig = summarize(rows, [10 * MS, 10 * MS], wait_ns=2 * MS, cuda=False)
    assert fig["steps"] == 2 and fig["step_ms_mean"] == 10.0
    assert fig["data_wait_fraction"] == 0.1
    assert fig["ops_per_step"] == 1.0 and fig["op_ms_per_step"] == 4.0 and fig["mean_op_us"] == 4000.0
    top = {o["name"]: o for o in fig["top_ops"]}
    assert top["aten::add"] == {"name": "aten::add", "calls": 2, "self_cpu_ms": 6.0}
    assert top["aten::empty"]["self_cpu_ms"] == 2.0
    assert not any(n.startswith("ProfilerStep") for n in top)
    assert fig["cuda"] is None


def test_ops_on_other_threads_are_not_the_loops_ops():
    rows = step_rows(1, 10 * MS) + [("aten::mm", "cpu_op", 10**12 + MS, 10**12 + 2 * MS, 7)]
    fig = summarize(rows, [10 * MS], 0, cuda=False)
    assert fig["ops_per_step"] == 0 and fig["mean_op_us"] is None
    assert fig["top_ops"][0]["name"] == "aten::mm"  # still in the self-time table


def cuda_rows(steps: int, kernels: int, kernel_ns: int, launch_ns: int, step_ns: int) -> list[tuple]:
    """Each step launches ``kernels`` back to back on the host; each kernel
    runs ``kernel_ns`` on the GPU right after its launch."""
    t0 = 10**12
    rows = step_rows(steps, step_ns, t0)
    for k in range(steps):
        t = t0 + k * step_ns
        for _ in range(kernels):
            rows.append(("aten::add", "cpu_op", t, t + launch_ns + US, 1))
            rows.append(("cudaLaunchKernel", "cuda_runtime", t + US // 2, t + US // 2 + launch_ns, 1))
            rows.append(
                ("vectorized_elementwise_kernel", "kernel", t + launch_ns, t + launch_ns + kernel_ns, 9)
            )
            t += launch_ns + 2 * US
    return rows


def test_cuda_figures_from_recorded_rows():
    steps, kernels, step_ns = 4, 1000, 10 * MS
    rows = cuda_rows(steps, kernels, kernel_ns=2 * US, launch_ns=5 * US, step_ns=step_ns)
    fig = summarize(rows, [step_ns] * steps, 0, cuda=True)
    c = fig["cuda"]
    assert c["kernels"] == 4000 and c["kernels_per_step"] == 1000.0
    assert c["kernel_median_us"] == 2.0
    assert c["self_cuda_ms_total"] == pytest.approx(8.0)
    assert c["launches_per_step"] == 1000.0
    assert c["launch_cpu_fraction"] == pytest.approx(0.5)  # 5 µs of every 10 µs
    assert c["gpu_idle_fraction"] == pytest.approx(0.8)  # 2 µs busy per 10 µs
    assert fig["top_ops"][0]["name"] in ("cudaLaunchKernel", "aten::add")


def test_cuda_requested_but_no_kernel_is_a_fully_idle_gpu():
    fig = summarize(step_rows(2, MS), [MS, MS], 0, cuda=True)
    assert fig["cuda"]["kernels"] == 0 and fig["cuda"]["gpu_idle_fraction"] == 1.0
    assert fig["cuda"]["kernel_median_us"] is None


def test_overlapping_kernels_count_once_toward_busy():
    rows = step_rows(1, 10 * MS) + [
        ("k1", "kernel", 10**12, 10**12 + 6 * MS, 9),
        ("k2", "kernel", 10**12 + 4 * MS, 10**12 + 8 * MS, 10),
        ("k3", "kernel", 10**12 + 9 * MS, 10**12 + 12 * MS, 9),  # clipped to the window
    ]
    assert summarize(rows, [10 * MS], 0, cuda=True)["cuda"]["gpu_idle_fraction"] == pytest.approx(0.1)


# --- the verdict ------------------------------------------------------------------------

BASE = {"steps": 10, "step_ms_mean": 20.0, "data_wait_fraction": 0.02, "ops_per_step": 40.0}
CUDA_IDLE_SHORT = {
    "kernels_per_step": 3000.0,
    "kernel_median_us": 3.0,
    "launch_cpu_fraction": 0.4,
    "gpu_idle_fraction": 0.85,
}


@pytest.mark.parametrize(
    "figures, expected, words",
    [
        ({**BASE, "data_wait_fraction": 0.55}, "data-bound", ["55 %", "next(DataLoader)"]),
        # data first, even when the GPU also idles between short kernels
        ({**BASE, "data_wait_fraction": 0.4, "cuda": CUDA_IDLE_SHORT}, "data-bound", ["40 %"]),
        (
            {**BASE, "cuda": CUDA_IDLE_SHORT},
            "launch-bound",
            ["3000 kernel launches", "3.0 µs", "40 %", "85 %"],
        ),
        # few kernels, but the host spends its step in cudaLaunchKernel
        (
            {**BASE, "cuda": {**CUDA_IDLE_SHORT, "kernels_per_step": 50.0, "kernel_median_us": 400.0}},
            "launch-bound",
            ["cudaLaunchKernel takes 40 %"],
        ),
        (
            {**BASE, "cuda": {**CUDA_IDLE_SHORT, "gpu_idle_fraction": 0.05}},
            "gpu-bound",
            ["busy 95 %"],
        ),
        (
            {
                **BASE,
                "top_ops": [{"name": "aten::conv2d", "calls": 10, "self_cpu_ms": 150.0}],
                "cuda": {
                    **CUDA_IDLE_SHORT,
                    "kernels_per_step": 20.0,
                    "kernel_median_us": 900.0,
                    "launch_cpu_fraction": 0.01,
                },
            },
            "cpu-bound",
            ["idles 85 %", "aten::conv2d", "75 %"],
        ),
        (
            {
                **BASE,
                "ops_per_step": 4000.0,
                "mean_op_us": 4.5,
                "op_ms_per_step": 18.0,
                "top_ops": [{"name": "aten::add", "calls": 40000, "self_cpu_ms": 100.0}],
            },
            "dispatch-bound",
            ["4000 torch operators per step", "4.5 µs", "90 %", "aten::add"],
        ),
        # many ops, but each one heavy: the model's compute
        ({**BASE, "ops_per_step": 4000.0, "mean_op_us": 400.0}, "cpu-bound", ["only 2 %"]),
        ({**BASE, "ops_per_step": 30.0, "mean_op_us": 600.0}, "cpu-bound", ["no torch operator stands out"]),
    ],
)
def test_verdict_table(figures, expected, words):
    v, reason, suggestion = verdict(figures)
    assert v == expected and v in VERDICTS
    for w in words:
        assert w in reason, (w, reason)
    assert suggestion
    assert "20.0 ms" in reason  # the numbers behind it


def test_a_burst_that_recorded_no_cuda_work_does_not_judge_the_gpu():
    # Not one kernel and not one launch (CUPTI unavailable, or no CUDA work in
    # these steps): "the GPU idles 100 %" would be a guess.
    blind = {"kernels": 0, "kernels_per_step": 0.0, "launches_per_step": 0.0, "gpu_idle_fraction": 1.0}
    v, reason, _ = verdict({**BASE, "ops_per_step": 30.0, "mean_op_us": 600.0, "cuda": blind})
    assert v == "cpu-bound" and "idles" not in reason
    assert "recorded no CUDA kernel or launch" in reason
    seen = {**blind, "kernels": 3, "kernels_per_step": 1.0}
    assert "idles" in verdict({**BASE, "cuda": seen})[1]


def test_suggestions_name_the_remedies():
    assert "reduce-overhead" in verdict({**BASE, "cuda": CUDA_IDLE_SHORT})[2]
    assert "DataLoader workers" in verdict({**BASE, "data_wait_fraction": 0.9})[0:3][2]


def test_no_steps_no_verdict():
    assert verdict({}) == (None, None, None)
    assert verdict({"steps": 0, "step_ms_mean": None}) == (None, None, None)


def test_summary_keys_are_stable_and_errors_have_no_verdict():
    keys = {
        "schema_version",
        "pid",
        "steps",
        "step_ms_mean",
        "data_wait_fraction",
        "verdict",
        "reason",
        "suggestion",
        "top_ops",
        "cuda",
        "trace_path",
        "error",
    }
    ok = summary(7, {**BASE, "data_wait_fraction": 0.5, "trace_path": "/x/t.json"}, None)
    assert keys <= set(ok) and ok["verdict"] == "data-bound" and ok["trace_path"] == "/x/t.json"
    bad = summary(7, {"steps": 0}, "the profiler could not start: busy")
    assert keys <= set(bad) and bad["verdict"] is None and bad["error"].startswith("the profiler")
    assert "failed" in summary_lines(bad)[0]
    # garbage in the result never raises
    weird = summary(7, {"steps": "x", "top_ops": [None, {"name": 3}], "cuda": 5}, None)
    assert weird["steps"] == 0 and weird["top_ops"][0]["name"] == "" and weird["cuda"] is None
    assert summary_lines(weird)


# --- wire ---------------------------------------------------------------------------------


def test_profile_request_bounds():
    assert wire.profile_request(10, 30.0, "/tmp")["steps"] == 10
    for steps in (0, wire.PROFILE_MAX_STEPS + 1):
        with pytest.raises(wire.WireError, match="steps"):
            wire.profile_request(steps)
    with pytest.raises(wire.WireError, match="max_s"):
        wire.profile_request(5, 61.0)
    with pytest.raises(wire.WireError, match="absolute"):
        wire.profile_request(5, None, "relative/dir")
    with pytest.raises(wire.WireError, match="longer"):
        wire.profile_request(5, None, "/" + "a" * 2000)
    with pytest.raises(wire.WireError, match="wrong type"):
        wire.validate({"type": "profile", "steps": True})


def test_profile_status_and_result_are_checked():
    assert wire.validate({"type": "profile_status", "state": "running", "steps_done": 3})
    with pytest.raises(wire.WireError, match="not one of"):
        wire.validate({"type": "profile_status", "state": "exploded"})
    assert wire.validate({"type": "profile_result", "result": {}, "error": "x"})
    with pytest.raises(wire.WireError):
        wire.validate({"type": "profile_result", "result": []})
    hello = {"type": "hello", "protocol": 1, "job": {"pid": 1, "cmdline": "x"}, "features": ["profile"]}
    assert wire.validate(hello)


# --- the monitor's request against fake job servers -------------------------------------------


class FakeJob:
    """A job socket at ``<dir>/<pid>.sock`` (our own pid: alive) that answers
    the hello with ``hello`` and then calls ``after(conn, request)``."""

    def __init__(self, hello: dict, after=None) -> None:
        self.dir = short_tmpdir()
        self.pid = os.getpid()
        self.path = os.path.join(self.dir, f"{self.pid}.sock")
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(4)
        self.hello, self.after = hello, after
        self.requests: list[dict] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.srv.accept()
        f = conn.makefile("rb")
        dec = wire.FrameDecoder()
        dec.feed(f.readline())
        conn.sendall(wire.encode(self.hello))
        if self.after is None:
            f.readline()  # an old probe reads the request and ignores it
            return
        (req,) = dec.feed(f.readline())
        self.requests.append(req)
        self.after(conn, req)

    def close(self) -> None:
        self.srv.close()


def server_hello(**extra) -> dict:
    return {
        "type": "hello",
        "protocol": 1,
        "job": {"pid": os.getpid(), "cmdline": "train.py", "dlwatch_version": "0.0.9"},
        "history": 0,
        **extra,
    }


def test_a_job_whose_probe_predates_profiling_is_not_supported():
    job = FakeJob(server_hello())
    try:
        with pytest.raises(ProfileError, match="predates profiler bursts") as e:
            request_profile(job.pid, 5, 10.0, "/tmp", directory=job.dir)
        assert e.value.kind == "unsupported" and "0.0.9" in str(e.value)
    finally:
        job.close()


@pytest.mark.parametrize("features", [[], [wire.FEATURE_STACKS]])
def test_a_job_with_profiling_disabled_says_so(features):
    # A job of this dlwatch announces stacks whatever DLWATCH_PROFILE says.
    job = FakeJob(server_hello(features=features))
    try:
        with pytest.raises(ProfileError, match="DLWATCH_PROFILE=0"):
            request_profile(job.pid, 5, 10.0, "/tmp", directory=job.dir)
    finally:
        job.close()


def test_busy_answer_and_progress_then_result():
    def busy(conn, req):
        conn.sendall(
            wire.encode({"type": "profile_status", "state": "busy", "message": "a burst is running"})
        )

    job = FakeJob(server_hello(features=["profile"]), busy)
    try:
        with pytest.raises(ProfileError, match="a burst is running") as e:
            request_profile(job.pid, 5, 10.0, "/tmp", directory=job.dir)
        assert e.value.kind == "busy"
    finally:
        job.close()

    def answer(conn, req):
        for k in (0, 2, 5):
            conn.sendall(
                wire.encode({"type": "profile_status", "state": "running", "steps": 5, "steps_done": k})
            )
        conn.sendall(wire.encode({"type": "profile_result", "result": {**BASE, "steps": 5}}))

    job = FakeJob(server_hello(features=["profile"]), answer)
    seen = []
    try:
        doc = request_profile(job.pid, 5, 10.0, "/tmp", directory=job.dir, on_status=seen.append)
    finally:
        job.close()
    assert job.requests == [{"type": "profile", "steps": 5, "max_s": 10.0, "out_dir": "/tmp"}]
    assert [m["steps_done"] for m in seen] == [0, 2, 5]
    assert doc["pid"] == job.pid and doc["steps"] == 5 and doc["verdict"] == "cpu-bound"


def test_hangup_mid_burst_of_a_live_job():
    job = FakeJob(server_hello(features=["profile"]), lambda conn, req: conn.close())
    try:
        with pytest.raises(ProfileError, match="closed the connection"):
            request_profile(job.pid, 5, 10.0, "/tmp", directory=job.dir)
    finally:
        job.close()


def test_no_socket_live_pid_is_not_instrumented_dead_pid_is_not_found():
    d = short_tmpdir()
    with pytest.raises(ProfileError, match="DLWATCH_DISABLE=1") as e:
        request_profile(os.getpid(), directory=d)
    assert e.value.kind == "unsupported"
    with pytest.raises(ProfileError, match="no dlwatch job with PID") as e:
        request_profile(2**22 + 12345, directory=d)
    assert e.value.kind == "not-found"


def test_main_loop_cpu_bound_suggests_a_burst():
    from tests.unit.test_diagnose_rules import evaluate, gpu, one

    snap = one(job_kw={"main_thread_cpu": 98.0}, gpus=[gpu(util=30.0)])
    (h,) = [h for h in evaluate(snap) if h["id"] == "main-loop-cpu-bound"]
    assert f"dlwatch profile --pid {h['job_pid']}" in h["suggestion"]
