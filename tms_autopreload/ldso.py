"""Where glibc's dynamic loader would find a DT_NEEDED name, in the order ld.so(8) documents.

For a name without a slash, ld.so(8) ("Finding shared objects") searches:

1. DT_RPATH of the object that needs it, then of the object that brought that one in, and on up, then of
   the executable, unless the object that needs it has DT_RUNPATH, even an empty one (an object with
   DT_RUNPATH has its DT_RPATH ignored, and lends it to none). A preloaded object is
   loaded by the executable (elf/rtld.c, do_preload), so the DT_RPATH of the program decides where a
   preloaded hook's own ``libcudart.so.N`` comes from, before LD_LIBRARY_PATH: conda's interpreters
   carry ``$ORIGIN/../lib`` (set with ``patchelf --force-rpath``), and a shell has none;
2. LD_LIBRARY_PATH (ignored in secure mode);
3. DT_RUNPATH of the object that needs it;
4. /etc/ld.so.cache;
5. the default paths (/lib, /usr/lib, and the 64-bit and multiarch variants of the loader's machine).

An empty entry of these lists is the current directory (``$ORIGIN/lib:``); an empty value has none.

Before any search, a name matches an object already loaded: the loader compares it with the
name each object was loaded by and with its DT_SONAME (elf/dl-load.c, _dl_map_object). The
objects of ``LD_PRELOAD`` are loaded before every DT_NEEDED entry, so a preloaded runtime
library is the one every later ``libcudart.so.N`` binds to. A directory is taken only when it
holds a file of the same ELF class and machine; the loader skips others and goes on, but stops at a file
that is no ELF object at all (an empty one, a linker script): the name is then found nowhere. ``$ORIGIN``
expands to the directory of the object whose entry it is: the program's in LD_LIBRARY_PATH and
LD_PRELOAD. This module predicts; :mod:`tms_autopreload.trace` asks the real loader, and the resolver
trusts only a plan the real loader agrees with.

The syntax of the loader's variables (how ld.so splits ``LD_PRELOAD`` and ``LD_LIBRARY_PATH``, how this package
writes them and records what it added) is :mod:`tms_autopreload.environment`'s, with the package's other rules
of the environment.
"""

import os

from . import ldcache
from .environment import is_tms_entry, split_preload, split_search_path
from .elf import DynamicInfo, ElfError, UnreadableFile, read_dynamic, read_kind

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["Found", "Object", "Loader", "loaded_as", "default_dirs", "PRELOADED"]

PRELOADED = "LD_PRELOAD"  # the rule of a name matched by an object LD_PRELOAD loaded

# e_machine -> the multiarch tuple Debian's loader for that machine searches first (its SYSTEM_DIRS).
MULTIARCH = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu"}


def default_dirs(machine: int) -> "tuple[str, ...]":
    """The loader's built-in directories for an executable of ``machine`` (e_machine): a loader is built
    for one machine, and Debian's searches that machine's multiarch directories first."""
    triplet = MULTIARCH.get(machine)
    multiarch = (f"/lib/{triplet}", f"/usr/lib/{triplet}") if triplet else ()
    return (*multiarch, "/lib64", "/usr/lib64", "/lib", "/usr/lib")


class Object:
    """A loaded or loadable object: its path, its dynamic-section facts, and the object whose DT_NEEDED entry
    brought it in (None: the program, or nothing, for the program itself, a preloaded object and one
    ``dlopen`` loaded), whose DT_RPATH its own needs search after its own."""

    __slots__ = ("path", "info", "loader")

    def __init__(self, path: str, info: DynamicInfo, loader: "Object | None" = None) -> None:
        self.path = path
        self.info = info
        self.loader = loader

    def origin(self) -> str:
        """What ``$ORIGIN`` is in its entries: its path's directory, from the current directory where the path
        is relative (an object found through an empty or relative search path entry), as the loader makes it
        absolute when it maps the object (elf/dl-object.c, _dl_new_object)."""
        directory = os.path.dirname(self.path)
        return directory if os.path.isabs(directory) else os.path.join(os.getcwd(), directory)

    def runpath_dirs(self) -> "list[str]":
        """Its DT_RUNPATH, ``$ORIGIN`` expanded: where the loader looks for its own needs only."""
        return _expand(self.info.runpath or (), self.origin())


class Found:
    """Where a name resolved and which ld.so(8) rule found it."""

    __slots__ = ("path", "rule")

    def __init__(self, path: str, rule: str) -> None:
        self.path = path
        self.rule = rule  # "DT_RPATH", "LD_LIBRARY_PATH", "DT_RUNPATH", "/etc/ld.so.cache", ...

    def __repr__(self) -> str:
        return f"Found({self.path!r}, {self.rule!r})"


def _expand(entries: "tuple[str, ...] | list[str]", origin: str) -> list[str]:
    return [e.replace("${ORIGIN}", origin).replace("$ORIGIN", origin) for e in entries]


def loaded_as(name: str, loaded: "list[tuple[str, str]]") -> "str | None":
    """The path of the first already-loaded object that the DT_NEEDED ``name`` matches, or None.

    ``loaded``: (the name each was loaded by, its path). A match is that name or the object's
    DT_SONAME, as the loader checks before it searches for a file.
    """
    for given, path in loaded:
        if name == given:
            return path
        try:
            if read_dynamic(path).soname == name:
                return path
        except ElfError:
            continue
    return None


def _normalized(path: str) -> str:
    """``path`` without its ``.`` and ``..`` entries (:func:`os.path.normpath`) where that names the same file;
    as written where a ``..`` follows a symbolic link, which the kernel takes to the link's target's parent,
    not to the link's own (``lnk/../deps`` is ``store/deps`` where ``lnk`` is ``store/lib``)."""
    kept: list[str] = []
    for part in path.split("/"):
        if part == ".." and kept and kept[-1] not in ("", ".."):
            if os.path.islink("/".join(kept)):
                return path
            kept.pop()
        elif part not in ("", ".") or not kept:
            kept.append(part)
    return os.path.normpath(path)


