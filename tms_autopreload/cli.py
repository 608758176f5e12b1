"""``tms-autopreload`` (also ``python -m tms_autopreload``): explain, print or apply the plan.

The exit codes are :data:`EXIT_CODES`, shown by ``--help``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import signal
import sys
import time

from .plan import Report, survey

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

__all__ = ["main", "build_parser", "EXIT_OK", "EXIT_NO_PLAN", "EXIT_USAGE", "EXIT_CODES"]

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_USAGE = 2
# One table, shown by --help and copied into the README's (a test compares them).
EXIT_CODES = (
    ("0", "the plan exists, or the command did what was asked"),
    ("1", "no plan (the reason is printed), a failing check, a kernel action refused or failed, a write error"),
    ("2", "usage error (an unreadable doctor --nodes FILE too), or a tool the command needs (Ray, "
          "jupyter_client) is not installed"),
    ("78", "the start-up hook of a flagged process: no plan (EX_CONFIG), before user code runs"),
    ("126/127", "run: the command could not be executed / was not found"),
    ("129/130/143", "ended by SIGHUP / SIGINT (Ctrl-C) / SIGTERM; doctor --deep first ends its child and "
                    "deletes its log (130 also: the start-up hook interrupted while resolving)"),
)


def _runtime_line(report: Report) -> str:
    rt = report.runtime
    if rt is None:
        return "runtime:  not decided"
    lib = f"{rt.library} ({rt.library_rule})" if rt.library else "not found"
    return f"runtime:  {rt.describe()}\nlibrary:  {rt.soname} -> {lib}"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def _interposes(report: Report) -> "dict[str, list[str] | None]":
    """Per candidate path: what it defines that the process's runtime library defines (None: unknown)."""
    from .builds import interposed
    from .elf import ElfError

    library = report.runtime.library if report.runtime else None
    out: "dict[str, list[str] | None]" = {}
    for v in report.verdicts:
        try:
            out[v.build.path] = list(interposed(v.build.path, library)) if library and v.build.info else None
        except (OSError, ElfError):
            out[v.build.path] = None
    return out


def _doctor_text(report: Report, interposes: "dict[str, list[str] | None]") -> str:
    out = [f"python:   {report.executable}",
           f"package:  {report.package_dir or 'torch_memory_saver not found'}",
           _runtime_line(report), ""]
    if report.verdicts:
        rows = [("candidate", "built for", "interposes", "loads?", "verdict", "why")]
        for v in report.verdicts:
            loads = {True: "yes", False: "NO", None: "-"}[v.loads]
            symbols = interposes.get(v.build.path)
            rows.append((v.build.name, v.build.target(), ", ".join(symbols) if symbols else "-", loads,
                         v.status.upper(), v.reason))
        out += [_table(rows), ""]
    for w in report.warnings + (report.plan.warnings if report.plan else ()):
        out.append(f"warning: {w}")
    if report.plan is not None:
        out.append(f"chosen:   {report.plan.build}")
        out += [f"set:      {k}={v}" for k, v in report.plan.changes().items()]
    else:
        out.append(f"NO PLAN:  {report.error}")
    return "\n".join(out)


def _plan_or_fail(report: Report) -> bool:
    if report.plan is None:
        print(f"tms-autopreload: {report.error}", file=sys.stderr)
        return False
    for w in report.warnings + report.plan.warnings:
        print(f"tms-autopreload: warning: {w}", file=sys.stderr)
    return True


def doctor_document(report: Report) -> dict:
    """The ``doctor --json`` document: the survey, with what each candidate interposes, and which node
    and Python said it (``doctor --nodes`` reads many nodes' documents together)."""
    interposes = _interposes(report)
    doc = {"hostname": os.uname().nodename, "python": sys.version.split()[0], **report.to_dict()}
    for candidate in doc["candidates"]:
        candidate["interposes"] = interposes.get(candidate["path"])
    return doc


