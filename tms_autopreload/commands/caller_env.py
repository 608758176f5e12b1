"""The environment a command answers for: its caller's, without what a plan of this package put there.

A command may run where a plan is already applied: after ``eval "$(tms-autopreload env)"``, inside
``tms-autopreload run --``, in a hooked worker or Jupyter kernel. Surveyed there, the applied values
look like the caller's own: the runtime's directory already first on ``LD_LIBRARY_PATH`` makes the
binding "as found", and a plan that prints only what it changes prints less than a fresh process
needs (the hook without its ``libcudart`` directory: exit 127 on a pip-only node). So every command
surveys :func:`before_plan` of its environment. What a plan added is not guessed from the values (a
caller may have put the runtime's directory on ``LD_LIBRARY_PATH`` themselves): every process that
applies a plan records it in ``TMS_AUTOPRELOAD_ADDED`` (:meth:`tms_autopreload.attempt.Plan.environment`).

:func:`own_plan` is the plan of the same environment with no ``LD_PRELOAD`` and no ``LD_LIBRARY_PATH``
of its own, whose every entry is therefore the plan's: the plan of a process started from a clean
environment (a Ray worker, from its raylet's), which ``env --json`` prints.

(The ``tms-autopreload`` command itself is never hooked: :func:`tms_autopreload.process_startup` leaves
it alone, so a flag exported in the caller's shell changes nothing here.)
"""

import os

from ..environment import ADDED_VAR, EXEC_VAR, STATE_VAR, is_tms_entry, split_preload, state_build
from ..builds import is_preload_name
from ..environment import read_added, split_search_path
from ..decision import survey
from ..decision import Report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["own_plan", "before_plan", "plan_applied", "PLAN_VARS"]

# The variables a plan sets (Plan.changes) and those a process applying one adds (Plan.environment).
PLAN_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH")
_MARKERS = (STATE_VAR, EXEC_VAR, ADDED_VAR)


def own_plan(environ: "Mapping[str, str] | None" = None) -> Report:
    """The survey of ``environ`` (default: this process's) without its ``LD_PRELOAD`` and
    ``LD_LIBRARY_PATH``: every value its plan sets is the plan's own."""
    env = os.environ if environ is None else environ
    return survey({k: v for k, v in env.items() if k not in PLAN_VARS})


def _without(entries: "list[str]", drop: "list[str]") -> "list[str]":
    """``entries`` less one occurrence of each of ``drop``, in order."""
    out = list(entries)
    for entry in drop:
        if entry in out:
            out.remove(entry)
    return out


def plan_applied(environ: "Mapping[str, str]") -> bool:
    """Whether a plan of this package was applied to ``environ`` (a hooked process, or a shell that took
    ``env``'s output): it carries a plan's record, so the builds in its ``LD_PRELOAD`` are that plan's, not a
    pick the caller exported."""
    return any(name in environ for name in _MARKERS)


def before_plan(environ: "Mapping[str, str] | None" = None) -> "dict[str, str]":
    """``environ`` (default: this process's) as it was before a plan of this package was applied to it.

    Taken out: every torch_memory_saver build in ``LD_PRELOAD`` (by its released name, or the one the state
    names: each is a plan's, or a launcher's pick that the plan replaces), one occurrence of each entry
    ``TMS_AUTOPRELOAD_ADDED`` records (the runtime preloaded by path, the directories put on
    ``LD_LIBRARY_PATH``), and the markers of a hooked process; a variable left empty is unset. Without such a
    build or a record, nothing was applied and ``environ`` is returned as it is; a caller's own entries are
    never taken out (one in a folder named after torch_memory_saver is the plan's to judge).
    """
    env = dict(os.environ if environ is None else environ)
    preload = split_preload(env.get("LD_PRELOAD", ""))
    planned = state_build(env)

    def applied(entry: str) -> bool:  # a build, not a caller's file in a folder named after torch_memory_saver
        return is_tms_entry(entry) and (is_preload_name(os.path.basename(entry)) or entry == planned)

    if ADDED_VAR not in env and not any(applied(e) for e in preload):
        return env
    added_preload, added_path = read_added(env.get(ADDED_VAR, ""))
    for name in _MARKERS:
        env.pop(name, None)
    values = {"LD_PRELOAD": _without([e for e in preload if not applied(e)], added_preload)}
    path = split_search_path(env.get("LD_LIBRARY_PATH", ""))
    if any(d in path for d in added_path):  # else the caller's value, as they spelt it
        values["LD_LIBRARY_PATH"] = _without(path, added_path)
    for name, entries in values.items():
        if entries:
            env[name] = ":".join(entries)
        else:
            env.pop(name, None)
    return env
