"""What torch's own ``__init__`` loads by path once imported, as each torch release has it.

``torch/__init__.py``'s ``_load_global_deps`` loads ``torch/lib/libtorch_global_deps.so`` (RTLD_GLOBAL); then,
when ``/proc/self/maps`` names a ``libcudart.so`` (a CUDA torch's always does by then), ``_preload_cuda_deps``
goes through an ordered list of NVIDIA libraries. For each it takes the first ``sys.path`` entry holding a
match of ``nvidia/<folder>/lib/<glob>``, then ``nvidia/cu<major>/lib/<glob>``, then ``<folder>/lib/<glob>``
(``<major>``: ``torch.version.cuda``'s), and loads the first match with ``ctypes.CDLL`` (RTLD_LOCAL) by path.
The whole list is one ``try`` block: a library that fails to load stops the ones after it, and in 2.13,
whose ``_preload_cuda_lib`` is called ``required=True``, so does one that is not found.

The runtime's entry is ``("cuda_runtime", "libcudart.so.*[0-9]")``: CUDA 12's wheel folder
(``nvidia-cuda-runtime-cu12``: ``nvidia/cuda_runtime/lib``) is searched before CUDA 13's
(``nvidia-cuda-runtime``: ``nvidia/cu13/lib``), and the glob takes any major. So a CUDA 13 torch with the
CUDA 12 wheel installed beside it maps that wheel's ``libcudart.so.12`` too: a second runtime, which nothing
binds to (RTLD_LOCAL, and no library asks for that name).

Read in torch 2.8.0, 2.9.0, 2.10.0, 2.12.0, 2.13.0, 2.14.0, 2.14.1 and 2.15.0 (``_get_cuda_dep_paths``,
``_preload_cuda_lib``, ``_preload_cuda_deps``, ``_load_global_deps``). Up to 2.9 the list is loaded only where
``libtorch_global_deps.so`` itself fails to load (its runtime not found); where it loads, only nvrtc and
nvJitLink follow by path, never a runtime. From 2.10 the list follows whenever a ``libcudart.so`` is mapped,
each entry required up to 2.13, best-effort from 2.14.0. A release between two read ones is taken to have
the earlier one's code, a release before 2.8 2.8's.
"""

import os

from .sitepath import search_path
from .gpu_libraries import CUDA, WHEEL_FOLDER, soname_prefix
from .gpu_libraries import release as release_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["code_of", "runtime_by_path", "stops_before_runtime"]

# (folder, glob) of each library in _preload_cuda_deps' list, in its order, up to the runtime's entry: the
# entries after it cannot stop it. Each glob is the file-name prefix followed by "*[0-9]".
_BEFORE_RUNTIME = (("cublas", "libcublasLt.so."), ("cublas", "libcublas.so."), ("cudnn", "libcudnn.so."),
                   ("cuda_nvrtc", "libnvrtc.so."), ("cuda_nvrtc", "libnvrtc-builtins.so."))
_RUNTIME = (WHEEL_FOLDER, soname_prefix(CUDA))
# (first release read with this code, whether a library not found stops the list, the entries up to the
# runtime's: none where no runtime is loaded by path once libtorch_global_deps.so has loaded). 2.9.0, 2.12.0,
# 2.14.1 and 2.15.0 read the same as the entry before them, but for entries after the runtime's (curand left
# the list in 2.15.0).
_RELEASES = (((2, 8), True, ()),
             ((2, 10), True, (*_BEFORE_RUNTIME, _RUNTIME)),
             ((2, 14), False, (*_BEFORE_RUNTIME, _RUNTIME)))


def code_of(version: "str | None") -> "tuple[str, bool, tuple[tuple[str, str], ...]]":
    """(the read release whose code ``version`` is taken to have, whether a library not found stops the list,
    the list up to the runtime's entry)."""
    release = release_of(version)
    chosen = _RELEASES[-1] if not release else _RELEASES[0]
    for entry in _RELEASES:
        if entry[0] <= release:
            chosen = entry
    return ".".join(map(str, chosen[0])), chosen[1], chosen[2]


def _matches(directory: str, prefix: str) -> "list[str]":
    """``glob(directory/prefix*[0-9])``, in the directory's order as glob gives it (no sort)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    return [os.path.join(directory, n) for n in names
            if n.startswith(prefix) and len(n) > len(prefix) and n[-1].isdigit() and not n.startswith(".")]


def _first(folder: str, prefix: str, cuda: str) -> "str | None":
    """``_preload_cuda_lib``'s pick: the first match in the first search path entry holding one."""
    major = cuda.split(".")[0]
    for entry in search_path():
        base = entry or "."
        found = (_matches(os.path.join(base, "nvidia", folder, "lib"), prefix)
                 + _matches(os.path.join(base, "nvidia", f"cu{major}", "lib"), prefix)
                 + _matches(os.path.join(base, folder, "lib"), prefix))
        if found:
            return os.path.abspath(found[0])
    return None


def runtime_by_path(cuda: "str | None", version: "str | None") -> "str | None":
    """The ``libcudart`` file torch ``version`` (``torch.version.cuda`` = ``cuda``) loads by path once
    imported, if its list gets that far (:func:`stops_before_runtime`); None for a torch that is not a
    CUDA build, or where no wheel holds one."""
    if not cuda or not code_of(version)[2]:
        return None
    return _first(*_RUNTIME, cuda)


def stops_before_runtime(cuda: str, version: "str | None",
                         cannot_load: "Callable[[str, set[str]], str | None]") -> "str | None":
    """Why torch's list stops before the runtime's entry, or None when it reaches it. ``cannot_load(path,
    loaded)``: why that library would fail to load by path, ``loaded`` the file names loaded before it."""
    release, required, entries = code_of(version)
    loaded: "set[str]" = set()
    for folder, prefix in entries[:-1]:
        path = _first(folder, prefix, cuda)
        if path is None:
            if required:
                return (f"torch {version or release}'s _preload_cuda_deps stops at {prefix}*[0-9], which no NVIDIA "
                        f"wheel on sys.path holds (each library it lists before the runtime is required there)")
            continue
        why = cannot_load(path, loaded)
        if why is not None:
            return f"torch's _preload_cuda_deps stops at {path}, which would not load ({why})"
        loaded.add(os.path.basename(path))
    return None
