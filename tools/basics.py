"""What every tool module shares: the error a set-up step raises, running a program, the environment a
test gives one, and the download cache with its locks.

The bottom layer of tools/: it imports no module of its own, so that every other (apt, standins,
downloads, tms_source, sandbox, rootfs, ...) can import it without a circle.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
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
    """The environment of the suite's own pip commands: this one, read with no pip configuration file.

    A machine's pip configuration may cap versions (a global ``constraint =`` file); the suite installs
    exactly what it pins. ``PIP_CONSTRAINT=`` and ``--isolated`` do not lift a constraint that a
    configuration file names; ``PIP_CONFIG_FILE=/dev/null`` makes pip read none."""
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull}


def clean_env(**extra: str) -> dict[str, str]:
    """A minimal environment: nothing of the test runner's LD_*, PYTHON*, TMS_* or SLIME_* leaks in."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TERM", "TMPDIR") if k in os.environ}
    env.update(extra)
    return env


@contextlib.contextmanager
def cache_lock(name: str) -> Iterator[None]:
    """Hold an exclusive lock on one cache entry, so that two runs sharing the cache (a second
    checkout's tests, the demo beside the suite) never build or download the same entry at once."""
    lock = CACHE / "locks" / f"{name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield
