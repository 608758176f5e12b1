"""Venvs, interpreters, hosts' loader caches and the wheels a scenario installs: shared by the tests, the
demo and the benchmark.

The venv with real torch (5.5 GB) is made once in the cache (:data:`basics.CACHE`), as the wheels are
(:mod:`downloads`).
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from basics import CACHE, ROOT, SetupError, cache_lock, clean_env, pip_env, run
from downloads import wheel
from tms_source import source_wheel

from tms_autopreload.startup import PYTHON_FLOOR  # the checkout's package, which downloads put on the path

# The two newest CPythons older than the package's floor (3.9, 3.8): where an install forced past its
# requires-python lands, and its start-up rules still import, so that it says so (tests/test_startup_files.py).
BELOW_FLOOR = tuple(f"{PYTHON_FLOOR[0]}.{PYTHON_FLOOR[1] - below}" for below in (1, 2))

# Real torch: the release users of torch_memory_saver 0.0.9/0.0.10 have (2.14.1, CUDA 13.0) and today's (2.15.0,
# CUDA 13.2). The first is the default of every real-torch test; the second joins where it proves something.
TORCH_VERSIONS = ("2.14.1", "2.15.0")
TORCH_VERSION = TORCH_VERSIONS[0]
# Real Ray: today's release (2.60.0, which turns token authentication on for a cluster it starts) for every
# Ray scenario, and the release before (2.58.0, authentication off unless asked) for one named scenario.
RAY_VERSIONS = ("2.60.0", "2.58.0")
RAY_VERSION = RAY_VERSIONS[0]
# Installed next to real torch: numpy (torch_memory_saver 0.0.10 imports it without declaring it),
# and the Jupyter client and kernel the notebook tests start.
TORCH_EXTRAS = ("numpy==2.4.6", "ipykernel==7.4.0", "jupyter_client==8.10.0")


# ---------------------------------------------------------------- private mount namespaces

def unshare_mounts() -> list[str]:
    """The command that runs a program in a private mount namespace where this user may bind-mount:
    root's own, or for any other user a user namespace mapping them to root (which the kernel must
    allow: unprivileged user namespaces)."""
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "-m"]


def ld_cache(root: Path, dirs: list[Path], runner: Callable[[list[str]], object] = run,
             ldconfig: str = "ldconfig") -> Path:
    """``root/ld.so.cache``: a loader cache listing exactly ``dirs`` (from ``root/ld.so.conf``; ``-X``: no
    links made in them), built by ``ldconfig`` through ``runner``. A host mounts it over
    ``/etc/ld.so.cache``; a root file system's host runs the root's own ldconfig, for its glibc's format."""
    root.mkdir(parents=True, exist_ok=True)
    conf = root / "ld.so.conf"
    conf.write_text("".join(f"{d}\n" for d in dirs))
    cache = root / "ld.so.cache"
    runner([ldconfig, "-X", "-C", str(cache), "-f", str(conf)])
    return cache


