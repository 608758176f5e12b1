"""The whole search path, and ``doctor`` = the hook, in the layouts people build.

site.py runs ``tms_autopreload.pth``'s import line while it is still adding site directories (on
CPython 3.10-3.14): packages in a directory it adds later must be found all the same. Each layout here
is built as people's tools build it, with real interpreters:

* ``system-site``: a venv made with ``python -m venv --system-site-packages`` over a base interpreter
  (a prefix of its own, :func:`support.base_python`) whose own site-packages hold torch and NVIDIA's
  runtime wheel, the package in the venv (an NGC-style image; ``scripts/gpu-check.sh`` builds this);
* ``user-site``: the package installed with ``pip install --user`` under a real ``HOME``, beside the
  base interpreter's torch;
* ``pth-line``: torch in a directory that a later ``.pth`` file (``zz_torch.pth``) adds.

The property checked everywhere (:func:`assert_doctor_is_hook`): a flagged start applies exactly the
plan ``doctor --json`` printed in the same environment without the flag (exec mode: the build,
LD_PRELOAD and LD_LIBRARY_PATH; dlopen mode: the build), with one runtime library mapped, the one
``doctor`` named, once torch's own libraries are loaded; where ``doctor`` has no plan, the start stops
with its error.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from pathlib import Path

import pytest
from conftest import DEFAULT_PYTHON, MODES, Scenario, mode_env, need, report_host
from support import (MAPPED, NO_DAC, REEXECD, Venv, assert_stopped, base_python, clean_env, locate_python, run,
                     runtime_wheel, tms_wheel, torch_venv, write_examples_standin, write_torch_standin)

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PYTHONS = ["3.10", "3.11", "3.12", "3.13"]

# A flagged start's own account: its image (re-exec'd or not), the hooks and runtime libraries mapped once
# torch's libraries are loaded as torch loads them, and what its children would inherit. A torch stand-in
# (tools/standins.py) cannot be imported: its libtorch_global_deps.so is loaded the way torch 2.14.1's
# _load_global_deps does (ctypes.CDLL, RTLD_GLOBAL), which maps the runtime its DT_NEEDED names. Where the
# host lacks that runtime (a driver-only build beside a system-CUDA torch, no CUDA installed), torch could
# not load hooked or not: the probe goes on without it.
PROBE = REEXECD + MAPPED + r"""
import ctypes, importlib.util, json, os
try:
    import torch
except ModuleNotFoundError:
    pass
