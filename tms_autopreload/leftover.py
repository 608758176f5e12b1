"""What a flagged start does where ``tms_autopreload.pth`` is left over: the package it starts is gone.

The package directory was deleted while the ``.pth`` stayed in site-packages, or an editable install's
checkout moved, or the start-up files beside the ``.pth`` went too. site.py would print a traceback for the
failed import and go on unhooked; instead a flagged start says so in one message, with a fix that runs from
the shell it is read in, and stops as the package stops (exit 78), or goes on under
``TMS_AUTOPRELOAD_ON_ERROR=warn``. The programs the package never hooks are left alone here too (a ``pip
install`` of the fix, from that same shell).

The package cannot import this module where it is needed, so it never does: ``tools/pthfile.py`` writes its
functions, with every function and constant of the package they use (the flag rules, the programs never
hooked, the fix's form, the way out), into the start-up files: :func:`left_over` into
``_tms_autopreload_left_over.py``, which the start module imports where ``import tms_autopreload`` fails, and
:func:`start_gone` into the ``.pth`` file's second line, a comment that its import line runs where the start
module (or that fallback) cannot be imported. Those rules are so written once, and checked by ruff and mypy.
"""

import json
import os
import sys

from .environment import (_COMMANDS, COMMAND, DISABLE_VAR, FALSE_WORDS, FLAG_VARS, NO_HOOK, ON_ERROR_POLICIES,
                          ON_ERROR_VAR, TRUE_WORDS, flags, original_argv, unhooked_program)
from .installer import _has_ensurepip, _uv_on_path, pip_form, where
from .install_source import DISTRIBUTION, local_path, source_args, source_gone
from .startup import EXIT_CONFIG, PTH, START, START_UP_FILES, parse_choice, stray_start
from .stopped import shell_way_out, way_out

TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib import metadata

    from .errors import Error

__all__ = ["left_over", "stop", "fix", "removal", "start_gone", "REPAIR_TOOLS", "OWN_PROGRAMS", "not_started"]

# The repair tools start_gone leaves alone, by their names alone (the package also reads a console script's first
# lines: unhooked_program): pip's scripts (pip3.12 is pip), -m pip and pip's runner, ensurepip, venv, virtualenv;
# and uv's interpreter query, by its -c text (_COMMANDS).
REPAIR_TOOLS = ("pip", "__pip-runner__", "ensurepip", "venv", "virtualenv")
# The package's own command, which start_gone leaves alone as the package does (unhooked_program): its console
# script, and ``-m tms_autopreload`` (``.__main__`` too).
OWN_PROGRAMS = (COMMAND, "tms_autopreload")


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


def removal(pth: str) -> str:
    """The command that removes the start-up files the wheel put beside ``pth`` (the ``.pth`` site.py read),
    from any shell, flagged or not: after it every start of the environment is unhooked, and says nothing.
    ``rm -f``: whichever is gone already, and without asking where one is write-protected."""
    import shlex

    site = os.path.dirname(pth)
    files = [pth, *(os.path.join(site, name) for name in START_UP_FILES[1:])]
    return " ".join([NO_HOOK, "rm", "-f", "--", *map(shlex.quote, files)])


def _again(python: str, options: "list[str]", editable: bool) -> str:
    """What hooks ``python`` again once the start-up files are removed, in words: no command can name a source
    that no record names or that is gone, and tms-autopreload is not on the package index (install_source), so
    installing it by name would fail."""
    source = "from where its checkout is now, in editable mode (pip's -e)" if editable else \
        "from your wheel or checkout"
    return (f"to hook {python} again, install tms-autopreload for it {source}, with pip's {' '.join(options)}; "
            f"it is not on the package index")


def fix(pth: str, read: bool = True) -> str:
    """What puts the package back for this interpreter, from the shell this is read in: the ``pip install`` of
    the source pip recorded, where it is still there, or else the removal of the start-up files, with what
    hooks it again in words; each after what stands in the way (:func:`tms_autopreload.installer.where`).
    ``read``: whether site.py runs the ``.pth`` files of the directory of ``pth``; where it does not (a
    ``--target`` folder), the install goes where this interpreter installs by default, where it does."""
    site = os.path.dirname(pth)
    words, options = where("install", site if read else None, True)
    record = _record(site)
    args = source_args(record) if record is not None else None
    editable = args is not None and args[:1] == ["-e"]
    if record is not None and args and not source_gone(record):
        facts = (_pip_found(site), _uv_on_path(), _has_ensurepip())
        fix = (f"{pip_form(sys.executable, 'install', options, args, *facts)}; or remove the start-up files "
               f"(`{removal(pth)}`)")
    else:
        why = ("nothing records where this copy came from" if record is None else
               "its record names no source pip installs from" if not args else
               f"its editable checkout {local_path(record)} is gone (moved or deleted)" if editable else
               f"the source it was installed from, {local_path(record)}, is gone")
        fix = f"`{removal(pth)}` ({why}: {_again(sys.executable, options, editable)})"
    return f"{'; '.join(words)}: {fix}" if words else fix


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
    stop(pth, "the tms_autopreload package it starts cannot be imported")


