"""Decide the preload plan for this process: which build, the exact LD_PRELOAD, and why.

:func:`survey` is the one function that decides; :func:`resolve`, the start-up hook and every
CLI command ask it. Steps:

1. find the candidate builds, or the one ``TMS_AUTOPRELOAD_PATH`` names (:func:`_candidates`);
2. detect the runtime this process will use (:mod:`tms_autopreload.runtime`);
3. keep the builds whose DT_NEEDED runtime matches it, driver-only builds matching any CUDA,
   best first (:func:`_screen`);
4. bind the hook to the runtime library torch will use, in this interpreter and in every child,
   the first of :data:`BINDINGS` that the loader model predicts holds (:func:`_plans_for`);
5. trace the planned start with the real loader, for the interpreter and for a non-Python child
   (``/bin/sh``, and ``bash`` where it is another file), and accept the first build that loads
   cleanly in all of them with the runtime bound where we meant (:func:`_choose`, :func:`_attempt`).

Each step says what became of a candidate with a :class:`Verdict`; a survey that finds no plan holds
the :class:`~tms_autopreload.errors.ResolveError` that :func:`resolve` raises.
"""

import os
import sys

from . import CUDA_MAJOR_VAR
from . import PATH_VAR
from . import ADDED_VAR, STATE_VAR, is_tms_entry, state_key
from . import compose_preload, locate, read_regular, same_file, split_preload
from .builds import Build, find_builds, read_build
from .elf import ElfError, read_dynamic
from .ldpaths import (LD_UNSAFE_CHARS, added_record, prepend_search_path, read_added, search_path_unsafe,
                      split_search_path)
from .errors import (CAUSE_BAD_FORCED_PATH, CAUSE_CHILD_FAILS, CAUSE_DOES_NOT_LOAD, CAUSE_ENV_TOO_LARGE,
                     CAUSE_FORCED_DOES_NOT_FIT, CAUSE_INTERPRETER_FAILS, CAUSE_LESS_PREFERRED, CAUSE_NO_BINDING,
                     CAUSE_NO_BUILD_FITS, CAUSE_NO_BUILDS, CAUSE_NO_DRIVER, CAUSE_NO_EXECUTABLE, CAUSE_NO_PACKAGE,
                     CAUSE_NO_RUNTIME, CAUSE_NOT_PRELOADED, CAUSE_PREFERRED_CHOSEN, CAUSE_TWO_RUNTIMES,
                     CAUSE_UNREADABLE_INTERPRETER, CAUSE_UNSAFE_PATH, CAUSE_UNTRUSTED_BUILDS,
                     CAUSE_UNUSABLE, CAUSE_WRONG_RUNTIME, ResolveError, shown)
from .ldso import Loader, Object, loaded_as
from .runtime import Runtime, detect, install_hint, split_from_torch
from .sonames import DRIVER_SONAME, GLIBC_SONAMES, release
from .trace import Trace, run_trace, run_traces, start_traces
from .trust import CAUSES as TRUST_CAUSES
from .trust import Trusted, refusal

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from .elf import DynamicInfo

__all__ = ["Plan", "Verdict", "Report", "survey", "resolve", "CHOSEN", "LOADS", "REJECTED", "UNTRIED", "STATUSES"]

_NO_DRIVER = f"the NVIDIA driver library {DRIVER_SONAME} is not on this node"
# Linux's limit on one "NAME=value" string of an exec'd environment, NUL included (32 pages):
# execve fails with E2BIG beyond it.
MAX_ARG_STRLEN = 32 * 4096


_E2BIG = 7


def _env_string_size(name: str, value: str) -> int:
    return len(os.fsencode(f"{name}={value}")) + 1


def _too_big(env: "Mapping[str, str]") -> ResolveError:
    """The error when the kernel refuses to exec the planned environment (E2BIG), naming its largest variables."""
    largest = sorted(env, key=lambda name: -_env_string_size(name, env[name]))[:3]
    sizes = ", ".join(f"{name} ({_env_string_size(name, env[name])} bytes)" for name in largest)
    return ResolveError(f"{sizes}: the environment is too large for the kernel to start any program with it (E2BIG: "
                        f"one variable over {MAX_ARG_STRLEN} bytes, or all together over the exec limit)",
                        fix="shorten or unset those variables", cause=CAUSE_ENV_TOO_LARGE)


# Verdict.status values (``doctor --json`` ``candidates[].status``).
CHOSEN = "chosen"  # the plan's build
LOADS = "loads"  # fits and loads (the survey makes the most preferred of these CHOSEN)
REJECTED = "rejected"  # cannot be preloaded here: ``reason`` and ``cause`` say why
UNTRIED = "untried"  # not judged to the end: no runtime was decided, or a preferred build was chosen first
STATUSES = (CHOSEN, LOADS, REJECTED, UNTRIED)


class Verdict:
    """What became of one candidate: its status, why (``reason`` for a person, ``cause`` for code, one of
    :data:`tms_autopreload.errors.CAUSES`; None for the chosen one), the real loader's answer, what would
    help, and the plan it gives when it loads (each step of the survey returns one)."""

    __slots__ = ("build", "status", "reason", "cause", "loader_ok", "fix", "plan")

    def __init__(self, build: Build, status: str, reason: str, cause: str | None = None, *,
                 loader_ok: bool | None = None, fix: str | None = None, plan: "Plan | None" = None) -> None:
        self.build = build
        self.status = status  # one of STATUSES
        self.reason = reason
        self.cause = cause
        self.loader_ok = loader_ok  # the real loader's answer (``doctor --json`` ``loads``); None when not traced
        self.fix = fix  # what the user can do, for the error when no build fits
        self.plan = plan  # the plan with this build, when it loads (LOADS or CHOSEN)

    def __repr__(self) -> str:
        cause = f", cause={self.cause!r}" if self.cause else ""
        return f"Verdict(build={self.build.path!r}, status={self.status!r}{cause})"


class Plan:
    """The environment that makes this process start with the right hook."""

    __slots__ = ("build", "ld_preload", "ld_library_path", "runtime", "warnings", "binding", "added")

    def __init__(self, build: str, ld_preload: str, ld_library_path: str | None, runtime: Runtime,
                 warnings: tuple[str, ...] = (), binding: str = "",
                 added: "tuple[tuple[str, ...], tuple[str, ...]]" = ((), ())) -> None:
        self.build = build  # real path of the chosen file
        self.ld_preload = ld_preload  # the complete new LD_PRELOAD value
        self.ld_library_path = ld_library_path  # the complete new LD_LIBRARY_PATH, None to leave it
        self.runtime = runtime
        self.warnings = warnings
        self.binding = binding  # how the hook's runtime need binds the runtime library, in words
        # What the plan adds, besides the hook: (LD_PRELOAD entries, LD_LIBRARY_PATH entries), an earlier
        # plan's included where they stay; a command run where it is applied takes them out again.
        self.added = added

    def changes(self) -> dict[str, str]:
        """Variables to set, and their values."""
        env = {"LD_PRELOAD": self.ld_preload}
        if self.ld_library_path is not None:
            env["LD_LIBRARY_PATH"] = self.ld_library_path
        return env

    def environment(self) -> dict[str, str]:
        """What a process applying the plan sets: :meth:`changes`, the state that lets its flagged children
        skip resolving (what it was resolved for: this prefix, the overrides, the build), and the record of
        what it added (:mod:`tms_autopreload.applied` reads it back)."""
        return {**self.changes(), STATE_VAR: state_key(self.build), ADDED_VAR: added_record(*self.added)}

    def __repr__(self) -> str:
        llp = "" if self.ld_library_path is None else f", ld_library_path={self.ld_library_path!r}"
        return f"Plan(build={self.build!r}, ld_preload={self.ld_preload!r}{llp})"


class Report:
    """Everything the survey saw; ``plan`` is None exactly when ``failure`` is set (``doctor --json`` is
    :func:`tms_autopreload.doctor.document`)."""

    __slots__ = ("executable", "package_dir", "runtime", "verdicts", "plan", "failure", "warnings", "loader")

    def __init__(self, executable: str, package_dir: str | None, runtime: Runtime | None,
                 verdicts: tuple[Verdict, ...], plan: Plan | None, failure: ResolveError | None,
                 warnings: tuple[str, ...] = (), loader: "Loader | None" = None) -> None:
        self.executable = executable
        # The survey's loader model of this process (None: its interpreter could not be read), for whoever
        # reads the report after the decision (doctor's driver facts and search rule): one per survey.
        self.loader = loader
        self.package_dir = package_dir
        self.runtime = runtime
        self.verdicts = verdicts
        self.plan = plan
        self.failure = failure  # why there is no plan: what resolve() raises, with this report
        self.warnings = warnings

    @property
    def error(self) -> str | None:
        """Why there is no plan, as a person reads it (the message and its fix), or None."""
        return None if self.failure is None else str(self.failure)

    def __repr__(self) -> str:
        told = f"plan={self.plan!r}" if self.failure is None else f"cause={self.failure.cause!r}"
        return f"Report({told}, verdicts={list(self.verdicts)!r})"


def _fits(build: Build, runtime: Runtime) -> bool:
    if runtime.kind == "hip":
        return build.kind == "hip" and build.major == runtime.major
    return (build.kind == "cuda" and build.major == runtime.major) or build.kind == "driver"


def _preference(build: Build, runtime: Runtime, index: int) -> tuple[int, int, int]:
    """Exact runtime builds before driver-only ones; a ``_cuN`` name matching the major first."""
    suffix = f"_cu{runtime.major}."
    return (0 if build.kind == runtime.kind else 1, 0 if suffix in build.name else 1, index)


