"""Decide the preload plan for this process: which build, the exact LD_PRELOAD, and why.

:func:`survey` is the one function that decides; :func:`resolve`, the start-up hook and every
CLI command ask it. Steps:

1. find the candidate builds, or the one ``TMS_AUTOPRELOAD_PATH`` names (:func:`_candidates`);
2. detect the runtime this process will use (:mod:`tms_autopreload.runtime`);
3. keep the builds whose DT_NEEDED runtime matches it, driver-only builds matching any CUDA,
   best first (:func:`_screen`);
4. bind the hook to the runtime library torch will use: when the loader would find another
   copy for the hook, put that library's directory first on LD_LIBRARY_PATH, so one copy maps;
5. trace the planned start with the real loader, and accept the first build it loads cleanly
   with the runtime bound where we meant (:func:`_choose`, :func:`_attempt`).
"""

import os
import sys

from . import PATH_VAR as FORCE_VAR
from . import STATE_VAR, state_key
from . import compose_preload, locate, open_regular, same_file, split_preload
from .builds import Build, build_install_hint, find_builds, read_build, writable_by_others
from .elf import ElfError
from .environ import LD_UNSAFE_CHARS, prepend_search_path, search_path_unsafe
from .errors import ResolveError, shown
from .ldso import Loader, Object, loaded_as
from .runtime import Runtime, detect, install_hint
from .sonames import DRIVER_SONAME
from .trace import Trace, run_trace

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

    from .elf import DynamicInfo

__all__ = ["Plan", "Verdict", "Report", "survey", "resolve", "CAUSE_NO_DRIVER"]

_NO_DRIVER = f"the NVIDIA driver library {DRIVER_SONAME} is not on this node"
# Verdict.cause of a build refused only because the loader cannot find the driver library.
CAUSE_NO_DRIVER = "no-driver"
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
        self.cause = cause  # CAUSE_NO_DRIVER, or None: what code may act on, never the wording


class Plan:
    """The environment that makes this process start with the right hook."""

    __slots__ = ("build", "ld_preload", "ld_library_path", "runtime", "warnings")

    def __init__(self, build: str, ld_preload: str, ld_library_path: str | None, runtime: Runtime,
                 warnings: tuple[str, ...] = ()) -> None:
        self.build = build  # real path of the chosen file
        self.ld_preload = ld_preload  # the complete new LD_PRELOAD value
        self.ld_library_path = ld_library_path  # the complete new LD_LIBRARY_PATH, None to leave it
        self.runtime = runtime
        self.warnings = warnings

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
                "library_rule": rt.library_rule, "torch_dir": rt.torch.dir if rt.torch else None,
                "torch_version": rt.torch.version if rt.torch else None,
            },
            "candidates": [{
                "path": v.build.path, "target": v.build.target(), "kind": v.build.kind,
                "major": v.build.major, "needs": list(v.build.needs), "loads": v.loads,
                "status": v.status, "reason": v.reason,
            } for v in self.verdicts],
            "plan": None if self.plan is None else {
                "build": self.plan.build, "env": self.plan.changes(),
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


def _plan_for(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader) -> "Plan | Attempt":
    """Step 4: the plan that preloads ``build`` with its runtime bound to the library this process uses,
    or the refused :class:`Attempt` when no environment can express it.

    Raises ResolveError when a planned LD_PRELOAD or LD_LIBRARY_PATH would be too long for any exec.
    """
    try:
        entry, entry_dir = _preload_entry(build.path)
    except ValueError as exc:
        return Attempt(str(exc), fix="install torch_memory_saver under a path without spaces or colons")
    current_llp = env.get("LD_LIBRARY_PATH", "")
    llp = current_llp
    if runtime.library is not None and build.kind in ("cuda", "hip") and build.info is not None:
        predicted = loader.find(runtime.soname, Object(build.path, build.info))
        if predicted is None or not same_file(predicted.path, runtime.library):
            bind_dir = os.path.dirname(runtime.library)
            if search_path_unsafe(bind_dir):
                return Attempt(f"{runtime.soname} is in {bind_dir}, whose ':' or ';' LD_LIBRARY_PATH cannot hold")
            llp = prepend_search_path(llp, bind_dir)
    if entry_dir is not None:
        llp = prepend_search_path(llp, entry_dir)
    plan = Plan(os.path.realpath(build.path), compose_preload(env.get("LD_PRELOAD", ""), entry),
                llp if llp != current_llp else None, runtime)
    for name, value in plan.changes().items():
        if value != env.get(name) and _env_string_size(name, value) > MAX_ARG_STRLEN:
            raise ResolveError(
                f"{name} would be {_env_string_size(name, value)} bytes with the hook's entries "
                f"({len(env.get(name, ''))} now), over the kernel's limit of {MAX_ARG_STRLEN} bytes for one "
                f"environment string (MAX_ARG_STRLEN): no program could be started with it. Fix: shorten "
                f"{name} (drop entries this process does not need) and start again")
    return plan


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
             trace_it: bool = True) -> Attempt:
    """Plan one build, then trace the planned start with the real loader and judge its answer.

    ``trace_it=False`` plans without the trace, for a caller whose own ``dlopen`` of the plan is
    the real loader's answer (:mod:`tms_autopreload.inprocess`); ``loads`` is then None.
    """
    planned = _plan_for(build, runtime, env, loader)
    if isinstance(planned, Attempt):
        return planned
    if not trace_it:
        return Attempt("chosen without a loader trace: to be loaded in-process", planned)
    return _judge(build, planned, run_trace(executable, {**env, **planned.changes()}))


