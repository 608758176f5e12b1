"""``tms-autopreload`` (also ``python -m tms_autopreload``): explain, print or apply the plan.

Exit codes: 0 a plan exists (or the command ran); 1 no plan (the reason is printed);
2 usage error; 126/127 ``run``: the command could not be executed / was not found.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys

from .plan import Report, survey

__all__ = ["main", "EXIT_OK", "EXIT_NO_PLAN", "EXIT_USAGE"]

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_USAGE = 2


def _runtime_line(report: Report) -> str:
    rt = report.runtime
    if rt is None:
        return "runtime:  not decided"
    lib = f"{rt.library} ({rt.library_rule})" if rt.library else "not found"
    return f"runtime:  {rt.describe()}\nlibrary:  {rt.soname} -> {lib}"


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows)


def _doctor_text(report: Report) -> str:
    out = [f"python:   {report.executable}",
           f"package:  {report.package_dir or 'torch_memory_saver not found'}",
           _runtime_line(report), ""]
    if report.verdicts:
        rows = [("candidate", "built for", "loads?", "verdict", "why")]
        for v in report.verdicts:
            loads = {True: "yes", False: "NO", None: "-"}[v.loads]
            rows.append((v.build.name, v.build.target(), loads, v.status.upper(), v.reason))
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


def _cmd_doctor(args: argparse.Namespace) -> int:
    report = survey(check_all=True)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(_doctor_text(report))
    return EXIT_OK if report.plan else EXIT_NO_PLAN


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
        print("tms-autopreload run: give a command: tms-autopreload run -- CMD [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tms-autopreload",
        description="Choose the torch_memory_saver LD_PRELOAD build that fits this process's CUDA runtime.",
        epilog="exit codes: 0 plan found; 1 no plan (reason printed); 2 usage; "
               "126/127 run: command not executable / not found")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("doctor", help="explain what is installed, what loads, and what is chosen")
    p.add_argument("--json", action="store_true", help="machine-readable report")
    p.set_defaults(func=_cmd_doctor)
    p = sub.add_parser("which", help="print the chosen build's path")
    p.set_defaults(func=_cmd_which)
    p = sub.add_parser("env", help="print `export` lines for eval (or --json for a Ray runtime_env)")
    p.add_argument("--json", action="store_true", help='print {"LD_PRELOAD": ..., ...}')
    p.set_defaults(func=_cmd_env)
    p = sub.add_parser("run", help="exec a command with the planned environment")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    p.set_defaults(func=_cmd_run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
