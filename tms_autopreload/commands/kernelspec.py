"""A Jupyter kernel for this interpreter that starts with the preload flag: quick experiments in notebooks.

The kernelspec's ``env`` carries ``TMS_AUTOPRELOAD=1``, so the kernel process resolves and re-execs
at start like any flagged interpreter (same PID, same argv: the ``-f CONNECTION_FILE`` it was
given still names its connection file). Written and removed with jupyter_client's own
``KernelSpecManager``, so a kernel lands exactly where ``jupyter kernelspec install`` would put
it. jupyter_client and ipykernel are imported only here: they are not dependencies of the package.
"""

import json
import os
import string
import sys
import tempfile

from .. import __version__
from ..environment import DISABLE_VAR, FLAG_VARS, GENERIC_FLAG, flags
from ..errors import (CAUSE_BAD_KERNEL_NAME, CAUSE_EMPTY_PREFIX, CAUSE_HOOK_OFF, CAUSE_INVALID_REQUEST, CAUSE_NOT_OURS,
                     CAUSE_NO_IPYKERNEL, CAUSE_NO_JUPYTER, CAUSE_NO_KERNEL, Error)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["install", "uninstall", "system_kernels", "MissingJupyter", "InvalidRequest", "KernelNotFound", "NotOurs",
           "DEFAULT_NAME", "MARKER", "MAX_NAME_LENGTH"]

DEFAULT_NAME = "python3-tms-autopreload"
MARKER = "tms_autopreload"  # metadata key: uninstall removes only kernels this package wrote
# MARKER's key for the folders above the kernel's own that its install made (absolute paths, nearest first):
# the kernels folder and the Jupyter folder above it (PREFIX/share/jupyter), never one higher.
MADE = "made"
# A kernel's name is its directory's name: one path component, which Linux's file systems (NAME_MAX) and
# Python's os.mkdir refuse beyond 255 bytes; a name of NAME_CHARACTERS has one byte a character.
MAX_NAME_LENGTH = 255


def _install_hint() -> str:
    from ..installer import pip_command

    return pip_command("install", "jupyter_client", "ipykernel")


class MissingJupyter(Error, RuntimeError):
    """jupyter_client or ipykernel is not installed for this interpreter; the fix says what to install."""

    cause = CAUSE_NO_JUPYTER


class InvalidRequest(Error, ValueError):
    """What was asked cannot be a kernel of this command (a name Jupyter refuses, an ``env`` that turns
    the hook off): a usage error."""

    cause = CAUSE_INVALID_REQUEST


class KernelNotFound(Error, KeyError):
    """No kernel of that name where uninstall was asked to look (a KeyError too, as it was before)."""

    cause = CAUSE_NO_KERNEL


class NotOurs(Error, ValueError):
    """The kernel there was not written by this package: installing would replace it, or uninstall
    would delete it, so both refuse (a ValueError too, as it was before)."""

    cause = CAUSE_NOT_OURS


def _manager() -> "Any":  # noqa: ANN401 - jupyter_client's KernelSpecManager, imported lazily, without stubs
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        raise MissingJupyter(f"jupyter_client is not installed for {sys.executable}", _install_hint()) from None
    return KernelSpecManager()


def _location(user: bool, sys_prefix: bool, prefix: "str | None") -> "dict[str, object]":
    """KernelSpecManager's keywords for one of --user / --sys-prefix / --prefix (none: system-wide)."""
    if prefix == "":
        raise InvalidRequest("an empty prefix names no directory", "leave it out for the system-wide one",
                             CAUSE_EMPTY_PREFIX)
    if sys_prefix:
        prefix = sys.prefix
    return {"user": user, "prefix": prefix}


# The characters of a kernel name: jupyter_client's rule (jupyter_client/kernelspec.py, checked against
# jupyter_client 8.10.0: ``_kernel_name_pat = re.compile(r"^[a-z0-9._\-]+$", re.IGNORECASE)``), written
# out here as jupyter_client keeps it private. Taken as its own words describe it ("ASCII letters and
# numbers and these separators: - . _"), which is stricter than the pattern in two places: a
# ``re.match`` with ``$`` lets one trailing newline through, and IGNORECASE lets in the four non-ASCII
# letters whose case folds into a-z (U+0130 İ, U+0131 ı, U+017F ſ, U+212A K, the Kelvin sign).
NAME_CHARACTERS = frozenset(string.ascii_letters + string.digits + "-._")


