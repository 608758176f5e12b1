"""Real torch 2.14.1+cu130 imported in a flagged process.

The driver is the only stand-in. The hook must be mapped before torch is imported, the process
must end with exactly one libcudart (torch's own, from nvidia/cu13/lib) even when the host also
has a system CUDA 13, the loader must bind torch's own references to ``cudaMalloc`` and ``cudaFree``
(libc10_cuda.so: its CUDA caching allocator) to the hook, and torch_memory_saver's own preload-mode
check must accept the environment. ``doctor --deep`` must say so, and must say "bypassed" with the
reason for environments that do not hook torch.
"""

from __future__ import annotations

import json
import os

import pytest
from conftest import assert_applied, mode_env
from support import MAPPED, REEXECD, allocator_bindings

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


@pytest.mark.parametrize("host", HOSTS, ids=HOST_IDS)
def test_real_torch_one_runtime_and_the_hook_wins(real_torch, host, tmp_path, mode):
    scn = real_torch(host)
    # LD_BIND_NOW binds every reference as its library loads, so the log shows torch's own bindings.
    r = scn.flagged(PROBE, {"LD_BIND_NOW": "1", "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(tmp_path / "bind"),
                            **mode_env(mode)})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    hook = str(scn.site / HOOK)
    assert_applied(mode, out["reexecd"], out["hook_before_torch"], hook)
    assert out["torch"].startswith("2.14.1") and out["cuda"] == "13.0"
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


@pytest.mark.parametrize("tms", TMS)
@pytest.mark.parametrize("host", HOSTS, ids=HOST_IDS)
def test_doctor_deep_proves_torch_allocator_binds_to_the_hook(real_torch, host, tms, mode, tmp_path):
    scn = real_torch(host, tms)
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
    CUDA 13. The allocator calls reach the hook, but the hook forwards into the system copy while
    torch loads its own: two runtimes, not proven."""
    scn = real_torch(("driver", "cuda13"))
    r = deep(scn, {"LD_PRELOAD": str(scn.site / HOOK)}, "--as-is")
    assert r.returncode == 1, r.stdout + r.stderr
    system = str(scn.parts.rt[13] / "libcudart.so.13")
    assert "verdict:  NOT PROVEN: 2 runtime libraries are mapped" in r.stdout
    assert f"the hook's own calls were bound to {system}" in r.stdout


def test_doctor_shows_what_each_candidate_interposes(real_torch):
    doc = real_torch(("driver",)).doctor()
    got = {os.path.basename(c["path"]): c["interposes"] for c in doc["candidates"]}
    assert got[HOOK] == ["cudaFree", "cudaMalloc"]


def test_real_torch_doctor_reads_torch_without_importing_it(real_torch):
    scn = real_torch(("driver", "cuda13"))
    doc = scn.doctor()
    assert doc["ok"], doc["error"]
    rt = doc["runtime"]
    assert rt["torch_version"].startswith("2.14.1") and rt["major"] == 13
    assert rt["library"] == str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    assert rt["library_rule"] == "DT_RPATH"
    # The system copy would win for the hook by default, so the plan puts torch's dir first.
    assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(scn.site / "nvidia" / "cu13" / "lib")
    r = scn.run(["-c", "import sys, tms_autopreload.plan as p; p.survey(); print('torch' in sys.modules)"])
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
