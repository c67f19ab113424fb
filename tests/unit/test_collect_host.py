"""Host sampling: cgroup quota discovery on fixture trees, and the real machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from dlwatch.collect import host
from dlwatch.collect.host import (
    HostSampler,
    Mount,
    Quota,
    cgroup_dir,
    combine_cores,
    find_cpu_quota,
    parse_cfs,
    parse_cpu_max,
    parse_mountinfo,
    parse_proc_cgroup,
)

V2_MOUNTINFO = (
    "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate\n"
)
V1_MOUNTINFO = (
    "31 23 0:28 / /sys/fs/cgroup ro,nosuid - tmpfs tmpfs ro,mode=755\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid - cgroup cgroup rw,cpu,cpuacct\n"
    "35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n"
)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# ---------------------------------------------------------------- pure parsers


@pytest.mark.parametrize(
    "text, cores",
    [
        ("max 100000\n", None),
        ("200000 100000\n", 2.0),
        ("150000 100000", 1.5),
        ("50000 100000", 0.5),
        ("max", None),
        ("", None),
        ("garbage 100000", None),
        ("100000 notanumber", None),
        ("100000 0", None),
        ("-5 100000", None),
    ],
)
def test_parse_cpu_max(text, cores):
    assert parse_cpu_max(text) == cores


@pytest.mark.parametrize(
    "quota, period, cores",
    [
        ("-1\n", "100000\n", None),
        ("400000\n", "100000\n", 4.0),
        ("25000", "100000", 0.25),
        ("x", "100000", None),
        ("100000", "", None),
        ("0", "100000", None),
    ],
)
def test_parse_cfs(quota, period, cores):
    assert parse_cfs(quota, period) == cores


def test_parse_proc_cgroup_v1_and_v2():
    m = parse_proc_cgroup(
        "12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n1:name=systemd:/x\n0::/user.slice/job\nbogus\n"
    )
    assert m.v2_path == "/user.slice/job"
    assert m.v1_paths["cpu"] == "/docker/abc"
    assert m.v1_paths["cpuacct"] == "/docker/abc"
    assert m.v1_paths["memory"] == "/docker/abc"


def test_parse_mountinfo_finds_cgroup_mounts_and_unescapes():
    text = V1_MOUNTINFO + "40 31 0:38 /sub /sys/fs/with\\040space rw - cgroup2 cgroup2 rw\nshort line\n"
    mounts = parse_mountinfo(text)
    assert [m.fstype for m in mounts] == ["cgroup", "cgroup", "cgroup2"]
    assert mounts[0].mount_point == "/sys/fs/cgroup/cpu,cpuacct"
    assert "cpu" in mounts[0].super_options
    assert mounts[2].mount_point == "/sys/fs/with space"
    assert mounts[2].root == "/sub"


@pytest.mark.parametrize(
    "root, path, expected",
    [
        ("/", "/a/b", "/m/a/b"),
        ("/docker/abc", "/docker/abc", "/m"),
        ("/docker/abc", "/docker/abc/child", "/m/child"),
        ("/docker/abc", "/elsewhere", "/m"),  # not below the mounted root: best effort
        ("/", "/", "/m"),
        ("/", "/../..", "/m"),  # cgroup namespace artefact never escapes the mount
    ],
)
def test_cgroup_dir(root, path, expected):
    assert str(cgroup_dir(Mount(root, "/m", "cgroup2", ()), path)) == expected


# ---------------------------------------------------------------- fixture trees


def test_v2_quota_in_leaf(tmp_path):
    write(tmp_path / "sys/fs/cgroup/job/cpu.max", "150000 100000\n")
    write(tmp_path / "sys/fs/cgroup/cpu.max", "max 100000\n")
    q = find_cpu_quota("0::/job\n", V2_MOUNTINFO, tmp_path)
    assert q == Quota(1.5, "cgroup v2", str(tmp_path / "sys/fs/cgroup/job"))


def test_v2_nested_parent_limit_is_tighter(tmp_path):
    cg = tmp_path / "sys/fs/cgroup"
    write(cg / "kubepods/cpu.max", "100000 100000\n")  # parent: 1 core
    write(cg / "kubepods/pod/cpu.max", "max 100000\n")
    write(cg / "kubepods/pod/ctr/cpu.max", "300000 100000\n")  # leaf asks for 3
    q = find_cpu_quota("0::/kubepods/pod/ctr\n", V2_MOUNTINFO, tmp_path)
    assert q is not None and q.cores == 1.0
    assert q.path == str(cg / "kubepods")


def test_v2_unlimited_everywhere(tmp_path):
    write(tmp_path / "sys/fs/cgroup/a/cpu.max", "max 100000\n")
    assert find_cpu_quota("0::/a\n", V2_MOUNTINFO, tmp_path) is None


def test_v2_cpu_controller_missing_means_no_quota(tmp_path):
    (tmp_path / "sys/fs/cgroup/a").mkdir(parents=True)
    assert find_cpu_quota("0::/a\n", V2_MOUNTINFO, tmp_path) is None


def test_v2_malformed_file_is_skipped_not_fatal(tmp_path):
    write(tmp_path / "sys/fs/cgroup/a/cpu.max", "\x00\x01 nonsense\n")
    write(tmp_path / "sys/fs/cgroup/cpu.max", "250000 100000\n")
    q = find_cpu_quota("0::/a\n", V2_MOUNTINFO, tmp_path)
    assert q is not None and q.cores == 2.5


def test_unreadable_file_is_skipped(tmp_path):
    # Root can read anything, so make the "file" a directory: reading it raises OSError.
    (tmp_path / "sys/fs/cgroup/a/cpu.max").mkdir(parents=True)
    write(tmp_path / "sys/fs/cgroup/cpu.max", "300000 100000\n")
    q = find_cpu_quota("0::/a\n", V2_MOUNTINFO, tmp_path)
    assert q is not None and q.cores == 3.0


def test_binary_garbage_file_does_not_raise(tmp_path):
    p = tmp_path / "sys/fs/cgroup/a/cpu.max"
    p.parent.mkdir(parents=True)
    p.write_bytes(b"\xff\xfe\xfa")
    assert find_cpu_quota("0::/a\n", V2_MOUNTINFO, tmp_path) is None


def test_v2_namespaced_mount_root(tmp_path):
    # Container with cgroupns: the mount's root is the container's own cgroup.
    mi = "30 23 0:26 /docker/abc /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"
    write(tmp_path / "sys/fs/cgroup/cpu.max", "200000 100000\n")
    q = find_cpu_quota("0::/docker/abc\n", mi, tmp_path)
    assert q is not None and q.cores == 2.0


def test_v1_quota_and_nested(tmp_path):
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu / "cpu.cfs_quota_us", "-1\n")
    write(cpu / "cpu.cfs_period_us", "100000\n")
    write(cpu / "docker/cpu.cfs_quota_us", "50000\n")
    write(cpu / "docker/cpu.cfs_period_us", "100000\n")
    write(cpu / "docker/abc/cpu.cfs_quota_us", "200000\n")
    write(cpu / "docker/abc/cpu.cfs_period_us", "100000\n")
    q = find_cpu_quota("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n", V1_MOUNTINFO, tmp_path)
    assert q == Quota(0.5, "cgroup v1", str(cpu / "docker"))


def test_v1_unlimited(tmp_path):
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu / "cpu.cfs_quota_us", "-1\n")
    write(cpu / "cpu.cfs_period_us", "100000\n")
    assert find_cpu_quota("3:cpu,cpuacct:/\n", V1_MOUNTINFO, tmp_path) is None


def test_v1_quota_without_period_file_is_ignored(tmp_path):
    write(tmp_path / "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "50000\n")
    assert find_cpu_quota("3:cpu,cpuacct:/\n", V1_MOUNTINFO, tmp_path) is None


def test_hybrid_takes_the_smaller_limit(tmp_path):
    mi = V1_MOUNTINFO + "41 31 0:38 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
    cpu = tmp_path / "sys/fs/cgroup/cpu,cpuacct"
    write(cpu / "cpu.cfs_quota_us", "300000\n")
    write(cpu / "cpu.cfs_period_us", "100000\n")
    write(tmp_path / "sys/fs/cgroup/unified/cpu.max", "120000 100000\n")
    q = find_cpu_quota("3:cpu,cpuacct:/\n0::/\n", mi, tmp_path)
    assert q is not None and q.cores == 1.2 and q.source == "cgroup v2"


def test_missing_mountinfo_defaults_to_sys_fs_cgroup(tmp_path):
    write(tmp_path / "sys/fs/cgroup/j/cpu.max", "75000 100000\n")
    for mi in (None, "", "garbage\n"):
        q = find_cpu_quota("0::/j\n", mi, tmp_path)
        assert q is not None and q.cores == 0.75


def test_unreadable_proc_cgroup_means_no_quota(tmp_path):
    write(tmp_path / "sys/fs/cgroup/cpu.max", "100000 100000\n")
    assert find_cpu_quota(None, V2_MOUNTINFO, tmp_path) is None
    assert find_cpu_quota("not a cgroup file", V2_MOUNTINFO, tmp_path) is None


def test_missing_tree_means_no_quota(tmp_path):
    assert find_cpu_quota("0::/a/b\n", V2_MOUNTINFO, tmp_path) is None


# ---------------------------------------------------------------- combining


def test_combine_cores_quota_tighter():
    b = combine_cores(8, Quota(1.5, "cgroup v2", "/x"))
    assert b.usable == 1.5 and b.quota == 1.5 and b.affinity == 8
    assert b.reason == "cgroup v2 quota 1.5 cores"


def test_combine_cores_affinity_tighter():
    b = combine_cores(2, Quota(4.0, "cgroup v1", "/x"))
    assert b.usable == 2.0 and b.quota == 4.0
    assert b.reason.startswith("affinity 2 cores")


def test_combine_cores_no_quota():
    b = combine_cores(3, None)
    assert (b.usable, b.quota, b.reason) == (3.0, None, "affinity 3 cores")


# ---------------------------------------------------------------- real machine


def test_usable_cores_real_matches_affinity_and_quota():
    aff = len(os.sched_getaffinity(0))
    q = host.cpu_quota()
    expected = min(aff, q.cores) if q else aff
    assert host.usable_cores() == pytest.approx(expected)
    assert 0 < host.usable_cores() <= os.cpu_count()


def test_usable_cores_follows_affinity_of_a_pinned_child():
    # A child pinned to one CPU must see one usable core (unless its quota is below 1).
    code = "from dlwatch.collect import host; print(host.core_budget().affinity)"
    out = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert out.stdout.strip() == "1"


def test_host_sample_keys_and_types():
    s = HostSampler().sample()
    assert s["logical_cpus"] == os.cpu_count()
    assert isinstance(s["usable_cores"], float) and s["usable_cores"] > 0
    assert 0.0 <= s["cpu_percent"] <= 100.0
    assert s["shm_free_bytes"] is None or s["shm_free_bytes"] >= 0
    assert s["affinity_cores"] == len(os.sched_getaffinity(0))
    assert isinstance(s["cores_reason"], str) and "cores" in s["cores_reason"]
    assert s["load_percent_of_usable"] == pytest.approx(
        s["cpu_percent"] / 100 * s["logical_cpus"] / s["usable_cores"] * 100
    )


def test_host_sample_function_returns_schema_keys():
    s = host.host_sample()
    for k in (
        "logical_cpus",
        "usable_cores",
        "cpu_percent",
        "shm_free_bytes",
        "load_percent_of_usable",
        "affinity_cores",
        "quota_cores",
        "cores_reason",
    ):
        assert k in s


def test_shm_free_missing_path_is_none(tmp_path):
    assert host.shm_free_bytes(str(tmp_path / "nope")) is None
    assert host.shm_free_bytes(str(tmp_path)) > 0


def proc_stat_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies from the "cpu" line of /proc/stat, read without psutil."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    total = user + nice + system + idle + iowait + irq + softirq + steal
    return total - idle - iowait, total


def oracle_window(sampler: HostSampler, gap: float) -> tuple[float, float]:
    """(sampler's cpu_percent, /proc/stat's) over the same window."""
    b0, t0 = proc_stat_busy_ticks()
    sampler.sample()
    time.sleep(gap)
    got = sampler.sample()["cpu_percent"]
    b1, t1 = proc_stat_busy_ticks()
    return got, (b1 - b0) / (t1 - t0) * 100.0


def test_cpu_percent_covers_interval_between_samples():
    """Each sample reports the load between it and the previous one.

    Other work on a shared box moves the absolute figures, so each window is
    checked against /proc/stat read around it, and the busy window must show
    at least the one core our child keeps busy.
    """
    n = os.cpu_count()
    sampler = HostSampler()
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        busy, busy_oracle = oracle_window(sampler, 1.0)
    finally:
        child.kill()
        child.wait()
    idle, idle_oracle = oracle_window(sampler, 0.5)
    assert busy == pytest.approx(busy_oracle, abs=5)
    assert idle == pytest.approx(idle_oracle, abs=5)
    assert busy >= 100.0 / n * 0.6


CPU_TIMES = type(psutil.cpu_times())


def fields(**kw: float):
    return CPU_TIMES(**{f: kw.get(f, 0.0) for f in CPU_TIMES._fields})


def test_busy_fraction_excludes_idle_iowait_and_guest():
    prev = fields(user=100, idle=100)
    # +30 user (of which 10 guest, counted twice by Linux), +10 system, +40 idle, +20 iowait
    cur = fields(user=130, system=10, idle=140, iowait=20, guest=10)
    assert host.busy_fraction(prev, cur) == pytest.approx(40 / 100)
    assert host.busy_fraction(cur, cur) is None


def test_short_interval_keeps_last_figure():
    ticks = iter(
        [
            CPU_TIMES(*([10.0] * 10)),
            CPU_TIMES(20.0, *([10.0] * 9)),
            CPU_TIMES(20.0, *([10.0] * 9)),  # no tick elapsed
        ]
    )
    s = HostSampler(cpu_times=lambda: next(ticks))
    first = s.sample()["cpu_percent"]
    assert first == pytest.approx(100.0)
    assert s.sample()["cpu_percent"] == pytest.approx(100.0)


def test_first_sample_without_interval_reports_since_boot_average():
    t = CPU_TIMES(*([10.0] * 10))  # user=10 ... idle=10, iowait=10
    s = HostSampler(cpu_times=lambda: t)
    v = s.sample()["cpu_percent"]
    assert 0.0 < v < 100.0


def test_the_monitors_own_cpu_is_counted_apart():
    # A new user's live view blamed "other processes" for the CPU the view
    # itself and a snapshot took.
    sampler = HostSampler()
    sampler.sample()
    end = time.process_time() + 0.3
    t0 = time.monotonic()
    while time.process_time() < end:  # this process's own work: 0.3 s of CPU
        pass
    s = sampler.sample()
    wall = time.monotonic() - t0
    assert s["monitor_cores"] == pytest.approx(0.3 / wall, abs=0.15), (s["monitor_cores"], wall)
    assert s["monitor_cores"] <= s["busy_cores"] + 0.1
