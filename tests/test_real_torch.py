"""Real torch (2.14.1+cu130, and today's 2.15.0+cu132 where it proves something) imported in a flagged process.

The driver is the only stand-in. The hook must be mapped before torch is imported, the process
must end with exactly one libcudart (torch's own, from nvidia/cu13/lib) even when the host also
has a system CUDA 13, the loader must bind torch's own references to ``cudaMalloc`` and ``cudaFree``
(libc10_cuda.so: its CUDA caching allocator) to the hook, and torch_memory_saver's own preload-mode
check must accept the environment. ``doctor --deep`` must say so, and must say "bypassed" with the
reason for environments that do not hook torch. With NVIDIA's CUDA 12 runtime wheel installed beside it,
torch's own ``_preload_cuda_deps`` maps that wheel's copy too (nothing binds to it): ``doctor`` predicts it
and ``--deep`` sees it, and both call the node fine; an override that makes the hook use that copy is not.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import TORCH_CUDA, TORCHES, assert_applied, mode_env
from support import MAPPED, REEXECD, allocator_bindings, pip_fix

PROBE = REEXECD + MAPPED + r"""
import ctypes, json, os
hook_before_torch = [m for m in mapped('.so') if 'torch_memory_saver' in m]
import torch
after = mapped('.so')
libc = ctypes.CDLL(None)
libc.dlsym.restype = ctypes.c_void_p
libc.dlsym.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
class DlInfo(ctypes.Structure):
    _fields_ = [('dli_fname', ctypes.c_char_p), ('dli_fbase', ctypes.c_void_p),
                ('dli_sname', ctypes.c_char_p), ('dli_saddr', ctypes.c_void_p)]
addr = libc.dlsym(None, b'cudaMalloc')
info = DlInfo()
libc.dladdr(ctypes.c_void_p(addr), ctypes.byref(info))
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
accepted = HookUtilModePreload().get_path_binary()
ctypes.CDLL(accepted)  # what torch_memory_saver's BinaryWrapper does with it
print(json.dumps({'torch': torch.__version__, 'cuda': torch.version.cuda, 'hook_before_torch': hook_before_torch,
                  'cudart': [m for m in after if os.path.basename(m).startswith('libcudart')],
                  'cudaMalloc_in': os.path.realpath(info.dli_fname.decode()), 'accepted': accepted,
                  'reexecd': reexecd()}))
