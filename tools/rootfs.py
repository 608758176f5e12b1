"""Debian root file systems as hosts: another glibc and the CPython releases Debian ships, run here.

A root file system is built once from Debian's package registry (``debootstrap --variant=minbase``
with the mirror this machine's apt already uses) and kept in the test cache. It is never written
after that: every process runs in a private mount namespace (``unshare -m``) on an overlay whose
upper layer is a throw-away tmpfs, chrooted into it. The directories a scenario needs (its venvs,
the wheels, the stand-in driver, the runtime libraries) are bind-mounted at the SAME absolute
paths inside, so a path means the same file on both sides and a test reads and writes them as
usual. A *host* is such a root plus a loader cache built by the root's own ``ldconfig`` (its
glibc, its cache format), mounted over its ``/etc/ld.so.cache``.
"""

from __future__ import annotations

import glob
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import apt
import emulation
from basics import CACHE, SetupError, cache_lock, clean_env, run
from downloads import PLATFORMS
from sandbox import Venv, ld_cache, unshare_mounts

# The Debian suites the tests use, and the CPython packages each brings (with its venv module).
# ``<suite>-<arch>`` is that suite for another Debian architecture, run under emulation.
SUITES: dict[str, tuple[str, ...]] = {"trixie": ("3.13",), "sid": ("3.14", "3.15"), "trixie-arm64": ("3.13",)}
# What a suite's root holds beyond them: trixie's ``python3`` with Debian's own pip (``python3-pip``), the
# distribution's interpreter as a user of it installs with ``pip install --user`` under PEP 668.
EXTRA: dict[str, tuple[str, ...]] = {"trixie": ("python3-pip",)}
SOURCES = ("/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list")),
           *sorted(glob.glob("/etc/apt/sources.list.d/*.sources")))


def mirror(sources: tuple[str, ...] = SOURCES) -> str:
    """The Debian archive this machine's apt uses: the first ``deb`` source whose suite is a release
    (not ``-security`` or ``-updates``), in one-line (``.list``) or deb822 (``.sources``) form."""
    for path in sources:
        try:
            text = Path(path).read_text()
        except OSError:
            continue
        for uri, suites in _deb_sources(text, deb822=path.endswith(".sources")):
            if any("-" not in s and "/" not in s for s in suites):
                return uri
    raise SetupError(f"no Debian archive in this machine's apt sources ({', '.join(sources)}): "
                     "add one (a `deb URI SUITE main` line) so that root file systems can be built")


def _deb_sources(text: str, deb822: bool) -> list[tuple[str, list[str]]]:
    """(URI, suites) of each binary-package source in an apt sources file."""
    out = []
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line or line[:1].isspace():
                    continue
                key, _, value = line.partition(":")
                fields[key.strip().lower()] = value.strip()
            if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
                out += [(uri, fields.get("suites", "").split()) for uri in fields.get("uris", "").split()]
    else:
        for line in text.splitlines():
            words = re.sub(r"\[[^]]*\]", " ", line.split("#", 1)[0]).split()
            if len(words) >= 3 and words[0] == "deb":
                out.append((words[1], [words[2]]))
    return out


def bootstrapper() -> list[str]:
    """The command that builds a root file system: debootstrap, else mmdebstrap, else debootstrap
    installed from this machine's apt (root only)."""
    if shutil.which("debootstrap") is None and shutil.which("mmdebstrap") is None:
        apt.ensure({"debootstrap": "debootstrap"}, "building Debian root file systems")
    if shutil.which("debootstrap"):
        return ["debootstrap", "--variant=minbase"]
    return ["mmdebstrap", "--variant=minbase"]


def arch(suite: str) -> str | None:
    """The foreign Debian architecture of a suite name (``trixie-arm64``: arm64), None for this machine's."""
    name, _, foreign = suite.partition("-")
    return foreign or None


# mmdebstrap's apt refuses a suite whose Release file is past its Valid-Until: sid's is valid seven days,
# and a registry that serves a snapshot of the archive (as this machine's does: sid of 2026-10-30, valid to
# 2026-11-06) stays past it. The signature is still checked; only the date is not. debootstrap does not
# read Valid-Until.
_APT_DATE_UNCHECKED = '--aptopt=Acquire::Check-Valid-Until "false"'


