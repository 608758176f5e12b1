"""What a start with no flag pays for ``tms_autopreload.pth``, in instructions: ``python tools/pth_cost.py``.

Counts the instructions of ``python -c pass`` under callgrind (``valgrind --tool=callgrind``, with
``PYTHONHASHSEED=0``: the same count for the same binary and files, whatever else the machine does) in a venv
holding no ``.pth``, one whose only ``.pth`` is an ``import os`` line (the floor: any import line costs that),
and one holding this checkout's ``tms_autopreload.pth`` (``--pth FILE``: another, such as an earlier
revision's). Prints each count and the difference over the floor. Wall time is the bench's (P1,
tools/bench.py); this is its repeatable part.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def instructions(python: Path) -> int:
    """Callgrind's total for ``python -c pass``."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", str(python), "-c", "pass"]
        r = subprocess.run(argv, capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"},
                           check=True)
    found = re.search(r"Collected : (\d+)", r.stderr)
    if found is None:
        raise SystemExit(f"callgrind printed no total:\n{r.stderr[-2000:]}")
    return int(found.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="the interpreter the venv is made from")
    parser.add_argument("--pth", type=Path, default=HERE.parent / "tms_autopreload.pth",
                        help="the .pth file to weigh (default: this checkout's)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        subprocess.run([args.python, "-m", "venv", "--without-pip", str(venv)], check=True)
        python = venv / "bin" / "python"
        site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                   capture_output=True, text=True, check=True).stdout.strip())
        counts = {"no .pth": instructions(python)}
        (site / "floor.pth").write_text("import os\n")
        counts["an `import os` line"] = instructions(python)
        os.unlink(site / "floor.pth")
        shutil.copy(args.pth, site / "tms_autopreload.pth")
        counts[f"{args.pth}"] = instructions(python)
    floor = counts["an `import os` line"]
    for label, count in counts.items():
        over = f"{(count - floor) / 1e6:+.3f} M over the floor" if label != "no .pth" else ""
        print(f"{count:>12,}  {label}  {over}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