def _accepts(path: str, want: DynamicInfo) -> "bool | None":
    """True when ``path`` is a file the loader would map for an object like ``want``; False when it passes
    over it and searches on (no such file, or an object of another ELF class or machine); None when it stops
    there with an error: a file that is no ELF object at all, such as an empty one or a linker script
    (elf/dl-load.c, open_verify: "file too short", "invalid ELF header")."""
    try:
        return read_kind(path) == (want.elf_class, want.machine)
    except UnreadableFile:
        return False
    except ElfError:
        return None


def _hwcaps_used(interpreter: "str | None", tunables: bool = True) -> "tuple[str, ...]":
    """The glibc-hwcaps subdirectories the program's loader uses, best first: asked of it (``glibc_hwcaps``);
    without ``tunables``, those the CPU runs, whatever ``GLIBC_TUNABLES`` takes away."""
    if interpreter is None:
        return ()
    from . import glibc_hwcaps  # only where the cache holds such a copy of a name looked up

    env = dict(os.environ)
    if not tunables:
        env.pop("GLIBC_TUNABLES", None)
    return glibc_hwcaps.used(interpreter, env)


class Loader:
    """One process's view of the loader: its executable, LD_LIBRARY_PATH and cache."""

    def __init__(self, executable: Object, ld_library_path: str, cache: ldcache.LdCache,
                 preload: str = "") -> None:
        self.executable = executable
        self.ld_library_path = ld_library_path
        self.cache = cache
        # (entry, path) of each object LD_PRELOAD loads, but torch_memory_saver builds: a plan replaces
        # those. An entry the loader would skip (missing, another ELF class) is left out, as it is.
        self.preloaded: "list[tuple[str, str]]" = []  # filled in order: an entry may match an earlier one
        for entry in split_preload(preload):
            if is_tms_entry(entry):
                continue
            found = self.find(entry)
            if found is not None:
                self.preloaded.append((entry, found.path))

    @classmethod
    def for_executable(cls, path: str, ld_library_path: str, preload: str = "",
                       like: "Loader | None" = None) -> "Loader":
        """The loader of a process that runs ``path`` (symlinks resolved, as the kernel does);
        ``like``: another program's loader, whose cache is reused when the machine is the same."""
        real = os.path.realpath(path)
        info = read_dynamic(real)
        if like is not None and like.executable.info.machine == info.machine:
            cache = like.cache
        else:
            cache = ldcache.load(info.machine, hwcaps_used=lambda: _hwcaps_used(info.interpreter),
                                 cpu_hwcaps=lambda: _hwcaps_used(info.interpreter, tunables=False))
        return cls(Object(real, info), ld_library_path, cache, preload)

    def under(self, ld_library_path: "str | None", preload: str) -> "Loader":
        """This process's loader were it started with other values of the two variables (``None``: its own
        ``LD_LIBRARY_PATH``): a plan's, whose effect the model predicts. The executable and cache are reused."""
        return Loader(self.executable, self.ld_library_path if ld_library_path is None else ld_library_path,
                      self.cache, preload)

    def library_dirs(self) -> "list[str]":
        """The executable's own search path (DT_RUNPATH, else DT_RPATH), expanded: its environment's
        library directory (conda's ``$PREFIX/lib``), where far more than one runtime lives."""
        info = self.executable.info
        return _expand(info.rpath if info.runpath is None else info.runpath, self.executable.origin())

    def find(self, name: str, needed_by: Object | None = None) -> Found | None:
        """Where ``name``, a DT_NEEDED entry of ``needed_by`` (default: the executable), loads from."""
        obj = needed_by or self.executable
        if "/" in name:  # ``$ORIGIN`` there is the needing object's directory (the program's, for LD_PRELOAD)
            path, = _expand((name,), obj.origin())
            return Found(path, "path") if _accepts(path, obj.info) else None
        preloaded = loaded_as(name, self.preloaded)
        if preloaded is not None:
            return Found(preloaded, PRELOADED)
        for rule, candidate in self._candidates(name, obj):
            taken = _accepts(candidate, obj.info)
            if taken is None:
                return None  # the loader stops at it with an error: the name is found nowhere
            if taken:
                return Found(candidate, rule)
        return None

    def _candidates(self, name: str, obj: Object) -> "Iterator[tuple[str, str]]":
        """(rule, path) of each file the loader tries for ``name``, needed by ``obj``, in its order: made as
        they are asked, so that the cache is read only where the search gets that far."""
        steps: list[tuple[str, list[str]]] = []
        if obj.info.runpath is None:
            rpath: list[str] = []
            up: "Object | None" = obj
            while up is not None:  # "then that object's dependent, and on up" (elf/dl-load.c)
                if up.info.runpath is None:
                    rpath += _expand(up.info.rpath, up.origin())
                up = up.loader
            if obj is not self.executable and self.executable.info.runpath is None:
                rpath += _expand(self.executable.info.rpath, self.executable.origin())
            steps.append(("DT_RPATH", rpath))
        steps.append(("LD_LIBRARY_PATH", _expand(split_search_path(self.ld_library_path), self.executable.origin())))
        steps.append(("DT_RUNPATH", obj.runpath_dirs()))
        for rule, dirs in steps:
            for d in dirs:
                yield rule, _normalized(os.path.join(d, name))
        cached = self.cache.lookup(name)
        if cached is not None:
            yield "/etc/ld.so.cache", cached
        for d in default_dirs(self.executable.info.machine):
            yield "default path", os.path.join(d, name)
