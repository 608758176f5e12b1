"""``tms-autopreload which``: the chosen build's path."""

from __future__ import annotations

import argparse
from ..decision import survey
from .caller_env import before_plan
from .exitpolicy import EXIT_NO_PLAN, EXIT_OK, plan_or_fail
from . import command, note_link, note_not_started

__all__ = ["configure_parser", "execute"]


def configure_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    command(sub, "which", execute, "print the chosen build's path")


def execute(args: argparse.Namespace) -> int:
    report = survey(before_plan())
    plan = plan_or_fail(report)
    if plan is None:
        return EXIT_NO_PLAN
    print(plan.build)
    note_link(report, "which")
    note_not_started("which")
    return EXIT_OK
