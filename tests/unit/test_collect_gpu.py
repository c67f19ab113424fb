"""GPU sampling: a fake NVML module (this machine has no GPU) and the real path.

The fake raises pynvml's own exception classes, so the sampler is tested
against the error hierarchy it meets in production.
"""

from __future__ import annotations

import ctypes
import os
import sys
from types import SimpleNamespace

import pynvml
import pytest

from dlwatch.collect import gpu
from dlwatch.collect.gpu import GpuSampler

MiB = 1024 * 1024


def nvml_error(code: int) -> pynvml.NVMLError:
    # pynvml.NVMLError(code) returns the matching subclass (NVMLError_NotSupported, ...).
    return pynvml.NVMLError(code)


class FakeNvml:
    """Just enough of pynvml's module surface. ``fail[(call, index)]`` or
    ``fail[call]`` is an exception raised by that call (for that device)."""

    NVMLError = pynvml.NVMLError
    NVMLLibraryMismatchError = pynvml.NVMLLibraryMismatchError
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVML_ERROR_LIBRARY_NOT_FOUND = pynvml.NVML_ERROR_LIBRARY_NOT_FOUND
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, devices: list[dict], fail: dict | None = None) -> None:
        self.devices = devices
        self.fail = fail or {}
        self.calls: list[str] = []

    def _check(self, call: str, index: int | None = None) -> None:
        self.calls.append(call)
        exc = self.fail.get((call, index), self.fail.get(call))
        if exc is not None:
            raise exc

    def nvmlInit(self):
        self._check("init")

    def nvmlShutdown(self):
        self._check("shutdown")

    def nvmlDeviceGetCount(self):
        self._check("count")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check("handle", i)
        return SimpleNamespace(index=i)

    def _dev(self, call, h):
        self._check(call, h.index)
        return self.devices[h.index]

    def nvmlDeviceGetName(self, h):
        return self._dev("name", h)["name"]

    def nvmlDeviceGetUUID(self, h):
        return self._dev("uuid", h)["uuid"]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=self._dev("util", h)["util"], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        d = self._dev("mem", h)
        return SimpleNamespace(used=d["used"], total=d["total"], free=d["total"] - d["used"])

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return self._dev("temp", h)["temp"]

    def nvmlDeviceGetPowerUsage(self, h):
        return self._dev("power", h)["mw"]

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [SimpleNamespace(pid=p, usedGpuMemory=MiB) for p in self._dev("procs", h)["pids"]]


def two_gpus() -> list[dict]:
    return [
        dict(
            name=b"NVIDIA H100 80GB HBM3",
            uuid=b"GPU-aaaa",
            util=87,
            used=40 * MiB,
            total=80 * MiB,
            temp=61,
            mw=312_500,
            pids=[1234, 5678],
        ),
        dict(
            name="NVIDIA A10G", uuid="GPU-bbbb", util=0, used=0, total=24 * MiB, temp=30, mw=20_000, pids=[]
        ),
    ]


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# ---------------------------------------------------------------- healthy path


def test_two_gpus_all_fields():
    fake = FakeNvml(two_gpus())
    status, gpus = GpuSampler(nvml=fake).sample()
    assert status == "ok"
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": "GPU-aaaa",
        "util_percent": 87.0,
        "util_samples": 1,
        "util_source": "reading",
        "mem_used_bytes": 40 * MiB,
        "mem_total_bytes": 80 * MiB,
        "temperature_c": 61.0,
        "power_w": 312.5,
        "processes": [1234, 5678],
        "error": None,
    }
    assert gpus[1]["name"] == "NVIDIA A10G" and gpus[1]["uuid"] == "GPU-bbbb"
    assert gpus[1]["util_percent"] == 0.0 and gpus[1]["processes"] == []
    assert isinstance(gpus[0]["util_percent"], float)


def test_init_is_lazy_and_happens_once():
    fake = FakeNvml(two_gpus())
    s = GpuSampler(nvml=fake)
    assert fake.calls == []
    s.sample()
    s.sample()
    assert fake.calls.count("init") == 1


def test_zero_devices():
    assert GpuSampler(nvml=FakeNvml([])).sample() == ("n/a: no GPU found", [])


def test_close_shuts_down_and_next_sample_reinitialises():
    fake = FakeNvml(two_gpus())
    with GpuSampler(nvml=fake) as s:
        s.sample()
    assert fake.calls.count("shutdown") == 1
    s.sample()
    assert fake.calls.count("init") == 2
    s.close()
    s.close()  # idempotent: no second shutdown for one init
    assert fake.calls.count("shutdown") == 2


# ---------------------------------------------------------------- per-field degradation


FIELD_OF_CALL = {
    "name": ["name"],
    "uuid": ["uuid"],
    "util": ["util_percent", "util_source", "util_samples"],
    "mem": ["mem_used_bytes", "mem_total_bytes"],
    "temp": ["temperature_c"],
    "power": ["power_w"],
    "procs": ["processes"],
}


