"""The package's one error model: every error it raises on purpose is an :class:`Error`.

An :class:`Error` carries three things, each for its own reader: ``message`` (what was found, for
a person), ``fix`` (what to do about it; every "Fix:" line the package prints comes from this
field) and ``cause`` (a short machine-readable word, listed in docs/reference.md, for code that
branches on data rather than on wording: scripts, ``doctor --json``, our own tests).
"""

TYPE_CHECKING = False  # typing costs ~5 ms to import on the start-up path
if TYPE_CHECKING:
    from .plan import Report

__all__ = ["Error", "ResolveError", "shown"]


class Error(Exception):
    """The base of every error the package raises on purpose.

    Subclasses name the part that raised it and give ``cause`` a default; a raise site may give a
    more precise cause. ``str()`` is the message followed by its fix, as a person reads it.
    """

    cause: str = "error"

    def __init__(self, message: str, fix: str | None = None, cause: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
        if cause is not None:
            self.cause = cause

    def __str__(self) -> str:
        return self.message if self.fix is None else f"{self.message}. Fix: {self.fix}"


class ResolveError(Error, RuntimeError):
    """No preload plan exists for this process (a RuntimeError too, as it was before the base).

    ``report`` holds the full survey (runtime, every candidate with its verdict) when one
    was made, so callers such as ``tms-autopreload doctor`` can show it.
    """

    cause = "no-plan"

    def __init__(self, message: str, report: "Report | None" = None, *, fix: str | None = None,
                 cause: str | None = None) -> None:
        super().__init__(message, fix, cause)
        self.report = report


def shown(value: str, limit: int = 60) -> str:
    """``value`` as a message quotes it: repr, and cut with its length when longer than ``limit``."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
