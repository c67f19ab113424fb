"""Host-wide figures: how many cores the job may really use, CPU load, /dev/shm.

``os.cpu_count()`` is the wrong denominator inside a container: a job pinned
to 4 CPUs, or given a CFS quota of 1.5 CPUs on a 64-core box, can use only
that many. ``usable_cores()`` is the smaller of the affinity mask and the
cgroup CPU quota (v1 or v2), walking up the cgroup tree because a parent's
limit caps every child.

The parsing is split into pure functions over file *contents* and a root
directory, so tests can feed fixture trees; the thin wrappers read the real
``/proc`` and ``/sys``. Anything unreadable or malformed means "no quota
found", never an exception: a monitor must not die on an odd kernel.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, NamedTuple

import psutil

DEFAULT_CGROUP_MOUNT = "/sys/fs/cgroup"
SHM_PATH = "/dev/shm"

# psutil's cpu_times() namedtuple; its class lives in a private module.
CpuTimes = Any


# ---------------------------------------------------------------- parsing


def parse_cpu_max(text: str) -> float | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` ("$QUOTA $PERIOD"), None if unlimited."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    try:
        quota = int(parts[0])
        # The kernel omits nothing, but a lone quota means the default period.
        period = int(parts[1]) if len(parts) > 1 else 100_000
    except ValueError:
        return None
    return _cores(quota, period)


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """Cores allowed by cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``."""
    try:
        quota = int(quota_text.strip())
        period = int(period_text.strip())
    except ValueError:
        return None
    return _cores(quota, period)


def _cores(quota: int, period: int) -> float | None:
    # v1 writes -1 for "no limit"; zero or negative values are not a limit we can use.
    if quota <= 0 or period <= 0:
        return None
    return quota / period


class CgroupMembership(NamedTuple):
    v2_path: str | None
    v1_paths: dict[str, str]  # controller -> path


def parse_proc_cgroup(text: str) -> CgroupMembership:
    """Parse ``/proc/self/cgroup``: lines ``hierarchy-id:controllers:path``."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hid, controllers, path = fields
        if hid == "0" and controllers == "":
            v2 = path
        else:
            for c in controllers.split(","):
                if c:
                    v1[c] = path
    return CgroupMembership(v2, v1)


class Mount(NamedTuple):
    root: str  # the path inside the cgroup hierarchy that is mounted here
    mount_point: str
    fstype: str
    super_options: tuple[str, ...]


def _unescape_mountinfo(field: str) -> str:
    # mountinfo encodes space, tab, newline and backslash as \ooo octal.
    if "\\" not in field:
        return field
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup (v1) and cgroup2 mounts listed in ``/proc/self/mountinfo``."""
    mounts: list[Mount] = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        if not sep:
            continue
        lf, rf = left.split(), right.split()
        if len(lf) < 5 or len(rf) < 3:
            continue
        fstype = rf[0]
        if fstype not in ("cgroup", "cgroup2"):
            continue
        mounts.append(
            Mount(
                root=_unescape_mountinfo(lf[3]),
                mount_point=_unescape_mountinfo(lf[4]),
                fstype=fstype,
                super_options=tuple(rf[2].split(",")),
            )
        )
    return mounts


def cgroup_dir(mount: Mount, cgroup_path: str) -> PurePosixPath:
    """Directory of ``cgroup_path`` under ``mount``, never above the mount point.

    A container usually mounts its own cgroup as the mount root, so the path
    from /proc/self/cgroup is relative to ``mount.root``. When it is not below
    the root (cgroup namespaces show "/" or "/.."), the best we can read is the
    mount point itself.
    """
    mp = PurePosixPath(mount.mount_point)
    path = os.path.normpath("/" + cgroup_path.lstrip("/"))
    root = os.path.normpath("/" + mount.root.lstrip("/"))
    if root == "/":
        rel = path.lstrip("/")
    elif path == root or path.startswith(root + "/"):
        rel = path[len(root) :].lstrip("/")
    else:
        rel = ""
    if ".." in PurePosixPath(rel).parts:
        rel = ""
    return mp / rel if rel else mp


def _ancestors(leaf: Path, top: Path) -> list[Path]:
    """``leaf`` and each parent up to and including ``top``."""
    chain = [leaf]
    cur = leaf
    while cur != top and cur.parent != cur:
        cur = cur.parent
        chain.append(cur)
    return chain


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


@dataclass(frozen=True)
class Quota:
    cores: float
    source: str  # "cgroup v2" | "cgroup v1"
    path: str  # the cgroup directory whose limit is the smallest


def _min_quota(candidates: list[Quota]) -> Quota | None:
    return min(candidates, key=lambda q: q.cores, default=None)


def quota_v2(mount_point: Path, leaf: Path) -> Quota | None:
    """Smallest ``cpu.max`` from ``leaf`` up to ``mount_point``."""
    found: list[Quota] = []
    for d in _ancestors(leaf, mount_point):
        text = _read(d / "cpu.max")
        cores = parse_cpu_max(text) if text is not None else None
        if cores is not None:
            found.append(Quota(cores, "cgroup v2", str(d)))
    return _min_quota(found)


def quota_v1(mount_point: Path, leaf: Path) -> Quota | None:
    """Smallest CFS quota from ``leaf`` up to ``mount_point``."""
    found: list[Quota] = []
    for d in _ancestors(leaf, mount_point):
        q, p = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
        cores = parse_cfs(q, p) if q is not None and p is not None else None
        if cores is not None:
            found.append(Quota(cores, "cgroup v1", str(d)))
    return _min_quota(found)


def _rebase(root: Path, absolute: PurePosixPath) -> Path:
    return root / str(absolute).lstrip("/")


def find_cpu_quota(proc_cgroup: str | None, mountinfo: str | None, root: Path = Path("/")) -> Quota | None:
    """The effective CPU quota of a process, from its /proc files' contents.

    ``root`` prefixes every mount point, so a test can lay out a fake
    ``sys/fs/cgroup`` under a temporary directory. Hybrid hosts (v1 cpu
    controller plus a v2 unified tree) are checked on both; the smaller wins.
    """
    if not proc_cgroup:
        return None
    membership = parse_proc_cgroup(proc_cgroup)
    mounts = parse_mountinfo(mountinfo or "")
    if not mounts:
        # No mountinfo (or no cgroup mounts listed): assume the usual v2 layout.
        mounts = [Mount("/", DEFAULT_CGROUP_MOUNT, "cgroup2", ())]
    found: list[Quota] = []
    for m in mounts:
        mp = _rebase(root, PurePosixPath(m.mount_point))
        if m.fstype == "cgroup2" and membership.v2_path is not None:
            leaf = _rebase(root, cgroup_dir(m, membership.v2_path))
            q = quota_v2(mp, leaf)
        elif m.fstype == "cgroup" and "cpu" in m.super_options and "cpu" in membership.v1_paths:
            leaf = _rebase(root, cgroup_dir(m, membership.v1_paths["cpu"]))
            q = quota_v1(mp, leaf)
        else:
            q = None
        if q is not None:
            found.append(q)
    return _min_quota(found)


def cpu_quota() -> Quota | None:
    """The real process's cgroup CPU quota, or None if there is none (or it is unreadable)."""
    return find_cpu_quota(_read(Path("/proc/self/cgroup")), _read(Path("/proc/self/mountinfo")))