def check_namespaces() -> None:
    """Raise SetupError unless :func:`unshare_mounts` with a bind mount works here."""
    try:
        r = subprocess.run([*unshare_mounts(), "sh", "-c", "mount --bind /etc/ld.so.cache /etc/ld.so.cache"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"cannot run unshare: {exc}") from None
    if r.returncode != 0:
        raise SetupError(f"private mount namespaces do not work here: {r.stderr.strip()}")


# ---------------------------------------------------------------- the torch_memory_saver a scenario installs

def tms_wheel(version: str, arch: str | None = None) -> Path:
    """A released torch_memory_saver wheel (for ``arch``, as :func:`wheel`), or a build of its source
    (a name of tms_source.SOURCE_BUILDS, this machine's only)."""
    if "-source" in version:
        if arch:
            raise SetupError(f"source builds of torch_memory_saver are made for this machine only, not {arch}")
        return source_wheel(version)
    return wheel(f"torch-memory-saver=={version}", arch)


# ---------------------------------------------------------------- interpreters and venvs

def _executable(python: str) -> str | None:
    """The interpreter ``python`` runs, where it starts and has ``venv`` (else None): a wrapper's target, such as
    the CPython a pyenv shim (a bash script that runs ``pyenv exec``: about 45 ms a start) executes, so that
    the tests' many starts of it pay for no wrapper."""
    r = subprocess.run([python, "-c", "import sys, venv; print(sys.executable)"], capture_output=True, text=True)
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def uv() -> str | None:
    """uv: on PATH, or next to this interpreter (the test venv installs it)."""
    found = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    return found if os.access(found, os.X_OK) else None


# How long `uv python install` may take to reach its download host before we say it cannot.
UV_INSTALL_TIMEOUT = 60


@functools.lru_cache(maxsize=None)
def locate_python(minor: str) -> str:
    """A working CPython ``3.<minor>`` on this machine: on PATH, under pyenv, found by ``uv python
    find``, else installed by ``uv python install``. Raises SetupError saying where it looked and
    why uv could not install it (its download host unreachable: said plainly, within a timeout).

    Interpreters in Debian root file systems (tools/rootfs.py) are named ``<suite>/<version>``
    and run there, not here.
    """
    candidates = [shutil.which(f"python{minor}")]
    candidates += sorted(glob.glob(os.path.expanduser(f"~/.pyenv/versions/{minor}.*/bin/python{minor}")))
    candidates += [f"/usr/bin/python{minor}", f"/usr/local/bin/python{minor}"]
    for c in candidates:
        if c and os.path.exists(c) and (found := _executable(c)):
            return found
    tool = uv()
    if tool is None:
        raise SetupError(f"python{minor} is not on PATH or under pyenv, and uv is not installed to find or "
                         f"install it (`pip install uv`, then `uv python install {minor}`)")
    env = clean_env(UV_PYTHON_DOWNLOADS="never")
    known = subprocess.run([tool, "python", "find", "--no-project", minor], env=env, capture_output=True, text=True,
                           timeout=60)
    if known.returncode == 0 and (found := _executable(known.stdout.strip())):
        return found
    env = clean_env(UV_HTTP_TIMEOUT="10", UV_HTTP_RETRIES="0")
    try:
        got = subprocess.run([tool, "python", "install", minor], env=env, capture_output=True, text=True,
                             timeout=UV_INSTALL_TIMEOUT)
    except subprocess.TimeoutExpired:
        why = f"no answer within {UV_INSTALL_TIMEOUT} s"
    else:
        if got.returncode == 0:
            return subprocess.run([tool, "python", "find", "--no-project", minor], env=env, capture_output=True,
                                  text=True, timeout=60, check=True).stdout.strip()
        why = (got.stderr.strip().splitlines() or [f"exit {got.returncode}"])[-1].strip()
    unreachable = any(w in why for w in ("lookup", "connect", "timed out", "no answer", "dns", "network"))
    raise SetupError(f"python{minor} is not on PATH, under pyenv or known to uv, and `uv python install {minor}` "
                     f"could not install it: {why}"
                     + (" (uv's download host is not reachable from here)" if unreachable else "")
                     + f"; install CPython {minor} another way (pyenv, your distribution), or use a Debian root "
                     f"file system's interpreter (sid/3.14, sid/3.15, trixie/3.13)")


def find_python(minor: str) -> str | None:
    """:func:`locate_python`, or None when it cannot find one."""
    try:
        return locate_python(minor)
    except SetupError:
        return None


def python_for_every_account(minor: str) -> str:
    """The real path of a CPython that every account can run (each directory above it searchable by all),
    ``3.<minor>`` where there is one, else the system's python3; a shared environment's tests
    (tests/test_shared_env.py) start it as other users. An interpreter under /root (pyenv) is not one.
    Raises SetupError when there is none."""
    for c in (find_python(minor), f"/usr/bin/python{minor}", "/usr/bin/python3"):
        if c and os.path.exists(c):
            real = Path(os.path.realpath(c))
            if all(os.stat(p).st_mode & 0o001 for p in real.parents):
                return str(real)
    raise SetupError("no Python interpreter that every account can run: each one found lies under a directory "
                     "other users cannot enter (such as pyenv's under /root)")


def build_own_wheel(dest: Path, source: Path = ROOT, isolated: bool = True) -> Path:
    """Build this project's wheel (what users install) from a clean copy of the source tree
    (``source``: this checkout, or an export of another revision, for ``tools/bench.py --against``).

    A copy, because setuptools reuses a ``build/`` directory left in the tree and would ship
    stale files from it. ``isolated=False`` builds with the setuptools of the running interpreter (the
    suite's, pinned in tests/requirements.txt, as ``make dist`` builds) instead of one pip installs into
    an environment of its own for the build: seconds less for every test session.
    """
    dest.mkdir(parents=True, exist_ok=True)
    src = clean_copy(source, dest / "src")
    run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", *([] if isolated else ["--no-build-isolation"]),
         "-w", str(dest), str(src)], env=pip_env())
    return sorted(dest.glob("tms_autopreload-*.whl"))[-1]


