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
"""

import os
import sys

from . import CUDA_MAJOR_VAR
from . import PATH_VAR
from . import STATE_VAR, state_key
from . import compose_preload, locate, open_regular, same_file, split_preload
from .builds import Build, build_install_hint, find_builds, read_build
from .elf import ElfError, read_dynamic
from .ldpaths import LD_UNSAFE_CHARS, prepend_search_path, search_path_unsafe, split_search_path
from .errors import ResolveError, shown
from .ldso import Loader, Object, loaded_as
from .runtime import Runtime, detect, install_hint
from .sonames import DRIVER_SONAME, GLIBC_SONAMES
from .trace import Trace, run_trace, run_traces
from .trust import CAUSES as TRUST_CAUSES
from .trust import Trusted, refusal

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .elf import DynamicInfo

__all__ = ["Plan", "Verdict", "Report", "survey", "resolve", "CAUSE_NO_DRIVER"]

_NO_DRIVER = f"the NVIDIA driver library {DRIVER_SONAME} is not on this node"
# Verdict.cause of a build refused only because the loader cannot find the driver library.
CAUSE_NO_DRIVER = "no-driver"
# Verdict.cause of a build for which no binding of BINDINGS holds (another runtime copy, or a child that dies).
CAUSE_NO_BINDING = "no-binding"
# Linux's limit on one "NAME=value" string of an exec'd environment, NUL included (32 pages):
# execve fails with E2BIG beyond it.
MAX_ARG_STRLEN = 32 * 4096


_E2BIG = 7


def _env_string_size(name: str, value: str) -> int:
    return len(os.fsencode(f"{name}={value}")) + 1


def _too_big(env: "Mapping[str, str]") -> str:
    """The error when the kernel refuses to exec the planned environment (E2BIG), naming its largest variables."""
    largest = sorted(env, key=lambda name: -_env_string_size(name, env[name]))[:3]
    sizes = ", ".join(f"{name} ({_env_string_size(name, env[name])} bytes)" for name in largest)
    return (f"{sizes}: the environment is too large for the kernel to start any program with it (E2BIG: one "
            f"variable over {MAX_ARG_STRLEN} bytes, or all together over the exec limit). Fix: shorten or unset "
            f"those variables")


class Verdict:
    """What became of one candidate."""

    __slots__ = ("build", "status", "reason", "loads", "cause")

    def __init__(self, build: Build, status: str, reason: str, loads: bool | None = None,
                 cause: str | None = None) -> None:
        self.build = build
        self.status = status  # "chosen", "loads" (fits and loads, not chosen), "rejected", "untried"
        self.reason = reason
        self.loads = loads  # the real loader's answer; None when not traced
        self.cause = cause  # CAUSE_NO_DRIVER, a tms_autopreload.trust cause, or None: what code may act on


class Plan:
    """The environment that makes this process start with the right hook."""

    __slots__ = ("build", "ld_preload", "ld_library_path", "runtime", "warnings", "binding")

    def __init__(self, build: str, ld_preload: str, ld_library_path: str | None, runtime: Runtime,
                 warnings: tuple[str, ...] = (), binding: str = "") -> None:
        self.build = build  # real path of the chosen file
        self.ld_preload = ld_preload  # the complete new LD_PRELOAD value
        self.ld_library_path = ld_library_path  # the complete new LD_LIBRARY_PATH, None to leave it
        self.runtime = runtime
        self.warnings = warnings
        self.binding = binding  # how the hook's runtime need binds the runtime library, in words

    def changes(self) -> dict[str, str]:
        """Variables to set, and their values."""
        env = {"LD_PRELOAD": self.ld_preload}
        if self.ld_library_path is not None:
            env["LD_LIBRARY_PATH"] = self.ld_library_path
        return env

    def environment(self) -> dict[str, str]:
        """What a process applying the plan sets: :meth:`changes`, and the state that lets its flagged
        children skip resolving (what it was resolved for: this prefix, the overrides, the build)."""
        return {**self.changes(), STATE_VAR: state_key(self.build)}


class Report:
    """Everything the survey saw; ``plan`` is None exactly when ``error`` is set."""

    __slots__ = ("executable", "package_dir", "runtime", "verdicts", "plan", "error", "warnings")

    def __init__(self, executable: str, package_dir: str | None, runtime: Runtime | None,
                 verdicts: tuple[Verdict, ...], plan: Plan | None, error: str | None,
                 warnings: tuple[str, ...] = ()) -> None:
        self.executable = executable
        self.package_dir = package_dir
        self.runtime = runtime
        self.verdicts = verdicts
        self.plan = plan
        self.error = error
        self.warnings = warnings

    def to_dict(self) -> "dict[str, Any]":
        """The ``doctor --json`` document (keys are listed in the README)."""
        rt = self.runtime
        return {
            "ok": self.plan is not None,
            "executable": self.executable,
            "torch_memory_saver_dir": self.package_dir,
            "runtime": None if rt is None else {
                "kind": rt.kind, "major": rt.major, "source": rt.source, "library": rt.library,
                "library_rule": rt.library_rule, "library_why": rt.library_why, "torch_dir": rt.torch.dir if rt.torch else None,
                "torch_version": rt.torch.version if rt.torch else None,
            },
            "candidates": [{
                "path": v.build.path, "target": v.build.target(), "kind": v.build.kind,
                "major": v.build.major, "needs": list(v.build.needs), "loads": v.loads,
                "status": v.status, "reason": v.reason, "cause": v.cause,
            } for v in self.verdicts],
            "plan": None if self.plan is None else {
                "build": self.plan.build, "env": self.plan.changes(), "binding": self.plan.binding,
            },
            "warnings": list(self.warnings + (self.plan.warnings if self.plan else ())),
            "error": self.error,
        }


def _fits(build: Build, runtime: Runtime) -> bool:
    if runtime.kind == "hip":
        return build.kind == "hip" and build.major == runtime.major
    return (build.kind == "cuda" and build.major == runtime.major) or build.kind == "driver"


def _preference(build: Build, runtime: Runtime, index: int) -> tuple[int, int, int]:
    """Exact runtime builds before driver-only ones; a ``_cuN`` name matching the major first."""
    suffix = f"_cu{runtime.major}."
    return (0 if build.kind == runtime.kind else 1, 0 if suffix in build.name else 1, index)


def _preload_entry(path: str) -> tuple[str, str | None]:
    """(LD_PRELOAD entry, directory to add to LD_LIBRARY_PATH) for ``path``.

    ld.so splits LD_PRELOAD on spaces and colons with no escaping. A path with such a
    character in its directory still works as a bare file name found through
    LD_LIBRARY_PATH (which splits only on ':' and ';'); other cases cannot be expressed.
    """
    if not LD_UNSAFE_CHARS & set(path):
        return path, None
    directory, name = os.path.split(path)
    if LD_UNSAFE_CHARS & set(name):
        raise ValueError("its file name contains a space, tab, colon or semicolon, which LD_PRELOAD "
                         "cannot hold; rename it or link it from a path without one")
    if search_path_unsafe(directory):
        raise ValueError("its directory contains ':' or ';', which neither LD_PRELOAD nor "
                         "LD_LIBRARY_PATH can hold; link it from a path without one")
    return name, directory


def _tms_reads_one_path(package_dir: str | None) -> bool:
    """True when torch_memory_saver's Python side needs LD_PRELOAD to be exactly one path.

    0.0.8 (``_BinaryInfo.compute``) and 0.0.9/0.0.9.post1 (``HookUtilModePreload``) pass the
    whole value to ``ctypes.CDLL``; 0.0.10 splits it on ':'. Read from its code, not a version.
    """
    if package_dir is None:
        return False
    try:
        with os.fdopen(open_regular(os.path.join(package_dir, "hooks", "mode_preload.py")), "rb") as f:
            return b'.split(":")' not in f.read(1 << 20)
    except OSError:
        return True


class Attempt:
    """What became of planning (and tracing) one build: a plan, or the reason there is none."""

    __slots__ = ("plan", "reason", "loads", "fix", "cause")

    def __init__(self, reason: str, plan: "Plan | None" = None, loads: bool | None = None,
                 fix: str | None = None, cause: str | None = None) -> None:
        self.plan = plan
        self.reason = reason
        self.loads = loads  # the real loader's answer; None when not traced
        self.fix = fix  # what the user can do, for the error when no build fits
        self.cause = cause  # a cause other code acts on (CAUSE_NO_DRIVER), as data rather than wording


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
    """One binding of :data:`BINDINGS` for one build: its environment, or why it cannot be written."""

    __slots__ = ("binding", "ld_preload", "ld_library_path", "refused")

    def __init__(self, binding: str, ld_preload: str = "", ld_library_path: str = "",
                 refused: "str | None" = None) -> None:
        self.binding = binding
        self.ld_preload = ld_preload
        self.ld_library_path = ld_library_path
        self.refused = refused


def _options(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, package_dir: str | None,
             entry: str, entry_dir: str | None) -> "list[Option]":
    """Every binding of :data:`BINDINGS` for ``build`` (the refused ones with their reason), in order."""
    current = env.get("LD_PRELOAD", "")
    llp = env.get("LD_LIBRARY_PATH", "")
    with_entry = prepend_search_path(llp, entry_dir) if entry_dir is not None else llp
    options = [Option(AS_FOUND, compose_preload(current, entry), with_entry)]
    library = runtime.library
    if library is None or build.kind == "driver" or build.info is None:
        return options
    bind_dir = os.path.dirname(library)
    own = [d for d in loader.library_dirs() if same_file(d, bind_dir)]
    if search_path_unsafe(bind_dir):
        options.append(Option(SEARCH_PATH, refused=f"{bind_dir} has ':' or ';', which LD_LIBRARY_PATH cannot hold"))
    elif own:
        options.append(Option(SEARCH_PATH, refused=(
            f"{bind_dir} is the interpreter's own library directory (its DT_RPATH {own[0]}), which holds far more "
            f"than the runtime: first on every child's LD_LIBRARY_PATH it would replace their own libraries")))
    else:
        bound = prepend_search_path(llp, bind_dir)
        options.append(Option(SEARCH_PATH, compose_preload(current, entry),
                              prepend_search_path(bound, entry_dir) if entry_dir is not None else bound))
    if LD_UNSAFE_CHARS & set(library):
        refused = f"{library} has a space, tab, colon or semicolon, which LD_PRELOAD cannot hold"
    elif "torch_memory_saver" in library:
        refused = f"{library} names torch_memory_saver, whose check wants exactly one LD_PRELOAD entry that does"
    elif _tms_reads_one_path(package_dir):
        refused = (f"torch_memory_saver at {package_dir} reads LD_PRELOAD as a single path (0.0.9.post1 and "
                   f"older), so its check refuses a second entry")
    else:
        refused = None
    options.append(Option(BY_PATH, refused=refused) if refused else
                   Option(BY_PATH, compose_preload(f"{library}:{current}" if current else library, entry), with_entry))
    return options


def _predict(build: Build, runtime: Runtime, option: Option, loader: Loader, env: "Mapping[str, str]",
             children: "list[tuple[str, DynamicInfo]]") -> "str | None":
    """Why the loader model says ``option`` would not map exactly ``runtime.library`` for the hook in this
    interpreter, or would leave a child without the runtime; None when it holds."""
    if runtime.library is None or build.kind == "driver" or build.info is None:
        return None
    hook = Object(build.path, build.info)
    soname = runtime.soname
    found = Loader(loader.executable, option.ld_library_path, loader.cache, option.ld_preload).find(soname, hook)
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
                 closure: "Callable[[], set[str]]") -> bool:
    """True when a child poses the loader another problem than the interpreter did in its trace, so that
    trace is not the child's answer. ``added``: directories the plan puts on LD_LIBRARY_PATH; ``closure``:
    the names the hook and the objects it brought in need, as the interpreter's trace resolved them.

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
        if own and not own.isdisjoint(closure()):
            return True
    return False


