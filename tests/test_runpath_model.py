"""The model of torch_memory_saver #108 (tests/data/torch_memory_saver-runpath-model.patch) behaves as #108 does.

#108's head (a9403e98 on rishabhsinha17/torch_memory_saver) is the reference, point by point: the
DT_RUNPATH its setup.py gives every CUDA extension, read with this package's ELF reader; what its
configure_subprocess() sets for the same parent (a libcudart mapped or not, LD_LIBRARY_PATH unset, empty or
set, LD_PRELOAD set); the unsuffixed names. The expected values below are those facts, written out; the
comparison with #108's own build is docs/integrations.md's ("The next torch_memory_saver").
"""

from __future__ import annotations

import json
import os
import re
import zipfile

import pytest
from support import clean_env, tms_wheel
from tms_autopreload import elf

MODEL = "0.0.10-source-runpath"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
RUNTIME_DIRS = {12: "nvidia/cuda_runtime/lib", 13: "nvidia/cu13/lib"}

# A parent that calls configure_subprocess(): argv[1] says whether it imports torch (and so maps torch's
# libcudart) or only torch_memory_saver's hooks modules (its package __init__ imports torch), with the
# build it would pick given, as #108's own tests give it.
PARENT = r"""
import json, os, sys, types
site, kind = sys.argv[1], sys.argv[2]
if kind == 'torch':
    import torch
    from torch_memory_saver.hooks import mode_preload
else:
    for name, sub in (('torch_memory_saver', ''), ('torch_memory_saver.hooks', 'hooks')):
        module = types.ModuleType(name)
        module.__path__ = [os.path.join(site, 'torch_memory_saver', sub)]
        sys.modules[name] = module
    from torch_memory_saver.hooks import mode_preload
    mode_preload.get_binary_path_from_package = lambda stem: os.path.join(site, stem + '_cu13.abi3.so')
names = ('LD_PRELOAD', 'LD_LIBRARY_PATH')
before = {k: os.environ.get(k) for k in names}
with mode_preload.configure_subprocess():
    inside = {k: os.environ.get(k) for k in names}
maps = [f[5].strip() for f in (l.split(None, 5) for l in open('/proc/self/maps')) if len(f) == 6]
print(json.dumps({'inside': inside, 'restored': {k: os.environ.get(k) for k in names} == before,
                  'cudart': sorted({m for m in maps if os.path.basename(m).startswith('libcudart.so.')})}))
"""


def major_of(name: str) -> int:
    """The CUDA major a hook file is built for: its ``_cu<N>`` suffix; an unsuffixed name is the cu12 copy."""
    m = re.search(r"_cu(\d+)\.abi3\.so$", name)
    return int(m.group(1)) if m else 12


@pytest.mark.parametrize("build", [MODEL])
def test_every_cuda_extension_carries_108s_runpath(build, tmp_path):
    """#108: ``-Wl,--enable-new-dtags -Wl,-rpath,$ORIGIN/<dir> -Wl,-rpath,$ORIGIN/../<dir>`` on both hook
    modes of both majors: one DT_RUNPATH ``$ORIGIN/<dir>:$ORIGIN/../<dir>``, no DT_RPATH; the unsuffixed
    names are byte copies of the cu12 builds, so they carry cu12's."""
    with zipfile.ZipFile(tms_wheel(build)) as z:
        names = sorted(n for n in z.namelist() if n.endswith(".abi3.so"))
        z.extractall(tmp_path, names)
    assert names == sorted(f"torch_memory_saver_hook_mode_{mode}{suffix}.abi3.so"
                           for mode in ("preload", "torch") for suffix in ("", "_cu12", "_cu13"))
    for name in names:
        major = major_of(name)
        info = elf.read_dynamic(str(tmp_path / name))
        rel = RUNTIME_DIRS[major]
        assert (info.rpath, info.runpath) == ((), (f"$ORIGIN/{rel}", f"$ORIGIN/../{rel}")), name
        assert [n for n in info.needed if n.startswith("libcud")] == ["libcuda.so.1", f"libcudart.so.{major}"], name
        if "_cu" not in name:
            assert (tmp_path / name).read_bytes() == (tmp_path / name.replace(".abi3", "_cu12.abi3")).read_bytes()


# (the parent, its LD_PRELOAD and LD_LIBRARY_PATH) -> what configure_subprocess() sets inside the block;
# "{hook}" is the cu13 build, "{cudart}" torch's libcudart directory as /proc/self/maps names it.
CASES = [
    ("torch", {}, {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": "{cudart}"}),
    ("torch", {"LD_LIBRARY_PATH": "/existing/lib"}, {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": "{cudart}:/existing/lib"}),
    ("torch", {"LD_LIBRARY_PATH": ""}, {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": "{cudart}"}),
    ("torch", {"LD_PRELOAD": "/other/lib.so"}, {"LD_PRELOAD": "{hook}:/other/lib.so", "LD_LIBRARY_PATH": "{cudart}"}),
    ("no-cudart", {}, {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": None}),
    ("no-cudart", {"LD_LIBRARY_PATH": "/existing/lib"}, {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": "/existing/lib"}),
]


def test_configure_subprocess_sets_what_108s_sets(real_torch):
    """For each parent, the values inside the block, and both restored after it: the hook first on
    LD_PRELOAD (other entries kept); the directory of the libcudart mapped in the parent first on
    LD_LIBRARY_PATH when there is one (no trailing ':' when the variable was unset or empty), and
    LD_LIBRARY_PATH untouched when none is mapped: no fallback to the pip runtime beside the hook."""
    scn = real_torch(("driver",), tms=MODEL)
    cudart = os.path.realpath(scn.site / "nvidia" / "cu13" / "lib")
    for kind, env, want in CASES:
        r = scn.host.run([str(scn.venv.python), "-c", PARENT, str(scn.site), kind], clean_env(**env))
        assert r.returncode == 0, r.stderr[-3000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        assert got["cudart"] == ([os.path.join(cudart, "libcudart.so.13")] if kind == "torch" else []), got
        expected = {k: v.format(hook=scn.site / CU13, cudart=cudart) if v else v for k, v in want.items()}
        assert got["inside"] == expected, (kind, env, got)
        assert got["restored"], (kind, env, got)


def test_the_unsuffixed_names_are_never_picked_for_cuda(real_torch):
    """#108 leaves the pick alone: for CUDA torch, get_binary_path_from_package() takes ``_cu<major>``, so
    the unsuffixed copies (cu12's bytes, cu12's RUNPATH) are only for those who name them."""
    scn = real_torch(("driver",), tms=MODEL)
    code = ("import torch\nfrom torch_memory_saver import utils\nout = {}\nfor v in ('12.9', '13.0'):\n"
            "    torch.version.cuda = v\n    out[v] = str(utils.get_binary_path_from_package("
            "'torch_memory_saver_hook_mode_preload'))\nprint(out)")
    r = scn.run(["-c", code])
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str({"12.9": str(scn.site / "torch_memory_saver_hook_mode_preload_cu12.abi3.so"),
                                    "13.0": str(scn.site / CU13)})
