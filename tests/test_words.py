"""Every word a user reads is on record: what each command and each flagged start prints, in each world.

Snapshot tests (syrupy; tests/words.py says the format and what the normaliser replaces): one transcript a
world, made in one shell, of ``doctor``, ``doctor --json``, ``which``, ``env``, ``env --json`` and two flagged
starts, verbose (exec mode with the slime flag, dlopen mode with the generic one), each with its streams and exit
status. The worlds:
every world of the scenario fixture (tests/test_sitepath.py's ``SCENARIO_WORLDS``: CUDA 13 system, pip-only CUDA
13 and 12, both runtimes, no driver, the driver-only build, ROCm, CPU torch, no torch, ...) and the overrides and
damaged installs that give each cause its words (:data:`MORE_WORLDS`). Then the refusals of ``activate()`` in a
running process, ``run``'s and ``kernel``'s messages, and ``doctor --ray``'s refusals. The way-out property's
stops are on record in its own cells (tests/test_way_out.py), ``doctor --deep`` and the node tables in
tests/test_words_nodes.py.

A snapshot that differs fails its test: read the diff; where the new words are right, ``--snapshot-update``
writes them (docs/development.md). :func:`test_every_cause_is_on_record` reads every snapshot file.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil

import pytest
from conftest import need
from support import ROOT, cc, extract, private_copy, tms_wheel, write_torch_standin
from test_sitepath import SCENARIO_WORLDS
from words import SYSTEM_PATH, normalise, places_of, snapshot_files, transcript

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"


def _flagged_starts(python: str) -> list[tuple[str, list[str]]]:
    return [("SLIME_OFFLOAD_TRAIN=1 TMS_AUTOPRELOAD_VERBOSE=1 python -c pass",
             ["env", "SLIME_OFFLOAD_TRAIN=1", "TMS_AUTOPRELOAD_VERBOSE=1", python, "-c", "pass"]),
            ("TMS_AUTOPRELOAD=1 TMS_AUTOPRELOAD_MODE=dlopen TMS_AUTOPRELOAD_VERBOSE=1 python -c pass",
             ["env", "TMS_AUTOPRELOAD=1", "TMS_AUTOPRELOAD_MODE=dlopen", "TMS_AUTOPRELOAD_VERBOSE=1", python, "-c",
              "pass"])]


def _commands(python: str) -> list[tuple[str, list[str]]]:
    said = [("tms-autopreload " + " ".join(args), [python, "-m", "tms_autopreload", *args])
            for args in (["doctor"], ["doctor", "--json"], ["which"], ["env"], ["env", "--json"])]
    return said + _flagged_starts(python)


def _home(tmp_path_factory) -> str:
    home = tmp_path_factory.getbasetemp() / "words-home"
    home.mkdir(exist_ok=True)
    return str(home)


def world_transcript(scn, tmp_path_factory, env: dict[str, str] | None = None, **places) -> str:
    """The commands' and the flagged starts' transcript of scenario ``scn``, normalised."""
    env = {"PATH": SYSTEM_PATH, "HOME": _home(tmp_path_factory), **(env or {})}
    said = transcript(scn.host, _commands(str(scn.venv.python)), env)
    return normalise(said, places_of(scn, **{"<home>": env["HOME"], **places}))


# ---------------------------------------------------------------- the scenario fixture's worlds

# One world of each kind of answer in the fast lane, each on a venv other fast tests make anyway; make test
# runs them all.
FAST_WORLDS = ("0.0.9.post1-cu13-sys", "cu13-sys-no-driver", "cu13-pip-only", "0.0.10-cu12-pip-only",
               "no-torch-pip13", "no-torch-two-systems", "no-torch-no-runtime", "no-torch-memory-saver", "cpu-torch")


@pytest.mark.parametrize("world", [w if w in FAST_WORLDS else pytest.param(w, marks=pytest.mark.slow)
                                   for w in SCENARIO_WORLDS])
def test_what_every_command_says_in_every_world(scenario, tmp_path_factory, said, world):
    """The scenario fixture's world: what the commands and the flagged starts say there."""
    assert world_transcript(scenario(**SCENARIO_WORLDS[world]), tmp_path_factory) == said


