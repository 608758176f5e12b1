"""How a plan binds the hook's runtime need to the library torch uses: the bindings tried in order, as data.

Each of :data:`STEPS` puts more into what every child inherits than the one before. For one build a step
writes its :class:`Option` (the environment, or why it cannot be written and what would let it be) and says
itself in words; an option predicts, with the loader model, whether it maps exactly torch's runtime for the
hook in this interpreter and in every non-Python child. The first option predicted to hold is the plan;
the real loader must agree (:func:`tms_autopreload.attempt.attempt`).
"""

import os

from . import compose_preload, same_file
from .builds import Build
from .childprograms import search_differs
from .ldpaths import LD_UNSAFE_CHARS, prepend_search_path, search_path_unsafe
from .ldso import Loader, Object
from .releases import ONE_PATH_RELEASES, SPLITTING_INSTALL, counted_by_check, reads_one_path
from .runtime import Runtime

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping

    from .elf import DynamicInfo

__all__ = ["AS_FOUND", "SEARCH_PATH", "RUNTIME_PRELOADED", "STEPS", "Option", "options", "words", "no_binding_fix",
           "unwritable", "preload_entry"]

# The steps' names, as a plan's ``binding`` words and ``doctor`` say them.
AS_FOUND = "as found"  # the hook alone: the loader finds that very file for it
SEARCH_PATH = "LD_LIBRARY_PATH"  # the library's directory first on LD_LIBRARY_PATH
RUNTIME_PRELOADED = "LD_PRELOAD"  # the library itself preloaded by path, right after the hook


def unwritable(path: str) -> "str | None":
    """Why ``path`` cannot be written in the environment at all, or None (:func:`preload_entry` then
    writes it).

    ld.so splits LD_PRELOAD on spaces and colons with no escaping. A path with such a
    character in its directory still works as a bare file name found through
    LD_LIBRARY_PATH (which splits only on ':' and ';'); other cases cannot be expressed.
    """
    if not LD_UNSAFE_CHARS & set(path):
        return None
    directory, name = os.path.split(path)
    if LD_UNSAFE_CHARS & set(name):
        return ("its file name contains a space, tab, colon or semicolon, which LD_PRELOAD "
                "cannot hold; rename it or link it from a path without one")
    if search_path_unsafe(directory):
        return ("its directory contains ':' or ';', which neither LD_PRELOAD nor "
                "LD_LIBRARY_PATH can hold; link it from a path without one")
    return None


def preload_entry(path: str) -> tuple[str, str | None]:
    """(LD_PRELOAD entry, directory to add to LD_LIBRARY_PATH) for ``path``, which :func:`unwritable`
    accepts: the path itself, or its bare file name found through LD_LIBRARY_PATH."""
    if not LD_UNSAFE_CHARS & set(path):
        return path, None
    directory, name = os.path.split(path)
    return name, directory


class Option:
    """One step of :data:`STEPS` written for one build: its environment, or why it cannot be written (and
    what would let it be, when the user can do something)."""

    __slots__ = ("step", "ld_preload", "ld_library_path", "refused", "fix")

    def __init__(self, step: "Step", ld_preload: str = "", ld_library_path: str = "",
                 refused: "str | None" = None, fix: "str | None" = None) -> None:
        self.step = step
        self.ld_preload = ld_preload
        self.ld_library_path = ld_library_path
        self.refused = refused
        self.fix = fix

    @property
    def binding(self) -> str:
        """Its step's name."""
        return self.step.name

    def predict(self, build: Build, runtime: Runtime, loader: Loader,
                children: "list[tuple[str, DynamicInfo]]") -> "str | None":
        """Why the loader model says this would not map exactly ``runtime.library`` for the hook in this
        interpreter, or would leave a child without the runtime; None when it holds."""
        if runtime.library is None or build.kind == "driver" or build.info is None:
            return None
        hook = Object(build.path, build.info)
        soname = runtime.soname
        found = loader.under(self.ld_library_path, self.ld_preload).find(soname, hook)
        if found is None:
            return f"its {soname} would not be found"
        if not same_file(found.path, runtime.library):
            rule = "the interpreter's DT_RPATH" if found.rule == "DT_RPATH" else found.rule
            return (f"its {soname} would bind to {found.path} ({rule}), not to {runtime.library} that "
                    f"torch uses: two runtime copies")
        for child, info in children:
            if not search_differs(loader.executable.info, info):
                continue  # the loader searches for the hook's needs in it as in the interpreter
            theirs = Loader(Object(child, info), self.ld_library_path, loader.cache, self.ld_preload)
            if theirs.find(soname, hook) is None:
                return f"a non-Python child ({child}) would not find its {soname}"
        return None


