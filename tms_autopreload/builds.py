"""The torch_memory_saver preload builds installed next to its package, classified by what they link.

Which release ships which builds is :mod:`tms_autopreload.releases`' fact; here, only the names every release
gives its preload builds, by which they are found. A name says what a build was meant to be; its DT_NEEDED
entries say what it will load, so only those decide.
"""

import os

from .elf import MACHINE_NAMES, DynamicInfo, ElfError, UnreadableFile, read_dynamic
from .gpu_libraries import CUDA, DRIVER_ONLY, DRIVER_SONAME, HIP, UNUSABLE, runtime_name, runtime_of, runtime_soname
from .trust import Refusal, Trusted, refusal

__all__ = ["Build", "read_build", "find_builds", "interposed", "is_preload_name", "named_major", "shown_build",
           "shown_path", "is_renamed", "PRELOAD_PREFIXES", "DRIVER_ONLY_PREFIX"]

# The file names of the preload builds torch_memory_saver's releases ship: the hook modes' (a ``_cu<major>``
# suffix before the extension where a release ships one per major, none where one build is all there is), and
# 0.0.6/0.0.8's driver-only build.
HOOK_PREFIX = "torch_memory_saver_hook_mode_preload"
DRIVER_ONLY_PREFIX = "torch_memory_saver_cpp"
PRELOAD_PREFIXES = (HOOK_PREFIX, DRIVER_ONLY_PREFIX)
_MAJOR_SUFFIX = "_cu"


def named_major(name: str) -> "int | None":
    """The CUDA major a build's file name says (``..._cu13.abi3.so`` -> 13), or None where it says none; a
    name says what a build was meant to be, never what it links (:func:`read_build` decides that)."""
    stem = name.split(".", 1)[0]
    at = stem.rfind(_MAJOR_SUFFIX)
    digits = stem[at + len(_MAJOR_SUFFIX):] if at >= 0 else ""
    return int(digits) if digits.isdigit() and len(digits) <= 3 else None


def is_preload_name(name: str) -> bool:
    """Whether a file of this name is one of torch_memory_saver's preload builds, by its name: where they
    are found, and which files of its install record are builds."""
    return name.startswith(PRELOAD_PREFIXES) and name.endswith(".so")


class Build:
    """One candidate preload file."""

    __slots__ = ("path", "kind", "major", "info", "problem", "_trusted", "_judged", "_refusal")

    def __init__(self, path: str, kind: str, major: int | None, info: DynamicInfo | None,
                 problem: str | None, trusted: Trusted | None = None) -> None:
        self.path = path
        self.kind = kind  # CUDA, HIP, DRIVER_ONLY (links only the driver), or UNUSABLE (gpu_libraries)
        self.major = major
        self.info = info  # its dynamic section, when readable
        self.problem = problem  # why it can never be preloaded here, or None
        self._trusted = trusted  # the writers of the process's code, to judge it against (None: not judged)
        self._judged = False
        self._refusal: "Refusal | None" = None

    @property
    def refusal(self) -> "Refusal | None":
        """Why it may not be preloaded: who else can write it (:mod:`tms_autopreload.trust`), or None.
        Judged when first asked: a resolve asks only for the builds that fit its runtime."""
        if not self._judged:
            self._judged = True
            if self.problem is None and self._trusted is not None:
                self._refusal = refusal(self.path, self._trusted)
        return self._refusal

    @property
    def needs(self) -> tuple[str, ...]:
        """Its DT_NEEDED entries."""
        return self.info.needed if self.info else ()

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    @property
    def file(self) -> str:
        """The file its path names, every symbolic link resolved: the file the loader maps."""
        return os.path.realpath(self.path)

    def target(self) -> str:
        """What it was built for, in words."""
        need = _need(self.kind, self.major)
        if need is None:
            return "nothing loadable"
        return f"{runtime_name(self.kind, self.major)} (needs {need})" if self.kind in (CUDA, HIP) else (
            f"any CUDA runtime (needs {need})")

    def shown(self) -> str:
        """This build as a reader is shown it (:func:`shown_build`)."""
        return shown_build(self.path, self.file, self.kind, self.major)


def _need(kind: str, major: "int | None") -> "str | None":
    """What a build of this kind links, in words: its runtime library, or only the driver's; None: nothing
    loadable."""
    if kind in (CUDA, HIP) and major is not None:  # read_build gives both kinds their major
        return runtime_soname(kind, major)
    return f"only the driver, {DRIVER_SONAME}" if kind == DRIVER_ONLY else None