# ---------------------------------------------------------------- overrides and damaged installs

def _chmod_world_writable(scn):
    (scn.site / CU13).chmod(0o777)


def _chown_to_nobody(scn):
    site = scn.site
    os.chown(site / CU13, 65534, 65534)


def _no_builds(scn):
    site = scn.site
    for build in site.glob("torch_memory_saver*.so"):
        build.unlink()


def _version_py_unreadable(scn):
    site = scn.site
    version = site / "torch" / "version.py"
    version.unlink()
    version.mkdir()


def _torch_says_12_links_13(scn):
    write_torch_standin(scn.site, cuda="12.8", hip=None, deps_lib=scn.parts.global_deps("cu13-sys"))


def _not_a_build(scn):
    site = scn.site
    (site / "torch_memory_saver_hook_mode_preload_cu14.abi3.so").write_bytes(b"#!/bin/sh\nnot an ELF object\n")


def _spaced_copy(scn):
    site = scn.site
    (site / "with space").mkdir()
    shutil.copy2(site / CU13, site / "with space" / CU13)


def _bash_child_shadowed(scn):
    """A ``libtinfo.so.6`` in torch's runtime directory that needs a library that is gone: the plan puts that
    directory first on LD_LIBRARY_PATH, where bash would load it instead of its own (tests/test_mutant_kinds.py)."""
    lib = scn.site / "nvidia" / "cu13" / "lib"
    gone = cc(scn.site / "gone" / "libtms_test_gone.so.1", "int tms_test_gone(void) { return 0; }\n",
              "-Wl,-soname,libtms_test_gone.so.1")
    cc(lib / "libtinfo.so.6", "int tms_test_tinfo(void) { return 0; }\n", "-Wl,-soname,libtinfo.so.6",
       "-Wl,--no-as-needed", f"-L{gone.parent}", "-l:libtms_test_gone.so.1")
    shutil.rmtree(gone.parent)


def _start_module_gone(scn):
    (scn.site / "_tms_autopreload_start.py").unlink()


# name: (the scenario, the variables of the shell (values formatted with the site), what damages its venv: each of
# those has a venv of its own, ``tag``)
MORE_WORLDS = {
    "forced-path": (dict(torch="cu13-sys"), {"TMS_AUTOPRELOAD_PATH": "{site}/" + CU13}, None),
    "forced-path-no-file": (dict(torch="cu13-sys"), {"TMS_AUTOPRELOAD_PATH": "{site}/gone/" + CU13}, None),
    "forced-path-does-not-fit": (dict(torch="cu13-sys"), {"TMS_AUTOPRELOAD_PATH": "{site}/" + CU12}, None),
    "forced-path-with-a-space": (dict(torch="cu13-sys", tag="spaced"),
                                 {"TMS_AUTOPRELOAD_PATH": "{site}/with space/" + CU13}, _spaced_copy),
    "cuda12-override-splits-from-torch": (dict(torch="cu13-sys", host=("driver", "cuda13", "cuda12")),
                                          {"TMS_AUTOPRELOAD_CUDA_MAJOR": "12"}, None),
    "cuda-override-not-a-version": (dict(torch="cu13-sys"), {"TMS_AUTOPRELOAD_CUDA_MAJOR": "thirteen"}, None),
    "build-world-writable": (dict(torch="cu13-sys", tag="world-writable"), {}, _chmod_world_writable),
    "build-owned-by-another-user": (dict(torch="cu13-sys", tag="foreign-owner"), {}, _chown_to_nobody),
    "no-builds": (dict(tms="0.0.10", torch="cu13-sys", tag="no-builds"), {}, _no_builds),
    "not-a-build-beside-the-builds": (dict(torch="cu13-sys", tag="not-a-build"), {}, _not_a_build),
    "torch-version-unreadable": (dict(torch="cu13-sys", tag="version-unreadable"), {}, _version_py_unreadable),
    "torch-says-12-links-13": (dict(torch="cu13-sys", tag="inconsistent"), {}, _torch_says_12_links_13),
    # LD_LIBRARY_PATH just under the kernel's limit for one string (MAX_ARG_STRLEN), which the plan's entry
    # puts over it.
    "planned-library-path-too-long": (dict(torch="cu13-pip", pip=(13,), host=("driver",)),
                                      {"LD_LIBRARY_PATH": "/" + "x" * 131000}, None),
    "torch-runtime-not-on-this-host": (dict(torch="cu13-sys", host=("driver",)), {}, None),
    "system-torch-beside-a-pip-runtime": (dict(torch="cu13-sys", pip=(13,)), {}, None),
    "bash-child-would-not-start": (dict(torch="cu13-pip", pip=(13,), tag="child-shadowed"), {}, _bash_child_shadowed),
    "start-module-gone": (dict(torch="cu13-sys", tag="start-module-gone"), {}, _start_module_gone),
    "kill-switch-and-misspelt-values": (dict(torch="cu13-sys"), {"TMS_AUTOPRELOAD_DISABLE": "ture",
                                                                 "TMS_AUTOPRELOAD_VERBOSE": "ture"}, None),
}
# The fast lane's: those on a venv the fast worlds above make anyway, or a copy of one.
FAST_MORE = ("forced-path-no-file", "forced-path-does-not-fit", "cuda-override-not-a-version", "build-world-writable",
             "torch-version-unreadable", "torch-says-12-links-13", "planned-library-path-too-long",
             "torch-runtime-not-on-this-host", "start-module-gone", "kill-switch-and-misspelt-values")


