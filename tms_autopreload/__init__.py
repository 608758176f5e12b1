"""Choose torch_memory_saver's LD_PRELOAD build for the CUDA runtime this process really uses.

The package's front door: what it is, its version, and its public API, each name loaded on first use (PEP
562), so that importing the package costs a start almost nothing. The start-up entry that
``tms_autopreload.pth`` runs in every process of a node is :func:`process_startup`
(:mod:`tms_autopreload.startup`, copied into the start module beside the ``.pth``); no PEP 829
``.start``: on 3.15 one makes site.py import ``pkgutil`` and this package in every start, flag or not.

Public: the names in ``__all__`` (docs/reference.md) and the command line, ``tms-autopreload``
(:func:`tms_autopreload.commands.main.main`, also ``python -m tms_autopreload``). Every module of the package is
private: they serve the hook and the commands, and may change in any release.
"""

TYPE_CHECKING = False  # typing costs milliseconds to import
if TYPE_CHECKING:
    from typing import Any

__version__ = "0.1.0"
# The public API, by the private module each name lives in, loaded on first use (PEP 562).
_LAZY = {"process_startup": "startup", "resolve": "decision", "survey": "decision",
         "configure_subprocess": "subprocesses", "activate": "inprocess", "Plan": "verdict", "Report": "decision",
         "Verdict": "verdict", "Error": "errors", "ResolveError": "errors"}
__all__ = [*_LAZY, "__version__"]


def __getattr__(name: str) -> "Any":  # noqa: ANN401 - PEP 562 hook: each lazy name has its own type
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tms_autopreload' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{module}", __name__), name)


def __dir__() -> "list[str]":
    """``dir(tms_autopreload)``: the public API, the lazily loaded names included (PEP 562)."""
    return list(__all__)
