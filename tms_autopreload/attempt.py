"""What happens to one build that fits: its plan, its planned start traced by the real loader, its verdict.

What it answers is a :class:`tms_autopreload.verdict.Verdict`, with the build's
:class:`tms_autopreload.verdict.Plan` where it loads.

Its plan with the first binding the loader model predicts holds, the planned start traced with the real
loader for the interpreter and its non-Python children at once, and the verdict. One idea in four parts, in
order:

1. the non-Python children a plan is checked for (``/bin/sh``, and ``bash`` where it is another file), and
   which of them pose the loader another problem than the interpreter, so that only those are traced
   (:func:`_own_problem`, whose three answers are named: tracing a child costs a process start);
2. the one judge of a trace (:func:`refused`), for the interpreter's trace (:func:`judge`, which also wants
   the build preloaded and its runtime bound to the library this process uses), the children's
   (:func:`_children_refused`) and the builds ``doctor`` traces beyond the plan (:func:`trace_the_rest`);
3. the bindings tried in order, plain functions in a tuple (:data:`STEPS`): for one build a step writes its
   :class:`Option` (the environment, or why it cannot be written and what would let it be), which
   :func:`_binding_words` says in words; an option predicts with the loader model whether it maps exactly
   torch's runtime for the hook in this interpreter and in every child;
4. :func:`attempt`, in three phases around the interpreter's trace (a :class:`tms_autopreload.trace.Tracing`,
   reaped on every way out): the first plan (:func:`_first_plan`: for the interpreter alone where its own
   DT_RPATH does not make every child's search differ), what is read while the trace runs
   (:func:`_read_while_traced`: the children, the plan made again where a child's search differs), and
   judging the children (:func:`_judge_children`) once the interpreter's trace is judged.

Longer than the package's other modules because it is one module on purpose: the flagged start imports
it, and each module costs that start a file lookup, a read and an unmarshal (about 0.4 million instructions,
an empty module's import under callgrind; 0.2 ms on a loaded 2-core machine).
"""

import os

from .builds import Build
from .elf import ElfError, read_dynamic
from .errors import (CAUSE_CHILD_FAILS, CAUSE_DOES_NOT_LOAD, CAUSE_ENV_TOO_LARGE, CAUSE_NO_BINDING, CAUSE_NO_DRIVER,
                     CAUSE_NOT_PRELOADED, CAUSE_TWO_RUNTIMES, CAUSE_UNSAFE_PATH, ResolveError)
from .environment import (ADDED_VAR, LD_UNSAFE_CHARS, MAX_ARG_STRLEN, compose_preload, env_string_size, is_tms_entry,
                          prepend_search_path, read_added, same_file, search_path_unsafe, split_preload,
                          split_search_path)
from .ldso import Loader, Object, loaded_as
from .runtime import Runtime, install_hint
from .gpu_libraries import DRIVER_ONLY, DRIVER_SONAME, GLIBC_SONAMES
from .trace import Trace, Tracing, run_trace, run_traces
from .verdict import LOADS, REJECTED, Plan, Verdict

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping

    from .elf import DynamicInfo

__all__ = ["attempt", "child_programs", "children_of", "readable", "trace_the_rest", "judge", "refused", "STEPS",
           "Option"]

# 1. The children. The non-Python children every plan is checked for: the system's shell, and bash where it
# is another file.
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
        except ElfError:
            continue
    return out


def children_of(env: "Mapping[str, str]", exe: str) -> "Callable[[], list[tuple[str, DynamicInfo]]]":
    """The children of :func:`child_programs` as :func:`readable` reads them, found once, when first asked
    (:func:`attempt` asks while the interpreter's trace runs), then the same to every build's attempt."""
    memo: "list[list[tuple[str, DynamicInfo]]]" = []

    def children() -> "list[tuple[str, DynamicInfo]]":
        if not memo:
            memo.append(readable(child_programs(env, exe)))
        return memo[0]

    return children