class Setting:
    """What every step reads to write its option for one build: the build, the runtime to bind, the
    caller's values and the hook's entry (:func:`preload_entry`)."""

    __slots__ = ("build", "runtime", "loader", "package_dir", "entry", "entry_dir", "current", "llp", "with_entry")

    def __init__(self, build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader,
                 package_dir: "str | None", entry: str, entry_dir: "str | None") -> None:
        self.build, self.runtime, self.loader, self.package_dir = build, runtime, loader, package_dir
        self.entry, self.entry_dir = entry, entry_dir
        self.current = env.get("LD_PRELOAD", "")
        self.llp = env.get("LD_LIBRARY_PATH", "")
        self.with_entry = prepend_search_path(self.llp, entry_dir) if entry_dir is not None else self.llp

    @property
    def library(self) -> "str | None":
        """The runtime library to bind; None where there is nothing to bind (no library, a driver-only build,
        an unreadable one): then only the first step applies."""
        b = self.build
        return None if b.kind == "driver" or b.info is None else self.runtime.library


class Step:
    """One way of binding, named :attr:`name`: :meth:`write` gives its option for a build, :meth:`says` puts
    it in words."""

    name = ""

    def write(self, s: Setting) -> "Option | None":
        """The option for ``s``'s build; None where the step does not apply."""
        raise NotImplementedError

    def says(self, library: str) -> str:
        """The plan's binding, in words, where it binds ``library``."""
        raise NotImplementedError


class _AsFound(Step):
    name = AS_FOUND

    def write(self, s: Setting) -> Option:
        return Option(self, compose_preload(s.current, s.entry), s.with_entry)

    def says(self, library: str) -> str:
        return f"{AS_FOUND}: the loader finds {library} for the hook and every child"


class _SearchPath(Step):
    name = SEARCH_PATH

    def write(self, s: Setting) -> "Option | None":
        library = s.library
        if library is None:
            return None
        bind_dir = os.path.dirname(library)
        own = [d for d in s.loader.library_dirs() if same_file(d, bind_dir)]
        if search_path_unsafe(bind_dir):
            return Option(self, refused=f"{bind_dir} has ':' or ';', which LD_LIBRARY_PATH cannot hold")
        if own:
            return Option(self, refused=(
                f"{bind_dir} is the interpreter's own library directory (its DT_RPATH {own[0]}), which holds far "
                f"more than the runtime: first on every child's LD_LIBRARY_PATH it would replace their own libraries"))
        bound = prepend_search_path(s.llp, bind_dir)
        return Option(self, compose_preload(s.current, s.entry),
                      prepend_search_path(bound, s.entry_dir) if s.entry_dir is not None else bound)

    def says(self, library: str) -> str:
        return f"{SEARCH_PATH}: {os.path.dirname(library)} first on LD_LIBRARY_PATH"


class _RuntimePreloaded(Step):
    name = RUNTIME_PRELOADED

    def write(self, s: Setting) -> "Option | None":
        library = s.library
        if library is None:
            return None
        fix = None
        if LD_UNSAFE_CHARS & set(library):
            refused = f"{library} has a space, tab, colon or semicolon, which LD_PRELOAD cannot hold"
        elif counted_by_check(library):
            refused = f"{library} names torch_memory_saver, whose check wants exactly one LD_PRELOAD entry that does"
            fix = (f"reinstall the CUDA runtime (or the environment) under a path without 'torch_memory_saver' in "
                   f"it: torch_memory_saver's check counts every LD_PRELOAD entry whose name holds those words, and "
                   f"the plan that binds the one runtime copy here preloads {library}")
        elif reads_one_path(s.package_dir):
            refused = (f"torch_memory_saver at {s.package_dir} reads LD_PRELOAD as a single path "
                       f"({ONE_PATH_RELEASES}), so its check refuses a second entry")
            fix = (f"{SPLITTING_INSTALL} (its preload check accepts LD_PRELOAD=<hook>:{library}, the plan that "
                   f"binds the one runtime copy here)")
        else:
            current = s.current
            return Option(self, compose_preload(f"{library}:{current}" if current else library, s.entry),
                          s.with_entry)
        return Option(self, refused=refused, fix=fix)

    def says(self, library: str) -> str:
        return f"{RUNTIME_PRELOADED}: {library} preloaded by path after the hook"


# In the order tried: each puts more into what every child inherits than the one before.
STEPS: "tuple[Step, ...]" = (_AsFound(), _SearchPath(), _RuntimePreloaded())


def options(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, package_dir: str | None,
            entry: str, entry_dir: str | None) -> "Iterator[Option]":
    """The option of every step of :data:`STEPS` that applies to ``build`` (the refused ones with their
    reason), in order, each written only when asked for: the first holds in most processes."""
    setting = Setting(build, runtime, env, loader, package_dir, entry, entry_dir)
    for step in STEPS:
        option = step.write(setting)
        if option is None:
            return
        yield option


def words(option: Option, runtime: Runtime, build: Build) -> str:
    """How a plan with ``option`` binds the hook's runtime, in words (empty where no runtime library is known)."""
    if runtime.library is None:
        return ""
    if runtime.soname not in build.needs:  # 0.0.8's build: it links only the driver
        return f"{AS_FOUND}: nothing to bind, the build links no {runtime.soname} (it needs only the driver)"
    return option.step.says(runtime.library)


def no_binding_fix(options: "list[Option]") -> "str | None":
    """What would let a binding hold, where the user can do it: the fix of a refused option."""
    return next((o.fix for o in options if o.refused and o.fix), None)
