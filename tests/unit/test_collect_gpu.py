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
    "util": ["util_percent"],
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