@pytest.mark.parametrize("world", [w if w in FAST_MORE else pytest.param(w, marks=pytest.mark.slow)
                                   for w in MORE_WORLDS])
def test_what_every_command_says_where_an_override_or_a_damaged_install_decides(scenario, tmp_path_factory, said,
                                                                                  world):
    """A world of :data:`MORE_WORLDS`: the shell's override, or the venv damaged once (each has its own)."""
    kw, variables, damage = MORE_WORLDS[world]
    scn = scenario(**kw)
    if damage is not None and not getattr(scn, "damaged", False):
        damage(scn)
        scn.damaged = True
    env = {name: value.format(site=scn.site) for name, value in variables.items()}
    assert world_transcript(scn, tmp_path_factory, env) == said


@pytest.mark.parametrize("folder", [pytest.param("with space", marks=pytest.mark.slow), "with:colon"])
def test_what_every_command_says_in_a_venv_under_a_folder_ld_preload_cannot_name(scenario, tmp_path_factory, said,
                                                                                 folder):
    """The report's world in a venv under a folder whose name has a space or a colon, which split LD_PRELOAD: with a
    space the plan names the build by its bare name and its folder on LD_LIBRARY_PATH; a colon splits that too, so
    every build is refused for its path, and the fix says where to install instead."""
    from conftest import Scenario, report_host

    shared = report_host(scenario)
    venv = need(private_copy, shared.venv, tmp_path_factory.mktemp("words-spaced") / folder / "venv")
    scn = Scenario(venv, shared.host, shared.parts)
    assert world_transcript(scn, tmp_path_factory) == said


# ---------------------------------------------------------------- activate() in a running process

# activate() where the process already holds what it must load first: each refusal's cause and its words.
ACTIVATE = r"""
import ctypes, os, sys, types
state = sys.argv[1]
if state == 'torch imported':
    sys.modules['torch'] = types.ModuleType('torch')
elif state != 'fresh':
    ctypes.CDLL(sys.argv[2], mode=ctypes.RTLD_GLOBAL)
import tms_autopreload
try:
    plan = tms_autopreload.activate()
    print('activated:', plan.build)
except tms_autopreload.ResolveError as exc:
    print('cause:', exc.cause)
    print(exc)
"""


