"""GPU figures from NVML (package nvidia-ml-py, module ``pynvml``).

The monitor must run on laptops, CPU boxes and CI, so "no GPU" is a normal
answer with a reason, never an exception. NVML is initialised lazily on the
first sample; after a failed init it is retried at most every
``retry_after_s`` seconds, because a failing ``nvmlInit`` can take a while
(driver probing) and the sampler runs about once a second.

Every per-device call is isolated: an unsupported or failing query (MIG
slices, vGPUs and old drivers refuse some) degrades that one field to None
and the device keeps its other figures.

Utilization is the mean of NVML's own sample buffer since the previous
call (``nvmlDeviceGetSamples(NVML_GPU_UTILIZATION_SAMPLES)``: the driver
records one every 1/6 s or so), with its spread. A device's first call
gets the whole buffer, which reaches back to before the monitor started (an
idle GPU's 0 % beside a job that started a second ago), so that call keeps
only the newest ``first_window_s`` of it by NVML's own clock; the buffer is a
ring, and its samples are filtered by timestamp, not by their order. One
``nvmlDeviceGetUtilizationRates`` reading is the busy share of a single
short period and swung 57 % -> 22 % a second apart on an H100 whose
15-reading mean (40.6 %) matched nvidia-smi's (40.0 %). Where the buffer is
not offered (old drivers, vGPUs) one reading stands in, and
``util_source`` says which.

Memory used is counted as nvidia-smi counts it: ``nvmlDeviceGetMemoryInfo``
v2 (``nvmlMemory_v2``), whose ``used`` leaves out the driver's reserved
memory; v1's ``used`` includes it and read nvidia-smi's + 480 MiB on an
H100 (4813 vs 4333 MiB). v1 where v2 is not offered.

The NVML module is injectable (``GpuSampler(nvml=fake)``) so tests can make
any call fail; by default the real ``pynvml`` is imported on first use.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

NOT_FOUND = "n/a: NVML not found (no NVIDIA driver)"
NOT_INSTALLED = "n/a: NVML not found (python package nvidia-ml-py not installed)"
NO_GPU = "n/a: no GPU found"
OK = "ok"
RETRY_AFTER_S = 30.0
# What a device's first read keeps of NVML's sample buffer: the monitor
# samples once a second, so a second unless the caller's window says more.
FIRST_WINDOW_S = 1.0


def _text(value: Any) -> str:
    # pynvml returns bytes from older releases and str from newer ones.
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


# What an NVIDIA driver leaves on a box (the kernel module's /proc entry, its
# control device, WSL2's GPU device). Where none is there NVML cannot start,
# so pynvml is not even imported: that import and the failing nvmlInit cost
# ~10 ms of CPU, a tenth of a one-shot `dlwatch snapshot` (bench/snapshot_cost.py).
DRIVER_PATHS = ("/proc/driver/nvidia", "/dev/nvidiactl", "/dev/dxg")


def driver_present(paths: tuple[str, ...] = DRIVER_PATHS) -> bool:
    return any(os.path.exists(p) for p in paths)


def _sample_value(smp: Any) -> float | None:
    """A utilization sample's value (an unsigned int in NVML's union)."""
    val = getattr(smp, "sampleValue", None)
    v: Any = getattr(val, "uiVal", val)
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if 0.0 <= f <= 100.0 else None


def _import_pynvml() -> ModuleType:
    import pynvml

    return pynvml


class GpuSampler:
    def __init__(
        self,
        nvml: Any = None,
        retry_after_s: float = RETRY_AFTER_S,
        clock: Callable[[], float] = time.monotonic,
        first_window_s: float = FIRST_WINDOW_S,
    ) -> None:
        self._nvml = nvml
        self._first_window_us = int(first_window_s * 1e6)
        self._retry_after_s = retry_after_s
        self._clock = clock
        self._initialized = False
        self._last_failure: tuple[float, str] | None = None  # (when, the status it gave)
        self._last_ts: dict[int, int] = {}  # per device: NVML's timestamp of the last sample read
        self._mem_v2: bool | None = None  # whether memory info v2 works here (None: not tried)

    # -------------------------------------------------------------- NVML plumbing

    def _errors(self) -> tuple[type[BaseException], ...]:
        # pynvml raises NVMLLibraryMismatchError, which is no NVMLError, when
        # a driver lacks a versioned call it wraps (the process list's _v3
        # before driver 510): that loses the one field, like any other refusal.
        names = ("NVMLError", "NVMLLibraryMismatchError")
        errs = (getattr(self._nvml, name, None) for name in names)
        return tuple(e for e in errs if isinstance(e, type))

    def _init_status(self, exc: BaseException) -> str:
        not_found = getattr(self._nvml, "NVMLError_LibraryNotFound", None)
        code = getattr(self._nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", None)
        if (isinstance(not_found, type) and isinstance(exc, not_found)) or (
            code is not None and getattr(exc, "value", None) == code
        ):
            return NOT_FOUND
        return f"n/a: NVML error: {exc}"

    def _ensure_init(self) -> str | None:
        """None when NVML is usable, else the status explaining why not."""
        if self._initialized:
            return None
        now = self._clock()
        if self._last_failure is not None:
            failed_at, failure = self._last_failure
            if now - failed_at < self._retry_after_s:
                return failure
        status = self._try_init()
        self._initialized = status is None
        self._last_failure = None if status is None else (now, status)
        return status

    def _try_init(self) -> str | None:
        if self._nvml is None:
            if not driver_present():
                return NOT_FOUND
            try:
                self._nvml = _import_pynvml()
            except ImportError:
                return NOT_INSTALLED
        try:
            self._nvml.nvmlInit()
        except self._errors() as e:
            return self._init_status(e)
        except OSError as e:
            # A broken libnvidia-ml (wrong arch, missing symbol) surfaces as OSError.
            return f"n/a: NVML error: {e}"
        return None

    def _field(self, fn: Callable[[], Any], failed: list[str], name: str) -> Any:
        try:
            return fn()
        except self._errors() as e:
            failed.append(f"{name}: {e}")
            return None

    # -------------------------------------------------------------- sampling

    def sample(self) -> tuple[str, list[dict[str, Any]]]:
        """(gpu_status, gpus): status "ok" with one dict per device, or "n/a: why" and []."""
        why = self._ensure_init()
        if why is not None:
            return why, []
        n = self._nvml
        try:
            count = n.nvmlDeviceGetCount()
        except self._errors() as e:
            return f"n/a: NVML error: {e}", []
        if count == 0:
            return NO_GPU, []
        return OK, [self._device(i) for i in range(count)]

    def _device(self, index: int) -> dict[str, Any]:
        n = self._nvml
        failed: list[str] = []
        dev: dict[str, Any] = {
            "index": index,
            "name": None,
            "uuid": None,
            "util_percent": None,
            "mem_used_bytes": None,
            "mem_total_bytes": None,
            "temperature_c": None,
            "power_w": None,
            "processes": None,
            "error": None,
        }
        handle = self._field(lambda: n.nvmlDeviceGetHandleByIndex(index), failed, "handle")
        if handle is None:
            dev["error"] = "; ".join(failed)
            return dev
        name = self._field(lambda: n.nvmlDeviceGetName(handle), failed, "name")
        dev["name"] = _text(name) if name is not None else None
        uuid = self._field(lambda: n.nvmlDeviceGetUUID(handle), failed, "uuid")
        dev["uuid"] = _text(uuid) if uuid is not None else None
        dev.update(self._utilization(index, handle, failed))
        mem = self._memory(handle, failed)
        if mem is not None:
            dev["mem_used_bytes"], dev["mem_total_bytes"] = int(mem.used), int(mem.total)
        temp = self._field(
            lambda: n.nvmlDeviceGetTemperature(handle, n.NVML_TEMPERATURE_GPU), failed, "temperature"
        )
        dev["temperature_c"] = float(temp) if temp is not None else None
        mw = self._field(lambda: n.nvmlDeviceGetPowerUsage(handle), failed, "power")
        dev["power_w"] = mw / 1000.0 if mw is not None else None
        procs = self._field(lambda: n.nvmlDeviceGetComputeRunningProcesses(handle), failed, "processes")
        # PIDs are in NVML's (the host's) PID namespace, which may differ from ours in a container.
        dev["processes"] = [int(p.pid) for p in procs] if procs is not None else None
        dev["error"] = "; ".join(failed) if failed else None
        return dev

    def _utilization(self, index: int, handle: Any, failed: list[str]) -> dict[str, Any]:
        """Mean, min and max of NVML's utilization samples since the last
        call, else one reading."""
        n = self._nvml
        kind = getattr(n, "NVML_GPU_UTILIZATION_SAMPLES", None)
        if kind is not None and hasattr(n, "nvmlDeviceGetSamples"):
            last = self._last_ts.get(index)
            try:
                _vtype, samples = n.nvmlDeviceGetSamples(handle, kind, last or 0)
            except self._errors():
                samples = None  # not offered here, or no sample since the last call
            got = [(int(getattr(smp, "timeStamp", 0)), _sample_value(smp)) for smp in samples or []]
            values: list[float] = []
            if got:
                newest = max(ts for ts, _ in got)
                floor = last if last is not None else newest - self._first_window_us
                values = [v for ts, v in got if ts > floor and v is not None]
                self._last_ts[index] = max(last or 0, newest)
            if values:
                return {
                    "util_percent": round(sum(values) / len(values), 1),
                    "util_min_percent": min(values),
                    "util_max_percent": max(values),
                    "util_samples": len(values),
                    "util_source": "samples",
                }
        util = self._field(lambda: n.nvmlDeviceGetUtilizationRates(handle), failed, "utilization")
        return {
            "util_percent": float(util.gpu) if util is not None else None,
            "util_samples": 1 if util is not None else None,
            "util_source": "reading" if util is not None else None,
        }

    def _memory(self, handle: Any, failed: list[str]) -> Any:
        n = self._nvml
        v2 = getattr(n, "nvmlMemory_v2", None)
        if v2 is not None and self._mem_v2 is not False:
            try:
                mem = n.nvmlDeviceGetMemoryInfo(handle, version=v2)
                self._mem_v2 = True
                return mem
            except (TypeError, AttributeError):
                self._mem_v2 = False  # a pynvml without the version argument
            except self._errors():
                if self._mem_v2 is None:
                    self._mem_v2 = False  # the driver has no v2: v1 from now on
        return self._field(lambda: n.nvmlDeviceGetMemoryInfo(handle), failed, "memory")

    def close(self) -> None:
        """Release NVML; a later sample() initialises it again."""
        if self._initialized:
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except self._errors():
                pass

    def __enter__(self) -> GpuSampler:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
