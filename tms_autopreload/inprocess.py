"""Load a plan into the running interpreter, so that it needs no second start (``TMS_AUTOPRELOAD_MODE=dlopen``).

``LD_PRELOAD`` puts the hook in the global scope before anything else the process loads. The same
bindings come from two ``dlopen`` calls made before torch is loaded: the runtime library torch will
bind, by absolute path and ``RTLD_LOCAL`` (the hook's ``DT_NEEDED`` is then met by SONAME, whatever
this process's ``LD_LIBRARY_PATH`` was at start), then the hook with ``RTLD_GLOBAL``. Libraries loaded
later look symbols up in the global scope first and find the hook; the hook's ``dlsym(RTLD_NEXT)``
finds the runtime library among its own dependencies. The environment is set as the plan says, for
children (they get the real ``LD_PRELOAD``) and for torch_memory_saver's own check.

Where this cannot give exactly the bindings ``LD_PRELOAD`` would, :func:`load` raises why, before it loads
anything, and the caller falls back to ``exec`` (or refuses, for :func:`tms_autopreload.activate`):

* a runtime library, torch, or another torch_memory_saver build is already mapped: references
  already bound do not move to a hook loaded later;
* an interposed symbol is already defined in the global scope (an earlier ``LD_PRELOAD`` entry, the
  executable, or an ``RTLD_GLOBAL`` library): it comes before the hook there, where ``LD_PRELOAD``
  would have put the hook first;
* the plan names no runtime library file to load first;
* a ``dlopen`` fails (``dlerror``'s text is reported).

``_ctypes`` (the C half of ctypes, about 1.5 ms to import) gives ``dlopen`` and ``dlsym``; ``ctypes``
itself is not imported. The lock of :func:`activate` is the interpreter's own (``_thread``): ``threading``
would import ``functools``, ``collections`` and more into every dlopen-mode start.
"""

import _thread
import os
import sys

import _ctypes

from .environment import is_tms_entry, mapped_hooks, mapped_objects, read_maps
from .builds import interposed
from .elf import ElfError
from .errors import (CAUSE_DLOPEN_FAILED, CAUSE_HOOK_LOADED, CAUSE_IN_PROCESS, CAUSE_NOT_MAPPED, CAUSE_NO_PROC_MAPS,
                     CAUSE_NO_RUNTIME_FILE, CAUSE_PRELOAD_DEFINES, CAUSE_RUNTIME_LOADED, CAUSE_SYMBOL_DEFINED,
                     CAUSE_TORCH_IMPORTED, CAUSE_TORCH_LOADED, CAUSE_UNREADABLE_SYMBOLS, Error, ResolveError)
from .gpu_libraries import runtime_of
from .symbols import defined_among

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import MutableMapping

    from .verdict import Plan

__all__ = ["load", "activate", "InProcessError", "TORCH_LIBRARY_PREFIXES"]

# Libraries of torch whose references to the runtime would already be bound if they are mapped.
TORCH_LIBRARY_PREFIXES = ("libtorch", "libc10")


class InProcessError(Error, RuntimeError):
    """The plan cannot be, or was not, loaded in this process; the message says why, ``cause`` names it.

    ``fix``: what helps instead, when a fresh interpreter calling :func:`activate` first would not
    (None: that is the fix).
    """

    cause = CAUSE_IN_PROCESS


# The fix of activate() where a fresh interpreter can bind the hook.
_RESTART = ("restart the interpreter (in a notebook: restart the kernel) and call tms_autopreload.activate() "
            "first, before anything imports torch")
# The fix where a fresh start cannot help: the plan itself needs LD_PRELOAD.
_START_FLAGGED = ("start the process with the flag (TMS_AUTOPRELOAD=1, or `tms-autopreload run -- CMD`), "
                  "which applies the plan with LD_PRELOAD")


def _obstacle(plan: "Plan") -> "InProcessError | None":
    """Why loading ``plan`` here would not bind as ``LD_PRELOAD`` does, or None."""
    library = plan.runtime.library
    if library is None:
        return InProcessError("the plan names no runtime library file to load before the hook", _START_FLAGGED,
                              CAUSE_NO_RUNTIME_FILE)
    if "torch" in sys.modules:
        return InProcessError("torch is already imported", cause=CAUSE_TORCH_IMPORTED)
    for path in mapped_objects():
        name = os.path.basename(path)
        if runtime_of(name):
            return InProcessError(f"a runtime library is already loaded ({path})", cause=CAUSE_RUNTIME_LOADED)
        if name.startswith(TORCH_LIBRARY_PREFIXES):
            return InProcessError(f"a torch library is already loaded ({path})", cause=CAUSE_TORCH_LOADED)
        if is_tms_entry(path):
            return InProcessError(f"a torch_memory_saver build is already loaded ({path})", cause=CAUSE_HOOK_LOADED)
    try:
        symbols = interposed(plan.build, library)
    except ElfError as exc:
        return InProcessError(f"cannot read the symbols of {plan.build} and {library}: {exc}", _START_FLAGGED,
                              CAUSE_UNREADABLE_SYMBOLS)
    main = _ctypes.dlopen(None, os.RTLD_NOW)  # type: ignore[arg-type]  # None: the main program, dlopen(3)'s NULL
    for symbol in symbols:
        try:
            _ctypes.dlsym(main, symbol)
        except OSError:
            continue  # not defined yet: the hook will be the first definition in the global scope
        where = "the global scope, where it would come before the hook"
        preloaded = _preloaded_definition(symbol)
        if preloaded is None:
            return InProcessError(f"{symbol} is already defined in {where}", cause=CAUSE_SYMBOL_DEFINED)
        entry, path = preloaded
        return InProcessError(f"{symbol} is already defined in {where}, by {path} from LD_PRELOAD",
                              f"every start with this LD_PRELOAD has it: remove {entry} from LD_PRELOAD, or "
                              f"{_START_FLAGGED} and puts the hook before it", CAUSE_PRELOAD_DEFINES)
    return None


