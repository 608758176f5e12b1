"""Which GPU runtime (CUDA or HIP, and its major version) this process will use, and from where.

Decided without importing torch: ``torch/version.py`` is plain text that states the build
(``cuda = '13.0'``, ``hip = None``), and ``torch/lib/libtorch_global_deps.so`` lists the runtime
library torch really links, which we resolve with the loader's own rules to the file torch
will bind to. Without torch (``tms-autopreload run -- CMD`` users), the loader's view and
NVIDIA's pip runtime wheels decide, and only when exactly one major is visible.
``TMS_AUTOPRELOAD_CUDA_MAJOR`` overrides detection in every case.

What torch's own ``__init__`` loads by path once imported, as each torch release has it, is read here too
(:func:`runtime_by_path`, :func:`stops_before_runtime`): that is where a second runtime copy comes from.
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

One module with the runtime's detection, not two: the flagged start needs both, and each module costs it
about 0.4 million instructions to import.
"""

import os

from . import sitepath
from .environment import CUDA_MAJOR_VAR, read_regular, same_file
from .elf import ElfError, read_dynamic
from .errors import (CAUSE_BAD_VERSION, CAUSE_CPU_ONLY_TORCH, CAUSE_NO_RUNTIME_VISIBLE, CAUSE_SEVERAL_RUNTIMES,
                     CAUSE_TORCH_INCONSISTENT, CAUSE_TORCH_UNREADABLE, ResolveError, shown)
from .ldso import Found, Loader, Object
from .gpu_libraries import (CUDA, CUDA_MAJORS, GLIBC_SONAMES, HIP, WHEEL_FOLDER, major_folder, number, nvidia_lib_dir,
                            runtime_name, runtime_of, runtime_soname, soname_prefix, wheel_lib_dirs)
from .gpu_libraries import release as release_of

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

__all__ = ["Runtime", "TorchBuild", "detect", "read_torch", "install_hint", "split_from_torch", "code_of",
           "runtime_by_path", "stops_before_runtime"]





_REINSTALL_TORCH = f"reinstall torch, or set {CUDA_MAJOR_VAR}=N to name the CUDA major yourself"


def install_hint(kind: str, major: int) -> str:
    """What provides a runtime, for error messages: only a wheel NVIDIA publishes, else the toolkit."""
    if kind == HIP:
        return f"install ROCm {major} ({runtime_soname(kind, major)})"
    if major in CUDA_MAJORS:
        from .installer import pip_command

        return f"{pip_command('install', CUDA_MAJORS[major].wheel)} (or a CUDA {major} toolkit)"
    return f"install a CUDA {major} toolkit (NVIDIA publishes no pip wheel of its runtime)"


class TorchBuild:
    """What torch's files say about the build, read without importing torch."""

    __slots__ = ("dir", "version", "cuda", "hip", "links", "global_deps")

    def __init__(self, dir: str, version: str | None, cuda: str | None, hip: str | None,
                 links: tuple[str, ...], global_deps: Object | None) -> None:
        self.dir = dir
        self.version = version
        self.cuda = cuda
        self.hip = hip
        self.links = links  # runtime libraries libtorch_global_deps.so needs
        self.global_deps = global_deps


class Runtime:
    """The runtime this process will use and the evidence for it."""

    __slots__ = ("kind", "major", "source", "library", "library_rule", "library_why", "torch", "second")

    def __init__(self, kind: str, major: int, source: str, found: Found | None,
                 torch: TorchBuild | None, why: str | None = None, second: str | None = None) -> None:
        self.kind = kind  # CUDA or HIP (gpu_libraries)
        self.major = major
        self.source = source  # where the decision came from, in words
        # The runtime library file the process will bind to, and the rule that finds it.
        self.library = found.path if found else None
        self.library_rule = found.rule if found else None
        # Why this copy, in words: which object finds it by which rule, or torch's own load by path.
        self.library_why = why or (f"found by {found.rule}" if found else None)
        self.torch = torch
        # A second runtime file torch maps by path besides this one, which nothing binds to (:func:`runtime_by_path`).
        self.second = second

    @property
    def soname(self) -> str:
        return runtime_soname(self.kind, self.major)

    @property
    def name(self) -> str:
        """``CUDA 13`` or ``ROCm/HIP 6``."""
        return runtime_name(self.kind, self.major)

    def describe(self) -> str:
        return f"{self.name} ({self.source})"


