"""What a flagged start does where ``tms_autopreload.pth`` is left over: the package it starts is gone.

The package directory was deleted while the ``.pth`` stayed in site-packages, or an editable install's
checkout moved. site.py would print a traceback for the failed import and go on unhooked; instead a
flagged start says so in one message, with a fix that runs from the shell it is read in, and stops as the
package stops (exit 78), or goes on under ``TMS_AUTOPRELOAD_ON_ERROR=warn``. The programs the package never
hooks are left alone here too (a ``pip install`` of the fix, from that same shell).

The package cannot import this module where it is needed, so it never does: ``tools/pthfile.py`` writes its
functions, with every function and constant of the package they use (the flag rules, the programs never
hooked, the fix's form, the way out), into the ``.pth`` file's ``#: `` lines, which the file's import line
runs when ``import tms_autopreload`` fails. Those rules are so written once, and checked by ruff and mypy.
"""

import json
import os
import sys

from . import COMMAND, DISABLE_VAR, NO_HOOK, ON_ERROR_VAR, flags, unhooked_program
from .installer import _has_ensurepip, _uv_on_path, pip_form, where
from .install_source import WHEEL_TEMPLATE, local_path, source_args, source_gone
from .startup import EXIT_CONFIG, parse_choice
from .stopped import way_out

TYPE_CHECKING = False
if TYPE_CHECKING:
    from types import FrameType

__all__ = ["left_over", "processed_pth"]


def _record(site: str) -> "dict[str, object] | None":
    """The PEP 610 record (``direct_url.json``) of the tms_autopreload distribution installed in ``site``,
    or None where there is none or it cannot be read."""
    try:
        infos = [n for n in os.listdir(site) if n.startswith("tms_autopreload-") and n.endswith(".dist-info")]
        with open(os.path.join(site, *infos[:1], "direct_url.json"), "rb") as f:
            record = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return record if len(infos) == 1 and isinstance(record, dict) and isinstance(record.get("url"), str) else None


def _pip_found(site: str) -> bool:
    """Whether this interpreter has pip: in ``site``, on ``sys.path`` as it is, or, outside a venv, in a site
    directory site.py has still to add (the ``.pth`` of a user site runs before the system's site-packages is
    on the path). In a venv the base's are left out: while site.py runs, ``site.getsitepackages()`` names
    them, pip there or not for the venv."""
    dirs = [site, *sys.path]
    if sys.prefix == sys.base_prefix:
        import site as site_module

        dirs += site_module.getsitepackages()
    return any(os.path.isdir(os.path.join(d, "pip")) for d in dirs if d)


def _fix(pth: str) -> str:
    """What puts the package back for this interpreter, from the shell this is read in."""
    site = os.path.dirname(pth)
    words, options = where("install", site, True)
    facts = (_pip_found(site), _uv_on_path(), _has_ensurepip())
    record = _record(site)
    args = source_args(record) if record is not None else None
    if record is not None and args and not source_gone(record):
        fix = pip_form(sys.executable, "install", options, args, *facts)
    elif record is not None and args and args[0] == "-e":
        editable = pip_form(sys.executable, "install", [o for o in options if o != "--force-reinstall"] + ["-e"],
                            ["/path/to/checkout"], *facts)
        fix = (f"its editable checkout {local_path(record)} is gone (moved or deleted): install it again from where "
               f"the checkout is now, {editable} with that path")
    else:
        gone = f"the source it was installed from, {local_path(record)}, is gone; " if record is not None else ""
        fix = (f"{gone}install it again from its wheel or checkout, "
               f"{pip_form(sys.executable, 'install', options, [WHEEL_TEMPLATE], *facts)} with that file's path")
    return f"{'; '.join(words)}: {fix}" if words else fix


def processed_pth(default: str) -> str:
    """The ``.pth`` file whose import line started this, or ``default`` where no such frame is found: a copy of
    the start-up files found earlier on ``sys.path`` (a ``PYTHONPATH`` folder) would otherwise name a file
    site.py never read. site.py's frame that runs import lines names it ``fullname``: ``addpackage`` up to
    3.14, ``_exec_imports`` from 3.15 (which sets it for import lines written for 3.14); site.py is frozen into
    the interpreter from 3.11 (``<frozen site>``) unless the build leaves it out."""
    frame: "FrameType | None" = sys._getframe()
    while frame is not None:
        fullname = frame.f_locals.get("fullname")
        if frame.f_code.co_filename.rpartition("/")[2] in ("site.py", "<frozen site>") and isinstance(fullname, str):
            return fullname
        frame = frame.f_back
    return default


def left_over(pth: str) -> None:
    """Say once that ``pth`` is left over, with the fix, and stop (exit 78) unless told to warn; nothing where
    no flag is on or the program is one the package never hooks."""
    if sys.platform != "linux" or hasattr(sys, "tms_autopreload_left_over"):
        return  # said once: in a venv site.py runs this file twice (3.10-3.14)
    program = unhooked_program()
    if program is not None:
        if program != COMMAND:
            os.environ[DISABLE_VAR] = "1"  # for its children, as the package does
        return
    if not flags(warn=False)[0]:
        return  # a misspelt flag is the package's to warn about, where it is installed
    sys.tms_autopreload_left_over = pth  # type: ignore[attr-defined]  # a mark of this start, read above
    import shlex

    warn = parse_choice(ON_ERROR_VAR, os.environ.get(ON_ERROR_VAR), ("exit", "warn"))[0] == "warn"
    message = (f"tms-autopreload: {pth} is left over: the tms_autopreload package it starts cannot be imported, so "
               f"this process is not hooked. Fix: {_fix(pth)}; or remove it (`{NO_HOOK} rm -- {shlex.quote(pth)}`)"
               + (f"; continuing without the hook ({ON_ERROR_VAR}=warn)" if warn else f"\n{way_out()}") + "\n")
    os.write(2, message.encode("utf-8", "surrogateescape"))
    if not warn:
        os._exit(EXIT_CONFIG)  # EX_CONFIG, as the package stops; a SystemExit here would abort start-up