def _preloaded_definition(symbol: str) -> "tuple[str, str] | None":
    """(the entry, the file it loaded) of the first LD_PRELOAD entry of this process that defines
    ``symbol``, or None.

    The loader finds a bare name (no slash) in LD_PRELOAD as it finds a DT_NEEDED entry, on the search
    path, not in the working directory: :class:`tms_autopreload.ldso.Loader` models that search. Only
    here, where dlopen mode has already failed, does this process read the loader's cache.
    """
    from .ldso import Loader

    try:
        # This process's own executable, whose DT_RPATH the search reads (an embedding program's, say,
        # not sys.executable's).
        loader = Loader.for_executable("/proc/self/exe", os.environ.get("LD_LIBRARY_PATH", ""),
                                       os.environ.get("LD_PRELOAD", ""))
    except ElfError:
        return None
    for entry, path in loader.preloaded:
        try:
            if defined_among(path, (symbol,)):
                return entry, path
        except ElfError:
            continue
    return None


def load(plan: "Plan", environ: "MutableMapping[str, str]") -> None:
    """Load ``plan`` into this process and set ``environ`` as the plan says; raise InProcessError if not possible.

    The ``TMS_*`` variables the hook reads in its constructor must be in ``environ`` (which is
    ``os.environ``, so the C environment too) before this is called.
    """
    found = _obstacle(plan)
    if found:
        raise found
    library = plan.runtime.library
    assert library is not None  # _obstacle refuses a plan without one
    # RTLD_LAZY, as the loader binds a preloaded object (unless LD_BIND_NOW, which applies to both).
    try:
        runtime = _ctypes.dlopen(library, os.RTLD_LAZY | os.RTLD_LOCAL)
    except OSError as exc:
        raise InProcessError(f"dlopen failed: {exc}", cause=CAUSE_DLOPEN_FAILED) from None
    try:
        _ctypes.dlopen(plan.build, os.RTLD_LAZY | os.RTLD_GLOBAL)
    except OSError as exc:
        _ctypes.dlclose(runtime)  # a failure leaves nothing of the plan loaded
        raise InProcessError(f"dlopen failed: {exc}", cause=CAUSE_DLOPEN_FAILED) from None
    if plan.build not in mapped_hooks(plan.build):
        if not read_maps():
            raise InProcessError("dlopen returned, but /proc/self/maps cannot be read, so that the hook is mapped "
                                 "cannot be confirmed", "mount /proc", CAUSE_NO_PROC_MAPS)
        raise InProcessError(f"dlopen returned, but {plan.build} is not mapped", cause=CAUSE_NOT_MAPPED)
    environ.update(plan.environment())


_activated: "Plan | None" = None
_activating = _thread.allocate_lock()


def activate() -> "Plan | None":
    """Bind the hook into this running interpreter; call it before ``import torch``. Returns the plan.

    For notebooks and scripts that cannot set the environment before they start: the first cell of
    a notebook, the first line of a script. It loads the plan as ``TMS_AUTOPRELOAD_MODE=dlopen``
    does, and sets ``LD_PRELOAD``, ``LD_LIBRARY_PATH`` and the state in ``os.environ`` for children
    and for torch_memory_saver's own check (with ``SLIME_OFFLOAD_TRAIN`` on, also its
    ``TMS_INIT_*`` defaults, before the hook's constructor reads them). A second call, or a call in
    a process started with the hook, returns the plan and changes nothing. Safe from any number of
    threads: one does the work, the others wait for it and get its plan.

    Raises :class:`tms_autopreload.ResolveError` when there is no plan, or when this process can
    no longer be hooked as ``LD_PRELOAD`` would; the message says what helps (usually: restart the
    interpreter, or the kernel in a notebook, and call it first). ``os.environ`` is then as it was.
    With ``TMS_AUTOPRELOAD_DISABLE`` on it changes nothing, warns, and returns None.
    """
    global _activated
    if _activated is not None:
        return _activated
    from .environment import DISABLE_VAR, SLIME_DEFAULTS, SLIME_FLAG, kill_switch, parse_flag

    env = os.environ
    off, unknown = kill_switch(env)
    if off:
        import warnings

        warnings.warn(f"{unknown or DISABLE_VAR + '=' + env[DISABLE_VAR]}: activate() changes nothing; this process "
                      f"is not hooked", RuntimeWarning, stacklevel=2)
        return None
    with _activating:
        if _activated is not None:  # another thread did the work while this one waited
            return _activated  # type: ignore[unreachable]  # mypy cannot see the other thread's write
        from .decision import resolve

        plan = resolve()
        if mapped_hooks(plan.build) != [plan.build]:
            added = {}
            if parse_flag(SLIME_FLAG, env.get(SLIME_FLAG))[0]:
                added = {name: value for name, value in SLIME_DEFAULTS.items() if name not in env}
            env.update(added)
            try:
                load(plan, env)
            except BaseException as exc:
                for name in added:  # os.environ as it was found
                    env.pop(name, None)
                if not isinstance(exc, InProcessError):
                    raise
                raise ResolveError(f"cannot bind the hook in this running process: {exc.message}",
                                   fix=exc.fix or _RESTART, cause=exc.cause) from None
        else:  # started with the hook: only the environment, as the start-up hook would leave it
            env.update(plan.environment())
        _activated = plan
        return plan
