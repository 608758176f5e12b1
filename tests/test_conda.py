"""conda's layout as conda ships it: an interpreter whose DT_RPATH is ``$ORIGIN/../lib``.

conda-build and rattler-build set an environment's executables' search path with ``patchelf
--force-rpath`` (DT_RPATH), and glibc searches the executable's DT_RPATH for a preloaded object's
DT_NEEDED (when that object has no DT_RUNPATH) before LD_LIBRARY_PATH. So in a conda environment
the hook's ``libcudart.so.N`` binds to ``$PREFIX/lib`` whatever LD_LIBRARY_PATH says, and a
non-Python child (bash, /bin/sh: no DT_RPATH) finds nothing there.

Each world here: a venv made with ``--copies`` whose interpreter is given DT_RPATH
``$ORIGIN/../lib`` with the real ``patchelf --force-rpath``; NVIDIA's real ``libcudart.so.N`` (from the
runtime wheel) in ``$PREFIX/lib``, as conda's ``cuda-cudart`` puts it; torch either as pip installs it
(a stand-in linked like the wheel, DT_RPATH into NVIDIA's runtime wheel, which is installed) or as
conda-forge builds it (DT_RPATH ``$ORIGIN/../../../..``, that is ``$PREFIX/lib``, and no runtime
wheel); the real torch_memory_saver wheels; a host whose loader cache lists the driver stub only.
Real torch 2.14.1 (CUDA 13) gets the same interpreter treatment in a private copy of its venv.

A flagged start must map exactly one libcudart (read from /proc/self/maps after torch's own
by-path load), pass torch_memory_saver's own preload check (its released code), and start
``bash -c true`` and ``/bin/sh -c true``; where no plan holds, stop with exit 78 naming the fix.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import support
from conftest import DEFAULT_PYTHON, Scenario, need
from support import MAPPED, Host, Venv, assert_stopped

RUNTIME_MEMBER = {12: "nvidia/cuda_runtime/lib/libcudart.so.12", 13: "nvidia/cu13/lib/libcudart.so.13"}
PIP_RPATH = {12: "$ORIGIN/../../nvidia/cuda_runtime/lib", 13: "$ORIGIN/../../nvidia/cu13/lib"}
CONDA_FORGE_RPATH = "$ORIGIN/../../../.."  # site-packages/torch/lib -> $PREFIX/lib
TORCH_CUDA = {12: "12.9", 13: "13.0"}

# What a flagged process reports: torch's own by-path load (torch 2.14.1's _load_global_deps: after
# libtorch_global_deps.so, when any libcudart is mapped, _preload_cuda_deps loads the first
# nvidia/cuda_runtime/lib or nvidia/cu<major>/lib libcudart on sys.path by path), done here for the
# stand-in, which cannot be imported; then torch_memory_saver's own preload check, as test_areal does;
# then the libcudart copies mapped and two non-Python children.
PROBE = MAPPED + r"""
import ctypes, glob, json, os, subprocess, sys, types
real = sys.argv[1] == 'real'
site = next(p for p in sys.path if p.endswith('site-packages'))
if real:
    import torch
    major = torch.version.cuda.split('.')[0]
else:
    major = sys.argv[2]
    ctypes.CDLL(os.path.join(site, 'torch', 'lib', 'libtorch_global_deps.so'), mode=ctypes.RTLD_GLOBAL)
    if mapped('libcudart.so'):
        for path in sys.path:
            found = (glob.glob(os.path.join(path, 'nvidia', 'cuda_runtime', 'lib', 'libcudart.so.*[0-9]'))
                     + glob.glob(os.path.join(path, 'nvidia', f'cu{major}', 'lib', 'libcudart.so.*[0-9]')))
            if found:
                ctypes.CDLL(found[0])
                break
    package = types.ModuleType('torch_memory_saver')
    package.__path__ = [os.path.join(site, 'torch_memory_saver')]
    sys.modules['torch_memory_saver'] = package
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
try:
    ctypes.CDLL(HookUtilModePreload().get_path_binary())  # what its BinaryWrapper does with the answer
    verdict = 'accepted'
except (AssertionError, OSError) as exc:
    verdict = f'refused: {exc}'
maps = mapped()
children = {}
for argv in (['bash', '-c', 'true'], ['/bin/sh', '-c', 'true']):
    r = subprocess.run(argv, capture_output=True, text=True)
    children[' '.join(argv)] = [r.returncode, r.stderr[-500:]]
print(json.dumps({'verdict': verdict, 'children': children,
                  'cudart': sorted(m for m in maps if os.path.basename(m).startswith('libcudart')),
                  'hooks': sorted(m for m in maps if 'torch_memory_saver' in os.path.basename(m)),
                  'preload': os.environ.get('LD_PRELOAD')}))