def _unwritable(path: str) -> "str | None":
    """Why ``path`` cannot be written in the environment at all, or None (:func:`_preload_entry` then
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


def _preload_entry(path: str) -> tuple[str, str | None]:
    """(LD_PRELOAD entry, directory to add to LD_LIBRARY_PATH) for ``path``, which :func:`_unwritable`
    accepts: the path itself, or its bare file name found through LD_LIBRARY_PATH."""
    if not LD_UNSAFE_CHARS & set(path):
        return path, None
    directory, name = os.path.split(path)
    return name, directory


# The first torch_memory_saver release whose Python side splits LD_PRELOAD on ':' (and wants one
# torch_memory_saver entry among them): 0.0.8 (``_BinaryInfo.compute``) and 0.0.9/0.0.9.post1
# (``HookUtilModePreload.get_path_binary``) pass the whole value to ``ctypes.CDLL``; 0.0.10 splits it.
_SPLITS_SINCE = (0, 0, 10)


def _tms_version(package_dir: str) -> "tuple[int, ...] | None":
    """The release of the torch_memory_saver distribution installed with ``package_dir``: the ``Version`` of
    the one ``torch_memory_saver-*.dist-info`` beside it (its installer's record); None when there is not
    exactly one, or it states none."""
    site = os.path.dirname(package_dir)
    try:
        found = [n for n in os.listdir(site)
                 if n.lower().startswith("torch_memory_saver-") and n.endswith(".dist-info")]
        if len(found) != 1:
            return None
        head = read_regular(os.path.join(site, found[0], "METADATA"), 1 << 16).decode("utf-8", "replace")
    except OSError:
        return None
    version = next((line[len("Version:"):] for line in head.split("\n") if line.startswith("Version:")), "")
    return release(version) or None


def _tms_reads_one_path(package_dir: str | None) -> bool:
    """True when torch_memory_saver's Python side needs LD_PRELOAD to be exactly one path.

    Decided by the installed distribution's version against :data:`_SPLITS_SINCE`. A tree with no
    metadata beside it (copied into place, or an editable source tree) has no version to go by: then
    its code decides, by whether ``hooks/mode_preload.py`` splits the value with ``.split(":")``. That
    is wording, checked against 0.0.8 (no such file), 0.0.9 and 0.0.9.post1 (no split), 0.0.10 and a
    source build of upstream #108 (the split); another spelling of the split reads as one path, the
    cautious answer.
    """
    if package_dir is None:
        return False
    release = _tms_version(package_dir)
    if release is not None:
        return release < _SPLITS_SINCE
    try:
        return b'.split(":")' not in read_regular(os.path.join(package_dir, "hooks", "mode_preload.py"), 1 << 20)
    except OSError:
        return True


# How a plan binds the hook's runtime need to the library torch uses, in the order tried: each puts
# more into what every child inherits than the one before. The first that the loader model predicts
# holds, in this interpreter and in every non-Python child, is the plan; the real loader must agree.
AS_FOUND = "as found"  # the hook alone: the loader finds that very file for it
SEARCH_PATH = "LD_LIBRARY_PATH"  # the library's directory first on LD_LIBRARY_PATH
BY_PATH = "LD_PRELOAD"  # the library itself preloaded by path, right after the hook
BINDINGS = (AS_FOUND, SEARCH_PATH, BY_PATH)
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


class Option:
    """One binding of :data:`BINDINGS` for one build: its environment, or why it cannot be written (and
    what would let it be, when the user can do something)."""

    __slots__ = ("binding", "ld_preload", "ld_library_path", "refused", "fix")

    def __init__(self, binding: str, ld_preload: str = "", ld_library_path: str = "",
                 refused: "str | None" = None, fix: "str | None" = None) -> None:
        self.binding = binding
        self.ld_preload = ld_preload
        self.ld_library_path = ld_library_path
        self.refused = refused
        self.fix = fix


def _options(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, package_dir: str | None,
             entry: str, entry_dir: str | None) -> "Iterator[Option]":
    """Every binding of :data:`BINDINGS` for ``build`` (the refused ones with their reason), in order, each
    written only when asked for: the first holds in most processes."""
    current = env.get("LD_PRELOAD", "")
    llp = env.get("LD_LIBRARY_PATH", "")
    with_entry = prepend_search_path(llp, entry_dir) if entry_dir is not None else llp
    yield Option(AS_FOUND, compose_preload(current, entry), with_entry)
    library = runtime.library
    if library is None or build.kind == "driver" or build.info is None:
        return
    bind_dir = os.path.dirname(library)
    own = [d for d in loader.library_dirs() if same_file(d, bind_dir)]
    if search_path_unsafe(bind_dir):
        yield Option(SEARCH_PATH, refused=f"{bind_dir} has ':' or ';', which LD_LIBRARY_PATH cannot hold")
    elif own:
        yield Option(SEARCH_PATH, refused=(
            f"{bind_dir} is the interpreter's own library directory (its DT_RPATH {own[0]}), which holds far more "
            f"than the runtime: first on every child's LD_LIBRARY_PATH it would replace their own libraries"))
    else:
        bound = prepend_search_path(llp, bind_dir)
        yield Option(SEARCH_PATH, compose_preload(current, entry),
                     prepend_search_path(bound, entry_dir) if entry_dir is not None else bound)
    fix = None
    if LD_UNSAFE_CHARS & set(library):
        refused = f"{library} has a space, tab, colon or semicolon, which LD_PRELOAD cannot hold"
    elif "torch_memory_saver" in library:
        refused = f"{library} names torch_memory_saver, whose check wants exactly one LD_PRELOAD entry that does"
        fix = (f"reinstall the CUDA runtime (or the environment) under a path without 'torch_memory_saver' in it: "
               f"torch_memory_saver's check counts every LD_PRELOAD entry whose name holds those words, and the "
               f"plan that binds the one runtime copy here preloads {library}")
    elif _tms_reads_one_path(package_dir):
        refused = (f"torch_memory_saver at {package_dir} reads LD_PRELOAD as a single path (0.0.9.post1 and "
                   f"older), so its check refuses a second entry")
        fix = (f"pip install 'torch-memory-saver>=0.0.10' (its preload check accepts LD_PRELOAD=<hook>:"
               f"{library}, the plan that binds the one runtime copy here)")
    else:
        refused = None
    yield (Option(BY_PATH, refused=refused, fix=fix) if refused else
           Option(BY_PATH, compose_preload(f"{library}:{current}" if current else library, entry), with_entry))


def _predict(build: Build, runtime: Runtime, option: Option, loader: Loader, env: "Mapping[str, str]",
             children: "list[tuple[str, DynamicInfo]]") -> "str | None":
    """Why the loader model says ``option`` would not map exactly ``runtime.library`` for the hook in this
    interpreter, or would leave a child without the runtime; None when it holds."""
    if runtime.library is None or build.kind == "driver" or build.info is None:
        return None
    hook = Object(build.path, build.info)
    soname = runtime.soname
    found = loader.under(option.ld_library_path, option.ld_preload).find(soname, hook)
    if found is None:
        return f"its {soname} would not be found"
    if not same_file(found.path, runtime.library):
        rule = "the interpreter's DT_RPATH" if found.rule == "DT_RPATH" else found.rule
        return (f"its {soname} would bind to {found.path} ({rule}), not to {runtime.library} that "
                f"torch uses: two runtime copies")
    for child, info in children:
        if not _search_differs(loader.executable.info, info):
            continue  # the loader searches for the hook's needs in it as in the interpreter
        theirs = Loader(Object(child, info), option.ld_library_path, loader.cache, option.ld_preload)
        if theirs.find(soname, hook) is None:
            return f"a non-Python child ({child}) would not find its {soname}"
    return None


def _effective_rpath(info: "DynamicInfo") -> "tuple[str, ...]":
    """The DT_RPATH the loader uses for objects a program loads: none where it has DT_RUNPATH."""
    return () if info.runpath else info.rpath


def _search_differs(exe: "DynamicInfo", child: "DynamicInfo") -> bool:
    """True when the loader's search for a preloaded object's needs differs between the two programs in
    what depends on the program itself: a DT_RPATH it uses, or another ELF class or machine."""
    return bool(_effective_rpath(exe) or _effective_rpath(child)
                or (child.elf_class, child.machine) != (exe.elf_class, exe.machine))


def _own_problem(loader: Loader, child: "tuple[str, DynamicInfo]", added: "list[str]",
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
    if _search_differs(exe.info, info):
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


def _walk(build: Build, where: "Callable[[str, Object], str | None]", read: "dict[str, DynamicInfo]") -> "set[str]":
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


def _closure(build: Build, trace: Trace, read: "dict[str, DynamicInfo]") -> "set[str]":
    """:func:`_walk` where the trace resolved each name: what the hook really brings in. ``read``: what
    :func:`_read_ahead` read already."""
    return _walk(build, lambda name, _parent: trace.resolved.get(name), read)


def _read_ahead(build: Build, loader: Loader, plan: Plan) -> "dict[str, DynamicInfo]":
    """The dynamic sections of the objects the loader model says the hook brings in under ``plan``, by
    path (:func:`_walk` where the model finds each name): read while the real loader traces the plan, so
    that :func:`_closure`, which follows the trace's answer, reads only where the model was wrong. A hint,
    never a verdict."""
    model = loader.under(plan.ld_library_path, plan.ld_preload)

    def where(name: str, parent: Object) -> "str | None":
        found = model.find(name, parent)
        return found.path if found else None

    read: "dict[str, DynamicInfo]" = {}
    _walk(build, where, read)
    return read


def _added_dirs(env: "Mapping[str, str]", ld_library_path: str) -> "list[str]":
    before = set(split_search_path(env.get("LD_LIBRARY_PATH", "")))
    return [d for d in split_search_path(ld_library_path) if d not in before]


def _children(paths: "list[str]") -> "list[tuple[str, DynamicInfo]]":
    """(path, dynamic section) of each child program this machine can read; another is no child of the job."""
    out = []
    for path in paths:
        try:
            out.append((path, read_dynamic(path)))
        except (OSError, ElfError):
            continue
    return out


def _judge_children(build: Build, traces: "list[tuple[str, Trace | OSError]]") -> "str | None":
    """Why a non-Python child would not start under the plan, in the real loader's words, or None."""
    for child, trace in traces:
        if isinstance(trace, OSError):
            continue
        skipped = trace.skip_of(build.name)
        if trace.missing or trace.errors or trace.status or skipped:
            why = trace.reason() or f"the loader skipped it as a preload: {skipped}"
            return f"a non-Python child ({child}) would not start: {why}"
    return None


def _plan_of(build: Build, runtime: Runtime, env: "Mapping[str, str]", option: Option,
             passed: "list[str]") -> Plan:
    """The plan of one binding (``passed``: why each earlier one would not hold); raises ResolveError when
    a value would be too long for any exec."""
    llp = option.ld_library_path
    words = _binding_words(option, runtime, build) + (f" (not {'; not '.join(passed)})" if passed else "")
    plan = Plan(os.path.realpath(build.path), option.ld_preload,
                llp if llp != env.get("LD_LIBRARY_PATH", "") else None, runtime, binding=words,
                added=_added(env, option))
    for name, value in plan.changes().items():
        if value != env.get(name) and _env_string_size(name, value) > MAX_ARG_STRLEN:
            raise ResolveError(
                f"{name} would be {_env_string_size(name, value)} bytes with the hook's entries "
                f"({len(env.get(name, ''))} now), over the kernel's limit of {MAX_ARG_STRLEN} bytes for one "
                f"environment string (MAX_ARG_STRLEN): no program could be started with it",
                fix=f"shorten {name} (drop entries this process does not need) and start again",
                cause=CAUSE_ENV_TOO_LARGE)
    return plan


def _added(env: "Mapping[str, str]", option: Option) -> "tuple[tuple[str, ...], tuple[str, ...]]":
    """What ``option`` adds to ``env``'s LD_PRELOAD (the hook aside: every torch_memory_saver entry is the
    plan's) and LD_LIBRARY_PATH, counting an entry an earlier plan added (``env``'s record) as added."""
    earlier_preload, earlier_path = read_added(env.get(ADDED_VAR, ""))
    had_preload, had_path = split_preload(env.get("LD_PRELOAD", "")), split_search_path(env.get("LD_LIBRARY_PATH", ""))
    preload = tuple(e for e in split_preload(option.ld_preload)
                    if not is_tms_entry(e) and (e not in had_preload or e in earlier_preload))
    path = tuple(d for d in split_search_path(option.ld_library_path) if d not in had_path or d in earlier_path)
    return preload, path


def _binding_words(option: Option, runtime: Runtime, build: Build) -> str:
    if runtime.library is None:
        return ""
    if runtime.soname not in build.needs:  # 0.0.8's build: it links only the driver
        return f"{AS_FOUND}: nothing to bind, the build links no {runtime.soname} (it needs only the driver)"
    if option.binding == AS_FOUND:
        return f"{AS_FOUND}: the loader finds {runtime.library} for the hook and every child"
    if option.binding == SEARCH_PATH:
        return f"{SEARCH_PATH}: {os.path.dirname(runtime.library)} first on LD_LIBRARY_PATH"
    return f"{BY_PATH}: {runtime.library} preloaded by path after the hook"


def _judge(build: Build, plan: Plan, trace: Trace) -> Verdict:
    """Step 5: the real loader's answer for ``plan``: accepted (LOADS, with the plan) only when everything
    resolves, the build is preloaded, and its runtime binds to the library this process uses."""
    runtime = plan.runtime
    # The loader skips a preload entry it cannot load and goes on: for the user's other entries that
    # is theirs, not this build's; for this build it is the reason.
    skipped = trace.skip_of(build.name)
    errors = list(trace.errors) + ([f"the loader skipped it as a preload: {skipped}"] if skipped else [])
    if trace.missing or errors or trace.status:
        reason = "; ".join([f"{n} => not found" for n in trace.missing] + errors) or trace.reason()
        if DRIVER_SONAME in trace.missing:
            return Verdict(build, REJECTED, f"{_NO_DRIVER} (no driver installed, not mounted into this container, "
                           f"or hidden by LD_LIBRARY_PATH); loader: {reason}", CAUSE_NO_DRIVER, loader_ok=False,
                           fix="install the NVIDIA driver (or expose it to the container), or do not set the "
                               "flag on nodes without a GPU")
        fix = install_hint(runtime.kind, runtime.major) if runtime.soname in trace.missing else None
        return Verdict(build, REJECTED, reason, CAUSE_DOES_NOT_LOAD, loader_ok=False, fix=fix)
    # A bare-name preload entry shows as "name => path", a path entry as "path".
    if not any(same_file(p, build.path) for p in (*trace.loaded, *trace.resolved.values())
               if os.path.basename(p) == build.name):
        return Verdict(build, REJECTED, "the loader did not preload it (no error given)", CAUSE_NOT_PRELOADED,
                       loader_ok=False)
    if build.kind == "driver":
        return Verdict(build, LOADS, "loads", loader_ok=True, plan=plan)
    # Listed as "soname => path" when found by a search; as a bare path when the name matched an
    # object LD_PRELOAD had loaded (by its DT_SONAME).
    bound = trace.resolved.get(runtime.soname) or loaded_as(runtime.soname, [(p, p) for p in trace.loaded])
    if runtime.library is not None and not same_file(bound, runtime.library):
        return Verdict(build, REJECTED, f"its {runtime.soname} would bind to {bound}, not to {runtime.library} "
                       f"that this process uses: two runtime copies", CAUSE_TWO_RUNTIMES, loader_ok=True)
    return Verdict(build, LOADS, f"loads; binds {runtime.soname} to {bound}", loader_ok=True, plan=plan)


def _attempt(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, executable: str,
             trace_it: bool = True, package_dir: str | None = None,
             children: "list[tuple[str, DynamicInfo]] | None" = None) -> Verdict:
    """Plan one build with the first binding the loader model predicts holds, then trace the planned
    start with the real loader (the interpreter and the non-Python ``children`` at once) and judge.

    With no binding predicted to hold, the first is traced anyway, so the loader's own words say why,
    followed by each other binding's reason. ``trace_it=False`` plans without the trace, for a caller
    whose own ``dlopen`` of the plan is the real loader's answer (:mod:`tms_autopreload.inprocess`);
    ``loader_ok`` is then None. The verdict is LOADS (with its plan) or REJECTED.
    """
    unwritable = _unwritable(build.path)
    if unwritable is not None:
        return Verdict(build, REJECTED, unwritable, CAUSE_UNSAFE_PATH,
                       fix="install torch_memory_saver under a path without spaces or colons")
    entry, entry_dir = _preload_entry(build.path)
    kids = children or []
    options: list[Option] = []  # the bindings written so far: up to the chosen one, else all
    why_not: list[str] = []
    chosen = None
    for option in _options(build, runtime, env, loader, package_dir, entry, entry_dir):
        options.append(option)
        why = option.refused or _predict(build, runtime, option, loader, env, kids)
        if why is None:
            chosen = option
            break
        why_not.append(f"{option.binding}: {why}")
    planned = _plan_of(build, runtime, env, chosen or options[0], why_not if chosen else [])
    if not trace_it:
        if chosen is None:
            return Verdict(build, REJECTED, "; ".join(why_not), CAUSE_NO_BINDING, fix=_no_binding_fix(options))
        return Verdict(build, LOADS, "chosen without a loader trace: to be loaded in-process", plan=planned)
    planned_env = {**env, **planned.changes()}
    added = _added_dirs(env, planned.ld_library_path or "")
    # The children whose own problem is plain before the interpreter's trace (a conda interpreter's: its
    # DT_RPATH) are traced beside it; those only the closure can decide, after it.
    decided = {kid[0]: _own_problem(loader, kid, added, None) for kid in kids}
    beside = [path for path, own in decided.items() if own]
    collect = start_traces([executable, *beside], planned_env)
    try:
        ahead = _read_ahead(build, loader, planned) if None in decided.values() else {}
    finally:
        trace, *beside_traces = collect()  # in order: the interpreter, then each of ``beside``
    if isinstance(trace, OSError):
        raise trace  # the interpreter itself cannot be started: survey's error, not this build's
    judged = _judge(build, planned, trace)
    if judged.plan is not None:
        memo: "list[set[str]]" = []

        def closure() -> "set[str]":
            if not memo:
                memo.append(_closure(build, trace, ahead))
            return memo[0]

        after = [kid[0] for kid in kids if decided[kid[0]] is None and _own_problem(loader, kid, added, closure)]
        answers = dict(zip(beside, beside_traces, strict=True))
        answers.update(zip(after, run_traces(after, planned_env) if after else [], strict=True))
        traced = [(kid[0], answers[kid[0]]) for kid in kids if kid[0] in answers]  # in the children's order
        child_reason = _judge_children(build, traced) if traced else None
        if child_reason is not None:
            judged = Verdict(build, REJECTED, child_reason, CAUSE_CHILD_FAILS, loader_ok=False)
    if judged.plan is not None or chosen is not None:
        return judged
    # Nothing was predicted to hold: the loader's words for the plain plan, then why each other binding cannot.
    reasons = [judged.reason, *why_not[1:]]
    return Verdict(build, REJECTED, "; ".join(reasons),
                   CAUSE_NO_DRIVER if judged.cause == CAUSE_NO_DRIVER else CAUSE_NO_BINDING,
                   loader_ok=judged.loader_ok, fix=judged.fix or _no_binding_fix(options))


def _no_binding_fix(options: "list[Option]") -> "str | None":
    """What would let a binding hold: what lets the runtime be preloaded by path, when the user can do it."""
    by_path = next((o for o in options if o.binding == BY_PATH), None)
    return by_path.fix if by_path is not None and by_path.refused else None


def _code_writers(program: Object, package_dir: str | None) -> Trusted:
    """Who can already change the code this process runs (:mod:`tms_autopreload.trust`): its prefixes,
    its real interpreter's directory (``program``: the loader's executable, symlinks resolved), and the
    site directory that holds torch_memory_saver (and so the builds found next to it)."""
    return Trusted((sys.prefix, sys.base_prefix, os.path.dirname(program.path),
                    os.path.dirname(package_dir) if package_dir else None))


def _candidates(env: "Mapping[str, str]", package_dir: str | None, exe: str, program: Object,
                warnings: list[str]) -> "tuple[list[Build], str | None]":
    """Step 1: (the builds to consider, the path TMS_AUTOPRELOAD_PATH forces or None); raises ResolveError
    when there are none. ``exe`` is the interpreter as named, ``program`` the loader's executable."""
    trusted = _code_writers(program, package_dir)
    want = program.info
    forced = env.get(PATH_VAR, "").strip() or None
    if forced:
        what = ("is not an absolute path" if not os.path.isabs(forced) else
                "does not exist" if not os.path.exists(forced) else
                "is not a regular file" if not os.path.isfile(forced) else None)
        if what:
            raise ResolveError(f"{PATH_VAR}={shown(forced)} {what}", fix="point it at a preload build or unset it",
                               cause=CAUSE_BAD_FORCED_PATH)
        build = read_build(forced, want)
        if build.problem:
            raise ResolveError(f"{PATH_VAR}={shown(forced)} does not name a torch_memory_saver preload build for "
                               f"this interpreter: {build.problem}", cause=CAUSE_BAD_FORCED_PATH,
                               fix=f"point {PATH_VAR} at one (`tms-autopreload doctor` lists the installed builds) "
                                   f"or unset it")
        unsafe = refusal(forced, trusted)
        if unsafe:
            warnings.append(f"{PATH_VAR} names a file others can change ({unsafe.message}); preloading it anyway")
        return [build], forced
    if package_dir is None:
        raise ResolveError(f"torch_memory_saver is not installed for {exe}", cause=CAUSE_NO_PACKAGE,
                           fix=f"pip install torch-memory-saver (or set {PATH_VAR}=/abs/path/to/build.so)")
    builds = find_builds(package_dir, want, trusted)
    if not builds:
        from .installed import reinstall_hint  # what to install: asked only when no build is found

        raise ResolveError(f"torch_memory_saver at {package_dir} ships no preload build (looked for "
                           f"torch_memory_saver_hook_mode_preload*.so and torch_memory_saver_cpp*.so there and "
                           f"in {os.path.dirname(package_dir)})",
                           fix=reinstall_hint(package_dir) or "reinstall torch-memory-saver",
                           cause=CAUSE_NO_BUILDS)
    return builds, None


def _screen(builds: list[Build], runtime: Runtime | None) -> "tuple[dict[int, Verdict], list[int]]":
    """Step 3: verdicts for builds that cannot fit or may not be preloaded (who can write them, judged
    only for builds that fit, so that the error names that cause), and the indexes of the rest, best first."""
    verdicts: dict[int, Verdict] = {}
    eligible: list[tuple[tuple[int, int, int], int]] = []
    for i, b in enumerate(builds):
        if b.problem:
            verdicts[i] = Verdict(b, REJECTED, b.problem, CAUSE_UNUSABLE)
        elif runtime is None:
            verdicts[i] = Verdict(b, UNTRIED, "no runtime could be decided", CAUSE_NO_RUNTIME)
        elif not _fits(b, runtime):
            verdicts[i] = Verdict(b, REJECTED, f"built for {b.target()}, not for this process's {runtime.name}",
                                  CAUSE_WRONG_RUNTIME)
        elif b.refusal:
            verdicts[i] = Verdict(b, REJECTED, f"{b.refusal.message}; refusing to preload it (name it in "
                                  f"{PATH_VAR} to override)", b.refusal.cause, fix=b.refusal.fix)
        else:
            eligible.append((_preference(b, runtime, i), i))
    return verdicts, [i for _, i in sorted(eligible)]


def _choose(builds: list[Build], eligible: list[int], runtime: Runtime, env: "Mapping[str, str]", loader: Loader,
            exe: str, check_all: bool, trace: bool, package_dir: str | None,
            children: "list[tuple[str, DynamicInfo]]") -> "tuple[Plan | None, dict[int, Verdict]]":
    """Steps 4-5: plan and trace the eligible builds in order; (the plan of the first that loads cleanly,
    their verdicts).

    Raises OSError when the interpreter itself cannot be started for the trace, and ResolveError when
    a planned LD_PRELOAD or LD_LIBRARY_PATH would be too long for any exec.
    """
    plan: Plan | None = None
    verdicts: dict[int, Verdict] = {}
    for i in eligible:
        if plan is not None and not check_all:
            verdicts[i] = Verdict(builds[i], UNTRIED, "a preferred build was chosen first", CAUSE_PREFERRED_CHOSEN)
            continue
        verdict = verdicts[i] = _attempt(builds[i], runtime, env, loader, exe, trace, package_dir, children)
        if verdict.plan is None:
            continue
        if plan is None:
            plan, verdict.status = verdict.plan, CHOSEN
        else:
            verdict.reason, verdict.cause = f"{verdict.reason}; not chosen (less preferred)", CAUSE_LESS_PREFERRED
    return plan, verdicts


def _trace_the_rest(verdicts: "dict[int, Verdict]", env: "Mapping[str, str]", plan: Plan | None, exe: str) -> None:
    """For ``doctor``: give every readable candidate not traced yet the loader's answer."""
    probe_env = {**env, **(plan.changes() if plan else {})}
    for v in verdicts.values():
        if v.loader_ok is None and v.build.info is not None and v.build.problem is None and v.build.refusal is None:
            probe_env["LD_PRELOAD"] = compose_preload(env.get("LD_PRELOAD", ""), v.build.path)
            try:
                t = run_trace(exe, probe_env)
            except OSError:
                continue
            skipped = t.skip_of(v.build.name)
            v.loader_ok = t.ok and not skipped
            if not v.loader_ok:
                v.reason = f"{v.reason}; loader: {t.reason() or f'skipped as a preload: {skipped}'}"


def _with_single_path_warning(plan: Plan, package_dir: str | None, forced: str | None) -> Plan:
    """The plan, warned when it keeps other LD_PRELOAD entries that torch_memory_saver's Python side refuses."""
    kept = split_preload(plan.ld_preload)[1:]
    if not kept or forced or not _tms_reads_one_path(package_dir):
        return plan
    return Plan(plan.build, plan.ld_preload, plan.ld_library_path, plan.runtime, binding=plan.binding,
                added=plan.added, warnings=(
        f"LD_PRELOAD keeps {':'.join(kept)} after the hook, but torch_memory_saver at {package_dir} "
        f"reads LD_PRELOAD as a single path (0.0.9.post1 and older), so its Python side will refuse "
        f"this process; drop those entries or pip install 'torch-memory-saver>=0.0.10'",))


def _no_fit(runtime: Runtime, ordered: tuple[Verdict, ...], eligible: list[int], forced: str | None,
            ld_library_path: str, package_dir: str | None = None) -> ResolveError:
    """The error when no build fits: the cause first (what the user set, who else can write every build
    that fits, or the driver every build that fits the runtime misses), then every candidate with its
    reason; the fix from what the candidates' verdicts suggest."""
    refused = [v for v in ordered if v.cause in TRUST_CAUSES]  # they fit; others can write them
    fixes = [f for i in eligible if (f := ordered[i].fix)] + list(dict.fromkeys(v.fix for v in refused if v.fix))
    listing = [f"  - {v.build.name}: {v.reason}" for v in ordered]
    split, torch = split_from_torch(runtime), runtime.torch
    built = None
    if split is not None and torch is not None:
        # The override names another runtime than torch links: that, not a missing build or runtime, is the
        # cause; installing the runtime it names, or a build for it, would only split the hook from torch
        # (split_warning).
        built = f"torch at {torch.dir} " + (f"is built for CUDA {torch.cuda}" if torch.cuda else f"links {split}")
        fixes = [f"unset {CUDA_MAJOR_VAR} ({built})",
                 *(f for f in fixes if f != install_hint(runtime.kind, runtime.major))]
    reasons_above = f"see the reasons above, or set {PATH_VAR} to a build that loads"
    if refused and not eligible:
        only = refused[0].build.refusal if len(refused) == 1 else None
        head = (f"{refused[0].build.name}, the torch_memory_saver preload build for {runtime.name}, is not preloaded: "
                f"{only.message}" if only else
                f"every torch_memory_saver preload build for {runtime.name} can be changed by someone who "
                f"cannot change this environment's code, so none is preloaded")
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_UNTRUSTED_BUILDS,
                            fix="; or ".join(fixes) + f"; or name the build in {PATH_VAR} to preload it anyway")
    if eligible and all(ordered[i].cause == CAUSE_NO_DRIVER for i in eligible):
        where = (f"LD_LIBRARY_PATH={shown(ld_library_path)}, /etc/ld.so.cache and the default directories"
                 if ld_library_path else "/etc/ld.so.cache and the default directories")
        head = (f"the NVIDIA driver library {DRIVER_SONAME} is not found by the loader (it searched {where}), "
                f"so no torch_memory_saver preload build can load for {runtime.describe()}")
        return ResolveError("\n".join([head + ":", *listing]), fix="; or ".join(dict.fromkeys(fixes)),
                            cause=CAUSE_NO_DRIVER)
    if eligible and all(ordered[i].cause == CAUSE_NO_BINDING for i in eligible):
        head = (f"no plan maps exactly one {runtime.soname} (the copy torch uses) in this interpreter and lets a "
                f"non-Python child start, for {runtime.describe()}")
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_NO_BINDING,
                            fix="; or ".join(dict.fromkeys(fixes)) if fixes else reasons_above)
    if forced:
        head = f"{PATH_VAR}={shown(forced)} names a build that does not fit {runtime.describe()}"
        return ResolveError("\n".join([head + ":", *listing]), cause=CAUSE_FORCED_DOES_NOT_FIT,
                            fix=f"unset {CUDA_MAJOR_VAR} and {PATH_VAR} to use torch's runtime ({built})" if built
                            else f"point {PATH_VAR} at a build for {runtime.name}, or unset it to choose among the "
                                 f"installed builds")
    if not eligible and not built:
        from .installed import build_install_hint  # what to install: asked only when no build fits

        fixes.append(build_install_hint(runtime.kind, runtime.major, package_dir))
    return ResolveError("\n".join([f"no torch_memory_saver preload build fits {runtime.describe()}:", *listing]),
                        fix="; or ".join(dict.fromkeys(fixes)) if fixes else reasons_above, cause=CAUSE_NO_BUILD_FITS)