def affinity_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        # Not Linux (no sched_getaffinity): every logical CPU is ours.
        return os.cpu_count() or 1


def _affinity_set() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except AttributeError:
        return set(range(os.cpu_count() or 1))


class CoreBudget(NamedTuple):
    usable: float
    affinity: int
    quota: float | None
    reason: str


def combine_cores(affinity: int, quota: Quota | None) -> CoreBudget:
    """Usable cores = the tighter of affinity and quota, with a readable why."""
    if quota is not None and quota.cores < affinity:
        return CoreBudget(
            quota.cores, affinity, quota.cores, f"{quota.source} quota {_fmt(quota.cores)} cores"
        )
    qc = quota.cores if quota is not None else None
    reason = f"affinity {affinity} cores"
    if quota is not None:
        reason += f" ({quota.source} quota {_fmt(quota.cores)} cores)"
    return CoreBudget(float(affinity), affinity, qc, reason)


def _fmt(x: float) -> str:
    return f"{x:g}" if x == int(x) else f"{x:.2f}".rstrip("0")


def core_budget() -> CoreBudget:
    return combine_cores(affinity_cores(), cpu_quota())


def usable_cores() -> float:
    """Cores this process can really use: min(affinity, cgroup CPU quota)."""
    return core_budget().usable


def shm_free_bytes(path: str = SHM_PATH) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


# ---------------------------------------------------------------- sampling


def busy_fraction(prev: CpuTimes, cur: CpuTimes) -> float | None:
    """Share of all CPUs' time that was busy between two ``psutil.cpu_times()``.

    Same definition as psutil.cpu_percent (idle and iowait count as not busy;
    guest time is already inside user), but on our own baseline: psutil's
    ``interval=None`` keeps one hidden global baseline per process, which any
    other caller in the monitor would silently reset.
    """

    def idle(t: CpuTimes) -> float:
        return t.idle + getattr(t, "iowait", 0.0)

    def total(t: CpuTimes) -> float:
        s = sum(t)
        # Linux counts guest time inside user too; psutil subtracts it likewise.
        return s - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)

    dt = total(cur) - total(prev)
    if dt <= 0:
        return None
    busy = dt - (idle(cur) - idle(prev))
    return min(max(busy / dt, 0.0), 1.0)


def nice_fraction(prev: CpuTimes, cur: CpuTimes) -> float | None:
    """Share of a CPU's time spent in processes at a positive nice between
    two ``cpu_times`` (the kernel's "nice" column; guest_nice is inside it)."""
    dt = sum(cur) - sum(prev) - (getattr(cur, "guest", 0.0) - getattr(prev, "guest", 0.0))
    dt -= getattr(cur, "guest_nice", 0.0) - getattr(prev, "guest_nice", 0.0)
    if dt <= 0:
        return None
    n = getattr(cur, "nice", 0.0) - getattr(prev, "nice", 0.0)
    return min(max(n / dt, 0.0), 1.0)


