"""``tms-autopreload kernel install|uninstall``: a Jupyter kernel of this interpreter that starts hooked."""

from __future__ import annotations

import argparse
import os
import sys

from .exitpolicy import EXIT_NO_PLAN, EXIT_OK, EXIT_USAGE
from . import command

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["configure_parser"]


def configure_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    from .kernelspec import DEFAULT_NAME

    p = command(sub, "kernel", None, "install or remove a Jupyter kernel of this interpreter that starts hooked")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION", parser_class=_KernelParser)
    install = command(actions, "install", _install,
                      "write a kernelspec that runs this interpreter with TMS_AUTOPRELOAD=1 (never over a "
                      "kernel this command did not write)")
    uninstall = command(actions, "uninstall", _uninstall, "remove a kernelspec this command wrote")
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


class _KernelParser(argparse.ArgumentParser):
    """``kernel install``'s and ``uninstall``'s parser: its help ends with where the kernel is without a
    location option (:func:`_without_location`), asked of jupyter_client only when the help is printed (every
    command line builds this parser, and importing jupyter_client would cost each of them its import)."""

    def format_help(self) -> str:
        """argparse's help, then where the kernel is, wrapped at spaces only: a path keeps its hyphens."""
        import shutil
        import textwrap

        where = textwrap.fill(_without_location(self.get_default("func")), shutil.get_terminal_size().columns - 2,
                              break_long_words=False, break_on_hyphens=False)
        return f"{super().format_help()}\n{where}\n"


def _without_location(action: object) -> str:
    """Where ``action`` (install or uninstall) looks without --user, --sys-prefix or --prefix."""
    if action is not _install:
        return ("Without --user, --sys-prefix or --prefix: the kernel of that name that Jupyter finds "
                "(`jupyter kernelspec list` shows each kernel and where it is).")
    from . import kernelspec

    try:
        where = kernelspec.system_kernels()
    except kernelspec.MissingJupyter as exc:
        where = f"not known here: {exc.message}"
    return (f"Without --user, --sys-prefix or --prefix: jupyter_client's system-wide kernels folder ({where}), "
            f"which may need root; --user writes where only you see it.")


def _location(args: argparse.Namespace) -> dict:
    return {"user": args.user, "sys_prefix": args.sys_prefix, "prefix": args.prefix}


def _install(args: argparse.Namespace) -> int:
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


def _uninstall(args: argparse.Namespace) -> int:
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
