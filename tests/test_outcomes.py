"""The decision judged by what happens: generated worlds, each started flagged for real.

A world is drawn from every axis the decision reads: torch_memory_saver's release or none (the real wheels
0.0.8, 0.0.9, 0.0.9.post1 and 0.0.10, and the layouts no wheel has: a CUDA 13 source build, a ROCm source
build, the cu12 name linked to the cu13 build), NVIDIA's runtime wheels in the venv, a system runtime in the
loader cache (CUDA 12, 13, both; ROCm), the driver (in the loader cache, on the shell's ``LD_LIBRARY_PATH``,
or nowhere), torch's kind (the stand-ins of conftest.TORCH_FIELDS, or no torch), the overrides
(``TMS_AUTOPRELOAD_CUDA_MAJOR``; ``TMS_AUTOPRELOAD_PATH`` naming a build of the venv, one elsewhere, or
something that is no build), the flag and the mode (``exec``, ``dlopen``). Nobody lists the worlds, so
nobody has to know in which one a bug shows.

In each world one flagged start runs a probe, and one shell runs ``doctor --json``, ``which`` and
``env --json`` (:func:`observe`). The start must end in one of two ways (:func:`judge`):

* exit 0, with exactly one torch_memory_saver build mapped, whose own DT_NEEDED (``readelf``, not its name)
  names the runtime the process mapped (or no runtime: a driver-only build); exactly one runtime library
  mapped once torch's own libraries are loaded as torch loads them; torch_memory_saver's own check (its
  installed code: 0.0.9 and later ``HookUtilModePreload.get_path_binary()`` then the ``ctypes.CDLL`` its
  ``BinaryWrapper`` does, 0.0.8 ``_BinaryInfo.compute()``) accepting ``LD_PRELOAD``; a ``bash`` child
  starting. ``doctor --json`` has that plan (the same file), ``which`` prints its build and ``env --json``
  its variables;
* or exit 78, saying why and a fix (``Fix:``), before any user code: ``doctor --json`` has no plan, its
  cause is one of :data:`tms_autopreload.errors.CAUSES` and its error is the stop's words; ``which`` and
  ``env --json`` exit 1 with the same words. Never where a plan anyone would make by hand works (a fitting
  build preloaded with torch's runtime directory first on ``LD_LIBRARY_PATH``, and ``bash`` starting with it).

Where the documents say the commands differ by design, the test asserts that relationship, and cites it
(docs/reference.md): a second runtime that torch loads by path and nothing binds to (``runtime.second``), an
override that splits the hook from torch (``runtime.split``, ``ok`` false), and ``env --json``, which answers
for the environment without this shell's ``LD_PRELOAD`` and ``LD_LIBRARY_PATH``.

``TMS_FUZZ_WORLDS`` sets the number of worlds (``make fuzz``: ten times the fast lane's, drawn at random; the
fast lane's are the same on every run).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
import support
from conftest import TORCH_FIELDS
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support import MAPPED, REEXECD, assert_stopped

sys.path.insert(0, str(support.ROOT))

from tms_autopreload.errors import CAUSES

FAST_WORLDS = 10
WORLDS = int(os.environ.get("TMS_FUZZ_WORLDS", FAST_WORLDS))
# The fast lane's worlds are the same on every run (derandomize): a failure there is one anybody can rerun.
SETTINGS = settings(max_examples=WORLDS, deadline=None, suppress_health_check=list(HealthCheck), database=None,
                    derandomize="TMS_FUZZ_WORLDS" not in os.environ)

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PLAIN = "torch_memory_saver_hook_mode_preload.abi3.so"
DRIVER_ONLY = "torch_memory_saver_cpp.abi3.so"  # 0.0.8's
TORCH_MODE = "torch_memory_saver_hook_mode_torch.abi3.so"  # not a preload build: torch_memory_saver's other mode
# (torch_memory_saver release, conftest's custom layout): every release of the index, and the layouts it has none of.
RELEASES = [(None, None), ("0.0.8", None), ("0.0.9", None), ("0.0.9.post1", None), ("0.0.10", None),
            ("0.0.10", "source13"), ("0.0.10", "rocm"), ("0.0.10", "cu12-link")]
TORCHES = [None, *TORCH_FIELDS]
PIP_WHEELS = [(), (12,), (13,), (12, 13)]
SYSTEMS = [(), ("cuda12",), ("cuda13",), ("cuda12", "cuda13"), ("rocm6",)]
DRIVERS = ["cache", "cache", "LD_LIBRARY_PATH", "none"]  # in the loader cache as often as not
# What TMS_AUTOPRELOAD_PATH names: a file of the venv's site-packages by name, or (the rest) a copy of one of its
# builds outside it, a missing file, a file that is no ELF object, an ELF object without torch_memory_saver in its
# path, a relative path (:func:`forced_path`).
FORCED = [CU13, CU12, PLAIN, DRIVER_ONLY, TORCH_MODE, "elsewhere", "missing", "not-elf", "unnamed", "relative"]


def sometimes(values: list) -> st.SearchStrategy:
    """None (no override) twice as often as all of ``values`` together: most worlds are the defaults'."""
    return st.sampled_from([None] * 2 * len(values) + values)