@pytest.fixture(scope="module")
def loaded_first(parts, tmp_path_factory):
    """What a process may have loaded before it calls activate(): a torch library (the CPU stand-in's, which
    links no runtime), torch_memory_saver 0.0.8's build (it links only the driver), and a library that defines
    what the hook defines (cudaMalloc, cudaFree)."""
    root = tmp_path_factory.mktemp("loaded-first")
    defines = need(cc, root / "libdefines_cuda_malloc.so",
                   "int cudaMalloc(void **p, unsigned long n) { return 0; }\nint cudaFree(void *p) { return 0; }\n")
    need(extract, need(tms_wheel, "0.0.8"), "torch_memory_saver_cpp.abi3.so", root)
    return {"a torch library loaded": parts.global_deps("cpu"),
            "a runtime library loaded": parts.rt[13] / "libcudart.so.13",
            "a torch_memory_saver build loaded": root / "torch_memory_saver_cpp.abi3.so",
            "cudaMalloc defined in the global scope": defines}


def test_what_activate_says_where_the_process_can_no_longer_be_hooked(scenario, tmp_path_factory, loaded_first, said):
    """``tms_autopreload.activate()`` (dlopen mode's loader, called from a notebook's first cell): in a fresh
    process it binds the hook; where torch (imported, or a library of it), a runtime, another build, or a definition
    of what the hook defines came first (in the global scope, or from ``LD_PRELOAD``), it refuses, naming the cause."""
    from conftest import report_host

    scn = report_host(scenario)
    python = str(scn.venv.python)
    steps = [("activate() in a fresh process", [python, "-c", ACTIVATE, "fresh"]),
             ("activate() after torch was imported", [python, "-c", ACTIVATE, "torch imported"])]
    steps += [(f"activate() with {state}", [python, "-c", ACTIVATE, state, str(path)])
              for state, path in loaded_first.items()]
    defines = loaded_first["cudaMalloc defined in the global scope"]
    steps.append((f"LD_PRELOAD={defines.name} activate()",
                  ["env", f"LD_PRELOAD={defines}", python, "-c", ACTIVATE, "fresh"]))
    env = {"PATH": SYSTEM_PATH, "HOME": _home(tmp_path_factory)}
    text = transcript(scn.host, steps, env)
    more = {"<loaded-first>": defines.parent, "<cpu-torch-deps>": loaded_first["a torch library loaded"].parent}
    assert normalise(text, places_of(scn, **more)) == said


@pytest.mark.slow
def test_what_activate_says_where_the_plan_names_no_runtime_library(scenario, tmp_path_factory, said):
    """torch_memory_saver 0.0.8's build links only the driver: it is the plan on a host where torch's runtime
    is not found, and dlopen mode cannot load the runtime before it; ``activate()`` says so."""
    scn = scenario(**SCENARIO_WORLDS["0.0.8-cu13-sys-driver-only"])
    steps = [("activate()", [str(scn.venv.python), "-c", ACTIVATE, "fresh"])]
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH, "HOME": _home(tmp_path_factory)})
    assert normalise(text, places_of(scn)) == said


def test_what_activate_says_where_proc_is_not_mounted(scenario, said):
    """Without ``/proc`` (a tmpfs mounted over it in the process's namespace) the hook is loaded but cannot be
    seen mapped: ``activate()`` says so, and the fix."""
    from conftest import report_host

    scn = report_host(scenario)
    r = scn.host.run([str(scn.venv.python), "-c", ACTIVATE, "fresh"], {"PATH": SYSTEM_PATH},
                     setup="mount -t tmpfs none /proc")
    assert r.stderr == "", r.stderr
    assert normalise(f"{r.stdout}--- exit {r.returncode}\n", places_of(scn)) == said


# ---------------------------------------------------------------- run, kernel, and doctor's refusals

