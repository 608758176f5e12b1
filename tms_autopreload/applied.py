"""The environment a command answers for: its caller's, without what a plan of this package put there.

A command may run where a plan is already applied: after ``eval "$(tms-autopreload env)"``, inside
``tms-autopreload run --``, in a hooked worker or Jupyter kernel. Surveyed there, the applied values
look like the caller's own: the runtime's directory already first on ``LD_LIBRARY_PATH`` makes the
binding "as found", and a plan that prints only what it changes prints less than a fresh process
needs (the hook without its ``libcudart`` directory: exit 127 on a pip-only node). So every command
surveys :func:`before_plan` of its environment, and a plan's own entries are told apart from the
caller's by :func:`own_plan`: the plan for the same environment with no ``LD_PRELOAD`` and no
``LD_LIBRARY_PATH`` of its own, whose every entry is therefore the plan's. That is also the plan of a
process started from a clean environment (a Ray worker, from its raylet's), which ``env --json`` prints.

(The ``tms-autopreload`` command itself is never hooked: :func:`tms_autopreload.process_startup` leaves
it alone, so a flag exported in the caller's shell changes nothing here.)
"""

import os

from . import EXEC_VAR, STATE_VAR, is_tms_entry, split_preload
from .ldpaths import split_search_path
from .plan import Report, survey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["own_plan", "before_plan", "PLAN_VARS"]

# The variables a plan sets (Plan.changes) and those a process applying one adds (Plan.environment).
PLAN_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH")
_MARKERS = (STATE_VAR, EXEC_VAR)


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


def before_plan(environ: "Mapping[str, str] | None" = None) -> "dict[str, str]":
    """``environ`` (default: this process's) as it was before a plan of this package was applied to it.

    A plan always puts a torch_memory_saver build into ``LD_PRELOAD``: without one, nothing was applied
    and ``environ`` is returned as it is. With one, every torch_memory_saver entry, one occurrence of each
    other entry of :func:`own_plan`'s values (the runtime preloaded by path, the directories put first on
    ``LD_LIBRARY_PATH``) and the markers a hooked process carries are taken out; a variable left empty is
    unset. Taking out an entry the caller had set themselves (``nvidia/cu13/lib`` on their own
    ``LD_LIBRARY_PATH``) changes no answer: the plan puts it back.
    """
    env = dict(os.environ if environ is None else environ)
    preload = split_preload(env.get("LD_PRELOAD", ""))
    if not any(is_tms_entry(e) for e in preload):
        return env
    own = own_plan(env).plan
    values = {"LD_PRELOAD": [e for e in preload if not is_tms_entry(e)],
              "LD_LIBRARY_PATH": split_search_path(env.get("LD_LIBRARY_PATH", ""))}
    if own is not None:
        changes = own.changes()
        values["LD_PRELOAD"] = _without(values["LD_PRELOAD"],
                                        [e for e in split_preload(changes["LD_PRELOAD"]) if not is_tms_entry(e)])
        values["LD_LIBRARY_PATH"] = _without(values["LD_LIBRARY_PATH"],
                                             split_search_path(changes.get("LD_LIBRARY_PATH", "")))
    for name in _MARKERS:
        env.pop(name, None)
    llp = env.get("LD_LIBRARY_PATH", "")
    for name, entries in values.items():
        if name == "LD_LIBRARY_PATH" and entries == split_search_path(llp):
            continue  # nothing of the plan's there: the caller's value, as they spelt it
        if entries:
            env[name] = ":".join(entries)
        else:
            env.pop(name, None)
    return env
