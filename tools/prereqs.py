"""What the tests need from the machine, checked before any test runs and said in one message.

Without this, a missing compiler or interpreter shows up as dozens of failing scenarios, each
naming the same cause. ``make test`` and ``make check`` run this module (with the test venv's
Python, whose uv finds or installs interpreters) before any test; it asks the same
functions the tests use (``locate_python``, the C compiler, the namespace probe, the set-up steps
that install Debian's packages), so that what it accepts is exactly what the suite can use.

Each requirement is one row of :data:`NEEDS`: what it is, which lanes need it (``check``, the
fast lane without downloads of torch or Ray, ``test``, the whole suite, and ``aarch64``, the suite's
arm64 root file system under emulation alone), how to tell whether this machine has it and how to
get it. Adding a requirement is adding a row.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import apt  # noqa: E402
import emulation  # noqa: E402
from rootfs import bootstrapper  # noqa: E402
from basics import CACHE, SetupError  # noqa: E402
from sandbox import BELOW_FLOOR, check_namespaces, locate_python, python_for_every_account  # noqa: E402
from standins import compiler  # noqa: E402

sys.path.insert(0, str(HERE.parent / "tests"))
import slurm  # noqa: E402

GIB = 1 << 30
# CPython versions the whole suite runs on this machine's own glibc (tests/test_hook.py's matrix).
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
# Free space each lane needs. What `make test` puts in the download cache: 13.6 GB, the 13.1 GB measured on
# 2026-12-03 (`du`) with the Ray venvs of 2026-12-04: the two real-torch venvs (2.14.1 and 2.15.0, 5.5 GB each),
# nine Ray venvs (2.4 GB: seven of Ray 2.60.0, 1.9 GB, and two of 2.58.0, 0.5 GB, where there were seven of
# 2.58.0, 1.9 GB), the Debian root file systems (0.6 GB) and the pinned wheels (60 MB). The rest is margin
# for what pip unpacks while it installs. One run's temporary directory (the scenario venvs) was seen past
# 375 MB.
CACHE_SPACE = {"check": 1 * GIB, "test": 16 * GIB, "aarch64": 2 * GIB}
TEMP_SPACE = 2 * GIB


@dataclass(frozen=True)
class Need:
    """One requirement: ``missing()`` says why this machine lacks it (None when it has it)."""

    what: str
    lanes: tuple[str, ...]
    missing: Callable[[str], str | None]
    fix: str


# Where Debian's packages put programs: one of them found here is installed, only not on this PATH.
SYSTEM_BIN = ("/usr/bin", "/bin", "/usr/sbin", "/sbin")


def _program(name: str, package: str) -> Callable[[str], str | None]:
    """``name`` on PATH (a user's PATH often lacks /usr/sbin, where ldconfig lives). Installed from
    Debian's ``package`` when the machine has no such program at all and this user can (root with
    apt-get), as the set-up steps install theirs: a fresh machine needs no step by hand."""
    def missing(lane: str) -> str | None:
        if shutil.which(name):
            return None
        if os.path.exists(f"/usr/sbin/{name}"):
            return f"/usr/sbin/{name} exists but /usr/sbin is not on PATH (add it: PATH=\"$PATH:/usr/sbin\")"
        if any(os.path.exists(os.path.join(d, name)) for d in SYSTEM_BIN):
            return f"no {name} on PATH"
        try:
            apt.ensure({package: name}, f"the tests ({name})")
        except SetupError as exc:
            return f"no {name} on PATH ({exc})"
        return None if shutil.which(name) else f"no {name} on PATH"
    return missing


def _compiler(lane: str) -> str | None:
    return None if compiler() else "no C compiler (gcc or cc) on PATH"


def _cross_compiler() -> None:
    """Debian's aarch64 cross compiler (installed when missing, as root), which builds the arm64 stand-ins."""
    if compiler("arm64") is None:
        raise SetupError("no aarch64-linux-gnu-gcc on PATH")


