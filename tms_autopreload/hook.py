"""What the start-up entry does once a flag is set: re-exec once with the planned environment.

Order of checks, cheapest first, so that children of a hooked process pay almost nothing:

1. flags parsed (``TMS_AUTOPRELOAD_DISABLE`` beats everything);
2. the hook this environment was resolved for is already mapped (``/proc/self/maps``) and
   the resolution was made for this interpreter's prefix: done, no resolve;
3. this PID already re-exec'd once and the hook is still not mapped: stop, never loop;
4. otherwise resolve (:func:`tms_autopreload.plan.survey`); if its build is mapped, done;
   else ``execv`` the same interpreter with the same ``sys.orig_argv`` and the new environment.

Nothing leaves this module as a traceback: start-up would print ``Error processing line``
or, for SystemExit, abort with ``Fatal Python error``. Failures print one message prefixed
``tms-autopreload:`` and exit with :data:`EXIT_NO_PLAN` (or continue, with
``TMS_AUTOPRELOAD_ON_ERROR=warn``).
"""

from __future__ import annotations

import os
import sys

from .environ import (DISABLE_VAR, EXEC_VAR, FLAG_VARS, ON_ERROR_VAR, SLIME_DEFAULTS, STATE_VAR,
                      VERBOSE_VAR, compose_preload, is_tms_entry, parse_flag, split_preload)

__all__ = ["run", "mapped_hooks", "state_key", "EXIT_NO_PLAN", "EXIT_INTERRUPTED"]

EXIT_NO_PLAN = 78  # EX_CONFIG (sysexits.h): no preload plan, or the re-exec did not take
EXIT_INTERRUPTED = 130


class _Stop(Exception):
    """A failure to report: the message, and the exit code when the hook is not told to warn."""

    def __init__(self, message: str, code: int = EXIT_NO_PLAN) -> None:
        super().__init__(message)
        self.code = code


def _say(message: str) -> None:
    """One message on fd 2 (sys.stderr may be None or replaced this early)."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.write(2, ("tms-autopreload: " + message.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except (OSError, ValueError):
        pass


def mapped_hooks() -> list[str]:
    """Paths of torch_memory_saver objects mapped into this process, from /proc/self/maps."""
    found: list[str] = []
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                if "torch_memory_saver" in line:
                    path = line.split(None, 5)[-1].strip()
                    if path.startswith("/") and is_tms_entry(path) and path not in found:
                        found.append(path)
    except OSError:
        pass
    return found


def state_key(build: str) -> str:
    """What a resolution depends on besides the files: this prefix and the two overrides."""
    env = os.environ
    return "::".join((sys.prefix, env.get("TMS_AUTOPRELOAD_CUDA_MAJOR", ""),
                      env.get("TMS_AUTOPRELOAD_PATH", ""), build))


def _embedded() -> bool:
    """True for an interpreter we must not re-exec: no argv to repeat, or not a python binary."""
    if not getattr(sys, "orig_argv", None) or not sys.executable:
        return True
    try:
        return os.path.realpath(sys.executable) != os.path.realpath("/proc/self/exe")
    except OSError:
        return True


def _normalise_preload(build: str) -> None:
    """Rewrite LD_PRELOAD colon-joined with ``build`` first, as torch_memory_saver reads it."""
    current = os.environ.get("LD_PRELOAD", "")
    entry = next((e for e in split_preload(current) if is_tms_entry(e)), build)
    wanted = compose_preload(current, entry)
    if wanted != current:
        os.environ["LD_PRELOAD"] = wanted


def _flags() -> tuple[bool, bool]:
    """(hook on, slime mode); prints one warning per unrecognised value."""
    values = {name: parse_flag(name, os.environ.get(name)) for name in (DISABLE_VAR, *FLAG_VARS)}
    for _, warning in values.values():
        if warning:
            _say("warning: " + warning)
    if values[DISABLE_VAR][0]:
        return False, False
    slime = values["SLIME_OFFLOAD_TRAIN"][0]
    return slime or values["TMS_AUTOPRELOAD"][0], slime


def _apply() -> None:
    on, slime = _flags()
    if not on:
        return
    env = os.environ
    verbose = parse_flag(VERBOSE_VAR, env.get(VERBOSE_VAR))[0]
    if slime:
        for name, value in SLIME_DEFAULTS.items():
            env.setdefault(name, value)
    mapped = mapped_hooks()
    state = env.get(STATE_VAR)
    for path in mapped:
        if state == state_key(path):
            _normalise_preload(path)
            env.pop(EXEC_VAR, None)
            if verbose:
                _say(f"{path} is mapped (resolved for this interpreter); nothing to do")
            return
    if env.get(EXEC_VAR) == str(os.getpid()):
        raise _Stop(f"re-executed once with LD_PRELOAD={env.get('LD_PRELOAD', '')!r}, but the hook is "
                    f"still not mapped (mapped: {mapped or 'none'}); not trying again. Something between "
                    f"the exec and this interpreter drops LD_PRELOAD (a setuid wrapper, or a launcher "
                    f"that cleans the environment): run `tms-autopreload doctor`.")

    from .plan import survey

    report = survey()
    if report.plan is None:
        raise _Stop(report.error or "no plan")
    plan = report.plan
    for warning in (*report.warnings, *plan.warnings):
        _say("warning: " + warning)
    if plan.build in mapped:
        env.update(plan.changes())
        env[STATE_VAR] = state_key(plan.build)
        env.pop(EXEC_VAR, None)
        if verbose:
            _say(f"{plan.build} is already mapped; {plan.runtime.describe()}")
        return
    if _embedded():
        raise _Stop(f"this interpreter ({sys.executable or 'unknown'}) is embedded in another program, "
                    f"so it cannot be restarted with the hook. Set it before the program starts: "
                    f"eval \"$(tms-autopreload env)\" (would set LD_PRELOAD={plan.ld_preload}).")
    new_env = dict(env)
    new_env.update(plan.changes())
    new_env[STATE_VAR] = state_key(plan.build)
    new_env[EXEC_VAR] = str(os.getpid())
    if verbose:
        _say(f"chose {plan.build} for {plan.runtime.describe()}; re-executing with "
             f"LD_PRELOAD={plan.ld_preload}"
             + (f" LD_LIBRARY_PATH={plan.ld_library_path}" if plan.ld_library_path is not None else ""))
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass
    try:
        os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], new_env)
    except OSError as exc:
        raise _Stop(f"cannot re-execute {sys.executable} ({exc.strerror or exc}); set the environment "
                    f"before start instead: eval \"$(tms-autopreload env)\"") from None


def run() -> None:
    """Entry from :func:`tms_autopreload.startup.process_startup`; never raises."""
    try:
        _apply()
    except BaseException as exc:  # noqa: BLE001 - nothing may escape into site.py
        if isinstance(exc, _Stop):
            message, code = str(exc), exc.code
        elif isinstance(exc, KeyboardInterrupt):
            message, code = "interrupted while resolving the preload hook", EXIT_INTERRUPTED
        else:
            message, code = (f"internal error while resolving the preload hook: {exc!r}; "
                             f"run `tms-autopreload doctor` and report it"), EXIT_NO_PLAN
        policy = os.environ.get(ON_ERROR_VAR, "exit").strip().lower()
        if policy == "warn" and code != EXIT_INTERRUPTED:
            _say(message + f"\ncontinuing without the hook ({ON_ERROR_VAR}=warn)")
            return
        if policy not in ("exit", "warn", ""):
            _say(f"warning: {ON_ERROR_VAR}={policy!r} is not 'exit' or 'warn'; using 'exit'")
        _say(message)
        os._exit(code)