"""


def conda_interpreter(prefix: Path) -> None:
    """Give the environment's interpreter files conda's DT_RPATH, as conda-build does (patchelf --force-rpath)."""
    if shutil.which("patchelf") is None:
        raise support.SetupError("needs patchelf (Debian: apt-get install patchelf)")
    for name in os.listdir(prefix / "bin"):
        path = prefix / "bin" / name
        if name.startswith("python") and path.is_file() and not path.is_symlink():
            support.run(["patchelf", "--force-rpath", "--set-rpath", "$ORIGIN/../lib", str(path)])


def conda_runtime(prefix: Path, major: int) -> Path:
    """NVIDIA's real libcudart in $PREFIX/lib, as conda's cuda-cudart installs it (its own copy)."""
    return support.extract(support.runtime_wheel(major), RUNTIME_MEMBER[major], prefix / "lib")[0]


@pytest.fixture(scope="module")
def conda(parts, tmp_path_factory):
    """Factory: ``conda(major, torch="pip"|"conda-forge", tms=...)``: a conda-style prefix on a driver-only host;
    ``name``: the prefix directory's name."""
    made: dict[tuple, Scenario] = {}

    def make(major: int, torch: str, tms: str, name: str = "prefix") -> Scenario:
        key = (major, torch, tms, name)
        if key not in made:
            root = tmp_path_factory.mktemp(f"conda-{major}-{torch}-{tms}")
            prefix = root / name
            support.run([need(support.locate_python, DEFAULT_PYTHON), "-m", "venv", "--copies", "--without-pip",
                         str(prefix)])
            need(conda_interpreter, prefix)
            venv = Venv(prefix)
            venv.install(parts.own_wheel, support.tms_wheel(tms),
                         *([support.runtime_wheel(major)] if torch == "pip" else []))
            conda_runtime(prefix, major)
            rpath = PIP_RPATH[major] if torch == "pip" else CONDA_FORGE_RPATH
            deps = support.global_deps(root / "deps" / "libtorch_global_deps.so", parts.rt[major],
                                       f"libcudart.so.{major}", rpath)
            support.write_torch_standin(venv.site, cuda=TORCH_CUDA[major], hip=None, deps_lib=deps)
            made[key] = Scenario(venv, need(Host, root / "host", [parts.stub]), parts)
        return made[key]

    return make


def flagged_probe(scn: Scenario, kind: str, major: int, tmp: Path) -> "tuple[subprocess.CompletedProcess, dict]":
    probe = tmp / "probe.py"
    probe.write_text(PROBE)
    r = scn.run([str(probe), kind, str(major)], {"SLIME_OFFLOAD_TRAIN": "1"}, timeout=300)
    return r, (json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {})


def assert_one_runtime_and_children(r, out: dict, expected_cudart: Path) -> None:
    assert r.returncode == 0, r.stderr[-3000:]
    assert out["verdict"] == "accepted", out
    assert [os.path.realpath(p) for p in out["cudart"]] == [os.path.realpath(expected_cudart)], out["cudart"]
    assert len(out["hooks"]) == 1, out
    assert out["children"] == {"bash -c true": [0, ""], "/bin/sh -c true": [0, ""]}, out["children"]


@pytest.mark.parametrize("major", [pytest.param(12, marks=pytest.mark.slow), 13])
def test_pip_torch_in_conda_binds_torch_runtime_by_path(conda, major, tmp_path):
    """slime's build_conda.sh: conda's libcudart in $PREFIX/lib, pip torch with NVIDIA's runtime wheel.
    With torch_memory_saver 0.0.10 the plan preloads torch's own libcudart by path beside the hook."""
    scn = conda(major, "pip", "0.0.10")
    wheel_copy = scn.site / RUNTIME_MEMBER[major]
    r, out = flagged_probe(scn, "standin", major, tmp_path)
    assert_one_runtime_and_children(r, out, wheel_copy)
    assert out["preload"].split(":")[1] == str(wheel_copy), out["preload"]
    doc = scn.doctor()
    assert doc["ok"] and doc["runtime"]["library"] == str(wheel_copy), doc
    assert "by path" in doc["runtime"]["library_why"], doc["runtime"]
    text = scn.run(["-m", "tms_autopreload", "doctor"]).stdout
    assert f"would bind to {scn.venv.path}/lib/libcudart.so.{major} (the interpreter's DT_RPATH)" in text, text
    binding = next(line for line in text.splitlines() if line.startswith("binding:"))
    assert "(not as found: its libcudart" in binding and "; not LD_LIBRARY_PATH: " in binding, binding


# A real LD_PRELOAD a user already has: coreutils' stdbuf preloads it (AReaL #1482 starts its workers so).
STDBUF = "/usr/libexec/coreutils/libstdbuf.so"