def _candidates(env: "Mapping[str, str]", package_dir: str | None, exe: str, want: "DynamicInfo",
                warnings: list[str]) -> "tuple[list[Build], str | None, str | None]":
    """Step 1: (the builds to consider, or an error; the path TMS_AUTOPRELOAD_PATH forces, if any)."""
    forced = env.get(FORCE_VAR, "").strip() or None
    if forced:
        what = ("is not an absolute path" if not os.path.isabs(forced) else
                "does not exist" if not os.path.exists(forced) else
                "is not a regular file" if not os.path.isfile(forced) else None)
        if what:
            return [], f"{FORCE_VAR}={shown(forced)} {what}; point it at a preload build or unset it", forced
        build = read_build(forced, want, explicit=True)
        if build.problem:
            return [], (f"{FORCE_VAR}={shown(forced)} does not name a torch_memory_saver preload build for this "
                        f"interpreter: {build.problem}. Fix: point {FORCE_VAR} at one (`tms-autopreload doctor` "
                        f"lists the installed builds) or unset it"), forced
        unsafe = writable_by_others(forced)
        if unsafe:
            warnings.append(f"{FORCE_VAR} names a file others can change ({unsafe}); preloading it anyway")
        return [build], None, forced
    if package_dir is None:
        return [], (f"torch_memory_saver is not installed for {exe}: pip install torch-memory-saver "
                    f"(or set {FORCE_VAR}=/abs/path/to/build.so)"), None
    builds = find_builds(package_dir, want)
    if not builds:
        return [], (f"torch_memory_saver at {package_dir} ships no preload build (looked for "
                    f"torch_memory_saver_hook_mode_preload*.so and torch_memory_saver_cpp*.so there and "
                    f"in {os.path.dirname(package_dir)}): reinstall torch-memory-saver"), None
    return builds, None, None


def _screen(builds: list[Build], runtime: Runtime | None) -> "tuple[dict[int, Verdict], list[int]]":
    """Step 3: verdicts for builds that cannot fit, and the indexes of those that may, best first."""
    verdicts: dict[int, Verdict] = {}
    eligible: list[tuple[tuple[int, int, int], int]] = []
    for i, b in enumerate(builds):
        if b.problem:
            verdicts[i] = Verdict(b, "rejected", b.problem)
        elif runtime is None:
            verdicts[i] = Verdict(b, "untried", "no runtime could be decided")
        elif _fits(b, runtime):
            eligible.append((_preference(b, runtime, i), i))
        else:
            verdicts[i] = Verdict(b, "rejected", f"built for {b.target()}, not for this process's {runtime.name}")
    return verdicts, [i for _, i in sorted(eligible)]


def _choose(builds: list[Build], eligible: list[int], runtime: Runtime, env: "Mapping[str, str]", loader: Loader,
            exe: str, check_all: bool, trace: bool) -> "tuple[Plan | None, dict[int, Verdict], list[str]]":
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
        attempt = _attempt(b, runtime, env, loader, exe, trace)
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
        if v.loads is None and v.build.info is not None and v.build.problem is None:
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
    return Plan(plan.build, plan.ld_preload, plan.ld_library_path, plan.runtime, (
        f"LD_PRELOAD keeps {':'.join(kept)} after the hook, but torch_memory_saver at {package_dir} "
        f"reads LD_PRELOAD as a single path (0.0.9.post1 and older), so its Python side will refuse "
        f"this process; drop those entries or pip install 'torch-memory-saver>=0.0.10'",))


def _no_fit(runtime: Runtime, ordered: tuple[Verdict, ...], eligible: list[int], fixes: list[str],
            forced: str | None, ld_library_path: str) -> str:
    """The error when no build fits: the cause first (what the user set, or the driver every build
    that fits the runtime misses), then every candidate with its reason, then the fix."""
    any_eligible = bool(eligible)
    if eligible and all(ordered[i].cause == CAUSE_NO_DRIVER for i in eligible):
        where = (f"LD_LIBRARY_PATH={shown(ld_library_path)}, /etc/ld.so.cache and the default directories"
                 if ld_library_path else "/etc/ld.so.cache and the default directories")
        lines = [f"the NVIDIA driver library {DRIVER_SONAME} is not found by the loader (it searched {where}), "
                 f"so no torch_memory_saver preload build can load for {runtime.describe()}:"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append("Fix: " + "; or ".join(dict.fromkeys(fixes)))
        return "\n".join(lines)
    if forced:
        lines = [f"{FORCE_VAR}={shown(forced)} names a build that does not fit {runtime.describe()}:"]
        lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
        lines.append(f"Fix: point {FORCE_VAR} at a build for {runtime.name}, or unset it to choose among the "
                     f"installed builds")
        return "\n".join(lines)
    lines = [f"no torch_memory_saver preload build fits {runtime.describe()}:"]
    lines += [f"  - {v.build.name}: {v.reason}" for v in ordered]
    if not any_eligible:
        fixes.append(build_install_hint(runtime.kind, runtime.major))
    lines.append("Fix: " + "; or ".join(dict.fromkeys(fixes)) if fixes else
                 f"Fix: see the reasons above, or set {FORCE_VAR} to a build that loads")
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
            plan, chosen, fixes = _choose(builds, eligible, runtime, env, loader, exe, check_all, trace)
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
