"""``tms-autopreload env``: the plan's variables, as ``export`` lines for this shell or JSON for Ray.

The JSON is for a Ray ``runtime_env``."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from ..decision import survey
from ..decision import Report
from .caller_env import before_plan, own_plan
from .exitpolicy import EXIT_NO_PLAN, EXIT_OK, plan_or_fail
from . import command, note_link, note_not_started

__all__ = ["configure_parser", "execute"]


def configure_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = command(sub, "env", execute, "print `export` lines for eval (or --json for a Ray runtime_env)")
    p.add_argument("--json", action="store_true",
                   help='print {"LD_PRELOAD": ..., ...} for a Ray runtime_env: the plan of this environment without '
                        "this shell's own LD_PRELOAD and LD_LIBRARY_PATH, which a worker started from its raylet's "
                        "environment does not have (where only they find the driver or the runtime, there is no such "
                        "plan: send the flag instead)")


def execute(args: argparse.Namespace) -> int:
    """The plan's variables, each with the whole value the plan gives it (evaluating them twice changes
    nothing). ``export`` lines are for this shell, so they keep its other entries, and set what a process
    applying the plan sets (:meth:`..attempt.Plan.environment`: its record too); ``--json`` is for a Ray
    ``runtime_env``, whose workers start from their raylet's environment, not this shell's: the plan of an
    environment without this shell's ``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` (:func:`..caller_env.own_plan`),
    with no ``${VAR}`` (Ray turns an unset one into an empty entry, which the loader reads as the
    current directory)."""
    report = own_plan() if args.json else survey(before_plan())
    if args.json and report.plan is None:
        print(f"tms-autopreload: {_json_refused(report)}", file=sys.stderr)
        return EXIT_NO_PLAN
    plan = plan_or_fail(report)
    if plan is None:
        return EXIT_NO_PLAN
    if args.json:
        print(json.dumps(plan.changes()))
    else:
        for k, v in plan.environment().items():
            print(f"export {k}={shlex.quote(v)}")
    note_link(report, "env")
    if not args.json:  # the workers of a Ray job start on their own nodes, from their own files
        note_not_started("env")
    return EXIT_OK


def _json_refused(report: Report) -> str:
    """Why ``env --json`` has no plan: the error of an environment without this shell's ``LD_PRELOAD`` and
    ``LD_LIBRARY_PATH``. Where this shell has a plan, those variables are what finds its driver or runtime:
    the workers, which start from their raylet's environment, lack them, and the fix is theirs, not the
    error's (which speaks of a node without them)."""
    here = survey(before_plan())
    head = ("for a process started without this shell's LD_PRELOAD and LD_LIBRARY_PATH (a Ray worker, from its "
            "raylet's environment)")
    if here.plan is None or report.failure is None:
        return f"{head}: {report.error}"
    from .caller_env import PLAN_VARS
    from ..errors import PATH_SHOWN, shown

    own = " and ".join(f"{name}={shown(os.environ[name], PATH_SHOWN)}" for name in PLAN_VARS if os.environ.get(name))
    return (f"{head}: {report.failure.message}. This shell has a plan only through its own {own or 'variables'}, "
            f"which a worker started from its raylet's environment does not have. Fix: send the flag instead of the "
            f"variables (runtime_env={{\"env_vars\": {{\"TMS_AUTOPRELOAD\": \"1\"}}}}: each worker resolves "
            f"on its own node, with the environment its raylet gives it), and start each node's raylet (`ray start`) "
            f"from a shell whose LD_LIBRARY_PATH finds the driver and the runtime, as this one does")