def _is_valid_kernel_name(name: str) -> bool:
    """True when Jupyter accepts ``name`` for a kernel and it names a directory of its own: one path
    component (not "." or "..", at most :data:`MAX_NAME_LENGTH` bytes) of :data:`NAME_CHARACTERS`."""
    return bool(name) and set(name) <= NAME_CHARACTERS and name not in (".", "..") and len(name) <= MAX_NAME_LENGTH


def _checked_name(name: str) -> str:
    """``name`` as Jupyter stores it (lower case), after :func:`_is_valid_kernel_name`."""
    if not _is_valid_kernel_name(name):
        raise InvalidRequest(f"{name!r} is not a kernel name Jupyter accepts",
                             "choose a name of ASCII letters and numbers and these separators only: - . _ "
                             f"(hyphen, period, underscore), at most {MAX_NAME_LENGTH} of them, other than . and ..",
                             CAUSE_BAD_KERNEL_NAME)
    return name.lower()


def _our_record(directory: str) -> "dict[str, Any] | None":
    """What this package wrote into the kernel.json in ``directory`` (its metadata's :data:`MARKER`), or None
    where that kernel is not one this package wrote."""
    try:
        with open(os.path.join(directory, "kernel.json"), encoding="utf-8") as f:
            metadata = json.load(f).get("metadata")
        record = metadata.get(MARKER) if isinstance(metadata, dict) else None
        return record if isinstance(record, dict) else None
    except (OSError, ValueError, AttributeError):
        return None


def _installed_by_us(directory: str) -> bool:
    """True when ``directory`` holds a kernel.json this package wrote (its metadata carries :data:`MARKER`)."""
    return _our_record(directory) is not None


def _folders_above(kernel: str) -> "tuple[str, str]":
    """The folders above a kernel's directory that an install may make and its uninstall may remove: the
    kernels folder and the Jupyter folder that holds it (PREFIX/share/jupyter, the user's or the system's
    Jupyter data folder), nearest first. Jupyter keeps every kernel at ``<its folder>/kernels/<name>``."""
    kernels = os.path.dirname(kernel)
    return kernels, os.path.dirname(kernels)


def _to_make(kernel: str) -> "list[str]":
    """Which of :func:`_folders_above` ``kernel`` are not there yet: the folders installing it will make."""
    return [folder for folder in _folders_above(kernel) if not os.path.isdir(folder)]


def _made_by_earlier(kernels: str) -> "list[str]":
    """The folders that the installs of this package's kernels in ``kernels`` recorded as made (the kernel
    about to be replaced among them): the record passes to the next kernel installed there, so that whichever
    of them is uninstalled last removes those folders."""
    try:
        names = sorted(os.listdir(kernels))
    except OSError:
        return []
    made: "list[str]" = []
    for name in names:
        record = _our_record(os.path.join(kernels, name))
        folders = record.get(MADE) if record else None
        made += [f for f in folders if isinstance(f, str) and f not in made] if isinstance(folders, list) else []
    return made


def _remove_made(kernel: str, made: object) -> None:
    """Remove the folders above the removed ``kernel`` that its install made (``made``, as its record has
    them), nearest first, each only while it is empty: never one that was there before (someone else's),
    never one that now holds anything, never above the Jupyter folder, and none where the record names
    other folders than the kernel's own (a kernel copied elsewhere by hand)."""
    if not isinstance(made, list):
        return
    for folder in _folders_above(kernel):
        if not any(isinstance(m, str) and _same_folder(m, folder) for m in made):
            return
        try:
            os.rmdir(folder)
        except OSError:  # not empty (another kernel, someone's file), or gone: it and those above it stay
            return


def _same_folder(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def system_kernels() -> str:
    """The folder ``install`` writes to without --user, --sys-prefix or --prefix: jupyter_client's
    system-wide kernels folder, as its KernelSpecManager computes it here (jupyter_core's first system
    path: /usr/local/share/jupyter on Linux; with ``JUPYTER_PLATFORM_DIRS=1``, the first of
    ``XDG_DATA_DIRS``). Raises :class:`MissingJupyter` without jupyter_client."""
    return os.path.dirname(_directory(_manager(), DEFAULT_NAME, False, False, None))


def _directory(manager: "Any", name: str, user: bool, sys_prefix: bool,  # noqa: ANN401 - a KernelSpecManager
               prefix: "str | None") -> str:
    """The directory install() writes for these options. KernelSpecManager has no public way to ask
    it, and computing it here would copy its rules (user dir, PREFIX/share/jupyter, system)."""
    directory: str = manager._get_destination_dir(name, **_location(user, sys_prefix, prefix))
    return directory


def kernel_json(display_name: str, env: "dict[str, str]", made: "list[str]") -> "dict[str, Any]":
    """The kernelspec: this interpreter running ipykernel, with the flag and ``env`` in its environment, and
    in its metadata the record that it is ours and which folders above it its install made (``made``)."""
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "env": {GENERIC_FLAG: "1", **env},
        "metadata": {"debugger": True, MARKER: {"version": __version__, MADE: made}},
    }


