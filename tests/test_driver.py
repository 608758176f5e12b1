"""The NVIDIA driver as users' nodes have it: too old for torch's CUDA, rescued by NVIDIA's forward
compatibility, or a kernel module and user-space library that differ.

Real torch_memory_saver 0.0.10 and NVIDIA's real cu13 runtime wheel, a torch for CUDA 13 (stand-in: only
its version file and global-deps library are read), the real loader. Two stand-ins only: the driver
library, installed the way NVIDIA installs it (``libcuda.so.1 -> libcuda.so.<version>``), and the kernel
module's ``/proc/driver/nvidia/version``, written on a tmpfs mounted over ``/proc/driver`` inside the
host's private mount namespace.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import AARCH64, Scenario, mode_env, need
from rootfs import RootfsHost
from support import MAPPED, ROOT, Host, clean_env, driver_stub

sys.path.insert(0, str(ROOT))
from tms_autopreload.commands.doctor import node_table as rows

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
OLD, NEW = "535.104.05", "580.95.05"
MAPS = MAPPED + """
import json, os
maps = mapped()
print(json.dumps({'hooks': [m for m in maps if 'torch_memory_saver' in m],
                  'libcuda': [m for m in maps if os.path.basename(m).startswith('libcuda.so')]}))
"""


def module(version: str | None) -> str:
    """Shell for the host's namespace: /proc/driver/nvidia/version saying ``version`` (None: no such file)."""
    mount = "mount -t tmpfs none /proc/driver"
    if version is None:
        return mount
    return (f"{mount} && mkdir /proc/driver/nvidia && printf 'NVRM version: NVIDIA UNIX x86_64 Kernel Module  "
            f"{version}  Sat Aug 19 01:15:15 UTC 2023\\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\\n' "
            f"> /proc/driver/nvidia/version")


