"""The start-up hook: its cheap cases, then resolve and re-exec once with the planned environment.

:func:`process_startup` is the entry (``tms_autopreload.pth`` runs a copy of it, tools/pthfile.py's
``_tms_autopreload_start.py``, with the rules of :mod:`tms_autopreload.environment` it uses). It handles the
cheap cases without importing anything of the package:

* no flag on, or a program the package never hooks: nothing is changed;
* the hook this environment was resolved for is already mapped (``/proc/self/maps``) and was resolved for
  this interpreter's prefix (a child of a hooked process): done, no resolve; when a launcher named it again
  in LD_PRELOAD (``configure_subprocess()``), the value is rewritten with one entry.

It runs once per process, the package's or the start module's copy (:data:`~tms_autopreload.environment.STARTED`):
in a venv on Python 3.10-3.14 site-packages is scanned twice, so the ``.pth`` runs twice per start (CPython
#75723); coverage.py's ``process_startup`` guards the same way. Else :func:`run`:

1. this PID already re-exec'd once and the hook is still not mapped: stop, never loop;
2. in ``dlopen`` mode (``TMS_AUTOPRELOAD_MODE=dlopen``), and always in an interpreter that cannot be
   re-exec'd, load the plan in-process (:mod:`tms_autopreload.inprocess`); where that cannot bind as
   ``LD_PRELOAD`` would, keep the reason and go on;
3. resolve with the loader trace (:func:`tms_autopreload.decision.survey`); if its build is mapped
   already, and no other torch_memory_saver build is, only normalise ``os.environ`` (LD_PRELOAD as
   torch_memory_saver's Python side reads it);
4. else ``execv`` the same interpreter with the same ``sys.orig_argv`` and the new environment
   (saying why dlopen mode could not be used, under ``TMS_AUTOPRELOAD_VERBOSE``), or stop with the
   reason where no exec is possible.

Nothing leaves this module as a traceback: start-up would print ``Error processing line``
or, for SystemExit, abort with ``Fatal Python error``. Failures print one message prefixed
``tms-autopreload:`` and exit with :data:`EXIT_CONFIG` (or continue, with
``TMS_AUTOPRELOAD_ON_ERROR=warn``).
"""

import os
import sys

from .environment import (APPLY_ENV, COMMAND, DISABLE_VAR, EXEC_VAR, FLAG_VARS, MODE_VAR, MODES, NO_HOOK,
                          ON_ERROR_POLICIES, ON_ERROR_VAR, SLIME_DEFAULTS, STARTED, VERBOSE_VAR, flag_values, flags,
                          inherited_hook, mapped_hooks, parse_flag, read_maps, reexecuted, same_file, say,
                          state_build, unhooked_program, unrecognised)

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType

    from .decision import Report

__all__ = ["process_startup", "run", "parse_choice", "start_warnings", "processed_pth", "stray_start", "too_old",
           "EXIT_CONFIG", "EXIT_INTERRUPTED", "PTH", "START", "FALLBACK", "START_UP_FILES", "PYTHON_FLOOR"]

# The files the wheel puts at the root of site-packages (tools/pthfile.py writes them, setup.py ships them): the
# .pth, the start module its line imports where a flag is set, and the fallback that imports where the package
# is gone.
PTH = "tms_autopreload.pth"
START = "_tms_autopreload_start"
FALLBACK = "_tms_autopreload_left_over"
START_UP_FILES = (PTH, f"{START}.py", f"{FALLBACK}.py")
EXIT_CONFIG = 78  # EX_CONFIG (sysexits.h): no preload plan, or the re-exec did not take
EXIT_INTERRUPTED = 130
# The oldest Python the package runs on: pyproject.toml's requires-python (tests/test_packaging.py holds them
# equal). pip installs it on an older one only when told to ignore that (``--ignore-requires-python``).
PYTHON_FLOOR = (3, 10)


