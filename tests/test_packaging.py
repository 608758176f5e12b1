"""Packaging: what pip, uv, an sdist and an editable install put in site-packages."""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from packaging.metadata import Metadata
from support import MAPPED, REEXECD, ROOT, SetupError, Venv, clean_env, execs, fenced_blocks, find_python, run, wheel
from support import uv as sandbox_uv

import dist  # tools/, on the path support puts it
from sandbox import clean_copy

from tms_autopreload.startup import PYTHON_FLOOR


def _startup_files() -> set[str]:
    """setup.py's STARTUP_FILES: what the wheel puts at the root of site-packages (the ``.pth`` alone:
    no PEP 829 ``.start``, see test_startup_files.py)."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    value = next(node.value for node in tree.body if isinstance(node, ast.Assign)
                 and any(getattr(t, "id", None) == "STARTUP_FILES" for t in node.targets))
    return set(ast.literal_eval(value))


STARTUP = _startup_files()
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PROBE = REEXECD + MAPPED + """
import json
print(json.dumps([reexecd(), mapped('torch_memory_saver')]))
"""


def assert_hooked(scn, r):
    """Exactly the installed CUDA 13 build mapped, after one re-exec."""
    assert r.returncode == 0, r.stderr
    reexecd, hooks = json.loads(r.stdout.strip().splitlines()[-1])
    assert hooks == [str(scn.site / CU13)] and execs(reexecd) == 1, (hooks, reexecd, r.stderr)


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
        package = {n for n in z.namelist() if n.startswith("tms_autopreload/")}
    assert package == PACKAGE, package ^ PACKAGE  # both wings: pyproject.toml lists each package by name
    assert len(pth) == 1 and pth[0].startswith("import os;")  # site.py runs only `import` lines
    assert "tms-autopreload = tms_autopreload.commands.main:main" in entry
    assert "Requires-Dist" not in metadata  # nothing that could swap the user's torch build
    # The floor pip reads is the one the package says where an install was forced below it.
    assert f"\nRequires-Python: >={'.'.join(map(str, PYTHON_FLOOR))}\n" in metadata, metadata


def test_the_start_up_files_are_what_their_generator_writes_from_the_package(parts):
    """tms_autopreload.pth, the entry it imports and the left-over fallback are written by tools/pthfile.py from
    the package's own checked code (the fallback: leftover.left_over and what it uses, copied whole); the files
    in the tree and the wheel's members are that output, and setup.py ships exactly them."""
    sys.path.insert(0, str(ROOT / "tools"))
    import pthfile

    want = pthfile.texts()
    assert set(want) == STARTUP
    from tms_autopreload.startup import START_UP_FILES  # what the left-over fixes remove: what the wheel puts there

    assert set(START_UP_FILES) == STARTUP
    with zipfile.ZipFile(parts.own_wheel) as z:
        for name, text in want.items():
            assert (ROOT / name).read_text() == text, f"{name}: run `.venv-test/bin/python tools/pthfile.py`"
            assert z.read(name).decode() == text, name
    fallback = want["_tms_autopreload_left_over.py"]
    for name in ("parse_flag", "kill_switch", "unhooked_program", "pip_form", "way_out", "left_over"):
        assert f"\ndef {name}(" in fallback, name  # the rules it shares with the package, copied whole
    # What every start of the environment reads: one import line, then one comment that site.py skips, which that
    # line runs where its start module is gone (the rules it shares with the package, copied whole, then made short
    # by python-minifier).
    line, second = want["tms_autopreload.pth"].splitlines()
    assert line.startswith("import os;") and second.startswith("#exec("), second[:200]
    code = ast.literal_eval(ast.parse(second[1:]).body[0].value.args[0])
    assert " is left over: " in code and code.rstrip().endswith("(fullname)"), code