def stop(pth: str, why: str) -> None:
    """What a flagged start does where the start-up files beside ``pth`` cannot start the package (``why``): say
    it once, with the fix (:func:`fix`), and stop (exit 78), or go on under ``TMS_AUTOPRELOAD_ON_ERROR=warn``.
    The one wording of that stop: :func:`left_over` and :func:`start_gone` (where the package, or the fallback,
    can still be imported) both end here."""
    sys.tms_autopreload_left_over = pth  # type: ignore[attr-defined]  # a mark of this start: said once
    warn = parse_choice(ON_ERROR_VAR, os.environ.get(ON_ERROR_VAR), ON_ERROR_POLICIES)[0] == "warn"
    message = (f"tms-autopreload: {pth} is left over: {why}, so this process is not hooked. Fix: {fix(pth)}"
               + (f"; continuing without the hook ({ON_ERROR_VAR}=warn)" if warn else f"\n{way_out()}") + "\n")
    os.write(2, message.encode("utf-8", "surrogateescape"))
    if not warn:
        os._exit(EXIT_CONFIG)  # EX_CONFIG, as the package stops; a SystemExit here would abort start-up


def start_gone(pth: str) -> None:
    """What the line of ``pth`` does where importing the start module failed: it is gone, or the package and
    the fallback that module imports are. The line cannot import anything of this package's then, so
    ``tools/pthfile.py`` writes this function, with what it uses, into the file's second line (a comment, which
    site.py skips at every other start), and the line's ``except`` runs it, with ``os``, ``sys`` and ``shlex``
    alone, in as few words as every start can afford to skip (docs/design.md says what they leave out): the
    package's flag words and kill switch, the package's own command and the repair tools by their names alone
    (:data:`OWN_PROGRAMS`, :data:`REPAIR_TOOLS`, uv's query). A flagged start is then stopped by the package's
    own :func:`stop` where the package can still be imported, or by its fallback's where that can (each with
    :func:`fix`: the source pip recorded, installed again, which puts the start-up files back); where neither
    can, by one message here with the removal of the start-up files and the way out of this shell. Each ends in
    :data:`ON_ERROR_VAR`'s exit 78, or with ``warn`` the start goes on, said once."""
    error = sys.exc_info()[1]
    if not isinstance(error, ImportError):
        raise  # the start module failed otherwise: site.py says how, as it did before the line caught it
    env = os.environ
    word = {name: env.get(name, "").strip().lower() for name in (DISABLE_VAR, ON_ERROR_VAR, *FLAG_VARS)}
    if word[DISABLE_VAR] not in FALSE_WORDS or TRUE_WORDS.isdisjoint(word[name] for name in FLAG_VARS) \
            or hasattr(sys, "tms_autopreload_left_over"):
        return  # the kill switch on (any word but an off word), no flag on, or said already
    # What this interpreter runs, as its own command line names it: a script, the module of -m (-mpip, -Impip:
    # what follows the m), the text of -c.
    orig = original_argv()
    program = orig[-len(sys.argv)] if 0 < len(sys.argv) <= len(orig) else ""
    if program[:1] == "-":
        program = program[program.find("m") + 1:]
    name = os.path.basename(program).split(".")[0]
    if name in OWN_PROGRAMS:
        return  # the package's own command answers for this shell, as it does where it is installed whole
    if name.rstrip("0123456789") in REPAIR_TOOLS or program.endswith(tuple(_COMMANDS)):
        env[DISABLE_VAR] = "1"  # for its children, as the package does
        return
    # Where the package, or its fallback, can still be imported, its own stop says it, with the fix that puts
    # the start-up files back (the source pip recorded, installed again); this line's words are for the rest.
    try:
        import tms_autopreload.leftover as package

        package.stop(pth, str(error))
    except Exception:  # noqa: BLE001 - the package is gone or broken: its fallback, else this line's own words
        try:
            import _tms_autopreload_left_over  # noqa: F401 - it runs on import: left_over, which ends in stop
        except Exception:  # noqa: BLE001 - gone or broken too
            pass
    if hasattr(sys, "tms_autopreload_left_over"):
        return  # said there, under warn
    sys.tms_autopreload_left_over = pth  # type: ignore[attr-defined]  # read above, and by left_over
    warn = word[ON_ERROR_VAR] == "warn"
    os.write(2, (f"tms-autopreload: {pth} is left over: {error}, so this process is not hooked. Fix: `{removal(pth)}` "
                 f"(then install tms-autopreload for {sys.executable} again from your wheel or checkout, with pip's "
                 f"--force-reinstall, to hook it)"
                 + (f"; continuing without the hook ({ON_ERROR_VAR}=warn)" if warn else f"\n{shell_way_out()}")
                 + "\n").encode("utf-8", "surrogateescape"))
    if not warn:
        os._exit(EXIT_CONFIG)


