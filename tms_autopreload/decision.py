"""Decide the preload plan for this process: which build, the exact LD_PRELOAD, and why.

:func:`survey` is the one function that decides, the choice over all builds; :func:`resolve`, the start-up
hook and every CLI command ask it. Steps:

1. find the candidate builds, or the one ``TMS_AUTOPRELOAD_PATH`` names (:func:`_candidates`);
2. detect the runtime this process will use (:mod:`tms_autopreload.runtime`);
3. keep the builds whose DT_NEEDED runtime matches it, driver-only builds matching any CUDA,
   best first (:func:`_screen`);
4. bind the hook to the runtime library torch will use, in this interpreter and in every child,
   the first of :data:`tms_autopreload.attempt.STEPS` that the loader model predicts holds;
5. trace the planned start with the real loader, for the interpreter and for a non-Python child
   (``/bin/sh``, and ``bash`` where it is another file), and accept the first build that loads
   cleanly in all of them with the runtime bound where we meant (:func:`_choose`; steps 4 and 5 are what
   happens to one build, :func:`tms_autopreload.attempt.attempt`).

Each step says what became of a candidate with a :class:`~tms_autopreload.verdict.Verdict`; a survey that
finds no plan holds the :class:`~tms_autopreload.errors.ResolveError` that :func:`resolve` raises.
"""

import os
import stat
import sys

from . import sitepath
from .environment import CUDA_MAJOR_VAR, PATH_VAR, TMS_WORDS, is_tms_entry, same_file, split_preload
from .attempt import attempt, children_of, trace_the_rest
from .builds import PRELOAD_PREFIXES, Build, find_builds, interposed, is_preload_name, named_major, read_build
from .elf import ElfError
from .errors import (CAUSE_BAD_FORCED_PATH, CAUSE_INTERPRETER_FAILS, CAUSE_LESS_PREFERRED, CAUSE_NO_BUILDS,
                     CAUSE_NO_EXECUTABLE, CAUSE_NO_PACKAGE, CAUSE_NO_RUNTIME, CAUSE_PREFERRED_CHOSEN,
                     CAUSE_UNREADABLE_INTERPRETER, CAUSE_UNUSABLE, CAUSE_WRONG_RUNTIME, PATH_SHOWN, ResolveError,
                     shown)
from .ldso import Loader, Object
from .runtime import Runtime, detect, split_from_torch
from .gpu_libraries import CUDA, DRIVER_ONLY, HIP
from .trust import Trusted, refusal
from .verdict import CHOSEN, REJECTED, UNTRIED, Plan, Verdict

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from .elf import DynamicInfo

__all__ = ["Report", "survey", "resolve", "split_overrides", "split_fix", "split_warning"]


class Report:
    """Everything the survey saw; ``plan`` is None exactly when ``failure`` is set (``doctor --json`` is
    :func:`tms_autopreload.commands.doctor.document.document`)."""

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

    @property
    def chosen(self) -> Build | None:
        """The build the plan preloads (None: no plan)."""
        return next((v.build for v in self.verdicts if v.status == CHOSEN), None)

    def __repr__(self) -> str:
        told = f"plan={self.plan!r}" if self.failure is None else f"cause={self.failure.cause!r}"
        return f"Report({told}, verdicts={list(self.verdicts)!r})"


_E2BIG = 7


def _fits(build: Build, runtime: Runtime) -> bool:
    if runtime.kind == HIP:
        return build.kind == HIP and build.major == runtime.major
    return (build.kind == CUDA and build.major == runtime.major) or build.kind == DRIVER_ONLY


def _preference(build: Build, runtime: Runtime, index: int) -> tuple[int, int, int]:
    """Exact runtime builds before driver-only ones; a ``_cuN`` name matching the major first."""
    return (0 if build.kind == runtime.kind else 1, 0 if named_major(build.name) == runtime.major else 1, index)


