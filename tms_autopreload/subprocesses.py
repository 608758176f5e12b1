"""``configure_subprocess()``: this process's plan, applied to the children it starts.

A drop-in for torch_memory_saver's own ``configure_subprocess()``, which SGLang wraps around its
scheduler ``proc.start()``. Same contract (the environment of children started inside the block,
restored on exit), but the build is the one :func:`tms_autopreload.decision.resolve` chose from the
runtime torch really binds and verified with the real loader, and the plan's ``LD_LIBRARY_PATH``
binding comes with it. On a host whose only ``libcudart.so.13`` is torch's pip wheel, that binding
is the difference between a child that starts and one the loader kills with exit 127 (sglang #36533).
"""

import contextlib
import os
import threading
import warnings

from .environment import DISABLE_VAR, kill_switch, mapped_hooks, say
from .decision import resolve
from .verdict import Plan

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["configure_subprocess", "FORK_ADVICE"]

# os.environ belongs to the whole process: one block at a time may hold it. Re-entrant, so that
# blocks nest in one thread.
_environ_lock = threading.RLock()
# How many blocks of an unhooked process are open (nested ones counted): the fork handler speaks only
# while one is. A fork child of a process that maps the plan's hook is a copy of it, hooked too.
_open_blocks = 0
FORK_ADVICE = "use 'spawn' or 'forkserver' as the start method (multiprocessing.get_context('spawn'))"


def _forked_in_block() -> None:
    """``os.register_at_fork(after_in_child=...)``: a fork child of a block says it is not hooked.

    fork copies the unhooked parent and does not exec, so the loader never reads the ``LD_PRELOAD``
    the block set; the child still has that value, so torch_memory_saver's own check would pass
    while nothing is intercepted. Programs the child execs are hooked.
    """
    if _open_blocks:
        say(f"process {os.getpid()} was forked inside configure_subprocess() and is not hooked: fork does not "
            f"exec, and the loader reads LD_PRELOAD only when a program starts (programs this process execs "
            f"are hooked); {FORK_ADVICE}")


os.register_at_fork(after_in_child=_forked_in_block)


def _start_method() -> str:
    """multiprocessing's start method as it stands, without fixing it (the default is listed first)."""
    import multiprocessing

    return multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]


@contextlib.contextmanager
def configure_subprocess() -> "Iterator[Plan | None]":
    """Give children started inside the block this process's preload plan; yields the plan.

    Sets ``LD_PRELOAD`` (the chosen build first, other entries kept, stale torch_memory_saver
    entries dropped), ``LD_LIBRARY_PATH`` when the plan binds the runtime library there, and
    ``TMS_AUTOPRELOAD_STATE`` (so a flagged child skips resolving) in ``os.environ``, and restores
    each to its previous value, or absence, on exit, also when the block raises.

    The calling process is not hooked: the loader reads ``LD_PRELOAD`` only when a program starts.
    So children must be new programs: ``subprocess``, and ``multiprocessing`` with the ``spawn`` or
    ``forkserver`` start method (a forkserver started inside a block; it forks its children from
    itself). A ``fork`` child is a copy of this process: where this process is not hooked, the block
    warns when multiprocessing's start method is ``fork``, and each child forked inside it says on
    stderr that it is not hooked. When no plan exists, :class:`tms_autopreload.ResolveError` is raised before
    anything changes, with the message ``tms-autopreload which`` prints. With
    ``TMS_AUTOPRELOAD_DISABLE`` on, the block changes nothing, warns, and yields None.

    Nestable: an inner block resolves against the outer block's environment and restores it.
    Thread safety: the values live in ``os.environ``, which every thread shares. Blocks are
    serialised by a re-entrant lock (another thread's block waits until this one ends), but a
    thread that starts children outside any block meanwhile gives them these values too, exactly
    as with torch_memory_saver's own function.
    """
    global _open_blocks
    off, unknown = kill_switch()
    if off:
        warnings.warn(f"{unknown or DISABLE_VAR + '=' + os.environ[DISABLE_VAR]}: configure_subprocess() changes "
                      f"nothing; children started in this block are not hooked", RuntimeWarning, stacklevel=3)
        yield None
        return
    with _environ_lock:
        plan = resolve()
        for warning in plan.warnings:
            warnings.warn(warning, RuntimeWarning, stacklevel=3)
        hooked = plan.build in mapped_hooks(plan.build)
        if not hooked and _start_method() == "fork":
            warnings.warn(f"multiprocessing's start method is 'fork': its children (Process, Pool, "
                          f"ProcessPoolExecutor) started in this block are copies of this unhooked process "
                          f"and are not hooked; {FORK_ADVICE}",
                          RuntimeWarning, stacklevel=3)
        changes = plan.environment()
        saved = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
        if not hooked:
            _open_blocks += 1
        try:
            yield plan
        finally:
            if not hooked:
                _open_blocks -= 1
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