def shown_path(path: str) -> str:
    """:func:`shown_build` for a build known by its path alone (a child that inherits a plan): what its file
    needs is read from that file's dynamic section, and only where the path names it under another name."""
    file = os.path.realpath(path)
    if not is_renamed(path, file):
        return path
    try:
        kind, major = _classify(read_dynamic(file))
    except ElfError:
        kind, major = UNUSABLE, None
    return shown_build(path, file, kind, major)


def shown_build(path: str, file: str, kind: str, major: "int | None", found: "str | None" = None) -> str:
    """A chosen build as every command shows it to a reader (doctor, a node's row, which's and env's note, the
    verbose start): its path, or where that path is a symbolic link to a file of another name, the link, the
    file it names and what that file needs (``kind``, ``major``: what read_build found in it). LD_PRELOAD
    keeps the link, whose name torch_memory_saver's check reads, but a name may say another CUDA major than
    the file links: the field links the cu12 name to the cu13 build, so that a launcher that picks by name
    gets it. ``found``: the search rule by which that need is found, where known."""
    need = _need(kind, major)
    if not is_renamed(path, file):
        return path + (f" ({need} found through {found})" if found and need else "")
    said = [f"needs {need}"] if need else []
    return f"{path} -> {file}" + (f" ({', '.join(said + ([f'found through {found}'] if found else []))})"
                                  if said or found else "")


def is_renamed(path: str, file: str) -> bool:
    """Whether ``path`` reaches ``file`` (its real file) under another name: a symbolic link named otherwise."""
    return os.path.basename(path) != os.path.basename(file)


def _classify(info: DynamicInfo) -> tuple[str, int | None]:
    for name in info.needed:
        found = runtime_of(name)
        if found:
            return found
    if DRIVER_SONAME in info.needed:
        return DRIVER_ONLY, None
    return UNUSABLE, None


def read_build(path: str, want: DynamicInfo, trusted: Trusted | None = None) -> Build:
    """Classify ``path`` for a process whose executable is ``want`` (same ELF class and machine), and
    judge who can write it against ``trusted``, the writers of that process's code (None: not judged)."""
    path = os.path.abspath(path)
    try:
        info = read_dynamic(path)
    except ElfError as exc:
        what = "cannot read it" if isinstance(exc, UnreadableFile) else "not a loadable ELF object"
        return Build(path, UNUSABLE, None, None, f"{what}: {exc}")
    kind, major = _classify(info)
    problem = None
    if info.machine != want.machine or info.elf_class != want.elf_class:
        problem = (f"built for {MACHINE_NAMES.get(info.machine, info.machine)} {info.elf_class}-bit, "
                   f"this interpreter is {want.machine_name} {want.elf_class}-bit")
    elif kind == UNUSABLE:
        problem = f"links neither libcudart, libamdhip64 nor {DRIVER_SONAME}: not a torch_memory_saver hook"
    return Build(path, kind, major, info, problem, trusted)


def find_builds(package_dir: str, want: DynamicInfo, trusted: Trusted) -> list[Build]:
    """Every preload build in the package directory and the one above it, in that order, each judged
    against ``trusted``."""
    builds: list[Build] = []
    seen: set[tuple[int, int]] = set()  # (device, inode): wheels may hold one file under two names
    for d in (package_dir, os.path.dirname(os.path.abspath(package_dir))):
        try:
            names = sorted(os.listdir(d))
        except OSError:
            continue
        for name in names:
            if is_preload_name(name):
                path = os.path.join(d, name)
                try:
                    st = os.stat(path)
                except OSError:
                    st = None
                key = (st.st_dev, st.st_ino) if st else (-1, len(seen))
                if key not in seen:
                    seen.add(key)
                    builds.append(read_build(path, want, trusted))
    return builds


def interposed(build: str, runtime_library: str) -> "tuple[str, ...]":
    """What ``build`` defines that ``runtime_library`` also defines: the calls it can intercept.

    Read from both dynamic symbol tables, not assumed: 0.0.9.post1 and 0.0.10 preload builds define
    ``cudaMalloc`` and ``cudaFree``, and so does 0.0.8's driver-only build, which links no runtime.
    Raises ElfError when either file cannot be read.
    """
    from .symbols import defined_among, read_symbols  # dlopen mode's, a forced build's and doctor's question

    return tuple(sorted(defined_among(runtime_library, read_symbols(build).defined)))
