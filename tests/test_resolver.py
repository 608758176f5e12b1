"""The resolver on real hosts (what the loader sees), real wheels and the real loader.

Each scenario builds its host (a private ld.so.cache), a venv with our built wheel and the
real torch_memory_saver wheel, then asks ``tms-autopreload doctor --json`` and starts a real
flagged process that maps the hook and runs a ``bash -c true`` child.

The matrix runs on this machine (x86-64) and again on aarch64 (``conftest.AARCH64``: Debian trixie for
arm64 under emulation, with the aarch64 wheels of torch_memory_saver and NVIDIA's runtimes).
"""

from __future__ import annotations

import json
import os
import shlex
import sys

import pytest
import support
from conftest import AARCH64, DEFAULT_PYTHON, assert_applied, mode_env, report_host
from support import MAPPED, REEXECD, assert_stopped

sys.path.insert(0, str(support.ROOT))

PROBE = REEXECD + MAPPED + """
import ctypes, json, os, subprocess, sys
site = next(p for p in sys.path if p.endswith('site-packages'))
deps = os.path.join(site, 'torch', 'lib', 'libtorch_global_deps.so')
if os.path.exists(deps):
    ctypes.CDLL(deps)  # what `import torch` loads first; the stand-in torch cannot be imported
maps = mapped('.so')
child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
print(json.dumps({'pid': os.getpid(), 'maps': maps, 'child': child.returncode, 'child_err': child.stderr,
                  'reexecd': reexecd(),
                  'env': {k: v for k, v in os.environ.items() if k.startswith(('LD_', 'TMS_'))}}))
"""


def hooked(scn, build, mode, env=None):
    """Start a flagged probe in that TMS_AUTOPRELOAD_MODE: exactly ``build`` mapped, applied as ``mode``
    applies it, and its bash child runs."""
    r = scn.flagged(PROBE, {**mode_env(mode), **(env or {})})
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert_applied(mode, out["reexecd"], mapped(out, "torch_memory_saver"), build)
    assert out["child"] == 0, out["child_err"]
    return out


def mapped(out, needle):
    return [m for m in out["maps"] if needle in os.path.basename(m)]


def chosen(doc):
    assert doc["ok"], doc["error"]
    return os.path.basename(doc["plan"]["build"])


def verdict(doc, name):
    return next(c for c in doc["candidates"] if os.path.basename(c["path"]) == name)


CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PLAIN = "torch_memory_saver_hook_mode_preload.abi3.so"
# torch_memory_saver built here with an $ORIGIN-relative RUNPATH to the pip runtime (tools/tms_source.py).
RUNPATH_BUILD = "0.0.10-source-runpath"
# Both machines: this one's interpreter (x86-64) and Debian's for arm64, emulated.
MACHINES = [DEFAULT_PYTHON, AARCH64]


def releases(*versions):
    """(tms, python) for each released version on both machines, and the RUNPATH source build (built for
    this machine only)."""
    return [(v, p) for v in versions for p in MACHINES] + [(RUNPATH_BUILD, DEFAULT_PYTHON)]


@pytest.mark.parametrize("tms, python", releases("0.0.9.post1"))
def test_cuda13_system_runtime_gets_the_cu13_build_bound_to_that_runtime(scenario, tms, python, mode):
    scn = scenario(tms=tms, torch="cu13-sys", host=("driver", "cuda13"), python=python)
    parts = scn.parts
    doc = scn.doctor()
    assert chosen(doc) == CU13
    assert doc["runtime"]["major"] == 13 and "torch.version.cuda='13.0'" in doc["runtime"]["source"]
    assert verdict(doc, CU12)["status"] == "rejected" and verdict(doc, CU12)["loads"] is False
    assert "libcudart.so.12 => not found" in verdict(doc, CU12)["reason"]
    out = hooked(scn, scn.site / CU13, mode)
    assert mapped(out, "libcudart") == [str(parts.rt[13] / "libcudart.so.13")]
    assert out["env"]["TMS_INIT_ENABLE"] == "1" and out["env"]["TMS_INIT_ENABLE_CPU_BACKUP"] == "1"


