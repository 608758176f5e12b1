"""The real loader's answer for a planned start, judged: one rule (:func:`refused`) for the interpreter's
trace, the non-Python children's and the builds ``doctor`` traces beyond the plan.

A trace says a start fails where a name is not found, the loader gives an error or a non-zero status, or
it skips the build as a preload entry (it goes on without a preload it cannot load: for the user's other
entries that is theirs, not this build's). The interpreter's trace must also show the build preloaded and
its runtime bound to the library this process uses (:func:`judge`).
"""

import os

from . import compose_preload, same_file
from .builds import Build
from .errors import CAUSE_DOES_NOT_LOAD, CAUSE_NO_DRIVER, CAUSE_NOT_PRELOADED, CAUSE_TWO_RUNTIMES
from .ldso import loaded_as
from .results import LOADS, REJECTED, Plan, Verdict
from .runtime import install_hint
from .sonames import DRIVER_SONAME
from .trace import Trace, run_trace

TYPE_CHECKING = False  # typing and collections cost milliseconds on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping

__all__ = ["refused", "judge", "judge_children", "trace_the_rest"]

_NO_DRIVER = f"the NVIDIA driver library {DRIVER_SONAME} is not on this node"


def refused(build: Build, trace: Trace) -> "str | None":
    """Why the real loader would not start the traced program with ``build`` preloaded, in its words; None
    when it would."""
    skipped = trace.skip_of(build.name)
    errors = list(trace.errors) + ([f"the loader skipped it as a preload: {skipped}"] if skipped else [])
    if trace.missing or errors or trace.status:
        return "; ".join([f"{n} => not found" for n in trace.missing] + errors) or trace.reason()
    return None


def judge(build: Build, plan: Plan, trace: Trace) -> Verdict:
    """Step 5: the real loader's answer for ``plan``: accepted (LOADS, with the plan) only when everything
    resolves, the build is preloaded, and its runtime binds to the library this process uses."""
    runtime = plan.runtime
    reason = refused(build, trace)
    if reason is not None:
        if DRIVER_SONAME in trace.missing:
            return Verdict(build, REJECTED, f"{_NO_DRIVER} (no driver installed, not mounted into this container, "
                           f"or hidden by LD_LIBRARY_PATH); loader: {reason}", CAUSE_NO_DRIVER, loader_ok=False,
                           fix="install the NVIDIA driver (or expose it to the container), or do not set the "
                               "flag on nodes without a GPU")
        fix = install_hint(runtime.kind, runtime.major) if runtime.soname in trace.missing else None
        return Verdict(build, REJECTED, reason, CAUSE_DOES_NOT_LOAD, loader_ok=False, fix=fix)
    # A bare-name preload entry shows as "name => path", a path entry as "path".
    if not any(same_file(p, build.path) for p in (*trace.loaded, *trace.resolved.values())
               if os.path.basename(p) == build.name):
        return Verdict(build, REJECTED, "the loader did not preload it (no error given)", CAUSE_NOT_PRELOADED,
                       loader_ok=False)
    if build.kind == "driver":
        return Verdict(build, LOADS, "loads", loader_ok=True, plan=plan)
    # Listed as "soname => path" when found by a search; as a bare path when the name matched an
    # object LD_PRELOAD had loaded (by its DT_SONAME).
    bound = trace.resolved.get(runtime.soname) or loaded_as(runtime.soname, [(p, p) for p in trace.loaded])
    if runtime.library is not None and not same_file(bound, runtime.library):
        return Verdict(build, REJECTED, f"its {runtime.soname} would bind to {bound}, not to {runtime.library} "
                       f"that this process uses: two runtime copies", CAUSE_TWO_RUNTIMES, loader_ok=True)
    return Verdict(build, LOADS, f"loads; binds {runtime.soname} to {bound}", loader_ok=True, plan=plan)


def judge_children(build: Build, traces: "list[tuple[str, Trace | OSError]]") -> "str | None":
    """Why a non-Python child would not start under the plan, in the real loader's words, or None."""
    for child, trace in traces:
        if isinstance(trace, OSError):
            continue
        why = refused(build, trace)
        if why is not None:
            return f"a non-Python child ({child}) would not start: {why}"
    return None


def trace_the_rest(verdicts: "dict[int, Verdict]", env: "Mapping[str, str]", plan: Plan | None, exe: str) -> None:
    """For ``doctor``: give every readable candidate not traced yet the loader's answer."""
    probe_env = {**env, **(plan.changes() if plan else {})}
    for v in verdicts.values():
        if v.loader_ok is None and v.build.info is not None and v.build.problem is None and v.build.refusal is None:
            probe_env["LD_PRELOAD"] = compose_preload(env.get("LD_PRELOAD", ""), v.build.path)
            try:
                t = run_trace(exe, probe_env)
            except OSError:
                continue
            why = refused(v.build, t)
            v.loader_ok = why is None
            if why is not None:
                v.reason = f"{v.reason}; loader: {why}"
