"""``configure_subprocess()``: this process's plan, applied to the children it starts.

A drop-in for torch_memory_saver's own ``configure_subprocess()``, which SGLang wraps around its
scheduler ``proc.start()``. Same contract (the environment of children started inside the block,
restored on exit), but the build is the one :func:`tms_autopreload.plan.resolve` chose from the
runtime torch really binds and verified with the real loader, and the plan's ``LD_LIBRARY_PATH``
binding comes with it. On a host whose only ``libcudart.so.13`` is torch's pip wheel, that binding
is the difference between a child that starts and one the loader kills with exit 127 (sglang #36533).
"""

import contextlib
import os
import threading
import warnings

from .plan import Plan, resolve

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["configure_subprocess"]

# os.environ belongs to the whole process: one block at a time may hold it. Re-entrant, so that
# blocks nest in one thread.
_environ_lock = threading.RLock()


@contextlib.contextmanager
def configure_subprocess() -> "Iterator[Plan]":
    """Give children started inside the block this process's preload plan; yields the plan.

    Sets ``LD_PRELOAD`` (the chosen build first, other entries kept, stale torch_memory_saver
    entries dropped), ``LD_LIBRARY_PATH`` when the plan binds the runtime library there, and
    ``TMS_AUTOPRELOAD_STATE`` (so a flagged child skips resolving) in ``os.environ``, and restores
    each to its previous value, or absence, on exit, also when the block raises.

    The calling process is not hooked: the loader reads ``LD_PRELOAD`` only when a program starts.
    When no plan exists, :class:`tms_autopreload.ResolveError` is raised before anything changes,
    with the message ``tms-autopreload which`` prints.

    Nestable: an inner block resolves against the outer block's environment and restores it.
    Thread safety: the values live in ``os.environ``, which every thread shares. Blocks are
    serialised by a re-entrant lock (another thread's block waits until this one ends), but a
    thread that starts children outside any block meanwhile gives them these values too, exactly
    as with torch_memory_saver's own function.
    """
    with _environ_lock:
        plan = resolve()
        for warning in plan.warnings:
            warnings.warn(warning, RuntimeWarning, stacklevel=3)
        changes = plan.environment()
        saved = {name: os.environ.get(name) for name in changes}
        os.environ.update(changes)
        try:
            yield plan
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
