"""The cores a process may use: CPU affinity capped by its cgroup's CPU quota (v2 and v1)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gradientmail.cores import available_cores, cgroup_cpu_limit

V2_MEMBERSHIP = "0::/kubepods/pod-1/container-a\n"
V1_MEMBERSHIP = "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n"


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.parametrize(
    ("cpu_max", "expected"), [("200000 100000\n", 2.0), ("150000 100000", 1.5), ("max 100000\n", None), ("garbage", None)]
)
def test_a_v2_quota_is_read_from_the_process_s_own_cgroup(tmp_path, cpu_max: str, expected: float | None) -> None:
    _write(tmp_path / "kubepods/pod-1/container-a/cpu.max", cpu_max)
    _write(tmp_path / "cpu.max", "max 100000")  # the root has none: the process's own cgroup decides
    assert cgroup_cpu_limit(tmp_path, V2_MEMBERSHIP) == expected


def test_a_namespaced_container_reads_its_quota_at_the_mount_root(tmp_path) -> None:
    """Inside a cgroup namespace the path /proc/self/cgroup names is not mounted below the root."""
    _write(tmp_path / "cpu.max", "50000 100000")
    assert cgroup_cpu_limit(tmp_path, V2_MEMBERSHIP) == 0.5
    assert available_cores(tmp_path, V2_MEMBERSHIP) == 1  # half a CPU still runs one thread


def test_a_v1_quota_and_its_absence(tmp_path) -> None:
    _write(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "300000\n")
    _write(tmp_path / "cpu/docker/abc/cpu.cfs_period_us", "100000\n")
    assert cgroup_cpu_limit(tmp_path, V1_MEMBERSHIP) == 3.0
    _write(tmp_path / "cpu/docker/abc/cpu.cfs_quota_us", "-1\n")
    assert cgroup_cpu_limit(tmp_path, V1_MEMBERSHIP) is None
    assert cgroup_cpu_limit(tmp_path / "nothing-mounted", V1_MEMBERSHIP) is None


def test_the_cores_are_the_affinity_capped_by_the_quota_rounded_up(tmp_path) -> None:
    affinity = len(os.sched_getaffinity(0))
    assert available_cores(tmp_path / "no-cgroup", "") == affinity
    _write(tmp_path / "cpu.max", f"{affinity * 100000 + 1} 100000")  # a hair over the affinity: the affinity
    assert available_cores(tmp_path, "0::/\n") == affinity
    _write(tmp_path / "cpu.max", "120000 100000")  # 1.2 CPUs: 2 threads keep it busy
    assert available_cores(tmp_path, "0::/\n") == min(affinity, 2)
