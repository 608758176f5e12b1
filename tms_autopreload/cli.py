"""``tms-autopreload`` (also ``python -m tms_autopreload``): explain, print or apply the plan.

The parser and the dispatch; each command's work is its own module's, and how a command ends on a
failed write or a signal is :mod:`tms_autopreload.exitpolicy`'s. The exit codes are :data:`EXIT_CODES`,
shown by ``--help``.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time

from .applied import before_plan, own_plan
from .exitpolicy import INTERRUPTS, WriteError, guarded_stdout, signal_of, unwinding_signals
from .plan import survey
from .results import Report

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from .results import Plan

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_NO_PLAN", "EXIT_USAGE", "EXIT_CODES"]

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_USAGE = 2
# One table, shown by --help and copied into the README's (a test compares them).
EXIT_CODES = (
    ("0", "the plan exists, or the command did what was asked"),
    ("1", "no plan (the reason is printed), a failing check (doctor: a driver that cannot run torch's CUDA too), "
          "a kernel action refused or failed, a write error"),
    ("2", "usage error (an unreadable doctor --nodes FILE too), a tool the command needs (Ray, jupyter_client) "
          "is not installed, or doctor --ray reached no cluster"),
    ("78", "the start-up hook of a flagged process: no plan (EX_CONFIG), before user code runs"),
    ("126/127", "run: the command could not be executed / was not found"),
    ("129/130/143", "ended by SIGHUP / SIGINT (Ctrl-C) / SIGTERM; doctor --deep first ends its child and "
                    "deletes its log (130 also: the start-up hook interrupted while resolving)"),
)


def _plan_or_fail(report: Report) -> "Plan | None":
    """The report's plan, its warnings said; None, its error said, when there is none."""
    if report.plan is None:
        print(f"tms-autopreload: {report.error}", file=sys.stderr)
        return None
    for w in report.warnings + report.plan.warnings:
        print(f"tms-autopreload: warning: {w}", file=sys.stderr)
    return report.plan


def _cmd_doctor(args: argparse.Namespace) -> int:
    if args.deep:
        return _deep(args)
    if args.ray:
        return _ray(args)
    if args.nodes is not None:
        return _nodes(args)
    from . import doctor

    env = before_plan()
    doc = doctor.document(survey(env, check_all=True), env)
    print(json.dumps(doc, indent=2) if args.json else doctor.text(doc))
    return EXIT_OK if doc["ok"] else EXIT_NO_PLAN


def _ray(args: argparse.Namespace) -> int:
    """``doctor --ray``: one row per node of a Ray cluster, from a real worker on each."""
    from .preflight import NoRay, Unreachable, UsageError, check_address, check_runtime_env, run

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
    from .doctor import versions

    return _show_nodes(rows, args, f" ({time.monotonic() - start:.1f} s)", versions())


def _nodes(args: argparse.Namespace) -> int:
    """``doctor --nodes FILE|-``: the same rows from ``doctor --json`` documents that every node printed."""
    from .rows import document_rows

    try:
        if args.nodes == "-":
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
    from . import rows as table

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
    from .bindings import Evidence, check, under_test

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
    env, hook, under = under_test(report.plan, args.mode, args.as_is, None if args.as_is else env)
    ev = check(env, hook, report.runtime.library, module=args.import_, executable=report.executable,
               in_process=args.mode == "dlopen" and not args.as_is, bound_fix=_bound_fix(report, args.as_is))
    print(json.dumps(ev.to_dict(), indent=2) if args.json else ev.text(under))
    return EXIT_OK if ev.ok else EXIT_NO_PLAN


def _bound_fix(report: Report, as_is: bool) -> "str | None":
    """``doctor --deep``'s fix where two runtime copies take bindings: the override that split the hook from
    torch, or (``--as-is``) the environment that is not the plan's."""
    from .plan import split_fix
    from .runtime import split_from_torch

    if report.runtime is not None and split_from_torch(report.runtime):
        return split_fix(os.environ)
    if as_is:
        return "start with the plan instead of this environment: set the flag, or eval \"$(tms-autopreload env)\""
    return None


def _cmd_which(args: argparse.Namespace) -> int:
    plan = _plan_or_fail(survey(before_plan()))
    if plan is None:
        return EXIT_NO_PLAN
    print(plan.build)
    return EXIT_OK