def _closure(build: Build, trace: Trace) -> "set[str]":
    """The names the hook needs and, transitively, the objects it brought in need, where the trace resolved
    them (glibc's own libraries are not read: they need only each other)."""
    names: set[str] = set()
    todo = list(build.info.needed if build.info else ())
    while todo:
        name = todo.pop()
        if name in names:
            continue
        names.add(name)
        path = trace.resolved.get(name) if name not in GLIBC_SONAMES else None
        if path:
            try:
                todo += read_dynamic(path).needed
            except (OSError, ElfError):
                continue
    return names


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
    words = _binding_words(option, runtime) + (f" (not {'; not '.join(passed)})" if passed else "")
    plan = Plan(os.path.realpath(build.path), option.ld_preload,
                llp if llp != env.get("LD_LIBRARY_PATH", "") else None, runtime, binding=words)
    for name, value in plan.changes().items():
        if value != env.get(name) and _env_string_size(name, value) > MAX_ARG_STRLEN:
            raise ResolveError(
                f"{name} would be {_env_string_size(name, value)} bytes with the hook's entries "
                f"({len(env.get(name, ''))} now), over the kernel's limit of {MAX_ARG_STRLEN} bytes for one "
                f"environment string (MAX_ARG_STRLEN): no program could be started with it. Fix: shorten "
                f"{name} (drop entries this process does not need) and start again")
    return plan