@pytest.mark.parametrize("call", sorted(FIELD_OF_CALL))
@pytest.mark.parametrize(
    "code",
    [
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_GPU_IS_LOST,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_UNKNOWN,
    ],
)
def test_one_failing_call_degrades_only_that_field(call, code):
    fake = FakeNvml(two_gpus(), fail={(call, 1): nvml_error(code)})
    status, gpus = GpuSampler(nvml=fake).sample()
    assert status == "ok"
    assert gpus[0]["error"] is None
    assert all(v is not None for k, v in gpus[0].items() if k != "error")
    broken = gpus[1]
    for key in FIELD_OF_CALL[call]:
        assert broken[key] is None
    others = [k for f in FIELD_OF_CALL.values() for k in f if k not in FIELD_OF_CALL[call]]
    assert all(broken[k] is not None for k in others)
    assert str(nvml_error(code)) in broken["error"]


def test_a_driver_without_the_versioned_process_list_loses_only_that_field():
    # pynvml raises NVMLLibraryMismatchError, which is no NVMLError, where the
    # driver lacks GetComputeRunningProcesses_v3 (before 510).
    err = pynvml.NVMLLibraryMismatchError("Unversioned function called and the pyNVML version does not match")
    status, gpus = GpuSampler(nvml=FakeNvml(two_gpus(), fail={("procs", 0): err})).sample()
    assert status == "ok"
    assert gpus[0]["processes"] is None and "does not match" in gpus[0]["error"]
    assert gpus[0]["util_percent"] == 87.0 and gpus[1]["processes"] == []


def test_every_call_failing_leaves_a_device_with_only_its_index():
    fail = {c: nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED) for c in FIELD_OF_CALL}
    status, gpus = GpuSampler(nvml=FakeNvml(two_gpus(), fail)).sample()
    assert status == "ok" and len(gpus) == 2
    for i, d in enumerate(gpus):
        assert d["index"] == i
        assert all(v is None for k, v in d.items() if k not in ("index", "error"))
        assert d["error"].count("Not Supported") == len(FIELD_OF_CALL)


def test_handle_failure_for_one_device():
    fake = FakeNvml(two_gpus(), fail={("handle", 0): nvml_error(pynvml.NVML_ERROR_GPU_IS_LOST)})
    status, gpus = GpuSampler(nvml=fake).sample()
    assert status == "ok"
    assert gpus[0]["name"] is None and "GPU is lost" in gpus[0]["error"]
    assert gpus[1]["name"] == "NVIDIA A10G"


def test_count_failure_is_a_status_and_is_retried_next_sample():
    fake = FakeNvml(two_gpus(), fail={"count": nvml_error(pynvml.NVML_ERROR_UNKNOWN)})
    s = GpuSampler(nvml=fake)
    assert s.sample() == ("n/a: NVML error: Unknown Error", [])
    del fake.fail["count"]
    assert s.sample()[0] == "ok"
    assert fake.calls.count("init") == 1


# ---------------------------------------------------------------- init failures


def test_library_not_found():
    fake = FakeNvml(two_gpus(), fail={"init": pynvml.NVMLError_LibraryNotFound()})
    assert GpuSampler(nvml=fake).sample() == ("n/a: NVML not found (no NVIDIA driver)", [])


def test_other_init_error_is_reported_with_its_text():
    fake = FakeNvml(two_gpus(), fail={"init": nvml_error(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)})
    assert GpuSampler(nvml=fake).sample() == ("n/a: NVML error: Driver Not Loaded", [])


def test_oserror_from_a_broken_library_is_a_status():
    fake = FakeNvml(two_gpus(), fail={"init": OSError("wrong ELF class: ELFCLASS32")})
    status, gpus = GpuSampler(nvml=fake).sample()
    assert status == "n/a: NVML error: wrong ELF class: ELFCLASS32" and gpus == []


def test_init_retried_at_most_every_30_seconds():
    clock = Clock()
    fake = FakeNvml(two_gpus(), fail={"init": pynvml.NVMLError_LibraryNotFound()})
    s = GpuSampler(nvml=fake, clock=clock)
    for dt in (0, 1, 10, 29.9):
        clock.t = 1000.0 + dt
        assert s.sample()[0] == gpu.NOT_FOUND
    assert fake.calls.count("init") == 1
    # The driver shows up (e.g. module loaded): the next attempt after 30 s succeeds.
    del fake.fail["init"]
    clock.t = 1000.0 + 30.0
    status, gpus = s.sample()
    assert status == "ok" and len(gpus) == 2
    assert fake.calls.count("init") == 2


