"""``tms-autopreload doctor``: what is installed, what loads, what is chosen, and why.

``--deep``: where the loader binds the hook; ``--ray`` and ``--nodes``: every node of a cluster, one row each."""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
import time

from ...environment import APPLY_ENV, GENERIC_FLAG, is_tms_entry, same_file, split_preload
from ...decision import survey
from ..caller_env import before_plan, plan_applied
from ..exitpolicy import EXIT_NO_PLAN, EXIT_OK, EXIT_USAGE, say_warnings
from .. import command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ...decision import Report

__all__ = ["configure_parser", "execute", "check"]


# doctor's options that belong to one of its modes: (option, dest, the mode's option)
_DOCTOR_MODE_OPTIONS = (("--import", "import_", "--deep"), ("--as-is", "as_is", "--deep"),
                        ("--mode", "mode", "--deep"), ("--address", "address", "--ray"),
                        ("--runtime-env", "runtime_env", "--ray"), ("--timeout", "timeout", "--ray"))


_DOCTOR_DEFAULTS = {"import_": "torch", "as_is": False, "mode": "exec", "address": "auto", "runtime_env": None,
                    "timeout": 60.0}


def interrupted(args: argparse.Namespace) -> "str | None":
    """What an interrupt undoes: ``--deep``'s child, whose process group is ended, and its binding log."""
    return "; its child was ended and its binding log deleted" if args.deep else None


def configure_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    """``doctor``'s parser: its modes (plain, ``--deep``, ``--ray``, ``--nodes``) and each mode's options."""
    p = command(sub, "doctor", execute, "explain what is installed, what loads, and what is chosen", check,
                interrupted)
    p.add_argument("--json", action="store_true", help="machine-readable report")
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--deep", action="store_true",
                       help="also prove the binding: import a module in a child under the plan and show where the "
                            "loader binds each reference to the hook's symbols (a few seconds for torch)")
    modes.add_argument("--ray", action="store_true",
                       help="ask every node of a Ray cluster, in a real worker started with the flag, and show one "
                            "row each")
    modes.add_argument("--nodes", metavar="FILE",
                       help="read the `doctor --json` documents every node printed (srun --label output, or "
                            "documents one after another; - for stdin) and show one row each, as --ray does")
    p.add_argument("--import", dest="import_", metavar="MODULE", help="with --deep: the module to import "
                                                                      "(default: torch)")
    p.add_argument("--as-is", action="store_true", default=None,
                   help="with --deep: check this environment as it is (your own LD_PRELOAD), not the plan")
    p.add_argument("--mode", choices=("exec", "dlopen"),
                   help="with --deep: the plan as LD_PRELOAD gives it (exec, default), or as "
                        "TMS_AUTOPRELOAD_MODE=dlopen loads it into a running interpreter")
    p.add_argument("--address", help="with --ray: a running cluster's address, HOST:PORT or ray://HOST:PORT "
                                     "(default: auto, as ray's CLI); never one that starts a new cluster (local)")
    p.add_argument("--runtime-env", metavar="JSON", help="with --ray: the job's runtime_env, merged into the workers'")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="with --ray: the preflight ends within S seconds (default 60); silent nodes are failing rows")
    p.add_argument("--all-nodes", action="store_true",
                   help="with --ray or --nodes: nodes that offer Ray no GPU count too (by default they are shown, "
                        "not counted)")


def check(args: argparse.Namespace) -> None:
    """Refuse options that cannot go together (usage error, exit 2), then fill in the defaults.

    Each mode's options default to None in the parser, so that "given" and "left at its default"
    can be told apart. --deep and --ray are a mutually exclusive group of the parser itself.
    """
    misplaced = [f"{option} only with {mode}" for option, dest, mode in _DOCTOR_MODE_OPTIONS
                 if getattr(args, dest) not in (None, False) and not getattr(args, mode[2:])]
    if args.all_nodes and not (args.ray or args.nodes is not None):
        misplaced.append("--all-nodes only with --ray or --nodes")
    if misplaced:
        args.parser.error("; ".join(misplaced))
    if args.as_is and args.mode == "dlopen":
        args.parser.error("--as-is checks the environment as it is; --mode dlopen changes it: give one of them")
    for dest, value in _DOCTOR_DEFAULTS.items():
        if getattr(args, dest) is None:
            setattr(args, dest, value)


def execute(args: argparse.Namespace) -> int:
    """``doctor`` in the mode its options chose."""
    if args.deep:
        return _deep(args)
    if args.ray:
        return _ray(args)
    if args.nodes is not None:
        return _nodes(args)
    from .document import document, text

    env = before_plan()
    doc = document(survey(env, check_all=True), env)
    named = _named_elsewhere(doc["plan"]["build"] if doc["plan"] else None)
    if named:
        doc["warnings"].append(named)
    doc["warnings"] += _said_of_variables()
    print(json.dumps(doc, indent=2) if args.json else text(doc))
    return EXIT_OK if doc["ok"] else EXIT_NO_PLAN


def _said_of_variables() -> "list[str]":
    """What a flagged start from this shell says of its variables (:func:`tms_autopreload.startup.start_warnings`),
    and, where the kill switch is on, that such a start runs unhooked and how to turn it off: a stop's way out
    tells the user to export it for the rest of the shell, and the start then says nothing."""
    from ...environment import DISABLE_VAR, kill_switch
    from ...startup import start_warnings

    said = start_warnings(os.environ)
    if kill_switch(os.environ)[0]:
        said.append(f"the kill switch is on in this shell ({DISABLE_VAR}={os.environ[DISABLE_VAR]!r}): flagged starts "
                    f"from it run unhooked and say nothing, whatever the flags say. To turn it off: "
                    f"`unset {DISABLE_VAR}`")
    return said