def _binding_words(option: Option, runtime: Runtime) -> str:
    if runtime.library is None:
        return ""
    if option.binding == AS_FOUND:
        return f"{AS_FOUND}: the loader finds {runtime.library} for the hook and every child"
    if option.binding == SEARCH_PATH:
        return f"{SEARCH_PATH}: {os.path.dirname(runtime.library)} first on LD_LIBRARY_PATH"
    return f"{BY_PATH}: {runtime.library} preloaded by path after the hook"


def _judge(build: Build, plan: Plan, trace: Trace) -> Attempt:
    """Step 5: the real loader's answer for ``plan``: accepted only when everything resolves, the build
    is preloaded, and its runtime binds to the library this process uses."""
    runtime = plan.runtime
    # The loader skips a preload entry it cannot load and goes on: for the user's other entries that
    # is theirs, not this build's; for this build it is the reason.
    skipped = trace.skip_of(build.name)
    errors = list(trace.errors) + ([f"the loader skipped it as a preload: {skipped}"] if skipped else [])
    if trace.missing or errors or trace.status:
        reason = "; ".join([f"{n} => not found" for n in trace.missing] + errors) or trace.reason()
        if DRIVER_SONAME in trace.missing:
            return Attempt(f"{_NO_DRIVER} (no driver installed, not mounted into this container, or hidden by "
                           f"LD_LIBRARY_PATH); loader: {reason}", loads=False, cause=CAUSE_NO_DRIVER,
                           fix="install the NVIDIA driver (or expose it to the container), or do not set the "
                               "flag on nodes without a GPU")
        fix = install_hint(runtime.kind, runtime.major) if runtime.soname in trace.missing else None
        return Attempt(reason, loads=False, fix=fix)
    # A bare-name preload entry shows as "name => path", a path entry as "path".
    if not any(same_file(p, build.path) for p in (*trace.loaded, *trace.resolved.values())
               if os.path.basename(p) == build.name):
        return Attempt("the loader did not preload it (no error given)", loads=False)
    if build.kind == "driver":
        return Attempt("loads", plan, loads=True)
    # Listed as "soname => path" when found by a search; as a bare path when the name matched an
    # object LD_PRELOAD had loaded (by its DT_SONAME).
    bound = trace.resolved.get(runtime.soname) or loaded_as(runtime.soname, [(p, p) for p in trace.loaded])
    if runtime.library is not None and not same_file(bound, runtime.library):
        return Attempt(f"its {runtime.soname} would bind to {bound}, not to {runtime.library} that "
                       f"this process uses: two runtime copies", loads=True)
    return Attempt(f"loads; binds {runtime.soname} to {bound}", plan, loads=True)