def _effective_rpath(info: "DynamicInfo") -> "tuple[str, ...]":
    """The DT_RPATH the loader uses for objects a program loads: none where it has DT_RUNPATH."""
    return info.rpath if info.runpath is None else ()


def _search_differs(exe: "DynamicInfo", child: "DynamicInfo") -> bool:
    """True when the loader's search for a preloaded object's needs differs between the two programs in
    what depends on the program itself: a DT_RPATH it uses, or another ELF class or machine."""
    return bool(_effective_rpath(exe) or _effective_rpath(child)
                or (child.elf_class, child.machine) != (exe.elf_class, exe.machine))


# Does a child pose the loader another problem than the interpreter did in its trace? The three answers of
# :func:`_own_problem`:
OWN_PROBLEM = "its own problem"  # yes: the interpreter's trace is not its answer, so it is traced too
INTERPRETERS_PROBLEM = "the interpreter's problem"  # no: the interpreter's trace answers for it
ASK_AFTER_TRACE = "ask after the trace"  # only the hook's closure, which the interpreter's trace resolves, can tell


def _own_problem(loader: Loader, child: "tuple[str, DynamicInfo]", added: "list[str]",
                 closure: "set[str] | None", exists: "Callable[[str], bool]" = os.path.exists) -> str:
    """Whether a child poses the loader another problem than the interpreter did in its trace, so that trace
    is not the child's answer: :data:`OWN_PROBLEM` or :data:`INTERPRETERS_PROBLEM`, or before that trace has
    answered (``closure`` None) :data:`ASK_AFTER_TRACE` where only the closure can tell. ``added``: directories
    the plan puts on LD_LIBRARY_PATH; ``closure``: the names the hook and the objects it brought in need, as
    the interpreter's trace resolved them. ``exists``: whether a file is there (:class:`_Children` asks each
    path once, before the trace's answer and after it).

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
        return OWN_PROBLEM
    if any(exists(os.path.join(d, name)) for d in added for name in info.needed):
        return OWN_PROBLEM
    for prog in (exe, Object(*child)):
        own = {name for d in prog.runpath_dirs() for name in prog.info.needed if exists(os.path.join(d, name))}
        if own:
            if closure is None:
                return ASK_AFTER_TRACE
            if not own.isdisjoint(closure):
                return OWN_PROBLEM
    return INTERPRETERS_PROBLEM


class _Children:
    """The non-Python children as read while the interpreter's trace runs, each with what it poses the loader
    under the plan (:func:`_own_problem`): decided before the trace's answer where that can be told, and by
    the hook's closure after it where only that can, each file check made once for both."""

    __slots__ = ("loader", "kids", "added", "seen", "answers")

    def __init__(self, loader: Loader, kids: "list[tuple[str, DynamicInfo]]", added: "list[str]") -> None:
        self.loader, self.kids, self.added = loader, kids, added
        self.seen: "dict[str, bool]" = {}
        self.answers = {kid[0]: _own_problem(loader, kid, added, None, self.exists) for kid in kids}

    def exists(self, path: str) -> bool:
        """Whether a file is there, asked of the file system once per path."""
        seen = self.seen
        return seen[path] if path in seen else seen.setdefault(path, os.path.exists(path))

    def answered(self, answer: str) -> "list[str]":
        """The children whose answer is ``answer`` (one of :func:`_own_problem`'s), in order."""
        return [path for path, said in self.answers.items() if said == answer]

    def own_after_trace(self, closure: "set[str]") -> "list[str]":
        """The children that were :data:`ASK_AFTER_TRACE` and pose their own problem, given the hook's ``closure``."""
        return [kid[0] for kid in self.kids if self.answers[kid[0]] == ASK_AFTER_TRACE
                and _own_problem(self.loader, kid, self.added, closure, self.exists) == OWN_PROBLEM]


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
            except ElfError:
                continue
            todo += [(need, Object(path, info, parent)) for need in info.needed]
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
    """The directories ``ld_library_path`` holds that ``env``'s LD_LIBRARY_PATH does not: what a plan adds."""
    before = set(split_search_path(env.get("LD_LIBRARY_PATH", "")))
    return [d for d in split_search_path(ld_library_path) if d not in before]