@pytest.mark.slow  # builds in an isolated environment from the index
def test_sdist_builds_the_same_wheel(parts, tmp_path):
    # From a copy: setuptools writes its egg-info into the tree it builds, and this checkout must stay as it was
    # (an egg-info beside the package is a distribution to importlib.metadata, which other tests judge).
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".hypothesis", ".pytest_cache"))
    run([sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(src)])
    sdist = next(tmp_path.glob("tms_autopreload-*.tar.gz"))
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert STARTUP <= names and "setup.py" in names
    with tarfile.open(sdist) as t:
        for name in STARTUP:
            member = next(m for m in t.getmembers() if m.name.endswith(f"/{name}"))
            assert t.extractfile(member).read() == (ROOT / name).read_bytes(), name
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "w"), str(sdist)])
    rebuilt = next((tmp_path / "w").glob("*.whl"))
    with zipfile.ZipFile(rebuilt) as a, zipfile.ZipFile(parts.own_wheel) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())


# Every scenario venv is installed by pip; pip's uninstall (seconds) is make test's.
@pytest.mark.parametrize("installer", [pytest.param("pip", marks=pytest.mark.slow), "uv"])
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
    """The same host as slime #2186, but our package installed by uv instead of pip."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"))
    uv = sandbox_uv()
    run([uv, "pip", "install", "-q", "--reinstall", "--python", str(scn.venv.python), "--no-deps",
         str(scn.parts.own_wheel)])
    assert_hooked(scn, scn.flagged(PROBE))


@pytest.mark.slow  # CPython 3.12 and an editable install
def test_editable_install_hooks(scenario, tmp_path):
    """``pip install -e``: hooked, and the start module beside the ``.pth`` imports the checkout's entry rather
    than a copy made at install time (tools/pthfile.py, ``editable_start``): a change to the checkout's rules
    reaches the next flagged start without a reinstall."""
    import pthfile

    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), python="3.12")
    src = clean_copy(ROOT, tmp_path / "src")
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
    try:
        run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "install", "-q", "-e", str(src)])
        assert (scn.site / "tms_autopreload.pth").exists()
        start = (scn.site / "_tms_autopreload_start.py").read_text()
        assert start == pthfile.editable_start((ROOT / "_tms_autopreload_start.py").read_text()), start
        assert_hooked(scn, scn.flagged(PROBE))
        r = scn.run(["-c", "import tms_autopreload; print(tms_autopreload.__file__)"], cwd=tmp_path)
        assert r.stdout.startswith(str(src)), r.stdout
        rules = src / "tms_autopreload" / "environment.py"
        edited = rules.read_text().replace('SLIME_DEFAULTS = {', 'SLIME_DEFAULTS = {"TMS_TEST_EDITED": "1", ', 1)
        rules.write_text(edited)
        r = scn.flagged("import os; print(os.environ.get('TMS_TEST_EDITED'))")
        assert (r.returncode, r.stdout) == (0, "1\n"), r.stderr
    finally:
        run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
        scn.venv.install(scn.parts.own_wheel)



@pytest.mark.slow  # an editable install builds in an isolated environment from the index
def test_editable_install_whose_checkout_moved(scenario, tmp_path):
    """``pip install -e`` of a checkout, then the checkout moved: the ``.pth`` the editable wheel put in
    site-packages is left over. A flagged start says so in one line naming it (no traceback) and stops
    (exit 78); an unflagged one runs, and says nothing."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), tag="editable-moved")
    src = clean_copy(ROOT, tmp_path / "checkout")
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "install", "-q", "-e", str(src)])
    assert_hooked(scn, scn.flagged(PROBE))
    src.rename(tmp_path / "moved")
    pth = scn.site / "tms_autopreload.pth"
    r = scn.run(["-c", "print('user code ran')"])
    assert (r.returncode, r.stdout, r.stderr) == (0, "user code ran\n", ""), r.stderr
    r = scn.flagged("print('user code ran')")
    assert (r.returncode, r.stdout) == (78, ""), r.stderr
    # No command can reinstall from a checkout that is gone: the fix removes the start-up files, and the message
    # says in words what hooks it again.
    python = scn.venv.python
    files = [str(pth), *(str(scn.site / n) for n in ("_tms_autopreload_start.py", "_tms_autopreload_left_over.py"))]
    removal = "env TMS_AUTOPRELOAD_DISABLE=1 " + shlex.join(["rm", "-f", "--", *files])
    assert r.stderr.splitlines()[0] == (
        f"tms-autopreload: {pth} is left over: the tms_autopreload package it starts cannot be imported, so this "
        f"process is not hooked. Fix: `{removal}` (its editable checkout {src} is gone (moved or deleted): to hook "
        f"{python} again, install tms-autopreload for it from where its checkout is now, in editable mode (pip's "
        f"-e), with pip's --force-reinstall; it is not on the package index)"), r.stderr
    # That command, from the flagged shell: the next start runs, unhooked, and says nothing.
    flagged = {**clean_env(), "SLIME_OFFLOAD_TRAIN": "1"}
    after = subprocess.run(["sh", "-c", f"{removal}; {shlex.join([str(python), '-c', 'pass'])}"], env=flagged,
                           capture_output=True, text=True, timeout=600)
    assert (after.returncode, after.stderr) == (0, ""), after.stderr
    # And what the words say, from the checkout's new place: the next start is hooked again.
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--force-reinstall", "-e",
         str(tmp_path / "moved")])
    assert_hooked(scn, scn.flagged(PROBE))