def _cmd_env(args: argparse.Namespace) -> int:
    """The plan's variables, each with the whole value the plan gives it (evaluating them twice changes
    nothing). ``export`` lines are for this shell, so they keep its other entries, and set what a process
    applying the plan sets (:meth:`.results.Plan.environment`: its record too); ``--json`` is for a Ray
    ``runtime_env``, whose workers start from their raylet's environment, not this shell's: the plan of an
    environment without this shell's ``LD_PRELOAD`` and ``LD_LIBRARY_PATH`` (:func:`.applied.own_plan`),
    with no ``${VAR}`` (Ray turns an unset one into an empty entry, which the loader reads as the
    current directory)."""
    report = own_plan() if args.json else survey(before_plan())
    if args.json and report.plan is None:
        print(f"tms-autopreload: {_json_refused(report)}", file=sys.stderr)
        return EXIT_NO_PLAN
    plan = _plan_or_fail(report)
    if plan is None:
        return EXIT_NO_PLAN
    if args.json:
        print(json.dumps(plan.changes()))
    else:
        for k, v in plan.environment().items():
            print(f"export {k}={shlex.quote(v)}")
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
    from .applied import PLAN_VARS
    from .errors import PATH_SHOWN, shown

    own = " and ".join(f"{name}={shown(os.environ[name], PATH_SHOWN)}" for name in PLAN_VARS if os.environ.get(name))
    return (f"{head}: {report.failure.message}. This shell has a plan only through its own {own or 'variables'}, "
            f"which a worker started from its raylet's environment does not have. Fix: send the flag instead of the "
            f"variables (runtime_env={{\"env_vars\": {{\"TMS_AUTOPRELOAD\": \"1\"}}}}: each worker resolves "
            f"on its own node, with the environment its raylet gives it), and start each node's raylet (`ray start`) "
            f"from a shell whose LD_LIBRARY_PATH finds the driver and the runtime, as this one does")


def _cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        args.parser.error("give a command: tms-autopreload run -- CMD [ARGS...]")
    if not command[0]:
        args.parser.error("the command name is empty (''): give a command: tms-autopreload run -- CMD [ARGS...]")
    env = before_plan()
    plan = _plan_or_fail(survey(env))
    if plan is None:
        return EXIT_NO_PLAN
    env.update(plan.environment())
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"tms-autopreload run: {command[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"tms-autopreload run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126


def _location(args: argparse.Namespace) -> dict:
    return {"user": args.user, "sys_prefix": args.sys_prefix, "prefix": args.prefix}


def _cmd_kernel_install(args: argparse.Namespace) -> int:
    from . import kernelspec

    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            args.parser.error(f"--env wants NAME=VALUE, got {item!r}")
        env[name] = value
    display = args.display_name or f"Python {sys.version_info.major}.{sys.version_info.minor} (tms-autopreload)"
    return _kernel(args, lambda: kernelspec.install(args.name, display, env, **_location(args)),
                   lambda where: f"installed kernel {os.path.basename(where)!r} ({display}) in {where}")


def _cmd_kernel_uninstall(args: argparse.Namespace) -> int:
    from . import kernelspec

    return _kernel(args, lambda: kernelspec.uninstall(args.name, **_location(args)),
                   lambda where: f"removed kernel {os.path.basename(where)!r} from {where}")