def split_overrides(env: "Mapping[str, str]") -> "list[str]":
    """The override variables set in ``env`` (``NAME=value``), which can make the hook use another runtime
    than torch (:func:`tms_autopreload.runtime.split_from_torch`)."""
    return [f"{name}={shown(env[name])}" for name in (CUDA_MAJOR_VAR, PATH_VAR) if env.get(name, "").strip()]


def split_fix(env: "Mapping[str, str]") -> str:
    """The fix where an override splits the hook from torch: unset the overrides ``env`` sets."""
    names = [o.partition("=")[0] for o in split_overrides(env)] or [CUDA_MAJOR_VAR]
    return f"unset {' and '.join(names)} to use torch's runtime"


def split_warning(runtime: Runtime, build: Build, env: "Mapping[str, str]") -> "str | None":
    """The plan's warning when an override makes the hook (``build``) use another runtime than torch links,
    else None (a driver-only build uses no runtime). Never a fix: what it asks for is what splits them."""
    split = split_from_torch(runtime)
    if split is None or runtime.torch is None or build.kind == "driver":
        return None
    overrides = split_overrides(env) or [runtime.source]
    return (f"{' and '.join(overrides)} makes the hook use {runtime.soname} while torch at {runtime.torch.dir} "
            f"links {split}: two CUDA runtimes are mapped, and the calls the hook forwards land in another "
            f"runtime than torch's own CUDA calls, so torch_memory_saver does not manage torch's memory as "
            f"meant; {split_fix(env)}")