# 2. The judge of a trace.
_NO_DRIVER = f"the NVIDIA driver library {DRIVER_SONAME} is not on this node"


def refused(build: Build, trace: Trace) -> "str | None":
    """Why the real loader would not start the traced program with ``build`` preloaded, in its words; None
    when it would."""
    skipped = trace.skip_of(build.name)
    errors = list(trace.errors) + ([f"the loader skipped it as a preload: {skipped}"] if skipped else [])
    if trace.missing or errors or trace.status:
        return "; ".join([f"{n} => not found" for n in trace.missing] + errors) or trace.reason()
    return None


def judge(build: Build, plan: Plan, trace: Trace) -> Verdict:
    """Step 5: the real loader's answer for ``plan``: accepted (LOADS, with the plan) only when everything
    resolves, the build is preloaded, and its runtime binds to the library this process uses."""
    runtime = plan.runtime
    reason = refused(build, trace)
    if reason is not None:
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
    if build.kind == DRIVER_ONLY:
        return Verdict(build, LOADS, "loads", loader_ok=True, plan=plan)
    # Listed as "soname => path" when found by a search; as a bare path when the name matched an
    # object LD_PRELOAD had loaded (by its DT_SONAME).
    bound = trace.resolved.get(runtime.soname) or loaded_as(runtime.soname, [(p, p) for p in trace.loaded])
    if runtime.library is not None and not same_file(bound, runtime.library):
        return Verdict(build, REJECTED, f"its {runtime.soname} would bind to {bound}, not to {runtime.library} "
                       f"that this process uses: two runtime copies", CAUSE_TWO_RUNTIMES, loader_ok=True)
    return Verdict(build, LOADS, f"loads; binds {runtime.soname} to {bound}", loader_ok=True, plan=plan)


def _children_refused(build: Build, traces: "list[tuple[str, Trace | OSError]]") -> "str | None":
    """Why a non-Python child would not start under the plan, in the real loader's words, or None."""
    for child, trace in traces:
        if isinstance(trace, OSError):
            continue
        why = refused(build, trace)
        if why is not None:
            return f"a non-Python child ({child}) would not start: {why}"
    return None


def trace_the_rest(verdicts: "dict[int, Verdict]", env: "Mapping[str, str]", plan: Plan | None, exe: str) -> None:
    """For ``doctor``: give every readable candidate not traced yet the loader's answer."""
    probe_env = {**env, **(plan.changes() if plan else {})}
    for i, v in list(verdicts.items()):
        if v.loader_ok is None and v.build.info is not None and v.build.problem is None and v.build.refusal is None:
            probe_env["LD_PRELOAD"] = compose_preload(env.get("LD_PRELOAD", ""), v.build.path)
            try:
                t = run_trace(exe, probe_env)
            except OSError:
                continue
            why = refused(v.build, t)
            verdicts[i] = v.but(loader_ok=why is None, reason=v.reason if why is None else f"{v.reason}; loader: {why}")


# 3. The binding steps. Their names, as a plan's ``binding`` words and ``doctor`` say them.
AS_FOUND = "as found"  # the hook alone: the loader finds that very file for it
SEARCH_PATH = "LD_LIBRARY_PATH"  # the library's directory first on LD_LIBRARY_PATH
RUNTIME_PRELOADED = "LD_PRELOAD"  # the library itself preloaded by path, right after the hook


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