def revision_source(rev: str, work: Path) -> tuple[str, Path]:
    """(``rev``'s short id, its source tree as git has it, exported once under ``work``): the package as
    another revision made it, for a wheel of that revision (:func:`build_own_wheel`'s ``source``)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=10", rev], capture_output=True, text=True,
                         check=True).stdout.strip()
    src = work / f"src-{sha}"
    if not (src / "pyproject.toml").exists():
        src.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", sha], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    return sha, src


def clean_copy(source: Path, dest: Path) -> Path:
    """``source`` copied to ``dest`` (replaced) without what a build must not see: git's data, venvs, the
    demo's sandbox, earlier builds and caches (the test runs' too, which other tests write while one copies:
    a file gone midway would fail the copy)."""
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(source, dest, ignore=shutil.ignore_patterns(".git", ".venv*", ".demo", "build", "dist",
                                                              "*.egg-info", "__pycache__", ".mypy_cache",
                                                              ".ruff_cache", ".hypothesis", ".pytest_cache"))
    return dest


@functools.cache
def pip_runner() -> Path:
    """pip's own runner of the pip it sits in (this interpreter's, the suite's pin), for another interpreter: what
    ``pip --python PYTHON`` starts (pip/_internal/build_env.py, ``get_runnable_pip``), found without importing pip."""
    spec = importlib.util.find_spec("pip")
    if spec is None or spec.origin is None:
        raise SetupError(f"no pip in {sys.executable}'s environment (tests/requirements.txt pins it)")
    return Path(spec.origin).parent / "__pip-runner__.py"


class Venv:
    """A real virtual environment with chosen wheels installed by pip."""

    def __init__(self, path: Path, python: str | None = None, wheels: Sequence[Path] = (),
                 system_site: bool = False) -> None:
        """Create a venv at ``path`` with ``python`` (or open the existing one when ``python`` is None)."""
        self.path = path
        if python is not None:
            args = [python, "-m", "venv", "--without-pip", str(path)]
            if system_site:
                args.insert(3, "--system-site-packages")
            run(args)
        self.python = path / "bin" / "python"
        self.site = Path(run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             env=clean_env()).stdout.strip())
        if wheels:
            self.install(*wheels)

    def install(self, *wheels: Path | str, deps: bool = False) -> None:
        """pip-install wheel files (no dependencies, no index), or requirements from the index.

        The suite's pin of pip runs under the venv's own interpreter, as ``pip --python`` runs it: by the runner
        that option starts (:func:`pip_runner`), without the pip process that only starts it (about 0.65 of
        each install's 1.9 CPU-seconds, and the suite's venvs are a few dozen installs a run)."""
        args = [str(self.python), str(pip_runner()), "install", "-q", "--disable-pip-version-check"]
        if not deps:
            args += ["--no-deps", "--no-index", "--force-reinstall"]
        run(args + [str(w) for w in wheels], env=pip_env())



def base_python(python: str, dest: Path) -> Venv:
    """An interpreter prefix of its own, as an image's ``/usr/local`` or ``/opt/python`` is: ``python``'s
    binary and standard library hard-linked (seconds, no space) under ``dest``, with an empty
    site directory of its own. Its ``sys.prefix`` is ``dest`` (the interpreter finds its prefix from
    its own location), so packages installed into it are a base interpreter's, which a venv made
    with ``--system-site-packages`` sees after its own."""
    facts = run([python, "-S", "-c", "import sys, sysconfig; print(sys.executable); "
                 "print(sysconfig.get_path('stdlib')); print(f'python{sys.version_info[0]}.{sys.version_info[1]}')"],
                env=clean_env()).stdout.split("\n")
    exe, stdlib, name = facts[0], Path(facts[1]), facts[2]
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "bin").mkdir(parents=True)
    lib = dest / "lib" / name
    lib.mkdir(parents=True)
    os.link(os.path.realpath(exe), dest / "bin" / name)
    for alias in ("python3", "python"):
        (dest / "bin" / alias).symlink_to(name)
    # Not Debian's EXTERNALLY-MANAGED marker (PEP 668): an image's own prefix has none, and with it pip
    # refuses to install into the base. Nor CPython's own test suite (``test``: half the standard library's
    # files, about 4,000 links each time), which the official Docker images delete and Debian ships apart.
    left_out = ("site-packages", "EXTERNALLY-MANAGED", "test")
    entries = [str(stdlib / e) for e in os.listdir(stdlib) if e not in left_out]
    run(["cp", "-al", *entries, str(lib)])
    # Its own site directory where its sysconfig puts packages: lib/pythonX.Y/site-packages, but
    # local/lib/pythonX.Y/dist-packages for Debian's python3, whose site.py reads that instead.
    base = Venv(dest)
    base.site.mkdir(parents=True, exist_ok=True)
    return base


def cached_venv(name: str, python: str, requirement: str, extras: tuple[str, ...] = ()) -> Venv:
    """A venv with ``requirement`` installed from the index, made once and kept in the cache.

    ``extras`` are installed on top once per distinct set (a marker file names the set), so adding
    a test tool does not rebuild a venv that took minutes to make.
    """
    path = CACHE / "venvs" / f"{name}-{Path(python).name}"
    with cache_lock(f"venv-{path.name}"):
        if not (path / ".complete").exists():
            shutil.rmtree(path, ignore_errors=True)
            Venv(path, python).install(requirement, deps=True)
            (path / ".complete").touch()
        venv = Venv(path)
        if extras:
            marker = path / (".extras-" + "-".join(sorted(extras)).replace("==", "_").replace("/", "_"))
            if not marker.exists():
                venv.install(requirement, *extras, deps=True)
                marker.touch()
        strays = sorted(p.name for p in venv.site.glob("*")
                        if p.name.startswith(("tms_autopreload", "torch_memory_saver")))
        if strays:
            # Every test installs those into a private copy (:func:`private_copy`): one in the cache means a
            # run installed into the shared venv, and every later "not installed" check would be wrong.
            raise SetupError(f"the cached venv {path} holds {', '.join(strays)}, which no cached venv is made "
                             f"with: a run installed into it. Fix: rm -rf {path} (it is rebuilt on next use)")
    return venv


def ensurepip_venv(python: str) -> Venv:
    """A venv of ``python`` with the pip its own ``ensurepip`` installs, as ``python -m venv`` makes it: made once
    per interpreter file and kept in the cache, since ensurepip costs seconds (it compiles all of pip) and gives
    the same files every time. Use it through :func:`private_copy`, as every cached venv."""
    real = os.path.realpath(python)
    st = os.stat(real)
    path = CACHE / "venvs" / f"ensurepip-{Path(real).name}-{st.st_ino:x}-{st.st_size:x}-{st.st_mtime_ns:x}"
    with cache_lock(f"venv-{path.name}"):
        if not (path / ".complete").exists():
            shutil.rmtree(path, ignore_errors=True)
            venv = Venv(path, python)
            run([str(venv.python), "-m", "ensurepip"], env=clean_env())
            (path / ".complete").touch()
    return Venv(path)


def private_copy(venv: Venv, dest: Path, links: bool = True) -> Venv:
    """A venv of this run's own with ``venv``'s files, shared by hard link (or copied: ``links=False``).

    A cached venv serves every run on the machine (another checkout's suite may run at the same
    time), so nothing may be installed into it: that would change what the other run tests. pip
    replaces files rather than writing into them, and Python writes bytecode by replace too, so a
    hard-linked copy (seconds, no space) leaves the cache untouched. A copy is for a venv whose files
    its users change in place (a mode, a file's bytes). The scripts in ``bin/`` name their interpreter
    by absolute path; they are rewritten (new files) to name the copy's.
    """
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    run(["cp", "-al" if links else "-a", str(venv.path), str(dest)])
    repoint_scripts(dest / "bin", venv.path, dest)
    return Venv(dest)


def repoint_scripts(scripts: Path, old: Path, new: Path) -> None:
    """Make the scripts in ``scripts`` that name a path under ``old`` (their interpreter, on their ``#!`` line)
    name it under ``new``: new files, so that a hard-linked original is left as it was."""
    before, after = os.fsencode(old), os.fsencode(new)
    for script in scripts.iterdir() if scripts.is_dir() else ():
        if script.is_symlink() or not script.is_file():
            continue
        data = script.read_bytes()
        if before in data:
            script.unlink()
            script.write_bytes(data.replace(before, after))
            script.chmod(0o755)


def torch_venv(python: str, version: str = TORCH_VERSION) -> Venv:
    """Real torch ``version`` (a CUDA 13 build: 2.14.1 links CUDA 13.0, 2.15.0 CUDA 13.2; 5.5 GB) with its
    torchrun, and :data:`TORCH_EXTRAS`."""
    return cached_venv(f"torch-{version}", python, f"torch=={version}", TORCH_EXTRAS)


def ray_venv(python: str, world: str, version: str = RAY_VERSION) -> Venv:
    """Real Ray ``version``, one venv per simulated node ``world`` (about 260 MB each)."""
    return cached_venv(f"ray-{version}-{world}", python, f"ray=={version}")


def ray_jobs_venv(python: str) -> Venv:
    """Real Ray with its dashboard (``ray[default]``), which ``ray job submit`` talks to."""
    return cached_venv(f"ray-default-{RAY_VERSION}", python, f"ray[default]=={RAY_VERSION}")
