"""Both halves of the bug and the fix, side by side, in a throwaway sandbox (``make demo``).

Builds two venvs under ``.demo/`` (or ``--dir``), each with the real torch_memory_saver wheel, NVIDIA's
real runtime wheel and this checkout installed:

* ``cuda13``: the original report's node: torch for CUDA 13 (real with ``--real-torch``; otherwise the
  tests' stand-in, which says so), ``nvidia-cuda-runtime`` 13, torch_memory_saver 0.0.9.post1;
* ``cuda12``: a CUDA 12 node: torch for CUDA 12 (stand-in), ``nvidia-cuda-runtime-cu12``,
  torch_memory_saver 0.0.10 (one wheel with the cu12 and cu13 builds).

Where no NVIDIA driver is visible, the tests' driver stub stands in (and says so). Then it shows:

1. on the CUDA 13 node, slime's pick before commit a74ae3a0a (cu12, then unsuffixed: the code the original
   report quotes) and slime v0.2.4's (the unsuffixed name only, asserted to exist; in these releases a copy
   of the cu12 build): each bash child dies, ``libcudart.so.12``;
2. slime main's pick (cu13 first, from commit a74ae3a0a) on the CUDA 12 node: ``libcudart.so.13``;
3. both nodes started with ``SLIME_OFFLOAD_TRAIN=1`` and this package: each picks its own build;
4. ``tms-autopreload doctor`` for the CUDA 13 node;
5. where the sandbox lives and how to remove it.

A node's loader finds only what it has: when this machine's loader cache lists the runtime the pick
lacks (a CUDA toolkit installed system-wide), the crash is shown with the loader run without its cache
(``ld.so --inhibit-cache``), as on a node without that toolkit, and the demo says so.

Needs only Python >= 3.10, a C compiler and the package index.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from basics import SetupError  # noqa: E402
from sandbox import clean_copy  # noqa: E402
from standins import driver_stub, global_deps, write_torch_standin  # noqa: E402

TORCH = "torch==2.14.1"
# Per node: torch_memory_saver, NVIDIA's runtime wheel, the torch stand-in's CUDA, and where the runtime
# wheel puts libcudart (torch's DT_RPATH names it).
NODES = {
    13: ("torch-memory-saver==0.0.9.post1", "nvidia-cuda-runtime==13.5.37", "13.0", "nvidia/cu13/lib"),
    12: ("torch-memory-saver==0.0.10", "nvidia-cuda-runtime-cu12==12.9.79", "12.8", "nvidia/cuda_runtime/lib"),
}
HOOK = "torch_memory_saver_hook_mode_preload{}.abi3.so"


class Slime:
    """How one shape of slime's ``slime/ray/actor_group.py`` picks ``LD_PRELOAD``: the names it tries, in
    order (the first that exists wins; with one name, slime asserts that it exists). ``patch`` is the file
    in ``patches/slime/`` whose removed lines are that code (tests/test_demo.py checks each against it)."""

    def __init__(self, label: str, patch: str, names: tuple[str, ...]) -> None:
        self.label, self.patch, self.names = label, patch, names

    def rule(self) -> str:
        return ("LD_PRELOAD = the one name it has, asserted to exist:" if len(self.names) == 1 else
                "LD_PRELOAD = the first existing name of:")


SLIMES = (
    Slime("slime main before a74ae3a0a (8f732538a, the code the original report quotes: cu12 first)",
          "8f732538a-cu12-first.patch", (HOOK.format("_cu12"), HOOK.format(""))),
    Slime("slime v0.2.4 (the release: only the unsuffixed name, a copy of the cu12 build in 0.0.9.post1 and 0.0.10)",
          "v0.2.4.patch", (HOOK.format(""),)),
    Slime("slime main from a74ae3a0a (slime #2262: cu13 first)", "main-624b824a8.patch",
          (HOOK.format("_cu13"), HOOK.format("_cu12"), HOOK.format(""))),
)
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1")

PROBE = r"""
import json, os, subprocess
maps = sorted({f[5].strip() for f in (l.split(None, 5) for l in open('/proc/self/maps')) if len(f) == 6})
child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
print(json.dumps({'hook': [m for m in maps if 'torch_memory_saver' in m],
                  'cudart': [m for m in maps if os.path.basename(m).startswith('libcudart')],
                  'child': child.returncode, 'child_err': child.stderr.strip()}))
