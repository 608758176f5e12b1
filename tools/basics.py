"""What every tool module shares: the error a set-up step raises, running a program, the environment a
test gives one, and the download cache with its locks.

The bottom layer of tools/: it imports no module of its own, so that every other (apt, standins,
downloads, tms_source, sandbox, rootfs, ...) can import it without a circle.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import fcntl
import functools
import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("TMS_TEST_CACHE", Path.home() / ".cache" / "tms-autopreload-tests"))


class SetupError(RuntimeError):
    """This machine lacks something a scenario needs; the message says what."""


def run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[Any]:  # noqa: ANN401 - subprocess.run's keywords
    kw.setdefault("check", True)
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    try:
        return subprocess.run(cmd, **kw)
    except subprocess.CalledProcessError as exc:
        raise SetupError(f"{' '.join(map(str, cmd))} failed ({exc.returncode}):\n{exc.stdout}\n{exc.stderr}") from None


def pip_env() -> dict[str, str]:
    """The environment of the suite's own pip commands: this one, with the machine's pip configuration
    minus its version caps.

    A machine's pip configuration may cap versions (a global ``constraint =`` file); the suite installs
    exactly what it pins. ``PIP_CONSTRAINT=`` (an empty value pip ignores) and ``--isolated`` do not lift a
    constraint that a configuration file names, and ``PIP_CONFIG_FILE=/dev/null`` lifts it with everything
    else the configuration says: where the index is, its certificate, local wheel folders, without which a
    machine behind a proxy reaches no index at all. So the configuration pip reads is written out again
    (``pip config list``) into a file of its own with every ``constraint`` set to ``/dev/null``: pip reads
    the file ``PIP_CONFIG_FILE`` names after the global ones, and a key given there replaces theirs."""
    env = {k: v for k, v in os.environ.items() if k not in ("PIP_CONSTRAINT", "PIP_CONFIG_FILE")}
    reads = tuple(sorted((k, v) for k, v in env.items() if k.startswith("PIP_") or k in _PIP_CONFIG_PLACES))
    return {**env, "PIP_CONFIG_FILE": str(_uncapped_pip_config(reads))}


# The variables that say where pip's configuration files are (besides the interpreter's own prefix): with pip's
# own PIP_* variables, all of the environment that `pip config list` reads. Keyed on these alone, the listing (a
# pip run, about 0.35 CPU-seconds) is made once a process, not once for each environment a test sets.
_PIP_CONFIG_PLACES = ("HOME", "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS")


@functools.cache
def _uncapped_pip_config(env: tuple[tuple[str, str], ...]) -> Path:
    """The pip configuration of ``env`` (the variables pip's configuration depends on) without its constraints,
    as a file (see ``pip_env``)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                            env=dict(env), check=True).stdout
    sections: dict[str, dict[str, str]] = {"global": {"constraint": os.devnull}}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, name = key.rpartition(".")
        if not section or section.startswith(":env:") or not value:
            continue  # what the environment says, pip reads from it again
        sections.setdefault(section, {})[name] = os.devnull if name == "constraint" else ast.literal_eval(value)
    config = configparser.ConfigParser(interpolation=None)
    config.read_dict(sections)
    text = io.StringIO()
    config.write(text)
    path = CACHE / "pip" / f"{hashlib.sha256(text.getvalue().encode()).hexdigest()[:16]}.conf"
    if not path.exists():  # named for its content: runs that share the cache write the same bytes
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_suffix(f".{os.getpid()}")
        part.write_text(text.getvalue())
        part.replace(path)
    return path


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: nothing of the test runner's LD_*, PYTHON*, TMS_* or SLIME_* leaks in."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TERM", "TMPDIR") if k in os.environ}
    env.update(extra)
    return env


@contextlib.contextmanager
def file_lock(lock: Path) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock`` (made if missing), so that processes sharing what it guards
    build it one at a time: the first builds, the others wait and then find it built."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def cache_lock(name: str) -> contextlib.AbstractContextManager[None]:
    """Hold an exclusive lock on one cache entry, so that two runs sharing the cache (a second
    checkout's tests, the demo beside the suite) never build or download the same entry at once."""
    return file_lock(CACHE / "locks" / f"{name}.lock")
