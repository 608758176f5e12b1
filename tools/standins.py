"""Stand-ins for what cannot be real on a machine without a GPU, shared by tests, demo and bench.

Only three things are ever faked: the NVIDIA driver (``libcuda.so.1``), ROCm's
``libamdhip64.so.N``, and a torch build that has no wheel for this machine (CUDA 12, ROCm,
CPU-only). The torch stand-in carries exactly what tms_autopreload reads, ``torch/version.py``
and ``torch/lib/libtorch_global_deps.so`` linked against the *real* runtime library, and
raises if anyone imports it. Everything is compiled here with the system C compiler, or for
another Debian architecture (``arch="arm64"``) with Debian's cross compiler for it.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import apt
from basics import SetupError

__all__ = ["SetupError", "DRIVER_SYMBOLS", "cc", "compiler", "driver_stub", "hip_stub", "global_deps",
           "write_torch_standin"]

# Functions the preload builds import from the driver (nm -D --undefined-only, all released
# versions), plus the two every driver user calls first. Each returns CUDA_ERROR_NO_DEVICE (100).
DRIVER_SYMBOLS = ("cuInit", "cuDriverGetVersion", "cuCtxGetDevice", "cuDeviceGet", "cuDeviceGetAttribute",
                  "cuGetErrorString", "cuMemAddressFree", "cuMemAddressReserve", "cuMemCreate",
                  "cuMemGetAllocationGranularity", "cuMemMap", "cuMemRelease", "cuMemSetAccess",
                  "cuMemUnmap")


# Debian architecture -> the GNU triplet of its cross compiler (Debian's gcc-<triplet> package).
CROSS = {"arm64": "aarch64-linux-gnu"}


def compiler(arch: str | None = None) -> str | None:
    """The system C compiler (gcc, else cc, on PATH), or for ``arch`` Debian's cross compiler, installed
    from this machine's apt when missing (root only; raises SetupError when it cannot be)."""
    if arch is None:
        return shutil.which("gcc") or shutil.which("cc")
    triplet = CROSS[arch]
    apt.ensure({f"gcc-{triplet}": f"{triplet}-gcc", f"libc6-dev-{arch}-cross": f"/usr/{triplet}/include/stdio.h"},
               f"building the {arch} stand-ins")
    return shutil.which(f"{triplet}-gcc")


def cc(out: Path, source: str, *args: str, arch: str | None = None, shared: bool = True) -> Path:
    """Compile ``source`` (C) into the shared object ``out`` with the system C compiler (for ``arch``:
    its cross compiler); ``shared=False``: into the program ``out``."""
    compiler_path = compiler(arch)
    if compiler_path is None:
        raise SetupError("no C compiler (gcc or cc) on PATH: install one (Debian: apt-get install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.with_name(out.name + ".c")
    src.write_text(source)
    r = subprocess.run([compiler_path, *(["-shared", "-fPIC"] if shared else []), "-o", str(out), str(src), *args],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SetupError(f"{compiler_path} failed building {out}:\n{r.stderr}")
    return out


def driver_stub(directory: Path, version: str | None = None, arch: str | None = None) -> Path:
    """``libcuda.so.1`` defining the driver functions the hooks import, each failing with 100.

    With ``version``, installed the way NVIDIA's installer does it: the file ``libcuda.so.<version>``
    (SONAME ``libcuda.so.1``) and the link ``libcuda.so.1 -> libcuda.so.<version>``.
    """
    body = "".join(f"int {s}(void) {{ return 100; }}\n" for s in DRIVER_SYMBOLS)
    if version is None:
        return cc(directory / "libcuda.so.1", body, "-Wl,-soname,libcuda.so.1", arch=arch)
    real = cc(directory / f"libcuda.so.{version}", body, "-Wl,-soname,libcuda.so.1", arch=arch)
    link = directory / "libcuda.so.1"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(real.name)
    return link


def hip_stub(directory: Path, major: int = 6, arch: str | None = None) -> Path:
    """``libamdhip64.so.N``: no ROCm here, so a named library with one function stands in for it."""
    return cc(directory / f"libamdhip64.so.{major}", "int hipGetDevice(int *d) { return 100; }\n",
              f"-Wl,-soname,libamdhip64.so.{major}", arch=arch)


def global_deps(out: Path, link_dir: Path | None, soname: str | None, rpath: str | None,
                arch: str | None = None) -> Path:
    """A ``libtorch_global_deps.so`` that links ``soname`` (found in ``link_dir``) as torch's does.

    ``rpath`` is written as DT_RPATH (``--disable-new-dtags``), like the torch wheels'
    ``$ORIGIN/../../nvidia/cu13/lib``.
    """
    args = ["-Wl,--no-as-needed"]
    if soname:
        args += [f"-L{link_dir}", f"-l:{soname}"]
    if rpath:
        args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    return cc(out, "void torch_global_deps_standin(void) {}\n", *args, arch=arch)


def write_torch_standin(site: Path, *, cuda: str | None, hip: str | None, deps_lib: Path,
                        version: str = "2.99.0+standin") -> Path:
    """Put a torch stand-in into ``site``: real-format version.py and global-deps library; import raises."""
    torch = site / "torch"
    (torch / "lib").mkdir(parents=True, exist_ok=True)
    (torch / "__init__.py").write_text(
        "raise ImportError('torch stand-in (tms_autopreload tests/demo): only version.py and "
        "lib/libtorch_global_deps.so are real files')\n")
    (torch / "version.py").write_text(
        "from typing import Optional\n\n__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip']\n"
        f"__version__ = {version!r}\ndebug = False\ncuda: Optional[str] = {cuda!r}\n"
        f"git_version = '0'\nhip: Optional[str] = {hip!r}\n")
    shutil.copy(deps_lib, torch / "lib" / "libtorch_global_deps.so")
    return torch