"""


def say(text: str = "") -> None:
    print(text, flush=True)


def fail(message: str) -> "None":
    say(f"demo: {message}")
    raise SystemExit(1)


def sh(cmd: list[str], env: dict[str, str] | None = None, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if check and r.returncode != 0:
        fail(f"`{' '.join(cmd)}` failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def venv_site(py: Path) -> Path:
    return Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())


@functools.lru_cache(maxsize=None)
def _own_pip() -> bool:
    """Whether this interpreter has a pip that can install into another environment (``--python``, pip >= 22.3)."""
    return subprocess.run([sys.executable, "-m", "pip", "--python", sys.executable, "--version"],
                          capture_output=True).returncode == 0


def _pip(py: Path) -> list[str]:
    """pip for the venv of ``py``: this interpreter's own when it can (no pip copied into each venv),
    else the venv's."""
    return [sys.executable, "-m", "pip", "--python", str(py)] if _own_pip() else [str(py), "-m", "pip"]


def _together(jobs: dict[str, list[str]]) -> None:
    """Run the commands at once (pip waits on the network, not the CPU); fail naming the first that failed."""
    procs = {what: subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for what, cmd in jobs.items()}
    for what, proc in procs.items():
        out, err = proc.communicate()
        if proc.returncode != 0:
            fail(f"{what} failed ({proc.returncode}):\n{out}{err}")


def build(sandbox: Path, real_torch: bool) -> dict[int, Path]:
    """Both nodes' venvs, with their wheels, this checkout and torch; returns each node's python."""
    pys = {major: sandbox / f"cuda{major}" / "bin" / "python" for major in NODES}
    for major, py in pys.items():
        if not py.exists():
            say(f"- creating a venv for the CUDA {major} node in {py.parent.parent}")
            sh([sys.executable, "-m", "venv", *(["--without-pip"] if _own_pip() else []), str(py.parent.parent)])
    quiet = ["install", "-q", "--disable-pip-version-check"]
    # From a clean copy: pip builds a source directory in place, and its build/ and egg-info left in the checkout
    # would be a second, stale distribution of the package to everything run from there (the tests among them).
    source = clean_copy(ROOT, sandbox / "source")
    wheel_build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--disable-pip-version-check",
                   "-w", str(sandbox / "build"), str(source)]
    jobs = {"building this checkout's wheel": wheel_build}
    for major, (tms, runtime, _, _) in NODES.items():
        say(f"- CUDA {major} node: installing {tms} and {runtime} (pip, from the package index)")
        jobs[f"installing into the CUDA {major} node"] = [*_pip(pys[major]), *quiet, tms, runtime]
    say("- building and installing this checkout into both")
    _together(jobs)
    wheel = max((sandbox / "build").glob("tms_autopreload-*.whl"), key=lambda p: p.stat().st_mtime)
    _together({f"installing this checkout into the CUDA {major} node":
               [*_pip(py), *quiet, "--no-deps", "--force-reinstall", str(wheel)] for major, py in pys.items()})
    for major, py in pys.items():
        _, _, cuda, runtime_dir = NODES[major]
        site = venv_site(py)
        if real_torch and major == 13:
            say(f"- installing real {TORCH} (the CUDA 13.0 build; several GB)")
            sh([*_pip(py), *quiet, TORCH])
        elif not (site / "torch" / "lib" / "libtorch_global_deps.so").exists() or \
                "standin" not in (site / "torch" / "version.py").read_text():
            soname = f"libcudart.so.{major}"
            say(f"- torch: using the tests' STAND-IN for torch 2.x+cu{cuda.replace('.', '')} (torch/version.py says "
                f"cuda='{cuda}'; torch/lib/libtorch_global_deps.so links the real {soname} via "
                f"$ORIGIN/../../{runtime_dir}; importing it raises)" + (
                    ". Pass --real-torch to install the real one." if major == 13 else ""))
            deps = global_deps(sandbox / "build" / f"cu{major}" / "libtorch_global_deps.so", site / runtime_dir,
                               soname, f"$ORIGIN/../../{runtime_dir}")
            write_torch_standin(site, cuda=cuda, hip=None, deps_lib=deps)
    return pys