def process_startup() -> None:
    """Apply the preload hook to this process when SLIME_OFFLOAD_TRAIN or TMS_AUTOPRELOAD asks."""
    if getattr(sys, STARTED, False):  # the package's entry or the start module's copy of it ran
        return
    setattr(sys, STARTED, True)
    env = os.environ
    if sys.platform != "linux" or not any(env.get(name) for name in FLAG_VARS):
        return
    program = unhooked_program()
    if program is not None:
        if program != COMMAND:
            env[DISABLE_VAR] = "1"  # for its children: a build backend, the pip that ensurepip starts
        return
    try:
        on, slime = flags(warn=not reexecuted(env))  # said once, before the exec
        if not on:
            return
        if slime:
            for name, value in SLIME_DEFAULTS.items():
                env.setdefault(name, value)
        planned = state_build()
        maps = read_maps()
        mapped = mapped_hooks(planned, maps)
        inherited = inherited_hook(mapped, planned)
        if inherited is not None:
            path, preload = inherited
            rewritten = preload != env.get("LD_PRELOAD")
            if rewritten:
                env["LD_PRELOAD"] = preload
            env.pop(EXEC_VAR, None)
            if parse_flag(VERBOSE_VAR, env.get(VERBOSE_VAR))[0]:
                say(f"{_shown(path)} is mapped (resolved for this interpreter); "
                    + (f"LD_PRELOAD rewritten as {preload}" if rewritten else "nothing to do"))
            return
    except Exception:  # noqa: BLE001 - the full path below reports anything, without a traceback
        maps = None
    from tms_autopreload.startup import run  # by its absolute name: the start module runs a copy of this

    run(maps or None)  # an empty read (no /proc) is tried again there


def _shown(path: str) -> str:
    """The mapped hook as the start said it (:func:`tms_autopreload.builds.shown_path`: a link to a file of another
    name, with that file), or its path alone where the package cannot be imported (removed under a running hooked
    parent, whose children are hooked still): being told more never changes what a start does."""
    try:
        from tms_autopreload.builds import shown_path
    except ImportError:
        return path
    return shown_path(path)


class _Stop(Exception):
    """A failure to report: the message, and the exit code when the hook is not told to warn."""

    def __init__(self, message: str, code: int = EXIT_CONFIG) -> None:
        super().__init__(message)
        self.code = code


def _cannot_exec() -> "str | None":
    """Why this interpreter must not be re-exec'd, or None: no argv to repeat, or not a python binary."""
    if not getattr(sys, "orig_argv", None) or not sys.executable:
        return f"this interpreter ({sys.executable or 'unknown'}) is embedded in another program"
    try:
        exe = os.readlink("/proc/self/exe")
    except OSError as exc:
        return f"/proc/self/exe cannot be read ({exc.strerror}: is /proc mounted?), so a re-exec cannot be checked"
    # The kernel's name for the running file has no symbolic link in it: one realpath decides.
    if os.path.realpath(sys.executable) != exe:
        return f"this interpreter ({sys.executable}) is embedded in another program ({exe})"
    return None


def parse_choice(name: str, value: "str | None", choices: "tuple[str, ...]") -> "tuple[str, str | None]":
    """(the choice, a warning) for a variable that names one of ``choices`` (any case); unset or empty
    means ``choices[0]``, the default, and so does an unknown spelling, with a warning."""
    if value is None:
        return choices[0], None
    word = value.strip().lower()
    if not word or word in choices:
        return word or choices[0], None
    return choices[0], unrecognised(name, value, " or ".join(choices), choices[0])


# The choices a start reads, each by parse_choice: what it says of their values is :func:`start_warnings`'s too.
CHOICES = ((ON_ERROR_VAR, ON_ERROR_POLICIES), (MODE_VAR, MODES))  # in the order a start reads them


def start_warnings(env: "Mapping[str, str]") -> "list[str]":
    """Every warning a flagged start says of the variables in ``env``, in its words: the booleans'
    (:func:`tms_autopreload.environment.flag_values`) and the choices' (:data:`CHOICES`). ``doctor`` says them too."""
    booleans = [warning for _, warning in flag_values(env).values() if warning]
    return booleans + [w for name, choices in CHOICES if (w := parse_choice(name, env.get(name), choices)[1])]


def _choice(name: str, choices: "tuple[str, ...]") -> str:
    """A choice variable's value, its warning said at once (see :func:`parse_choice`)."""
    value, warning = parse_choice(name, os.environ.get(name), choices)
    if warning:
        say("warning: " + warning)
    return value


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