def _attempt(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, executable: str,
             trace_it: bool = True, package_dir: str | None = None,
             children: "list[tuple[str, DynamicInfo]] | None" = None) -> Attempt:
    """Plan one build with the first binding the loader model predicts holds, then trace the planned
    start with the real loader (the interpreter and the non-Python ``children`` at once) and judge.

    With no binding predicted to hold, the first is traced anyway, so the loader's own words say why,
    followed by each other binding's reason. ``trace_it=False`` plans without the trace, for a caller
    whose own ``dlopen`` of the plan is the real loader's answer (:mod:`tms_autopreload.inprocess`);
    ``loads`` is then None.
    """
    try:
        entry, entry_dir = _preload_entry(build.path)
    except ValueError as exc:
        return Attempt(str(exc), fix="install torch_memory_saver under a path without spaces or colons")
    kids = children or []
    options = _options(build, runtime, env, loader, package_dir, entry, entry_dir)
    why_not: list[str] = []
    chosen = None
    for option in options:
        why = option.refused or _predict(build, runtime, option, loader, env, kids)
        if why is None:
            chosen = option
            break
        why_not.append(f"{option.binding}: {why}")
    planned = _plan_of(build, runtime, env, chosen or options[0], why_not if chosen else [])
    if not trace_it:
        if chosen is None:
            return Attempt("; ".join(why_not), loads=None, fix=_no_binding_fix(options, runtime), cause=CAUSE_NO_BINDING)
        return Attempt("chosen without a loader trace: to be loaded in-process", planned)
    planned_env = {**env, **planned.changes()}
    trace = run_trace(executable, planned_env)
    judged = _judge(build, planned, trace)
    if judged.plan is not None:
        added, memo = _added_dirs(env, planned.ld_library_path or ""), []

        def closure() -> "set[str]":
            if not memo:
                memo.append(_closure(build, trace))
            return memo[0]

        traced = [kid[0] for kid in kids if _own_problem(loader, kid, added, closure)]
        child_reason = _judge_children(build, list(zip(traced, run_traces(traced, planned_env)))) if traced else None
        if child_reason is not None:
            judged = Attempt(child_reason, loads=False)
    if judged.plan is not None or chosen is not None:
        return judged
    # Nothing was predicted to hold: the loader's words for the plain plan, then why each other binding cannot.
    reasons = [judged.reason, *why_not[1:]]
    return Attempt("; ".join(reasons), loads=judged.loads, fix=judged.fix or _no_binding_fix(options, runtime),
                   cause=judged.cause or CAUSE_NO_BINDING)