class Option:
    """One binding (a step of :data:`STEPS`) written for one build: its environment, or why it cannot be
    written (and what would let it be, when the user can do something)."""

    __slots__ = ("binding", "ld_preload", "ld_library_path", "refused", "fix")

    def __init__(self, binding: str, ld_preload: str = "", ld_library_path: str = "", refused: "str | None" = None,
                 fix: "str | None" = None) -> None:
        self.binding = binding  # the step's name: AS_FOUND, SEARCH_PATH or RUNTIME_PRELOADED
        self.ld_preload = ld_preload
        self.ld_library_path = ld_library_path
        self.refused = refused
        self.fix = fix

    def predict(self, build: Build, runtime: Runtime, loader: Loader,
                children: "list[tuple[str, DynamicInfo]]") -> "str | None":
        """Why the loader model says this would not map exactly ``runtime.library`` for the hook in this
        interpreter, or would leave a child without the runtime; None when it holds. A driver-only build needs
        no runtime: what finds one is torch's ``libtorch_global_deps.so``, which must then find that same copy
        (where torch also loads it by path, :data:`tms_autopreload.runtime.TORCH_BY_PATH`, another would be a
        second one mapped), as it does in dlopen mode, which loads that copy before torch."""
        if runtime.library is None or build.info is None:
            return None
        soname = runtime.soname
        if build.kind == DRIVER_ONLY:
            torch = runtime.torch
            if torch is None or torch.global_deps is None or soname not in torch.links:
                return None
            searcher, whose = torch.global_deps, "torch's"
        else:
            searcher, whose = Object(build.path, build.info), "its"
        found = loader.under(self.ld_library_path, self.ld_preload).find(soname, searcher)
        if found is None:
            return f"{whose} {soname} would not be found"
        if not same_file(found.path, runtime.library):
            rule = "the interpreter's DT_RPATH" if found.rule == "DT_RPATH" else found.rule
            return (f"{whose} {soname} would bind to {found.path} ({rule}), not to {runtime.library} that "
                    f"torch uses: two runtime copies")
        if build.kind == DRIVER_ONLY:
            return None  # the children load no runtime for it
        hook = Object(build.path, build.info)
        for child, info in children:
            if not _search_differs(loader.executable.info, info):
                continue  # the loader searches for the hook's needs in it as in the interpreter
            theirs = Loader(Object(child, info), self.ld_library_path, loader.cache, self.ld_preload)
            if theirs.find(soname, hook) is None:
                return f"a non-Python child ({child}) would not find its {soname}"
        return None


class Setting:
    """What every step reads to write its option for one build: the build, the runtime to bind, the
    caller's values and the hook's entry (:func:`_preload_entry`)."""

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
        """The runtime library to bind (for a driver-only build, the copy torch's own libraries must find); None
        where there is nothing to bind (no library, an unreadable build): then only the first step applies."""
        return None if self.build.info is None else self.runtime.library


def _as_found(s: Setting) -> Option:
    """The hook alone, as the loader finds its runtime."""
    return Option(AS_FOUND, compose_preload(s.current, s.entry), s.with_entry)


def _search_path(s: Setting) -> "Option | None":
    """The runtime library's directory first on LD_LIBRARY_PATH (never the interpreter's own)."""
    library = s.library
    if library is None:
        return None
    bind_dir = os.path.dirname(library)
    own = [d for d in s.loader.library_dirs() if same_file(d, bind_dir)]
    if search_path_unsafe(bind_dir):
        return Option(SEARCH_PATH, refused=f"{bind_dir} has ':' or ';', which LD_LIBRARY_PATH cannot hold")
    if own:
        return Option(SEARCH_PATH, refused=(
            f"{bind_dir} is the interpreter's own library directory (its DT_RPATH {own[0]}), which holds far "
            f"more than the runtime: first on every child's LD_LIBRARY_PATH it would replace their own libraries"))
    bound = prepend_search_path(s.llp, bind_dir)
    return Option(SEARCH_PATH, compose_preload(s.current, s.entry),
                  prepend_search_path(bound, s.entry_dir) if s.entry_dir is not None else bound)


