"""A second CUDA runtime beside torch's, and overrides that split the hook from torch.

torch's own ``__init__`` loads NVIDIA's runtime by path (``_preload_cuda_deps``, RTLD_LOCAL), globbing
``nvidia/cuda_runtime/lib`` (CUDA 12's wheel) before ``nvidia/cu13/lib``: with ``nvidia-cuda-runtime-cu12``
installed beside a CUDA 13 torch it maps that wheel's ``libcudart.so.12`` too, a copy nothing binds to.
``doctor`` predicts it and says so, with the wheel that brings it and the fix where nothing requires that
wheel. An override (``TMS_AUTOPRELOAD_CUDA_MAJOR``) that makes the hook use another runtime than torch
links is said plainly, makes ``ok`` false, and is never offered as a fix.

The real NVIDIA runtime wheels and torch_memory_saver wheels; torch is the stand-in (its version.py and a
``libtorch_global_deps.so`` linked like the real one): ``doctor`` reads torch's files and never imports it.
The real torch of both releases is in tests/test_real_torch.py.
"""

from __future__ import annotations

import os
import shutil

import support
from support import assert_stopped, pip_fix

CU12_WHEEL = "nvidia-cuda-runtime-cu12"
SPLIT = "TMS_AUTOPRELOAD_CUDA_MAJOR"


def _second_world(scenario, tag: str = ""):
    """CUDA 13 torch from pip with its runtime wheel and NVIDIA's CUDA 12 runtime wheel, on a driver-only host.
    Shared (without ``tag``): a test that changes it puts it back."""
    return scenario(tms="0.0.10", torch="cu13-pip", pip=(12, 13), host=("driver",), tag=tag)


def _requires(site, name: str, requirement: str) -> None:
    """An installed distribution ``name`` whose metadata requires ``requirement`` (what pip leaves of a
    package that depends on it: its .dist-info; the requirement is all this test reads)."""
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\nRequires-Dist: {requirement}\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")