def _parse_version_py(text: str) -> dict[str, str | None]:
    """Read ``name = 'value'`` / ``name: Optional[str] = None`` lines of torch/version.py.

    Why not ``ast``: it costs about 2 ms to import, and the file is generated by torch's
    build with one assignment per line.
    """
    values: dict[str, str | None] = {}
    for line in text.splitlines():
        name, sep, rhs = line.partition("=")
        if not sep:
            continue
        name = name.split(":", 1)[0].strip()
        rhs = rhs.strip()
        if name not in ("__version__", "cuda", "hip"):
            continue
        if rhs == "None":
            values[name] = None
        elif len(rhs) >= 2 and rhs[0] == rhs[-1] and rhs[0] in "'\"":
            values[name] = rhs[1:-1]
    return values


def read_torch(torch_dir: str) -> TorchBuild:
    """Read torch's build facts from its files; raise ResolveError when they are unreadable."""
    version_py = os.path.join(torch_dir, "version.py")
    try:
        values = _parse_version_py(read_regular(version_py, 1 << 16).decode("utf-8", "replace"))
    except OSError as exc:
        raise ResolveError(f"torch at {torch_dir} has no readable torch/version.py ({exc.strerror}): the install "
                           f"is broken", fix=_REINSTALL_TORCH, cause=CAUSE_TORCH_UNREADABLE) from None
    if "cuda" not in values and "hip" not in values:
        raise ResolveError(f"{version_py} states neither `cuda` nor `hip`: it is not a torch build file this tool "
                           f"can read", fix=_REINSTALL_TORCH, cause=CAUSE_TORCH_UNREADABLE)
    deps_path = os.path.join(torch_dir, "lib", "libtorch_global_deps.so")
    deps: Object | None = None
    links: tuple[str, ...] = ()
    try:
        deps = Object(deps_path, read_dynamic(deps_path))
        links = tuple(n for n in deps.info.needed if runtime_of(n))
    except ElfError:
        deps = None
    return TorchBuild(torch_dir, values.get("__version__"), values.get("cuda"), values.get("hip"),
                      links, deps)


def _major(text: str, what: str) -> int:
    major = number(text.strip().split(".", 1)[0])
    if major is None or not 0 < major < 100:
        raise ResolveError(f"{what}={shown(text)} is not a version with a numeric major",
                           fix=f"`unset {CUDA_MAJOR_VAR}` (or set it to a CUDA major, for example 12 or 13)",
                           cause=CAUSE_BAD_VERSION)
    return major


def _visible(loader: Loader, kind: str, major: int, needed_by: Object | None) -> Found | None:
    """Where the runtime of ``major`` would come from: the loader's search, else a pip wheel."""
    soname = runtime_soname(kind, major)
    found = loader.find(soname, needed_by)
    if found is None and kind == CUDA:
        pip = sitepath.pip_runtime_libcudart(major)
        if pip is not None:
            found = Found(pip, "NVIDIA pip wheel")
    return found


TORCH_BY_PATH = "torch by path"  # Found.rule of the copy torch's own __init__ loads by path
_PRELOAD = "torch/__init__.py's _preload_cuda_deps"


def _cannot_load(loader: Loader, torch: TorchBuild) -> "Callable[[str, set[str]], str | None]":
    """Why a library torch's list loads by path would fail to load (:func:`stops_before_runtime`):
    not readable for this machine, or a direct need the loader model finds nowhere (names loaded before it,
    glibc's and torch's runtime count as found)."""
    def cannot(path: str, loaded: "set[str]") -> "str | None":
        try:
            info = read_dynamic(path)
        except ElfError as exc:
            return f"unreadable: {exc}"
        want = loader.executable.info
        if (info.elf_class, info.machine) != (want.elf_class, want.machine):
            return "built for another machine"
        obj = Object(path, info)
        for need in info.needed:
            if need not in GLIBC_SONAMES and need not in loaded and need not in torch.links \
                    and loader.find(need, obj) is None:
                return f"its {need} would not be found"
        return None
    return cannot