def _code_writers(program: Object, package_dir: str | None) -> Trusted:
    """Who can already change the code this process runs (:mod:`tms_autopreload.trust`): its prefixes,
    its real interpreter's directory (``program``: the loader's executable, symlinks resolved), and the
    site directory that holds torch_memory_saver (and so the builds found next to it)."""
    return Trusted((sys.prefix, sys.base_prefix, os.path.dirname(program.path),
                    os.path.dirname(package_dir) if package_dir else None))


def _unreachable(path: str) -> "str | None":
    """Why the file ``path`` names cannot be a build, in the kernel's words where it cannot be reached (too many
    symbolic links, a directory this account cannot search): never "does not exist" for a file that may."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be reached ({exc.strerror or exc})"
    return None if stat.S_ISREG(st.st_mode) else "is not a regular file"


def _candidates(env: "Mapping[str, str]", package_dir: str | None, torch_dir: str | None, exe: str, program: Object,
                warnings: list[str]) -> "tuple[list[Build], str | None]":
    """Step 1: (the builds to consider, the path TMS_AUTOPRELOAD_PATH forces or None); raises ResolveError
    when there are none. ``exe`` is the interpreter as named, ``program`` the loader's executable;
    ``torch_dir``: torch's directory (None: no torch), beside which a missing torch_memory_saver goes."""
    trusted = _code_writers(program, package_dir)
    want = program.info
    forced = env.get(PATH_VAR, "").strip() or None
    if forced:
        named = f"{PATH_VAR}={shown(forced, PATH_SHOWN)}"
        what = "is not an absolute path" if not os.path.isabs(forced) else _unreachable(forced)
        if what:
            raise ResolveError(f"{named} {what}", fix=f"`unset {PATH_VAR}` (or point it at a preload build)",
                               cause=CAUSE_BAD_FORCED_PATH)
        build = read_build(forced, want)
        if build.problem:
            raise ResolveError(f"{named} does not name a torch_memory_saver preload build for "
                               f"this interpreter: {build.problem}", cause=CAUSE_BAD_FORCED_PATH,
                               fix=f"`unset {PATH_VAR}` (or point it at one: `tms-autopreload doctor` lists the "
                                   f"installed builds)")
        if not is_tms_entry(forced):
            import shlex

            link = os.path.join(os.path.dirname(forced), f"{TMS_WORDS}_{os.path.basename(forced)}")
            raise ResolveError(f"{named} has no \"{TMS_WORDS}\" in its path, so torch_memory_saver's own check "
                               f"(which finds its build in LD_PRELOAD by those words) would refuse every process "
                               f"preloading it", cause=CAUSE_BAD_FORCED_PATH,
                               fix=f"name it by a link that holds them, and point {PATH_VAR} at the link: `ln -s "
                                   f"{shlex.quote(forced)} {shlex.quote(link)} && export "
                                   f"{PATH_VAR}={shlex.quote(link)}`")
        unsafe = refusal(forced, trusted)
        if unsafe:
            warnings.append(f"{PATH_VAR} names a file others can change ({unsafe.message}); preloading it anyway")
        return [build], forced
    if package_dir is None:
        from .releases import install_fix

        raise ResolveError(f"torch_memory_saver is not installed for {exe}", cause=CAUSE_NO_PACKAGE,
                           fix=f"{install_fix(torch_dir)} (or set {PATH_VAR}=/abs/path/to/build.so)")
    builds = find_builds(package_dir, want, trusted)
    if not builds:
        from .reinstall import REINSTALL, reinstall_hint

        looked = " and ".join(f"{prefix}*.so" for prefix in PRELOAD_PREFIXES)
        raise ResolveError(f"torch_memory_saver at {package_dir} ships no preload build (looked for {looked} there "
                           f"and in {os.path.dirname(package_dir)})",
                           fix=reinstall_hint(package_dir) or REINSTALL,
                           cause=CAUSE_NO_BUILDS)
    return builds, None