def test_what_run_kernel_and_the_commands_refusals_say(scenario, tmp_path_factory, said):
    """``run`` with and without a command, a command that fails or is missing; ``kernel`` without jupyter_client,
    and what it refuses before asking it; usage errors; ``doctor --ray`` where Ray is not installed and the
    addresses it refuses; ``doctor --nodes`` of a file that is not there."""
    from conftest import report_host

    scn = report_host(scenario)
    tms = [str(scn.venv.python), "-m", "tms_autopreload"]
    steps = [(shlex.join(["tms-autopreload", *args]), [*tms, *args] if args[:1] != ["-c"] else [tms[0], *args])
             for args in (
        ["run", "--", "sh", "-c", "echo hooked: $LD_PRELOAD"], ["run", "--", "sh", "-c", "exit 7"],
        ["run", "--", "no-such-command-here"], ["run"], ["run", "sh", "-c", "echo no dashes"],
        ["kernel", "install", "--user"], ["kernel", "uninstall", "--user"],
        ["kernel", "install", "--prefix", ""], ["kernel", "install", "--name", "no spaces here"],
        ["kernel", "install", "--env", "NOEQUALS"], ["kernel"],
        ["-c", "from tms_autopreload.commands import kernelspec\ntry:\n    kernelspec.install('ours', 'x', {})\n"
               "except kernelspec.Error as exc:\n    print(f'cause: {exc.cause}')"],
        ["doctor", "--import", "json"], ["doctor", "--deep", "--as-is", "--mode", "dlopen"],
        ["doctor", "--ray"], ["doctor", "--ray", "--address", "local"], ["doctor", "--ray", "--timeout", "0"],
        ["doctor", "--ray", "--runtime-env", "not json"], ["doctor", "--nodes", "/nonexistent/documents"], [])]
    env = {"PATH": SYSTEM_PATH, "HOME": _home(tmp_path_factory), "COLUMNS": "100"}
    text = transcript(scn.host, steps, env)
    assert normalise(text, places_of(scn, **{"<home>": env["HOME"]})) == said


# kernel install's and uninstall's refusals by their cause, from the package's own errors (what the command prints
# is each error's words): jupyter_client answers, ipykernel hidden for the one that needs it gone.
KERNEL = r"""
import json, os, sys
from tms_autopreload.commands import kernelspec
prefix = sys.argv[1]
foreign = os.path.join(prefix, "share", "jupyter", "kernels", "python3")
os.makedirs(foreign)
with open(os.path.join(foreign, "kernel.json"), "w") as f:
    json.dump({"argv": ["python3", "-m", "ipykernel_launcher", "-f", "{connection_file}"], "display_name": "Python 3",
               "language": "python"}, f)
calls = [lambda: kernelspec.install("no spaces here", "x", {}, prefix=prefix),
         lambda: kernelspec.install("ours", "x", {"TMS_AUTOPRELOAD_DISABLE": "1"}, prefix=prefix),
         lambda: kernelspec.install("ours", "x", {}, prefix=""),
         lambda: kernelspec.uninstall("nothing-here", prefix=prefix),
         lambda: kernelspec.install("python3", "x", {}, prefix=prefix),
         lambda: kernelspec.uninstall("python3", prefix=prefix)]
for call in calls:
    try:
        call()
    except kernelspec.Error as exc:
        print(f"cause: {exc.cause}\n{exc}\n")
sys.modules["ipykernel"] = None  # as where it is not installed
try:
    kernelspec.install("ours", "x", {}, prefix=prefix)
except kernelspec.Error as exc:
    print(f"cause: {exc.cause}\n{exc}")
"""