ANY = {
    "release": st.sampled_from(RELEASES),
    "torch": st.sampled_from(TORCHES),
    "pip": st.sampled_from(PIP_WHEELS),
    "system": st.sampled_from(SYSTEMS),
    "driver": st.sampled_from(DRIVERS),
    "major": sometimes(["12", "13", "11", "x"]),
    "forced": sometimes(FORCED),
    "mode": st.sampled_from(["exec", "dlopen"]),
    "flag": st.sampled_from(["SLIME_OFFLOAD_TRAIN", "TMS_AUTOPRELOAD"]),
}


def where_torch_looks(world: dict) -> dict:
    """The world with torch's own runtime where torch looks for it: NVIDIA's wheel in the venv for a torch from
    pip (its DT_RPATH), the loader cache for a system one."""
    kind, major = torch_runtime(world["torch"])
    if world["torch"].endswith("-pip"):
        return {**world, "pip": tuple(sorted({*world["pip"], major}))}
    place = "rocm6" if kind == "libamdhip64" else f"cuda{major}"
    return {**world, "system": tuple(sorted({*world["system"], place}))}


# Half the worlds are anything; half are a user's ordinary node, where a plan made by hand works often: a GPU
# torch whose runtime lies where it looks, a torch_memory_saver, the driver found, no override.
world_strategy = st.one_of(
    st.fixed_dictionaries({**ANY, "release": st.sampled_from(RELEASES[1:]), "torch": st.sampled_from(TORCHES[1:-1]),
                           "driver": st.sampled_from(["cache", "LD_LIBRARY_PATH"]), "major": st.none(),
                           "forced": st.none()}).map(where_torch_looks),
    st.fixed_dictionaries(ANY),
)


# The worlds in which this property found a disagreement, each run first on every run (what became of each:
# docs/guarantees.md).
FOUND: list[dict] = [
    # 0.0.8's driver-only build, a system CUDA 12 torch and NVIDIA's CUDA 12 wheel in the venv: exec mode mapped
    # both libcudart copies (the system one torch's libraries found, the wheel's torch loads by path).
    {"release": ("0.0.8", None), "torch": "cu12-sys", "pip": (12,), "system": ("cuda12",), "driver": "cache",
     "major": None, "forced": None, "mode": "exec", "flag": "TMS_AUTOPRELOAD"},
]


# ---------------------------------------------------------------- what one world does