def _setup_step(step: Callable[[], object]) -> Callable[[str], str | None]:
    """The suite's own set-up step (which installs what it can: Debian packages as root): its
    SetupError's words, or None when it succeeds."""
    def missing(lane: str) -> str | None:
        try:
            step()
        except SetupError as exc:
            return str(exc)
        return None
    return missing


def _pythons(lane: str) -> str | None:
    """Each of :data:`PYTHONS`, and those below the package's floor, as the suite finds it (PATH, pyenv, uv, or
    installed by uv)."""
    absent = []
    for version in (*BELOW_FLOOR, *PYTHONS):
        try:
            locate_python(version)
        except SetupError as exc:
            absent.append(str(exc))
    return "; ".join(absent) or None


def _space(lane: str) -> str | None:
    """Free space for what the lane still has to download and build (what the cache holds counts),
    and for the scenario venvs in the temporary directory."""
    want: dict[int, list] = {}  # file system -> [bytes wanted, where]
    cache_want = max(CACHE_SPACE[lane] - _size(CACHE, limit=CACHE_SPACE[lane]), 0)
    for where, size in ((_existing(CACHE), cache_want), (Path(tempfile.gettempdir()), TEMP_SPACE)):
        entry = want.setdefault(os.stat(where).st_dev, [0, where])
        entry[0] += size
    short = [f"{shutil.disk_usage(where).free / GIB:.1f} GiB free under {where}, {size / GIB:.1f} GiB needed"
             for size, where in want.values() if shutil.disk_usage(where).free < size]
    return "; ".join(short) or None


def _one_file_system(lane: str) -> str | None:
    """The cached venvs are copied into each run by hard link (``sandbox.private_copy``: ``cp -al``), which
    one file system alone allows: across two, every such copy fails ("Invalid cross-device link")."""
    cache, temp = _existing(CACHE), Path(tempfile.gettempdir())
    if os.stat(cache).st_dev == os.stat(temp).st_dev:
        return None
    return (f"the download cache ({CACHE}, on the file system of {cache}) and the temporary directory ({temp}) "
            f"are on different file systems")


def _existing(path: Path) -> Path:
    """``path`` or its nearest existing parent (the cache is made on first use)."""
    while not path.exists():
        path = path.parent
    return path


def _size(root: Path, limit: int) -> int:
    """Bytes under ``root``, counted up to ``limit`` (past it, the exact figure does not matter)."""
    total = 0
    for path, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(path, name)).st_blocks * 512
            except OSError:
                continue
        if total >= limit:
            break
    return total


ALL = ("check", "test", "aarch64")
# Programs the tests start: name -> (Debian package, lanes that need it).
PROGRAMS = {
    "unshare": ("util-linux", ALL),
    "mount": ("mount", ALL),
    "setpriv": ("util-linux", ("check", "test")),
    "ldconfig": ("libc-bin", ALL),
    "nm": ("binutils", ("check", "test")),
    "readelf": ("binutils", ("check", "test")),  # what a build needs, read apart from the package (test_outcomes.py)
    "git": ("git", ("check", "test")),
    "g++": ("g++", ("check", "test")),  # torch_memory_saver built from its sdist (tools/tms_source.py)
    "pgrep": ("procps", ("check", "test")),
    "bash": ("bash", ALL),
    "patchelf": ("patchelf", ("check", "test")),  # conda's interpreters: DT_RPATH set by --force-rpath (test_conda.py)
    "script": ("bsdutils", ("test",)),
    "valgrind": ("valgrind", ("test",)),  # tools/start_cost.py, tools/pth_cost.py: callgrind (test_snippets.py)
    "useradd": ("passwd", ("check", "test")),  # tests/test_shared_env.py: accounts of its own
    "userdel": ("passwd", ("check", "test")),
    "groupadd": ("passwd", ("check", "test")),
    "groupdel": ("passwd", ("check", "test")),
}