def _runtime_preloaded(s: Setting) -> "Option | None":
    """The runtime library itself preloaded by path, right after the hook (where torch_memory_saver's check
    accepts a second entry)."""
    library = s.library
    if library is None:
        return None
    from .releases import ONE_PATH_RELEASES, reads_one_path, splitting_install

    fix = None
    if LD_UNSAFE_CHARS & set(library):
        refused = f"{library} has a space, tab, colon or semicolon, which LD_PRELOAD cannot hold"
    elif is_tms_entry(library):
        refused = f"{library} names torch_memory_saver, whose check wants exactly one LD_PRELOAD entry that does"
        fix = (f"reinstall the CUDA runtime (or the environment) under a path without 'torch_memory_saver' in "
               f"it: torch_memory_saver's check counts every LD_PRELOAD entry whose name holds those words, and "
               f"the plan that binds the one runtime copy here preloads {library}")
    elif reads_one_path(s.package_dir):
        refused = (f"torch_memory_saver at {s.package_dir} reads LD_PRELOAD as a single path "
                   f"({ONE_PATH_RELEASES}), so its check refuses a second entry")
        fix = (f"{splitting_install(s.package_dir)} (its preload check accepts LD_PRELOAD=<hook>:{library}, the "
               f"plan that binds the one runtime copy here)")
    else:
        current = s.current
        return Option(RUNTIME_PRELOADED, compose_preload(f"{library}:{current}" if current else library, s.entry),
                      s.with_entry)
    return Option(RUNTIME_PRELOADED, refused=refused, fix=fix)


# The bindings, in the order tried: each puts more into what every child inherits than the one before. A step
# writes its option for a build, or None where it does not apply (then neither does any after it).
STEPS = (_as_found, _search_path, _runtime_preloaded)


def _options(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, package_dir: str | None,
             entry: str, entry_dir: str | None) -> "Iterator[Option]":
    """The option of every step of :data:`STEPS` that applies to ``build`` (the refused ones with their
    reason), in order, each written only when asked for: the first holds in most processes."""
    setting = Setting(build, runtime, env, loader, package_dir, entry, entry_dir)
    for step in STEPS:
        option = step(setting)
        if option is None:
            return
        yield option


def _binding_words(option: Option, runtime: Runtime, build: Build) -> str:
    """How a plan with ``option`` binds the hook's runtime, in words (empty where no runtime library is known)."""
    library = runtime.library
    if library is None:
        return ""
    if runtime.soname not in build.needs and option.binding == AS_FOUND:  # 0.0.8's build: it links only the driver
        return f"{AS_FOUND}: nothing to bind, the build links no {runtime.soname} (it needs only the driver)"
    if runtime.soname not in build.needs:
        where = (f"{os.path.dirname(library)} first on LD_LIBRARY_PATH" if option.binding == SEARCH_PATH else
                 f"{library} preloaded by path after the hook")
        return (f"{option.binding}: {where}, so that torch's libraries bind the copy torch also loads by path "
                f"(the build links no {runtime.soname})")
    if option.binding == AS_FOUND:
        return f"{AS_FOUND}: the loader finds {library} for the hook and every child"
    if option.binding == SEARCH_PATH:
        return f"{SEARCH_PATH}: {os.path.dirname(library)} first on LD_LIBRARY_PATH"
    return f"{RUNTIME_PRELOADED}: {library} preloaded by path after the hook"


def _no_binding_fix(options: "list[Option]") -> "str | None":
    """What would let a binding hold, where the user can do it: the fix of a refused option."""
    return next((o.fix for o in options if o.refused and o.fix), None)