@pytest.fixture(scope="module")
def world(scenario, parts, tmp_path_factory):
    """A venv with torch for CUDA 13 and tms 0.0.10; driver directories as NVIDIA installs them."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    root = tmp_path_factory.mktemp("drivers")
    dirs = {v: root / f"nvidia-{v}" for v in (OLD, NEW)}
    for version, d in dirs.items():
        need(driver_stub, d, version)
    compat = root / f"cuda-compat-13-{NEW}"  # what NVIDIA's cuda-compat-13-0 package puts in .../compat
    need(driver_stub, compat, NEW)
    hosts = {v: Scenario(scn.venv, need(Host, root / f"host-{v}", [d]), parts) for v, d in dirs.items()}
    return scn, hosts, dirs, compat


def doctor(scn, setup, env=None, *args):
    return scn.host.run([str(scn.venv.python), "-m", "tms_autopreload", "doctor", *args], clean_env(**(env or {})),
                        setup=setup)


def driver_line(out: str) -> str:
    return next(line for line in out.splitlines() if line.startswith("driver:   "))


def flagged(scn, setup, env=None, mode="exec"):
    r = scn.host.run([str(scn.venv.python), "-c", MAPS],
                     clean_env(SLIME_OFFLOAD_TRAIN="1", **mode_env(mode), **(env or {})), setup=setup)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_old_driver_without_forward_compatibility_fails(world, capsys):
    """Driver 535 (CUDA 12.2 at most) under a torch for CUDA 13: doctor fails, naming both and the fix."""
    scn, hosts, dirs, _ = world
    old = hosts[OLD]
    r = doctor(old, module(OLD))
    assert r.returncode == 1, r.stdout + r.stderr
    line = driver_line(r.stdout)
    with capsys.disabled():
        print(f"\n[old driver] {line}")
    assert line.startswith(f"driver:   FAILING: the NVIDIA driver {OLD} runs CUDA 12.x at most, but torch is built "
                           f"for CUDA 13, which needs a driver >= 580"), line
    assert "upgrade the NVIDIA driver to >= 580" in line and "forward-compatibility" in line
    assert "LD_LIBRARY_PATH" in line
    assert f"module:   NVIDIA kernel module {OLD}" in r.stdout
    assert f"libcuda:  {dirs[OLD] / ('libcuda.so.' + OLD)} ({OLD}, via /etc/ld.so.cache, runs CUDA 12.x at most)" \
        in r.stdout, r.stdout
    doc = json.loads(doctor(old, module(OLD), None, "--json").stdout)
    assert doc["ok"] is False and doc["plan"] is not None  # a plan exists; the driver is what fails
    assert doc["driver"]["verdict"] == "failing" and doc["driver"]["newest_major"] == 12
    # The preflight row built from this node's document fails with the same words.
    got = rows.node_row("old", "10.0.0.1", "n" * 16, rows.document_answer(doc), None, gpus=8)
    assert not got["ok"] and got["error"].startswith(f"the NVIDIA driver {OLD} runs CUDA 12.x at most")
    # The start-up hook does not refuse: the loader can load it; only the first CUDA call fails.
    out = flagged(old, module(OLD))
    assert [os.path.basename(h) for h in out["hooks"]] == [CU13]


@pytest.mark.parametrize("how", ["LD_LIBRARY_PATH", "LD_PRELOAD"])
def test_forward_compatibility_is_ok_and_the_only_libcuda(world, how, mode, capsys):
    """NVIDIA's forward-compatibility libcuda 580 reached first on a 535 module: OK, naming the file, and a
    flagged process (hook and all) maps that one libcuda and no other."""
    scn, hosts, _, compat = world
    old = hosts[OLD]
    env = {"LD_LIBRARY_PATH": str(compat)} if how == "LD_LIBRARY_PATH" else {"LD_PRELOAD": str(compat / "libcuda.so.1")}
    r = doctor(old, module(OLD), env)
    assert r.returncode == 0, r.stdout + r.stderr
    line = driver_line(r.stdout)
    with capsys.disabled():
        print(f"\n[forward compatibility, {how}] {line}")
    real = compat / f"libcuda.so.{NEW}"
    assert line == (f"driver:   OK: forward compatibility: {real} (libcuda {NEW}, via {how}) runs CUDA 13.x on "
                    f"kernel module {OLD}; torch and the hook bind this one libcuda"), line
    out = flagged(old, module(OLD), env, mode)
    assert [os.path.basename(h) for h in out["hooks"]] == [CU13], out
    assert out["libcuda"] == [str(real)], out


def test_module_and_library_versions_differ(world, capsys):
    """Kernel module 580 with user-space 535 (an upgrade without a reboot, a container's wrong mount)."""
    _, hosts, dirs, _ = world
    r = doctor(hosts[OLD], module(NEW))
    assert r.returncode == 1, r.stdout + r.stderr
    line = driver_line(r.stdout)
    with capsys.disabled():
        print(f"\n[mismatch] {line}")
    assert line.startswith(f"driver:   FAILING: Driver/library version mismatch: the NVIDIA kernel module is {NEW} "
                           f"but the user-space driver the loader binds is {OLD} "
                           f"({dirs[OLD] / ('libcuda.so.' + OLD)}, via /etc/ld.so.cache)"), line
    assert "reboot" in line


def test_no_module_version_file_is_unknown_never_failing(world, scenario):
    """Containers without /proc/driver/nvidia/version, or with no file there to read: the module is unknown,
    and that alone fails nothing."""
    _, hosts, _, _ = world
    r = doctor(hosts[NEW], module(None))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "module:   unknown: /proc/driver/nvidia/version does not exist" in r.stdout
    assert driver_line(r.stdout).startswith(f"driver:   OK: driver {NEW} runs CUDA 13.x"), r.stdout
    # There, but no file to read (a directory in its place): said as such, and unknown all the same.
    r = doctor(hosts[NEW], module(None) + " && mkdir -p /proc/driver/nvidia/version")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "module:   unknown: cannot read /proc/driver/nvidia/version (" in r.stdout, r.stdout
    assert driver_line(r.stdout).startswith(f"driver:   OK: driver {NEW} runs CUDA 13.x"), r.stdout
    # The tests' plain stub (no version in its name) and no module: unknown, and doctor still exits 0.
    plain = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    r = doctor(plain, module(None))
    assert r.returncode == 0 and driver_line(r.stdout).startswith("driver:   UNKNOWN: driver version unknown"), r.stdout


def test_matching_new_driver_is_ok(world):
    _, hosts, _, _ = world
    r = doctor(hosts[NEW], module(NEW))
    assert r.returncode == 0, r.stdout + r.stderr
    assert driver_line(r.stdout) == f"driver:   OK: driver {NEW} runs CUDA 13.x (>= 580 needed for CUDA 13)"


@pytest.mark.slow
@pytest.mark.aarch64
def test_the_aarch64_module_line_and_driver_in_an_arm64_root(scenario, tmp_path):
    """Debian trixie for arm64 (emulated): the kernel module's line as NVIDIA's open module writes it there
    (``... Open Kernel Module for aarch64  <version> ...``) and an aarch64 libcuda installed as NVIDIA
    installs it: doctor reads both, and a driver 580 runs torch's CUDA 13."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), python=AARCH64)
    nvidia = tmp_path / f"nvidia-{NEW}"
    need(driver_stub, nvidia, NEW, "arm64")
    host = need(RootfsHost, scn.host.rootfs, tmp_path / "host", [nvidia])
    line = (f"NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  {NEW}  Release Build  "
            "(dvs-builder@U22-I3-B17-02-5)  Tue Sep 23 09:55:41 UTC 2025")
    setup = ('mount -t tmpfs none "$ROOT/proc/driver" && mkdir "$ROOT/proc/driver/nvidia" && '
             f"printf '%s\\nGCC version:  gcc version 13.3.0\\n' '{line}' > \"$ROOT/proc/driver/nvidia/version\"")
    r = host.run([str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--json"], clean_env(), setup=setup)
    assert r.returncode == 0, r.stdout + r.stderr
    driver = json.loads(r.stdout)["driver"]
    assert driver["module_version"] == NEW and driver["library_version"] == NEW, driver
    assert driver["library"] == str(nvidia / f"libcuda.so.{NEW}") and driver["newest_major"] == 13, driver
    assert driver["verdict"] == "ok", driver


def test_without_a_plan_the_driver_line_names_the_driver_and_why_it_is_not_judged(world, scenario, parts):
    """torch_memory_saver not installed: no runtime is decided, so no CUDA major to judge the driver against.
    The driver line still names the driver the libcuda line shows, and says why there is no verdict, never
    blaming the kernel module's file (the verdict stays "unknown")."""
    _, _, dirs, _ = world
    bare = scenario(tms=None, torch="cu13-pip", pip=(13,), host=("driver",))
    scn = Scenario(bare.venv, need(Host, dirs[NEW].parent / "host-no-tms", [dirs[NEW]]), parts)
    for proc in (module(None), module(NEW)):
        r = doctor(scn, proc)
        assert r.returncode == 1, r.stdout + r.stderr
        line = driver_line(r.stdout)
        assert line.startswith(f"driver:   UNKNOWN: driver {NEW} runs CUDA 13.x at most; not judged: no CUDA "
                               f"runtime was decided for this process"), line
        assert "/proc/driver/nvidia/version" not in line, line


def test_without_libcuda_the_driver_line_says_not_found_where_that_is_why_there_is_no_plan(scenario):
    """A host without the driver library: every build links ``libcuda.so.1``, so the plan stops for it (cause
    ``no-driver``), and the driver line says so, NOT FOUND, with the plan's fix, in the text, the JSON and a
    node's row. Where something else stops the plan first (torch_memory_saver not installed), the missing
    library is said, not judged: UNKNOWN, as before."""
    gone = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=())  # the world's venv, no driver
    r = doctor(gone, module(None))
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(doctor(gone, module(None), None, "--json").stdout)
    assert doc["cause"] == "no-driver" and doc["driver"]["verdict"] == "not-found", doc
    assert doc["driver"]["fix"] == doc["fix"], doc["driver"]
    line = driver_line(r.stdout)
    assert line.startswith("driver:   NOT FOUND: no libcuda.so.1 is found by the loader"), line
    assert line.endswith(f"Fix: {doc['fix']}") and "libcuda:  not found" in r.stdout, r.stdout
    row = rows.node_row("gone", "10.0.0.2", "g" * 16, rows.document_answer(doc), None, gpus=8)
    assert " NOT FOUND " in rows.render([row]).splitlines()[1], rows.render([row])

    bare = scenario(tms=None, torch="cu13-pip", pip=(13,), host=())
    r = doctor(bare, module(None))
    assert r.returncode == 1 and "torch_memory_saver is not installed" in r.stdout, r.stdout + r.stderr
    assert driver_line(r.stdout).startswith("driver:   UNKNOWN: no libcuda.so.1 is found by the loader"), r.stdout
