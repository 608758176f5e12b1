"""Debian packages the suite installs itself when missing, from this machine's apt (as root only).

One place for it: a set-up step that needs a program names its package and the file that shows
it is installed; everything else (the lock shared by parallel runs, ``apt-get update`` when the
lists are stale, the message when this user cannot install) is the same for all of them.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from basics import SetupError, cache_lock, clean_env


def ensure(packages: dict[str, str], purpose: str) -> None:
    """Install each package whose file (its value: a path, or a program name looked up on PATH) is
    missing; ``purpose`` says what needs them, for the message when this user cannot install."""
    def missing() -> list[str]:
        return [name for name, file in packages.items()
                if not (os.path.exists(file) if "/" in file else shutil.which(file))]

    if not missing():
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise SetupError(f"{purpose} needs {', '.join(missing())}: `apt-get install {' '.join(missing())}` (as root)")
    with cache_lock("apt-get"):
        if not missing():
            return
        env = clean_env(DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *missing()]
        if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True)
            r = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if r.returncode != 0:
                raise SetupError(f"{purpose} needs {', '.join(missing())}; {' '.join(cmd)} failed:\n{r.stderr}")
