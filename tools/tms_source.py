"""torch_memory_saver built here from its released source, for CUDA 12 and 13, with or without patches.

The PyPI sdist of 0.0.10 carries the same Python package and CUDA sources as upstream main at
4a43c97 (only its version string and a ROCm-only function in ``csrc/utils.h`` differ). It is built
as upstream's release does: once per CUDA major (``TMS_CUDA_MAJOR``), then merged into one wheel
with the cu12 builds also under the unsuffixed names. No CUDA toolkit and no GPU are needed: the
headers come from NVIDIA's pip wheels (the runtime's ``include/`` plus the ``crt/`` headers, which
CUDA 13 ships in ``nvidia-cuda-crt`` and CUDA 12 in ``nvidia-cuda-nvcc-cu12``), the runtime library
to link from the runtime wheel, and ``libcuda.so`` is the driver stand-in. Each wheel is built once
and kept in the cache.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

from basics import CACHE, ROOT, SetupError, cache_lock, run
from downloads import RUNTIME_WHEELS, extract, wheel
from tms_autopreload.gpu_libraries import CUDA, CUDA_MAJORS, runtime_soname
from tms_autopreload.releases import RELEASED_CUDA_MAJORS
from standins import driver_stub

SDIST_VERSION = "0.0.10"
UPSTREAM_COMMIT = "4a43c97771f139db0215c1378e8a0b50e679d23d"  # upstream main whose sources the sdist carries
# NVIDIA's wheels holding the headers the C++ sources include, beside the runtime wheel, per major:
# (requirement, the include directory inside it).
HEADER_WHEELS = {12: ("nvidia-cuda-nvcc-cu12==12.9.86", "nvidia/cuda_nvcc/include"),
                 13: ("nvidia-cuda-crt==13.5.37", "nvidia/cu13/include")}
# A source build: the patches applied to the sdist, in order.
SOURCE_BUILDS = {
    # as released, which is upstream main at UPSTREAM_COMMIT
    "0.0.10-source": (),
    # with a model of upstream #108 (not its code): $ORIGIN-relative RUNPATH to the pip runtime, and a
    # configure_subprocess() that prepends the parent's libcudart directory to LD_LIBRARY_PATH
    "0.0.10-source-runpath": (ROOT / "tests" / "data" / "torch_memory_saver-runpath-model.patch",),
    # with the patch this project ships for upstream
    "0.0.10-source-patched": (ROOT / "patches" / "torch_memory_saver" / "main-4a43c97.patch",),
    # the tree users will have next: the model of #108, then the same patch on top
    "0.0.10-source-runpath-patched": (ROOT / "tests" / "data" / "torch_memory_saver-runpath-model.patch",
                                      ROOT / "patches" / "torch_memory_saver" / "main-4a43c97.patch"),
}


def sdist() -> Path:
    """The torch_memory_saver sdist from the package index, downloaded once into the cache."""
    dest = CACHE / "sdists"
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / f"torch_memory_saver-{SDIST_VERSION}.tar.gz"
    with cache_lock(f"sdist-torch-memory-saver-{SDIST_VERSION}"):
        if not target.exists():
            # pip prepares the metadata of what it downloads; this setup.py refuses to run without a major.
            run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dest),
                 f"torch-memory-saver=={SDIST_VERSION}"], env={**os.environ, "TMS_CUDA_MAJOR": "13"})
    if not target.exists():
        raise SetupError(f"pip download gave no {target.name}")
    return target


# CPython before 3.10.12 and 3.11.4 (Debian bookworm's 3.11.2 among them) has no tarfile extraction filters.
TAR_FILTERS = hasattr(tarfile, "data_filter")


def unpack(dest: Path) -> Path:
    """The sdist's source tree under ``dest``: its files and directories only, each below ``dest``."""
    with tarfile.open(sdist()) as tar:
        if TAR_FILTERS:
            tar.extractall(dest, filter="data")
        else:
            # What the "data" filter does, for the plain members an sdist needs: refuse any other member
            # and any path outside ``dest``; owner this process, no special or group/other-write bits.
            members = tar.getmembers()
            odd = [m.name for m in members if not (m.isfile() or m.isdir()) or m.name.startswith("/")
                   or ".." in Path(m.name).parts]
            if odd:
                raise SetupError(f"{sdist()} holds members an sdist should not: {', '.join(odd[:5])}")
            for m in members:
                m.uid, m.gid, m.uname, m.gname = os.getuid(), os.getgid(), "", ""
                m.mode &= 0o755
            tar.extractall(dest, members)
    return dest / f"torch_memory_saver-{SDIST_VERSION}"


def _unzip_tree(whl: Path, prefix: str, dest: Path) -> None:
    """The members of ``whl`` under ``prefix``, written below ``dest`` with their relative paths."""
    with zipfile.ZipFile(whl) as z:
        for name in z.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                target = dest / name[len(prefix):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))


