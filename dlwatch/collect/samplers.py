"""What ``Monitor`` asks of the things it samples with.

The real ones are ``GpuSampler``, ``HostSampler``, ``ProcSampler`` and
``dlwatch.diagnose.Diagnoser``; tests hand in their own. Any object with these
methods will do: the monitor never asks which class it has.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any, Protocol


class GpuSource(Protocol):
    def sample(self) -> tuple[str, list[dict[str, Any]]]:
        """("ok", one dict per device), or ("n/a: why", [])."""
        ...


class HostSource(Protocol):
    def sample(self) -> dict[str, Any]:
        """The host's figures since the previous call (collect/host.py)."""
        ...


Pids = Collection[int]


class ProcSource(Protocol):
    def sample(
        self,
        pids: Pids,
        main_pids: Pids | None = None,
        uss_pids: Pids | None = None,
        force_uss: bool = False,
        thread_pids: Pids = (),
        own_tids: Mapping[int, Iterable[int]] | None = None,
        active_since: Mapping[int, tuple[float, float]] | None = None,
    ) -> dict[int, dict[str, Any]]:
        """Figures per PID. ``main_pids``: whose main-thread CPU is wanted,
        ``uss_pids``: whose USS (None: all); ``force_uss``: read USS now
        rather than on the sampler's own schedule; ``thread_pids``: whose
        every thread's CPU is wanted (``thread_cpu``). Others get None there.
        ``own_tids``: dlwatch's own threads per PID, left out of its figures.
        ``active_since``: per PID, (CPU seconds, monotonic seconds) when a
        worker began its work: its first CPU figure averages from there."""
        ...


class HintSource(Protocol):
    def update(self, snapshot: Mapping[str, Any]) -> list[dict]:
        """The hints for ``snapshot``, judged after the earlier ones."""
        ...
