"""The non-Python children every plan is checked for (the system's shell, and bash where it is another file),
and which of them pose the loader another problem than the interpreter, so that only those are traced.

Tracing a child costs a process start: :func:`own_problem` decides, from the programs' dynamic sections and
what the interpreter's own trace resolved, where the interpreter's answer is the child's too.
"""

import os

from .builds import Build
from .elf import ElfError, read_dynamic
from .ldpaths import split_search_path
from .ldso import Loader, Object
from .results import Plan
from .sonames import GLIBC_SONAMES
from .trace import Trace

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .elf import DynamicInfo

__all__ = ["CHILD_PROGRAMS", "child_programs", "readable", "search_differs", "own_problem", "hook_closure",
           "read_ahead", "added_dirs"]

# The non-Python children every plan is checked for: the system's shell, and bash where it is another file.
CHILD_PROGRAMS = ("/bin/sh", "bash")


def child_programs(env: "Mapping[str, str]", exe: str) -> "list[str]":
    """Real paths of :data:`CHILD_PROGRAMS` here (bash as ``PATH`` finds it), each once, the interpreter
    (``exe``, a real path) left out."""
    seen = {exe}
    out: list[str] = []
    for name in CHILD_PROGRAMS:
        dirs = [""] if "/" in name else split_search_path(env.get("PATH", os.defpath))
        path = next((p for d in dirs if os.access(p := os.path.join(d, name), os.X_OK) and os.path.isfile(p)), None)
        real = os.path.realpath(path) if path else None
        if real and real not in seen:
            seen.add(real)
            out.append(real)
    return out


def readable(paths: "list[str]") -> "list[tuple[str, DynamicInfo]]":
    """(path, dynamic section) of each child program this machine can read; another is no child of the job."""
    out = []
    for path in paths:
        try:
            out.append((path, read_dynamic(path)))
        except (OSError, ElfError):
            continue
    return out


def _effective_rpath(info: "DynamicInfo") -> "tuple[str, ...]":
    """The DT_RPATH the loader uses for objects a program loads: none where it has DT_RUNPATH."""
    return () if info.runpath else info.rpath


def search_differs(exe: "DynamicInfo", child: "DynamicInfo") -> bool:
    """True when the loader's search for a preloaded object's needs differs between the two programs in
    what depends on the program itself: a DT_RPATH it uses, or another ELF class or machine."""
    return bool(_effective_rpath(exe) or _effective_rpath(child)
                or (child.elf_class, child.machine) != (exe.elf_class, exe.machine))


def own_problem(loader: Loader, child: "tuple[str, DynamicInfo]", added: "list[str]",
                 closure: "Callable[[], set[str]] | None") -> "bool | None":
    """True when a child poses the loader another problem than the interpreter did in its trace, so that
    trace is not the child's answer. ``added``: directories the plan puts on LD_LIBRARY_PATH; ``closure``:
    the names the hook and the objects it brought in need, as the interpreter's trace resolved them, or
    None before that trace has answered: then None where only the closure can tell.

    For a preloaded object's needs the loader's search depends on the program only through the
    program's DT_RPATH (ld.so(8), step 1: not used where the program has DT_RUNPATH), its ELF class and
    machine, and the objects the program loads itself, which satisfy a later need of the same name.
    So the answers are one where neither program has such a DT_RPATH, both are of one class and
    machine, neither finds a name of the closure by its own DT_RUNPATH, and no added directory holds
    a library the child needs (its own start is then as it was). A conda interpreter's children
    always pose their own problem: its DT_RPATH is what finds the runtime for it.
    """
    exe, (_, info) = loader.executable, child
    if search_differs(exe.info, info):
        return True
    if any(os.path.exists(os.path.join(d, name)) for d in added for name in info.needed):
        return True
    for prog in (exe, Object(*child)):
        own = {name for d in prog.runpath_dirs() for name in prog.info.needed if os.path.exists(os.path.join(d, name))}
        if own:
            if closure is None:
                return None
            if not own.isdisjoint(closure()):
                return True
    return False


def walk(build: Build, where: "Callable[[str, Object], str | None]", read: "dict[str, DynamicInfo]") -> "set[str]":
    """The names the hook needs and, transitively, the objects it brings in need, each object found by
    ``where(name, needed_by)`` (glibc's own libraries are not read: they need only each other).
    ``read``: the dynamic sections read so far, by path; each object read here is added to it."""
    names: set[str] = set()
    todo = [(name, Object(build.path, build.info)) for name in build.info.needed] if build.info else []
    while todo:
        name, parent = todo.pop()
        if name in names:
            continue
        names.add(name)
        path = where(name, parent) if name not in GLIBC_SONAMES else None
        if path:
            try:
                info = read[path] if path in read else read.setdefault(path, read_dynamic(path))
            except (OSError, ElfError):
                continue
            todo += [(need, Object(path, info)) for need in info.needed]
    return names


def hook_closure(build: Build, trace: Trace, read: "dict[str, DynamicInfo]") -> "set[str]":
    """:func:`walk` where the trace resolved each name: what the hook really brings in. ``read``: what
    :func:`read_ahead` read already."""
    return walk(build, lambda name, _parent: trace.resolved.get(name), read)


def read_ahead(build: Build, loader: Loader, plan: Plan) -> "dict[str, DynamicInfo]":
    """The dynamic sections of the objects the loader model says the hook brings in under ``plan``, by
    path (:func:`walk` where the model finds each name): read while the real loader traces the plan, so
    that :func:`hook_closure`, which follows the trace's answer, reads only where the model was wrong. A hint,
    never a verdict."""
    model = loader.under(plan.ld_library_path, plan.ld_preload)

    def where(name: str, parent: Object) -> "str | None":
        found = model.find(name, parent)
        return found.path if found else None

    read: "dict[str, DynamicInfo]" = {}
    walk(build, where, read)
    return read


def added_dirs(env: "Mapping[str, str]", ld_library_path: str) -> "list[str]":
    """The directories ``ld_library_path`` holds that ``env``'s LD_LIBRARY_PATH does not: what a plan adds."""
    before = set(split_search_path(env.get("LD_LIBRARY_PATH", "")))
    return [d for d in split_search_path(ld_library_path) if d not in before]
