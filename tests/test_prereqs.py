"""The check `make test` and `make check` run first: everything missing, in one message, with how to get it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, clean_env, unshare_mounts

PREREQS = ROOT / "tools" / "prereqs.py"


def path_without(tmp_path: Path, *names: str) -> str:
    """A PATH of one directory linking every program of this PATH except ``names``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = bin_dir / entry.name
            if entry.name not in names and not link.exists() and os.access(entry.path, os.X_OK):
                link.symlink_to(entry.path)
    return str(bin_dir)


def prereqs(lane: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PREREQS), lane], capture_output=True, text=True, timeout=120,
                          env=clean_env(**env))


# `make check` checks the fast lane's own needs; the other lanes' (the aarch64 namespace, four CPythons,
# Slurm) are checked where they are needed, in `make test`.
def _lanes(*lanes: str) -> list:
    return [lane if lane == "check" else pytest.param(lane, marks=pytest.mark.slow) for lane in lanes]


@pytest.mark.parametrize("lane", _lanes("check", "test", "aarch64"))
def test_this_machine_has_everything(lane):
    r = prereqs(lane)
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")


@pytest.mark.slow  # the fast lane's missing compiler is in the test below, with everything else missing
@pytest.mark.parametrize("lane", ["check", "test"])
def test_missing_compiler_is_one_message_naming_gcc(tmp_path, lane):
    """Exactly the compiler's two lines more than this machine's own answer (which is empty here, under
    TMS_TEST_STRICT, by test_this_machine_has_everything)."""
    own = prereqs(lane).stderr.splitlines()[1:]
    r = prereqs(lane, PATH=path_without(tmp_path, "gcc", "cc"))
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert lines[0] == f"prereqs: `make {lane}` cannot run here; missing:"
    at = lines.index("  - a C compiler: no C compiler (gcc or cc) on PATH")
    assert lines[at + 1] == "      get it: Debian: apt-get install gcc"
    assert lines[1:at] + lines[at + 2:] == own


def test_everything_missing_is_listed_at_once(tmp_path):
    r = prereqs("test", PATH=path_without(tmp_path, "gcc", "cc", "unshare"))
    assert r.returncode == 1
    assert r.stderr.count("prereqs: ") == 1, r.stderr
    assert "  - unshare: no unshare on PATH\n      get it: Debian: apt-get install util-linux" in r.stderr
    assert "  - a C compiler: no C compiler (gcc or cc) on PATH" in r.stderr
    # the namespace probe needs unshare too, and says so instead of raising
    assert "  - private mount namespaces: cannot run unshare:" in r.stderr
    # and so does the aarch64 lane's, at once (it waited 60 s for a namespace that never came)
    assert ("  - a private binfmt_misc for arm64 programs: cannot start a namespace for arm64 programs: no unshare "
            "on PATH (util-linux)\n") in r.stderr, r.stderr


def _check_with_cache_on_a_tmpfs(mountpoint, size):
    """`prereqs.py check` with its download cache on a tmpfs of ``size`` mounted at ``mountpoint``, in a private
    mount namespace."""
    mountpoint.mkdir()
    script = f'mount -t tmpfs -o size={size} tmpfs "{mountpoint}" && exec "$@"'
    return subprocess.run([*unshare_mounts(), "sh", "-c", script, "sh", sys.executable, str(PREREQS), "check"],
                          capture_output=True, text=True, timeout=120,
                          env=clean_env(TMS_TEST_CACHE=str(mountpoint / "cache")))


def test_a_full_disk_is_named_with_what_is_needed(tmp_path):
    """A 16 MiB tmpfs as the download cache, in a private mount namespace."""
    small = tmp_path / "small"
    r = _check_with_cache_on_a_tmpfs(small, "16m")
    assert r.returncode == 1
    assert f"  - disk space: 0.0 GiB free under {small}, 1.0 GiB needed\n" in r.stderr, r.stderr
    assert "TMS_TEST_CACHE" in r.stderr


def test_a_cache_on_another_file_system_than_the_temporary_directory_is_named(tmp_path):
    """A tmpfs as the download cache, the temporary directory where it was: the hard-linked venv copies
    would fail there (cp -al across file systems), so prereqs names both places and the fix."""
    other = tmp_path / "other"
    r = _check_with_cache_on_a_tmpfs(other, "2g")
    assert r.returncode == 1
    assert (f"  - the download cache and the temporary directory on one file system: the download cache "
            f"({other / 'cache'}, on the file system of {other}) and the temporary directory") in r.stderr, r.stderr
    assert "point TMPDIR at a directory on the cache's file system" in r.stderr


def _wheel(folder: Path, name: str, version: str) -> None:
    """A minimal valid wheel of ``name`` ``version`` (what pip needs to resolve and download it)."""
    import zipfile

    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{f},,\n" for f in [*files, f"{info}/RECORD"])
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as zf:
        for f, text in files.items():
            zf.writestr(f, text)


@pytest.mark.slow  # pip runs
def test_the_suites_pip_lifts_a_configured_cap_and_keeps_the_rest_of_the_configuration(tmp_path):
    """The suite installs exactly what it pins, whatever cap a machine's pip configuration sets, and still
    reaches the index that configuration names (a mirror, a local folder, a proxy's certificate): with
    ``PIP_CONFIG_FILE=/dev/null`` a machine whose index is configured reached none (behind a proxy:
    pypi.org's certificate refused). Here the user's configuration names the only index (a local folder)
    and caps the package below what the suite asks for."""
    index, home = tmp_path / "wheels", tmp_path / "home"
    index.mkdir()
    for version in ("1.0", "2.0"):
        _wheel(index, "tms-pinned-demo", version)
    (home / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "caps.txt").write_text("tms-pinned-demo<=1.0\n")
    (home / ".config" / "pip" / "pip.conf").write_text(
        f"[global]\nno-index = true\nfind-links = {index}\nconstraint = {tmp_path / 'caps.txt'}\n")
    download = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(tmp_path / "got"),
                "tms-pinned-demo==2.0"]
    env = clean_env(HOME=str(home), TMS_TEST_CACHE=str(tmp_path / "cache"))
    capped = subprocess.run(download, capture_output=True, text=True, env=env, timeout=120)
    assert capped.returncode != 0, "the configured cap holds for pip itself"
    code = ("import os, subprocess, sys; sys.path.insert(0, sys.argv[1]); import basics;"
            "sys.exit(subprocess.run(sys.argv[2:], env=basics.pip_env()).returncode)")
    r = subprocess.run([sys.executable, "-c", code, str(ROOT / "tools"), *download], capture_output=True,
                       text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [p.name for p in (tmp_path / "got").iterdir()] == ["tms_pinned_demo-2.0-py3-none-any.whl"]
