"""``tms-autopreload`` (also ``python -m tms_autopreload``): the parser, wired from the commands.

Each command is a module of this package that owns its parser (``configure_parser``) and its execution
(``execute``): :mod:`.doctor`, :mod:`.which`, :mod:`.env`, :mod:`.run`, :mod:`.kernel`. How a command ends
(its exit codes, a failed write, a signal) is :mod:`.exitpolicy`'s; the codes are shown by ``--help``.
"""

from __future__ import annotations

import argparse
import sys

from .exitpolicy import EXIT_CODES, EXIT_NO_PLAN, INTERRUPTS, WriteError, guarded_stdout, signal_of, unwinding_signals


__all__ = ["main", "build_parser", "parse", "COMMANDS"]


COMMANDS = ("doctor", "which", "env", "run", "kernel")  # the modules, in the order --help lists them


def build_parser() -> argparse.ArgumentParser:
    from importlib import import_module

    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="tms-autopreload",
        description="Choose the torch_memory_saver LD_PRELOAD build that fits this process's CUDA runtime.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="exit codes:\n" + "\n".join(f"  {code:<12} {meaning}" for code, meaning in EXIT_CODES))
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for name in COMMANDS:
        import_module(f".{name}", __package__).configure_parser(sub)
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