def cuda_home(root: Path, major: int) -> Path:
    """A CUDA_HOME the sdist's setup.py accepts, made of NVIDIA's wheels and the driver stand-in."""
    home = root / f"cuda{major}"
    req, include = HEADER_WHEELS[major]
    _unzip_tree(wheel(req), f"{include}/crt/", home / "include" / "crt")
    runtime = wheel(RUNTIME_WHEELS[major])
    wheel_lib = CUDA_MAJORS[major].lib_dir  # the runtime wheel's folders, as the package knows them
    _unzip_tree(runtime, f"{os.path.dirname(wheel_lib)}/include/", home / "include")
    lib = home / "lib64"
    extract(runtime, f"{wheel_lib}/{runtime_soname(CUDA, major)}", lib)
    (lib / "libcudart.so").symlink_to(runtime_soname(CUDA, major))
    driver_stub(lib)
    (lib / "libcuda.so").symlink_to("libcuda.so.1")
    return home


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def merge(wheels: dict[int, Path], out_dir: Path, local: str) -> Path:
    """One wheel with every major's builds, as upstream's merge_cuda_wheels.py makes it: the union of
    the files, the cu12 builds copied to the unsuffixed names, the version tagged ``+local``."""
    version = f"{SDIST_VERSION}+{local}"
    files: dict[str, bytes] = {}
    for major in sorted(wheels):
        with zipfile.ZipFile(wheels[major]) as z:
            for name in z.namelist():
                if ".dist-info/" not in name:
                    files[name] = z.read(name)
                elif major == min(wheels) and not name.endswith(("/RECORD", "/WHEEL")):
                    text = z.read(name).decode()
                    if name.endswith("/METADATA"):
                        text = re.sub(r"(?m)^Version: .*$", f"Version: {version}", text)
                    files[f"torch_memory_saver-{version}.dist-info/{name.split('/', 1)[1]}"] = text.encode()
    for name in list(files):
        m = re.fullmatch(r"(torch_memory_saver_hook_mode_\w+)_cu12(\.abi3\.so)", name)
        if m:
            files[m.group(1) + m.group(2)] = files[name]
    info = f"torch_memory_saver-{version}.dist-info"
    files[f"{info}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: tms-autopreload-tests\nRoot-Is-Purelib: false\n" \
                             b"Tag: cp39-abi3-linux_x86_64\n"
    record = "".join(f"{n},{_record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{info}/RECORD,,\n"
    out = out_dir / f"torch_memory_saver-{version}-cp39-abi3-linux_x86_64.whl"
    tmp = out.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0)), data, zipfile.ZIP_DEFLATED)
            z.getinfo(name).external_attr = (0o755 if name.endswith(".so") else 0o644) << 16
        z.writestr(f"{info}/RECORD", record)
    tmp.rename(out)
    return out


def source_wheel(name: str) -> Path:
    """The wheel of the source build ``name`` (a key of :data:`SOURCE_BUILDS`), built once.

    The cache key holds the patches' bytes, so a changed patch gives a new build.
    """
    patches = SOURCE_BUILDS[name]
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in patches)).hexdigest()[:10]
    local = f"{name.split('-', 1)[1].replace('-', '.')}.{digest}"
    dest = CACHE / "source-builds"
    dest.mkdir(parents=True, exist_ok=True)
    with cache_lock(f"source-build-{name}-{digest}"):
        found = sorted(dest.glob(f"torch_memory_saver-{SDIST_VERSION}+{local}-*.whl"))
        if found:
            return found[-1]
        if shutil.which("g++") is None or shutil.which("git") is None:
            raise SetupError("building torch_memory_saver needs g++ and git (Debian: apt-get install g++ git)")
        with tempfile.TemporaryDirectory(prefix="tms-source-") as tmp:
            root = Path(tmp)
            src = unpack(root / "src")
            for patch in patches:
                r = subprocess.run(["git", "apply", "--verbose", str(patch)], cwd=src, capture_output=True, text=True)
                if r.returncode != 0:
                    raise SetupError(f"git apply {patch.name} to the {SDIST_VERSION} sdist failed:\n{r.stderr}")
            built: dict[int, Path] = {}
            for major in RELEASED_CUDA_MAJORS:
                tree = root / f"tree{major}"
                shutil.copytree(src, tree)
                env = {**os.environ, "TMS_CUDA_MAJOR": str(major), "CUDA_HOME": str(cuda_home(root, major)),
                       "TMS_PLATFORM": "cuda"}
                run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(root / f"dist{major}"),
                     str(tree)], env=env)
                built[major] = next((root / f"dist{major}").glob("torch_memory_saver-*.whl"))
            return merge(built, dest, local)