def too_old() -> "str | None":
    """Why the package cannot run in this interpreter, with the fix, where it is older than :data:`PYTHON_FLOOR`
    (an install forced past its requires-python); else None. A flagged start stops with it, and every command
    says it, before anything imports a module written for a newer Python: only this module, the environment's
    rules, the error model and the install commands (:mod:`tms_autopreload.installer`, with the search path and
    the install record it reads) are imported there."""
    if sys.version_info >= PYTHON_FLOOR:
        return None
    from .errors import Error
    from .install_source import DISTRIBUTION
    from .installer import pip_command

    floor = ".".join(map(str, PYTHON_FLOOR))
    here = ".".join(map(str, sys.version_info[:3]))
    return str(Error(f"{sys.executable} is Python {here}, and tms_autopreload needs Python {floor} or newer (it was "
                     f"installed here past its requires-python), so it cannot choose a build for this interpreter",
                     f"{pip_command('uninstall', DISTRIBUTION)}, then install it into an environment of Python "
                     f"{floor} or newer"))


def _apply(maps: "bytes | None") -> None:
    old = too_old()
    if old is not None:
        raise _Stop(old)
    env = os.environ
    verbose = parse_flag(VERBOSE_VAR, env.get(VERBOSE_VAR))[0]
    if reexecuted(env):
        from .stopped import not_taken

        raise _Stop(not_taken(mapped_hooks(state_build(), maps)))

    from .decision import survey

    stray = stray_start(getattr(sys.modules.get(START), "__file__", None), processed_pth(""))
    if stray is not None:
        say(f"warning: {stray[0]}. Fix: {stray[1]}")
    embedded = _cannot_exec()
    in_process = embedded is not None or _choice(MODE_VAR, MODES) == "dlopen"
    why_not = None
    if in_process:
        why_not = _load_in_process(env, verbose)
        if why_not is None:
            return
    report = survey()
    if report.plan is None:
        raise _Stop(report.error or "no plan")
    plan = report.plan
    for warning in (*report.warnings, *plan.warnings):
        say("warning: " + warning)
    # /proc/self/maps as read at entry, unless loading in-process may have mapped more since
    mapped = mapped_hooks(plan.build, None if in_process else maps)
    if mapped == [plan.build]:  # a second torch_memory_saver build mapped too would compete: exec
        env.update(plan.environment())
        env.pop(EXEC_VAR, None)
        if verbose:
            say(f"{_chosen(report)} is already mapped; {plan.runtime.describe()}")
        return
    if embedded:
        raise _Stop(f"{embedded}, so it cannot be restarted with the hook, and loading the hook in-process "
                    f"would not bind as LD_PRELOAD does: {why_not}. Set it before the program starts: "
                    f"`{APPLY_ENV}` (would set LD_PRELOAD={plan.ld_preload}).")
    if in_process and verbose:
        say(f"dlopen mode: {why_not}; falling back to exec")
    new_env = dict(env)
    new_env.update(plan.environment())
    new_env[EXEC_VAR] = str(os.getpid())
    if verbose:
        _say_plan(report, "chose", "", "; re-executing with")
    _flush()
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new_env)
    except OSError as exc:
        raise _Stop(f"cannot re-execute {sys.executable} ({exc.strerror or exc}); set the environment "
                    f"before start instead: `{APPLY_ENV}`") from None


def _load_in_process(env: "os._Environ[str]", verbose: bool) -> "str | None":
    """Load the plan into this interpreter (dlopen mode); None when done, else why not.

    The plan is made without a loader trace: the ``dlopen`` is the real loader's answer, and a
    failure leaves nothing of the plan loaded. After any failure the caller surveys again, with
    the trace, and reports or execs exactly as exec mode does.
    """
    from .inprocess import InProcessError, load
    from .decision import survey

    report = survey(trace=False)
    if report.plan is None:
        return report.error or "no plan"
    plan = report.plan
    try:
        load(plan, env)
    except InProcessError as exc:
        return exc.message  # its fix is what the caller does next: re-exec with LD_PRELOAD
    for warning in (*report.warnings, *plan.warnings):
        say("warning: " + warning)
    env.pop(EXEC_VAR, None)
    if verbose:
        _say_plan(report, "loaded", " in-process", " (no exec); children get")
    return None