"""


HOSTS = [("driver",), ("driver", "cuda13")]
HOST_IDS = ["pip-runtime-only", "plus-system-cuda13"]
HOOK = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
# A released wheel, and torch_memory_saver built here with an $ORIGIN-relative RUNPATH (tools/tms_source.py).
RUNPATH_BUILD = "0.0.10-source-runpath"
TMS = ["0.0.9.post1", RUNPATH_BUILD]


@pytest.mark.parametrize("torch", TORCHES)
@pytest.mark.parametrize("host", HOSTS, ids=HOST_IDS)
def test_real_torch_one_runtime_and_the_hook_wins(real_torch, host, tmp_path, mode, torch):
    scn = real_torch(host, torch=torch)
    # LD_BIND_NOW binds every reference as its library loads, so the log shows torch's own bindings.
    r = scn.flagged(PROBE, {"LD_BIND_NOW": "1", "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(tmp_path / "bind"),
                            **mode_env(mode)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    hook = str(scn.site / HOOK)
    assert_applied(mode, out["reexecd"], out["hook_before_torch"], hook)
    assert out["torch"].startswith(torch + "+") and out["cuda"] == TORCH_CUDA[torch]
    assert out["hook_before_torch"] == [hook]
    assert out["cudart"] == [str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")]
    assert out["cudaMalloc_in"] == hook
    assert out["accepted"] == hook
    bound = allocator_bindings(tmp_path)
    for lib in ("libc10_cuda.so", "libtorch_cuda.so"):
        assert bound[lib] == {"cudaMalloc": hook, "cudaFree": hook}, bound


def deep(scn, env=None, *args, tmp=None):
    r = scn.run(["-m", "tms_autopreload", "doctor", "--deep", *args],
                {**(env or {}), **({"TMPDIR": str(tmp)} if tmp else {})})
    assert r.returncode in (0, 1), r.stderr
    return r


# Both released-or-built torch_memory_saver kinds with the first torch; today's torch with the newest release.
DEEP_CASES = [(TORCHES[0], tms) for tms in TMS] + [(TORCHES[-1], "0.0.10")]


@pytest.mark.parametrize("torch, tms", DEEP_CASES)
@pytest.mark.parametrize("host", HOSTS, ids=HOST_IDS)
def test_doctor_deep_proves_torch_allocator_binds_to_the_hook(real_torch, host, torch, tms, mode, tmp_path):
    scn = real_torch(host, tms, torch=torch)
    r = deep(scn, None, "--mode", mode, tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert "torch's CUDA allocator (libc10_cuda.so): cudaMalloc, cudaFree -> hook" in lines
    assert "libtorch_cuda.so: cudaMalloc, cudaFree -> hook" in lines
    assert any(line.startswith("verdict:  INTERCEPTED") for line in lines), r.stdout
    doc = json.loads(deep(scn, None, "--json", "--mode", mode, tmp=tmp_path).stdout)
    assert doc["ok"] and doc["hook_mapped"] and doc["interposed"] == ["cudaFree", "cudaMalloc"]
    assert doc["runtime_libraries_mapped"] == [str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")]
    assert {lib["name"]: lib["status"] for lib in doc["libraries"]}["libc10_cuda.so"] == "intercepted"
    assert doc["log_bytes"] > 1_000_000 and isinstance(doc["seconds"], float)  # the key is documented; its value
    # is a time, which no test bounds (tools/bench.py measures it)
    assert not list(tmp_path.iterdir())  # the log is gone (doctor --deep wrote it under this TMPDIR)


def test_doctor_deep_without_the_preload_says_bypassed(real_torch):
    """A broken plan: nothing preloaded. Every reference binds to libcudart, and the reason says why."""
    scn = real_torch(("driver",))
    r = deep(scn, None, "--as-is")
    assert r.returncode == 1, r.stdout + r.stderr
    assert ("torch's CUDA allocator (libc10_cuda.so): cudaMalloc, cudaFree -> libcudart.so.13 (BYPASSED: bound to"
            in r.stdout)
    assert "the hook is not loaded in this process" in r.stdout and "verdict:  BYPASSED" in r.stdout


def test_doctor_deep_hook_bound_to_a_second_libcudart_fails(real_torch):
    """A broken plan: the hook preloaded without the LD_LIBRARY_PATH binding on a host with a system
    CUDA 13. The allocator calls reach the hook, but the hook's libcudart.so.13 is the system copy, which
    torch's libraries then bind too, while torch's by-path load maps its own wheel copy: the copy that takes
    the calls is not the one torch's install brings, so not proven (cause second-runtime-bound)."""
    scn = real_torch(("driver", "cuda13"))
    r = deep(scn, {"LD_PRELOAD": str(scn.site / HOOK)}, "--as-is")
    assert r.returncode == 1, r.stdout + r.stderr
    system = str(scn.parts.rt[13] / "libcudart.so.13")
    assert "verdict:  NOT PROVEN: 2 runtime libraries are mapped" in r.stdout
    assert f"the hook's own calls were bound to {system}" in r.stdout
    assert "cause:    second-runtime-bound; fix: start with the plan instead of this environment" in r.stdout


def test_doctor_shows_what_each_candidate_interposes(real_torch):
    doc = real_torch(("driver",)).doctor()
    got = {os.path.basename(c["path"]): c["interposes"] for c in doc["candidates"]}
    assert got[HOOK] == ["cudaFree", "cudaMalloc"]


@pytest.mark.parametrize("torch", TORCHES)
def test_real_torch_doctor_reads_torch_without_importing_it(real_torch, torch):
    scn = real_torch(("driver", "cuda13"), torch=torch)
    doc = scn.doctor()
    assert doc["ok"], doc["error"]
    rt = doc["runtime"]
    assert rt["torch_version"].startswith(torch + "+") and rt["major"] == 13
    assert rt["library"] == str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    assert rt["library_rule"] == "DT_RPATH"
    # What torch/__init__.py then loads by path is that same file: one copy, no second one.
    assert rt["library_why"] == ("libtorch_global_deps.so finds it by DT_RPATH; torch/__init__.py's "
                                 "_preload_cuda_deps then loads this same file by path (RTLD_LOCAL): one copy")
    assert rt["second"] is None and rt["split"] is None
    # The system copy would win for the hook by default, so the plan puts torch's dir first.
    assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(scn.site / "nvidia" / "cu13" / "lib")
    r = scn.run(["-c", "import sys, tms_autopreload.decision as p; p.survey(); print('torch' in sys.modules)"])
    assert r.stdout.strip() == "False", r.stderr
    assert os.path.basename(doc["plan"]["build"]) == "torch_memory_saver_hook_mode_preload_cu13.abi3.so"