class HostSampler:
    """Successive ``sample()`` calls give the CPU load over the interval between them.

    The baseline is taken at construction, so the first sample already covers
    a real interval (as long as some time has passed).
    """

    def __init__(
        self,
        cpu_times: Callable[[], CpuTimes] = psutil.cpu_times,
        budget: Callable[[], CoreBudget] = core_budget,
        shm: Callable[[], int | None] = shm_free_bytes,
        percpu_times: Callable[[], list[CpuTimes]] | None = None,
        affinity: Callable[[], set[int]] = _affinity_set,
    ) -> None:
        self._cpu_times = cpu_times
        self._budget = budget
        self._shm = shm
        self._percpu = percpu_times or (lambda: psutil.cpu_times(percpu=True))
        self._affinity = affinity
        self._prev = cpu_times()
        self._prev_t = time.monotonic()
        self._last_percent: float | None = None
        self._prev_percpu = self._read_percpu()
        self._last_busy_cores: float | None = None
        self._last_niced_cores: float | None = None
        self._prev_own = _own_cpu()
        self._last_own_cores: float | None = None

    def _read_percpu(self) -> list[CpuTimes] | None:
        try:
            return list(self._percpu())
        except (OSError, psutil.Error):
            return None

    def _busy_cores(self) -> float | None:
        """Cores' worth of busy time on the CPUs this process may run on.

        The diagnosis subtracts every process's load from the usable cores;
        load on CPUs outside the affinity mask takes nothing from them."""
        cur = self._read_percpu()
        prev, self._prev_percpu = self._prev_percpu, cur
        own, (t0, c0) = _own_cpu(), self._prev_own
        self._prev_own = own
        if own[0] > t0:
            self._last_own_cores = max(0.0, (own[1] - c0) / (own[0] - t0))
        if cur is None or prev is None or len(cur) != len(prev):
            return self._last_busy_cores
        try:
            allowed = self._affinity()
        except OSError:
            allowed = set(range(len(cur)))
        total, niced, seen = 0.0, 0.0, False
        for i in sorted(allowed):
            if i < len(cur):
                f = busy_fraction(prev[i], cur[i])
                if f is not None:
                    total += f
                    niced += nice_fraction(prev[i], cur[i]) or 0.0
                    seen = True
        if seen:
            self._last_busy_cores = total
            self._last_niced_cores = min(niced, total)
        return self._last_busy_cores

    def sample(self) -> dict:
        cur, now = self._cpu_times(), time.monotonic()
        frac = busy_fraction(self._prev, cur)
        interval = now - self._prev_t
        if frac is not None:
            self._last_percent = frac * 100.0
            self._prev, self._prev_t = cur, now
        elif self._last_percent is None:
            # Sampled right after construction, before a clock tick: like top's
            # first frame, report the average since boot rather than a made-up 0.
            since_boot = busy_fraction(type(cur)(*([0.0] * len(cur))), cur)
            self._last_percent = (since_boot or 0.0) * 100.0
            interval = time.time() - psutil.boot_time()
        # Otherwise (no tick since the last sample) the last figure stands.
        logical = os.cpu_count() or 1
        b = self._budget()
        busy_cores = self._last_percent / 100.0 * logical
        return {
            # Busy cores on the affinity CPUs over the same interval: what the
            # diagnosis takes every process on the box (ours and others') to use.
            "busy_cores": self._busy_cores(),
            # ... of which processes at a positive nice (/proc/stat's "nice"
            # time): they yield a contested core to nice-0 threads.
            "niced_busy_cores": self._last_niced_cores,
            # ... of which this monitor's own process (the live view, a
            # snapshot): busy time it causes is no other process's load.
            "monitor_cores": self._last_own_cores,
            "logical_cpus": logical,
            "usable_cores": b.usable,
            "cpu_percent": self._last_percent,
            # Can exceed 100: processes outside our affinity/quota load the box too.
            "load_percent_of_usable": busy_cores / b.usable * 100.0 if b.usable > 0 else None,
            "cpu_interval_s": interval,
            "shm_free_bytes": self._shm(),
            "affinity_cores": b.affinity,
            "quota_cores": b.quota,
            "cores_reason": b.reason,
        }


def _own_cpu() -> tuple[float, float]:
    """(monotonic now, CPU seconds of this process and its reaped children:
    py-spy reads)."""
    t = os.times()
    return time.monotonic(), t.user + t.system + t.children_user + t.children_system


_default_sampler: HostSampler | None = None


def host_sample() -> dict:
    """One host sample; CPU load covers the time since the previous call (or import use)."""
    global _default_sampler
    if _default_sampler is None:
        _default_sampler = HostSampler()
    return _default_sampler.sample()