# 4. One build.
def _plan_of(build: Build, runtime: Runtime, env: "Mapping[str, str]", option: Option,
             passed: "list[str]") -> Plan:
    """The plan of one binding (``passed``: why each earlier one would not hold); raises ResolveError when
    a value would be too long for any exec."""
    llp = option.ld_library_path
    said = _binding_words(option, runtime, build) + (f" (not {'; not '.join(passed)})" if passed else "")
    plan = Plan(build.path, option.ld_preload,
                llp if llp != env.get("LD_LIBRARY_PATH", "") else None, runtime, binding=said,
                added=_added(env, option))
    for name, value in plan.changes().items():
        if value != env.get(name) and env_string_size(name, value) > MAX_ARG_STRLEN:
            raise ResolveError(
                f"{name} would be {env_string_size(name, value)} bytes with the hook's entries "
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


class _Bindings:
    """Step 4 for one build: its bindings written for the caller's ``env``, each predicted for the interpreter
    and each of ``kids`` (None: for the interpreter alone, then ``alone``). Those written (up to the chosen one,
    else all), why each before the chosen one would not hold, the first the loader model predicts holds (None:
    none does), and the plan of that one, else of the first (raises ResolveError where that one's would be too
    long for any exec)."""

    __slots__ = ("build", "runtime", "env", "loader", "package_dir", "alone", "written", "why_not", "chosen", "plan")

    def __init__(self, build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader,
                 package_dir: "str | None", kids: "list[tuple[str, DynamicInfo]] | None") -> None:
        self.build, self.runtime, self.env, self.loader, self.package_dir = build, runtime, env, loader, package_dir
        self.alone = kids is None
        entry, entry_dir = _preload_entry(build.path)
        self.written: list[Option] = []
        self.why_not: list[str] = []
        self.chosen = None
        for option in _options(build, runtime, env, loader, package_dir, entry, entry_dir):
            self.written.append(option)
            why = option.refused or option.predict(build, runtime, loader, kids or [])
            if why is None:
                self.chosen = option
                break
            self.why_not.append(f"{option.binding}: {why}")
        self.plan = _plan_of(build, runtime, env, self.chosen or self.written[0], self.why_not if self.chosen else [])

    def again(self, kids: "list[tuple[str, DynamicInfo]]") -> "_Bindings":
        """The same build's bindings, predicted for the interpreter and each of ``kids``."""
        return _Bindings(self.build, self.runtime, self.env, self.loader, self.package_dir, kids)

    def planned_env(self) -> "dict[str, str]":
        """The environment the plan starts the interpreter and its children with."""
        return {**self.env, **self.plan.changes()}


def _first_plan(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, package_dir: str | None,
                children: "Callable[[], list[tuple[str, DynamicInfo]]]", trace_it: bool) -> _Bindings:
    """The first phase: the plan the interpreter's trace starts with. A first start waits for that trace, so
    the plan is made for the interpreter alone and the children are read while it runs
    (:func:`_read_while_traced`). They are read first, and the plan made with them, where nothing is traced;
    where the interpreter's own DT_RPATH makes every child's search differ (a conda interpreter), so that they
    would change it anyway; and where the plan for the interpreter alone would be too large for any exec, which
    a binding the children rule out can make it: as if they had been read first."""
    alone = trace_it and not _effective_rpath(loader.executable.info)
    try:
        return _Bindings(build, runtime, env, loader, package_dir, None if alone else children())
    except ResolveError:
        if not alone:
            raise
    return _Bindings(build, runtime, env, loader, package_dir, children())


def _untraced(bound: _Bindings) -> Verdict:
    """The verdict without the loader's trace, for a caller whose own ``dlopen`` of the plan is the real
    loader's answer: LOADS with the chosen binding's plan, or REJECTED with why none would hold."""
    if bound.chosen is None:
        return Verdict(bound.build, REJECTED, "; ".join(bound.why_not), CAUSE_NO_BINDING,
                       fix=_no_binding_fix(bound.written))
    return Verdict(bound.build, LOADS, "chosen without a loader trace: to be loaded in-process", plan=bound.plan)


def _read_while_traced(bound: _Bindings, children: "Callable[[], list[tuple[str, DynamicInfo]]]",
                       interpreter: Tracing) -> "tuple[_Bindings, _Children]":
    """The second phase, what is read while the interpreter's trace of ``bound``'s plan runs: the children;
    the plan made again with them where it was made for the interpreter alone and a child's search differs
    (:func:`_search_differs`), and traced again where that changed it (the answer for the first plan is not
    this one's); and what each child poses the loader, as far as can be told before the trace's answer."""
    kids = children()
    if bound.alone and any(_search_differs(bound.loader.executable.info, info) for _, info in kids):
        again = bound.again(kids)
        if again.plan.changes() != bound.plan.changes():
            interpreter.restart(again.planned_env())
        bound = again
    return bound, _Children(bound.loader, kids, _added_dirs(bound.env, bound.plan.ld_library_path or ""))


def _judge_children(bound: _Bindings, trace: Trace, ahead: "dict[str, DynamicInfo]", children: _Children,
                    beside: "dict[str, Trace | OSError]") -> "str | None":
    """The third phase, judging the children, once the interpreter's ``trace`` has answered and accepts the
    plan: those traced beside it (``beside``: their answers, by path) and those only the hook's closure could
    decide, traced now where they pose their own problem. Why a child would not start under the plan, in the
    loader's words, or None. ``ahead``: what :func:`_read_ahead` read while the trace ran."""
    asked = children.answered(ASK_AFTER_TRACE)
    after = children.own_after_trace(_closure(bound.build, trace, ahead)) if asked else []
    answers = {**beside, **dict(zip(after, run_traces(after, bound.planned_env()) if after else [], strict=True))}
    traced = [(path, answers[path]) for path, _ in children.kids if path in answers]  # in the children's order
    return _children_refused(bound.build, traced) if traced else None


def _none_holds(judged: Verdict, bound: _Bindings) -> Verdict:
    """Where no binding was predicted to hold: the loader's words for the first, then why each other cannot."""
    reasons = [judged.reason, *bound.why_not[1:]]
    return Verdict(bound.build, REJECTED, "; ".join(reasons),
                   CAUSE_NO_DRIVER if judged.cause == CAUSE_NO_DRIVER else CAUSE_NO_BINDING,
                   loader_ok=judged.loader_ok, fix=judged.fix or _no_binding_fix(bound.written))


def attempt(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, executable: str,
            trace_it: bool = True, package_dir: str | None = None,
            children: "Callable[[], list[tuple[str, DynamicInfo]]]" = list) -> Verdict:
    """Plan one build with the first binding the loader model predicts holds, then trace the planned
    start with the real loader (the interpreter and the non-Python ``children()`` at once) and judge.

    With no binding predicted to hold, the first is traced anyway, so the loader's own words say why,
    followed by each other binding's reason. ``trace_it=False`` plans without the trace, for a caller
    whose own ``dlopen`` of the plan is the real loader's answer (:mod:`tms_autopreload.inprocess`);
    ``loader_ok`` is then None. The verdict is LOADS (with its plan) or REJECTED.

    Its phases: the first plan (:func:`_first_plan`); what is read while the interpreter's trace runs
    (:func:`_read_while_traced`), the children whose own problem is plain by then traced beside it and the
    objects the loader model expects the hook to bring in read ahead; and judging the children
    (:func:`_judge_children`).
    """
    cannot = _unwritable(build.path)
    if cannot is not None:
        return Verdict(build, REJECTED, cannot, CAUSE_UNSAFE_PATH,
                       fix="install torch_memory_saver under a path without spaces or colons")
    bound = _first_plan(build, runtime, env, loader, package_dir, children, trace_it)
    if not trace_it:
        return _untraced(bound)
    with Tracing([executable], bound.planned_env()) as interpreter:
        bound, kids = _read_while_traced(bound, children, interpreter)
        beside = kids.answered(OWN_PROBLEM)  # plain before the trace's answer: traced beside it, both at once
        with Tracing(beside, bound.planned_env()) as beside_traced:
            ahead = _read_ahead(build, loader, bound.plan) if kids.answered(ASK_AFTER_TRACE) else {}
            trace, = interpreter.answers()
            answers = dict(zip(beside, beside_traced.answers(), strict=True))
    if isinstance(trace, OSError):
        raise trace  # the interpreter itself cannot be started: survey's error, not this build's
    judged = judge(build, bound.plan, trace)
    why = _judge_children(bound, trace, ahead, kids, answers) if judged.plan is not None else None
    if why is not None:
        judged = Verdict(build, REJECTED, why, CAUSE_CHILD_FAILS, loader_ok=False)
    return judged if judged.plan is not None or bound.chosen is not None else _none_holds(judged, bound)