def _root(lane: str) -> str | None:
    return None if os.geteuid() == 0 else f"running as uid {os.geteuid()}"


def _shared_python(lane: str) -> str | None:
    """The interpreter tests/test_shared_env.py starts as other accounts."""
    try:
        python_for_every_account(f"{sys.version_info.major}.{sys.version_info.minor}")
    except SetupError as exc:
        return str(exc)
    return None

NEEDS = (
    Need("private mount namespaces", ALL, _setup_step(check_namespaces),
         "run as root, or as a user the kernel allows user namespaces "
         "(sysctl kernel.unprivileged_userns_clone=1 or user.max_user_namespaces > 0)"),
    *(Need(name, lanes, _program(name, package), f"Debian: apt-get install {package} (run as root with apt-get, "
                                                           "make test installs it)")
      for name, (package, lanes) in PROGRAMS.items()),
    Need("a C compiler", ALL, _compiler, "Debian: apt-get install gcc"),
    Need("root (a shared environment's tests create accounts and change file owners)", ("check", "test"), _root,
         "run the tests as root (in a container, say)"),
    Need("a Python every account can run", ("check", "test"), _shared_python,
         "Debian: apt-get install python3 (an interpreter outside /root)"),
    Need("qemu-user-static, mmdebstrap and arch-test", ("test", "aarch64"), _setup_step(emulation.install_qemu),
         "Debian: apt-get install qemu-user-static mmdebstrap arch-test (run as root with apt-get, make test installs "
         "them)"),
    Need("a private binfmt_misc for arm64 programs", ("test", "aarch64"), _setup_step(lambda: emulation.check("arm64")),
         "run as root on Linux 6.7 or later (a user namespace mounts its own binfmt_misc there)"),
    Need("an aarch64 cross compiler", ("test", "aarch64"), _setup_step(_cross_compiler),
         "Debian: apt-get install gcc-aarch64-linux-gnu libc6-dev-arm64-cross (run as root with apt-get, make test "
         "installs them)"),
    Need("debootstrap or mmdebstrap", ("test",), _setup_step(bootstrapper),
         "Debian: apt-get install debootstrap (run as root with apt-get, make test installs it)"),
    Need("Slurm", ("test",), _setup_step(slurm.ensure_installed),
         f"Debian: apt-get install {' '.join(slurm.PACKAGES)} (run as root with apt-get, make test installs them)"),
    Need(f"CPython {PYTHONS[0]}-{PYTHONS[-1]} and {', '.join(BELOW_FLOOR)}", ("test",), _pythons,
         "install each missing version with uv (uv python install 3.12), pyenv (pyenv install 3.12) or "
         "your distribution's python3.12 package with its venv module (Debian: python3.12-venv)"),
    Need("the download cache and the temporary directory on one file system", ALL, _one_file_system,
         "point TMPDIR at a directory on the cache's file system (mkdir -p DIR; TMPDIR=DIR make ...), or "
         "TMS_TEST_CACHE at one on the temporary directory's"),
    Need("disk space", ALL, _space,
         "free space there, or point TMS_TEST_CACHE (the download cache) or TMPDIR at a larger file system"),
)


def missing(lane: str) -> list[tuple[Need, str]]:
    """Every requirement of ``lane`` this machine lacks, with why."""
    found = []
    for need in NEEDS:
        if lane in need.lanes:
            why = need.missing(lane)
            if why:
                found.append((need, why))
    return found


def message(lane: str, lacking: list[tuple[Need, str]]) -> str:
    """The one message that lists everything missing and how to get each."""
    lines = [f"prereqs: `make {lane}` cannot run here; missing:"]
    for need, why in lacking:
        lines += [f"  - {need.what}: {why}", f"      get it: {need.fix}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("lane", choices=ALL, nargs="?", default="test")
    lane = parser.parse_args(argv).lane
    lacking = missing(lane)
    if lacking:
        print(message(lane, lacking), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