def _cmd_doctor(args: argparse.Namespace) -> int:
    if args.deep:
        return _deep(args)
    if args.ray:
        return _ray(args)
    if args.nodes is not None:
        return _nodes(args)
    report = survey(check_all=True)
    if args.json:
        print(json.dumps(doctor_document(report), indent=2))
    else:
        print(_doctor_text(report, _interposes(report)))
    return EXIT_OK if report.plan else EXIT_NO_PLAN


def _ray(args: argparse.Namespace) -> int:
    """``doctor --ray``: one row per node of a Ray cluster, from a real worker on each."""
    from .preflight import NoRay, Unreachable, run

    try:
        job_env = json.loads(args.runtime_env) if args.runtime_env else None
        if job_env is not None and not isinstance(job_env, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        print(f"tms-autopreload doctor --ray: --runtime-env is not a JSON object ({exc})", file=sys.stderr)
        return EXIT_USAGE
    tty = sys.stderr.isatty()

    def progress(answered: int, total: int) -> None:
        if tty:
            print(f"\r{answered}/{total} nodes answered", end="", file=sys.stderr, flush=True)

    start = time.monotonic()
    try:
        rows = run(args.address, job_env, args.timeout, progress)
    except NoRay as exc:
        print(f"tms-autopreload doctor --ray: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as exc:
        print(f"tms-autopreload doctor --ray: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN
    if tty:
        print(file=sys.stderr)
    return _show_nodes(rows, args.json, f" ({time.monotonic() - start:.1f} s)")


def _nodes(args: argparse.Namespace) -> int:
    """``doctor --nodes FILE|-``: the same rows from ``doctor --json`` documents that every node printed."""
    from .preflight import document_rows

    try:
        if args.nodes == "-":
            data = sys.stdin.buffer.read()
        else:
            with open(args.nodes, "rb") as f:
                data = f.read()
    except OSError as exc:
        print(f"tms-autopreload doctor --nodes: cannot read {args.nodes}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    return _show_nodes(document_rows(data.decode("utf-8", "replace")), args.json, "")


def _show_nodes(rows: "list[dict]", as_json: bool, took: str) -> int:
    """The per-node table (or ``--json`` document) and the summary line; exit 0 only when every node is ok."""
    failing = sum(not row["ok"] for row in rows)
    summary = f"{len(rows)} nodes: {len(rows) - failing} ok, {failing} failing{took}"
    if as_json:
        print(json.dumps({"ok": not failing and bool(rows), "nodes": rows, "summary": summary}, indent=2))
    else:
        print(_ray_table(rows))
        print(summary)
    return EXIT_OK if rows and not failing else EXIT_NO_PLAN


def _ray_table(rows: "list[dict]") -> str:
    table = [("node", "ip", "python", "torch (runtime)", "hooked", "build, or the first line of the error")]
    for row in rows:
        answer = row["answer"] or {}
        rt = (answer.get("survey") or {}).get("runtime") or {}
        torch = (f"{rt.get('torch_version') or 'no torch'} ({'CUDA' if rt.get('kind') == 'cuda' else 'ROCm/HIP'} "
                 f"{rt.get('major')})" if rt else "-")
        plan = (answer.get("survey") or {}).get("plan")
        what = os.path.basename(plan["build"]) if plan and row["ok"] else (row["error"] or "-").splitlines()[0]
        name = row["name"] if row["name"] and row["name"] != row["ip"] else ""
        node = f"{name} {(row['node_id'] or '')[:8]}".strip() or "?"
        table.append((node, row["ip"] or "-", answer.get("python") or "-", torch,
                      "yes" if row["ok"] else "NO", what if len(what) <= 160 else what[:157] + "..."))
    return _table(table)


def _deep(args: argparse.Namespace) -> int:
    """``doctor --deep``: where the loader binds the module's references to the hook's symbols."""
    from . import EXEC_VAR, FLAG_VARS, GENERIC_FLAG, MODE_VAR, STATE_VAR, VERBOSE_VAR, parse_flag
    from .bindings import Evidence, check
    from . import is_tms_entry, split_preload

    report = survey()
    if report.plan is None or report.runtime is None or report.runtime.library is None:
        ev = Evidence(args.import_, report.plan.build if report.plan else None,
                      report.runtime.library if report.runtime else None)
        ev.error = report.error or "the runtime library this process binds was not found"
        if args.json:
            print(json.dumps(ev.to_dict(), indent=2))
        else:
            print(f"tms-autopreload: {ev.error}", file=sys.stderr)
        return EXIT_NO_PLAN
    plan = report.plan
    hook = plan.build
    if args.as_is:
        env = dict(os.environ)
        named = [e for e in split_preload(env.get("LD_PRELOAD", "")) if is_tms_entry(e)]
        hook = named[0] if named and os.path.isabs(named[0]) else plan.build
    elif args.mode == "dlopen":
        # The child starts as a flagged process in dlopen mode would: nothing of ours preloaded.
        env = {k: v for k, v in os.environ.items() if k not in (STATE_VAR, EXEC_VAR)}
        env["LD_PRELOAD"] = ":".join(e for e in split_preload(env.get("LD_PRELOAD", "")) if not is_tms_entry(e))
        if not any(parse_flag(name, env.get(name))[0] for name in FLAG_VARS):
            env[GENERIC_FLAG] = "1"
        env.update({MODE_VAR: "dlopen", VERBOSE_VAR: "1"})
    else:
        env = {**os.environ, **plan.environment()}
    ev = check(env, hook, report.runtime.library, module=args.import_, executable=report.executable,
               in_process=args.mode == "dlopen" and not args.as_is)
    if args.json:
        print(json.dumps(ev.to_dict(), indent=2))
        return EXIT_OK if ev.ok else EXIT_NO_PLAN
    where = ("this environment as it is" if args.as_is else
             "the plan, loaded in-process by the start-up hook (dlopen mode)" if args.mode == "dlopen" else "the plan")
    print(f"deep:     `import {ev.module}` under {where} with LD_BIND_NOW=1 LD_DEBUG=bindings: "
          f"{ev.seconds:.1f} s, {ev.log_bytes / 1e6:.1f} MB of binding log (read line by line, deleted)")
    if ev.import_error:
        print(f"import:   FAILED: {ev.import_error}")
    mapped = {True: "mapped", False: "NOT mapped", None: "not checked"}[ev.hook_mapped]
    print(f"hook:     {ev.hook} ({mapped})")
    print(f"symbols:  {', '.join(ev.interposed) or 'none'} (defined by the hook and by {ev.runtime_library})")
    print(f"runtime:  {len(ev.runtimes)} mapped: {', '.join(ev.runtimes) or 'none'}")
    print()
    for lib in ev.libraries:
        targets = {t for t in lib.bound.values()}
        to = "hook" if lib.status == "intercepted" else ", ".join(sorted(os.path.basename(t or "nothing") for t in targets))
        line = f"{lib.label()}: {', '.join(lib.bound)} -> {to}"
        print(line if lib.status == "intercepted" else f"{line} ({lib.status.upper()}: {lib.reason})")
    print(f"\nverdict:  {ev.verdict()}")
    return EXIT_OK if ev.ok else EXIT_NO_PLAN


def _cmd_which(args: argparse.Namespace) -> int:
    report = survey()
    if not _plan_or_fail(report):
        return EXIT_NO_PLAN
    print(report.plan.build)
    return EXIT_OK


def _cmd_env(args: argparse.Namespace) -> int:
    report = survey()
    if not _plan_or_fail(report):
        return EXIT_NO_PLAN
    changes = report.plan.changes()
    if args.json:
        print(json.dumps(changes))
    else:
        for k, v in changes.items():
            print(f"export {k}={shlex.quote(v)}")
    return EXIT_OK


def _cmd_run(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        args.parser.error("give a command: tms-autopreload run -- CMD [ARGS...]")
    if not command[0]:
        args.parser.error("the command name is empty (''): give a command: tms-autopreload run -- CMD [ARGS...]")
    report = survey()
    if not _plan_or_fail(report):
        return EXIT_NO_PLAN
    env = dict(os.environ)
    env.update(report.plan.changes())
    sys.stdout.flush()
    try:
        os.execvpe(command[0], command, env)
    except FileNotFoundError:
        print(f"tms-autopreload run: {command[0]}: command not found", file=sys.stderr)
        return 127
    except OSError as exc:
        print(f"tms-autopreload run: {command[0]}: {exc.strerror}", file=sys.stderr)
        return 126
    return EXIT_OK  # not reached: execvpe replaced this process


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
    except KeyError:
        print(f"tms-autopreload kernel: no kernel named {args.name!r} there", file=sys.stderr)
        return EXIT_NO_PLAN
    except (ValueError, OSError) as exc:
        print(f"tms-autopreload kernel: {exc}", file=sys.stderr)
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

    def command(parent: "argparse._SubParsersAction", name: str, func: "Callable[[argparse.Namespace], int]",
                help: str) -> argparse.ArgumentParser:
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
    p.add_argument("--address", help="with --ray: the cluster's address (default: auto, as ray's CLI)")
    p.add_argument("--runtime-env", metavar="JSON", help="with --ray: the job's runtime_env, merged into the workers'")
    p.add_argument("--timeout", type=float, metavar="S",
                   help="with --ray: seconds to wait for every node (default 60); silent nodes are failing rows")
    command(sub, "which", _cmd_which, "print the chosen build's path")
    p = command(sub, "env", _cmd_env, "print `export` lines for eval (or --json for a Ray runtime_env)")
    p.add_argument("--json", action="store_true", help='print {"LD_PRELOAD": ..., ...}')
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


class _Stdout(io.RawIOBase):
    """File descriptor 1, whose failed writes raise :class:`WriteError`: a full disk or a closed pipe
    is then told apart from every other OSError, wherever the command printed. After a failure it
    takes and drops everything, so that nothing is retried at exit."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return os.isatty(1)

    def write(self, data: "bytes | memoryview") -> int:
        if self.failed:
            return len(data)
        try:
            return os.write(1, data)
        except OSError as exc:
            self.failed = True
            raise WriteError(exc.strerror or str(exc)) from None


class WriteError(Exception):
    """Standard output could not be written; the message is the system's reason."""


class Interrupted(BaseException):
    """A signal asked this command to stop; ``finally`` blocks run on the way out, as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def _guarded_stdout() -> "Iterator[None]":
    """``sys.stdout`` over :class:`_Stdout` while a command runs, when it is file descriptor 1 (the
    console script); put back after, so that a caller of :func:`main` keeps its own."""
    current = sys.stdout
    try:
        fd = current.fileno() if current is not None else None
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        fd = None
    if fd != 1:
        yield
        return
    current.flush()
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Stdout()), encoding=current.encoding, errors=current.errors,
                                  line_buffering=current.line_buffering)
    try:
        yield
    finally:
        guarded, sys.stdout = sys.stdout, current
        guarded.flush()  # raises WriteError unless that was raised already (then it drops what is left)


def main(argv: list[str] | None = None) -> int:
    try:
        with _guarded_stdout():  # --help and --version print while parsing
            args = build_parser().parse_args(argv)
            if args.cmd == "doctor":
                _check_doctor(args)
            return _run(args)
    except WriteError as exc:
        print(f"tms-autopreload: write error: {exc}", file=sys.stderr)
        return EXIT_NO_PLAN


def _run(args: argparse.Namespace) -> int:
    """The command; a signal ends it through its finally blocks, with 128+N and one line.

    SIGTERM and SIGHUP end doctor --deep as Ctrl-C does: through the finally blocks that end its
    child's process group and delete the binding log. Only there: elsewhere (Ray's client, say) a
    signal keeps its default action, which no blocking call can delay.
    """
    handlers = {}
    if args.cmd == "doctor" and args.deep:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                handlers[signum] = signal.signal(signum, _interrupt)
    try:
        code = args.func(args)
        sys.stdout.flush()
        return code
    except (Interrupted, KeyboardInterrupt) as exc:
        signum = exc.signum if isinstance(exc, Interrupted) else signal.SIGINT
        done = "; its child was ended and its binding log deleted" if args.cmd == "doctor" and args.deep else ""
        print(f"tms-autopreload {args.cmd}: interrupted by {signal.Signals(signum).name}{done}", file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