def _judge_forced(build: Build, runtime: Runtime, warnings: list[str]) -> None:
    """Refuse the build ``TMS_AUTOPRELOAD_PATH`` names when it defines nothing that the process's runtime
    library defines (it would intercept no call: a torch_memory_saver build of another mode, such as
    ``hook_mode_torch``, a pluggable allocator); warn where that cannot be read."""
    if build.problem or build.kind == HIP:
        return  # refused or judged elsewhere; a ROCm build's symbols are not CUDA's
    named = f"{PATH_VAR}={shown(build.path, PATH_SHOWN)}"
    if runtime.library is None:
        warnings.append(f"{named}: what it intercepts is unknown (no {runtime.soname} file to compare its symbols "
                        f"with); preloading it anyway")
        return
    try:
        symbols = interposed(build.path, runtime.library)
    except ElfError as exc:
        warnings.append(f"{named}: what it intercepts is unknown (the symbol tables of it and {runtime.library} "
                        f"cannot be read: {exc}); preloading it anyway")
        return
    if not symbols:
        raise ResolveError(f"{named} defines nothing that {runtime.library} defines, so preloading it intercepts "
                           f"no call (a torch_memory_saver build of another mode, such as hook_mode_torch, is loaded "
                           f"by torch_memory_saver itself, not preloaded)", cause=CAUSE_BAD_FORCED_PATH,
                           fix=f"`unset {PATH_VAR}` (or point it at a preload build, {PRELOAD_PREFIXES[0]}*.so: "
                               f"`tms-autopreload doctor` lists the installed builds)")


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
            children: "Callable[[], list[tuple[str, DynamicInfo]]]") -> "tuple[Plan | None, dict[int, Verdict]]":
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
        verdict = verdicts[i] = attempt(builds[i], runtime, env, loader, exe, trace, package_dir, children)
        if verdict.plan is None:
            continue
        if plan is None:
            plan, verdicts[i] = verdict.plan, verdict.but(status=CHOSEN)
        else:
            verdicts[i] = verdict.but(reason=f"{verdict.reason}; not chosen (less preferred)",
                                      cause=CAUSE_LESS_PREFERRED)
    return plan, verdicts


def _with_check_warning(plan: Plan, package_dir: str | None, forced: str | None, preload: str) -> Plan:
    """The plan, warned where torch_memory_saver's Python side would refuse what it keeps, or where it drops an
    entry of ``preload`` (the process's own LD_PRELOAD) that is not a preload build: any entry kept after
    the hook, where it reads the variable as one path; an entry whose path holds ``torch_memory_saver`` (which
    its check counts as one of its builds: :func:`tms_autopreload.environment.is_tms_entry`), which the plan drops."""
    kept = split_preload(plan.ld_preload)[1:]
    dropped = [e for e in split_preload(preload)
               if is_tms_entry(e) and not is_preload_name(os.path.basename(e)) and not same_file(e, plan.build)]
    warnings = []
    if dropped:
        warnings.append(f"LD_PRELOAD loses {':'.join(dropped)}: torch_memory_saver's check counts every entry whose "
                        f"path holds \"{TMS_WORDS}\" as one of its builds and refuses more than one, so the plan "
                        f"keeps only the hook; move that file to a path without those words to keep it preloaded")
    if kept and not forced:
        from .releases import ONE_PATH_RELEASES, reads_one_path, splitting_install  # most starts keep none

        if reads_one_path(package_dir):
            warnings.append(f"LD_PRELOAD keeps {':'.join(kept)} after the hook, but torch_memory_saver at "
                            f"{package_dir} reads LD_PRELOAD as a single path ({ONE_PATH_RELEASES}), so its Python "
                            f"side will refuse this process; drop those entries or {splitting_install(package_dir)}")
    if not warnings:
        return plan
    return Plan(plan.build, plan.ld_preload, plan.ld_library_path, plan.runtime, binding=plan.binding,
                added=plan.added, warnings=tuple(warnings))


def split_overrides(env: "Mapping[str, str]") -> "list[str]":
    """The override variables set in ``env`` (``NAME=value``), which can make the hook use another runtime
    than torch (:func:`tms_autopreload.runtime.split_from_torch`)."""
    return [f"{name}={shown(env[name], PATH_SHOWN) if name == PATH_VAR else shown(env[name])}"
            for name in (CUDA_MAJOR_VAR, PATH_VAR) if env.get(name, "").strip()]


