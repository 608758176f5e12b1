"""Wheels from the package index, downloaded once into the cache, and what is read out of them.

Wheels are downloaded once into ``$TMS_TEST_CACHE`` (default ``~/.cache/tms-autopreload-tests``) and
reused, for this machine or for another Debian architecture.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from basics import CACHE, ROOT, SetupError, cache_lock, pip_env, run

sys.path.insert(0, str(ROOT))  # the checkout's package: its tables
from tms_autopreload.gpu_libraries import CUDA_MAJORS

# NVIDIA's runtime wheels the suite installs, by CUDA major: the package's own names for them
# (gpu_libraries.CUDA_MAJORS), at versions pinned here, so that every run tests the same files.
RUNTIME_WHEELS = {major: f"{CUDA_MAJORS[major].wheel.partition('==')[0]}=={pin}"
                  for major, pin in {12: "12.9.79", 13: "13.5.37"}.items()}

# Debian architectures other than this machine's, and the wheel platform tag pip downloads for each.
PLATFORMS = {"arm64": "manylinux2014_aarch64"}


def wheel(spec: str, arch: str | None = None) -> Path:
    """The wheel for ``name==version`` from the package index, downloaded once into the cache: for
    this machine, or for the Debian architecture ``arch`` (kept apart, in ``wheels/<arch>``)."""
    name, _, version = spec.partition("==")
    dest = CACHE / "wheels" / (arch or "")
    dest.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    platform = ["--platform", PLATFORMS[arch]] if arch else []
    with cache_lock(f"wheel-{name}-{version}" + (f"-{arch}" if arch else "")):
        found = sorted(dest.glob(pattern))
        if not found:
            run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", *platform,
                 "-d", str(dest), spec], env=pip_env())
            found = sorted(dest.glob(pattern))
    if not found:
        raise SetupError(f"pip download {spec} gave no file matching {pattern}")
    return found[-1]


def runtime_wheel(major: int, arch: str | None = None) -> Path:
    return wheel(RUNTIME_WHEELS[major], arch)


def extract(whl: Path, member_glob: str, dest: Path) -> list[Path]:
    """Copy the members of a wheel matching ``member_glob`` into ``dest`` (flat)."""
    import fnmatch

    dest.mkdir(parents=True, exist_ok=True)
    out = []
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if fnmatch.fnmatch(name, member_glob):
                target = dest / os.path.basename(name)
                target.write_bytes(z.read(name))
                target.chmod(0o755)
                out.append(target)
    return out
