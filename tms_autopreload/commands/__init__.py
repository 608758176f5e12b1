"""The commands' wing: ``tms-autopreload`` and what only its commands use.

Nothing here runs at interpreter start: the hook's wing (the package's top level) never imports this
package, and ``python -m tms_autopreload`` (:mod:`tms_autopreload.__main__`) and the console script of an
older install (:mod:`tms_autopreload.cli`) are the only ways in. :mod:`.main` wires the commands, each a
module that owns its parser and its execution.
"""

from __future__ import annotations

import argparse

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

    from ..decision import Report
    from typing import TypeVar

    Parser = TypeVar("Parser", bound=argparse.ArgumentParser)  # a subcommand's parser is of its parent's class

__all__ = ["command", "note_link", "note_not_started"]


def command(parent: "argparse._SubParsersAction[Parser]", name: str,
            func: "Callable[[argparse.Namespace], int] | None", help: str,
            check: "Callable[[argparse.Namespace], None] | None" = None,
            interrupt: "Callable[[argparse.Namespace], str | None] | None" = None) -> "Parser":
    """A command's subparser (or a subcommand's), with what runs it (``func``), what refuses option
    combinations after parsing (``check``, a usage error) and what an interrupt undoes (``interrupt``: the
    words said of it, or None where it has nothing to undo) as its defaults: what each command module's
    ``configure_parser`` makes its parser with."""
    p = parent.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
    p.set_defaults(func=func, parser=p, check=check, interrupt=interrupt)
    return p


def note_link(report: "Report", name: str) -> None:
    """Command ``name``'s note on stderr where the chosen build's path is a symbolic link to a file of another
    name: its stdout stays what scripts read (the link's path, the variables naming it), and the note shows the
    reader the link, the file it names and what that file needs (:meth:`tms_autopreload.builds.Build.shown`),
    where the link's name alone would say another CUDA major."""
    import sys

    from ..builds import is_renamed

    build = report.chosen
    if build is not None and is_renamed(build.path, build.file):
        print(f"tms-autopreload {name}: {build.shown()}", file=sys.stderr)


def note_not_started(name: str) -> None:
    """Command ``name``'s warning on stderr where flagged starts of this interpreter are not hooked although the
    package is installed (:func:`tms_autopreload.leftover.not_started`: its start-up files), with the fix a flagged
    start gives: the plan it prints is what a flag would apply, and the flag would not."""
    import sys

    from ..leftover import not_started

    gap = not_started()
    if gap is not None:
        print(f"tms-autopreload {name}: warning: {gap}", file=sys.stderr)
