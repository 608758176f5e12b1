"""What happens to one build that fits: its plan with the first binding the loader model predicts holds
(:mod:`tms_autopreload.bindsteps`), the planned start traced with the real loader for the interpreter and
its non-Python children at once (:mod:`tms_autopreload.childprograms`), and the verdict
(:mod:`tms_autopreload.judge`).
"""

import os

from . import ADDED_VAR, is_tms_entry, split_preload
from .bindsteps import Option, no_binding_fix, options, preload_entry, unwritable, words
from .builds import Build
from .childprograms import added_dirs, hook_closure, own_problem, read_ahead
from .errors import CAUSE_CHILD_FAILS, CAUSE_ENV_TOO_LARGE, CAUSE_NO_BINDING, CAUSE_NO_DRIVER, CAUSE_UNSAFE_PATH, \
    ResolveError
from .judge import judge, judge_children
from .ldpaths import read_added, split_search_path
from .ldso import Loader
from .results import LOADS, REJECTED, Plan, Verdict
from .runtime import Runtime
from .trace import run_traces, start_traces

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping

    from .elf import DynamicInfo

__all__ = ["attempt", "MAX_ARG_STRLEN", "env_string_size"]

# Linux's limit on one "NAME=value" string of an exec'd environment, NUL included (32 pages):
# execve fails with E2BIG beyond it.
MAX_ARG_STRLEN = 32 * 4096


def env_string_size(name: str, value: str) -> int:
    return len(os.fsencode(f"{name}={value}")) + 1


def _plan_of(build: Build, runtime: Runtime, env: "Mapping[str, str]", option: Option,
             passed: "list[str]") -> Plan:
    """The plan of one binding (``passed``: why each earlier one would not hold); raises ResolveError when
    a value would be too long for any exec."""
    llp = option.ld_library_path
    said = words(option, runtime, build) + (f" (not {'; not '.join(passed)})" if passed else "")
    plan = Plan(os.path.realpath(build.path), option.ld_preload,
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


def attempt(build: Build, runtime: Runtime, env: "Mapping[str, str]", loader: Loader, executable: str,
             trace_it: bool = True, package_dir: str | None = None,
             children: "list[tuple[str, DynamicInfo]] | None" = None) -> Verdict:
    """Plan one build with the first binding the loader model predicts holds, then trace the planned
    start with the real loader (the interpreter and the non-Python ``children`` at once) and judge.

    With no binding predicted to hold, the first is traced anyway, so the loader's own words say why,
    followed by each other binding's reason. ``trace_it=False`` plans without the trace, for a caller
    whose own ``dlopen`` of the plan is the real loader's answer (:mod:`tms_autopreload.inprocess`);
    ``loader_ok`` is then None. The verdict is LOADS (with its plan) or REJECTED.
    """
    cannot = unwritable(build.path)
    if cannot is not None:
        return Verdict(build, REJECTED, cannot, CAUSE_UNSAFE_PATH,
                       fix="install torch_memory_saver under a path without spaces or colons")
    entry, entry_dir = preload_entry(build.path)
    kids = children or []
    written: list[Option] = []  # the bindings written so far: up to the chosen one, else all
    why_not: list[str] = []
    chosen = None
    for option in options(build, runtime, env, loader, package_dir, entry, entry_dir):
        written.append(option)
        why = option.refused or option.predict(build, runtime, loader, kids)
        if why is None:
            chosen = option
            break
        why_not.append(f"{option.binding}: {why}")
    planned = _plan_of(build, runtime, env, chosen or written[0], why_not if chosen else [])
    if not trace_it:
        if chosen is None:
            return Verdict(build, REJECTED, "; ".join(why_not), CAUSE_NO_BINDING, fix=no_binding_fix(written))
        return Verdict(build, LOADS, "chosen without a loader trace: to be loaded in-process", plan=planned)
    planned_env = {**env, **planned.changes()}
    added = added_dirs(env, planned.ld_library_path or "")
    # The children whose own problem is plain before the interpreter's trace (a conda interpreter's: its
    # DT_RPATH) are traced beside it; those only the closure can decide, after it.
    decided = {kid[0]: own_problem(loader, kid, added, None) for kid in kids}
    beside = [path for path, own in decided.items() if own]
    collect = start_traces([executable, *beside], planned_env)
    try:
        ahead = read_ahead(build, loader, planned) if None in decided.values() else {}
    finally:
        trace, *beside_traces = collect()  # in order: the interpreter, then each of ``beside``
    if isinstance(trace, OSError):
        raise trace  # the interpreter itself cannot be started: survey's error, not this build's
    judged = judge(build, planned, trace)
    if judged.plan is not None:
        memo: "list[set[str]]" = []

        def closure() -> "set[str]":
            if not memo:
                memo.append(hook_closure(build, trace, ahead))
            return memo[0]

        after = [kid[0] for kid in kids if decided[kid[0]] is None and own_problem(loader, kid, added, closure)]
        answers = dict(zip(beside, beside_traces, strict=True))
        answers.update(zip(after, run_traces(after, planned_env) if after else [], strict=True))
        traced = [(kid[0], answers[kid[0]]) for kid in kids if kid[0] in answers]  # in the children's order
        child_reason = judge_children(build, traced) if traced else None
        if child_reason is not None:
            judged = Verdict(build, REJECTED, child_reason, CAUSE_CHILD_FAILS, loader_ok=False)
    if judged.plan is not None or chosen is not None:
        return judged
    # Nothing was predicted to hold: the loader's words for the plain plan, then why each other binding cannot.
    reasons = [judged.reason, *why_not[1:]]
    return Verdict(build, REJECTED, "; ".join(reasons),
                   CAUSE_NO_DRIVER if judged.cause == CAUSE_NO_DRIVER else CAUSE_NO_BINDING,
                   loader_ok=judged.loader_ok, fix=judged.fix or no_binding_fix(written))
