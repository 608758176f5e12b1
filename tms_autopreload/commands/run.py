"""``tms-autopreload run -- CMD``: exec a command with the planned environment."""

from __future__ import annotations

import argparse
import os
import sys

from ..decision import survey
from .caller_env import before_plan
from .exitpolicy import EXIT_NO_PLAN, plan_or_fail
from . import command

__all__ = ["configure_parser", "execute"]


def configure_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = command(sub, "run", execute, "exec a command with the planned environment")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")


def execute(args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        args.parser.error("give a command: tms-autopreload run -- CMD [ARGS...]")
    if not command[0]:
        args.parser.error("the command name is empty (''): give a command: tms-autopreload run -- CMD [ARGS...]")
    env = before_plan()
    plan = plan_or_fail(survey(env))
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