def test_runpath_build_needs_no_binding_beside_a_system_cuda13(real_torch):
    """A hook whose RUNPATH names torch's pip runtime finds it before the system copy in ld.so.cache,
    so the plan leaves LD_LIBRARY_PATH alone where a released build needs torch's directory first."""
    doc = real_torch(("driver", "cuda13"), RUNPATH_BUILD).doctor()
    assert doc["ok"], doc["error"]
    assert "LD_LIBRARY_PATH" not in doc["plan"]["env"], doc["plan"]
    chosen = next(c for c in doc["candidates"] if c["status"] == "chosen")
    assert chosen["reason"].endswith(f"binds libcudart.so.13 to {doc['runtime']['library']}"), chosen


CUDART_AFTER_IMPORT = MAPPED + """
import json, os, torch
print(json.dumps(sorted({m for m in mapped('.so') if os.path.basename(m).startswith('libcudart')})))
"""


@pytest.mark.parametrize("torch", TORCHES)
def test_second_runtime_torch_maps_by_path_is_predicted_and_takes_no_binding(real_torch, torch, tmp_path):
    """NVIDIA's CUDA 12 runtime wheel beside a CUDA 13 torch: torch's own _preload_cuda_deps maps its
    libcudart.so.12 (nvidia/cuda_runtime/lib is globbed first), flagged or not. ``doctor`` predicts exactly
    what torch maps, names the wheel and the fix; ``--deep`` sees nothing bind to that copy; both call the
    node fine, and the flagged start is hooked with torch's own copy."""
    scn = real_torch(("driver",), "0.0.10", torch=torch, pip=(12,))
    cu13 = str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    cu12 = str(scn.site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    doc = scn.doctor()
    assert doc["ok"], doc["error"]
    assert doc["runtime"]["library"] == cu13 and doc["runtime"]["second"]["path"] == cu12, doc["runtime"]
    fix = pip_fix(scn.venv.python, "uninstall", "nvidia-cuda-runtime-cu12")
    assert doc["runtime"]["second"]["fix"] == fix
    assert any(cu12 in w and fix in w for w in doc["warnings"]), doc["warnings"]
    unflagged = scn.run(["-c", CUDART_AFTER_IMPORT])
    assert json.loads(unflagged.stdout.strip().splitlines()[-1]) == sorted([cu12, cu13]), unflagged.stderr[-3000:]
    r = scn.flagged(PROBE)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hook_before_torch"] == [str(scn.site / HOOK)] and out["cudaMalloc_in"] == str(scn.site / HOOK)
    assert sorted(out["cudart"]) == sorted([cu12, cu13]), out
    r = deep(scn, None, "--json", tmp=tmp_path)
    ev = json.loads(r.stdout)
    assert r.returncode == 0 and ev["ok"], ev["verdict"]
    assert ev["cause"] == "idle-runtime" and ev["fix"] == fix, ev
    assert [i["path"] for i in ev["idle_runtimes"]] == [cu12] and ev["runtime_bound_by"][cu12] == [], ev
    assert any(os.path.basename(b) == "libc10_cuda.so" for b in ev["runtime_bound_by"][cu13]), ev
    text = deep(scn, None, tmp=tmp_path).stdout
    assert f"cause:    idle-runtime; fix: {fix}" in text, text


def test_override_to_the_cu12_wheel_splits_the_hook_from_torch_and_is_said(real_torch, tmp_path):
    """TMS_AUTOPRELOAD_CUDA_MAJOR=12 on CUDA 13 torch with the CUDA 12 wheel: the flagged start does as asked
    (the cu12 hook) and says what it does; doctor calls it not ok; --deep sees two copies take bindings
    (torch's libraries the CUDA 13 one, the hook's own calls the CUDA 12 one), with the cause and the fix."""
    scn = real_torch(("driver",), "0.0.10", torch=TORCHES[-1], pip=(12,))
    env = {"TMS_AUTOPRELOAD_CUDA_MAJOR": "12"}
    doc = scn.doctor(env)
    assert not doc["ok"] and doc["runtime"]["split"]["torch_library"] == "libcudart.so.13", doc["runtime"]
    warning = next(w for w in doc["warnings"] if "makes the hook use libcudart.so.12" in w)
    r = scn.flagged("import torch", env)
    assert r.returncode == 0 and f"tms-autopreload: warning: {warning}" in r.stderr.splitlines(), r.stderr
    ev = json.loads(deep(scn, env, "--json", tmp=tmp_path).stdout)
    assert not ev["ok"] and ev["cause"] == "second-runtime-bound", ev
    assert ev["fix"] == "`unset TMS_AUTOPRELOAD_CUDA_MAJOR` to use torch's runtime", ev
    cu12 = str(scn.site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    assert ev["hook_bound_to"] == [cu12] and ev["runtime_bound_by"][cu12], ev