def test_doctor_predicts_the_cu12_wheel_copy_torch_loads_by_path(scenario):
    scn = _second_world(scenario)
    doc = scn.doctor()
    cu13 = str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    cu12 = str(scn.site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    assert doc["ok"], doc["error"]
    rt = doc["runtime"]
    # The copy torch and the hook share is torch's own (its DT_RPATH); the CUDA 12 copy is said as what it is.
    assert rt["library"] == cu13 and rt["library_rule"] == "DT_RPATH", rt
    assert "also loads by path" not in rt["library_why"], rt["library_why"]
    assert f"also loads {cu12} by path" in rt["library_why"], rt["library_why"]
    assert rt["second"] == {"path": cu12, "shared": cu13, "wheel": CU12_WHEEL, "site": str(scn.site),
                            "pip_refuses": None, "required_by": [], "conditions": {}, "cause": "idle-runtime",
                            "fix": pip_fix(scn.venv.python, "uninstall", CU12_WHEEL)}, rt["second"]
    said = [w for w in doc["warnings"] if cu12 in w]
    assert len(said) == 1 and "nothing binds to" in said[0] and rt["second"]["fix"] in said[0], said
    text = scn.run(["-m", "tms_autopreload", "doctor"]).stdout
    assert f"warning: {said[0]}" in text.splitlines(), text


def test_no_uninstall_fix_where_an_installed_package_requires_the_wheel(scenario):
    scn = _second_world(scenario)
    _requires(scn.site, "needs-cu12", f"{CU12_WHEEL.upper().replace('-', '_')}>=12; platform_system == 'Linux'")
    try:
        doc = scn.doctor()
    finally:
        shutil.rmtree(scn.site / "needs_cu12-1.0.dist-info")
    second = doc["runtime"]["second"]
    assert second["fix"] is None and second["wheel"] == CU12_WHEEL, second
    assert second["required_by"] == ["needs-cu12"], second
    assert second["conditions"] == {"needs-cu12": "platform_system == 'Linux'"}, second
    said = next(w for w in doc["warnings"] if "libcudart.so.12" in w)
    assert "pip uninstall" not in said, said
    assert "needs-cu12 requires it if `platform_system == 'Linux'`, a condition this tool does not evaluate" in said
    # A requirement without a condition: it stays.
    _requires(scn.site, "always-cu12", CU12_WHEEL)
    said = next(w for w in scn.doctor()["warnings"] if "libcudart.so.12" in w)
    assert "it stays while always-cu12 requires it" in said, said


def test_torch_213_stops_its_list_at_a_library_no_wheel_holds(scenario, parts):
    """torch 2.13's _preload_cuda_lib is called required=True: the first library of its list (cuBLAS) that no
    wheel holds stops the list before the runtime, so nothing is loaded by path; 2.14.1's skips it."""
    scn = _second_world(scenario)
    deps = parts.global_deps("cu13-pip")
    try:
        for version, second in (("2.13.0", None), ("2.14.1", "libcudart.so.12"), ("2.10.0", None),
                                ("2.14.0", "libcudart.so.12")):
            support.write_torch_standin(scn.site, cuda="13.0", hip=None, deps_lib=deps, version=version)
            rt = scn.doctor()["runtime"]
            assert (rt["second"] and os.path.basename(rt["second"]["path"])) == second, (version, rt)
        support.write_torch_standin(scn.site, cuda="13.0", hip=None, deps_lib=deps, version="2.13.0")
        why = scn.doctor()["runtime"]["library_why"]
        assert "torch 2.13.0's _preload_cuda_deps stops at libcublasLt.so.*[0-9]" in why, why
    finally:
        support.write_torch_standin(scn.site, cuda="13.0", hip=None, deps_lib=deps)


def test_torch_29_and_older_load_no_runtime_by_path(scenario, parts):
    """Up to torch 2.9 the list is loaded only where libtorch_global_deps.so fails to load; where it loads,
    nothing but nvrtc and nvJitLink follow by path: no second runtime, and the copy is the one it finds."""
    scn = _second_world(scenario, tag="2.9")
    deps = parts.global_deps("cu13-pip")
    for version in ("2.9.0", "2.8.0", "2.5.1"):
        support.write_torch_standin(scn.site, cuda="13.0", hip=None, deps_lib=deps, version=version)
        rt = scn.doctor()["runtime"]
        assert rt["second"] is None and "by path" not in rt["library_why"], (version, rt)
        assert rt["library"] == str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13"), (version, rt)


def test_a_library_that_fails_to_load_stops_torchs_list(scenario, parts):
    """One try block: an earlier library of the list that cannot load (here a cuBLAS file that is no ELF
    object) stops the later ones, the runtime's among them."""
    scn = _second_world(scenario)
    broken = scn.site / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13"
    broken.write_bytes(b"not an ELF object")
    try:
        rt = scn.doctor()["runtime"]
    finally:
        broken.unlink()
    assert rt["second"] is None, rt
    assert f"_preload_cuda_deps stops at {broken}, which would not load" in rt["library_why"], rt


def test_a_library_of_this_machine_lets_the_list_go_on_and_one_of_another_stops_it(scenario):
    """An earlier library of the list built for this machine, whose needs are found, loads: the list goes
    on to the runtime's entry (the CUDA 12 copy is still loaded by path). The same file marked for another
    machine (its ELF header's e_machine) would not load, and stops the list there."""
    scn = _second_world(scenario)
    lib = scn.site / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13"
    support.cc(lib, "int tms_test_cublaslt(void) { return 0; }\n", "-Wl,-soname,libcublasLt.so.13")
    try:
        rt = scn.doctor()["runtime"]
        assert (rt["second"] and os.path.basename(rt["second"]["path"])) == "libcudart.so.12", rt
        assert "stops at" not in rt["library_why"], rt["library_why"]
        data = bytearray(lib.read_bytes())
        other = 183 if int.from_bytes(data[18:20], "little") != 183 else 62  # AArch64, else x86-64
        data[18:20] = other.to_bytes(2, "little")
        lib.write_bytes(bytes(data))
        rt = scn.doctor()["runtime"]
    finally:
        lib.unlink()
    assert rt["second"] is None, rt
    assert f"stops at {lib}, which would not load (built for another machine)" in rt["library_why"], rt


def test_override_that_splits_the_hook_from_torch_is_said_and_not_ok(scenario):
    scn = _second_world(scenario)
    env = {SPLIT: "12"}
    doc = scn.doctor(env)
    rt = doc["runtime"]
    assert not doc["ok"] and doc["plan"] is not None, doc
    assert os.path.basename(doc["plan"]["build"]) == "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
    assert rt["split"] == {"torch_library": "libcudart.so.13", "overrides": [f"{SPLIT}='12'"],
                           "cause": "split-runtime", "fix": f"`unset {SPLIT}` to use torch's runtime"}, rt
    said = [w for w in doc["warnings"] if w.startswith(f"{SPLIT}='12' makes the hook use libcudart.so.12")]
    assert len(said) == 1 and "links libcudart.so.13" in said[0], doc["warnings"]
    r = scn.run(["-m", "tms_autopreload", "doctor"], env)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "why:      the copy torch will use" not in r.stdout, r.stdout
    assert "why:      the copy the hook will use, not torch's: found by NVIDIA pip wheel; torch at" in r.stdout
    # The flagged start applies what was asked for, and says what it does.
    r = scn.flagged("print('user code ran')", env)
    assert r.returncode == 0 and r.stdout.strip() == "user code ran", r.stderr
    assert f"tms-autopreload: warning: {said[0]}" in r.stderr.splitlines(), r.stderr
    # Without the override: one runtime for both, no such warning, ok.
    doc = scn.doctor()
    assert doc["ok"] and doc["runtime"]["split"] is None, doc


def test_no_fix_installs_the_runtime_an_override_split_off(scenario):
    """Without the CUDA 12 wheel the override finds no CUDA 12 runtime: the fix is to unset it, and never to
    install the runtime it names, which would split the hook from torch."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    env = {SPLIT: "12"}
    doc = scn.doctor(env)
    assert not doc["ok"] and doc["plan"] is None
    assert doc["fix"].startswith(f"`unset {SPLIT}` (torch at {scn.site / 'torch'} is built for CUDA 13.0)"), doc["fix"]
    assert CU12_WHEEL not in doc["fix"] and "CUDA 12 toolkit" not in doc["fix"], doc["fix"]
    message = assert_stopped(scn.flagged("print('user code ran')", env), f"unset {SPLIT}")
    assert CU12_WHEEL not in message.splitlines()[-1], message


def test_an_override_naming_torchs_own_major_keeps_torchs_copy_and_the_second_runtime(scenario):
    """``TMS_AUTOPRELOAD_CUDA_MAJOR`` equal to the major torch links overrides nothing: the copy is torch's,
    found as torch finds it, and the CUDA 12 copy torch loads by path is said as without the override."""
    scn = _second_world(scenario)
    plain, same = scn.doctor(), scn.doctor({SPLIT: "13"})
    assert same["ok"], same["error"]
    for key in ("library", "library_rule", "library_why", "second"):
        assert same["runtime"][key] == plain["runtime"][key], (key, same["runtime"], plain["runtime"])
    assert same["plan"]["env"] == plain["plan"]["env"], (same["plan"], plain["plan"])


def test_both_overrides_on_another_major_than_torchs_are_told_to_go(scenario, parts):
    """Both overrides naming CUDA 12 on a CUDA 13 torch with no CUDA 12 runtime: what splits the hook from
    torch is the cause, and the fix unsets both, never "point the path at a CUDA 12 build"."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    env = {SPLIT: "12", "TMS_AUTOPRELOAD_PATH": str(scn.site / "torch_memory_saver_hook_mode_preload_cu12.abi3.so")}
    doc = scn.doctor(env)
    assert not doc["ok"] and doc["plan"] is None, doc
    assert doc["fix"].startswith(f"`unset {SPLIT} TMS_AUTOPRELOAD_PATH` to use torch's runtime (torch at "
                                 f"{scn.site / 'torch'} is built for CUDA 13.0)"), doc["fix"]
    assert "for CUDA 12" not in doc["fix"] and CU12_WHEEL not in doc["fix"], doc["fix"]


def test_an_override_naming_a_major_no_release_ships_offers_no_install(scenario):
    """``TMS_AUTOPRELOAD_CUDA_MAJOR=11`` on a CUDA 13 torch: unset it; installing torch_memory_saver 0.0.8
    for a CUDA 11 that torch does not use would only split the hook from torch."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    doc = scn.doctor({SPLIT: "11"})
    assert not doc["ok"] and doc["fix"].startswith(f"`unset {SPLIT}` (torch at"), doc["fix"]
    assert "pip install" not in doc["fix"], doc["fix"]


def test_no_uninstall_fix_for_a_wheel_this_environments_pip_cannot_remove(scenario, tmp_path):
    """The CUDA 12 wheel on PYTHONPATH (a ``pip install --target`` folder) of a venv: this venv's pip says
    "Not uninstalling ... outside environment" and removes nothing, so no ``pip uninstall`` is offered; the
    warning says where the wheel lies instead."""
    import shutil
    import subprocess
    import sys

    scn = _second_world(scenario, tag="target")
    target = tmp_path / "target"
    (target / "nvidia").mkdir(parents=True)
    shutil.move(scn.site / "nvidia" / "cuda_runtime", target / "nvidia" / "cuda_runtime")
    for info in scn.site.glob("nvidia_cuda_runtime_cu12-*.dist-info"):
        shutil.move(info, target / info.name)
    env = {"PYTHONPATH": str(target)}
    doc = scn.doctor(env)
    cu12 = str(target / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")
    second = doc["runtime"]["second"]
    assert second["path"] == cu12 and second["wheel"] == CU12_WHEEL, second
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y",
                          CU12_WHEEL], capture_output=True, text=True, env=support.clean_env(**env))
    assert "outside environment" in pip.stdout + pip.stderr and os.path.exists(cu12), pip  # pip's own answer
    assert second["fix"] is None, second
    said = next(w for w in doc["warnings"] if cu12 in w)
    assert "pip uninstall" not in said and f"it lies in {target}, outside this environment" in said, said
