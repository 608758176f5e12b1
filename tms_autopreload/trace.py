"""Ask the real loader where every object of a process would come from, without running it.

With ``LD_TRACE_LOADED_OBJECTS=1`` in its environment, glibc's ld.so maps nothing, runs no
constructor, prints one line per object (``ldd``'s output) and exits 0. The preload list,
LD_LIBRARY_PATH and the cache are read exactly as for the real start, so a plan that traces
clean will load. Missing dependencies show on stdout as ``NAME => not found``; preload files
it skips, and symbol-version failures, show on stderr.

The child is started with ``os.posix_spawn`` rather than ``subprocess``: importing
``subprocess`` alone costs about 10 ms, the whole budget of a resolve.
"""

import os

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Trace", "Tracing", "collect", "run_trace", "run_traces", "spawn", "start_traces"]


# glibc elf/rtld.c, for a preload entry it cannot load: "ERROR: ld.so: object '%s' from %s cannot be
# preloaded (%s): ignored.\n", where %s is LD_PRELOAD or /etc/ld.so.preload. The name may hold any
# byte but NUL, newlines included, so the message is cut out by its fixed parts, not by lines.
_SKIP_HEAD, _SKIP_FROM, _SKIP_WHY, _SKIP_TAIL = ("ERROR: ld.so: object '", "' from ", " cannot be preloaded (",
                                                 "): ignored.\n")
# The names Linux gives its vDSO (x86-64, aarch64, riscv: linux-vdso.so.1; i386: linux-gate.so.1; ppc, s390: the
# 32- and 64-bit ones), which a trace lists as it lists an object found in the current directory.
_VDSO = frozenset({"linux-vdso.so.1", "linux-gate.so.1", "linux-vdso32.so.1", "linux-vdso64.so.1"})


class Trace:
    """The loader's answer for one environment."""

    __slots__ = ("resolved", "loaded", "missing", "errors", "skipped", "status")

    def __init__(self, resolved: dict[str, str] | None = None, loaded: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), errors: tuple[str, ...] = (),
                 skipped: tuple[tuple[str, str], ...] = (), status: int = 0) -> None:
        self.resolved = resolved or {}  # DT_NEEDED name -> path
        self.loaded = loaded  # paths of objects named by path (the program, preloads)
        self.missing = missing  # names that resolved to "not found"
        self.errors = errors  # the loader's own messages, but for skipped preload entries
        self.skipped = skipped  # (preload entry, why) the loader ignored and went on without
        self.status = status

    @property
    def ok(self) -> bool:
        """The program would start (preload entries the loader skips do not stop it)."""
        return not self.missing and not self.errors and self.status == 0

    def skip_of(self, name: str) -> "str | None":
        """Why the loader skipped the preload entry whose file is named ``name``, or None."""
        return next((why for entry, why in self.skipped if os.path.basename(entry) == name), None)

    def reason(self) -> str:
        """The loader's own words for why this would not start."""
        parts = [f"{name} => not found" for name in self.missing] + list(self.errors)
        if self.status and not parts:
            parts.append(f"the traced loader exited with status {self.status}")
        return "; ".join(parts)


def _take_skipped(output: str) -> "tuple[str, list[tuple[str, str]]]":
    """(``output`` without the loader's skipped-preload messages, (entry, why) of each)."""
    skipped: list[tuple[str, str]] = []
    kept: list[str] = []
    pos = 0
    while (start := output.find(_SKIP_HEAD, pos)) >= 0:
        name_at = start + len(_SKIP_HEAD)
        from_at = output.find(_SKIP_FROM, name_at)
        why_at = output.find(_SKIP_WHY, from_at) if from_at >= 0 else -1
        end = output.find(_SKIP_TAIL, why_at) if why_at >= 0 else -1
        if end < 0:
            break
        kept.append(output[pos:start])
        skipped.append((output[name_at:from_at], output[why_at + len(_SKIP_WHY):end]))
        pos = end + len(_SKIP_TAIL)
    kept.append(output[pos:])
    return "".join(kept), skipped


def _parse(output: str, status: int) -> Trace:
    resolved: dict[str, str] = {}
    loaded: list[str] = []
    missing: list[str] = []
    errors: list[str] = []
    output, skipped = _take_skipped(output)
    # Lines end with "\n" only: str.splitlines would also split a file name at "\r" or "\x1e".
    for raw in output.split("\n"):
        line = raw.strip()
        if not line:
            continue
        if not raw.startswith("\t"):
            errors.append(line)
            continue
        if " => " in line:
            name, _, where = line.partition(" => ")
            where = where.strip()
            if where == "not found":
                missing.append(name)
            else:
                resolved[name] = where.rsplit(" (0x", 1)[0].strip()
        else:
            # An object named by a path (the program's loader, a preloaded object), or one the loader opened by
            # its bare name, where an empty search path entry (the current directory) found it: the loader
            # prints the name once where the path it opened is the name. The kernel's vDSO is printed so too.
            path = line.rsplit(" (0x", 1)[0].strip()
            if "/" in path:
                loaded.append(path)
            elif path not in _VDSO:
                resolved[path] = path
    return Trace(resolved, tuple(loaded), tuple(missing), tuple(errors), tuple(skipped), status)