def _no_binding_fix(options: "list[Option]", runtime: Runtime) -> "str | None":
    """What would let a binding hold: the torch_memory_saver whose check accepts the runtime preloaded by path."""
    by_path = next((o for o in options if o.binding == BY_PATH), None)
    if by_path is not None and by_path.refused and "names torch_memory_saver" in by_path.refused:
        return (f"reinstall the CUDA runtime (or the environment) under a path without 'torch_memory_saver' in it: "
                f"torch_memory_saver's check counts every LD_PRELOAD entry whose name holds those words, and the "
                f"plan that binds the one runtime copy here preloads {runtime.library}")
    if by_path is not None and by_path.refused and "single path" in by_path.refused:
        return (f"pip install 'torch-memory-saver>=0.0.10' (its preload check accepts LD_PRELOAD=<hook>:"
                f"{runtime.library}, the plan that binds the one runtime copy here)")
    return None


def _code_writers(exe: str, package_dir: str | None) -> Trusted:
    """Who can already change the code this process runs (:mod:`tms_autopreload.trust`): its prefixes,
    its real interpreter's directory, and the site directory that holds torch_memory_saver (and so
    the builds found next to it)."""
    return Trusted((sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(exe)),
                    os.path.dirname(package_dir) if package_dir else None))


def _candidates(env: "Mapping[str, str]", package_dir: str | None, exe: str, want: "DynamicInfo",
                warnings: list[str]) -> "tuple[list[Build], str | None, str | None]":
    """Step 1: (the builds to consider, or an error; the path TMS_AUTOPRELOAD_PATH forces, if any)."""
    trusted = _code_writers(exe, package_dir)
    forced = env.get(PATH_VAR, "").strip() or None
    if forced:
        what = ("is not an absolute path" if not os.path.isabs(forced) else
                "does not exist" if not os.path.exists(forced) else
                "is not a regular file" if not os.path.isfile(forced) else None)
        if what:
            return [], f"{PATH_VAR}={shown(forced)} {what}; point it at a preload build or unset it", forced
        build = read_build(forced, want)
        if build.problem:
            return [], (f"{PATH_VAR}={shown(forced)} does not name a torch_memory_saver preload build for this "
                        f"interpreter: {build.problem}. Fix: point {PATH_VAR} at one (`tms-autopreload doctor` "
                        f"lists the installed builds) or unset it"), forced
        unsafe = refusal(forced, trusted)
        if unsafe:
            warnings.append(f"{PATH_VAR} names a file others can change ({unsafe.message}); preloading it anyway")
        return [build], None, forced
    if package_dir is None:
        return [], (f"torch_memory_saver is not installed for {exe}: pip install torch-memory-saver "
                    f"(or set {PATH_VAR}=/abs/path/to/build.so)"), None
    builds = find_builds(package_dir, want, trusted)
    if not builds:
        return [], (f"torch_memory_saver at {package_dir} ships no preload build (looked for "
                    f"torch_memory_saver_hook_mode_preload*.so and torch_memory_saver_cpp*.so there and "
                    f"in {os.path.dirname(package_dir)}): reinstall torch-memory-saver"), None
    return builds, None, None


