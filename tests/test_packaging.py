"""Issue 3 packaging: what pip, uv, an sdist and an editable install put in site-packages."""

from __future__ import annotations

import shutil
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from support import ROOT, Venv, find_python, run
from support import uv as sandbox_uv

# No PEP 829 .start: see test_startup_files.py.
STARTUP = {"tms_autopreload.pth"}
PROBE = "import os; print(os.environ.get('TMS_AUTOPRELOAD_STATE', ''))"


def _root_files(whl: Path) -> set[str]:
    with zipfile.ZipFile(whl) as z:
        return {n for n in z.namelist() if "/" not in n}


def _listing(site: Path) -> set[str]:
    return {str(p.relative_to(site)) for p in site.rglob("*") if "__pycache__" not in p.parts}


def test_wheel_carries_the_pth_alone_at_its_root(parts):
    assert _root_files(parts.own_wheel) == STARTUP
    with zipfile.ZipFile(parts.own_wheel) as z:
        pth = [line for line in z.read("tms_autopreload.pth").decode().splitlines() if not line.startswith("#")]
        entry = z.read(next(n for n in z.namelist() if n.endswith("entry_points.txt"))).decode()
        metadata = z.read(next(n for n in z.namelist() if n.endswith("METADATA"))).decode()
    assert len(pth) == 1 and pth[0].startswith("import os;")  # site.py runs only `import` lines
    assert "tms-autopreload = tms_autopreload.cli:main" in entry
    assert "Requires-Dist" not in metadata  # nothing that could swap the user's torch build


def test_sdist_builds_the_same_wheel(parts, tmp_path):
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(ROOT)])
    sdist = next(tmp_path.glob("tms_autopreload-*.tar.gz"))
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert STARTUP <= names and "setup.py" in names
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), str(sdist)])
    rebuilt = next((tmp_path / "w").glob("*.whl"))
    with zipfile.ZipFile(rebuilt) as a, zipfile.ZipFile(parts.own_wheel) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


@pytest.mark.parametrize("installer", ["pip", "uv"])
def test_install_and_uninstall_leave_nothing_behind(parts, tmp_path, installer):
    venv = Venv(tmp_path / "v", find_python("3.11") or sys.executable, [])
    before = _listing(venv.site)
    if installer == "pip":
        venv.install(parts.own_wheel)
    else:
        uv = sandbox_uv()
        run([uv, "pip", "install", "-q", "--python", str(venv.python), "--no-deps", str(parts.own_wheel)])
    assert STARTUP <= {p.name for p in venv.site.iterdir()}
    assert (venv.path / "bin" / "tms-autopreload").exists()
    if installer == "pip":
        run([sys.executable, "-m", "pip", "--python", str(venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
    else:
        run([uv, "pip", "uninstall", "-q", "--python", str(venv.python), "tms-autopreload"])
    assert _listing(venv.site) == before
    assert not (venv.path / "bin" / "tms-autopreload").exists()


def test_uv_install_hooks(scenario, tmp_path):
    """The same seed host, but our package installed by uv instead of pip."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"))
    uv = sandbox_uv()
    run([uv, "pip", "install", "-q", "--reinstall", "--python", str(scn.venv.python), "--no-deps",
         str(scn.parts.own_wheel)])
    r = scn.flagged(PROBE)
    assert r.returncode == 0 and r.stdout.strip().endswith("_cu13.abi3.so"), r.stderr


def test_editable_install_hooks(scenario, tmp_path):
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), python="3.12")
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                                             "__pycache__"))
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
    try:
        run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "install", "-q", "-e", str(src)])
        assert (scn.site / "tms_autopreload.pth").exists()
        r = scn.flagged(PROBE)
        assert r.returncode == 0 and r.stdout.strip().endswith("_cu13.abi3.so"), r.stderr
        r = scn.run(["-c", "import tms_autopreload; print(tms_autopreload.__file__)"], cwd=tmp_path)
        assert r.stdout.startswith(str(src)), r.stdout
    finally:
        run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
        scn.venv.install(scn.parts.own_wheel)
