"""The cores this process may use: the one count the package's CPU-bound pools are sized from.

A node shares its machine: with the training loop and its data loader on a GPU node, with the
S3 server and the other learners on a small box. The kernels' threads are therefore sized from
the cores this process may actually run on. The S3 mailbox's parts in flight are not: they wait
on sockets and are sized by the link (``S3Tuning.max_concurrency``; on the 2-core VM of
``docs/benchmarks.md`` 2 or 4 in flight made the syncer's round no faster than 8).

"May run on" is the smaller of the CPU affinity (``taskset``, a cpuset) and the cgroup's CPU
quota (a container's ``--cpus``, a Kubernetes pod's CPU limit), rounded up: a pod limited to 2
CPUs on a 64-core node sees 64 in ``os.cpu_count()`` and is throttled past 2.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["CGROUP_ROOT", "available_cores", "cgroup_cpu_limit"]

CGROUP_ROOT = Path("/sys/fs/cgroup")
"""Where the kernel mounts the cgroup hierarchy (v2 unified, or v1's ``cpu`` controller under it)."""


def cgroup_cpu_limit(root: Path = CGROUP_ROOT, membership: str | None = None) -> float | None:
    """CPUs the quota of this process's cgroup allows (quota ÷ period), or None without one:
    cgroup v2's ``cpu.max`` ("max 100000", or "200000 100000" for 2 CPUs), else v1's
    ``cpu.cfs_quota_us`` (−1: none) over ``cpu.cfs_period_us``. The cgroup is the one
    ``/proc/self/cgroup`` names (``membership``: its text, for tests), looked up under ``root``
    and, where that path is not mounted (a container's namespace), at ``root`` itself. An
    unreadable or malformed file counts as no quota."""
    v2, v1 = _own_cgroups(membership)
    for directory in dict.fromkeys((root / v2.lstrip("/"), root)):
        try:
            quota, period = (directory / "cpu.max").read_text().split()
        except (OSError, ValueError):
            continue
        return None if quota == "max" else _ratio(quota, period)
    for directory in dict.fromkeys((root / "cpu" / v1.lstrip("/"), root / "cpu")):
        try:
            quota = (directory / "cpu.cfs_quota_us").read_text().strip()
            period = (directory / "cpu.cfs_period_us").read_text().strip()
        except OSError:
            continue
        return _ratio(quota, period)
    return None


def _own_cgroups(membership: str | None) -> tuple[str, str]:
    """This process's cgroup paths: the v2 one (``0::path``) and the v1 ``cpu`` controller's."""
    if membership is None:
        try:
            membership = Path("/proc/self/cgroup").read_text()
        except OSError:
            membership = ""
    v2 = v1 = "/"
    for line in membership.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2 = path or "/"
        elif "cpu" in controllers.split(","):
            v1 = path or "/"
    return v2, v1


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def available_cores(root: Path = CGROUP_ROOT, membership: str | None = None) -> int:
    """The cores this process may use: its CPU affinity, capped by its cgroup's quota (rounded
    up); at least 1."""
    affinity = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    limit = cgroup_cpu_limit(root, membership)
    if limit is not None:
        affinity = min(affinity, math.ceil(limit))
    return max(1, affinity)
