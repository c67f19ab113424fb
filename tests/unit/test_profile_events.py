"""Kineto events of each torch release's shape become the same rows.

torch 2.11's ``_KinetoEvent`` has no ``activity_type`` and a burst that read
it unconditionally failed on the GPU box; these fakes carry only the methods
each shape has (the class's own ``dir()``), so reading one that is absent
fails here as it did there.
"""

from __future__ import annotations

import enum

import pytest

from dlwatch.probe import profile_events, profile_figures
from dlwatch.probe.profile_events import Unsupported


class DeviceType(enum.Enum):  # torch._C._autograd.DeviceType's names
    CPU = 0
    CUDA = 1


# (name, kineto category, start_ns, end_ns, thread, device, scope)
TRUTH = [
    ("ProfilerStep#1", "user_annotation", 1_000_000, 9_000_000, 11, DeviceType.CPU, 7),
    ("aten::mm", "cpu_op", 1_100_000, 1_400_000, 11, DeviceType.CPU, 0),
    ("cudaLaunchKernel", "cuda_runtime", 1_200_000, 1_210_000, 11, DeviceType.CPU, 0),
    ("my_block", "user_annotation", 2_000_000, 3_000_000, 11, DeviceType.CPU, 7),
    ("ampere_sgemm_128x64_nn", "kernel", 1_300_000, 1_900_000, 7, DeviceType.CUDA, 0),
    ("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", 2_000_000, 2_100_000, 7, DeviceType.CUDA, 0),
    ("Memset (Device)", "gpu_memset", 2_200_000, 2_201_000, 7, DeviceType.CUDA, 0),
    # Kineto's own events have scope 0, the GPU spans of record_function too
    ("ProfilerStep#1", "gpu_user_annotation", 1_300_000, 2_201_000, 7, DeviceType.CUDA, 0),
    ("my_block", "gpu_user_annotation", 2_000_000, 2_201_000, 7, DeviceType.CUDA, 0),
    # CUPTI's bookkeeping, on the thread that stops the profiler
    ("Activity Buffer Request", "overhead", 8_500_000, 8_600_000, 11, DeviceType.CPU, 0),
]


def make_event_class(methods: set[str]):
    """A class with only ``methods`` of _KinetoEvent's, each reading TRUTH."""

    def getter(attr):
        def method(self):
            name, cat, start, end, tid, dev, scope = self.t
            return {
                "name": name,
                "activity_type": cat,
                "start_ns": start,
                "end_ns": end,
                "duration_ns": end - start,
                "start_us": start // 1000,
                "duration_us": (end - start) // 1000,
                "start_thread_id": tid,
                "device_type": dev,
                "scope": scope,
                "is_user_annotation": cat in ("user_annotation", "gpu_user_annotation"),
            }[attr]

        return method

    ns = {m: getter(m) for m in methods}
    ns["__init__"] = lambda self, t: setattr(self, "t", t)
    return type("_KinetoEvent", (), ns)


COMMON = {"name", "start_thread_id", "device_type", "scope"}
SHAPES = {
    # 2.1 (dir() of 2.1.2+cu121's class): microseconds only, no end_ns, no annotation flag
    "2.1": COMMON | {"start_us", "duration_us"},
    # between them (is_user_annotation came with 2.5): nanoseconds, no annotation flag
    "ns-without-annotation-flag": COMMON | {"start_ns", "end_ns", "duration_ns"},
    # 2.11 (2.11.0+cu130's class): is_user_annotation, no activity_type
    "2.11": COMMON | {"start_ns", "end_ns", "duration_ns", "is_user_annotation"},
    # 2.13 / 2.14: activity_type too
    "2.13": COMMON | {"start_ns", "end_ns", "duration_ns", "is_user_annotation", "activity_type"},
}


@pytest.mark.parametrize("version", sorted(SHAPES))
def test_each_release_shape_reads_the_same_rows(version):
    cls = make_event_class(SHAPES[version])
    assert not hasattr(cls(TRUTH[0]), "activity_type") or version == "2.13"
    got = profile_events.rows([cls(t) for t in TRUTH], version)
    want = [(n, c, s, e, tid) for n, c, s, e, tid, _d, _s in TRUTH]
    assert got == want


def test_without_scope_or_annotation_flag_steps_still_mark_the_steps():
    cls = make_event_class({"name", "start_thread_id", "device_type", "start_ns", "end_ns"})
    got = profile_events.rows([cls(t) for t in TRUTH], "old")
    cats = {r[0]: r[1] for r in got if r[4] == 11}  # the training thread's
    assert cats["ProfilerStep#1"] in ("user_annotation", "gpu_user_annotation")
    assert cats["aten::mm"] == "cpu_op"
    # a user's own record_function is an op without the flag or the scope: only its name is known
    assert cats["my_block"] == "cpu_op"


def test_rows_give_the_same_figures_on_every_shape():
    figs = set()
    for version, methods in SHAPES.items():
        rows = profile_events.rows([make_event_class(methods)(t) for t in TRUTH], version)
        fig = profile_figures.summarize(rows, [8_000_000], 0, cuda=True)
        figs.add(repr(fig))
    assert len(figs) == 1


def test_events_that_lack_a_time_say_so_in_one_line():
    cls = make_event_class({"name", "start_thread_id", "device_type"})
    with pytest.raises(Unsupported) as e:
        profile_events.rows([cls(TRUTH[1])], "1.9.0")
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith("torch 1.9.0's profiler events lack start_ns/start_us, end_ns/duration_us")
    assert "torch 2.1 or newer" in msg