except ImportError as exc:
    if 'stand-in' not in str(exc):
        raise
    lib = os.path.join(importlib.util.find_spec('torch').submodule_search_locations[0], 'lib')
    try:
        ctypes.CDLL(os.path.join(lib, 'libtorch_global_deps.so'), mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass
files = mapped()
print(json.dumps({'reexecd': reexecd(),
                  'hooks': sorted(f for f in files if 'torch_memory_saver' in os.path.basename(f)),
                  'runtimes': sorted({os.path.realpath(f) for f in files
                                      if os.path.basename(f).startswith(('libcudart.so', 'libamdhip64.so'))}),
                  'LD_PRELOAD': os.environ.get('LD_PRELOAD'), 'LD_LIBRARY_PATH': os.environ.get('LD_LIBRARY_PATH')}))
"""


class World(Scenario):
    """A layout on a host, with the variables every process of it gets (``HOME`` for a user site) and, in
    a root file system, the shell that mounts its directories there first."""

    def __init__(self, venv: Venv, host, parts, env: dict[str, str] | None = None, setup: str = "") -> None:
        super().__init__(venv, host, parts)
        self.env = env or {}
        self.setup = setup

    def run(self, args: list[str], env: dict[str, str] | None = None, **kw):
        if self.setup:
            kw.setdefault("setup", self.setup)
        return super().run(args, {**self.env, **(env or {})}, **kw)


def assert_doctor_is_hook(world: Scenario, env: dict[str, str] | None = None) -> dict:
    """What ``doctor --json`` printed without the flag is what a flagged start does, in both modes;
    returns doctor's document."""
    env = env or {}
    doc = world.doctor(env)
    for mode in MODES:
        r = world.run(["-c", PROBE], {"TMS_AUTOPRELOAD": "1", **mode_env(mode), **env}, timeout=300)
        if doc["plan"] is None:
            message = assert_stopped(r, verbose=True)
            assert doc["error"].splitlines()[0] in message, (mode, doc["error"], message)
            continue
        assert r.returncode == 0, (mode, doc["plan"], r.stderr[-3000:])
        seen = json.loads(r.stdout.strip().splitlines()[-1])
        plan = doc["plan"]
        assert [os.path.realpath(h) for h in seen["hooks"]] == [os.path.realpath(plan["build"])], (mode, seen, plan)
        library = doc["runtime"]["library"]
        assert len(seen["runtimes"]) <= 1 and seen["runtimes"] in ([], [os.path.realpath(library or "")]), \
            (mode, seen["runtimes"], library)
        if mode == "exec":
            assert seen["reexecd"], (seen, r.stderr)
            assert seen["LD_PRELOAD"] == plan["env"]["LD_PRELOAD"], (seen, plan)
            assert seen["LD_LIBRARY_PATH"] == plan["env"].get("LD_LIBRARY_PATH", env.get("LD_LIBRARY_PATH")), \
                (seen, plan)
    return doc


# ---------------------------------------------------------------- the layouts

def _base_with_torch(parts, root: Path, python: str, torch: str = "cu13-pip") -> Venv:
    """A base interpreter whose own site-packages hold a torch stand-in and NVIDIA's runtime wheel,
    as ``pip install torch`` leaves them (torch/lib finds nvidia/cu13/lib by its DT_RPATH)."""
    base = need(base_python, need(locate_python, python), root / "base")
    major = 13 if "13" in torch else 12
    need(base.install, runtime_wheel(major))
    cuda = "13.0" if major == 13 else "12.8"
    write_torch_standin(base.site, cuda=cuda, hip=None, deps_lib=parts.global_deps(torch))
    return base


def _host(parts, root: Path, host: tuple[str, ...]):
    from support import Host

    return need(Host, root / "host", parts.host_dirs(host))


def system_site(parts, root: Path, python: str, host: tuple[str, ...], tms: str = "0.0.9.post1") -> World:
    base = _base_with_torch(parts, root, python)
    venv = need(Venv, root / "venv", str(base.python), [parts.own_wheel, tms_wheel(tms)], system_site=True)
    return World(venv, _host(parts, root, host), parts)


def user_site(parts, root: Path, python: str, host: tuple[str, ...], tms: str = "0.0.9.post1") -> World:
    base = _base_with_torch(parts, root, python)
    home = root / "home"
    home.mkdir()
    import sys

    need(run, [sys.executable, "-m", "pip", "--python", str(base.python), "install", "-q", "--user", "--no-deps",
               "--no-index", "--disable-pip-version-check", str(parts.own_wheel), str(tms_wheel(tms))],
         env=clean_env(HOME=str(home)))
    assert list(home.glob("lib/python*/site-packages/tms_autopreload.pth")) == [] and \
        list(home.glob(".local/lib/python*/site-packages/tms_autopreload.pth")), "pip --user put it elsewhere"
    return World(base, _host(parts, root, host), parts, {"HOME": str(home)})


def pth_line(parts, root: Path, python: str, host: tuple[str, ...], tms: str = "0.0.9.post1",
             torch_site: Path | None = None) -> World:
    """``torch_site``: a directory already holding torch (real torch's); else a stand-in is made."""
    venv = need(Venv, root / "venv", need(locate_python, python), [parts.own_wheel, tms_wheel(tms)])
    if torch_site is None:
        torch_site = root / "extra"
        import sys

        need(run, [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target",
                   str(torch_site), str(runtime_wheel(13))])
        write_torch_standin(torch_site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    (venv.site / "zz_torch.pth").write_text(f"{torch_site}\n")
    return World(venv, _host(parts, root, host), parts)


LAYOUTS = {"system-site": system_site, "user-site": user_site, "pth-line": pth_line}
PIP_ONLY = ("driver",)
SYSTEM_CUDA13 = ("driver", "cuda13")


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_torch_on_a_later_site_directory_is_found(parts, tmp_path, layout, python):
    """Pip-only host: torch and its runtime exist only in a directory site.py adds after the
    package's ``.pth`` ran. The flagged start finds them, as ``doctor`` does."""
    world = LAYOUTS[layout](parts, tmp_path, python, PIP_ONLY)
    doc = assert_doctor_is_hook(world)
    assert doc["ok"] and os.path.basename(doc["plan"]["build"]) == CU13, doc
    assert doc["runtime"]["torch_dir"] and "nvidia/cu13/lib" in doc["runtime"]["library"], doc["runtime"]
    if layout == "system-site":
        # A user site that exists but cannot be listed (mode 0311, root without its permission bypass): site.py
        # skips it, and so does the search path the start models; torch is still found in the base's.
        home = tmp_path / "unlisted-home"
        user = home / ".local" / "lib" / f"python{python}" / "site-packages"
        user.mkdir(parents=True)
        user.chmod(0o311)
        r = world.host.run([*NO_DAC, str(world.venv.python), "-c", PROBE],
                           clean_env(TMS_AUTOPRELOAD="1", HOME=str(home)))
        seen = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else None
        assert seen and seen["reexecd"] and seen["hooks"] == [doc["plan"]["build"]], r.stdout + r.stderr


def test_a_finder_that_fails_on_torch_is_passed_over(scenario):
    """Another package's ``.pth``, sorted before ours, put a finder first on ``sys.meta_path`` that raises for
    ``torch`` and ``torch_memory_saver`` (an editable install's finder whose checkout moved): the start asks the
    next finder, as ``doctor`` does, and both agree in both modes (the program's own ``import torch`` meets the
    finder's error, the probe goes on without it)."""
    scn = report_host(scenario)
    finder = scn.site / "aa_tms_test_finder.pth"
    finder.write_text("import sys; exec('class Moved:\\n @staticmethod\\n"
                      " def find_spec(name, path=None, target=None):\\n"
                      "  if name in (\\'torch\\', \\'torch_memory_saver\\'):\\n"
                      "   raise ModuleNotFoundError(\\'its checkout moved\\', name=name)\\n"
                      "sys.meta_path.insert(0, Moved)')\n")
    try:
        doc = assert_doctor_is_hook(scn)
    finally:
        finder.unlink()
    assert os.path.basename(doc["plan"]["build"]) == CU13, doc


def test_a_working_directory_that_is_gone_leaves_relative_entries_as_they_are(tmp_path, monkeypatch):
    """``sys.path`` holds relative entries (``''`` under ``python -c``) and the working directory was removed:
    site.py keeps such an entry as it is (site.makepath), and so does the search path the start models, which
    is then the one it gives with a working directory."""
    from tms_autopreload import sitepath

    monkeypatch.setattr("sys.path", ["", "relative/dir", *__import__("sys").path])
    with_cwd = sitepath._search_path()
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert sitepath._search_path() == with_cwd and with_cwd[:2] == ["", "relative/dir"], with_cwd


@pytest.mark.slow  # each layout's flagged starts stay in the fast lane (the test above), and a system CUDA
# beside torch's own runtime in test_doctor_is_the_hook_in_every_scenario_world
@pytest.mark.parametrize("layout", LAYOUTS)
def test_one_runtime_beside_a_system_cuda(parts, tmp_path, layout):
    """Host with a system CUDA 13: the hook binds torch's own libcudart (the one torch loads by its
    DT_RPATH), not the system's, so one copy maps."""
    world = LAYOUTS[layout](parts, tmp_path, DEFAULT_PYTHON, SYSTEM_CUDA13)
    doc = assert_doctor_is_hook(world)
    assert doc["ok"] and "nvidia/cu13/lib" in doc["plan"]["env"].get("LD_LIBRARY_PATH", ""), doc["plan"]


@pytest.mark.slow
@pytest.mark.parametrize("python", ["sid/3.14", "sid/3.15"])
def test_debian_python_with_torch_in_dist_packages(parts, rootfs, tmp_path, python):
    """Debian's own python3 with torch installed where ``pip install`` puts it for that interpreter
    (``/usr/local/lib/python3.X/dist-packages``), and a ``--system-site-packages`` venv over it holding the
    package: hooked with the cu13 build and torch's runtime, as ``doctor`` says, on a pip-only host."""
    from rootfs import RootfsHost, RootfsVenv

    suite, _, version = python.rpartition("/")
    fs = rootfs(suite)
    dist = tmp_path / "dist-packages"
    import sys

    need(run, [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(dist),
               str(runtime_wheel(13))])
    write_torch_standin(dist, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    fs.run([fs.python(version), "-m", "venv", "--without-pip", "--system-site-packages", str(tmp_path / "venv")])
    venv = need(RootfsVenv, fs, tmp_path / "venv", None, [parts.own_wheel, tms_wheel("0.0.9.post1")])
    target = f"/usr/local/lib/python{version}/dist-packages"
    world = World(venv, need(RootfsHost, fs, tmp_path / "host", parts.host_dirs(PIP_ONLY)), parts,
                  setup=f'mkdir -p "$ROOT{target}" && mount --bind {dist} "$ROOT{target}"')
    doc = assert_doctor_is_hook(world)
    assert doc["ok"] and os.path.basename(doc["plan"]["build"]) == CU13, doc
    assert doc["runtime"]["torch_dir"] == f"{target}/torch", doc["runtime"]


@pytest.mark.slow
@pytest.mark.parametrize("host", [PIP_ONLY, SYSTEM_CUDA13], ids=["pip-only", "system-cuda13"])
def test_real_torch_on_a_later_pth_line(parts, tmp_path, host):
    """Real torch 2.14.1 (CUDA 13) in a directory ``zz_torch.pth`` adds: the flagged start imports it
    hooked with the cu13 build and exactly one libcudart, torch's own, counting what torch loads by
    path (``_load_global_deps``) once imported."""
    shared = need(torch_venv, need(locate_python, DEFAULT_PYTHON))
    world = pth_line(parts, tmp_path, DEFAULT_PYTHON, host, torch_site=shared.site)
    world.env = {"PYTHONDONTWRITEBYTECODE": "1"}  # the cached torch is shared: nothing is written into it
    doc = assert_doctor_is_hook(world)
    assert doc["ok"] and os.path.basename(doc["plan"]["build"]) == CU13, doc
    assert doc["runtime"]["torch_version"].startswith("2.14.1"), doc["runtime"]
    assert os.path.realpath(doc["runtime"]["library"]) == os.path.realpath(
        shared.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13"), doc["runtime"]


# ---------------------------------------------------------------- every world of the scenario fixture

RUNPATH_BUILD = "0.0.10-source-runpath"  # torch_memory_saver built here with an $ORIGIN-relative RUNPATH
# Each distinct world the suite's tests ask the ``scenario`` fixture for (conftest.py), on this machine's
# interpreter; the failing ones too (no plan: the start stops with doctor's error).
SCENARIO_WORLDS = {
    "0.0.9.post1-cu13-sys": dict(torch="cu13-sys"),
    "0.0.9-cu13-sys": dict(tms="0.0.9", torch="cu13-sys"),
    "0.0.10-cu13-sys": dict(tms="0.0.10", torch="cu13-sys"),
    "cu13-sys-two-systems": dict(torch="cu13-sys", host=("driver", "cuda12", "cuda13")),
    "cu13-sys-no-driver": dict(torch="cu13-sys", host=("cuda13",)),
    "0.0.10-cu13-pip-beside-system": dict(tms="0.0.10", torch="cu13-pip", pip=(13,)),
    "cu13-pip-only": dict(torch="cu13-pip", pip=(13,), host=("driver",)),
    "cu12-pip-only": dict(torch="cu12-pip", pip=(12,), host=("driver",)),
    "0.0.10-cu12-pip-only": dict(tms="0.0.10", torch="cu12-pip", pip=(12,), host=("driver",)),
    "cu12-sys": dict(torch="cu12-sys", host=("driver", "cuda12")),
    "0.0.8-cu13-sys-driver-only": dict(tms="0.0.8", torch="cu13-sys", host=("driver",)),
    "0.0.8-cu12-sys": dict(tms="0.0.8", torch="cu12-sys", host=("driver", "cuda12")),
    "no-torch-pip13": dict(torch=None, pip=(13,)),
    "no-torch-system13": dict(torch=None),
    "no-torch-two-systems": dict(torch=None, host=("driver", "cuda12", "cuda13")),
    "no-torch-no-runtime": dict(torch=None, host=("driver",)),
    "no-torch-memory-saver": dict(tms=None, torch="cu13-sys"),
    "cpu-torch": dict(torch="cpu"),
    "rocm-source-layout": dict(tms="0.0.10", torch="rocm6", layout="rocm", host=("rocm6",)),
    "cu13-source-layout": dict(tms="0.0.10", torch="cu13-sys", layout="source13"),
    "runpath-source-build-cu13-pip": dict(tms=RUNPATH_BUILD, torch="cu13-pip", pip=(13,), host=("driver",)),
    "runpath-source-build-no-torch": dict(tms=RUNPATH_BUILD, torch=None, host=("driver",)),
}


# The worlds `make check` runs: one of each kind of answer (a system runtime, two of them, torch's own beside a
# system one, CUDA 12 from pip, no torch, no plan, ROCm, a RUNPATH build); `make test` runs them all. The
# resolver's tests start most of the others' hosts in the fast lane too.
# One world of each kind of answer, each on a venv other fast tests make anyway (scenarios that differ only in
# their host share a venv); the source-build worlds are slow by their name (conftest.py).
FAST_WORLDS = ("0.0.9.post1-cu13-sys", "cu13-sys-two-systems", "cu13-pip-only", "0.0.10-cu12-pip-only",
               "no-torch-pip13", "no-torch-no-runtime")
assert set(FAST_WORLDS) <= set(SCENARIO_WORLDS)


@pytest.mark.parametrize("world", [w if w in FAST_WORLDS else pytest.param(w, marks=pytest.mark.slow)
                                   for w in SCENARIO_WORLDS])
def test_doctor_is_the_hook_in_every_scenario_world(scenario, world):
    assert_doctor_is_hook(scenario(**SCENARIO_WORLDS[world]))


# ---------------------------------------------------------------- scripts/gpu-check.sh's own layout

ROOT = Path(__file__).resolve().parent.parent


def _real_torch_base(root: Path) -> Venv:
    """A base interpreter whose own site-packages hold real torch 2.14.1 and its NVIDIA wheels, as an
    image's python3 does: the cached torch venv's packages hard-linked in (seconds, no space; nothing is
    written into the cache: new files go to the copy's own directories)."""
    shared = need(torch_venv, need(locate_python, DEFAULT_PYTHON))
    base = need(base_python, need(locate_python, DEFAULT_PYTHON), root / "base")
    need(run, ["cp", "-al", *map(str, shared.site.iterdir()), str(base.site)])
    return base


def _torch_outer_venv(parts, root: Path) -> Venv:
    """A python3 that is itself a venv holding a torch stand-in and NVIDIA's runtime wheel, as a GPU image's
    ``/opt/torch/.venv/bin/python3`` is: ``--system-site-packages`` over it reaches only its base's
    site-packages, so ``scripts/gpu-check.sh`` adds a path line naming the venv's own."""
    plain = need(base_python, need(locate_python, DEFAULT_PYTHON), root / "plain")
    outer = need(Venv, root / "outer", str(plain.python))
    need(outer.install, runtime_wheel(13))
    write_torch_standin(outer.site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    return outer


GPU_CHECK_VERSIONS = ("0.0.10", "0.0.9.post1")  # the torch_memory_saver versions scripts/gpu-check.sh checks


@pytest.mark.slow  # the script's layout (system-site) is started in the fast lane by the tests above
@pytest.mark.parametrize("torch", ["stand-in", "real", "stand-in in a venv"])
def test_gpu_check_layout_up_to_the_gpu(parts, tmp_path, torch):
    """The venvs ``scripts/gpu-check.sh`` makes, one per torch_memory_saver version (``--venv``: the same
    steps, stopped before the GPU): ``--system-site-packages`` over a python3 that carries a CUDA 13 torch, in
    its own site-packages or in a venv of its own. On a pip-only host each one's flagged start is hooked
    with the cu13 build and torch's one libcudart, as ``doctor`` says, in both modes."""
    base = (_real_torch_base(tmp_path) if torch == "real" else _torch_outer_venv(parts, tmp_path)
            if torch == "stand-in in a venv" else _base_with_torch(parts, tmp_path, DEFAULT_PYTHON))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for w in (parts.own_wheel, *map(tms_wheel, GPU_CHECK_VERSIONS)):
        (wheels / w.name).symlink_to(w)
    need(run, ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--venv", str(tmp_path / "venvs")],
         env=clean_env(PYTHON=str(base.python), WHEELS=str(wheels)), timeout=600)
    assert sorted(p.name for p in (tmp_path / "venvs").iterdir()) == sorted(GPU_CHECK_VERSIONS)
    host = _host(parts, tmp_path, PIP_ONLY)
    for version in GPU_CHECK_VERSIONS:
        venv = Venv(tmp_path / "venvs" / version)
        assert list(venv.site.glob("torch_memory_saver-*.dist-info")) == \
            [venv.site / f"torch_memory_saver-{version}.dist-info"], version
        doc = assert_doctor_is_hook(World(venv, host, parts, {"PYTHONDONTWRITEBYTECODE": "1"}))
        assert doc["ok"] and os.path.basename(doc["plan"]["build"]) == CU13, (version, doc)
        assert doc["runtime"]["torch_dir"] == str(base.site / "torch"), (version, doc["runtime"])


@pytest.mark.slow  # real torch; the package index (--fetch)
def test_gpu_check_fetches_then_runs_every_step_up_to_the_gpu(parts, tmp_path):
    """``TMS_EXAMPLES=DIR scripts/gpu-check.sh --fetch`` downloads and builds what the check installs and
    copies the user's torch_memory_saver ``test/examples`` beside it (here a stand-in of empty modules);
    ``--dry-run`` then runs every step that needs no GPU, with real torch 2.14.1 as python3's own on a
    pip-only host (the driver a stand-in): both venvs, ``doctor --deep`` in both modes (the binding proof),
    the flagged process and its spawn child (each hooked with doctor's pick, the child without resolving
    again), torch_memory_saver's tests that need no GPU under the flag, and its GPU tests collected; and
    stops at the GPU with exit 2. Without the examples, the same run passes and says plainly, in its table,
    its summary and its last words, that their GPU tests did not run."""
    import tms_source

    names = write_examples_standin(need(tms_source.sdist), tmp_path / "their-examples")
    wheels = tmp_path / "wheels"
    fetched = need(run, ["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--fetch"],
                   env=clean_env(WHEELS=str(wheels), TMS_EXAMPLES=str(tmp_path / "their-examples")),
                   timeout=600).stdout
    for pattern in ("torch_memory_saver-0.0.10-*.whl", "torch_memory_saver-0.0.9.post1-*.whl",
                    "tms_autopreload-*.whl", "torch_memory_saver-0.0.10.tar.gz", "pytest-*.whl"):
        assert len(fnmatch.filter(fetched.split(), pattern)) == 1, (pattern, fetched)
    assert sorted(p.stem for p in (wheels / "examples").iterdir()) == sorted(names)
    assert "their tests: run test_examples.py (needs the GPU)\n" in fetched, fetched
    # The same wheels without the examples, as a --fetch without TMS_EXAMPLES leaves them.
    bare = tmp_path / "wheels-bare"
    bare.mkdir()
    for w in wheels.iterdir():
        if w.name != "examples":
            (bare / w.name).symlink_to(w)
    base = _real_torch_base(tmp_path)
    host = _host(parts, tmp_path, PIP_ONLY)
    for given in (True, False):
        tmp = tmp_path / f"tmp-{given}"
        tmp.mkdir()
        r = host.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run"],
                     clean_env(PYTHON=str(base.python), WHEELS=str(wheels if given else bare), TMPDIR=str(tmp),
                               PYTHONDONTWRITEBYTECODE="1", GPU_CHECK_SECONDS="1500"), timeout=1800)
        print(r.stdout)
        assert r.returncode == 2, r.stdout[-6000:] + r.stderr[-3000:]
        said = ([] if given else ["gpu-check: torch_memory_saver's own GPU tests (test_examples.py) did not run: "
                                  "their scenarios, test/examples, are not in the sdist; give TMS_EXAMPLES=DIR "
                                  "(docs/gpu.md)"]) \
            + ["gpu-check: dry run: every step up to the GPU passed; nothing ran on a GPU"]
        assert r.stderr.splitlines()[-len(said):] == said and r.stderr.count("did not run") == len(said) - 1, \
            r.stderr
        tables = r.stdout.split("\n== ")[1:]
        titles = [t.splitlines()[0] for t in tables]
        assert titles[:4] == [f"torch_memory_saver {v}, {m} mode ==" for v in GPU_CHECK_VERSIONS for m in MODES], \
            titles
        for table in tables[:4]:
            results = dict(re.findall(r"(?m)^(\S.*?) +(PASS|FAIL|SKIP) ", table))
            assert set(results.values()) == {"PASS", "SKIP"} and len(results) == 12, table
            assert [k for k, v in results.items() if v == "SKIP"] == ["pause/resume 8 GiB",
                                                                      "child: pause/resume 2 GiB"], table
            assert "INTERCEPTED" in table and "child: plan inherited (no re-exec, no resolve)" in results, table
        suite = tables[4]
        summary = [line for line in tables[5].splitlines()[1:] if line]
        assert [line.split()[-1] for line in summary[:6]] == ["PASS"] * 6, summary
        if given:
            assert "flagged: 10 passed; 0 GPU tests" not in suite and "flagged: 10 passed; " in suite, suite
            assert "\ntest_examples.py::test_simple[preload] " in suite, suite
            assert len(summary) == 6, summary
        else:
            assert "\nnot run: test_examples.py: its scenarios, test/examples/, are not in the sdist; " in suite, suite
            assert "\nflagged: 10 passed; their GPU tests (test_examples.py) did not run: no test/examples\n" \
                in suite, suite
            assert "test_examples.py::" not in suite, suite
            assert [" ".join(line.split()) for line in summary[6:]] == \
                ["their GPU tests (test_examples.py) NOT RUN (no test/examples: TMS_EXAMPLES)"], summary


# ---------------------------------------------------------------- what an import line sees, per version

# An import line of a .pth file in the venv's site-packages (sorting first): the search path the package
# computes there, and sys.path as it is then, written to $PROBE_OUT the first time it runs (on 3.10-3.14
# a venv's site-packages is processed twice, CPython #75723; the start-up hook acts the first time).
EARLY_PROBE = ("import os, json, sys; from tms_autopreload.sitepath import search_path; "
               "os.path.exists(os.environ['PROBE_OUT']) or "
               "open(os.environ['PROBE_OUT'], 'w').write(json.dumps([search_path(), sys.path]))\n")
# sys.path once site.py is done: sys.path[0] ('' for -c) comes after it, except under -I or -P.
FINAL = ("import json, sys; print(json.dumps(sys.path[0 if sys.flags.isolated or getattr(sys.flags, 'safe_path', 0) "
         "else 1:]))")


def _site_probe_layout(root: Path, venv_site: Path, base_site: Path, user_site: Path) -> dict[str, Path]:
    """Every kind of directory site.py adds after the venv's site-packages, each with a ``.pth`` path line
    of its own, and the venv's own later ``zz_`` line; returns the directories named."""
    named = {}
    for name, site in (("base", base_site), ("user", user_site), ("zz", venv_site)):
        site.mkdir(parents=True, exist_ok=True)
        named[name] = root / f"added-by-{name}"
        named[name].mkdir()
        (site / f"{name}_line.pth").write_text(f"# a comment\n{named[name]}\n\nimport os\n")
    (venv_site / "aa_probe.pth").write_text(EARLY_PROBE)
    return named


def _early_and_final(parts, rootfs, root: Path, python: str, options: tuple[str, ...] = (),
                     extra_env: dict[str, str] | None = None, system_site: bool = True):
    """Build the probe layout in a venv of ``python`` and start it with ``options``: (the directories named,
    the final sys.path, search_path() at the import line, sys.path there, the venv)."""
    home = root / "home"
    out = root / "probe.json"
    suite, _, version = python.rpartition("/")
    env = clean_env(HOME=str(home), PROBE_OUT=str(out), **(extra_env or {}))
    made = ["--system-site-packages"] if system_site else []
    if suite:
        fs = rootfs(suite)
        dist = f"/usr/local/lib/python{version}/dist-packages"  # Debian's site-packages for local installs
        base_site = root / "dist-packages"
        base_site.mkdir()
        setup = f'mkdir -p "$ROOT{dist}" && mount --bind {base_site} "$ROOT{dist}"'
        fs.run([fs.python(version), "-m", "venv", "--without-pip", *made, str(root / "venv")])
        from rootfs import RootfsVenv

        venv = need(RootfsVenv, fs, root / "venv", None, [parts.own_wheel])

        def start(code: str):
            return run(fs.wrap([str(venv.python), *options, "-c", code], env, setup=setup), env=clean_env())
    else:
        base = need(base_python, need(locate_python, python), root / "base")
        venv = need(Venv, root / "venv", str(base.python), [parts.own_wheel], system_site=system_site)
        base_site = base.site

        def start(code: str):
            return run([str(venv.python), *options, "-c", code], env=env)
    user = home / ".local" / "lib" / f"python{version}" / "site-packages"
    named = _site_probe_layout(root, venv.site, base_site, user)
    final = json.loads(start(FINAL).stdout)
    computed, raw = json.loads(out.read_text())
    print(f"{python} {' '.join(options)} {extra_env or ''}: at the import line sys.path lacks",
          [p for p in final if p not in raw] or "nothing", "of the final", final)
    return named, final, computed, raw, venv


@pytest.mark.parametrize("python", [*PYTHONS, "sid/3.14", "sid/3.15"])
def test_search_path_at_an_import_line_is_the_final_path(parts, rootfs, tmp_path, python):
    """From an import line in a ``--system-site-packages`` venv, with a user site, the package's search
    path is the one the interpreter has once site.py is done. What ``sys.path`` itself holds then is the
    version's own: on 3.10-3.14 the user site, the base's site-packages and every later path line are
    missing; from 3.15 (PEP 829's batching, Debian's 3.15.2 here) every path line is already there."""
    named, final, computed, raw, venv = _early_and_final(parts, rootfs, tmp_path, python)
    assert all(str(d) in final for d in named.values()), final
    assert computed == final
    if python.endswith("3.15"):
        assert raw == final
    else:  # only what came before: the interpreter's own entries and the venv's site-packages
        assert raw == final[:final.index(str(venv.site)) + 1], raw


@pytest.mark.slow  # a base interpreter and a venv per case; the fast lane keeps the import line's test above, and
# a flagged start in a venv without system site packages (the last test here)
@pytest.mark.parametrize("python", [DEFAULT_PYTHON, "sid/3.14"])
@pytest.mark.parametrize("how, options, extra_env, system_site, left_out", [
    ("-s", ("-s",), None, True, ("user",)),
    ("-I", ("-I",), None, True, ("user",)),
    ("PYTHONNOUSERSITE", (), {"PYTHONNOUSERSITE": "1"}, True, ("user",)),
    ("venv without system site", (), None, False, ("user", "base")),
])
def test_search_path_follows_site_options(parts, rootfs, tmp_path, python, how, options, extra_env, system_site,
                                          left_out):
    """The options and settings that leave site directories out (``-s``, ``-I``, ``PYTHONNOUSERSITE``, a
    venv's ``include-system-site-packages = false``) leave them out of the computed path too."""
    named, final, computed, raw, venv = _early_and_final(parts, rootfs, tmp_path, python, options, extra_env,
                                                         system_site)
    assert computed == final
    assert str(named["zz"]) in final and not any(str(named[n]) in final for n in left_out), final


# ---------------------------------------------------------------- a venv without the base interpreter's site-packages

def test_a_venv_without_system_site_packages_never_sees_the_base_interpreters_torch(scenario, parts, tmp_path):
    """A GPU image's python3 holds a CUDA 12 torch in its own site-packages; a venv made over it without
    ``--system-site-packages`` (the default) holds the package and torch_memory_saver but no torch, on a host with
    the CUDA 13 runtime. The venv's interpreter cannot import the base's torch, so a flagged start there has no
    torch: the one visible runtime, CUDA 13, decides, and doctor says no torch. Deciding by the base's torch would
    ask for CUDA 12, which this host lacks, and stop a start that needs nothing of it."""
    base = need(base_python, need(locate_python, DEFAULT_PYTHON), tmp_path / "base")
    write_torch_standin(base.site, cuda="12.8", hip=None, deps_lib=parts.global_deps("cu12-sys"))
    venv = need(Venv, tmp_path / "venv", str(base.python))
    assert "include-system-site-packages = false" in (venv.path / "pyvenv.cfg").read_text()
    # The packages as pip installed them into the fast lane's venv of the same wheels: hard-linked, not a pip run
    # (nothing writes into them).
    model = scenario(torch=None, host=("driver", "cuda13"))
    run(["cp", "-al", *map(str, model.site.iterdir()), str(venv.site)])
    scn = Scenario(venv, model.host, parts)
    doc = scn.doctor()
    assert doc["ok"] and doc["runtime"]["torch_dir"] is None, (doc["runtime"], doc["error"])
    assert doc["runtime"]["source"].startswith("no torch; only libcudart.so.13"), doc["runtime"]
    probe = MAPPED + ("import json\ntry:\n    import torch\n    seen = 'imported'\nexcept ImportError as exc:\n"
                      "    seen = type(exc).__name__\nprint(json.dumps([seen, mapped('torch_memory_saver')]))")
    r = scn.flagged(probe, flag="TMS_AUTOPRELOAD")
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1]) == ["ModuleNotFoundError", [str(venv.site / CU13)]], r.stdout
