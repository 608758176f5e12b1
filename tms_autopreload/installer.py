"""The install and uninstall commands the package prints, each in the one form that runs where it is printed.

A fix is pasted into the shell that showed it: perhaps one with the flag exported (where every Python
start of a node that nothing fits stops with exit 78), and whose ``PATH`` may lead to another environment's
``pip`` (a venv made ``--without-pip``, a uv venv, no venv activated). So every command :func:`pip_command`
writes:

* starts with :data:`NO_HOOK` (``env TMS_AUTOPRELOAD_DISABLE=1``: ``env`` runs in any shell, csh too), so
  that nothing it starts is hooked, whatever pip version or launcher runs it (the hook also leaves pip,
  ``venv`` and uv's interpreter query alone: :func:`tms_autopreload.environment.unhooked_program`);
* names the environment by its interpreter's path (``/venv/bin/python -m pip``), never a bare ``pip``;
* where that environment has no pip: ``uv pip ... --python`` where uv is on ``PATH`` (but into the user
  site, where uv installs nothing), else ``ensurepip`` first (into the user site too, for a ``--user``
  install: the interpreter's prefix may be another account's); where it has neither, says so;
* installs where the copy it is about lies: ``--user`` for the user site, ``--target DIR`` for a folder on
  ``PYTHONPATH``; a package not installed yet, into the user site where what it goes beside lies there
  (torch_memory_saver beside torch), and says before the command what no command can change from here (an
  interpreter marked externally managed, PEP 668; an environment this account cannot write).

Every message asks here: one function decides the form, the messages only say what to install.
"""

import os
import sys

from .environment import NO_HOOK

__all__ = ["pip_command", "pip_form", "pip_refusal", "where"]


def pip_refusal(site: str) -> "str | None":
    """Why this environment's ``pip uninstall`` removes nothing installed in ``site``, in words, or None
    where it removes it. pip's own rule (``is_local`` and the standard library check of
    ``UninstallPathSet.from_dist``): in a virtual environment only what lies under ``sys.prefix``, else
    anything but the standard library; elsewhere it says "Not uninstalling ..." and goes on."""
    import sysconfig

    real = os.path.realpath(site)
    if real in {os.path.realpath(sysconfig.get_path(p)) for p in ("stdlib", "platstdlib")}:
        return "in the standard library directory"
    if sys.prefix != sys.base_prefix and not real.startswith(os.path.realpath(sys.prefix) + os.sep):
        return "outside this environment"
    return None


def _has_pip() -> bool:
    """Whether this interpreter can run ``-m pip``: pip is on the search path it will have."""
    from .sitepath import package_dir

    return package_dir("pip") is not None


def _user_site(site: str) -> bool:
    """Whether ``site`` is this account's user site directory (where ``pip install --user`` puts packages)."""
    import site as site_module

    user = site_module.getusersitepackages()
    return bool(user) and os.path.realpath(site) == os.path.realpath(user)


def _externally_managed() -> "str | None":
    """The PEP 668 marker that makes pip refuse to install for this interpreter, or None (a venv has none)."""
    if sys.prefix != sys.base_prefix:
        return None
    import sysconfig

    marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
    return marker if os.path.isfile(marker) else None


def _not_writable(site: str) -> "str | None":
    """Why this account cannot install into ``site``, in words (its owner), or None where it can."""
    if os.access(site, os.W_OK):
        return None
    try:
        import pwd

        owner = pwd.getpwuid(os.stat(site).st_uid).pw_name
    except (OSError, KeyError):
        owner = "its owner"
    return f"{site} is not writable by this account (it belongs to {owner}): run it as {owner}"


def pip_command(verb: str, *requirements: str, site: "str | None" = None, reinstall: bool = False,
                python: "str | None" = None, beside: "str | None" = None) -> str:
    """The fix that runs pip's ``verb`` (``install`` or ``uninstall``) for ``requirements`` in this
    environment, or in that of ``python`` (another node's interpreter, which only its path is known of),
    from the shell that shows it: words first where something stands in the way, then the command in
    backticks (:func:`pip_form`).

    ``site``: the directory the package it is about lies in, where the command must put it back (the user
    site, or a ``--target`` folder on ``PYTHONPATH`` that this environment's pip does not touch);
    ``reinstall``: install even over an installed copy of the same version (a damaged one); ``beside``: for
    a package not installed yet, the site directory of what it goes beside (torch's, for torch_memory_saver).
    """
    if python is not None:
        return pip_form(python, verb, [], list(requirements), True, False, True)
    words, options = where(verb, site, reinstall, beside)
    fix = pip_form(sys.executable, verb, options, list(requirements), _has_pip(), _uv_on_path(), _has_ensurepip())
    return f"{'; '.join(words)}: {fix}" if words else fix