def _kernel(args: argparse.Namespace, action: "Callable[[], str]", done: "Callable[[str], str]") -> int:
    """Run one kernel action and map its exceptions to exit codes: usage 2, refused or failed 1."""
    from . import kernelspec

    try:
        where = action()
    except kernelspec.InvalidRequest as exc:
        args.parser.error(str(exc))
    except kernelspec.MissingJupyter as exc:
        print(f"tms-autopreload kernel: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (kernelspec.KernelNotFound, kernelspec.NotOurs, OSError) as exc:
        print(f"tms-autopreload kernel: {exc}", file=sys.stderr)  # an Error's str: its message and its fix
        return EXIT_NO_PLAN
    print(done(where))
    return EXIT_OK


def _directory(value: str) -> str:
    """An argparse type: a directory argument may not be empty (``--prefix ""`` is no prefix at all)."""
    if not value:
        raise argparse.ArgumentTypeError("give a directory (an empty value would mean the system-wide one)")
    return value


# doctor's options that belong to one of its modes: (option, dest, the mode's option)
_DOCTOR_MODE_OPTIONS = (("--import", "import_", "--deep"), ("--as-is", "as_is", "--deep"),
                        ("--mode", "mode", "--deep"), ("--address", "address", "--ray"),
                        ("--runtime-env", "runtime_env", "--ray"), ("--timeout", "timeout", "--ray"))
_DOCTOR_DEFAULTS = {"import_": "torch", "as_is": False, "mode": "exec", "address": "auto", "runtime_env": None,
                    "timeout": 60.0}


def _check_doctor(args: argparse.Namespace) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .kernelspec import DEFAULT_NAME

    parser = argparse.ArgumentParser(
        prog="tms-autopreload",
        description="Choose the torch_memory_saver LD_PRELOAD build that fits this process's CUDA runtime.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {code:<12} {meaning}" for code, meaning in EXIT_CODES))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def command(parent: "argparse._SubParsersAction[argparse.ArgumentParser]", name: str,
                func: "Callable[[argparse.Namespace], int] | None", help: str) -> argparse.ArgumentParser:
        p = parent.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
        p.set_defaults(func=func, parser=p)
        return p

    p = command(sub, "doctor", _cmd_doctor, "explain what is installed, what loads, and what is chosen")
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
    command(sub, "which", _cmd_which, "print the chosen build's path")
    p = command(sub, "env", _cmd_env, "print `export` lines for eval (or --json for a Ray runtime_env)")
    p.add_argument("--json", action="store_true",
                   help='print {"LD_PRELOAD": ..., ...} for a Ray runtime_env: the plan of this environment without '
                        "this shell's own LD_PRELOAD and LD_LIBRARY_PATH, which a worker started from its raylet's "
                        "environment does not have (where only they find the driver or the runtime, there is no such "
                        "plan: send the flag instead)")
    p = command(sub, "run", _cmd_run, "exec a command with the planned environment")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")

    p = command(sub, "kernel", None, "install or remove a Jupyter kernel of this interpreter that starts hooked")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    install = command(actions, "install", _cmd_kernel_install,
                      "write a kernelspec that runs this interpreter with TMS_AUTOPRELOAD=1 (never over a "
                      "kernel this command did not write)")
    uninstall = command(actions, "uninstall", _cmd_kernel_uninstall, "remove a kernelspec this command wrote")
    for p in (install, uninstall):
        p.add_argument("--name", default=DEFAULT_NAME,
                       help=f"kernel name, as Jupyter allows it: ASCII letters, digits, - . _ (default {DEFAULT_NAME})")
    install.add_argument("--display-name", help="name shown in Jupyter")
    install.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                         help="another variable for the kernel's environment (repeatable); one that turns the "
                              "hook off is refused")
    for p in (install, uninstall):
        where = p.add_mutually_exclusive_group()
        where.add_argument("--user", action="store_true", help="this user's Jupyter data directory")
        where.add_argument("--sys-prefix", action="store_true", help="this environment (sys.prefix)")
        where.add_argument("--prefix", type=_directory, help="PREFIX/share/jupyter/kernels")
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked: a usage error exits 2 here, as argparse's own do."""
    args = build_parser().parse_args(argv)
    if args.cmd == "doctor":
        _check_doctor(args)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        with guarded_stdout():  # --help and --version print while parsing
            return _run(parse(argv))
    except WriteError as exc:
        print(f"tms-autopreload: write error: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN


def _run(args: argparse.Namespace) -> int:
    """The command; a signal ends it through its finally blocks, with 128+N and one line.

    SIGTERM and SIGHUP end doctor --deep as Ctrl-C does (:func:`.exitpolicy.unwinding_signals`):
    through the finally blocks that end its child's process group and delete the binding log.
    """
    deep = args.cmd == "doctor" and args.deep
    with unwinding_signals(deep):
        try:
            code: int = args.func(args)
            sys.stdout.flush()
            return code
        except INTERRUPTS as exc:
            done = "; its child was ended and its binding log deleted" if deep else ""
            signum = signal_of(exc)
            print(f"tms-autopreload {args.cmd}: interrupted by {signum.name}{done}", file=sys.stderr)
            return 128 + signum
