"""The one exception type the resolver raises."""

TYPE_CHECKING = False  # typing costs ~5 ms to import on the start-up path
if TYPE_CHECKING:
    from .plan import Report

__all__ = ["ResolveError", "shown"]


class ResolveError(RuntimeError):
    """No preload plan exists for this process.

    The message names what was found, why each candidate was rejected, and the fix.
    ``report`` holds the full survey (runtime, every candidate with its verdict) when one
    was made, so callers such as ``tms-autopreload doctor`` can show it.
    """

    def __init__(self, message: str, report: "Report | None" = None) -> None:
        super().__init__(message)
        self.report = report


def shown(value: str, limit: int = 60) -> str:
    """``value`` as a message quotes it: repr, and cut with its length when longer than ``limit``."""
    return repr(value) if len(value) <= limit else f"{value[:limit]!r}... ({len(value)} characters)"