def spawn(argv: "list[str]", env: dict[str, str]) -> "tuple[int, int]":
    """(pid, read end of its output pipe) of ``argv`` started under ``env``: stdout and stderr on one pipe,
    stdin from /dev/null. Raises OSError when it cannot be started."""
    read_fd, write_fd = os.pipe()
    try:
        pid = os.posix_spawn(
            argv[0], argv, env,
            file_actions=[(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_DUP2, write_fd, 2),
                          (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
        )
    except OSError:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    return pid, read_fd


def collect(pid: int, read_fd: int) -> "tuple[str, int]":
    """(all it wrote, its exit code) of a program :func:`spawn` started."""
    chunks: list[bytes] = []
    try:
        while data := os.read(read_fd, 65536):
            chunks.append(data)
    finally:
        os.close(read_fd)  # a loader still writing then stops at its next write
        _, wait_status = os.waitpid(pid, 0)  # reaped even when the read was interrupted
    return b"".join(chunks).decode("utf-8", "replace"), os.waitstatus_to_exitcode(wait_status)


def start_traces(executables: "list[str]", env: dict[str, str]) -> "Callable[[], list[Trace | OSError]]":
    """Start tracing each of ``executables`` under ``env`` (LD_TRACE_LOADED_OBJECTS is added here), all at
    once; the function returned waits for their answers, in order. Call it exactly once, also when the
    caller fails in between: it reaps the traced programs (:class:`Tracing` does, for a ``with`` block).

    stdout and stderr share one pipe per program: the loader indents every trace line with a tab
    and none of its messages, which is how they are told apart again. The traced programs never
    run, so reading one to end of file cannot wait on another; started together, their loaders
    work side by side, and beside the caller until it asks. A program that cannot be started at all
    gives its OSError in its place.
    """
    env = dict(env)
    env["LD_TRACE_LOADED_OBJECTS"] = "1"
    started: "list[tuple[int, int] | OSError]" = []
    for executable in executables:
        try:
            started.append(spawn([executable], env))
        except OSError as exc:
            started.append(exc)

    def answers_in_order() -> "list[Trace | OSError]":
        answers: "list[Trace | OSError]" = []
        try:
            for s in started:
                answers.append(s if isinstance(s, OSError) else _parse(*collect(*s)))
        finally:
            for s in started[len(answers) + 1:]:  # after an exception: reap the rest, unread
                if not isinstance(s, OSError):
                    os.close(s[1])
                    os.waitpid(s[0], 0)
        return answers

    return answers_in_order


class Tracing:
    """The traces of ``executables`` as a ``with`` block holds them: started on entering it (:func:`start_traces`
    under ``env``), their answers waited for once (:meth:`answers`), started again under another environment
    (:meth:`restart`), and reaped on every way out of the block, an exception or an interrupt included, where
    nobody asked for their answers."""

    __slots__ = ("executables", "_env", "_collect")

    def __init__(self, executables: "list[str]", env: dict[str, str]) -> None:
        self.executables = executables
        self._env = env
        self._collect: "Callable[[], list[Trace | OSError]]" = list  # what reaps the traces started: none yet

    def __enter__(self) -> "Tracing":
        self._collect = start_traces(self.executables, self._env)
        return self

    def answers(self) -> "list[Trace | OSError]":
        """Wait for the traces' answers, in the order of ``executables``; the traced programs are reaped then
        (also where the wait is interrupted), and a second call answers nothing."""
        collect, self._collect = self._collect, list
        return collect()

    def restart(self, env: dict[str, str]) -> None:
        """Reap the traces started, their answers unwanted, and start them again under ``env``."""
        self.answers()
        self._collect = start_traces(self.executables, env)

    def __exit__(self, *exc: object) -> None:
        self.answers()


def run_traces(executables: "list[str]", env: dict[str, str]) -> "list[Trace | OSError]":
    """Trace each of ``executables`` under ``env``, all at once, and wait for them (:func:`start_traces`)."""
    return start_traces(executables, env)()


def run_trace(executable: str, env: dict[str, str]) -> Trace:
    """Trace ``executable`` alone (:func:`run_traces`); raises OSError when it cannot be started at
    all: that is the interpreter's fault, not any candidate's."""
    trace, = run_traces([executable], env)
    if isinstance(trace, OSError):
        raise trace
    return trace
