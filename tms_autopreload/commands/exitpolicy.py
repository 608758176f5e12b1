"""How a command of the CLI ends: its exit codes, no plan, a failed write, a signal.

The codes are :data:`EXIT_CODES`.

Every command ends with one of :data:`EXIT_CODES`; where it needs a plan and there is none, it says the
error and exits :data:`EXIT_NO_PLAN` (:func:`plan_or_fail`). Two rules, each applied by
:func:`tms_autopreload.commands.main.main` around every command:

* standard output that cannot be written (a full disk, a closed pipe) raises :class:`WriteError`
  wherever the command printed (:func:`guarded_stdout`), so that it is told apart from every other
  OSError and said in one line, as coreutils says it;
* SIGTERM and SIGHUP can be made to end a command as Ctrl-C does, through its ``finally`` blocks
  (:func:`unwinding_signals`), for a command whose child and files must not outlive it.
  :func:`signal_of` names the signal that ended a command, for its 128+N exit code.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterator

    from _typeshed import ReadableBuffer

    from ..verdict import Plan
    from ..decision import Report

__all__ = ["WriteError", "guarded_stdout", "Interrupted", "INTERRUPTS", "unwinding_signals", "signal_of",
           "plan_or_fail", "say_warnings", "EXIT_OK", "EXIT_NO_PLAN", "EXIT_USAGE", "EXIT_CODES"]

EXIT_OK = 0
EXIT_NO_PLAN = 1
EXIT_USAGE = 2
# One table, shown by --help and copied into the README's (a test compares them).
EXIT_CODES = (
    ("0", "the plan exists, or the command did what was asked"),
    ("1", "no plan (the reason is printed), a failing check (doctor: a driver that cannot run torch's CUDA, or "
          "start-up files that leave flagged starts unhooked, too), "
          "a kernel action refused or failed, a write error"),
    ("2", "usage error (an unreadable doctor --nodes FILE too), a tool the command needs (Ray, jupyter_client) "
          "is not installed, or doctor --ray reached no cluster"),
    ("78", "the start-up hook of a flagged process: no plan (EX_CONFIG), before user code runs"),
    ("126/127", "run: the command could not be executed / was not found"),
    ("129/130/143", "ended by SIGHUP / SIGINT (Ctrl-C) / SIGTERM; doctor --deep first ends its child and "
                    "deletes its log (130 also: the start-up hook interrupted while resolving)"),
)


def plan_or_fail(report: "Report") -> "Plan | None":
    """The report's plan, its warnings said; None, its error said, when there is none."""
    if report.plan is None:
        print(f"tms-autopreload: {report.error}", file=sys.stderr)
        return None
    say_warnings(report)
    return report.plan


def say_warnings(report: "Report") -> None:
    """The survey's warnings, and its plan's, on stderr: stdout keeps what scripts read."""
    for w in report.warnings + (report.plan.warnings if report.plan else ()):
        print(f"tms-autopreload: warning: {w}", file=sys.stderr)


class WriteError(Exception):
    """Standard output could not be written; the message is the system's reason."""


class _Stdout(io.RawIOBase):
    """File descriptor 1, whose failed writes raise :class:`WriteError`: a full disk or a closed pipe
    is then told apart from every other OSError, wherever the command printed. After a failure it
    takes and drops everything, so that nothing is retried at exit."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return 1

    def isatty(self) -> bool:
        return os.isatty(1)

    def write(self, data: "ReadableBuffer") -> int:
        if self.failed:
            return len(memoryview(data))
        try:
            return os.write(1, data)
        except OSError as exc:
            self.failed = True
            raise WriteError(exc.strerror or str(exc)) from None


@contextlib.contextmanager
def guarded_stdout() -> "Iterator[None]":
    """``sys.stdout`` over :class:`_Stdout` while a command runs, when it is file descriptor 1 (the
    console script); put back after, so that a caller of :func:`~tms_autopreload.commands.main.main` keeps its own."""
    current = sys.stdout
    try:
        fd = current.fileno() if current is not None else 1  # None: fd 1 was closed at start (`cmd >&-`)
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        fd = None
    if fd != 1:
        yield
        return
    if current is not None:
        current.flush()
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(_Stdout()), encoding=getattr(current, "encoding", None) or "utf-8",
                                  errors=getattr(current, "errors", None) or "strict",
                                  line_buffering=getattr(current, "line_buffering", False))
    try:
        yield
    finally:
        guarded, sys.stdout = sys.stdout, current
        guarded.flush()  # raises WriteError unless that was raised already (then it drops what is left)


class Interrupted(BaseException):
    """A signal asked this command to stop; ``finally`` blocks run on the way out, as for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


# What a command ended by a signal raises: Ctrl-C's own, or ours for the signals unwinding_signals takes.
INTERRUPTS = (Interrupted, KeyboardInterrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def unwinding_signals(enabled: bool = True) -> "Iterator[None]":
    """While enabled, SIGTERM and SIGHUP raise :class:`Interrupted`, so that they end the command
    through its ``finally`` blocks as Ctrl-C does; a signal this process ignores stays ignored.

    Only where a command asks for it: elsewhere (Ray's client, say) a signal keeps its default
    action, which no blocking call can delay. The handlers before are put back after.
    """
    handlers = {}
    if enabled:
        for signum in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(signum) is not signal.SIG_IGN:
                handlers[signum] = signal.signal(signum, _interrupt)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


def signal_of(exc: "Interrupted | KeyboardInterrupt") -> signal.Signals:
    """The signal that ended a command (one of :data:`INTERRUPTS`): its exit code is 128 + it."""
    return signal.Signals(exc.signum if isinstance(exc, Interrupted) else signal.SIGINT)