def test_what_kernel_says_where_jupyter_is_installed(real_torch, tmp_path, said):
    """``kernel install`` and ``uninstall`` in real torch's venv, which has jupyter_client and ipykernel: what each
    does and what each refuses (a name Jupyter refuses, an ``--env`` that turns the hook off, a kernel that is not
    there or not this package's), then the same refusals by their cause, as the API raises them."""
    scn = real_torch(("driver",))
    tms = [str(scn.venv.python), "-m", "tms_autopreload", "kernel"]
    prefix = ["--prefix", str(tmp_path / "cli")]
    steps = [(shlex.join(["tms-autopreload", "kernel", *args]), [*tms, *args]) for args in (
        ["install", *prefix], ["install", *prefix, "--name", "ours", "--display-name", "Ours", "--env", "A=1"],
        ["install", *prefix, "--name", "no spaces here"], ["install", *prefix, "--env", "TMS_AUTOPRELOAD_DISABLE=1"],
        ["uninstall", *prefix, "--name", "nothing-here"], ["uninstall", *prefix, "--name", "ours"],
        ["uninstall", *prefix])]
    steps.append(("the refusals by their cause", [str(scn.venv.python), "-c", KERNEL, str(tmp_path / "api")]))
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH, "HOME": str(tmp_path), "COLUMNS": "100"})
    assert normalise(text, places_of(scn, **{"<prefix>": tmp_path})) == said


# A Ray whose ray.init raises, as it does where nothing answers (tests/test_preflight.py has the same stand-in).
RAY_STANDIN = {
    "ray/__init__.py": "def init(**kw):\n    raise ConnectionError('ray.init: no cluster answers at this address')\n",
    "ray/util/__init__.py": "",
    "ray/util/scheduling_strategies.py": "class NodeAffinitySchedulingStrategy:\n    pass\n",
    "ray/runtime_env.py": "class RuntimeEnv(dict):\n    pass\n",
}
# doctor --ray's refusals by their cause, from the package's own errors: the driver's recorded `refused` events
# (Ray's token authentication, as tests/test_ray.py's cluster gives them), a Ray that never answers (the
# stand-in), and the options it refuses.
PREFLIGHT = r"""
import sys
from tms_autopreload.commands.doctor import ray_cluster as preflight
events = [{"event": "refused", "why": "Unauthenticated: the cluster wants a token", "token_mode": False,
           "has_token": False},
          {"event": "refused", "why": "no token found", "token_mode": True, "has_token": False},
          {"event": "refused", "why": "Unauthenticated: token mismatch", "token_mode": True, "has_token": True}]
said = [preflight._refused("10.0.0.1:6379", event) for event in events]
for call in (lambda: preflight.check_address("local"), lambda: preflight.check_runtime_env('{"env_vars": {"A": 1}}'),
             lambda: preflight.run("auto", None, 20.0)):
    try:
        call()
    except preflight.Error as exc:
        said.append(exc)
for exc in said:
    print(f"cause: {exc.cause}\n{exc}\n")
"""


def test_what_doctor_ray_says_where_it_cannot_ask_the_nodes(scenario, tmp_path, said):
    from conftest import report_host

    scn = report_host(scenario)
    for name, text in RAY_STANDIN.items():
        (tmp_path / "ray-standin" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "ray-standin" / name).write_text(text)
    python = str(scn.venv.python)
    steps = [("doctor --ray's errors without Ray",
              [python, "-c", PREFLIGHT.replace("for exc in said", "said = said[-1:]\nfor exc in said")]),
             ("doctor --ray's errors: refused by Ray's token authentication (the driver's recorded events), options "
              "it refuses, a Ray that never answers",
              ["env", f"PYTHONPATH={tmp_path / 'ray-standin'}", python, "-c", PREFLIGHT]),
             ("tms-autopreload doctor --ray, a Ray that never answers",
              ["env", f"PYTHONPATH={tmp_path / 'ray-standin'}", python, "-m", "tms_autopreload", "doctor", "--ray",
               "--timeout", "20"])]
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH, "HOME": str(tmp_path)})
    assert normalise(text, places_of(scn, **{"<ray-standin>": tmp_path / "ray-standin"})) == said


# ---------------------------------------------------------------- every cause, on record