def demo_env(sandbox: Path, py: Path) -> dict[str, str]:
    """The environment every demo process gets: the caller's, less LD_*/TMS_*/SLIME_*/PYTHON*, plus the
    driver stub when this machine's loader finds no libcuda.so.1."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LD_", "TMS_", "SLIME_", "PYTHON"))}
    check = sh([str(py), "-c", "import sys; from tms_autopreload.ldso import Loader; "
                "print(Loader.for_executable(sys.executable, '').find('libcuda.so.1') is not None)"], env=env)
    if check.stdout.strip() != "True":
        driver_stub(sandbox / "driver")
        env["LD_LIBRARY_PATH"] = str(sandbox / "driver")
        say(f"- no NVIDIA driver here: a STAND-IN libcuda.so.1 ({sandbox / 'driver'}) is on LD_LIBRARY_PATH for "
            f"every demo process; its functions return CUDA_ERROR_NO_DEVICE")
    return env


def slime_pick(py: Path, names: tuple[str, ...], env: dict[str, str], major: int) -> None:
    """What slime's pick (the first of ``names`` that exists) gives this node's train worker: its bash child,
    run by the loader."""
    site = venv_site(py)
    for name in names:
        say(f"      {name}")
    pick = next(site / n for n in names if (site / n).exists())
    missing = "libcudart.so.13" if "_cu13" in pick.name else "libcudart.so.12"
    say(f"   picked {pick.name} on this CUDA {major} node; the train worker's first child is a bash:")
    argv = ["bash", "-c", "true"]
    cached = sh([str(py), "-c", "import sys; from tms_autopreload.ldso import Loader; "
                 f"print(Loader.for_executable(sys.executable, '').cache.lookup({missing!r}) or '')"], env=env)
    loader = next((p for p in LOADERS if os.path.exists(p)), None)
    if cached.stdout.strip() and loader:
        say(f"   (this machine's loader cache lists {cached.stdout.strip()}, a toolkit this CUDA {major} node does "
            f"not have: the loader runs without its cache, {loader} --inhibit-cache, as on that node)")
        argv = [loader, "--inhibit-cache", shutil.which("bash") or "/bin/bash", "-c", "true"]
    r = sh(argv, env={**env, "LD_PRELOAD": str(pick)}, check=False)
    say(f"   $ LD_PRELOAD={pick.name} bash -c true")
    say(f"   exit {r.returncode}: {r.stderr.strip() or '(no message)'}")
    if r.returncode != 127:
        say(f"   (this machine can load {missing}, so the crash does not reproduce here; the pick is still the "
            f"wrong major for a CUDA {major} torch)")


def fixed(py: Path, env: dict[str, str], major: int) -> bool:
    """The same node's start with the flag: the hook it maps, its libcudart copies, its bash child."""
    say(f"   CUDA {major} node:")
    r = sh([str(py), "-c", PROBE], env={**env, "SLIME_OFFLOAD_TRAIN": "1"}, check=False)
    if r.returncode != 0:
        say(f"   exit {r.returncode}: {r.stderr.strip()}")
        return False
    out = json.loads(r.stdout.strip().splitlines()[-1])
    say(f"   mapped hook: {', '.join(out['hook'])}")
    say(f"   libcudart copies mapped: {len(out['cudart'])} ({', '.join(out['cudart']) or 'none yet'})")
    say(f"   its bash child: exit {out['child']}{' ' + out['child_err'] if out['child_err'] else ''}")
    return bool(out["hook"]) and out["child"] == 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=ROOT / ".demo", help="sandbox directory (default: .demo)")
    parser.add_argument("--real-torch", action="store_true", help="install real torch 2.14.1 (CUDA 13.0 build)")
    parser.add_argument("--clean", action="store_true", help="remove the sandbox and exit")
    args = parser.parse_args(argv)
    sandbox = args.dir.resolve()
    if args.clean:
        shutil.rmtree(sandbox, ignore_errors=True)
        say(f"removed {sandbox}")
        return 0
    if sys.version_info < (3, 10) or not sys.platform.startswith("linux"):
        fail("needs Linux and Python >= 3.10")
    if shutil.which("bash") is None:
        fail("needs bash (the crash is a bash child)")
    say("== building the sandbox")
    try:
        py = build(sandbox, args.real_torch)
        env = demo_env(sandbox, py[13])
    except SetupError as exc:
        fail(str(exc))

    before, release, main_ = SLIMES
    say("\n== 1. the original report, on a CUDA 13 node")
    for slime in (before, release):
        say(f"   {slime.label}; {slime.rule()}")
        slime_pick(py[13], slime.names, env, 13)
    say(f"\n== 2. {main_.label}, on a CUDA 12 node; {main_.rule()}")
    slime_pick(py[12], main_.names, env, 12)

    say("\n== 3. the same starts with SLIME_OFFLOAD_TRAIN=1 and tms_autopreload installed")
    ok = all([fixed(py[13], env, 13), fixed(py[12], env, 12)])

    say("\n== 4. tms-autopreload doctor (the CUDA 13 node)")
    r = sh([str(py[13]), "-m", "tms_autopreload", "doctor"], env=env, check=False)
    say("   " + r.stdout.rstrip().replace("\n", "\n   "))

    say(f"\n== 5. the sandbox is {sandbox}; remove it with `make demo-clean` (or rm -rf {sandbox})")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
