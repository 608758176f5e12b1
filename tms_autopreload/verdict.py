"""What every step of the survey answers for one candidate: its :class:`Verdict`, and the :class:`Plan` it gives.

The start-up hook, the commands and ``doctor``'s document read both (the survey's whole answer is
:class:`tms_autopreload.decision.Report`); :mod:`tms_autopreload.attempt` makes them for one build.
"""

from .environment import ADDED_VAR, STATE_VAR, state_key
from .environment import added_record

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from .builds import Build
    from .runtime import Runtime

__all__ = ["Verdict", "Plan", "CHOSEN", "LOADS", "REJECTED", "UNTRIED", "STATUSES"]

# Verdict.status values (``doctor --json`` ``candidates[].status``).
CHOSEN = "chosen"  # the plan's build
LOADS = "loads"  # fits and loads (the survey makes the most preferred of these CHOSEN)
REJECTED = "rejected"  # cannot be preloaded here: ``reason`` and ``cause`` say why
UNTRIED = "untried"  # not judged to the end: no runtime was decided, or a preferred build was chosen first
STATUSES = (CHOSEN, LOADS, REJECTED, UNTRIED)


class Verdict:
    """What became of one candidate: its status, why (``reason`` for a person, ``cause`` for code, one of
    :data:`tms_autopreload.errors.CAUSES`; None for the chosen one), the real loader's answer, what would
    help, and the plan it gives when it loads (each step of the survey returns one)."""

    __slots__ = ("build", "status", "reason", "cause", "loader_ok", "fix", "plan")

    def __init__(self, build: "Build", status: str, reason: str, cause: str | None = None, *,
                 loader_ok: bool | None = None, fix: str | None = None, plan: "Plan | None" = None) -> None:
        self.build = build
        self.status = status  # one of STATUSES
        self.reason = reason
        self.cause = cause
        self.loader_ok = loader_ok  # the real loader's answer (``doctor --json`` ``loads``); None when not traced
        self.fix = fix  # what the user can do, for the error when no build fits
        self.plan = plan  # the plan with this build, when it loads (LOADS or CHOSEN)

    def but(self, **changes: object) -> "Verdict":
        """This verdict with ``changes`` (``status=CHOSEN``, say): a new one, since a verdict once made is what
        a step of the survey answered, and the survey's later steps only add to it."""
        new = object.__new__(Verdict)
        for name in self.__slots__:
            setattr(new, name, changes.pop(name, getattr(self, name)))
        if changes:
            raise TypeError(f"a verdict has no {', '.join(changes)}")
        return new

    def __repr__(self) -> str:
        cause = f", cause={self.cause!r}" if self.cause else ""
        return f"Verdict(build={self.build.path!r}, status={self.status!r}{cause})"


class Plan:
    """The environment that makes this process start with the right hook."""

    __slots__ = ("build", "ld_preload", "ld_library_path", "runtime", "warnings", "binding", "added")

    def __init__(self, build: str, ld_preload: str, ld_library_path: str | None, runtime: "Runtime",
                 warnings: tuple[str, ...] = (), binding: str = "",
                 added: "tuple[tuple[str, ...], tuple[str, ...]]" = ((), ())) -> None:
        self.build = build  # real path of the chosen file
        self.ld_preload = ld_preload  # the complete new LD_PRELOAD value
        self.ld_library_path = ld_library_path  # the complete new LD_LIBRARY_PATH, None to leave it
        self.runtime = runtime
        self.warnings = warnings
        self.binding = binding  # how the hook's runtime need binds the runtime library, in words
        # What the plan adds, besides the hook: (LD_PRELOAD entries, LD_LIBRARY_PATH entries), an earlier
        # plan's included where they stay; a command run where it is applied takes them out again.
        self.added = added

    def changes(self) -> dict[str, str]:
        """Variables to set, and their values."""
        env = {"LD_PRELOAD": self.ld_preload}
        if self.ld_library_path is not None:
            env["LD_LIBRARY_PATH"] = self.ld_library_path
        return env

    def environment(self) -> dict[str, str]:
        """What a process applying the plan sets: :meth:`changes`, the state that lets its flagged children
        skip resolving (what it was resolved for: this prefix, the overrides, the build), and the record of
        what it added (:mod:`tms_autopreload.commands.caller_env` reads it back)."""
        return {**self.changes(), STATE_VAR: state_key(self.build), ADDED_VAR: added_record(*self.added)}

    def __repr__(self) -> str:
        llp = "" if self.ld_library_path is None else f", ld_library_path={self.ld_library_path!r}"
        return f"Plan(build={self.build!r}, ld_preload={self.ld_preload!r}{llp})"
