"""GpuSampler through the real pynvml, over an emulated NVIDIA library.

test_collect_gpu.py fakes pynvml's Python surface; this replaces only what
this machine cannot have, the C library (``pynvml.nvmlLib``), so pynvml's own
wrappers run: its ctypes structures, its size-then-fill calls, its version
decorators and the exceptions it makes of the C return codes. It checks that
dlwatch asks the library what it means to ask (argument order, units, the
union member a sample's value is in, the v2 memory structure).

The emulation answers with C return codes and fills the ctypes arguments as
libnvidia-ml does. It leans on two of pynvml's internals (the library handle
and its function cache) and skips where a pynvml lacks them.
"""

from __future__ import annotations

import ctypes
from ctypes import POINTER, byref, c_void_p, cast

import pynvml
import pytest

from dlwatch.collect.gpu import GpuSampler

if not hasattr(pynvml, "nvmlLib") or not hasattr(pynvml, "_nvmlGetFunctionPointer_cache"):
    pytest.skip("this pynvml keeps its library handle elsewhere", allow_module_level=True)

MiB = 1 << 20


def _obj(arg):
    # pynvml passes byref(x): the C side writes through it.
    return getattr(arg, "_obj", arg)


class EmulatedLibrary:
    """libnvidia-ml for one H100: ``ring`` holds the utilization samples
    (timestamp µs, percent) in the order the driver hands them out."""

    def __init__(self, ring, missing=()):
        self.ring = ring
        self.missing = set(missing)
        self.since: list[int] = []

    def __getattribute__(self, name):
        if name in object.__getattribute__(self, "missing"):
            raise AttributeError(name)  # a driver that does not export it
        return object.__getattribute__(self, name)

    def nvmlInitWithFlags(self, flags):
        return pynvml.NVML_SUCCESS

    def nvmlShutdown(self):
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetCount_v2(self, count):
        _obj(count).value = 1
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetHandleByIndex_v2(self, index, handle):
        cast(byref(_obj(handle)), POINTER(c_void_p)).contents.value = 0x1000 + index.value
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetName(self, handle, buf, size):
        buf.value = b"NVIDIA H100 80GB HBM3"
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUUID(self, handle, buf, size):
        buf.value = b"GPU-0f1e2d3c"
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetSamples(self, handle, kind, since, value_type, count, samples):
        assert kind.value == pynvml.NVML_GPU_UTILIZATION_SAMPLES
        new = [s for s in self.ring if s[0] > since.value]
        _obj(value_type).value = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
        if samples is None:  # the size query
            self.since.append(since.value)
            if not new:
                return pynvml.NVML_ERROR_NOT_FOUND
            _obj(count).value = len(new)
            return pynvml.NVML_SUCCESS
        for slot, (ts, value) in zip(samples, new):
            slot.timeStamp, slot.sampleValue.uiVal = ts, value
        _obj(count).value = min(len(new), len(samples))
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetUtilizationRates(self, handle, util):
        _obj(util).gpu = 87
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo(self, handle, mem):
        m = _obj(mem)
        m.total, m.used = 80 << 30, (4333 + 480) * MiB  # v1 counts the driver's reserve
        m.free = m.total - m.used
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetMemoryInfo_v2(self, handle, mem):
        m = _obj(mem)
        if m.version != pynvml.nvmlMemory_v2 or ctypes.sizeof(m) != pynvml.nvmlMemory_v2 & 0xFFFFFF:
            return pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
        m.total, m.reserved, m.used = 80 << 30, 480 * MiB, 4333 * MiB
        m.free = m.total - m.reserved - m.used
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetTemperature(self, handle, sensor, temp):
        _obj(temp).value = 61
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetPowerUsage(self, handle, mw):
        _obj(mw).value = 312_500
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle, count, procs):
        if procs is None:
            _obj(count).value = 2
            return pynvml.NVML_ERROR_INSUFFICIENT_SIZE
        procs[0].pid, procs[1].pid = 1234, 5678
        _obj(count).value = 2
        return pynvml.NVML_SUCCESS


@pytest.fixture
def library(monkeypatch):
    def install(lib: EmulatedLibrary) -> GpuSampler:
        monkeypatch.setattr(pynvml, "nvmlLib", lib)
        monkeypatch.setattr(pynvml, "_nvmlGetFunctionPointer_cache", {})
        return GpuSampler(nvml=pynvml)

    return install


def ring(start_us: int, values: list[int], step_us: int = 250_000) -> list[tuple[int, int]]:
    return [(start_us + i * step_us, v) for i, v in enumerate(values)]


def test_every_figure_through_pynvml(library):
    lib = EmulatedLibrary(ring(10_000_000, [40, 60, 40, 60]))
    status, gpus = library(lib).sample()
    assert status == "ok", status
    g = gpus[0]
    assert g["error"] is None, g["error"]
    assert (g["name"], g["uuid"]) == ("NVIDIA H100 80GB HBM3", "GPU-0f1e2d3c")
    assert (g["util_percent"], g["util_samples"], g["util_source"]) == (50.0, 4, "samples")
    assert g["mem_used_bytes"] == 4333 * MiB  # v2, as nvidia-smi counts it
    assert (g["temperature_c"], g["power_w"], g["processes"]) == (61.0, 312.5, [1234, 5678])


def test_the_first_read_keeps_its_window_and_later_reads_go_by_timestamp(library):
    # 19 s of an idle GPU before the monitor started, then a job at 100 %.
    lib = EmulatedLibrary(ring(0, [0] * 76) + ring(19_250_000, [100] * 4))
    sampler = library(lib)
    assert sampler.sample()[1][0]["util_percent"] == 100.0
    # The next samples handed out from the ring's write position, not oldest first.
    later = ring(20_250_000, [5 * i for i in range(12)])
    lib.ring += later[8:] + later[:8]
    g = sampler.sample()[1][0]
    assert (g["util_samples"], g["util_percent"]) == (12, 27.5)
    g = sampler.sample()[1][0]  # nothing new: NVML says NOT_FOUND, one reading stands in
    assert lib.since == [0, 20_000_000, later[-1][0]]
    assert (g["util_source"], g["util_percent"], g["error"]) == ("reading", 87.0, None)


def test_an_old_driver_loses_only_the_fields_it_lacks(library):
    lib = EmulatedLibrary(
        ring(0, [30, 30]),
        missing={"nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3"},
    )
    status, gpus = library(lib).sample()
    g = gpus[0]
    assert status == "ok" and g["util_percent"] == 30.0
    assert g["mem_used_bytes"] == (4333 + 480) * MiB  # v1 where v2 is missing
    assert g["processes"] is None and g["error"]
