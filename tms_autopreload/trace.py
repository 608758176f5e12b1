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

__all__ = ["Trace", "run_trace"]


class Trace:
    """The loader's answer for one environment."""

    __slots__ = ("resolved", "loaded", "missing", "errors", "status")

    def __init__(self, resolved: dict[str, str] | None = None, loaded: tuple[str, ...] = (),
                 missing: tuple[str, ...] = (), errors: tuple[str, ...] = (), status: int = 0) -> None:
        self.resolved = resolved or {}  # DT_NEEDED name -> path
        self.loaded = loaded  # paths of objects named by path (the program, preloads)
        self.missing = missing  # names that resolved to "not found"
        self.errors = errors  # the loader's own messages
        self.status = status

    @property
    def ok(self) -> bool:
        return not self.missing and not self.errors and self.status == 0

    def reason(self) -> str:
        """The loader's own words for why this would not start."""
        parts = [f"{name} => not found" for name in self.missing] + list(self.errors)
        if self.status and not parts:
            parts.append(f"the traced loader exited with status {self.status}")
        return "; ".join(parts)


def _parse(output: str, status: int) -> Trace:
    resolved: dict[str, str] = {}
    loaded: list[str] = []
    missing: list[str] = []
    errors: list[str] = []
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
            path = line.rsplit(" (0x", 1)[0].strip()
            if path.startswith("/"):
                loaded.append(path)
    return Trace(resolved, tuple(loaded), tuple(missing), tuple(errors), status)


def run_trace(executable: str, env: dict[str, str]) -> Trace:
    """Trace ``executable`` under ``env`` (LD_TRACE_LOADED_OBJECTS is added here).

    stdout and stderr share one pipe: the loader indents every trace line with a tab and
    none of its messages, which is how they are told apart again. The traced program never
    runs, so reading to end of file cannot wait on it. Raises OSError when ``executable``
    cannot be started at all: that is the interpreter's fault, not any candidate's.
    """
    env = dict(env)
    env["LD_TRACE_LOADED_OBJECTS"] = "1"
    read_fd, write_fd = os.pipe()
    try:
        pid = os.posix_spawn(
            executable, [executable], env,
            file_actions=[(os.POSIX_SPAWN_DUP2, write_fd, 1), (os.POSIX_SPAWN_DUP2, write_fd, 2),
                          (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0)],
        )
    except OSError:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    chunks: list[bytes] = []
    try:
        while data := os.read(read_fd, 65536):
            chunks.append(data)
    finally:
        os.close(read_fd)
    _, wait_status = os.waitpid(pid, 0)
    return _parse(b"".join(chunks).decode("utf-8", "replace"), os.waitstatus_to_exitcode(wait_status))