def _named_elsewhere(chosen: "str | None") -> "str | None":
    """The warning where this shell's own ``LD_PRELOAD`` names a torch_memory_saver build other than the one
    chosen for it (a launcher's pick by file name, exported): every unflagged program the shell starts
    preloads that build, which dies in the loader where its runtime is missing and forwards to another
    runtime where it is not. The fix starts with the shell's builtin, as it must where programs die. Nothing
    where a plan put the build there (another environment's, whose record says so: the command answers for the
    environment from before it)."""
    if plan_applied(os.environ):
        return None
    preload = split_preload(os.environ.get("LD_PRELOAD", ""))
    others = [e for e in preload if is_tms_entry(e) and not same_file(e, chosen)]
    if not others:
        return None
    return (f"this shell's LD_PRELOAD names {', '.join(others)}, not the build chosen here"
            f"{f' ({chosen})' if chosen else ''}: every program started from it without the flag preloads that "
            f"build. Fix: `unset LD_PRELOAD`, then set the flag (`export {GENERIC_FLAG}=1`), or `{APPLY_ENV}`")


def _ray(args: argparse.Namespace) -> int:
    """``doctor --ray``: one row per node of a Ray cluster, from a real worker on each."""
    from .ray_cluster import NoRay, Unreachable, UsageError, check_address, check_runtime_env, run

    try:
        check_address(args.address)
        job_env = check_runtime_env(args.runtime_env)
        if not args.timeout > 0:
            raise UsageError(f"--timeout must be a positive number of seconds, not {args.timeout:g}")
    except UsageError as exc:
        print(f"tms-autopreload doctor --ray: {exc}", file=sys.stderr)
        return EXIT_USAGE
    tty = sys.stderr.isatty()

    def progress(answered: int, total: int) -> None:
        if tty:
            print(f"\r{answered}/{total} nodes answered", end="", file=sys.stderr, flush=True)

    start = time.monotonic()
    try:
        rows = run(args.address, job_env, args.timeout, progress)
    except (NoRay, Unreachable, UsageError) as exc:
        if tty:
            print(file=sys.stderr)
        print(f"tms-autopreload doctor --ray: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if tty:
        print(file=sys.stderr)
    from .document import versions

    return _show_nodes(rows, args, f" ({time.monotonic() - start:.1f} s)", versions())


def _nodes(args: argparse.Namespace) -> int:
    """``doctor --nodes FILE|-``: the same rows from ``doctor --json`` documents that every node printed."""
    from .node_table import document_rows

    try:
        if args.nodes == "-":
            if sys.stdin is None:  # started with its standard input closed (<&-)
                raise OSError(errno.EBADF, "standard input is closed")
            data = sys.stdin.buffer.read()
        else:
            with open(args.nodes, "rb") as f:
                data = f.read()
    except OSError as exc:
        print(f"tms-autopreload doctor --nodes: cannot read {args.nodes}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    return _show_nodes(document_rows(data.decode("utf-8", "replace")), args, "")


def _show_nodes(rows: "list[dict]", args: argparse.Namespace, took: str,
                here: "dict[str, str | None] | None" = None) -> int:
    """The per-node table (or ``--json`` document), then the notes (nodes whose versions differ from
    ``here``'s) and the summary line; exit 0 only when the preflight passed (:func:`.rows.passed`)."""
    from . import node_table as table

    lines = table.summary(rows, here, args.all_nodes)
    lines[0] += took
    ok = table.passed(rows, args.all_nodes)
    if args.json:
        print(json.dumps({"ok": ok, "nodes": rows, "summary": lines[0], "notes": lines[1:]}, indent=2))
    else:
        print(table.render(rows))
        print("\n".join([*lines[1:], lines[0]]))  # the notes in node order, the summary last
    return EXIT_OK if ok else EXIT_NO_PLAN


def _deep(args: argparse.Namespace) -> int:
    """``doctor --deep``: where the loader binds the module's references to the hook's symbols."""
    from .deep import Evidence, check, under_test

    env = before_plan()
    report = survey(env)
    if report.plan is None or report.runtime is None or report.runtime.library is None:
        ev = Evidence(args.import_, report.plan.build if report.plan else None,
                      report.runtime.library if report.runtime else None)
        ev.error = report.error or "the runtime library this process binds was not found"
        if args.json:
            print(json.dumps(ev.to_dict(), indent=2))
        else:
            print(f"tms-autopreload: {ev.error}", file=sys.stderr)
        return EXIT_NO_PLAN
    say_warnings(report)
    env, hook, under = under_test(report.plan, args.mode, args.as_is, None if args.as_is else env)
    ev = check(env, hook, report.runtime.library, module=args.import_, executable=report.executable,
               in_process=args.mode == "dlopen" and not args.as_is, bound_fix=_bound_fix(report, args.as_is))
    print(json.dumps(ev.to_dict(), indent=2) if args.json else ev.text(under))
    return EXIT_OK if ev.ok else EXIT_NO_PLAN


def _bound_fix(report: Report, as_is: bool) -> "str | None":
    """``doctor --deep``'s fix where two runtime copies take bindings: the override that split the hook from
    torch, or (``--as-is``) the environment that is not the plan's."""
    from ...decision import split_fix
    from ...runtime import split_from_torch

    if report.runtime is not None and split_from_torch(report.runtime):
        return split_fix(os.environ)
    if as_is:
        return f"start with the plan instead of this environment: set the flag, or `{APPLY_ENV}`"
    return None