def where(verb: str, site: "str | None", reinstall: bool,
          beside: "str | None" = None) -> "tuple[list[str], list[str]]":
    """(what stands in the way, in words; pip's options) for ``verb`` in this interpreter's environment, the
    package lying in ``site`` (None: anywhere): forced again, into the user site or the ``--target`` folder it
    lies in, told that an externally managed interpreter may be changed; whose the environment is where this
    account cannot write it. (Also the left-over ``.pth``'s: ``os`` and ``sys`` only, the rest imported here.)

    A package not installed yet (``site`` None) goes beside what lies in ``beside``: into the user site where
    that is the user site; anywhere else into this environment's own site-packages, which its search path
    holds too (a folder on ``PYTHONPATH`` or a base's site-packages under a venv may be another account's)."""
    words: "list[str]" = []
    options: "list[str]" = ["--force-reinstall"] if reinstall and verb == "install" else []
    if verb == "install" and site is not None:
        if pip_refusal(site):
            options += ["--target", site, "--upgrade"]
        elif _user_site(site):
            options.append("--user")
        blocked = None if "--target" in options else _not_writable(site)
        if blocked:
            words.append(blocked)
    elif verb == "install" and beside is not None and _user_site(beside):
        options.append("--user")
    marker = _externally_managed() if verb == "install" and "--target" not in options else None
    if marker is not None:
        options.append("--break-system-packages")
        words.insert(0, f"this interpreter is marked externally managed ({marker}, PEP 668), so pip installs for "
                        f"it only when told to (or use a venv)")
    return words, options


def pip_form(exe: str, verb: str, options: "list[str]", args: "list[str]", has_pip: bool, uv: bool,
             has_ensurepip: bool) -> str:
    """The one command that runs pip's ``verb`` with ``options`` and ``args`` for the interpreter ``exe``,
    unhooked, in backticks: its own pip where it has one (``has_pip``), else uv's (``uv``: on PATH; a venv uv
    made has no pip, but the command must find uv; uv has no ``--user``), else pip after ``ensurepip``; where
    none of them is there, what to install first. (Also the left-over ``.pth``'s fix, which has only ``os``
    and ``sys``.)"""
    import shlex

    # pip's own variable, not its option, where the interpreter is externally managed: ensurepip obeys it too.
    unmanaged = ["PIP_BREAK_SYSTEM_PACKAGES=1"] if "--break-system-packages" in options else []

    def line(*words: str) -> str:
        return " ".join([NO_HOOK, *(unmanaged if words[0] != "uv" else []), *map(shlex.quote, words)])

    own = (["-y"] if verb == "uninstall" else []) + [o for o in options if o != "--break-system-packages"]
    pip = line(exe, '-m', 'pip', verb, *own, *args)
    if has_pip:
        return f"`{pip}`"
    user = "--user" in options  # uv has no user site ("pip's `--user` is unsupported"): pip's command only
    uv_options = ["--reinstall" if o == "--force-reinstall" else o for o in options]
    if uv and not user:
        return f"`{line('uv', 'pip', verb, '--python', exe, *uv_options, *args)}`"
    if has_ensurepip and not unmanaged:  # ensurepip drops every PIP_ variable, so it obeys PEP 668's marker
        # pip itself goes where the install goes: the user site is this account's, the prefix may not be.
        return f"`{line(exe, '-m', 'ensurepip', *(['--user'] if user else []))} && {pip}`"
    then = pip if user else line('uv', 'pip', verb, '--python', exe, *uv_options, *args)
    return (f"{exe} has neither pip nor ensurepip (a distribution's interpreter without its pip package): install "
            f"your distribution's pip for it (Debian: python3-pip){'' if user else ' or uv'}, then `{then}`")


def _uv_on_path() -> bool:
    import shutil

    return shutil.which("uv") is not None


def _has_ensurepip() -> bool:
    """Whether this interpreter's standard library has ensurepip (a distribution may leave it out)."""
    return os.path.isdir(os.path.join(os.path.dirname(os.__file__), "ensurepip"))
