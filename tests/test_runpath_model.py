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
from support import MAPPED, clean_env, tms_wheel
from tms_autopreload import elf

MODEL = "0.0.10-source-runpath"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
RUNTIME_DIRS = {12: "nvidia/cuda_runtime/lib", 13: "nvidia/cu13/lib"}

# A parent that calls configure_subprocess(): argv[1] says whether it imports torch (and so maps torch's
# libcudart) or only torch_memory_saver's hooks modules (its package __init__ imports torch), with the
# build it would pick given, as #108's own tests give it.
PARENT = MAPPED + r"""
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
maps = mapped()
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
    ("torch", {"LD_LIBRARY_PATH": "/existing/lib"},
     {"LD_PRELOAD": "{hook}", "LD_LIBRARY_PATH": "{cudart}:/existing/lib"}),
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


# ---------------------------------------------------------------- what a DT_RUNPATH hook changes

def _conda_like(root, parts):
    """A conda-style prefix: ``bin/python-like`` with DT_RPATH ``$ORIGIN/../lib`` (conda-build and
    rattler-build write DT_RPATH) and the CUDA 13 runtime in ``lib/``, as conda's ``cuda-cudart`` puts it."""
    from support import cc

    (root / "lib").mkdir(parents=True)
    (root / "lib" / "libcudart.so.13").write_bytes((parts.rt[13] / "libcudart.so.13").read_bytes())
    exe = cc(root / "bin" / "python-like", "int main(void) { return 0; }\n", "-Wl,--disable-new-dtags",
             "-Wl,-rpath,$ORIGIN/../lib", shared=False)
    assert elf.read_dynamic(str(exe)).rpath == ("$ORIGIN/../lib",)
    return exe


def _hook(build: str, dest):
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(tms_wheel(build)) as z:
        (dest / CU13).write_bytes(z.read(CU13))
    (dest / CU13).chmod(0o755)
    return dest / CU13


def _predicted(host, exe, hook, llp: str):
    """(rule, path) the loader model gives for the hook's libcudart.so.13 under ``exe`` on ``host``."""
    from tms_autopreload import ldcache
    from tms_autopreload.ldso import Loader, Object

    info = elf.read_dynamic(str(exe))
    loader = Loader(Object(str(exe), info), llp, ldcache.load(info.machine, str(host.cache)))
    found = loader.find("libcudart.so.13", Object(str(hook), elf.read_dynamic(str(hook))))
    return (found.rule, found.path) if found else None


def _loaded(host, exe, hook, llp: str | None):
    """The real loader: exit status, and (search rule glibc names, the file it took) for libcudart.so.13."""
    env = {"PATH": os.environ["PATH"], "LD_PRELOAD": str(hook), "LD_DEBUG": "libs"}
    if llp is not None:
        env["LD_LIBRARY_PATH"] = llp
    r = host.run([str(exe)], env)
    rule = path = None
    lines = r.stderr.splitlines()
    for i, line in enumerate(lines):
        if "find library=libcudart.so.13" in line:
            for later in lines[i + 1:]:
                m = re.search(r"search path=\S*\s+\((.*)\)", later)
                if m:
                    rule = m.group(1).split(" from file")[0]
                m = re.search(r"trying file=(\S+)", later)
                if m and os.path.exists(m.group(1)):
                    path = m.group(1)
                    break
                if "find library=" in later:
                    break
            break
    return r.returncode, rule, path, r.stderr


