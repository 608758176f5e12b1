"""What a flagged first start costs, in instructions: ``python3 tools/start_cost.py --against REV``.

Counts a real first start with ``SLIME_OFFLOAD_TRAIN=1`` under callgrind (``valgrind --tool=callgrind``,
``PYTHONHASHSEED=0``), in exec mode up to its re-exec and in dlopen mode whole, and a hooked child (``child``:
a start in the environment a flagged start leaves its children, the hook mapped), in the bench's venvs
(tools/bench.py: this checkout's and REV's, the same torch_memory_saver, runtime and torch stand-in). Two
things valgrind would change are undone by a ``.pth`` file sorted before the package's, present only while
this runs: its own ``LD_PRELOAD`` entries are taken out (the hook would keep them and warn), and ``execve``
ends the process (valgrind does not follow the re-exec, which P3 measures). The loader trace the start
spawns is another process and not counted. Wall time is the bench's (P2, P2'); this is its repeatable part.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from basics import CACHE  # noqa: E402
from bench import inherited, revision_venv, setup  # noqa: E402
from sandbox import find_python  # noqa: E402

_PTH = "aa_tms_start_cost.pth"
_PTH_LINE = ("import os; os.environ.get('TMS_START_COST') and (setattr(os, 'execve', lambda *a: os._exit(0)), "
             "os.environ.__setitem__('LD_PRELOAD', ':'.join(e for e in os.environ.get('LD_PRELOAD', '').split(':') "
             "if 'vgpreload' not in e)))\n")


def instructions(python: str, env: dict[str, str]) -> int:
    """Callgrind's total for a flagged ``python -c 'import os; os._exit(0)'``."""
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", python, "-c", "import os; os._exit(0)"]
    r = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/")
    found = re.search(r"Collected : (\d+)", r.stderr)
    if found is None or "tms-autopreload:" in r.stderr:
        raise SystemExit(f"the flagged start did not run cleanly under callgrind:\n{r.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", metavar="REV", required=True, help="the git revision to count beside this one")
    parser.add_argument("--python", default=f"{sys.version_info.major}.{sys.version_info.minor}")
    parser.add_argument("--dir", type=Path, default=CACHE / "bench", help="the bench's venvs (tools/bench.py --dir)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    python = find_python(args.python)
    if python is None:
        raise SystemExit(f"start_cost: python{args.python} not found")
    work = args.dir
    s = setup(work, python)
    sha, theirs = revision_venv(args.against, work, python)
    venvs = {"this checkout": s["venvs"]["with"], args.against + f" ({sha})": theirs}
    pths = []
    for py in (str(v.python) for v in venvs.values()):
        purelib = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
        pths.append(Path(purelib) / _PTH)
    try:
        for pth in pths:
            pth.write_text(_PTH_LINE)
        for mode in ("exec", "dlopen", "child"):
            for label, venv in venvs.items():
                flagged = {**s["base"], "SLIME_OFFLOAD_TRAIN": "1", "TMS_AUTOPRELOAD_MODE": mode}
                env = {**(inherited(venv, s["base"]) if mode == "child" else flagged), "TMS_START_COST": "1",
                       "PYTHONHASHSEED": "0"}
                print(f"{mode:6}  {instructions(str(venv.python), env):>12,}  {label}")
    finally:
        for pth in pths:
            pth.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
