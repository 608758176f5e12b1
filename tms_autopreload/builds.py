"""The torch_memory_saver preload builds installed next to its package, classified by what they link.

Wheels put the builds in site-packages itself (the directory above the package); source builds
may put them in the package directory. Layouts seen on PyPI:

* 0.0.6, 0.0.8: ``torch_memory_saver_cpp.abi3.so`` (driver only: libcuda.so.1);
* 0.0.9: ``torch_memory_saver_hook_mode_preload.abi3.so`` (libcudart.so.12);
* 0.0.9.post1, 0.0.10: ``..._preload_cu12``, ``..._preload_cu13`` and an unsuffixed copy of cu12;
* source builds: one unsuffixed build of whichever major it was built for.

A name says what a build was meant to be; its DT_NEEDED entries say what it will load, so only
those decide. ``..._hook_mode_torch*`` builds are pluggable allocators, not preload hooks.
"""

import os

from .elf import MACHINE_NAMES, DynamicInfo, ElfError, read_dynamic, read_symbols
from .sonames import DRIVER_SONAME, RELEASED_CUDA_MAJORS, runtime_name, runtime_of, runtime_soname
from .trust import Refusal, Trusted, refusal

__all__ = ["Build", "read_build", "find_builds", "interposed", "build_install_hint", "missing_builds", "reinstall_hint",
           "PRELOAD_PREFIXES"]

PRELOAD_PREFIXES = ("torch_memory_saver_hook_mode_preload", "torch_memory_saver_cpp")


def missing_builds(package_dir: str) -> "tuple[str, list[str], str | None] | None":
    """(the version, the preload builds its RECORD lists that are gone, the command pip recorded its source
    by (PEP 610), forced) of the torch-memory-saver distribution installed in the site directory of
    ``package_dir``; None when pip's record of it is not there (a source tree, another installer) or names
    no missing build."""
    from importlib import metadata

    from .origin import command_from, record_of

    site = os.path.dirname(os.path.abspath(package_dir))
    for dist in metadata.distributions(path=[site]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") != "torch-memory-saver":
            continue
        gone = [str(f) for f in dist.files or () if f.name.startswith(PRELOAD_PREFIXES) and f.name.endswith(".so")
                and not os.path.lexists(str(dist.locate_file(f)))]
        record = record_of(dist)
        return (dist.version, gone, command_from(record, force=True) if record else None) if gone else None
    return None


def _may_be_for(name: str, major: int | None) -> bool:
    """Whether a build of this name, by the releases' naming, may be the one for CUDA ``major`` (None: any):
    ``_cu<major>``; unsuffixed, the CUDA 12 build (0.0.9 to 0.0.10); ``torch_memory_saver_cpp``, driver only."""
    if major is None or f"_cu{major}." in name or name.startswith("torch_memory_saver_cpp"):
        return True
    return "_cu" not in name and major == 12


def reinstall_hint(package_dir: "str | None", major: int | None = None) -> "str | None":
    """The command that puts back the installed release's missing preload builds (those that may be for
    CUDA ``major``; None: any), or None when none are missing. The same version, forced: a plain ``pip
    install`` of it answers "Requirement already satisfied" (no release of torch-memory-saver declares a
    dependency, so --force-reinstall touches only it)."""
    found = missing_builds(package_dir) if package_dir else None
    gone = [g for g in found[1] if _may_be_for(os.path.basename(g), major)] if found else []
    if not found or not gone:
        return None
    version, command = found[0], found[2]
    said = (f"torch-memory-saver {version} is installed but its {', '.join(os.path.basename(g) for g in gone)} "
            f"{'is' if len(gone) == 1 else 'are'} missing")
    if command:  # pip recorded where it came from: that source again, whatever its version says
        return f"{said}: {command}"
    if "+" in version:  # a local version label: a build of its own, which no index has
        return (f"{said}: reinstall it from the source it was built from (its version's local label, "
                f"+{version.partition('+')[2]}, names a build the package index does not have)")
    return f"{said}: pip install --force-reinstall torch-memory-saver=={version}"


def build_install_hint(kind: str, major: int, package_dir: "str | None" = None) -> str:
    """The torch_memory_saver to install when no installed build fits ``kind`` ``major``: the installed
    release again where its builds were removed, else only what a release ships, or how to build it."""
    reinstall = reinstall_hint(package_dir, major) if kind == "cuda" else None
    if reinstall:
        return reinstall
    if kind == "hip":
        return "install a ROCm build of torch_memory_saver (built from source with ROCm)"
    if major in RELEASED_CUDA_MAJORS:
        return (f"install a torch_memory_saver that ships a CUDA {major} build: "
                f"pip install 'torch-memory-saver>=0.0.9.post1' (it ships _cu12 and _cu13 builds)")
    return (f"no torch_memory_saver release ships a CUDA {major} build (releases ship CUDA "
            f"{' and '.join(map(str, RELEASED_CUDA_MAJORS))} builds); torch_memory_saver 0.0.8's build needs only the "
            f"driver ({DRIVER_SONAME}), not a CUDA {major} runtime: pip install 'torch-memory-saver==0.0.8'")


class Build:
    """One candidate preload file."""

    __slots__ = ("path", "kind", "major", "info", "problem", "_trusted", "_judged", "_refusal")

    def __init__(self, path: str, kind: str, major: int | None, info: DynamicInfo | None,
                 problem: str | None, trusted: Trusted | None = None) -> None:
        self.path = path
        self.kind = kind  # "cuda", "hip", "driver" (links only libcuda.so.1), or "unusable"
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

    def target(self) -> str:
        """What it was built for, in words."""
        if self.kind in ("cuda", "hip") and self.major is not None:  # read_build gives both kinds their major
            return f"{runtime_name(self.kind, self.major)} (needs {runtime_soname(self.kind, self.major)})"
        if self.kind == "driver":
            return f"any CUDA runtime (needs only the driver, {DRIVER_SONAME})"
        return "nothing loadable"


def _classify(info: DynamicInfo) -> tuple[str, int | None]:
    for name in info.needed:
        found = runtime_of(name)
        if found:
            return found
    if DRIVER_SONAME in info.needed:
        return "driver", None
    return "unusable", None


def read_build(path: str, want: DynamicInfo, trusted: Trusted | None = None) -> Build:
    """Classify ``path`` for a process whose executable is ``want`` (same ELF class and machine), and
    judge who can write it against ``trusted``, the writers of that process's code (None: not judged)."""
    path = os.path.abspath(path)
    try:
        info = read_dynamic(path)
    except ElfError as exc:
        return Build(path, "unusable", None, None, f"not a loadable ELF object: {exc}")
    except OSError as exc:
        return Build(path, "unusable", None, None, f"cannot read it: {exc.strerror or exc}")
    kind, major = _classify(info)
    problem = None
    if info.machine != want.machine or info.elf_class != want.elf_class:
        problem = (f"built for {MACHINE_NAMES.get(info.machine, info.machine)} {info.elf_class}-bit, "
                   f"this interpreter is {want.machine_name} {want.elf_class}-bit")
    elif kind == "unusable":
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
            if name.startswith(PRELOAD_PREFIXES) and name.endswith(".so"):
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
    Raises ElfError or OSError when either file cannot be read.
    """
    return tuple(sorted(read_symbols(build).defined & read_symbols(runtime_library).defined))
