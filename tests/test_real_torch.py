"""Issues 2 and 4: real torch 2.14.1+cu130 imported in a flagged process.

The driver is the only stand-in. The hook must be mapped before torch is imported, the process
must end with exactly one libcudart (torch's own, from nvidia/cu13/lib) even when the host also
has a system CUDA 13, ``cudaMalloc`` in the global scope must resolve to the hook, and
torch_memory_saver's own preload-mode check must accept the environment.
"""

from __future__ import annotations

import json
import os

import pytest

PROBE = r"""
import ctypes, json, os
def maps():
    return sorted({f[5].strip() for f in (l.split(None, 5) for l in open('/proc/self/maps'))
                   if len(f) == 6 and '.so' in f[5]})
hook_before_torch = [m for m in maps() if 'torch_memory_saver' in m]
import torch
after = maps()
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
                  'cudaMalloc_in': os.path.realpath(info.dli_fname.decode()), 'accepted': accepted}))
"""


@pytest.mark.parametrize("host", [("driver",), ("driver", "cuda13")], ids=["pip-runtime-only", "plus-system-cuda13"])
def test_real_torch_one_runtime_and_the_hook_wins(real_torch, host):
    scn = real_torch(host)
    r = scn.flagged(PROBE)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    hook = str(scn.site / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    assert out["torch"].startswith("2.14.1") and out["cuda"] == "13.0"
    assert out["hook_before_torch"] == [hook]
    assert out["cudart"] == [str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")]
    assert out["cudaMalloc_in"] == hook
    assert out["accepted"] == hook


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