# The flagged start's own account. torch's start is done as torch 2.14.1's _load_global_deps does it (the
# stand-in cannot be imported): libtorch_global_deps.so with RTLD_GLOBAL, then, where a libcudart is mapped,
# the first sys.path entry's NVIDIA runtime wheel copy by path (_preload_cuda_lib("cuda_runtime", ...):
# nvidia/cuda_runtime/lib, then nvidia/cu<major>/lib, then cuda_runtime/lib). Then torch_memory_saver's own
# check of LD_PRELOAD, from its installed code (its __init__ imports torch: only the modules the check needs
# are loaded), what is mapped, and a bash child.
PROBE = REEXECD + MAPPED + r"""
import ctypes, glob, json, os, subprocess, sys, types
site = next(p for p in sys.path if p.endswith('site-packages'))
out = {'reexecd': reexecd(), 'LD_PRELOAD': os.environ.get('LD_PRELOAD'),
       'LD_LIBRARY_PATH': os.environ.get('LD_LIBRARY_PATH'), 'torch': None, 'check': None,
       'init': [os.environ.get('TMS_INIT_ENABLE'), os.environ.get('TMS_INIT_ENABLE_CPU_BACKUP')]}
torch_dir = os.path.join(site, 'torch')
if os.path.exists(os.path.join(torch_dir, 'version.py')):
    version = {}
    exec(open(os.path.join(torch_dir, 'version.py')).read(), version)
    try:
        ctypes.CDLL(os.path.join(torch_dir, 'lib', 'libtorch_global_deps.so'), mode=ctypes.RTLD_GLOBAL)
        out['torch'] = 'loaded'
    except OSError as exc:
        out['torch'] = f'fails: {exc}'
    else:
        if mapped('libcudart.so') and version['cuda']:
            major = version['cuda'].split('.')[0]
            for path in sys.path:
                found = (glob.glob(os.path.join(path, 'nvidia', 'cuda_runtime', 'lib', 'libcudart.so.*[0-9]'))
                         + glob.glob(os.path.join(path, 'nvidia', f'cu{major}', 'lib', 'libcudart.so.*[0-9]'))
                         + glob.glob(os.path.join(path, 'cuda_runtime', 'lib', 'libcudart.so.*[0-9]')))
                if found:
                    ctypes.CDLL(found[0])
                    break
package = os.path.join(site, 'torch_memory_saver')
if os.path.exists(os.path.join(package, 'hooks', 'mode_preload.py')):  # 0.0.9 and later
    module = types.ModuleType('torch_memory_saver')
    module.__path__ = [package]
    sys.modules['torch_memory_saver'] = module
    from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
    try:
        ctypes.CDLL(HookUtilModePreload().get_path_binary())  # what its BinaryWrapper does with the answer
        out['check'] = 'accepted'
    except (AssertionError, OSError) as exc:
        out['check'] = f'refused: {exc}'
elif os.path.exists(os.path.join(package, '__init__.py')):  # 0.0.8: the check is _BinaryInfo.compute()
    sys.modules['torch'] = types.ModuleType('torch')  # imported at its top, used only by what is not run here
    import torch_memory_saver
    out['check'] = 'accepted' if torch_memory_saver._BinaryInfo.compute().enabled else 'refused'
files = mapped()
out['hooks'] = sorted({os.path.realpath(f) for f in files if 'torch_memory_saver' in os.path.basename(f)})
out['runtimes'] = sorted({os.path.realpath(f) for f in files
                          if os.path.basename(f).startswith(('libcudart.so', 'libamdhip64.so'))})
child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
out['child'] = [child.returncode, child.stderr[-500:]]
print(json.dumps(out))
"""

# One shell per world: the flagged start (its variables are the arguments after the first five), then the
# commands without the flag, each output in its own file. Where the shell's LD_LIBRARY_PATH is set, doctor is
# asked again without it: what env --json answers for (docs/reference.md). Where a plan made by hand is known
# to be fair (its LD_LIBRARY_PATH, else "-"), each installed preload build is tried with it: bash starting.
SHELL = r"""
py=$1 out=$2 probe=$3 site=$4 hand=$5; shift 5
env "$@" "$py" -c "$probe" >"$out/start.out" 2>"$out/start.err"; echo $? >"$out/start.rc"
"$py" -m tms_autopreload doctor --json >"$out/doctor.out" 2>"$out/doctor.err"; echo $? >"$out/doctor.rc"
"$py" -m tms_autopreload which >"$out/which.out" 2>"$out/which.err"; echo $? >"$out/which.rc"
"$py" -m tms_autopreload env --json >"$out/json.out" 2>"$out/json.err"; echo $? >"$out/json.rc"
if [ -n "${LD_LIBRARY_PATH+set}" ]; then
  env -u LD_LIBRARY_PATH "$py" -m tms_autopreload doctor --json >"$out/own.out" 2>"$out/own.err"
fi
if [ "$hand" != - ]; then
  for build in "$site"/torch_memory_saver_hook_mode_preload*.so "$site"/torch_memory_saver_cpp*.so; do
    [ -e "$build" ] || continue
    env LD_PRELOAD="$build" LD_LIBRARY_PATH="$hand" bash -c true 2>/dev/null; echo "$? $build" >>"$out/hand"
  done
fi
exit 0
"""


