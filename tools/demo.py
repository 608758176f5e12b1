"""The seed's crash and the fix, side by side, in a throwaway sandbox (``make demo``).

Builds ``.demo/`` (or ``--dir``): a venv with the real torch_memory_saver 0.0.9.post1 wheel,
NVIDIA's real CUDA 13 runtime wheel, this checkout installed, and a torch for CUDA 13 (real
with ``--real-torch``; otherwise the tests' stand-in, which says so). Where no NVIDIA driver
is visible, the tests' driver stub stands in (and says so). Then it shows, in order:

1. slime's pick today (first existing name) and what the loader does with it;
2. the same start with ``SLIME_OFFLOAD_TRAIN=1`` and this package installed;
3. ``tms-autopreload doctor`` for the sandbox;
4. where the sandbox lives and how to remove it.

Needs only Python >= 3.10, a C compiler and the package index.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from standins import SetupError, driver_stub, global_deps, write_torch_standin  # noqa: E402

TMS = "torch-memory-saver==0.0.9.post1"
RUNTIME = "nvidia-cuda-runtime==13.5.37"
TORCH = "torch==2.14.1"
# slime/ray/actor_group.py before the fix: the first of these names that exists.
SLIME_NAMES = ("torch_memory_saver_hook_mode_preload_cu12.abi3.so", "torch_memory_saver_hook_mode_preload.abi3.so")

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


def build(sandbox: Path, real_torch: bool) -> tuple[Path, dict[str, str]]:
    """The sandbox venv and the environment every demo process gets."""
    venv = sandbox / "venv"
    py = venv / "bin" / "python"
    if not py.exists():
        say(f"- creating a venv in {venv}")
        sh([sys.executable, "-m", "venv", str(venv)])
    say(f"- installing {TMS}, {RUNTIME} and this checkout (pip, from the package index)")
    sh([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", TMS, RUNTIME, str(ROOT)])
    site = Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("LD_", "TMS_", "SLIME_", "PYTHON"))}
    if real_torch:
        say(f"- installing real {TORCH} (the CUDA 13.0 build; several GB)")
        sh([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", TORCH])
    elif not (site / "torch" / "lib" / "libtorch_global_deps.so").exists() or \
            "standin" not in (site / "torch" / "version.py").read_text():
        say("- torch: using the tests' STAND-IN for torch 2.x+cu130 (torch/version.py says cuda='13.0'; "
            "torch/lib/libtorch_global_deps.so links the real libcudart.so.13 via $ORIGIN/../../nvidia/cu13/lib; "
            "importing it raises). Pass --real-torch to install the real one.")
        deps = global_deps(sandbox / "build" / "libtorch_global_deps.so", site / "nvidia" / "cu13" / "lib",
                           "libcudart.so.13", "$ORIGIN/../../nvidia/cu13/lib")
        write_torch_standin(site, cuda="13.0", hip=None, deps_lib=deps)
    check = sh([str(py), "-c", "import sys; from tms_autopreload.ldso import Loader; "
                "print(Loader.for_executable(sys.executable, '').find('libcuda.so.1') is not None)"], env=env)
    if check.stdout.strip() != "True":
        driver_stub(sandbox / "driver")
        env["LD_LIBRARY_PATH"] = str(sandbox / "driver")
        say(f"- no NVIDIA driver here: a STAND-IN libcuda.so.1 ({sandbox / 'driver'}) is on LD_LIBRARY_PATH for "
            f"every demo process; its functions return CUDA_ERROR_NO_DEVICE")
    return py, env


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
        fail("needs bash (the seed's crash is a bash child)")
    say("== building the sandbox")
    try:
        py, env = build(sandbox, args.real_torch)
    except SetupError as exc:
        fail(str(exc))
    site = Path(sh([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())

    say("\n== 1. slime today: LD_PRELOAD = the first existing name of")
    for name in SLIME_NAMES:
        say(f"      {name}")
    pick = next(site / n for n in SLIME_NAMES if (site / n).exists())
    say(f"   picked {pick.name}; the train worker's first child is a bash:")
    r = sh(["bash", "-c", "true"], env={**env, "LD_PRELOAD": str(pick)}, check=False)
    say(f"   $ LD_PRELOAD={pick.name} bash -c true")
    say(f"   exit {r.returncode}: {r.stderr.strip() or '(no message)'}")
    if r.returncode != 127:
        say("   (this machine can load a CUDA 12 runtime, so the crash does not reproduce here; the pick is "
            "still the wrong major for a CUDA 13 torch)")

    say("\n== 2. the same start with SLIME_OFFLOAD_TRAIN=1 and tms_autopreload installed")
    r = sh([str(py), "-c", PROBE], env={**env, "SLIME_OFFLOAD_TRAIN": "1"}, check=False)
    if r.returncode != 0:
        say(f"   exit {r.returncode}: {r.stderr.strip()}")
        fail("the flagged start failed; see `tms-autopreload doctor` below")
    out = json.loads(r.stdout.strip().splitlines()[-1])
    say(f"   mapped hook: {', '.join(out['hook'])}")
    say(f"   libcudart copies mapped: {len(out['cudart'])} ({', '.join(out['cudart']) or 'none yet'})")
    say(f"   its bash child: exit {out['child']}{' ' + out['child_err'] if out['child_err'] else ''}")

    say("\n== 3. tms-autopreload doctor")
    r = sh([str(py), "-m", "tms_autopreload", "doctor"], env=env, check=False)
    say("   " + r.stdout.rstrip().replace("\n", "\n   "))

    say(f"\n== 4. the sandbox is {sandbox}; remove it with `make demo-clean` (or rm -rf {sandbox})")
    return 0 if out["hook"] and out["child"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
