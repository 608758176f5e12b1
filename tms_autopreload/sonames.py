"""The library names the loader is asked for (the driver's, and each GPU runtime's by major), and the
name a person reads for each runtime.

A build is classified, a runtime located and a mapped file recognised by these names
(``DT_NEEDED`` entries, ``SONAME`` s, mapped file names), so they are written here once.
"""

__all__ = ["DRIVER_SONAME", "GLIBC_SONAMES", "runtime_soname", "runtime_of", "runtime_name"]

# NVIDIA's user-space driver library, which every torch_memory_saver build links.
DRIVER_SONAME = "libcuda.so.1"
# glibc's own libraries (and its loader, by machine): they need nothing but each other, so a walk of what a
# hook brings in need not read them.
GLIBC_SONAMES = frozenset(("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
                           "libresolv.so.2", "libutil.so.1", "libmvec.so.1", "ld-linux-x86-64.so.2",
                           "ld-linux-aarch64.so.1"))
# The DT_NEEDED name of each runtime: libcudart.so.N for CUDA, libamdhip64.so.N for HIP.
_SONAME_PREFIX = {"cuda": "libcudart.so.", "hip": "libamdhip64.so."}


def runtime_soname(kind: str, major: int) -> str:
    """The DT_NEEDED name of ``kind``'s runtime library of ``major``; the one place it is formatted."""
    return f"{_SONAME_PREFIX[kind]}{major}"


def runtime_name(kind: str, major: "int | None") -> str:
    """``CUDA 13`` or ``ROCm/HIP 6``: how every message, table and ``doctor`` line names a runtime.

    Any kind but ``cuda`` is HIP's: the two are all there are, and a document read from another node
    is shown, not judged.
    """
    return f"{'CUDA' if kind == 'cuda' else 'ROCm/HIP'} {major}"


def number(text: str) -> "int | None":
    """A major version written in 1 to 3 ASCII digits, else None (``str.isdigit`` also accepts '²')."""
    return int(text) if 0 < len(text) <= 3 and text.isascii() and text.isdigit() else None


def runtime_of(needed: str) -> "tuple[str, int] | None":
    """(kind, major) when a DT_NEEDED name is a runtime library, else None; the one place this is decided."""
    for kind, prefix in _SONAME_PREFIX.items():
        major = number(needed[len(prefix):].split(".", 1)[0]) if needed.startswith(prefix) else None
        if major is not None:
            return kind, major
    return None