def _screen(builds: list[Build], runtime: Runtime | None) -> "tuple[dict[int, Verdict], list[int]]":
    """Step 3: verdicts for builds that cannot fit or may not be preloaded (who can write them, judged
    only for builds that fit, so that the error names that cause), and the indexes of the rest, best first."""
    verdicts: dict[int, Verdict] = {}
    eligible: list[tuple[tuple[int, int, int], int]] = []
    for i, b in enumerate(builds):
        if b.problem:
            verdicts[i] = Verdict(b, "rejected", b.problem)
        elif runtime is None:
            verdicts[i] = Verdict(b, "untried", "no runtime could be decided")
        elif not _fits(b, runtime):
            verdicts[i] = Verdict(b, "rejected", f"built for {b.target()}, not for this process's {runtime.name}")
        elif b.refusal:
            verdicts[i] = Verdict(b, "rejected", f"{b.refusal.message}; refusing to preload it (name it in "
                                  f"{PATH_VAR} to override)", cause=b.refusal.cause)
        else:
            eligible.append((_preference(b, runtime, i), i))
    return verdicts, [i for _, i in sorted(eligible)]


def _choose(builds: list[Build], eligible: list[int], runtime: Runtime, env: "Mapping[str, str]", loader: Loader,
            exe: str, check_all: bool, trace: bool, package_dir: str | None,
            children: "list[tuple[str, DynamicInfo]]") -> "tuple[Plan | None, dict[int, Verdict], list[str]]":
    """Steps 4-5: plan and trace the eligible builds in order; (the first that loads cleanly, their
    verdicts, the fixes the refused ones suggest).

    Raises OSError when the interpreter itself cannot be started for the trace, and ResolveError when
    a planned LD_PRELOAD or LD_LIBRARY_PATH would be too long for any exec.
    """
    plan: Plan | None = None
    verdicts: dict[int, Verdict] = {}
    fixes: list[str] = []
    for i in eligible:
        b = builds[i]
        if plan is not None and not check_all:
            verdicts[i] = Verdict(b, "untried", "a preferred build was chosen first")
            continue
        attempt = _attempt(b, runtime, env, loader, exe, trace, package_dir, children)
        if attempt.plan is None:
            verdicts[i] = Verdict(b, "rejected", attempt.reason, attempt.loads, attempt.cause)
            if attempt.fix:
                fixes.append(attempt.fix)
        elif plan is None:
            plan = attempt.plan
            verdicts[i] = Verdict(b, "chosen", attempt.reason, attempt.loads)
        else:
            verdicts[i] = Verdict(b, "loads", f"{attempt.reason}; not chosen (less preferred)", True)
    return plan, verdicts, fixes


