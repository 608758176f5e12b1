"""How many pytest-xdist workers the lanes start (the Makefile's ``JOBS``): ``python3 tools/workers.py``.

One more than the CPUs this process may use, since the suite spends part of its time waiting on the
processes it starts. The CPUs it may use are the fewer of two limits: its affinity (what ``nproc`` counts)
and its cgroup's CPU quota (a container's ``--cpus``, a systemd slice's ``CPUQuota``), which ``nproc`` and
``os.cpu_count`` do not see: a runner with 64 CPUs in its affinity and a 4-CPU quota would start 65
workers on 4 CPUs' time. The quota is read as the kernel applies it: cgroup v2's ``cpu.max`` and v1's
``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, of this process's cgroup and every cgroup above it (the
lowest wins), rounded up to whole CPUs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")


def _quota(directory: Path) -> float | None:
    """The CPUs one cgroup's own limit allows (None: no limit, or no such file)."""
    try:
        quota, period = (directory / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "200000 100000"
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:
        quota_us = int((directory / "cpu.cfs_quota_us").read_text())  # v1: -1 for none
        period_us = int((directory / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def cgroup_cpus(proc_cgroup: str, root: Path = CGROUP_ROOT) -> float | None:
    """The lowest CPU quota on the way from this process's cgroup (``proc_cgroup``: /proc/self/cgroup's
    text) up to the root, v2's unified hierarchy and v1's ``cpu`` controller alike; None where none is set."""
    limits = []
    for line in proc_cgroup.splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = root / "unified" if (root / "unified").is_dir() else root  # hybrid: v2 mounted beside v1
        elif "cpu" in controllers.split(","):
            base = root / controllers if (root / controllers).is_dir() else root / "cpu"
        else:
            continue
        here = base / path.lstrip("/")
        while True:
            limit = _quota(here)
            if limit is not None:
                limits.append(limit)
            if here == base:
                break
            here = here.parent
    return min(limits) if limits else None


def usable_cpus(root: Path = CGROUP_ROOT) -> int:
    """The CPUs this process may use: its affinity, capped by its cgroup's quota (at least one)."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota = cgroup_cpus(Path("/proc/self/cgroup").read_text(), root)
    except OSError:
        quota = None
    return max(1, min(cpus, math.ceil(quota))) if quota is not None else cpus


if __name__ == "__main__":
    print(usable_cpus() + 1)