def bootstrap(suite: str, target: Path, packages: list[str]) -> list[str]:
    """The command that builds ``suite``'s root file system into ``target``: for another architecture
    mmdebstrap, running the new root's own programs (its package scripts) under emulation."""
    release, foreign = suite.partition("-")[0], arch(suite)
    include = f"--include={','.join(packages)}"
    if foreign is None:
        command = bootstrapper()
        if command[0] == "mmdebstrap":
            command.append(_APT_DATE_UNCHECKED)
        return [*command, include, release, str(target), mirror()]
    return [*emulation.namespace(foreign), "nice", "-n", "10", "mmdebstrap", "--mode=root", "--variant=minbase",
            _APT_DATE_UNCHECKED, f"--architectures={foreign}", include, release, str(target), mirror()]


def packages(suite: str) -> list[str]:
    """The Debian packages ``suite``'s root is built with: its CPython releases with their venv module, and
    :data:`EXTRA`."""
    return [f"python{v}{s}" for v in SUITES[suite] for s in ("", "-venv")] + list(EXTRA.get(suite, ()))


def build(suite: str) -> Path:
    """The cached root file system of ``suite`` (built on first use: about a minute, ten under emulation;
    under a lock, so that parallel runs build it once). Its ``.complete`` marker lists the packages it was
    built with: a root that lacks one :func:`packages` names now is built again. Delete
    ``$TMS_TEST_CACHE/rootfs/<suite>`` to take a newer one."""
    root = CACHE / "rootfs" / suite
    wanted = packages(suite)
    with cache_lock(f"rootfs-{suite}"):
        done = root / ".complete"
        if not done.exists() or not set(wanted) <= set(done.read_text().split()):
            tmp = root.with_name(suite + ".partial")
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(root, ignore_errors=True)
            tmp.parent.mkdir(parents=True, exist_ok=True)
            run(bootstrap(suite, tmp, wanted), timeout=3600)
            tmp.rename(root)
            done.write_text("".join(f"{p}\n" for p in wanted))
    return root


class Rootfs:
    """Runs commands chrooted into a cached root file system, with ``shared`` host directories
    visible at their own paths (read-write) and the root itself unchanged afterwards."""

    def __init__(self, suite: str, shared: list[Path]) -> None:
        if shutil.which("unshare") is None or shutil.which("chroot") is None:
            raise SetupError("root file system hosts need unshare and chroot (util-linux, coreutils)")
        self.suite = suite
        self.arch = arch(suite)
        if self.arch is not None:
            emulation.check(self.arch)
        self.path = build(suite)
        self.shared = [Path(p) for p in shared]

    def python(self, version: str) -> str:
        """The interpreter ``python<version>`` inside this root."""
        if version not in SUITES[self.suite]:
            raise SetupError(f"Debian {self.suite} root file systems here carry CPython "
                             f"{', '.join(SUITES[self.suite])}, not {version}")
        return f"/usr/bin/python{version}"

    def wrap(self, argv: list[str], env: dict[str, str], setup: str = "", ld_cache: Path | None = None,
             scratch: Path | None = None) -> list[str]:
        """``argv`` with exactly ``env``, chrooted into the root in a private mount namespace, in the
        current directory when the root shows it.

        ``scratch`` is a host directory for the overlay's mount point (a tmpfs is mounted there
        inside the namespace only); ``ld_cache`` replaces the root's ``/etc/ld.so.cache``;
        ``setup`` is more shell run first, with ``$ROOT`` naming the root as mounted.
        """
        scratch = scratch or self.shared[0]
        q = shlex.quote
        lines = [f"T={q(str(scratch))}/.rootfs-mnt", 'mkdir -p "$T"', 'mount -t tmpfs tmpfs "$T"',
                 'mkdir "$T/u" "$T/w" "$T/m"', 'ROOT="$T/m"',
                 f'mount -t overlay overlay -o lowerdir={q(str(self.path))},upperdir="$T/u",workdir="$T/w" "$ROOT"',
                 'mount --rbind /dev "$ROOT/dev"', 'mount --rbind /proc "$ROOT/proc"']
        for p in self.shared:
            lines += [f'mkdir -p "$ROOT"{q(str(p))}', f'mount --bind {q(str(p))} "$ROOT"{q(str(p))}']
        if ld_cache is not None:
            lines.append(f'mount --bind {q(str(ld_cache))} "$ROOT/etc/ld.so.cache"')
        if setup:
            lines.append(setup)
        # The working directory carries over where the root shows it (a shared path), as it would on a host.
        lines += ['W="$(pwd)"', '[ -d "$ROOT$W" ] || W=/', 'exec chroot "$ROOT" env -i -C "$W" "$@"']
        namespace = emulation.namespace(self.arch) if self.arch else unshare_mounts()
        return [*namespace, "sh", "-ec", "\n".join(lines), "rootfs",
                *(f"{k}={v}" for k, v in env.items()), *map(str, argv)]

    def run(self, argv: list[str], env: dict[str, str] | None = None,
            **kw: Any) -> subprocess.CompletedProcess[Any]:  # noqa: ANN401 - subprocess.run's keywords
        """Run inside the root (a setup step: failures raise SetupError)."""
        return run(self.wrap(argv, env if env is not None else clean_env()), env=clean_env(), **kw)

    def glibc(self) -> str:
        """The root's glibc version, from its own ``ldd``."""
        out: str = self.run(["ldd", "--version"]).stdout.splitlines()[0]
        return out.rsplit(" ", 1)[-1]