@pytest.mark.parametrize("tms, python", releases("0.0.9.post1"))
def test_cuda13_from_pip_only_gets_the_cu13_build_bound_to_the_pip_runtime(scenario, tms, python, mode):
    """The pip runtime is found by the LD_LIBRARY_PATH binding, or by the build's own RUNPATH (then no binding)."""
    scn = scenario(tms=tms, torch="cu13-pip", pip=(13,), host=("driver",), python=python)
    doc = scn.doctor()
    assert chosen(doc) == CU13
    pip_dir = str(scn.site / "nvidia" / "cu13" / "lib")
    if tms == RUNPATH_BUILD:
        assert "LD_LIBRARY_PATH" not in doc["plan"]["env"], doc["plan"]
    else:
        assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == pip_dir
    out = hooked(scn, scn.site / CU13, mode)
    assert mapped(out, "libcudart") == [os.path.join(pip_dir, "libcudart.so.13")]


@pytest.mark.parametrize("tms, python", releases("0.0.10"))
def test_cuda12_from_pip_only_gets_the_cu12_build_where_slimes_pick_fails(scenario, tms, python, mode):
    scn = scenario(tms=tms, torch="cu12-pip", pip=(12,), host=("driver",), python=python)
    assert chosen(scn.doctor()) == CU12
    out = hooked(scn, scn.site / CU12, mode)
    assert mapped(out, "libcudart") == [str(scn.site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")]
    # slime today: the first existing name of (cu13, cu12, unsuffixed) -> cu13 -> exit 127.
    r = scn.host.run(["bash", "-c", "true"], {"PATH": os.environ["PATH"], "LD_PRELOAD": str(scn.site / CU13)})
    assert r.returncode == 127
    assert "libcudart.so.13: cannot open shared object file" in r.stderr


@pytest.mark.parametrize("python", MACHINES)
def test_with_both_runtimes_loadable_torchs_cuda13_decides(scenario, python):
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda12", "cuda13"), python=python)
    doc = scn.doctor()
    assert chosen(doc) == CU13
    assert verdict(doc, CU12)["loads"] is True and verdict(doc, CU12)["status"] == "rejected"
    assert "not for this process's CUDA 13" in verdict(doc, CU12)["reason"]


def test_cu12_only_release_on_cuda13_stops_naming_the_release_to_install(scenario):
    scn = scenario(tms="0.0.9", torch="cu13-sys", host=("driver", "cuda13"))
    doc = scn.doctor()
    assert not doc["ok"], doc
    assert "CUDA 12" in doc["error"] and "torch-memory-saver>=0.0.9.post1" in doc["error"]
    r = scn.run(["-m", "tms_autopreload", "which"])
    assert r.returncode == 1 and r.stdout == "" and "torch-memory-saver>=0.0.9.post1" in r.stderr
    assert_stopped(scn.flagged("print('user code ran')"), "torch-memory-saver>=0.0.9.post1")


def test_doctor_names_no_runtime_binding_for_a_driver_only_build(scenario):
    """0.0.8's build links only libcuda.so.1: doctor says torch's runtime copy (torch uses it), but neither
    its `binding:` nor its `chosen:` line says the build binds a libcudart, which it does not need."""
    scn = scenario(tms="0.0.8", torch="cu13-sys")
    r = scn.run(["-m", "tms_autopreload", "doctor"])
    assert r.returncode == 0, r.stderr
    lines = {line.split(":", 1)[0]: line for line in r.stdout.splitlines() if ":" in line}
    assert "libcudart" not in lines["chosen"], lines["chosen"]
    assert lines["binding"] == ("binding:  as found: nothing to bind, the build links no libcudart.so.13 (it needs "
                                "only the driver)"), lines["binding"]
    assert scn.doctor()["plan"]["runtime_rule"] is None


@pytest.mark.slow
def test_doctor_without_torch_does_not_speak_of_torchs_copy(scenario):
    scn = scenario(tms="0.0.10", torch=None, host=("driver", "cuda13"))
    r = scn.run(["-m", "tms_autopreload", "doctor"])
    assert r.returncode == 0, r.stderr
    why = next(line for line in r.stdout.splitlines() if line.startswith("why:"))
    assert why == "why:      no torch here: the copy the hook's build will bind, found by /etc/ld.so.cache", why


@pytest.mark.parametrize("major", [pytest.param(12, marks=pytest.mark.slow), 13])
def test_the_driver_only_build_is_chosen_on_either_runtime(scenario, major, mode):
    scn = scenario(tms="0.0.8", torch=f"cu{major}-sys", host=("driver", f"cuda{major}"))
    assert chosen(scn.doctor()) == "torch_memory_saver_cpp.abi3.so"
    hooked(scn, scn.site / "torch_memory_saver_cpp.abi3.so", mode)


@pytest.mark.parametrize("case, kw, words", [
    ("no torch_memory_saver", dict(tms=None, torch="cu13-sys"), ["torch_memory_saver is not installed",
                                                                   "pip install torch-memory-saver"]),
    pytest.param("CPU-only torch", dict(torch="cpu"), ["CPU-only build", "Fix: install a CUDA build of torch"],
                 marks=pytest.mark.slow),
    ("no driver", dict(torch="cu13-sys", host=("cuda13",)), ["libcuda.so.1", "install the NVIDIA driver"]),
    ("no torch, no runtime", dict(torch=None, host=("driver",)), ["no CUDA runtime is visible",
                                                                   "TMS_AUTOPRELOAD_CUDA_MAJOR=N"]),
    ("no torch, both runtimes", dict(torch=None, host=("driver", "cuda12", "cuda13")),
     ["several CUDA runtimes are visible", "TMS_AUTOPRELOAD_CUDA_MAJOR=N"]),
])
@pytest.mark.parametrize("python", MACHINES)
def test_each_host_without_a_plan_stops_with_its_own_fix(scenario, case, kw, words, python):
    scn = scenario(**kw, python=python)
    doc = scn.doctor()
    assert not doc["ok"], case
    for w in words:
        assert w in doc["error"], (case, doc["error"])
    assert_stopped(scn.flagged("print('user code ran')"), *words)


def test_without_torch_the_one_visible_runtime_decides(scenario, mode):
    scn = scenario(torch=None, host=("driver", "cuda13"))
    doc = scn.doctor()
    assert chosen(doc) == CU13 and doc["runtime"]["source"].startswith("no torch; only libcudart.so.13")
    hooked(scn, scn.site / CU13, mode)


def test_without_torch_the_pip_runtime_decides(scenario, mode):
    scn = scenario(torch=None, pip=(13,), host=("driver",))
    doc = scn.doctor()
    assert chosen(doc) == CU13 and doc["runtime"]["library_rule"] == "NVIDIA pip wheel"
    hooked(scn, scn.site / CU13, mode)


def test_an_unsuffixed_source_build_for_cuda13_is_chosen(scenario, mode):
    scn = scenario(tms="0.0.10", torch="cu13-sys", layout="source13", host=("driver", "cuda13"))
    assert chosen(scn.doctor()) == PLAIN
    hooked(scn, scn.site / PLAIN, mode)


def test_rocm_torch_picks_the_hip_build(scenario):
    scn = scenario(tms="0.0.10", torch="rocm6", layout="rocm", host=("rocm6",))
    doc = scn.doctor()
    assert chosen(doc) == PLAIN and doc["runtime"]["kind"] == "hip"


def _wheel_majors(version: str) -> set[int]:
    """The CUDA majors the preload builds of a real torch_memory_saver wheel link (their DT_NEEDED)."""
    import tempfile
    import zipfile

    from tms_autopreload.elf import read_dynamic
    from tms_autopreload.gpu_libraries import runtime_of

    majors = set()
    with zipfile.ZipFile(support.tms_wheel(version)) as z, tempfile.TemporaryDirectory() as d:
        for name in z.namelist():
            if name.startswith("torch_memory_saver_hook_mode_preload") and name.endswith(".so"):
                path = z.extract(name, d)
                majors |= {runtime_of(n)[1] for n in read_dynamic(path).needed if runtime_of(n)}
    return majors


def test_no_message_names_a_build_no_release_ships(scenario):
    """TMS_AUTOPRELOAD_CUDA_MAJOR=11: no release ships a CUDA 11 build (the real wheels' builds link CUDA 12
    and 13 only). The error says so and names what exists: torch_memory_saver 0.0.8, whose build links only the
    driver; installed, that build is chosen and the start is hooked. The runtime hints name only wheels
    NVIDIA publishes."""
    from tms_autopreload.releases import RELEASED_CUDA_MAJORS
    from tms_autopreload.runtime import install_hint

    assert _wheel_majors("0.0.9.post1") == _wheel_majors("0.0.10") == set(RELEASED_CUDA_MAJORS) == {12, 13}
    env = {"TMS_AUTOPRELOAD_CUDA_MAJOR": "11"}
    doc = scenario(tms="0.0.10", torch="cu13-sys").doctor(env)
    assert not doc["ok"] and "ships a CUDA 11 build:" not in doc["error"], doc["error"]
    scn = scenario(tms="0.0.10", torch="cu13-sys")
    # The override, not a missing build, is the cause here (torch is built for CUDA 13): the one fix, and
    # nothing installed for a CUDA 11 torch does not use.
    fix = f"Fix: `unset TMS_AUTOPRELOAD_CUDA_MAJOR` (torch at {scn.site / 'torch'} is built for CUDA 13.0)"
    assert doc["error"].splitlines()[-1] == fix, doc["error"]
    assert_stopped(scn.flagged("print('user code ran')", env), fix)
    # Without torch, CUDA 11 is the process's own: what exists for it is said (the scenarios' venvs have no
    # pip of their own: made --without-pip, so the command installs it first).
    scn10 = scenario(tms="0.0.10", torch=None)
    fix = ("Fix: no torch_memory_saver release ships a CUDA 11 build (releases ship CUDA 12 and 13 builds); "
           "torch_memory_saver 0.0.8's build needs only the driver (libcuda.so.1), not a CUDA 11 runtime: "
           "`env TMS_AUTOPRELOAD_DISABLE=1 " + shlex.quote(str(scn10.venv.python)) + " -m ensurepip && env "
           "TMS_AUTOPRELOAD_DISABLE=1 " + shlex.quote(str(scn10.venv.python)) + " -m pip install "
           "torch-memory-saver==0.0.8`")
    assert scn10.doctor(env)["error"].splitlines()[-1] == fix
    driver_only = scenario(tms="0.0.8", torch="cu13-sys")
    assert chosen(driver_only.doctor(env)) == "torch_memory_saver_cpp.abi3.so"
    hooked(driver_only, driver_only.site / "torch_memory_saver_cpp.abi3.so", "exec", env)
    pip = f"`env TMS_AUTOPRELOAD_DISABLE=1 {shlex.quote(sys.executable)} -m pip install"
    assert [install_hint("cuda", m) for m in (10, 11, 12, 13, 14)] == [
        "install a CUDA 10 toolkit (NVIDIA publishes no pip wheel of its runtime)",
        f"{pip} nvidia-cuda-runtime-cu11` (or a CUDA 11 toolkit)",
        f"{pip} nvidia-cuda-runtime-cu12` (or a CUDA 12 toolkit)",
        f"{pip} 'nvidia-cuda-runtime==13.*'` (or a CUDA 13 toolkit)",
        "install a CUDA 14 toolkit (NVIDIA publishes no pip wheel of its runtime)"]


@pytest.mark.parametrize("python", MACHINES)
def test_override_decides_when_no_torch_and_both_visible(scenario, python):
    scn = scenario(torch=None, host=("driver", "cuda12", "cuda13"), python=python)
    assert chosen(scn.doctor({"TMS_AUTOPRELOAD_CUDA_MAJOR": "12"})) == CU12
    assert chosen(scn.doctor({"TMS_AUTOPRELOAD_CUDA_MAJOR": "13"})) == CU13
    doc = scn.doctor({"TMS_AUTOPRELOAD_CUDA_MAJOR": "thirteen"})
    assert not doc["ok"] and "TMS_AUTOPRELOAD_CUDA_MAJOR='thirteen'" in doc["error"]


@pytest.mark.parametrize("python", MACHINES)
def test_forced_path_is_verified_and_major_checked(scenario, python):
    scn = scenario(torch="cu13-sys", host=("driver", "cuda13"), python=python)
    doc = scn.doctor({"TMS_AUTOPRELOAD_PATH": str(scn.site / CU13)})
    assert chosen(doc) == CU13
    doc = scn.doctor({"TMS_AUTOPRELOAD_PATH": str(scn.site / CU12)})
    assert not doc["ok"] and "not for this process's CUDA 13" in doc["error"]
    doc = scn.doctor({"TMS_AUTOPRELOAD_PATH": "relative.so"})
    assert not doc["ok"] and doc["error"].startswith("TMS_AUTOPRELOAD_PATH='relative.so' is not an absolute path")


def test_path_with_space_works_through_library_path(scenario, tmp_path, mode):
    scn = scenario(torch="cu13-sys", host=("driver", "cuda13"))
    spaced = tmp_path / "with space"
    spaced.mkdir()
    target = spaced / CU13
    target.write_bytes((scn.site / CU13).read_bytes())
    target.chmod(0o755)
    env = {"TMS_AUTOPRELOAD_PATH": str(target)}
    doc = scn.doctor(env)
    assert doc["plan"]["env"]["LD_PRELOAD"] == CU13
    assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(spaced)
    hooked(scn, target, mode, env)
    colon = tmp_path / "a:b"
    colon.mkdir()
    (colon / CU13).write_bytes(target.read_bytes())
    doc = scn.doctor({"TMS_AUTOPRELOAD_PATH": str(colon / CU13)})
    assert not doc["ok"] and "':' or ';'" in doc["error"]


@pytest.mark.slow  # builds torch_memory_saver from source on a cold cache
def test_runpath_build_apart_from_torchs_runtime_still_gets_the_binding(scenario, parts, mode):
    """Split site-packages (torch and its pip runtime in one directory on sys.path, torch_memory_saver in
    the venv): the build's $ORIGIN RUNPATH names a directory without the runtime, so the hook alone
    dies in the loader, and the plan binds torch's runtime directory on LD_LIBRARY_PATH."""
    scn = scenario(tms=RUNPATH_BUILD, torch=None, host=("driver",), tag="split-site")
    system = scn.venv.path.parent / "system" / "site-packages"
    if not (system / "torch").exists():
        support.write_torch_standin(system, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
        support.extract(support.runtime_wheel(13), "nvidia/cu13/lib/libcudart.so.13",
                        system / "nvidia" / "cu13" / "lib")
    env = {"PYTHONPATH": str(system)}
    r = scn.host.run(["bash", "-c", "true"], {"PATH": os.environ["PATH"], "LD_PRELOAD": str(scn.site / CU13)})
    assert r.returncode == 127 and "libcudart.so.13: cannot open shared object file" in r.stderr, r.stderr
    doc = scn.doctor(env)
    assert chosen(doc) == CU13
    runtime_dir = str(system / "nvidia" / "cu13" / "lib")
    assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == runtime_dir
    out = hooked(scn, scn.site / CU13, mode, env)
    assert mapped(out, "libcudart") == [os.path.join(runtime_dir, "libcudart.so.13")]


@pytest.mark.parametrize("python", MACHINES)
def test_a_build_for_the_other_machine_is_refused_by_machine_not_traced(scenario, python):
    """A build of the other architecture among the candidates (a wheel copied across machines, a shared
    home directory): refused for its ELF machine before the loader is asked about it; named in
    TMS_AUTOPRELOAD_PATH, the same clear stop."""
    scn = scenario(tms="0.0.10", torch="cu13-sys", host=("driver", "cuda13"), python=python)
    other, here, theirs = ("arm64", "x86-64", "aarch64") if scn.parts.arch is None else (None, "aarch64", "x86-64")
    import zipfile

    foreign = scn.site / f"torch_memory_saver_hook_mode_preload_{theirs.replace('-', '_')}.abi3.so"
    with zipfile.ZipFile(support.tms_wheel("0.0.10", other)) as z:
        foreign.write_bytes(z.read(CU13))
    foreign.chmod(0o755)
    try:
        _refused_by_machine(scn, foreign, here, theirs)
    finally:
        foreign.unlink()  # the scenario is shared


def _refused_by_machine(scn, foreign, here, theirs):
    """The test above, once ``foreign`` (built for ``theirs``) lies among the candidates."""
    doc = scn.doctor()
    assert chosen(doc) == CU13
    refused = verdict(doc, foreign.name)
    assert refused["status"] == "rejected" and refused["loads"] is None, refused
    assert f"built for {theirs} 64-bit, this interpreter is {here} 64-bit" in refused["reason"], refused
    env = {"TMS_AUTOPRELOAD_PATH": str(foreign)}
    doc = scn.doctor(env)
    assert not doc["ok"] and f"built for {theirs} 64-bit" in doc["error"], doc
    assert_stopped(scn.flagged("print('user code ran')", env), f"built for {theirs} 64-bit")


@pytest.mark.parametrize("python", ["trixie/3.13", AARCH64])
def test_a_runtime_only_in_the_machines_default_directory_is_found(scenario, python):
    """The loader's last resort, its default directories, are those of its machine: a libcudart.so.13
    copied into /usr/lib/<multiarch tuple> after the loader cache was built is found by that rule alone,
    on x86-64 and on aarch64 (Debian trixie for each), as the real loader finds it. Trixie's /lib is a link
    to usr/lib, so the first default directory, /lib/<multiarch tuple>, is where both find it; the kernel
    names the mapped file by its real path."""
    scn = scenario(torch=None, host=("driver",), python=python, tag="default-dir")
    triplet = "x86_64-linux-gnu" if scn.parts.arch is None else "aarch64-linux-gnu"
    system = f"/usr/lib/{triplet}/libcudart.so.13"
    setup = f'cp {scn.parts.rt[13] / "libcudart.so.13"} "$ROOT{system}"'
    r = scn.host.run([str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--json"], support.clean_env(),
                     setup=setup)
    doc = json.loads(r.stdout)
    assert chosen(doc) == CU13
    assert doc["runtime"]["library"] == f"/lib/{triplet}/libcudart.so.13", doc["runtime"]
    assert doc["runtime"]["library_rule"] == "default path", doc["runtime"]
    r = scn.host.run([str(scn.venv.python), "-c", PROBE], support.clean_env(SLIME_OFFLOAD_TRAIN="1"), setup=setup)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert mapped(out, "torch_memory_saver") == [str(scn.site / CU13)] and out["child"] == 0, out
    assert mapped(out, "libcudart") == [system], out["maps"]


@pytest.mark.parametrize("python", MACHINES)
def test_cuda12_system_runtime_gets_the_cu12_build_bound_to_that_runtime(scenario, python, mode):
    """A CUDA 12 torch on a node whose CUDA 12 runtime is in the loader cache: the cu12 build, and one libcudart."""
    scn = scenario(tms="0.0.10", torch="cu12-sys", host=("driver", "cuda12"), python=python)
    doc = scn.doctor()
    assert chosen(doc) == CU12 and doc["runtime"]["major"] == 12
    assert verdict(doc, CU13)["status"] == "rejected"
    out = hooked(scn, scn.site / CU12, mode)
    assert mapped(out, "libcudart") == [str(scn.parts.rt[12] / "libcudart.so.12")]


def test_an_interpreter_the_loader_cannot_start_is_said_in_the_systems_words(scenario):
    """Where the interpreter cannot be started for the loader's trace (its file no longer executable since
    it started, say: here ``posix_spawn`` refuses it), the answer names it and says why in the system's
    words, ``strerror`` alone (the path is said already), then the way out."""
    scn = report_host(scenario)
    code = ("import json, os, sys\n"
            "def refuse(path, *args, **kw):\n"
            "    raise PermissionError(13, 'Permission denied', path)\n"
            "os.posix_spawn = refuse\n"
            "from tms_autopreload import decision\n"
            "r = decision.survey()\n"
            "print(json.dumps([sys.executable, r.failure.cause, r.error]))")
    r = scn.run(["-c", code])
    assert r.returncode == 0, r.stderr
    exe, cause, error = json.loads(r.stdout)
    assert cause == "interpreter-fails", error
    assert error == (f"cannot run the interpreter {exe} to verify the plan with the loader (Permission denied). "
                     f"Fix: set LD_PRELOAD by hand with `tms-autopreload env` from a working Python"), error
