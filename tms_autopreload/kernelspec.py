"""A Jupyter kernel for this interpreter that starts with the preload flag: quick experiments in notebooks.

The kernelspec's ``env`` carries ``TMS_AUTOPRELOAD=1``, so the kernel process resolves and re-execs
at start like any flagged interpreter (same PID, same argv: the ``-f CONNECTION_FILE`` it was
given still names its connection file). Written and removed with jupyter_client's own
``KernelSpecManager``, so a kernel lands exactly where ``jupyter kernelspec install`` would put
it. jupyter_client and ipykernel are imported only here: they are not dependencies of the package.
"""

import json
import os
import sys
import tempfile

from . import GENERIC_FLAG, __version__

__all__ = ["install", "uninstall", "MissingJupyter", "DEFAULT_NAME", "MARKER"]

DEFAULT_NAME = "python3-tms-autopreload"
MARKER = "tms_autopreload"  # metadata key: uninstall removes only kernels this package wrote
INSTALL_HINT = "pip install jupyter_client ipykernel"


class MissingJupyter(RuntimeError):
    """jupyter_client or ipykernel is not installed for this interpreter; the message says what to run."""


def _manager():  # noqa: ANN202 - jupyter_client's type, imported lazily
    try:
        from jupyter_client.kernelspec import KernelSpecManager
    except ImportError:
        raise MissingJupyter(f"jupyter_client is not installed for {sys.executable}: {INSTALL_HINT}") from None
    return KernelSpecManager()


def _location(user: bool, sys_prefix: bool, prefix: "str | None") -> "dict[str, object]":
    """KernelSpecManager's keywords for one of --user / --sys-prefix / --prefix (none: system-wide)."""
    if sys_prefix:
        prefix = sys.prefix
    return {"user": user, "prefix": prefix}


def kernel_json(display_name: str, env: "dict[str, str]") -> "dict[str, object]":
    """The kernelspec: this interpreter running ipykernel, with the flag and ``env`` in its environment."""
    return {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "env": {GENERIC_FLAG: "1", **env},
        "metadata": {"debugger": True, MARKER: {"version": __version__}},
    }


def install(name: str, display_name: str, env: "dict[str, str]", *, user: bool = False,
            sys_prefix: bool = False, prefix: "str | None" = None) -> str:
    """Install the kernelspec; return the directory it was written to."""
    manager = _manager()
    try:
        import ipykernel  # noqa: F401 - the kernel runs `python -m ipykernel_launcher`
    except ImportError:
        raise MissingJupyter(f"ipykernel is not installed for {sys.executable}, which the kernel would run: "
                             f"{INSTALL_HINT}") from None
    with tempfile.TemporaryDirectory() as source:
        with open(os.path.join(source, "kernel.json"), "w", encoding="utf-8") as f:
            json.dump(kernel_json(display_name, env), f, indent=1)
        return manager.install_kernel_spec(source, name, replace=True, **_location(user, sys_prefix, prefix))


def uninstall(name: str, *, user: bool = False, sys_prefix: bool = False, prefix: "str | None" = None) -> str:
    """Remove a kernelspec this package installed; return its directory. Refuses any other kernel.

    Raises KeyError when no kernel of that name is found where asked, ValueError when the one
    found was not written by this package.
    """
    manager = _manager()
    if user or sys_prefix or prefix:
        # The directory install() wrote for these options. KernelSpecManager has no public way to
        # ask it, and computing it here would copy its rules (user dir, PREFIX/share/jupyter, system).
        kernels = manager._get_destination_dir(name, **_location(user, sys_prefix, prefix))
        directory = kernels if os.path.isdir(kernels) else None
    else:
        directory = manager.find_kernel_specs().get(name)
    if directory is None:
        raise KeyError(name)
    try:
        with open(os.path.join(directory, "kernel.json"), encoding="utf-8") as f:
            ours = MARKER in (json.load(f).get("metadata") or {})
    except (OSError, ValueError, AttributeError):
        ours = False
    if not ours:
        raise ValueError(f"{directory} was not installed by tms-autopreload; remove it with "
                         f"`jupyter kernelspec uninstall {name}`")
    import shutil

    shutil.rmtree(directory)
    return directory