def test_pynvml_not_importable(monkeypatch):
    monkeypatch.setattr(gpu, "driver_present", lambda: True)  # a driver, but not the package
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    status, gpus = GpuSampler().sample()
    assert status == gpu.NOT_INSTALLED and status.startswith("n/a: NVML not found")
    assert gpus == []


def test_without_a_driver_pynvml_is_not_even_imported(monkeypatch, tmp_path):
    assert not gpu.driver_present((str(tmp_path / "nvidiactl"),))
    (tmp_path / "nvidiactl").touch()
    assert gpu.driver_present((str(tmp_path / "x"), str(tmp_path / "nvidiactl")))
    monkeypatch.setattr(gpu, "driver_present", lambda: False)

    def no_import():
        raise AssertionError("pynvml imported without a driver")

    monkeypatch.setattr(gpu, "_import_pynvml", no_import)
    assert GpuSampler().sample() == (gpu.NOT_FOUND, [])


# ---------------------------------------------------------------- the real NVML


def _nvml_loadable() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


def test_real_pynvml_default_path():
    """On a box without the NVIDIA driver the real sampler says so; with one, it works."""
    with GpuSampler() as s:
        status, gpus = s.sample()
    if _nvml_loadable():
        assert status in ("ok", gpu.NO_GPU) or status.startswith("n/a: NVML error:")
        if status == "ok":
            assert gpus and all(g["mem_total_bytes"] > 0 for g in gpus)
    else:
        assert status == "n/a: NVML not found (no NVIDIA driver)"
        assert gpus == []


@pytest.mark.gpu
@pytest.mark.skipif(
    not _nvml_loadable() or not os.path.exists("/dev/nvidiactl"), reason="needs an NVIDIA driver and GPU"
)
def test_real_gpu_figures():
    with GpuSampler() as s:
        status, gpus = s.sample()
    assert status == "ok"
    for i, g in enumerate(gpus):
        assert g["index"] == i and isinstance(g["name"], str) and g["name"]
        assert g["uuid"].startswith(("GPU-", "MIG-"))
        assert 0 <= g["mem_used_bytes"] <= g["mem_total_bytes"]


# ------------------------------------------------------- window means, memory as nvidia-smi counts it


class FakeNvmlBuffer(FakeNvml):
    """The newer surface: NVML's utilization sample buffer and memory info v2.
    ``samples[i]``: (timestamp µs, value) pairs the driver has recorded for
    device i; ``reserved``: what v1's ``used`` counts on top of v2's."""

    NVML_GPU_UTILIZATION_SAMPLES = pynvml.NVML_GPU_UTILIZATION_SAMPLES
    nvmlMemory_v2 = pynvml.nvmlMemory_v2

    def __init__(self, devices, samples, reserved=480 * MiB, fail=None):
        super().__init__(devices, fail)
        self.samples = samples
        self.reserved = reserved
        self.since: list[int] = []

    def nvmlDeviceGetSamples(self, h, kind, since):
        self._check("samples", h.index)
        assert kind == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        self.since.append(since)
        got = [
            SimpleNamespace(timeStamp=ts, sampleValue=SimpleNamespace(uiVal=v))
            for ts, v in self.samples[h.index]
            if ts > since
        ]
        if not got:
            raise nvml_error(pynvml.NVML_ERROR_NOT_FOUND)  # what NVML says when nothing is new
        return pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, got

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        d = self._dev("mem2" if version else "mem", h)
        if version is None:  # v1: used counts the driver's reserved memory
            return SimpleNamespace(used=d["used"] + self.reserved, total=d["total"], free=0)
        assert version == pynvml.nvmlMemory_v2
        return SimpleNamespace(
            used=d["used"], total=d["total"], reserved=self.reserved, free=0, version=version
        )


def swinging(start_us: int = 1_000_000) -> list[tuple[int, int]]:
    # one reading a sixth of a second, swinging as the field saw (57 %, 22 %, ...)
    values = [57, 22, 0, 86, 40, 35, 61, 19, 44, 42, 38, 43]
    return [(start_us + i * 166_667, v) for i, v in enumerate(values)]


def test_utilization_is_the_mean_of_the_sample_buffer_with_its_spread():
    fake = FakeNvmlBuffer(two_gpus()[:1], [swinging()])
    s = GpuSampler(nvml=fake, first_window_s=2.0)  # the 12 samples span 1.83 s
    _, gpus = s.sample()
    g = gpus[0]
    assert g["util_source"] == "samples" and g["util_samples"] == 12
    assert g["util_percent"] == pytest.approx(40.6, abs=0.05)
    assert (g["util_min_percent"], g["util_max_percent"]) == (0.0, 86.0)
    assert "util" not in fake.calls  # no single reading taken


