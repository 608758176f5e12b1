"""The lanes' worker count (tools/workers.py, the Makefile's JOBS): the CPUs this process may use, affinity
capped by its cgroup's CPU quota, plus one."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

from support import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import workers

WORKERS = ROOT / "tools" / "workers.py"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def test_cgroup_v2_quota_of_the_process_or_any_cgroup_above_it(tmp_path):
    root = _tree(tmp_path, {"cpu.max": "max 100000\n", "ci/cpu.max": "250000 100000\n",
                            "ci/job/cpu.max": "max 100000\n"})
    assert workers.cgroup_cpus("0::/ci/job\n", root) == 2.5  # the parent's, rounded up by usable_cpus
    assert workers.cgroup_cpus("0::/\n", root) is None


def test_cgroup_v1_cpu_controller_and_a_hybrid_host(tmp_path):
    v1 = {"cpu/cpu.cfs_quota_us": "-1\n", "cpu/cpu.cfs_period_us": "100000\n",
          "cpu/slice/cpu.cfs_quota_us": "300000\n", "cpu/slice/cpu.cfs_period_us": "100000\n"}
    root = _tree(tmp_path / "v1", v1)
    assert workers.cgroup_cpus("4:memory:/slice\n1:cpu:/slice\n0::/\n", root) == 3
    hybrid = _tree(tmp_path / "hybrid", {**v1, "unified/job/cpu.max": "100000 100000\n"})
    assert workers.cgroup_cpus("1:cpu:/slice\n0::/job\n", hybrid) == 1  # the lower of both hierarchies
    joined = _tree(tmp_path / "joined", {"cpu,cpuacct/slice/cpu.cfs_quota_us": "50000\n",
                                         "cpu,cpuacct/slice/cpu.cfs_period_us": "100000\n"})
    assert workers.cgroup_cpus("2:cpu,cpuacct:/slice\n", joined) == 0.5


def test_no_quota_leaves_the_affinity(tmp_path):
    root = _tree(tmp_path, {"cpu.max": "max 100000\n"})
    assert workers.cgroup_cpus("0::/\n", root) is None
    assert workers.cgroup_cpus("0::/not-mounted-here\n", root) is None  # no such files: no limit read


def test_a_real_cgroup_quota_caps_the_workers():
    """A cgroup of this kernel with a one-CPU quota (v1's cpu controller, or v2's cpu.max where v2 alone is
    mounted), the script started inside it: two workers, whatever the machine's CPU count."""
    base = Path("/sys/fs/cgroup")
    name = f"tms-workers-{uuid.uuid4().hex[:8]}"
    if (base / "cpu" / "cpu.cfs_quota_us").exists():
        group = base / "cpu" / name
        group.mkdir()
        (group / "cpu.cfs_quota_us").write_text("100000")
        (group / "cpu.cfs_period_us").write_text("100000")
    else:
        if "cpu" not in (base / "cgroup.subtree_control").read_text().split():
            (base / "cgroup.subtree_control").write_text("+cpu")
        group = base / name
        group.mkdir()
        (group / "cpu.max").write_text("100000 100000")
    try:
        r = subprocess.run(["sh", "-c", f'echo $$ > "{group}/cgroup.procs" && exec "$@"', "sh", sys.executable,
                            str(WORKERS)], capture_output=True, text=True, timeout=60)
    finally:
        group.rmdir()  # the process has exited: the group is empty
    assert (r.returncode, r.stdout, r.stderr) == (0, "2\n", "")