@pytest.mark.parametrize("build", ["0.0.10-source", MODEL])
def test_a_runpath_hook_does_not_search_the_executables_rpath(build, parts, tmp_path):
    """glibc searches the executable's DT_RPATH for an object's DT_NEEDED only when that object has no
    DT_RUNPATH. So under a conda interpreter (DT_RPATH ``$ORIGIN/../lib``, libcudart there, no pip runtime),
    0.0.10's hook finds the prefix's libcudart through the interpreter's DT_RPATH, while #108's, whose
    DT_RUNPATH names no existing directory here, dies in the loader (exit 127) unless LD_LIBRARY_PATH names
    the directory. The loader model (tms_autopreload.ldso) predicts each case as the real loader does."""
    from support import Host

    exe = _conda_like(tmp_path / "prefix", parts)
    hook = _hook(build, tmp_path / "prefix" / "lib" / "python3.11" / "site-packages")
    host = Host(tmp_path / "host", parts.host_dirs(("driver",)))
    prefix_lib = os.path.normpath(exe.parent / ".." / "lib" / "libcudart.so.13")
    status, rule, path, err = _loaded(host, exe, hook, None)
    if build == MODEL:
        assert status == 127 and "libcudart.so.13: cannot open shared object file" in err, err[-3000:]
        assert _predicted(host, exe, hook, "") is None
    else:
        assert (status, rule) == (0, "RPATH"), err[-3000:]
        assert os.path.realpath(path) == os.path.realpath(prefix_lib)
        assert _predicted(host, exe, hook, "") == ("DT_RPATH", prefix_lib)
    lib = str(tmp_path / "prefix" / "lib")
    status, rule, path, err = _loaded(host, exe, hook, lib)
    assert status == 0, err[-3000:]
    assert rule == ("LD_LIBRARY_PATH" if build == MODEL else "RPATH"), err[-3000:]  # DT_RPATH comes first
    assert _predicted(host, exe, hook, lib)[0] == ("LD_LIBRARY_PATH" if build == MODEL else "DT_RPATH")


@pytest.mark.parametrize("build", [MODEL])
def test_ld_library_path_overrides_the_hooks_runpath(build, parts, tmp_path):
    """#108 chose DT_RUNPATH so that LD_LIBRARY_PATH still wins: a hook beside a pip runtime takes that
    runtime through its DT_RUNPATH, and another copy named on LD_LIBRARY_PATH instead; the model agrees."""
    from support import Host

    site = tmp_path / "site"
    hook = _hook(build, site)
    (site / "nvidia" / "cu13" / "lib").mkdir(parents=True)
    (site / "nvidia" / "cu13" / "lib" / "libcudart.so.13").write_bytes((parts.rt[13] / "libcudart.so.13").read_bytes())
    other = tmp_path / "other"
    other.mkdir()
    (other / "libcudart.so.13").write_bytes((parts.rt[13] / "libcudart.so.13").read_bytes())
    host = Host(tmp_path / "host", parts.host_dirs(("driver",)))
    true = "/bin/true"
    status, rule, path, err = _loaded(host, true, hook, None)
    assert (status, rule, path) == (0, "RUNPATH", str(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")), \
        err[-3000:]
    assert _predicted(host, true, hook, "") == ("DT_RUNPATH", str(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13"))
    status, rule, path, err = _loaded(host, true, hook, str(other))
    assert (status, rule, path) == (0, "LD_LIBRARY_PATH", str(other / "libcudart.so.13")), err[-3000:]
    assert _predicted(host, true, hook, str(other)) == ("LD_LIBRARY_PATH", str(other / "libcudart.so.13"))


@pytest.mark.parametrize("build", ["0.0.10-source", MODEL])
def test_doctor_names_the_rule_that_finds_the_runtime_for_the_chosen_build(real_torch, build):
    """On the pip-only host beside torch's pip runtime: #108's hook finds it through its own DT_RUNPATH,
    so the plan binds nothing; 0.0.10's has no search path of its own, so the plan's LD_LIBRARY_PATH
    binding finds it. ``doctor`` says which, from the loader model for the planned environment."""
    scn = real_torch(("driver",), tms=build)
    doc = scn.doctor()
    assert doc["ok"], doc["error"]
    rule = "DT_RUNPATH" if build == MODEL else "LD_LIBRARY_PATH"
    assert doc["plan"]["runtime_rule"] == rule, doc["plan"]
    assert ("LD_LIBRARY_PATH" in doc["plan"]["env"]) == (build != MODEL), doc["plan"]
    r = scn.run(["-m", "tms_autopreload", "doctor"])
    assert f"chosen:   {doc['plan']['build']} (libcudart.so.13 found through {rule})" in r.stdout, r.stdout