def _torch_uses(loader: Loader, kind: str, major: int,
                torch: TorchBuild) -> "tuple[Found | None, str | None, str | None]":
    """(the runtime copy torch will use, why in words, a second runtime file torch maps by path or None).

    The copy is the one its libraries bind: ``libtorch_global_deps.so`` finds it by the loader's rules, and
    everything torch loads after binds that soname to it. Then ``_preload_cuda_deps`` loads a runtime file by
    path (:func:`runtime_by_path`): where that file has torch's soname and is another file, torch
    maps it whatever it bound, so it is the one copy a plan may bind (the plan makes
    ``libtorch_global_deps.so`` find it too); where it has another soname (CUDA 12's wheel beside a CUDA 13
    torch), it is a second runtime that nothing binds to.
    """
    soname = runtime_soname(kind, major)
    found = loader.find(soname, torch.global_deps)
    why = None if found is None else f"libtorch_global_deps.so finds it by {found.rule}"
    by_path = runtime_by_path(torch.cuda, torch.version) if kind == CUDA else None
    if by_path is None or (found is not None and same_file(found.path, by_path)):
        if by_path is not None and why:
            why += f"; {_PRELOAD} then loads this same file by path (RTLD_LOCAL): one copy"
        return found, why, None
    stopped = stops_before_runtime(torch.cuda or "", torch.version, _cannot_load(loader, torch))
    if stopped is not None:
        return found, (why + "; " if why else "") + f"no copy is loaded by path: {stopped}", None
    if runtime_of(os.path.basename(by_path)) != (kind, major):
        why = (why + "; " if why else "") + (
            f"{_PRELOAD} also loads {by_path} by path (RTLD_LOCAL; it looks in {wheel_lib_dirs(major)[1]} "
            f"before {wheel_lib_dirs(major)[0]}), a second runtime that nothing binds to")
        return found, why, by_path
    return Found(by_path, TORCH_BY_PATH), (
        f"{_PRELOAD} loads this copy by path once imported (RTLD_LOCAL), whatever else torch binds: the one copy "
        f"that torch and the hook can share without a second one mapped" +
        (f"; libtorch_global_deps.so alone would find {found.path} by {found.rule}" if found else "")), None


def split_from_torch(runtime: "Runtime") -> "str | None":
    """The runtime library torch links where the process's runtime (an override's) is another one, else None:
    then the hook and torch use different runtimes. The one place this is decided."""
    torch = runtime.torch
    if torch is None:
        return None
    links = torch.links or tuple(runtime_soname(k, m) for k, v in ((HIP, torch.hip), (CUDA, torch.cuda))
                                 if v and (m := number(v.split(".")[0])) is not None)[:1]
    return None if not links or runtime.soname in links else links[0]