def split_fix(env: "Mapping[str, str]") -> str:
    """The fix where an override splits the hook from torch: unset the overrides ``env`` sets."""
    names = [o.partition("=")[0] for o in split_overrides(env)] or [CUDA_MAJOR_VAR]
    return f"`unset {' '.join(names)}` to use torch's runtime"


def split_warning(runtime: Runtime, build: Build, env: "Mapping[str, str]") -> "str | None":
    """The plan's warning when an override makes the hook (``build``) use another runtime than torch links,
    else None (a driver-only build uses no runtime). Never a fix: what it asks for is what splits them."""
    split = split_from_torch(runtime)
    if split is None or runtime.torch is None or build.kind == DRIVER_ONLY:
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
    package_dir = sitepath.package_dir("torch_memory_saver")
    # Found once, here: the runtime is torch's (step 2), and a missing torch_memory_saver is installed beside it.
    torch_dir = sitepath.package_dir("torch")
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
    except ElfError as exc:
        return fail(ResolveError(f"cannot read the interpreter {exe} ({exc})", cause=CAUSE_UNREADABLE_INTERPRETER,
                                 fix="set LD_PRELOAD by hand with `tms-autopreload env` from a normal Python"))
    try:
        builds, forced = _candidates(env, package_dir, torch_dir, exe, loader.executable, warnings)
    except ResolveError as exc:
        return fail(exc)
    runtime_error: ResolveError | None = None
    try:
        majors = [b.major for b in builds if b.kind == CUDA and b.major]
        runtime: Runtime | None = detect(env, loader, torch_dir, majors)
    except ResolveError as exc:
        runtime, runtime_error = None, exc
    if forced and runtime is not None:
        try:
            _judge_forced(builds[0], runtime, warnings)
        except ResolveError as exc:
            return fail(exc, runtime)
    verdicts, eligible = _screen(builds, runtime)
    plan: Plan | None = None
    if runtime is not None:
        try:
            plan, chosen = _choose(builds, eligible, runtime, env, loader, exe, check_all, trace, package_dir,
                                   children_of(env, loader.executable.path))
        except ResolveError as exc:  # a planned value no exec could carry
            return fail(exc, runtime)
        except OSError as exc:
            if exc.errno == _E2BIG:
                from .no_plan import too_big

                return fail(too_big(env), runtime)
            return fail(ResolveError(f"cannot run the interpreter {exe} to verify the plan with the loader "
                                     f"({exc.strerror or exc})", cause=CAUSE_INTERPRETER_FAILS,
                                     fix="set LD_PRELOAD by hand with `tms-autopreload env` from a working Python"),
                        runtime)
        verdicts.update(chosen)
    if check_all:
        trace_the_rest(verdicts, env, plan, exe)
    ordered = tuple(verdicts[i] for i in range(len(builds)))
    if plan is not None:
        said = split_warning(plan.runtime, next(v.build for v in ordered if v.status == CHOSEN), env)
        return Report(exe, package_dir, runtime, ordered,
                      _with_check_warning(plan, package_dir, forced, env.get("LD_PRELOAD", "")),
                      None, tuple(warnings) + ((said,) if said else ()), loader)
    if runtime is None:
        return fail(runtime_error, None, ordered)  # type: ignore[arg-type]  # set exactly when detect raised
    from .no_plan import no_fit  # only a start that finds no plan reads its words

    return fail(no_fit(runtime, ordered, eligible, forced, env.get("LD_LIBRARY_PATH", ""), package_dir), runtime,
                ordered)


def resolve(environ: "Mapping[str, str] | None" = None, *, executable: str | None = None) -> Plan:
    """The plan for this process; raises :class:`ResolveError` (with ``.report``) when none exists."""
    report = survey(environ, executable=executable)
    if report.plan is None:
        raise report.failure  # type: ignore[misc]  # set exactly when there is no plan
    return report.plan
