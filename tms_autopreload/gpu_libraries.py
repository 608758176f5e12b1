"""The GPU libraries a process loads: the driver's and each runtime's names and wheel folders, each CUDA major.

A build is classified, a runtime located and a mapped file recognised by these names (``DT_NEEDED``
entries, ``SONAME`` s, mapped file names, NVIDIA's wheel folders), so they are written here once, with the
kinds of runtime and of build they tell apart, one table of what the package knows of each CUDA major,
and the reading of the version strings that name them.
"""

__all__ = ["CUDA", "HIP", "DRIVER_ONLY", "UNUSABLE", "DRIVER_SONAME", "DRIVER_FILE_PREFIX", "GLIBC_SONAMES",
           "CudaMajor", "CUDA_MAJORS", "WHEEL_FOLDER", "wheel_lib_dirs", "soname_prefix",
           "runtime_soname", "runtime_of", "runtime_name", "number", "release"]

# The kinds of GPU runtime (``cuda`` is also torch.version's field and doctor's JSON key for it, which are
# that field's name, not this kind), and the kinds of preload build besides them: what each links.
CUDA = "cuda"
HIP = "hip"
DRIVER_ONLY = "driver"  # a build that links only the driver (0.0.8's): it fits any CUDA runtime
UNUSABLE = "unusable"  # a file that links neither a runtime nor the driver
# NVIDIA's user-space driver library, which every torch_memory_saver build links, and its files' names
# (libcuda.so.<version>, which the soname links to).
DRIVER_SONAME = "libcuda.so.1"
DRIVER_FILE_PREFIX = "libcuda.so."
# glibc's own libraries (and its loader, by machine): they need nothing but each other, so a walk of what a
# hook brings in need not read them.
GLIBC_SONAMES = frozenset(("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                           "libresolv.so.2", "libutil.so.1", "libmvec.so.1", "ld-linux-x86-64.so.2",
                           "ld-linux-aarch64.so.1"))
# The DT_NEEDED name of each runtime: libcudart.so.N for CUDA, libamdhip64.so.N for HIP.
_SONAME_PREFIX = {CUDA: "libcudart.so.", HIP: "libamdhip64.so."}
# Where NVIDIA's runtime wheels put the library, under site-packages: nvidia-cuda-runtime (13 and later) in
# nvidia/cu<major>/lib, nvidia-cuda-runtime-cu11 and -cu12 in nvidia/<WHEEL_FOLDER>/lib.
WHEEL_FOLDER = "cuda_runtime"


def nvidia_lib_dir(folder: str) -> str:
    """The folder under site-packages where NVIDIA's wheel of ``folder`` (``cuda_runtime``, ``cublas``, ...,
    or a major's, :func:`major_folder`) puts its libraries; the one place it is spelt."""
    return f"nvidia/{folder}/lib"


def major_folder(major: "int | str") -> str:
    """The folder of CUDA ``major``'s wheels from 13 on (``cu13``): one per major, not one per library."""
    return f"cu{major}"


class CudaMajor:
    """What the package knows of one CUDA major: NVIDIA's pip wheel of its runtime as ``pip install`` takes it
    (before 11: none; from 13 one project, versioned by the CUDA release), the folder under site-packages that
    wheel puts the runtime library in, and the oldest driver that runs it. Which torch_memory_saver releases
    ship a build for it is :data:`tms_autopreload.releases.RELEASES`'."""

    __slots__ = ("major", "wheel", "lib_dir", "minimum_driver")

    def __init__(self, major: int, wheel: str, folder: str, minimum_driver: str) -> None:
        self.major = major
        self.wheel = wheel
        self.lib_dir = nvidia_lib_dir(folder)
        self.minimum_driver = minimum_driver


# The oldest drivers are the oldest Linux x86_64 driver that runs each CUDA major (minor-version
# compatibility), from NVIDIA's CUDA Toolkit Release Notes, section "CUDA Driver", table "CUDA Toolkit and
# Minimum Required Driver Version for CUDA Minor Version Compatibility"
# (docs.nvidia.com/cuda/cuda-toolkit-release-notes/), and the same rows in the CUDA Compatibility guide's
# "Minor Version Compatibility" table (docs.nvidia.com/deploy/cuda-compatibility/minor-version-compatibility.html):
# CUDA 13.x >= 580, CUDA 12.x >= 525.60.13, CUDA 11.x >= 450.80.02. Applied on aarch64 (ARM64 SBSA) as they
# are: the release notes' table has a Linux x86_64 column only, the Compatibility guide's per-major floors
# (>= 580, >= 525, >= 450) name no architecture, and no ARM64 SBSA table was found.
CUDA_MAJORS = {row.major: row for row in (
    CudaMajor(11, "nvidia-cuda-runtime-cu11", WHEEL_FOLDER, "450.80.02"),
    CudaMajor(12, "nvidia-cuda-runtime-cu12", WHEEL_FOLDER, "525.60.13"),
    CudaMajor(13, "nvidia-cuda-runtime==13.*", major_folder(13), "580"),
)}


def wheel_lib_dirs(major: int) -> "tuple[str, ...]":
    """The folders of site-packages where NVIDIA's pip wheels put CUDA ``major``'s runtime, in the order this
    package looks: the major's own folder first, where only that major's runtime can be. (torch looks the
    other way round for what it loads by path, and in one more folder: :func:`tms_autopreload.runtime.runtime_by_path`
    models its order.)"""
    return nvidia_lib_dir(major_folder(major)), nvidia_lib_dir(WHEEL_FOLDER)


def soname_prefix(kind: str) -> str:
    """What every DT_NEEDED name of ``kind``'s runtime library starts with (``libcudart.so.``)."""
    return _SONAME_PREFIX[kind]


def runtime_soname(kind: str, major: int) -> str:
    """The DT_NEEDED name of ``kind``'s runtime library of ``major``; the one place it is formatted."""
    return f"{soname_prefix(kind)}{major}"


def runtime_name(kind: str, major: "int | None") -> str:
    """``CUDA 13`` or ``ROCm/HIP 6``: how every message, table and ``doctor`` line names a runtime.

    Any kind but ``cuda`` is HIP's: the two are all there are, and a document read from another node
    is shown, not judged.
    """
    return f"{'CUDA' if kind == CUDA else 'ROCm/HIP'} {major}"


def number(text: str) -> "int | None":
    """A major version written in 1 to 3 ASCII digits, else None (``str.isdigit`` also accepts '²')."""
    return int(text) if 0 < len(text) <= 3 and text.isascii() and text.isdigit() else None


def release(version: "str | None") -> "tuple[int, ...]":
    """The release numbers of a version string as PyPI has them: ``0.0.9.post1`` -> (0, 0, 9), ``2.15.0+cu132``
    -> (2, 15, 0); () when it starts with none. The one reader of torch's and torch_memory_saver's versions."""
    out = []
    for part in (version or "").strip().split("+", 1)[0].split("."):
        digits = part[:len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def runtime_of(needed: str) -> "tuple[str, int] | None":
    """(kind, major) when a DT_NEEDED name is a runtime library, else None; the one place this is decided."""
    for kind, prefix in _SONAME_PREFIX.items():
        major = number(needed[len(prefix):].split(".", 1)[0]) if needed.startswith(prefix) else None
        if major is not None:
            return kind, major
    return None