class RootfsHost:
    """A root file system plus a loader cache listing exactly ``dirs`` (built by its own ldconfig):
    the same interface as support.Host, for the same tests."""

    def __init__(self, rootfs: Rootfs, root: Path, dirs: list[Path]) -> None:
        self.rootfs = rootfs
        self.dirs = dirs
        self.cache = ld_cache(root, dirs, rootfs.run, "/sbin/ldconfig")
        self.scratch = root

    def wrap(self, argv: list[str], env: dict[str, str], setup: str = "") -> list[str]:
        return self.rootfs.wrap(argv, env, setup, ld_cache=self.cache, scratch=self.scratch)

    def run(self, argv: list[str], env: dict[str, str], setup: str = "",
            **kw: Any) -> subprocess.CompletedProcess[Any]:  # noqa: ANN401 - subprocess.run's keywords
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.wrap(argv, env, setup), env=clean_env(), **kw)


class RootfsVenv(Venv):
    """A venv made by the root's interpreter inside the root (at a shared path), with wheels
    installed by the root's own pip (Debian's pip wheel run from the file: the venv stays bare).

    In a root of another architecture the wheels are installed by this machine's pip for the root's
    platform and interpreter (``--target`` the venv's site-packages): the same files in the same places,
    without minutes of pip under emulation for every venv. The venv itself is still made by the root's
    interpreter, and everything a test starts runs there.
    """

    def __init__(self, rootfs: Rootfs, path: Path, python: str | None = None, wheels: Sequence[Path] = ()) -> None:
        self.rootfs = rootfs
        self.path = path
        if python is not None:
            rootfs.run([python, "-m", "venv", "--without-pip", str(path)])
        self.python = path / "bin" / "python"
        query = "import sys, sysconfig; print(sysconfig.get_paths()['purelib']); print('%d.%d' % sys.version_info[:2])"
        site, self.version = rootfs.run([str(self.python), "-c", query]).stdout.split()
        self.site = Path(site)
        if wheels:
            self.install(*wheels)

    def install(self, *wheels: Path | str, deps: bool = False) -> None:
        if deps:
            raise SetupError("root file system venvs install wheel files only (no index inside the root)")
        if self.rootfs.arch is not None:
            run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
                 "--no-compile", "--upgrade", "--target", str(self.site), "--platform", PLATFORMS[self.rootfs.arch],
                 "--python-version", self.version, "--implementation", "cp", "--only-binary=:all:", *map(str, wheels)])
            return
        pip = self.rootfs.run(["sh", "-c", "ls /usr/share/python-wheels/pip-*.whl"]).stdout.split()[-1]
        self.rootfs.run([str(self.python), f"{pip}/pip", "install", "-q", "--disable-pip-version-check",
                         "--no-cache-dir", "--no-deps", "--no-index", "--force-reinstall", *map(str, wheels)])