# ---------------------------------------------------------------- what a packager expects

# Both wings: a subpackage left out of pyproject.toml's list would be missing from the wheel.
PACKAGE = {str(p.relative_to(ROOT)) for p in (ROOT / "tms_autopreload").rglob("*.py") if "__pycache__" not in p.parts}
DIST_INFO = {"METADATA", "WHEEL", "RECORD", "entry_points.txt", "top_level.txt", "licenses/LICENSE"}
SDIST_TOP = {"LICENSE", "CHANGELOG.md", "README.md", "PKG-INFO", "pyproject.toml", "setup.cfg", "setup.py",
             "MANIFEST.in"}
EGG_INFO = {"PKG-INFO", "SOURCES.txt", "dependency_links.txt", "entry_points.txt", "top_level.txt"}


def _metadata(text: str) -> Metadata:
    """Core metadata parsed and validated by packaging (what twine and the index check)."""
    meta = Metadata.from_email(text, validate=True)
    assert meta.metadata_version == "2.4"  # License-Expression needs 2.4 (PEP 639)
    assert (meta.name, meta.license_expression, meta.license_files) == ("tms-autopreload", "Apache-2.0", ["LICENSE"])
    assert meta.license is None and not [c for c in meta.classifiers or () if c.startswith("License ::")]
    assert not meta.requires_dist  # nothing that could swap the user's torch build
    assert str(meta.requires_python) == ">=3.10" and meta.description_content_type == "text/markdown"
    assert meta.description.strip() == (ROOT / "README.md").read_text().strip()
    return meta


@pytest.mark.slow  # builds in an isolated environment from the index
def test_sdist_and_wheel_hold_the_package_its_license_and_nothing_else(tmp_path):
    """Built as a packager builds (``python -m build``: the sdist, then the wheel from the sdist) from a
    checkout that has been used: bytecode and test caches lie around in it."""
    src = tmp_path / "src"
    # A used checkout as it is, but for the caches tests beside this one write while it copies (a file replaced
    # midway fails the copy): those are planted below.
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info",
                                                             "__pycache__", ".hypothesis", ".pytest_cache"))
    for litter in ("tms_autopreload/__pycache__/plan.cpython-311.pyc", ".pytest_cache/v/cache/lastfailed",
                   "tests/__pycache__/conftest.cpython-311.pyc", ".hypothesis/examples/x"):
        (src / litter).parent.mkdir(parents=True, exist_ok=True)
        (src / litter).write_bytes(b"x")
    run([sys.executable, "-m", "build", "--outdir", str(tmp_path / "out"), str(src)])
    license_text = (ROOT / "LICENSE").read_bytes()
    assert license_text.startswith(b"\n                                 Apache License\n")

    (whl,) = (tmp_path / "out").glob("tms_autopreload-*.whl")
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        assert names == STARTUP | PACKAGE | {f"{dist_info}/{n}" for n in DIST_INFO}
        assert z.read(f"{dist_info}/licenses/LICENSE") == license_text
        wheel_meta = _metadata(z.read(f"{dist_info}/METADATA").decode())

    (sdist,) = (tmp_path / "out").glob("tms_autopreload-*.tar.gz")
    with tarfile.open(sdist) as t:
        top = f"tms_autopreload-{wheel_meta.version}"
        files = {m.name.removeprefix(f"{top}/") for m in t.getmembers() if m.isfile()}
        assert files == SDIST_TOP | STARTUP | PACKAGE | {f"tms_autopreload.egg-info/{n}" for n in EGG_INFO}
        assert t.extractfile(f"{top}/LICENSE").read() == license_text
        sdist_meta = _metadata(t.extractfile(f"{top}/PKG-INFO").read().decode())
    assert sdist_meta.version == wheel_meta.version