def _say_plan(report: "Report", done: str, how: str, then: str) -> None:
    """The verbose message of an applied plan, in exec and dlopen mode alike: what was ``done`` with
    which build, ``how``, for which runtime, ``then`` the variables the plan sets."""
    plan = report.plan
    assert plan is not None  # said only of a plan that was applied
    variables = " ".join(f"{name}={value}" for name, value in plan.changes().items())
    say(f"{done} {_chosen(report)}{how} for {plan.runtime.describe()}{then} {variables}")


def _chosen(report: "Report") -> str:
    """The plan's build as the verbose messages name it (:meth:`tms_autopreload.builds.Build.shown`)."""
    build = report.chosen
    assert build is not None  # a report with a plan has its chosen build
    return build.shown()


def processed_pth(default: str) -> str:
    """The ``.pth`` file whose import line started this, or ``default`` where no such frame is found: a copy of
    the start-up files found earlier on ``sys.path`` (a ``PYTHONPATH`` folder) would otherwise name a file
    site.py never read. site.py's frame that runs import lines names it ``fullname``: ``addpackage`` up to
    3.14, ``_exec_imports`` from 3.15 (which sets it for import lines written for 3.14); site.py is frozen into
    the interpreter from 3.11 (``<frozen site>``) unless the build leaves it out."""
    frame: "FrameType | None" = sys._getframe()
    while frame is not None:
        fullname = frame.f_locals.get("fullname")
        if frame.f_code.co_filename.rpartition("/")[2] in ("site.py", "<frozen site>") and isinstance(fullname, str):
            return fullname
        frame = frame.f_back
    return default


def stray_start(started: "str | None", pth: str) -> "tuple[str, str] | None":
    """Why ``started``, the start module a flagged start imports (this process's, or the first one ``doctor``
    finds on ``sys.path``), is not the one beside ``pth``, the ``.pth`` site.py reads, and the fix; or None. A
    start module earlier on ``sys.path`` (a ``PYTHONPATH`` folder, a ``--target`` install of another version) is
    imported by the ``.pth`` line instead, and runs its own copy of the start-up rules, which may be older than
    this package's (tools/pthfile.py writes the copy). Only ``PYTHONPATH`` comes before the site directories
    when site.py runs the line, so taking its folder off there is the other way out."""
    beside = os.path.join(os.path.dirname(pth), f"{START}.py")
    if started is None or not os.path.isabs(beside) or same_file(started, beside):
        return None
    import shlex

    return (f"the start module {started}, earlier on sys.path, is what flagged starts import instead of {beside} "
            f"beside {pth}: its copy of the start-up rules may not be this package's",
            f"`{NO_HOOK} rm -f -- {shlex.quote(started)}` (or take its folder off PYTHONPATH)")


def run(maps: "bytes | None" = None) -> None:
    """Entry from :func:`tms_autopreload.process_startup`; never raises. ``maps``: /proc/self/maps as the entry
    read it (None where it was not read, or read nothing: it is read again where asked)."""
    on_error = _choice(ON_ERROR_VAR, ON_ERROR_POLICIES)
    import gc  # built in: nothing to find on disk

    # The imports and the resolve allocate thousands of objects and free them by reference count: the
    # collections their allocations would trigger find little to free, and cost about a tenth of the work (callgrind).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _apply(maps)
    except BaseException as exc:  # noqa: BLE001 - nothing may escape into site.py
        if isinstance(exc, _Stop):
            message, code = str(exc), exc.code
        elif isinstance(exc, KeyboardInterrupt):
            message, code = "interrupted while resolving the preload hook", EXIT_INTERRUPTED
        else:
            message, code = (f"internal error while resolving the preload hook: {exc!r}; "
                             f"run `tms-autopreload doctor` and report it"), EXIT_CONFIG
        if on_error == "warn" and code != EXIT_INTERRUPTED:
            say(message + f"\ncontinuing without the hook ({ON_ERROR_VAR}=warn)")
            return
        if code == EXIT_CONFIG:
            try:
                from .stopped import way_out  # only a stopped start says it
            except Exception:  # noqa: BLE001 - a package broken under a running start: its reason alone, no traceback
                pass
            else:
                message += "\n" + way_out()
        say(message)
        _flush()
        os._exit(code)
    finally:
        if collecting:
            gc.enable()
