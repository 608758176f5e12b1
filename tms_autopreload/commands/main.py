"""``tms-autopreload`` (also ``python -m tms_autopreload``): the parser, wired from the commands.

Each command is a module that owns its parser (``configure_parser``), its execution (``execute``) and what an
interrupt has undone (``interrupt``, :func:`tms_autopreload.commands.command`): :mod:`.doctor.command`,
:mod:`.which`, :mod:`.env`, :mod:`.run`, :mod:`.kernel`. This module only wires them. How a command ends (its
exit codes, a failed write, a signal) is :mod:`.exitpolicy`'s; the codes are shown by ``--help``.
"""

from __future__ import annotations

import argparse
import sys

from ..environment import COMMAND
from ..startup import too_old
from .exitpolicy import EXIT_CODES, EXIT_NO_PLAN, INTERRUPTS, WriteError, guarded_stdout, signal_of, unwinding_signals

if (old := too_old()) is not None:  # before the commands' modules, which an older Python cannot import
    print(f"{COMMAND}: {old}", file=sys.stderr)
    raise SystemExit(EXIT_NO_PLAN)

# The commands, imported after that check.
from .. import __version__
from . import env, kernel, run, which
from .doctor import command as doctor

__all__ = ["main", "build_parser", "parse", "COMMANDS"]


COMMANDS = (doctor, which, env, run, kernel)  # the command modules, in the order --help lists them


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=COMMAND,
        description="Choose the torch_memory_saver LD_PRELOAD build that fits this process's CUDA runtime.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {code:<12} {meaning}" for code, meaning in EXIT_CODES))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.configure_parser(sub)
    return parser


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked: a usage error exits 2 here, as argparse's own do."""
    args = build_parser().parse_args(argv)
    if args.check is not None:
        args.check(args)
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

    Where the command has something to undo (its ``interrupt`` names it: doctor --deep's child and binding
    log), SIGTERM and SIGHUP end it as Ctrl-C does (:func:`.exitpolicy.unwinding_signals`), through the finally
    blocks that undo it, and the line says what was undone.
    """
    undone = args.interrupt(args) if args.interrupt is not None else None
    with unwinding_signals(undone is not None):
        try:
            code: int = args.func(args)
            sys.stdout.flush()
            return code
        except INTERRUPTS as exc:
            signum = signal_of(exc)
            print(f"tms-autopreload {args.cmd}: interrupted by {signum.name}{undone or ''}", file=sys.stderr)
            return 128 + signum