def test_the_runtime_preloaded_by_path_keeps_the_users_own_preload(conda, tmp_path):
    """The plan that preloads torch's libcudart by path beside the hook keeps what the user's LD_PRELOAD
    held: hook, runtime, then ``libstdbuf.so``, each mapped once, torch_memory_saver's check accepting it and
    the children starting with it."""
    if not os.path.exists(STDBUF):
        pytest.skip(f"needs {STDBUF} (Debian: apt-get install coreutils)")
    scn = conda(13, "pip", "0.0.10")
    wheel_copy = scn.site / RUNTIME_MEMBER[13]
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    r = scn.run([str(probe), "standin", "13"], {"SLIME_OFFLOAD_TRAIN": "1", "LD_PRELOAD": STDBUF}, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert_one_runtime_and_children(r, out, wheel_copy)
    assert out["preload"].split(":")[1:] == [str(wheel_copy), STDBUF], out["preload"]
    maps = scn.run(["-c", MAPPED + f"print(mapped({os.path.basename(STDBUF)!r}))"],
                   {"LD_PRELOAD": out["preload"]})
    assert maps.stdout.split() == [f"[{STDBUF!r}]"], (maps.stdout, maps.stderr)


@pytest.mark.slow  # a conda prefix of its own
def test_an_environment_whose_path_names_torch_memory_saver_is_told_to_move(conda):
    """The plan that holds in a conda environment preloads the runtime by path, and torch_memory_saver's check
    counts every LD_PRELOAD entry whose name holds 'torch_memory_saver': in an environment whose path does,
    the start stops and the Fix says to reinstall under another path (TMS_AUTOPRELOAD_PATH could not help)."""
    scn = conda(13, "pip", "0.0.10", name="torch_memory_saver_env")
    message = assert_stopped(scn.flagged("print('user code ran')"),
                             "under a path without 'torch_memory_saver' in it")
    assert "set TMS_AUTOPRELOAD_PATH to a build that loads" not in message, message


@pytest.mark.parametrize("major", [pytest.param(12, marks=pytest.mark.slow), 13])
def test_conda_forge_torch_children_start(conda, major, tmp_path):
    """conda-forge's torch finds the runtime only in $PREFIX/lib: the interpreter finds it by its DT_RPATH,
    a bash child has none. The plan preloads that copy by path (never all of $PREFIX/lib on LD_LIBRARY_PATH)."""
    scn = conda(major, "conda-forge", "0.0.10")
    conda_copy = scn.venv.path / "lib" / f"libcudart.so.{major}"
    r, out = flagged_probe(scn, "standin", major, tmp_path)
    assert_one_runtime_and_children(r, out, conda_copy)
    doc = scn.doctor()
    assert str(scn.venv.path / "lib") not in doc["plan"]["env"].get("LD_LIBRARY_PATH", ""), doc["plan"]


@pytest.mark.parametrize("torch", ["pip", pytest.param("conda-forge", marks=pytest.mark.slow)])
@pytest.mark.parametrize("major", [pytest.param(12, marks=pytest.mark.slow), 13])
def test_no_plan_holds_for_single_path_tms(conda, major, torch, tmp_path):
    """torch_memory_saver 0.0.9.post1 reads LD_PRELOAD as one path, and no other binding holds here:
    exit 78 before any user code, naming the cause and the torch_memory_saver that accepts a plan."""
    scn = conda(major, torch, "0.0.9.post1")
    r = scn.flagged("print('user code ran')")
    message = assert_stopped(r, "DT_RPATH", "pip install 'torch-memory-saver>=0.0.10'")
    assert message.startswith(f"tms-autopreload: no plan maps exactly one libcudart.so.{major} (the copy torch uses)")
    assert "single path" in message, message


@pytest.mark.slow
def test_real_torch_in_conda(parts, tmp_path_factory):
    """Real torch 2.14.1 (CUDA 13) from its venv, its interpreter given conda's DT_RPATH, conda's libcudart
    in $PREFIX/lib: after ``import torch`` one libcudart (the wheel's), the real check accepts, children start."""
    shared = need(support.torch_venv, support.find_python(DEFAULT_PYTHON))
    root = tmp_path_factory.mktemp("conda-real-torch")
    venv = need(support.private_copy, shared, root / "prefix")
    for name in os.listdir(venv.path / "bin"):  # the copy's interpreter: a file of its own, as conda's is
        path = venv.path / "bin" / name
        if name.startswith("python") and path.is_symlink():
            real = os.path.realpath(path)
            path.unlink()
            shutil.copy2(real, path)
    need(conda_interpreter, venv.path)
    need(venv.install, parts.own_wheel, support.tms_wheel("0.0.10"))
    conda_runtime(venv.path, 13)
    scn = Scenario(venv, need(Host, root / "host", [parts.stub]), parts)
    r, out = flagged_probe(scn, "real", 13, root)
    assert_one_runtime_and_children(r, out, venv.site / RUNTIME_MEMBER[13])