def install(name: str, display_name: str, env: "dict[str, str]", *, user: bool = False,
            sys_prefix: bool = False, prefix: "str | None" = None) -> str:
    """Install the kernelspec; return the directory it was written to.

    Never over a kernel this package did not write: a directory of that name where it would go, or a
    kernel of that name Jupyter already lists (ipykernel's ``python3``, say), is refused with
    :class:`NotOurs`, since installing would replace it. Its own kernel is replaced. The directory is 0755
    and kernel.json 0644, readable by everyone as ipykernel's installer leaves them, so that a shared
    ``--prefix`` or ``--sys-prefix`` kernel is seen by other users' Jupyter. The kernels folder and the
    Jupyter folder above it, where this install makes them (or an earlier install of this package's kernels
    beside it made them), are recorded in kernel.json, so that :func:`uninstall` removes them again.
    """
    manager = _manager()
    try:
        import ipykernel  # noqa: F401 - the kernel runs `python -m ipykernel_launcher`
    except ImportError:
        raise MissingJupyter(f"ipykernel is not installed for {sys.executable}, which the kernel would run",
                             _install_hint(), CAUSE_NO_IPYKERNEL) from None
    name = _checked_name(name)
    spec = kernel_json(display_name, env, [])  # the folders it makes are known once its destination is
    if not flags(spec["env"], warn=False)[0]:
        off = [f"{k}={v}" for k, v in env.items() if k in (*FLAG_VARS, DISABLE_VAR)]
        raise InvalidRequest(f"--env {' '.join(off)} turns off the hook this kernel exists for",
                             "leave it out (a kernel without the hook: python -m ipykernel install)", CAUSE_HOOK_OFF)
    destination = _directory(manager, name, user, sys_prefix, prefix)
    listed = manager.find_kernel_specs().get(name)
    for existing in (destination, listed):
        if existing and os.path.exists(existing) and not _installed_by_us(existing):
            what = f"{existing} was not installed by tms-autopreload" if existing == destination else (
                f"a kernel named {name!r} already exists in {existing}, not installed by tms-autopreload")
            raise NotOurs(f"{what}; installing would replace it", "choose another --name")
    spec["metadata"][MARKER][MADE] = _to_make(destination) or _made_by_earlier(os.path.dirname(destination))
    with tempfile.TemporaryDirectory() as staging:
        source = os.path.join(staging, name)
        os.mkdir(source)
        os.chmod(source, 0o755)  # copytree copies these modes; mkdtemp's 0700 would hide the kernel
        path = os.path.join(source, "kernel.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump(spec, f, indent=1)
        os.chmod(path, 0o644)
        installed: str = manager.install_kernel_spec(source, name, **_location(user, sys_prefix, prefix))
        return installed


def uninstall(name: str, *, user: bool = False, sys_prefix: bool = False, prefix: "str | None" = None) -> str:
    """Remove a kernelspec this package installed, then the folders above it that its install made, where
    they are empty (:func:`_remove_made`); return its directory. Refuses any other kernel.

    Raises :class:`KernelNotFound` when no kernel of that name is found where asked, :class:`NotOurs`
    when the one found was not written by this package.
    """
    manager = _manager()
    name = _checked_name(name)
    if user or sys_prefix or prefix is not None:
        kernel = _directory(manager, name, user, sys_prefix, prefix)
        directory = kernel if os.path.isdir(kernel) else None
        where = f"in {os.path.dirname(kernel)}"
    else:
        directory = manager.find_kernel_specs().get(name)
        where = "among the kernels Jupyter finds"
    if directory is None:
        raise KernelNotFound(f"no kernel named {name!r} {where}",
                             "check the name and the location: "
                             "`jupyter kernelspec list` shows each kernel and where it is")
    if not _installed_by_us(directory):
        raise NotOurs(f"{directory} was not installed by tms-autopreload",
                      f"remove it with `jupyter kernelspec uninstall {name}`")
    import shutil

    made = (_our_record(directory) or {}).get(MADE)
    shutil.rmtree(directory)
    _remove_made(directory, made)
    return directory