# The causes no snapshot carries, each with why. Keep it short: where a cause can be reached cheaply, snapshot it.
EXEMPT = {
    "error": "Error's default, where a raise names no cause: every raise of the package names one",
    "no-plan": "ResolveError's default, where a raise names no cause: every raise of the package names one",
    "in-process": "InProcessError's default, where a raise names no cause: every raise of the package names one",
    "invalid-request": "InvalidRequest's default: its raises name bad-kernel-name, empty-prefix or hook-off",
    "preferred-chosen": "a candidate's status, not a stop: doctor checks every candidate, so it never shows it",
    "no-executable": "sys.executable empty: an embedded interpreter that knows no executable, which no command "
                     "or start of a normal Python gives",
    "unreadable-interpreter": "the interpreter's own file unreadable by the process that runs it: not as root, "
                              "the suite's user",
    "interpreter-fails": "the interpreter cannot be started for the loader's trace (an exec failing with an error "
                         "other than E2BIG): no cheap world makes exec fail",
    "unchecked": "a path component lstat cannot examine: not as root, the suite's user",
    "dlopen-failed": "dlopen of a plan the real loader has just traced: only a file changed in between",
    "not-mapped": "dlopen returned but the hook is not in /proc/self/maps: the kernel's own list would have to lie",
    "unreadable-symbols": "the hook's symbol table unreadable after the loader traced it: only a file changed in "
                          "between",
    "two-runtimes": "a fitting build whose planned start binds another runtime copy than torch's: each binding is "
                    "chosen by the loader model to bind torch's copy, and the real loader agrees in every world here "
                    "(tests/test_plan_steps.py judges a recorded trace where it does not)",
    "not-preloaded": "the real loader neither preloads a build nor says why: glibc's loader always says "
                     "(tests/test_plan_steps.py judges a recorded silent trace)",
    "no-binding": "no binding is predicted to hold for a build that fits (torch's runtime copy where neither the "
                  "hook's search nor LD_LIBRARY_PATH can reach it): no world of the suite's makes one yet",
}


def _causes_on_record() -> set[str]:
    found: set[str] = set()
    for path in snapshot_files():
        text = path.read_text()
        found.update(re.findall(r'"cause": "([a-z-]+)"', text))
        found.update(re.findall(r"^cause: +([a-z-]+)", text, re.M))
    return found


def test_every_cause_is_on_record():
    """Every cause of ``errors.CAUSES`` is in a snapshot (a ``"cause"`` of a ``--json`` document, or a ``cause:``
    line: ``doctor --deep``'s, or an error's as its API gives it), but the written exemptions; and an exemption
    is only for a cause no snapshot carries."""
    import sys

    sys.path.insert(0, str(ROOT))
    from tms_autopreload.errors import CAUSES

    found = _causes_on_record()
    assert set(EXEMPT) <= set(CAUSES), set(EXEMPT) - set(CAUSES)
    assert sorted(set(CAUSES) - found - set(EXEMPT)) == [], "causes no snapshot carries"
    assert sorted(found & set(EXEMPT)) == [], "exempt, yet on record: drop the exemption"
    assert found <= set(CAUSES), found - set(CAUSES)


def test_the_normaliser_names_each_path_whole_the_longest_first_and_in_each_spelling(tmp_path):
    """A path inside another gets its own name; a longer name sharing a prefix is not cut; a symbolic link's target
    and the folder's real spelling name the same place; what is left of the suite's temporary directory is <tmp>; a
    run's version, PID and duration are named too."""
    import platform

    real = tmp_path / "real"
    (real / "venv" / "lib" / "site-packages").mkdir(parents=True)
    (tmp_path / "link").symlink_to(real)
    venv = tmp_path / "link" / "venv"
    site = venv / "lib" / "site-packages"
    text = (f"{site}/hook.so {real}/venv/lib/site-packages/hook.so {venv}2/bin/python {venv}/bin/python "
            f"python {platform.python_version()}, pid 4242, took 1.5 s")
    assert normalise(text, {"<venv>": venv, "<site>": site}) == (
        f"<site>/hook.so <site>/hook.so <tmp>/{tmp_path.name}/link/venv2/bin/python <venv>/bin/python "
        "python <python-version>, pid <pid>, took <seconds> s")