def test_a_first_read_keeps_only_its_window_of_the_buffer():
    # NVML hands a first call its whole buffer: 19 s of an idle GPU before
    # the monitor started, then the job's first second at 100 %.
    idle = [(i * 250_000, 0) for i in range(76)]  # up to 18.75 s
    busy = [(19_250_000 + i * 250_000, 100) for i in range(4)]  # 19.25 to 20 s
    for window_s, want, count in ((1.0, 100.0, 4), (2.25, 50.0, 8)):
        fake = FakeNvmlBuffer(two_gpus()[:1], [idle + busy])
        _, gpus = GpuSampler(nvml=fake, first_window_s=window_s).sample()
        assert fake.since == [0]
        assert (gpus[0]["util_percent"], gpus[0]["util_samples"]) == (want, count), window_s


def test_samples_are_taken_by_timestamp_whatever_their_order_in_the_ring():
    first = [(1_000_000 + i * 166_667, 50) for i in range(6)]
    later = [(3_000_000 + i * 166_667, 5 * i) for i in range(12)]
    fake = FakeNvmlBuffer(two_gpus()[:1], [first])
    s = GpuSampler(nvml=fake)
    s.sample()
    fake.samples[0] = first + later[8:] + later[:8]  # a ring read from its write position
    _, gpus = s.sample()
    assert gpus[0]["util_samples"] == 12 and gpus[0]["util_percent"] == 27.5
    _, gpus = s.sample()  # the newest timestamp is remembered, not the last one returned
    assert fake.since[-1] == later[-1][0] and gpus[0]["util_source"] == "reading"


def test_each_call_reads_only_the_samples_since_the_last():
    fake = FakeNvmlBuffer(two_gpus()[:1], [swinging()])
    s = GpuSampler(nvml=fake)
    s.sample()
    fake.samples[0] += [(4_000_000, 90), (4_166_667, 100)]
    _, gpus = s.sample()
    assert fake.since[-1] == swinging()[-1][0]
    assert gpus[0]["util_percent"] == 95.0 and gpus[0]["util_samples"] == 2


def test_no_new_sample_falls_back_to_one_reading():
    fake = FakeNvmlBuffer(two_gpus()[:1], [swinging()])
    s = GpuSampler(nvml=fake)
    s.sample()
    _, gpus = s.sample()  # nothing new in the buffer
    assert gpus[0]["util_source"] == "reading" and gpus[0]["util_percent"] == 87.0


def test_a_driver_without_the_buffer_gives_one_reading():
    fake = FakeNvmlBuffer(
        two_gpus()[:1], [swinging()], fail={"samples": nvml_error(pynvml.NVML_ERROR_NOT_SUPPORTED)}
    )
    _, gpus = GpuSampler(nvml=fake).sample()
    assert gpus[0]["util_source"] == "reading" and gpus[0]["util_percent"] == 87.0
    assert gpus[0]["error"] is None


def test_memory_used_is_counted_as_nvidia_smi_counts_it():
    fake = FakeNvmlBuffer(two_gpus()[:1], [swinging()])
    _, gpus = GpuSampler(nvml=fake).sample()
    assert gpus[0]["mem_used_bytes"] == 40 * MiB  # v2: without the 480 MiB reserved
    assert "mem" not in fake.calls


def test_memory_falls_back_to_v1_where_v2_is_not_offered():
    fake = FakeNvmlBuffer(
        two_gpus()[:1], [swinging()], fail={"mem2": nvml_error(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)}
    )
    s = GpuSampler(nvml=fake)
    _, gpus = s.sample()
    assert gpus[0]["mem_used_bytes"] == 40 * MiB + 480 * MiB and gpus[0]["error"] is None
    s.sample()
    assert fake.calls.count("mem2") == 1  # v2 is not asked again


def test_the_snapshot_carries_the_windows_mean_that_hints_and_view_use():
    from dlwatch.collect.monitor import Monitor

    class Swinging:
        """GpuSampler's surface: one per-second figure per call."""

        def __init__(self) -> None:
            self.values = iter([90.0, 57.0, 22.0, 0.0, 86.0])

        def sample(self):
            g = {"index": 0, "name": "H100", "util_percent": next(self.values), "mem_used_bytes": 1,
                 "mem_total_bytes": 2, "util_source": "samples"}  # fmt: skip
            return "ok", [g]

        def close(self) -> None:
            pass

    m = Monitor(directory="/nonexistent-dlwatch", gpu=Swinging(), procs=False, host=False, diagnoser=False)
    for _ in range(5):
        m._last_gpu = 0.0  # one GPU figure per build, as once a second
        snap = m.build(window_s=3.0)
    g = snap["gpus"][0]
    assert g["util_percent"] == 86.0  # the last second alone
    assert g["util_window_percent"] == pytest.approx((22.0 + 0.0 + 86.0) / 3, abs=0.05)
    assert (g["util_window_min_percent"], g["util_window_max_percent"]) == (0.0, 86.0)
