"""The ``tms-autopreload`` console script of an install before the commands had their own wing.

Such a script runs ``from tms_autopreload.cli import main``, and pip rewrites it only when it reinstalls the
package. The command itself is :mod:`tms_autopreload.commands.main`."""

from .commands.main import main

__all__ = ["main"]