@pytest.mark.slow  # downloads setuptools
def test_install_without_build_isolation_on_the_declared_setuptools_floor(tmp_path):
    """``pip install --no-build-isolation .`` with exactly the oldest setuptools pyproject.toml allows."""
    (floor,) = re.findall(r'^requires = \["setuptools>=([\d.]+)"\]$', (ROOT / "pyproject.toml").read_text(), re.M)
    venv = Venv(tmp_path / "v", sys.executable, [wheel(f"setuptools=={floor}")])
    src = clean_copy(ROOT, tmp_path / "src")
    run([sys.executable, "-m", "pip", "--python", str(venv.python), "install", "-q", "--no-build-isolation",
         "--no-deps", "--no-index", str(src)])
    assert STARTUP <= {p.name for p in venv.site.iterdir()}
    (dist_info,) = venv.site.glob("tms_autopreload-*.dist-info")
    assert (dist_info / "licenses" / "LICENSE").read_bytes() == (ROOT / "LICENSE").read_bytes()
    assert "License-Expression: Apache-2.0" in (dist_info / "METADATA").read_text()


# ---------------------------------------------------------------- make dist (tools/dist.py)

EPOCH = "1700000000"


@pytest.fixture(scope="session")
def dist_build(tmp_path_factory):
    """``make dist``'s build of this checkout at :data:`EPOCH`: ``(sdist, wheel)``."""
    return dist.build(ROOT, tmp_path_factory.mktemp("dist") / "out", EPOCH)


def _untidy_copy(dest: Path) -> Path:
    """This checkout as another machine's checkout of it gives it: other file times, group-writable modes."""
    src = clean_copy(ROOT, dest)
    for path in src.rglob("*"):
        if path.is_file():
            path.chmod(0o664)
        os.utime(path, (1e9, 1e9))
    return src


@pytest.mark.slow  # builds the sdist and the wheel twice
def test_dist_is_the_same_bytes_for_the_same_source_and_epoch(dist_build, tmp_path):
    """A second build from a copy with other file times and modes, under another umask, at the same
    SOURCE_DATE_EPOCH: byte-identical; at another epoch the files differ (the epoch is what they carry)."""
    src = _untidy_copy(tmp_path / "src")
    old = os.umask(0o002)
    try:
        again = dist.build(src, tmp_path / "again", EPOCH)
    finally:
        os.umask(old)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in dist_build]
    later = dist.build(src, tmp_path / "later", str(int(EPOCH) + 86400))
    assert all(a.read_bytes() != b.read_bytes() for a, b in zip(later, dist_build, strict=True))
    with tarfile.open(dist_build[0]) as t:
        members = t.getmembers()
    assert {(m.mtime, m.uid, m.gid, m.uname, m.gname) for m in members} == {(int(EPOCH), 0, 0, "", "")}
    assert {m.mode for m in members if m.isfile()} == {0o644}
    with zipfile.ZipFile(dist_build[1]) as z:
        assert {i.date_time for i in z.infolist()} == {(2023, 11, 14, 22, 13, 20)}  # EPOCH in UTC
        modes = {i.filename.rpartition("/")[2]: i.external_attr >> 16 for i in z.infolist()}
    assert modes.pop("RECORD") == 0o100664  # what the wheel library gives it, on every build
    assert set(modes.values()) == {0o100644}