class Seen:
    """What one world did: each command's exit status, standard output and error."""

    def __init__(self, directory: Path) -> None:
        def read(name: str) -> str:
            path = directory / name
            return path.read_text() if path.exists() else ""

        self.runs = {name: (int(read(f"{name}.rc") or -1), read(f"{name}.out"), read(f"{name}.err"))
                     for name in ("start", "doctor", "which", "json")}
        self.doctor = json.loads(self.runs["doctor"][1])
        own = read("own.out")
        self.own = json.loads(own) if own else self.doctor
        self.hand = [(int(rc), build) for rc, build in (line.split(" ", 1) for line in read("hand").splitlines())]

    def rc(self, name: str) -> int:
        return self.runs[name][0]

    def out(self, name: str) -> str:
        return self.runs[name][1]

    def err(self, name: str) -> str:
        return self.runs[name][2]

    def probe(self) -> dict:
        return json.loads(self.out("start").strip().splitlines()[-1])

    def __repr__(self) -> str:
        return "\n".join(f"--- {name}: exit {rc}\n{out[-3000:]}\n{err[-3000:]}" for name, (rc, out, err)
                         in self.runs.items())


@functools.lru_cache(maxsize=None)
def dynamic(path: str) -> tuple[tuple[str, ...], str | None]:
    """(DT_NEEDED names, DT_SONAME) of an ELF file, as ``readelf`` reads them."""
    text = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True, check=True).stdout
    needed = tuple(re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", text))
    soname = re.search(r"\(SONAME\)\s+Library soname: \[(.*)\]", text)
    return needed, soname.group(1) if soname else None


RUNTIME_NAME = re.compile(r"(libcudart|libamdhip64)\.so\.(\d+)$")


def runtime_needs(path: str) -> set[tuple[str, int]]:
    """The runtimes (library stem, major) a file's DT_NEEDED names."""
    return {(m.group(1), int(m.group(2))) for m in map(RUNTIME_NAME.match, dynamic(path)[0]) if m}


def runtime_of(path: str) -> tuple[str, int]:
    """The runtime (library stem, major) a mapped runtime library is, by its DT_SONAME."""
    soname = dynamic(path)[1]
    m = RUNTIME_NAME.match(soname or "")
    assert m, (path, soname)
    return m.group(1), int(m.group(2))


def warnings_said(stderr: str) -> list[str]:
    """The warnings a start or a command printed, each once per line as they print them."""
    return [line[len("tms-autopreload: warning: "):] for line in stderr.splitlines()
            if line.startswith("tms-autopreload: warning: ")]


# ---------------------------------------------------------------- the worlds

@pytest.fixture(scope="module")
def elsewhere(tmp_path_factory) -> Path:
    """Where TMS_AUTOPRELOAD_PATH may name files outside any venv, in directories only root may write, with
    torch_memory_saver in their path: a copy of a build (:func:`forced_path`), a file that is no ELF object."""
    root = tmp_path_factory.mktemp("forced") / "torch_memory_saver_elsewhere"
    root.mkdir()
    (root / "torch_memory_saver_notes.so").write_text("not an ELF object\n")
    return root


def forced_path(world: dict, scn, elsewhere: Path) -> str | None:
    """What the world's TMS_AUTOPRELOAD_PATH names. "elsewhere" is a copy, outside the venv, of a build of the
    release the venv holds (the build of another release would not be what its Python side calls: 0.0.8's
    ``_BinaryInfo`` sets up functions 0.0.10's builds do not define), or 0.0.10's cu13 build where none is."""
    name = world["forced"]
    if name is None:
        return None
    if name == "elsewhere":
        folder = elsewhere / hashlib.sha1(str(scn.site).encode()).hexdigest()[:10]
        if not folder.exists():
            folder.mkdir()
            site_builds = [scn.site / n for n in (CU13, PLAIN, DRIVER_ONLY) if (scn.site / n).exists()]
            if site_builds:
                shutil.copy(site_builds[0], folder / site_builds[0].name)
            else:
                with zipfile.ZipFile(support.tms_wheel("0.0.10")) as z:
                    (folder / CU13).write_bytes(z.read(CU13))
                (folder / CU13).chmod(0o755)
        return str(next(folder.iterdir()))
    other = {"not-elf": str(elsewhere / "torch_memory_saver_notes.so"), "unnamed": os.path.realpath("/bin/true"),
             "relative": CU13, "missing": str(scn.site / "torch_memory_saver_missing.so")}
    return other.get(name, str(scn.site / name))


def make(world: dict, scenario, parts, elsewhere: Path):
    """The world's scenario (the session's cache: worlds that differ only in their host share a venv), the
    environment of its shell, and the variables its flagged start adds."""
    tms, layout = world["release"]
    host = (("driver",) if world["driver"] == "cache" else ()) + world["system"]
    scn = scenario(tms=tms, torch=world["torch"], pip=world["pip"], host=host, layout=layout)
    env = support.clean_env()
    if world["driver"] == "LD_LIBRARY_PATH":
        env["LD_LIBRARY_PATH"] = str(parts.stub)
    if world["major"] is not None:
        env["TMS_AUTOPRELOAD_CUDA_MAJOR"] = world["major"]
    forced = forced_path(world, scn, elsewhere)
    if forced is not None:
        env["TMS_AUTOPRELOAD_PATH"] = forced
    flagged = {world["flag"]: "1", "TMS_AUTOPRELOAD_MODE": world["mode"], "TMS_AUTOPRELOAD_VERBOSE": "1"}
    return scn, env, flagged


def hand_plan(world: dict, scn, parts, env: dict[str, str]) -> str | None:
    """The LD_LIBRARY_PATH of the plan anyone would make by hand, where the world is plain enough to have one: no
    override, and a GPU torch that loads unhooked (its own runtime library is where it looks: its DT_RPATH
    directory in the venv for pip's runtime, else the loader cache) on a host whose loader finds the driver.
    Torch's runtime directory first, then the shell's own entries. None elsewhere."""
    torch = world["torch"]
    if world["major"] or world["forced"] or torch in (None, "cpu"):
        return None
    kind, major = torch_runtime(torch)
    if kind == "libcudart" and world["driver"] == "none":
        return None
    wheel = scn.site / "nvidia" / ("cu13" if major == 13 else "cuda_runtime") / "lib"
    places = [wheel] if torch.endswith("-pip") else []
    if f"cuda{major}" in world["system"] or (kind == "libamdhip64" and "rocm6" in world["system"]):
        places.append(parts.hip if kind == "libamdhip64" else parts.rt[major])
    found = [d for d in places if (d / f"{kind}.so.{major}").exists()]
    if not found:
        return None
    return ":".join([str(found[0]), *filter(None, [env.get("LD_LIBRARY_PATH")])])


def fits(build: str, torch: str) -> bool:
    """A build fits torch where its own DT_NEEDED names torch's runtime, or no runtime (the driver's alone) for a
    CUDA torch."""
    runtime = torch_runtime(torch)
    return runtime_needs(build) == {runtime} or (not runtime_needs(build) and runtime[0] == "libcudart")


def observe(scn, env: dict[str, str], flagged: dict[str, str], hand: str | None) -> Seen:
    """Run the world's shell: the flagged start with ``flagged`` added, then the commands, then each build
    with the plan made by hand (``hand``, its LD_LIBRARY_PATH), where there is one."""
    with tempfile.TemporaryDirectory(prefix="tms-outcome-") as d:
        argv = ["sh", "-c", SHELL, "sh", str(scn.venv.python), d, PROBE, str(scn.site), "-" if hand is None else hand,
                *(f"{k}={v}" for k, v in flagged.items())]
        r = scn.host.run(argv, env, timeout=300)
        assert r.returncode == 0, (r.returncode, r.stderr)
        return Seen(Path(d))


# ---------------------------------------------------------------- the judgement

def judge(world: dict, seen: Seen, env: dict[str, str]) -> None:
    """The world's outcome (``env``: its shell's environment): hooked or stopped, and the commands agreeing."""
    doc = seen.doctor
    assert seen.rc("doctor") == (0 if doc["ok"] else 1), seen
    if seen.rc("start") == 78:
        # Where a plan made by hand works (a fitting build preloaded, torch's runtime directory first, bash
        # starting), there is one to find.
        works = [build for rc, build in seen.hand if rc == 0 and fits(os.path.realpath(build), world["torch"])]
        assert not works, (works, seen)
        judge_stop(seen)
    else:
        assert seen.rc("start") == 0, seen
        judge_hooked(world, seen, env)
    judge_env_json(seen, env)


def judge_stop(seen: Seen) -> None:
    """Exit 78 with the reason and a fix, and no plan anywhere: doctor's cause is a known one, its error the
    stop's words, and which says the same."""
    doc = seen.doctor
    r = subprocess.CompletedProcess([], seen.rc("start"), seen.out("start"), seen.err("start"))
    message = assert_stopped(r, verbose=True)
    assert "Fix:" in message, seen
    assert doc["plan"] is None and not doc["ok"], seen
    assert doc["cause"] in CAUSES and doc["error"] and doc["fix"], doc
    said = message.rstrip("\n").removeprefix("tms-autopreload: ")
    assert same_error(said, doc["error"]), (said, doc["error"])
    assert (doc["driver"]["verdict"] == "not-found") == (doc["cause"] == "no-driver"), doc["driver"]
    assert (seen.rc("which"), seen.out("which")) == (1, ""), seen
    assert seen.err("which") == f"tms-autopreload: {said}\n", seen


def judge_hooked(world: dict, seen: Seen, env: dict[str, str]) -> None:
    """Exit 0: one build mapped, the one doctor plans, needing the one runtime mapped, torch_memory_saver's
    own check accepting LD_PRELOAD, a bash child starting; which prints the build."""
    doc, out = seen.doctor, seen.probe()
    plan, rt = doc["plan"], doc["runtime"]
    assert plan is not None, seen
    assert out["hooks"] == [os.path.realpath(plan["file"])], (out["hooks"], plan)
    hook = out["hooks"][0]
    # The process's environment holds the plan, for its children and torch_memory_saver's check (both modes).
    assert out["LD_PRELOAD"] == plan["env"]["LD_PRELOAD"], (out, plan)
    assert out["LD_LIBRARY_PATH"] == plan["env"].get("LD_LIBRARY_PATH", env.get("LD_LIBRARY_PATH")), (out, plan)
    applied_by_exec = out["reexecd"]
    if world["mode"] == "exec":
        assert applied_by_exec, seen
    elif applied_by_exec:
        # dlopen mode falls back to exec where it says why (docs/reference.md's table). Of its reasons, these
        # worlds reach one: nothing is loaded before the start-up hook, and LD_PRELOAD is unset, so only a plan
        # that names no runtime library file (a driver-only build where torch's runtime is not visible).
        assert "dlopen mode: " in seen.err("start") and "falling back to exec" in seen.err("start"), seen
        assert rt["library"] is None, seen
    # The build's own DT_NEEDED names the runtime mapped, and exactly one runtime is mapped, but where the
    # documents say why another is (docs/reference.md): runtime.second, a copy torch loads by path that nothing
    # binds to; an override of another runtime than the one torch links, whose own copy torch maps beside it
    # where the host has it: runtime.split where the hook uses the override's runtime, none for a driver-only
    # build, which uses none.
    needs = runtime_needs(hook)
    assert len(needs) <= 1, (hook, needs)
    split = rt["split"]
    runtime = ("libcudart" if rt["kind"] == "cuda" else "libamdhip64", rt["major"])
    torch = torch_runtime(world["torch"]) if world["torch"] not in (None, "cpu") else None
    others = set()
    if rt["second"]:  # mapped where torch's libraries load, as torch loads it once they do
        assert rt["second"]["cause"] == "idle-runtime", rt["second"]
        second = os.path.realpath(rt["second"]["path"])
        assert (second in out["runtimes"]) == (out["torch"] == "loaded"), (out, rt["second"])
        others.add(second)
    if torch is not None and torch != runtime:
        assert (split is not None) == bool(needs), (split, needs)
        assert split is None or split["cause"] == "split-runtime", split
        others |= {r for r in out["runtimes"] if runtime_of(r) == torch}
    else:
        assert split is None, split
    ours = [r for r in out["runtimes"] if r not in others]
    if rt["library"] is None:  # no runtime copy found: only a build that needs none, which loads none
        assert not needs and ours == [], (hook, needs, out["runtimes"], rt)
    elif needs or torch == runtime:
        assert ours == [os.path.realpath(rt["library"])], (out["runtimes"], rt)
    else:  # a driver-only build, and no torch that loads this runtime: none mapped, or the one doctor names
        assert ours in ([], [os.path.realpath(rt["library"])]), (out["runtimes"], rt)
    if needs:
        assert needs == {runtime_of(ours[0])} == {runtime}, (hook, needs, ours, runtime)
    if torch == runtime and rt["library"] is not None:
        assert out["torch"] == "loaded", out  # torch's own libraries load in the hooked process, binding that copy
    # torch_memory_saver's own check (none without its package: TMS_AUTOPRELOAD_PATH alone named the build)
    if world["release"][0] is not None:
        assert out["check"] == "accepted", out
    assert out["child"][0] == 0, out["child"]
    # SLIME_OFFLOAD_TRAIN sets torch_memory_saver's own switches too, TMS_AUTOPRELOAD only the hook (reference.md)
    assert out["init"] == (["1", "1"] if world["flag"] == "SLIME_OFFLOAD_TRAIN" else [None, None]), out
    # The commands: doctor's verdict, which's path, the same warnings.
    assert doc["ok"] == (split is None), doc
    assert doc["error"] is None and doc["cause"] is None, doc
    assert (seen.rc("which"), seen.out("which")) == (0, plan["build"] + "\n"), seen
    said = warnings_said(seen.err("start"))
    assert warnings_said(seen.err("which")) == said, seen
    beyond = [w for w in doc["warnings"] if w not in said]  # doctor's own: the second runtime's, where there is one
    assert len(beyond) == (1 if rt["second"] else 0), (doc["warnings"], said)


def judge_env_json(seen: Seen, env: dict[str, str]) -> None:
    """``env --json`` prints the plan of this environment without this shell's LD_PRELOAD and LD_LIBRARY_PATH
    (docs/reference.md: for a Ray runtime_env): doctor's own plan where the shell sets neither, else the plan of
    doctor asked without them; no plan there: exit 1 and why."""
    own = seen.own
    if own["plan"] is not None:
        assert seen.rc("json") == 0, seen
        assert json.loads(seen.out("json")) == own["plan"]["env"], (seen.out("json"), own["plan"])
        return
    assert (seen.rc("json"), seen.out("json")) == (1, ""), seen
    head = ("tms-autopreload: for a process started without this shell's LD_PRELOAD and LD_LIBRARY_PATH (a Ray "
            "worker, from its raylet's environment): ")
    err = seen.err("json")
    assert err.startswith(head), err
    if seen.doctor["plan"] is None:
        assert err.endswith("\n") and same_error(err[len(head):-1], own["error"]), (err, own["error"])
    else:  # this shell has a plan only through its own variables: the fix is to send the flag instead
        assert "send the flag instead" in err and "LD_LIBRARY_PATH=" in err, err


def same_error(said: str, doctor: str) -> bool:
    """The start's error is doctor's, but where doctor (which traces every candidate: docs/reference.md) adds
    the real loader's answer to a candidate's line that the start did not trace."""
    ours, theirs = said.splitlines(), doctor.splitlines()
    return len(ours) == len(theirs) and all(a == b or (a.startswith("  - ") and b.startswith(a + "; loader: "))
                                            for a, b in zip(ours, theirs, strict=True))


def torch_runtime(torch: str) -> tuple[str, int]:
    """The runtime (library stem, major) a torch stand-in of kind ``torch`` links, from its version fields."""
    cuda, hip = TORCH_FIELDS[torch]
    return ("libcudart", int(cuda.split(".")[0])) if cuda else ("libamdhip64", int(hip.split(".")[0]))


# ---------------------------------------------------------------- the property

def test_every_world_ends_hooked_or_stopped_and_the_commands_agree(scenario, parts, elsewhere):
    def check(world):
        scn, env, flagged = make(world, scenario, parts, elsewhere)
        seen = observe(scn, env, flagged, hand_plan(world, scn, parts, env))
        judge(world, seen, env)

    for world in FOUND:
        check = example(world)(check)
    SETTINGS(given(world_strategy)(check))()