def _trace_the_rest(verdicts: dict[int, Verdict], env: "Mapping[str, str]", plan: Plan | None,
                    exe: str) -> dict[int, Verdict]:
    """For ``doctor``: ``verdicts`` with the loader's answer for every readable candidate not traced yet."""
    probe_env = {**env, **(plan.changes() if plan else {})}
    out = dict(verdicts)
    for i, v in verdicts.items():
        if v.loads is None and v.build.info is not None and v.build.problem is None and v.build.refusal is None:
            probe_env["LD_PRELOAD"] = compose_preload(env.get("LD_PRELOAD", ""), v.build.path)
            try:
                t = run_trace(exe, probe_env)
            except OSError:
                continue
            skipped = t.skip_of(v.build.name)
            ok = t.ok and not skipped
            why = t.reason() or f"skipped as a preload: {skipped}"
            out[i] = Verdict(v.build, v.status, v.reason if ok else f"{v.reason}; loader: {why}", ok, v.cause)
    return out


def _with_single_path_warning(plan: Plan, package_dir: str | None, forced: str | None) -> Plan:
    """The plan, warned when it keeps other LD_PRELOAD entries that torch_memory_saver's Python side refuses."""
    kept = split_preload(plan.ld_preload)[1:]
    if not kept or forced or not _tms_reads_one_path(package_dir):
        return plan
    return Plan(plan.build, plan.ld_preload, plan.ld_library_path, plan.runtime, binding=plan.binding, warnings=(
        f"LD_PRELOAD keeps {':'.join(kept)} after the hook, but torch_memory_saver at {package_dir} "
        f"reads LD_PRELOAD as a single path (0.0.9.post1 and older), so its Python side will refuse "
        f"this process; drop those entries or pip install 'torch-memory-saver>=0.0.10'",))