def test_no_events_no_rows():
    assert profile_events.rows([], "2.11") == []


def test_the_real_event_class_is_read_with_what_it_has():
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p, torch.profiler.record_function("mine"):
        torch.ones(3).add_(1)
    rows = profile_events.rows(p.profiler.kineto_results.events(), torch.__version__)
    by_name = {r[0]: r for r in rows}
    assert by_name["mine"][1] == "user_annotation"
    assert by_name["aten::add_"][1] == "cpu_op"
    assert all(r[3] >= r[2] > 0 for r in rows)


def test_real_events_read_through_each_older_shape_agree_with_activity_type():
    # The real events of this torch, seen through only the methods each older
    # release has: the fallbacks must give what activity_type() gives.
    torch = pytest.importorskip("torch")
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as p:
        for step in range(2):
            with torch.profiler.record_function(f"ProfilerStep#{step}"):
                torch.ones(64).mul_(2).sum()
    events = list(p.profiler.kineto_results.events())
    if not hasattr(events[0], "activity_type"):
        pytest.skip("this torch has no activity_type to compare with")
    want = profile_events.rows(events, torch.__version__)

    def seen_as(methods):
        class View:
            def __init__(self, e):
                self._e = e

            def __dir__(self):
                return sorted(methods)

            def __getattr__(self, name):
                if name not in methods:
                    raise AttributeError(name)
                if name in ("start_us", "duration_us") and not hasattr(self._e, name):
                    # this torch counts in ns only: what 2.1 would have said
                    ns = getattr(self._e, name.replace("_us", "_ns"))
                    return lambda: ns() // 1000
                return getattr(self._e, name)

        return [View(e) for e in events]

    for version in ("ns-without-annotation-flag", "2.11"):
        assert profile_events.rows(seen_as(SHAPES[version]), version) == want, version
    # 2.1's shape has microseconds only: the same rows, to the microsecond
    got = profile_events.rows(seen_as(SHAPES["2.1"]), "2.1")
    assert [(r[0], r[1], r[4]) for r in got] == [(r[0], r[1], r[4]) for r in want]
    assert all(abs(g[2] - w[2]) < 1000 and abs(g[3] - w[3]) < 2000 for g, w in zip(got, want))


@pytest.mark.parametrize("fail", [False, True])
def test_an_in_process_burst_puts_next_back_whether_or_not_reading_fails(probe, tmp_path, monkeypatch, fail):
    # The wrapper stays for the plain window after the burst; a burst whose
    # events cannot be read must not leave it behind.
    import time

    torch = pytest.importorskip("torch")
    from torch.utils.data import DataLoader, TensorDataset

    from dlwatch.probe import profiler

    if fail:
        monkeypatch.setattr(
            profile_events, "rows", lambda *a: (_ for _ in ()).throw(Unsupported("old torch"))
        )
    monkeypatch.setattr(profiler, "AROUND_MIN_S", 0.05)
    dl = DataLoader(TensorDataset(torch.zeros(4000, 2)), batch_size=2)
    it = iter(dl)
    next(it)
    st = next(s for s in probe.snapshot() if s.loader_ref() is dl)
    before = profiler._iter_class().__dict__["__next__"]
    burst, why = profiler.start(st, 3, 30.0, str(tmp_path), None, {"id": st.id})
    assert burst is not None, why
    end = time.monotonic() + 30
    while burst.state != profiler.DONE and time.monotonic() < end:
        next(it)
        time.sleep(0.002)
    assert burst.state == profiler.DONE
    assert profiler._iter_class().__dict__["__next__"] is before
    if fail:
        assert burst.error == "old torch"
    else:
        assert burst.error is None and burst.result["unprofiled"]["steps"] >= 2
        # The window after the burst opens only once the events are read and
        # the trace written: that work holds the GIL, and a window running
        # beside it measured our thread's work as the loop's (H100, issue 44).
        assert burst.after.t0 is not None and burst.processed_ns is not None
        assert burst.after.t0 >= burst.processed_ns
    profiler.release(burst)


def test_an_activity_type_that_is_no_name_falls_back_to_the_methods():
    cls = make_event_class(SHAPES["2.13"])
    cls.activity_type = lambda self: 3  # a release giving the enum's number, not its name
    got = profile_events.rows([cls(t) for t in TRUTH], "x")
    assert got == [(n, c, s, e, tid) for n, c, s, e, tid, _d, _s in TRUTH]


@pytest.mark.parametrize(
    "call", ["cudaLaunchKernel", "cudaLaunchKernelExC", "cudaLaunchKernel_ptsz", "cuLaunchKernelEx"]
)
def test_every_name_kineto_gives_a_kernel_launch_counts_as_one(call):
    rows = [
        ("ProfilerStep#1", "user_annotation", 0, 1_000_000, 11),
        (call, "cuda_runtime", 100_000, 300_000, 11),
        ("cudaStreamSynchronize", "cuda_runtime", 400_000, 900_000, 11),  # no launch
        ("k", "kernel", 300_000, 310_000, 7),
    ]
    cuda = profile_figures.summarize(rows, [1_000_000], 0, cuda=True)["cuda"]
    assert cuda["launches_per_step"] == 1.0 and cuda["launch_cpu_fraction"] == 0.2