def survey(environ: "Mapping[str, str] | None" = None, *, executable: str | None = None,
           check_all: bool = False, trace: bool = True) -> Report:
    """Look at this process and decide. Never raises for a bad environment: see ``Report.failure``.

    ``check_all`` traces every candidate (for ``doctor``); otherwise tracing stops at the
    first build that loads. ``trace=False`` takes the preferred fitting build without tracing it:
    only for loading the plan in-process, where the ``dlopen`` is the loader's answer and any
    failure is followed by a traced survey.
    """
    env = dict(os.environ if environ is None else environ)
    exe = executable or sys.executable
    package_dir = locate.package_dir("torch_memory_saver")
    warnings: list[str] = []
    loader: Loader | None = None

    def fail(error: ResolveError, runtime: Runtime | None = None, verdicts: tuple[Verdict, ...] = ()) -> Report:
        report = Report(exe, package_dir, runtime, verdicts, None, error, tuple(warnings), loader)
        error.report = report
        return report

    if not exe:
        return fail(ResolveError("this interpreter does not know its own executable (sys.executable is empty)",
                                 fix="set LD_PRELOAD by hand with `tms-autopreload env`", cause=CAUSE_NO_EXECUTABLE))
    try:
        loader = Loader.for_executable(exe, env.get("LD_LIBRARY_PATH", ""), env.get("LD_PRELOAD", ""))
    except (OSError, ElfError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return fail(ResolveError(f"cannot read the interpreter {exe} ({why})", cause=CAUSE_UNREADABLE_INTERPRETER,
                                 fix="set LD_PRELOAD by hand with `tms-autopreload env` from a normal Python"))
    try:
        builds, forced = _candidates(env, package_dir, exe, loader.executable, warnings)
    except ResolveError as exc:
        return fail(exc)
    runtime_error: ResolveError | None = None
    try:
        runtime: Runtime | None = detect(env, loader, [b.major for b in builds if b.kind == "cuda" and b.major])
    except ResolveError as exc:
        runtime, runtime_error = None, exc
    verdicts, eligible = _screen(builds, runtime)
    plan: Plan | None = None
    if runtime is not None:
        try:
            plan, chosen = _choose(builds, eligible, runtime, env, loader, exe, check_all, trace, package_dir,
                                   _children(child_programs(env, loader.executable.path)))
        except ResolveError as exc:  # a planned value no exec could carry
            return fail(exc, runtime)
        except OSError as exc:
            if exc.errno == _E2BIG:
                return fail(_too_big(env), runtime)
            return fail(ResolveError(f"cannot run the interpreter {exe} to verify the plan with the loader "
                                     f"({exc.strerror or exc})", cause=CAUSE_INTERPRETER_FAILS,
                                     fix="set LD_PRELOAD by hand with `tms-autopreload env` from a working Python"),
                        runtime)
        verdicts.update(chosen)
    if check_all:
        _trace_the_rest(verdicts, env, plan, exe)
    ordered = tuple(verdicts[i] for i in range(len(builds)))
    if plan is not None:
        said = split_warning(plan.runtime, next(v.build for v in ordered if v.status == CHOSEN), env)
        return Report(exe, package_dir, runtime, ordered, _with_single_path_warning(plan, package_dir, forced),
                      None, tuple(warnings) + ((said,) if said else ()), loader)
    if runtime is None:
        return fail(runtime_error, None, ordered)  # type: ignore[arg-type]  # set exactly when detect raised
    return fail(_no_fit(runtime, ordered, eligible, forced, env.get("LD_LIBRARY_PATH", ""), package_dir), runtime,
                ordered)


def resolve(environ: "Mapping[str, str] | None" = None, *, executable: str | None = None) -> Plan:
    """The plan for this process; raises :class:`ResolveError` (with ``.report``) when none exists."""
    report = survey(environ, executable=executable)
    if report.plan is None:
        raise report.failure  # type: ignore[misc]  # set exactly when there is no plan
    return report.plan