def _no_fit(runtime: Runtime, ordered: tuple[Verdict, ...], eligible: list[int], fixes: list[str],
            forced: str | None, ld_library_path: str) -> str:
    """The error when no build fits: the cause first (what the user set, who else can write every build
    that fits, or the driver every build that fits the runtime misses), then every candidate with its
    reason, then the fix."""
    refused = [v.build for v in ordered if v.cause in TRUST_CAUSES]  # they fit; others can write them
    fixes = fixes + list(dict.fromkeys(b.refusal.fix for b in refused if b.refusal))
    torch = runtime.torch
    if runtime.source.startswith(f"{CUDA_MAJOR_VAR}=") and torch is not None and torch.cuda \
            and torch.cuda.split(".")[0] != str(runtime.major):
        # The override names another major than torch's build: that, not a missing build, is the cause.
        fixes = [f"unset {CUDA_MAJOR_VAR} (torch at {torch.dir} is built for CUDA {torch.cuda})", *fixes]
    if refused and not eligible:
        lines = [(f"{refused[0].name}, the torch_memory_saver preload build for {runtime.name}, is not preloaded: "
                  f"{refused[0].refusal.message}" if len(refused) == 1 and refused[0].refusal else
                  f"every torch_memory_saver preload build for {runtime.name} can be changed by someone who "
                  f"cannot change this environment's code, so none is preloaded") + ":"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append("Fix: " + "; or ".join(fixes) + f"; or name the build in {PATH_VAR} to preload it anyway")
        return "\n".join(lines)
    if eligible and all(ordered[i].cause == CAUSE_NO_DRIVER for i in eligible):
        where = (f"LD_LIBRARY_PATH={shown(ld_library_path)}, /etc/ld.so.cache and the default directories"
                 if ld_library_path else "/etc/ld.so.cache and the default directories")
        lines = [f"the NVIDIA driver library {DRIVER_SONAME} is not found by the loader (it searched {where}), "
                 f"so no torch_memory_saver preload build can load for {runtime.describe()}:"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append("Fix: " + "; or ".join(dict.fromkeys(fixes)))
        return "\n".join(lines)
    if eligible and all(ordered[i].cause == CAUSE_NO_BINDING for i in eligible):
        lines = [f"no plan maps exactly one {runtime.soname} (the copy torch uses) in this interpreter and lets a "
                 f"non-Python child start, for {runtime.describe()}:"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append("Fix: " + "; or ".join(dict.fromkeys(fixes)) if fixes else
                     f"Fix: see the reasons above, or set {PATH_VAR} to a build that loads")
        return "\n".join(lines)
    if forced:
        lines = [f"{PATH_VAR}={shown(forced)} names a build that does not fit {runtime.describe()}:"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append(f"Fix: point {PATH_VAR} at a build for {runtime.name}, or unset it to choose among the "
                     f"installed builds")
        return "\n".join(lines)
    lines = [f"no torch_memory_saver preload build fits {runtime.describe()}:"]
    lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
    if not eligible:
        fixes.append(build_install_hint(runtime.kind, runtime.major))
    lines.append("Fix: " + "; or ".join(dict.fromkeys(fixes)) if fixes else
                 f"Fix: see the reasons above, or set {PATH_VAR} to a build that loads")
    return "\n".join(lines)


def survey(environ: "Mapping[str, str] | None" = None, *, executable: str | None = None,
           check_all: bool = False, trace: bool = True) -> Report:
    """Look at this process and decide. Never raises for a bad environment: see ``Report.error``.

    ``check_all`` traces every candidate (for ``doctor``); otherwise tracing stops at the
    first build that loads. ``trace=False`` takes the preferred fitting build without tracing it:
    only for loading the plan in-process, where the ``dlopen`` is the loader's answer and any
    failure is followed by a traced survey.
    """
    env = dict(os.environ if environ is None else environ)
    exe = executable or sys.executable
    package_dir = locate.package_dir("torch_memory_saver")
    warnings: list[str] = []

    def fail(message: str, runtime: Runtime | None = None, verdicts: tuple[Verdict, ...] = ()) -> Report:
        return Report(exe, package_dir, runtime, verdicts, None, message, tuple(warnings))

    if not exe:
        return fail("this interpreter does not know its own executable (sys.executable is empty): "
                    "set LD_PRELOAD by hand with `tms-autopreload env`")
    try:
        loader = Loader.for_executable(exe, env.get("LD_LIBRARY_PATH", ""), env.get("LD_PRELOAD", ""))
    except (OSError, ElfError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        return fail(f"cannot read the interpreter {exe} ({why}); set LD_PRELOAD by hand with "
                    f"`tms-autopreload env` from a normal Python")
    builds, error, forced = _candidates(env, package_dir, exe, loader.executable.info, warnings)
    if error:
        return fail(error)
    try:
        runtime: Runtime | None = detect(env, loader, [b.major for b in builds if b.kind == "cuda" and b.major])
        runtime_error = None
    except ResolveError as exc:
        runtime, runtime_error = None, str(exc)
    verdicts, eligible = _screen(builds, runtime)
    plan: Plan | None = None
    fixes: list[str] = []
    if runtime is not None:
        try:
            plan, chosen, fixes = _choose(builds, eligible, runtime, env, loader, exe, check_all, trace, package_dir,
                                          _children(child_programs(env, loader.executable.path)))
            verdicts.update(chosen)
        except ResolveError as exc:  # a planned value no exec could carry
            return fail(str(exc), runtime)
        except OSError as exc:
            if exc.errno == _E2BIG:
                return fail(_too_big(env), runtime)
            return fail(f"cannot run the interpreter {exe} to verify the plan with the loader "
                        f"({exc.strerror or exc}); set LD_PRELOAD by hand with `tms-autopreload env` "
                        f"from a working Python", runtime)
    if check_all:
        verdicts = _trace_the_rest(verdicts, env, plan, exe)
    ordered = tuple(verdicts[i] for i in range(len(builds)))
    if plan is not None:
        return Report(exe, package_dir, runtime, ordered, _with_single_path_warning(plan, package_dir, forced),
                      None, tuple(warnings))
    if runtime is None:
        return fail(runtime_error or "no runtime", None, ordered)
    return fail(_no_fit(runtime, ordered, eligible, fixes, forced, env.get("LD_LIBRARY_PATH", "")),
                runtime, ordered)


def resolve(environ: "Mapping[str, str] | None" = None, *, executable: str | None = None) -> Plan:
    """The plan for this process; raises :class:`ResolveError` (with ``.report``) when none exists."""
    report = survey(environ, executable=executable)
    if report.plan is None:
        raise ResolveError(report.error or "no plan", report)
    return report.plan