def not_started() -> "Error | None":
    """Why flagged starts of this interpreter are not hooked although the package is installed, with the fix a
    flagged start gives (:func:`fix`); None where nothing says so. Judged from the installed distribution's
    directory (the site directory pip put the start-up files in, an editable install's too): a start-up file
    missing there (a flagged start then stops, or runs unhooked where the ``.pth`` is the one gone), or not what
    the install wrote (:func:`_changed`), or a start module earlier on ``sys.path`` imported instead of the one
    there (:func:`tms_autopreload.startup.stray_start`, as a flagged start says it), or that directory one whose
    ``.pth`` files site.py does not run (a ``--target`` folder on ``PYTHONPATH``), with no ``.pth`` of this
    package in one it does. Where no distribution is installed (the package run from a checkout), nothing is
    judged. ``doctor``, ``which`` and ``env`` ask this."""
    from importlib import metadata

    from .errors import CAUSE_NOT_STARTED, Error

    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return None
    site = os.path.abspath(str(dist.locate_file("")))
    pth = os.path.join(site, PTH)
    missing = [name for name in START_UP_FILES if not os.path.isfile(os.path.join(site, name))]
    if missing:
        # Without the fallback alone a flagged start is hooked, and stops where the package goes, in fewer words.
        then = (f"flagged starts of {sys.executable} are not hooked" if {PTH, f"{START}.py"} & set(missing) else
                f"flagged starts of {sys.executable} are hooked, but where the package goes they stop without this "
                f"fix")
        return Error(f"the start-up file{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                     f"{'are' if len(missing) > 1 else 'is'} missing from {site}, where tms-autopreload is installed: "
                     f"{then}", fix(pth), CAUSE_NOT_STARTED)
    changed = _changed(dist, site)
    if changed:
        return Error(f"the start-up file{'s' if len(changed) > 1 else ''} {', '.join(changed)} in {site} "
                     f"{'differ' if len(changed) > 1 else 'differs'} from what tms-autopreload's install wrote there "
                     f"(pip's record of it): flagged starts of {sys.executable} may not be hooked", fix(pth),
                     CAUSE_NOT_STARTED)
    stray = stray_start(_first_start_module(), pth)
    if stray is not None:
        return Error(*stray, CAUSE_NOT_STARTED)
    site_module = sys.modules.get("site")
    if site_module is None or sys.flags.no_site:
        return None  # site.py did not run here: which directories it reads cannot be asked
    from .sitepath import site_dirs

    read = {os.path.realpath(d) for d in site_dirs(site_module)}
    # Where a site directory holds a .pth of this package too, its line starts the package from sys.path.
    if os.path.realpath(site) not in read and not any(os.path.isfile(os.path.join(d, PTH)) for d in read):
        return Error(f"{pth} lies in {site}, which is not a site directory of {sys.executable} (site.py runs the "
                     f".pth files of those alone), so flagged starts of it are not hooked", fix(pth, read=False),
                     CAUSE_NOT_STARTED)
    return None


def _changed(dist: "metadata.Distribution", site: str) -> "list[str]":
    """The start-up files in ``site`` whose bytes are not those pip's record of ``dist`` hashes (edited, cut
    short, or written over by another install): site.py runs whatever they hold."""
    import base64
    import hashlib

    changed = []
    for file in dist.files or ():
        if str(file) not in START_UP_FILES or file.hash is None or file.hash.mode != "sha256":
            continue
        path = os.path.join(site, str(file))
        if not os.access(path, os.R_OK):  # site.py cannot run it either; installed again, it can
            changed.append(str(file))
            continue
        with open(path, "rb") as f:
            digest = hashlib.sha256(f.read()).digest()
        if base64.urlsafe_b64encode(digest).rstrip(b"=").decode() != file.hash.value:
            changed.append(str(file))
    return changed


def _first_start_module() -> "str | None":
    """The start module a flagged start of this interpreter imports: the one that ran here, else the first on
    ``sys.path`` as site.py sees it (without the folder of the script or ``-m`` that ``sys.path[0]`` adds after)."""
    ran = getattr(sys.modules.get(START), "__file__", None)
    if ran is not None:
        return str(ran)
    from importlib.machinery import PathFinder

    path = sys.path if getattr(sys.flags, "safe_path", False) or sys.flags.isolated else sys.path[1:]
    spec = PathFinder.find_spec(START, path)
    return spec.origin if spec is not None else None