@pytest.mark.slow  # builds the sdist and the wheel
def test_dist_is_checked_as_the_index_checks_it(dist_build, tmp_path):
    """twine (metadata, README rendering) and check-wheel-contents pass on the build, and fail it on a
    wheel that carries bytecode."""
    sdist, wheel = dist_build
    dist.check(sdist, wheel)
    bad = tmp_path / wheel.name
    pyc = "tms_autopreload/__pycache__/plan.cpython-311.pyc"
    with zipfile.ZipFile(wheel) as good, zipfile.ZipFile(bad, "w") as z:
        for info in good.infolist():
            z.writestr(info, good.read(info) + (f"{pyc},,\n".encode() if info.filename.endswith("RECORD") else b""))
        z.writestr(pyc, b"")
    with pytest.raises(SetupError, match="W001"):
        dist.check(sdist, bad)


@pytest.mark.slow  # builds the sdist and the wheel
def test_dist_refuses_a_tag_that_names_another_version(dist_build):
    version = dist_build[1].name.split("-")[1]
    dist.check_tag(f"v{version}", dist_build[1])
    with pytest.raises(SetupError) as exc:
        dist.check_tag("v9.9.9", dist_build[1])
    assert str(exc.value) == (f"the tag v9.9.9 does not name the version built ({version}): tag the commit "
                              f"v{version}, or change __version__ in tms_autopreload/__init__.py to the tag's")


def test_dist_without_git_or_epoch_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    with pytest.raises(SetupError, match=r"set SOURCE_DATE_EPOCH \(seconds since 1970"):
        dist.source_date_epoch(tmp_path)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    assert dist.source_date_epoch(tmp_path) == EPOCH
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "2023-11-14")
    with pytest.raises(SetupError, match=r"SOURCE_DATE_EPOCH='2023-11-14' is not a time: set it to seconds"):
        dist.source_date_epoch(tmp_path)


def _readme_install_lines() -> list[str]:
    """README's lines for a team's nodes before the first upload: ``make dist``, then ``pip install`` of the
    wheel (comments off)."""
    (block,) = [b for b in fenced_blocks((ROOT / "README.md").read_text()) if b.startswith("make dist")]
    return [line.partition("#")[0].strip() for line in block.splitlines()]


@pytest.mark.slow  # builds the sdist and the wheel
def test_the_readme_install_lines_give_a_wheel_that_hooks(scenario, tmp_path):
    """README's two lines as a team runs them, one after the other in a checkout (this one's copy, the test
    venv as the Makefile's): ``make dist``, then ``pip install dist/<wheel>`` into a node's venv. The wheel,
    built from the sdist, hooks a flagged start on slime #2186's host."""
    make, install = _readme_install_lines()
    assert make == "make dist" and install.startswith("pip install dist/"), (make, install)
    src = clean_copy(ROOT, tmp_path / "checkout")
    venv = Path(sys.executable).parent.parent
    r = run([*shlex.split(make), "-C", str(src), f"VENV={venv}", "-o", f"{venv}/.ready"],
            env={**os.environ, "SOURCE_DATE_EPOCH": EPOCH})
    (wheel,) = (src / "dist").glob("*.whl")
    assert f"dist/{wheel.name}" in r.stdout.splitlines() and install == f"pip install dist/{wheel.name}", r.stdout
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), tag="readme-install")
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), "uninstall", "-y", "-q", "tms-autopreload"])
    pip, *args = shlex.split(install)
    assert pip == "pip"
    run([sys.executable, "-m", "pip", "--python", str(scn.venv.python), *args, "-q"], cwd=src)
    (record,) = scn.site.glob("tms_autopreload-*.dist-info/RECORD")
    assert "tms_autopreload.pth," in record.read_text()
    assert_hooked(scn, scn.flagged(PROBE))