def detect(environ: "Mapping[str, str]", loader: Loader, torch_dir: "str | None",
           majors: "Iterable[int]" = ()) -> Runtime:
    """Decide the runtime for this process; raise ResolveError with the fix when it cannot.

    ``torch_dir``: torch's package directory as ``import torch`` would find it (the survey's, found once:
    :func:`tms_autopreload.sitepath.package_dir`), None where there is no torch; ``majors``: CUDA majors the
    installed builds target, probed when there is no torch.
    """
    override_text = environ.get(CUDA_MAJOR_VAR, "").strip()
    override = _major(override_text, CUDA_MAJOR_VAR) if override_text else None
    torch = None
    if torch_dir is not None:
        try:
            torch = read_torch(torch_dir)
        except ResolveError:
            if override is None:
                raise  # with the override, a broken torch only loses its evidence

    if override is not None:
        source = f"{CUDA_MAJOR_VAR}={override_text}"
        runtime = Runtime(CUDA, override, source, None, torch)
        torch_links = split_from_torch(runtime)
        if torch is not None and torch_links is None and runtime.soname in torch.links:
            # The major torch links: the copy is the one torch uses, found as torch finds it.
            found, why, second = _torch_uses(loader, CUDA, override, torch)
            return Runtime(CUDA, override, source, found, torch, why, second)
        found = _visible(loader, CUDA, override, None)
        runtime = Runtime(CUDA, override, source, found, torch)
        if found is not None and torch is not None and torch_links is not None:
            runtime.library_why = (f"found by {found.rule}; torch at {torch.dir} links {torch_links}, another "
                                   f"runtime ({CUDA_MAJOR_VAR}={override_text})")
        return runtime

    if torch is not None:
        where = f"torch {torch.version} at {torch.dir}" if torch.version else f"torch (version unknown) at {torch.dir}"
        if torch.hip:
            kind, major = HIP, _major(torch.hip, "torch.version.hip")
        elif torch.cuda:
            kind, major = CUDA, _major(torch.cuda, "torch.version.cuda")
        else:
            raise ResolveError(
                f"{where} is a CPU-only build (torch.version.cuda and torch.version.hip are None); "
                f"torch_memory_saver needs a CUDA or ROCm torch", cause=CAUSE_CPU_ONLY_TORCH,
                fix="install a CUDA build of torch, or do not set SLIME_OFFLOAD_TRAIN/TMS_AUTOPRELOAD for "
                    "CPU-only processes")
        soname = runtime_soname(kind, major)
        other = [n for n in torch.links if n != soname]
        if other and soname not in torch.links:
            raise ResolveError(
                f"{where} is inconsistent: torch/version.py says {kind} {major} but "
                f"torch/lib/libtorch_global_deps.so links {', '.join(other)}", fix="reinstall torch",
                cause=CAUSE_TORCH_INCONSISTENT)
        if soname in torch.links:
            checked = f"libtorch_global_deps.so links {soname}"
        elif torch.global_deps is None:
            checked = "libtorch_global_deps.so not read"
        else:
            checked = "libtorch_global_deps.so links no runtime library"
        field = "hip" if kind == HIP else "cuda"  # torch.version's field names
        source = f"{where}: torch.version.{field}={getattr(torch, field)!r}, {checked}"
        found, why, second = _torch_uses(loader, kind, major, torch)
        return Runtime(kind, major, source, found, torch, why, second)

    from .releases import RELEASED_CUDA_MAJORS  # asked only without torch: what a release has a build for

    probed = sorted(set(majors) | set(RELEASED_CUDA_MAJORS))
    seen = {m: f for m in probed if (f := _visible(loader, CUDA, m, None)) is not None}
    if len(seen) == 1:
        (major, found), = seen.items()
        return Runtime(CUDA, major, f"no torch; only {runtime_soname(CUDA, major)} is visible ({found.path}, "
                                      f"{found.rule})", found, None)
    if not seen:
        raise ResolveError(
            f"no torch is installed for this interpreter and no CUDA runtime is visible "
            f"(looked for {', '.join(runtime_soname(CUDA, m) for m in probed)} on the loader's path and in "
            f"NVIDIA's pip wheels)", cause=CAUSE_NO_RUNTIME_VISIBLE,
            fix=f"install torch, or a CUDA runtime ({install_hint(CUDA, max(CUDA_MAJORS))}), or set {CUDA_MAJOR_VAR}=N")
    listing = "; ".join(f"{runtime_soname(CUDA, m)} at {f.path} ({f.rule})" for m, f in seen.items())
    raise ResolveError(
        f"no torch is installed for this interpreter and several CUDA runtimes are visible ({listing}), "
        f"so the runtime this process will use is unknown", fix=f"set {CUDA_MAJOR_VAR}=N to choose one",
        cause=CAUSE_SEVERAL_RUNTIMES)


# ---------------------------------------------------------------- what torch's __init__ loads by path

# (folder, glob) of each library in _preload_cuda_deps' list, in its order, up to the runtime's entry: the
# entries after it cannot stop it. Each glob is the file-name prefix followed by "*[0-9]".
_BEFORE_RUNTIME = (("cublas", "libcublasLt.so."), ("cublas", "libcublas.so."), ("cudnn", "libcudnn.so."),
                   ("cuda_nvrtc", "libnvrtc.so."), ("cuda_nvrtc", "libnvrtc-builtins.so."))
_RUNTIME = (WHEEL_FOLDER, soname_prefix(CUDA))
# (first release read with this code, whether a library not found stops the list, the entries up to the
# runtime's: none where no runtime is loaded by path once libtorch_global_deps.so has loaded). 2.9.0, 2.12.0,
# 2.14.1 and 2.15.0 read the same as the entry before them, but for entries after the runtime's (curand left
# the list in 2.15.0).
_TORCH_RELEASES = (((2, 8), True, ()),
                   ((2, 10), True, (*_BEFORE_RUNTIME, _RUNTIME)),
                   ((2, 14), False, (*_BEFORE_RUNTIME, _RUNTIME)))


def code_of(version: "str | None") -> "tuple[str, bool, tuple[tuple[str, str], ...]]":
    """(the read release whose code ``version`` is taken to have, whether a library not found stops the list,
    the list up to the runtime's entry)."""
    release = release_of(version)
    chosen = _TORCH_RELEASES[-1] if not release else _TORCH_RELEASES[0]
    for entry in _TORCH_RELEASES:
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
    for entry in sitepath.search_path():
        base = entry or "."
        found = (_matches(os.path.join(base, nvidia_lib_dir(folder)), prefix)
                 + _matches(os.path.join(base, nvidia_lib_dir(major_folder(major))), prefix)
                 + _matches(os.path.join(base, folder, "lib"), prefix))  # torch's third place: not a wheel's
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
