"""The way out works from where the user stands: every fix, pasted into the shell that printed it, changes
the environment the message is about, and the retried command goes further, with every package where the world
put it.

A property over worlds x failures x shells. Each cell builds its world, provokes the message the way a user
meets it (a flagged ``python -c pass`` that stops with exit 78, or ``doctor`` in a shell with no flag), takes
the fix out of it exactly as printed (the first command in backticks after ``Fix:``), and runs
``sh -c 'FIX; RETRY'`` in that same shell: the same variables (the flag exported), the same ``PATH``, the venv
activated or not. Installs are real and offline, from the suite's wheel cache, through the variables pip and
uv read (``PIP_NO_INDEX``/``PIP_FIND_LINKS``; uv 0.13 has no variable for ``--no-index``, so ``UV_CONFIG_FILE``
names a ``uv.toml`` that says it, with ``UV_FIND_LINKS``; a fresh ``UV_CACHE_DIR`` per cell). Every retry here
then passes: the start is hooked, or ``doctor`` has a plan; and torch, torch_memory_saver and this package are
found where the world put them, torch_memory_saver where it put none beside torch (in the user site where torch
lies there: pip's ``--user``).

Worlds (where torch, torch_memory_saver and this package live):

* ``pip-venv-activated``: a venv with its own pip (``python -m venv``), everything in its site-packages, the
  venv's ``bin`` first on ``PATH`` and ``VIRTUAL_ENV`` set; commands name ``python``;
* ``pip-venv-by-path``: the same venv, not activated: ``PATH`` leads to no Python of it;
* ``without-pip``: a venv made ``--without-pip``, everything in it; another venv's ``pip`` first on ``PATH``;
* ``uv-venv``: a venv uv made (no pip), everything installed by uv; ``uv`` on ``PATH``;
* ``uv-venv-without-uv``: the same, ``uv`` not on ``PATH`` (a venv made by a uv the shell does not have);
* ``user-site``: an interpreter's own prefix with no pip, everything in the user site under ``HOME``; ``uv`` on
  ``PATH`` (which installs nothing into a user site);
* ``debian-user-site``: Debian trixie's own ``python3`` with Debian's ``python3-pip``, marked externally
  managed (PEP 668) as Debian ships it, everything installed ``--user`` with that pip (told
  ``--break-system-packages``, as its users are), run in a Debian root file system (``tools/rootfs.py``);
* ``target``: torch and this package in a venv with pip, torch_memory_saver in a ``pip install --target``
  folder on ``PYTHONPATH`` (site.py never reads a ``.pth`` file from there).

Failures: no torch_memory_saver; 0.0.10 with its cu13 build deleted; 0.0.9 (a CUDA 12 build only) under a
CUDA 13 torch; this package's directory removed (its ``.pth`` left over), with the record of where pip
installed it from or without it (as from an index: no command can name the source then, and the fix
removes the start-up files); the start module the ``.pth`` line imports removed; ``TMS_AUTOPRELOAD_PATH``
naming no file; ``TMS_AUTOPRELOAD_CUDA_MAJOR=12`` under a CUDA 13 torch. Shells: ``TMS_AUTOPRELOAD=1``,
``SLIME_OFFLOAD_TRAIN=1``, dlopen mode, and no flag (``doctor`` provokes the message; not for a left-over
``.pth``, where no command of the package can run and nothing is said without a flag).

The host has the driver and CUDA 13 in its loader cache, and torch is the CUDA 13 stand-in. The fast lane
runs the cells of :data:`FAST`; ``make test`` every one (a class per world).
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import pytest
from conftest import DEFAULT_PYTHON, need
from rootfs import RootfsHost
from support import (MAPPED, Host, Venv, assert_stopped, base_python, clean_env, locate_python, private_copy,
                     repoint_scripts, run, tms_wheel, uv, write_torch_standin)

WORLDS = ["pip-venv-activated", "pip-venv-by-path", "without-pip", "uv-venv", "uv-venv-without-uv", "user-site",
          "debian-user-site", "target"]
FAILURES = ["no-tms", "deleted-build", "cu12-only-release", "package-removed", "package-removed-unrecorded",
            "start-removed", "bad-path", "cuda12-override"]
# Where no command of the package can run, and nothing is said without a flag.
LEFT_OVER = ("package-removed", "package-removed-unrecorded", "start-removed")
SHELLS = {"TMS_AUTOPRELOAD": {"TMS_AUTOPRELOAD": "1"}, "SLIME_OFFLOAD_TRAIN": {"SLIME_OFFLOAD_TRAIN": "1"},
          "dlopen": {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_MODE": "dlopen"}, "no-flag": {}}
# Seven cells in the fast lane: six of the cheapest (a uv venv is made and filled in a second), for six failures
# and each shell; and the one world where a fix for what is not installed must say where: the user site (about
# 15 s here, most of it ensurepip). make test runs every world.
FAST = {("uv-venv", "deleted-build", "TMS_AUTOPRELOAD"), ("uv-venv", "package-removed", "SLIME_OFFLOAD_TRAIN"),
        ("uv-venv", "no-tms", "dlopen"), ("uv-venv", "cuda12-override", "no-flag"),
        ("uv-venv", "cu12-only-release", "SLIME_OFFLOAD_TRAIN"), ("user-site", "no-tms", "SLIME_OFFLOAD_TRAIN"),
        ("uv-venv", "start-removed", "TMS_AUTOPRELOAD")}
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
START_UP_FILES = ("tms_autopreload.pth", "_tms_autopreload_start.py", "_tms_autopreload_left_over.py")
DEBIAN = "trixie"  # the Debian root of debian-user-site (tools/rootfs.py: its python3 with python3-pip)
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


def _cells(fast: bool, world: str | None = None):
    """The cells of the fast lane (``fast``), or the others of ``world``."""
    for w, failure, shell in itertools.product(WORLDS, FAILURES, SHELLS):
        if shell == "no-flag" and failure in LEFT_OVER:
            continue  # no command of the package can run, and without a flag nothing is said
        if ((w, failure, shell) in FAST) is fast and (fast or w == world):
            yield pytest.param(w, failure, shell, id=f"{w}-{failure}-{shell}")


@pytest.fixture(scope="module")
def kit(parts, rootfs, tmp_path_factory):
    """What every cell builds from: the wheels (offline, one folder), the host, and built-once templates (the
    Debian root and its host among them, made where a world asks)."""
    root = tmp_path_factory.mktemp("way-out")
    links = root / "wheels"
    links.mkdir()
    for wheel in (parts.own_wheel, *(need(tms_wheel, v) for v in ("0.0.9", "0.0.9.post1", "0.0.10"))):
        (links / wheel.name).symlink_to(wheel)
    # uv 0.13 has no variable for --no-index: its configuration file says it (UV_CONFIG_FILE).
    (root / "uv.toml").write_text(f"no-index = true\nfind-links = [{str(links)!r}]\n")
    uvbin = root / "uvbin"  # uv alone on PATH: not the test venv's pip or python beside it
    uvbin.mkdir()
    (uvbin / "uv").symlink_to(need(_uv))
    return {"root": root, "links": links, "uvbin": uvbin, "python": need(locate_python, DEFAULT_PYTHON),
            "host": need(Host, root / "host", parts.host_dirs(("driver", "cuda13"))), "templates": {},
            "deps": parts.global_deps("cu13-sys"), "own": parts.own_wheel,
            "debian": lambda: need(RootfsHost, rootfs(DEBIAN), root / "debian-host",
                                   parts.host_dirs(("driver", "cuda13")))}


def _uv() -> str:
    found = uv()
    if found is None:
        from support import SetupError

        raise SetupError("uv is not installed (tests/requirements.txt installs it)")
    return found


def _offline(kit, cell: Path) -> dict[str, str]:
    """pip's and uv's variables for installs from the suite's wheels only, with a cache of the cell's own."""
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(kit["links"]), "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "UV_CONFIG_FILE": str(kit["root"] / "uv.toml"), "UV_FIND_LINKS": str(kit["links"]),
            "UV_CACHE_DIR": str(cell / "uv-cache")}


def _pip(kit, python: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Install with the suite's own pip into the interpreter ``python``'s environment, offline."""
    run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         "--disable-pip-version-check", "--no-index", "--find-links", str(kit["links"]), *args],
        env=clean_env(**(env or {})))


def _template(kit, name: str, make):
    """A venv made once per module by ``make(path)``, which cells copy (scripts rewritten to the copy); or
    another thing cells share (the Debian root's host)."""
    if name not in kit["templates"]:
        kit["templates"][name] = make(kit["root"] / "templates" / name)
    return kit["templates"][name]


def _pip_venv(kit, path: Path) -> Venv:
    run([kit["python"], "-m", "venv", str(path)], env=clean_env())
    return Venv(path)


def _wheels(kit, tms: str | None) -> list[str]:
    """What a world installs: this package, and torch_memory_saver ``tms`` where there is one."""
    return [str(kit["own"])] + ([f"torch-memory-saver=={tms}"] if tms else [])


def _filled(kit, kind: str, tms: str | None) -> Venv:
    """A venv (``kind``: with its own pip, or ``without-pip``) with :func:`_wheels` installed by pip, made once a
    module for each release; each cell gets a copy (:func:`private_copy`: hard links, its scripts rewritten to
    name the copy), not a pip run of its own, which was the larger part of a cell's time."""
    def make(path: Path) -> Venv:
        venv = (private_copy(_template(kit, "pip", lambda p: _pip_venv(kit, p)), path) if kind == "pip"
                else Venv(path, kit["python"]))
        _pip(kit, venv.python, *_wheels(kit, tms))
        return venv

    return _template(kit, f"{kind}-{tms}", make)


def _target_folder(kit, tms: str) -> Path:
    """A ``pip install --target`` folder holding torch_memory_saver ``tms``, made once a module."""
    def make(path: Path) -> Path:
        _pip(kit, _filled(kit, "pip", None).python, "--target", str(path), f"torch-memory-saver=={tms}")
        return path

    return _template(kit, f"target-{tms}", make)


def _user_base(kit) -> Venv:
    """The interpreter prefix the user-site templates are installed with."""
    return _template(kit, "user-base", lambda path: base_python(kit["python"], path))


def _user_site(kit, world: str, tms: str | None, home: Path) -> Path:
    """``home`` with the user site of ``world`` (``user-site``: an interpreter's own prefix; ``debian-user-site``:
    Debian's python3 and pip) holding :func:`_wheels`, each installed ``--user`` once a module into a home of
    the template's and hard-linked into ``home``; where the user site lies in ``home``."""
    def make(path: Path) -> Path:
        path.mkdir(parents=True)
        if world == "user-site":
            base = _user_base(kit)
            _pip(kit, base.python, "--user", *_wheels(kit, tms), env={"HOME": str(path)})
            return Path(run([str(base.python), "-c", "import site; print(site.getusersitepackages())"],
                            env=clean_env(HOME=str(path))).stdout.strip())
        fs, env = _template(kit, "debian-host", lambda _: kit["debian"]()).rootfs, clean_env(HOME=str(path))
        fs.run(["python3", "-m", "pip", "install", "-q", "--user", "--break-system-packages", "--no-deps",
                "--no-index", "--find-links", str(kit["links"]), *_wheels(kit, tms)], env)
        return Path(fs.run(["python3", "-c", "import site; print(site.getusersitepackages())"], env).stdout.strip())

    template = kit["root"] / "templates" / f"{world}-home-{tms}"
    user = _template(kit, template.name, make)
    run(["cp", "-al", str(template), str(home)])
    return home / user.relative_to(template)


class World:
    """One cell's world: the machine it runs on (``host``: this one, or a Debian root), how its shell starts the
    interpreter (``python``), that shell's variables (``env``), and where this package (``site``), torch
    (``torch_site``) and torch_memory_saver (``tms_site``) lie."""

    def __init__(self, kit, cell: Path, world: str, tms: str | None) -> None:
        self.home = cell / "home"
        self.host = kit["host"]
        env = {"HOME": str(self.home), "PATH": SYSTEM_PATH}
        if world in ("pip-venv-activated", "pip-venv-by-path", "target"):
            venv = private_copy(_filled(kit, "pip", None if world == "target" else tms), cell / "venv")
            if world == "pip-venv-activated":
                env.update(PATH=f"{venv.path / 'bin'}:{SYSTEM_PATH}", VIRTUAL_ENV=str(venv.path))
            self.python, self.site, self.tms_site = str(venv.python), venv.site, venv.site
            if world == "target":
                self.tms_site = cell / "target"
                env["PYTHONPATH"] = str(self.tms_site)
                if tms:
                    run(["cp", "-al", str(_target_folder(kit, tms)), str(self.tms_site)])
                else:
                    self.tms_site.mkdir()
            if world == "pip-venv-activated":
                self.python = "python"
        elif world == "without-pip":
            venv = private_copy(_filled(kit, "without-pip", tms), cell / "venv")
            other = _template(kit, "pip", lambda p: _pip_venv(kit, p))
            env["PATH"] = f"{other.path / 'bin'}:{SYSTEM_PATH}"
            self.python, self.site, self.tms_site = str(venv.python), venv.site, venv.site
        elif world in ("uv-venv", "uv-venv-without-uv"):
            # Made with a cache of its own: the shell's is fresh, so that uv queries the interpreter there
            # (in the flagged shell) instead of reading what it learnt here.
            build = {**_offline(kit, cell), "UV_CACHE_DIR": str(cell / "uv-build-cache")}
            run([str(kit["uvbin"] / "uv"), "venv", "-q", "--python", kit["python"], str(cell / "venv")],
                env=clean_env(**build))
            venv = Venv(cell / "venv")
            run([str(kit["uvbin"] / "uv"), "pip", "install", "-q", "--python", str(venv.python), *_wheels(kit, tms)],
                env=clean_env(**build))
            env["PATH"] = f"{kit['uvbin']}:{SYSTEM_PATH}" if world == "uv-venv" else SYSTEM_PATH
            self.python, self.site, self.tms_site = str(venv.python), venv.site, venv.site
        elif world == "user-site":
            base = base_python(kit["python"], cell / "base")
            user = _user_site(kit, world, tms, self.home)
            # The template's scripts (pip's --user bin/) name the template's interpreter: this cell's instead.
            repoint_scripts(self.home / ".local" / "bin", _user_base(kit).path, base.path)
            env["PATH"] = f"{kit['uvbin']}:{SYSTEM_PATH}"
            self.python, self.site, self.tms_site = str(base.python), user, user
        else:  # debian-user-site: Debian's pip, run in the root, installs as its users do (pip says which option)
            self.host = _template(kit, "debian-host", lambda _: kit["debian"]())
            user = _user_site(kit, world, tms, self.home)
            self.python, self.site, self.tms_site = "python3", user, user
        self.home.mkdir(exist_ok=True)
        self.torch_site = self.site
        write_torch_standin(self.torch_site, cuda="13.0", hip=None, deps_lib=kit["deps"])
        self.env = env


FAILURE_TMS = {"no-tms": None, "cu12-only-release": "0.0.9"}  # the rest: 0.0.10


def _broken(kit, cell: Path, world: str, failure: str) -> tuple[World, dict[str, str]]:
    """The world with the failure in it, and what the failure adds to the shell's variables."""
    w = World(kit, cell, world, FAILURE_TMS.get(failure, "0.0.10"))
    added: dict[str, str] = {}
    if failure == "deleted-build":
        (w.tms_site / CU13).unlink()
    elif failure in ("package-removed", "package-removed-unrecorded"):
        shutil.rmtree(w.site / "tms_autopreload")
        if failure == "package-removed-unrecorded":  # as from an index: pip records only a direct install
            for record in w.site.glob("tms_autopreload-*.dist-info/direct_url.json"):
                record.unlink()
    elif failure == "start-removed":
        (w.site / "_tms_autopreload_start.py").unlink()
    elif failure == "bad-path":
        added["TMS_AUTOPRELOAD_PATH"] = str(cell / "gone" / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    elif failure == "cuda12-override":
        added["TMS_AUTOPRELOAD_CUDA_MAJOR"] = "12"
    return w, added


def the_fix(said: str) -> str:
    """The fix as printed: the first command in backticks after ``Fix:``."""
    at = said.find("Fix: ")
    assert at >= 0, said
    found = re.search(r"`([^`]+)`", said[at:])
    assert found, said
    return found.group(1)


@pytest.mark.parametrize("world, failure, shell", list(_cells(fast=True)))
def test_every_fix_pasted_where_it_was_printed_makes_the_retry_pass(kit, tmp_path, world, failure, shell, said):
    """What the stop (or ``doctor``) says is on record too (``said``: tests/words.py)."""
    w, added = _broken(kit, tmp_path, world, failure)
    env = {**w.env, **added, **SHELLS[shell], **_offline(kit, tmp_path)}
    retry = [w.python, "-m", "tms_autopreload", "doctor"] if shell == "no-flag" else [w.python, "-c", "pass"]
    before = w.host.run(retry, env, timeout=300)
    record, said = said, before.stdout if shell == "no-flag" else before.stderr
    assert before.returncode == (1 if shell == "no-flag" else 78), (before.returncode, said)
    assert _on_record(kit, w, tmp_path, f"$ {shlex.join(retry)}\n{said}--- exit {before.returncode}\n") == record
    fix = the_fix(said)
    assert fix.startswith(("env TMS_AUTOPRELOAD_DISABLE=1 ", "unset ")), (fix, said)
    after = w.host.run(["sh", "-c", f"{fix}; {shlex.join(retry)}"], env, timeout=600)
    headline = next(line for line in said.splitlines() if line.startswith(("NO PLAN:", "tms-autopreload: "))
                    and not line.startswith("tms-autopreload: warning:"))
    assert after.returncode == 0, (fix, after.stdout[-2000:], after.stderr[-3000:])
    assert headline not in after.stdout + after.stderr, (fix, headline)
    found = w.host.run([w.python, "-c", WHERE], w.env)  # the world's shell without the flag: nothing hooked
    assert found.returncode == 0, found.stderr
    placed = {name: os.path.realpath(site / name) for name, site in _placed(w, failure).items()}
    assert {n: os.path.realpath(d) for n, d in json.loads(found.stdout).items() if d} == placed, (fix, found.stdout)
    if "tms_autopreload" in placed:  # and its start-up files beside it: a flagged start is hooked again
        assert sorted(n for n in START_UP_FILES if (w.site / n).is_file()) == sorted(START_UP_FILES), fix


def _on_record(kit, w: World, cell: Path, text: str) -> str:
    """``text`` as the snapshot holds it: this cell's paths named (tests/words.py)."""
    from words import normalise

    python = os.path.realpath(kit["python"])
    driver, cuda13 = kit["host"].dirs
    return normalise(text, {"<site>": w.site, "<tms-site>": w.tms_site, "<home>": w.home, "<cell>": cell,
                            "<kit>": kit["root"], "<own-wheel>": kit["own"], "<driver-dir>": driver,
                            "<cuda13-dir>": cuda13, "<base-python>": python,
                            "<base-prefix>": Path(python).parent.parent})


# Where the interpreter finds each package, without importing it (torch's stand-in raises on import).
WHERE = ("import importlib.util, json; specs = {n: importlib.util.find_spec(n) for n in "
         "('torch', 'torch_memory_saver', 'tms_autopreload')}; "
         "print(json.dumps({n: s.submodule_search_locations[0] for n, s in specs.items() if s}))")


def _placed(w: World, failure: str) -> dict[str, Path]:
    """The site directory each package must be found in after the fix: where the world put it; torch_memory_saver,
    which no-tms leaves out, beside torch (in the user site where torch lies there); this package nowhere where it
    is gone and no record names its source (the fix removes its start-up files and says how to install it)."""
    placed = {"torch": w.torch_site, "torch_memory_saver": w.torch_site if failure == "no-tms" else w.tms_site,
              "tms_autopreload": w.site}
    if failure == "package-removed-unrecorded":
        del placed["tms_autopreload"]
    return placed


def _world_class(world: str) -> type:
    """The other cells of one world, for ``make test``: a class of its own, so that pytest-xdist's
    ``--dist loadscope`` gives each world to a worker (one module would run every cell on one)."""
    @pytest.mark.slow
    @pytest.mark.parametrize("world, failure, shell", list(_cells(False, world)))
    def test(self, kit, tmp_path, world, failure, shell, said):
        test_every_fix_pasted_where_it_was_printed_makes_the_retry_pass(kit, tmp_path, world, failure, shell, said)

    return type(f"TestWorld_{world.replace('-', '_')}", (), {
        "__doc__": f"The way out in the world {world}.",
        "test_every_fix_pasted_where_it_was_printed_makes_the_retry_pass": test})


for _class in map(_world_class, WORLDS):
    globals()[_class.__name__] = _class


# ---------------------------------------------------------------- pip's own command, in a venv with pip

# A flagged start's report once it is hooked: the torch_memory_saver builds mapped in it.
HOOKED = MAPPED + "import json; print(json.dumps(mapped('torch_memory_saver')))"


def test_a_build_deleted_from_an_index_install_is_put_back_by_pips_own_command(scenario, kit, tmp_path):
    """torch_memory_saver 0.0.10 installed from the index (pip keeps no record of where from) in a venv with
    its own pip, the cu13 build deleted: the stop's fix is that pip's command, and pasted into the flagged shell
    (offline, from the suite's wheels) it installs the release again over the damaged copy, so the retried start
    is hooked with the build put back. Without ``--force-reinstall`` pip answers "Requirement already
    satisfied" and puts nothing back. The fast lane's one world with pip (its cells above have uv's command, the
    others pip after ``ensurepip``); the scenario's venv gets the suite's own pip hard-linked, not by a pip run."""
    import pip

    scn = scenario(tms="0.0.10", torch="cu13-sys", tag="index-reinstall-with-pip")
    for record in scn.site.glob("torch_memory_saver-*.dist-info/direct_url.json"):
        record.unlink()  # as from the index: only a direct install (a file, a URL, a checkout) is recorded
    own = Path(pip.__file__).parent  # hard-linked: nothing writes into its files
    run(["cp", "-al", str(own), *map(str, own.parent.glob("pip-*.dist-info")), str(scn.site)])
    (scn.site / CU13).unlink()
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", **_offline(kit, tmp_path))
    python = str(scn.venv.python)
    said = assert_stopped(scn.host.run([python, "-c", "pass"], env), "is missing")
    fix = the_fix(said)
    assert fix.startswith(f"env TMS_AUTOPRELOAD_DISABLE=1 {python} -m pip install "), fix
    after = scn.host.run(["sh", "-c", f"{fix} && {shlex.join([python, '-c', HOOKED])}"], env, timeout=600)
    assert after.returncode == 0, (fix, after.stdout[-2000:], after.stderr[-3000:])
    assert json.loads(after.stdout.strip().splitlines()[-1]) == [str(scn.site / CU13)], after.stdout


@pytest.mark.slow
def test_where_no_command_can_help_the_message_says_so(parts, tmp_path, kit):
    """No driver on the host: nothing pip installs puts one there. The stop says what to do in words, and
    prints no install command."""
    w = World(kit, tmp_path, "pip-venv-by-path", "0.0.10")
    host = need(Host, tmp_path / "host", parts.host_dirs(("cuda13",)))
    r = host.run([w.python, "-c", "pass"], {**w.env, "SLIME_OFFLOAD_TRAIN": "1"})
    assert r.returncode == 78, r.stderr
    assert "install the NVIDIA driver" in r.stderr and "pip install" not in r.stderr, r.stderr
    assert os.path.basename(w.python) == "python"


# ---------------------------------------------------------------- a flagged shell never blocks the repair

def _blocked_world(kit, cell: Path, world: str = "uv-venv") -> World:
    """A venv where no build fits (no torch_memory_saver): every flagged Python start stops, 78."""
    return World(kit, cell, world, None)


REPAIRS = {  # how a user repairs, from a flagged shell, without the prefix: each is left unhooked
    "pip console script": "{bin}/pip --version",
    "pip3.N console script": "{bin}/pip3 --version",
    "python -m pip": "{python} -m pip --version",
    "python -Impip": "{python} -Impip --version",
    "another pip --python": "{other}/pip --python {python} list",
    "uv pip --python": "uv pip install -q --python {python} torch-memory-saver",
    "python -m venv": "{python} -m venv {cell}/new-venv",
    "python -m ensurepip": "{python} -m ensurepip",
    "a build backend pip runs": "{python} -m pip install -q --no-build-isolation {cell}/project",
}
FAST_REPAIRS = {"uv pip --python"}  # the cheapest world, a uv venv (the others need one with pip)


@pytest.mark.parametrize("repair", [pytest.param(r, marks=() if r in FAST_REPAIRS else (pytest.mark.slow,))
                                    for r in REPAIRS])
def test_a_flagged_shell_never_blocks_the_tools_a_user_repairs_with(kit, tmp_path, repair):
    """Where no build fits, a flagged ``python -c pass`` stops (78); pip, ``venv``, ensurepip and uv's
    interpreter query run, and pip passes the kill switch to what it starts (an in-tree build backend, in a
    Python child of pip's). Without the prefix every printed fix carries."""
    w = _blocked_world(kit, tmp_path, "uv-venv" if repair.startswith("uv") else "pip-venv-by-path")
    env = {**w.env, "SLIME_OFFLOAD_TRAIN": "1", "PATH": f"{kit['uvbin']}:{w.env['PATH']}", **_offline(kit, tmp_path)}
    project = tmp_path / "project"  # a project whose build backend is in its own tree: no download
    project.mkdir()
    (project / "pyproject.toml").write_text('[build-system]\nrequires = []\nbuild-backend = "backend"\n'
                                            'backend-path = ["."]\n')
    (project / "backend.py").write_text(_BACKEND)
    other = _template(kit, "pip", lambda p: _pip_venv(kit, p)).path / "bin" if "{other}" in REPAIRS[repair] else None
    command = REPAIRS[repair].format(bin=Path(w.python).parent, python=w.python, other=other, cell=tmp_path)
    assert kit["host"].run([w.python, "-c", "pass"], env).returncode == 78  # the shell is blocked
    r = kit["host"].run(["sh", "-c", command], env, timeout=600)
    assert r.returncode == 0, (command, r.stdout[-2000:], r.stderr[-3000:])
    if repair == "uv pip --python":  # and then the start goes on
        assert kit["host"].run([w.python, "-c", "pass"], env).returncode == 0


# A PEP 517 backend that writes a wheel of one module, with the standard library only.
_BACKEND = '''
import base64, hashlib, os, zipfile

INFO = "demo-0.1.dist-info"
FILES = {"demo.py": b"x = 1\\n", INFO + "/METADATA": b"Metadata-Version: 2.1\\nName: demo\\nVersion: 0.1\\n",
         INFO + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"}

def _digest(data):
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()

def _wheel(directory):
    name = "demo-0.1-py3-none-any.whl"
    record = "".join(f"{n},sha256={_digest(d)},{len(d)}\\n" for n, d in FILES.items()) + INFO + "/RECORD,,\\n"
    with zipfile.ZipFile(os.path.join(directory, name), "w") as z:
        for n, d in FILES.items():
            z.writestr(n, d)
        z.writestr(INFO + "/RECORD", record)
    return name

def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _wheel(wheel_directory)
'''


@pytest.mark.parametrize("world", ["uv-venv", pytest.param("pip-venv-by-path", marks=pytest.mark.slow)])
def test_a_left_over_pth_never_blocks_the_repair_either(kit, tmp_path, world):
    """The package removed, its ``.pth`` left over: the fallback leaves uv's query and pip alone too."""
    w = World(kit, tmp_path, world, "0.0.10")
    shutil.rmtree(w.site / "tms_autopreload")
    env = {**w.env, "TMS_AUTOPRELOAD": "1", "PATH": f"{kit['uvbin']}:{w.env['PATH']}", **_offline(kit, tmp_path)}
    assert kit["host"].run([w.python, "-c", "pass"], env).returncode == 78
    commands = ([["uv", "pip", "list", "--python", w.python]] if world == "uv-venv" else
                [[str(Path(w.python).parent / "pip"), "--version"], [w.python, "-m", "pip", "--version"]])
    for command in commands:
        r = kit["host"].run(command, env)
        assert r.returncode == 0 and "left over" not in r.stderr, (command, r.stderr)


@pytest.mark.slow
def test_where_a_plan_exists_the_repair_tools_are_not_hooked_either(kit, tmp_path):
    """The decision, the same where the flag would hook: pip is never re-executed with the hook (it has no
    use for it, and a start of pip then costs no resolve), and what it starts inherits the kill switch."""
    w = World(kit, tmp_path, "pip-venv-by-path", "0.0.10")
    env = {**w.env, "SLIME_OFFLOAD_TRAIN": "1", "TMS_AUTOPRELOAD_VERBOSE": "1"}
    hooked = kit["host"].run([w.python, "-c", "pass"], env)
    assert hooked.returncode == 0 and "re-executing" in hooked.stderr, hooked.stderr
    r = kit["host"].run([w.python, "-m", "pip", "--version"], env)
    assert r.returncode == 0 and "tms-autopreload" not in r.stderr, r.stderr


# ---------------------------------------------------------------- what a message says where no command can do it

@pytest.mark.slow
@pytest.mark.parametrize("failure", ["no-tms", "package-removed-from-the-user-site"])
def test_an_externally_managed_interpreter_is_said_and_its_fix_runs_as_printed(kit, tmp_path, failure):
    """An interpreter marked EXTERNALLY-MANAGED (PEP 668) with its own pip, as a distribution's python3 with
    python3-pip: pip refuses to install there unless told to. The message says so, and its command, pasted,
    tells pip with pip's own variable. Where this package lay in the user site and is gone (its ``.pth`` left
    over there, run before the system's site-packages is on the path), the fallback says the same."""
    base = base_python(kit["python"], tmp_path / "base")
    stdlib = Path(run([str(base.python), "-c", "import sysconfig; print(sysconfig.get_path('stdlib'))"],
                      env=clean_env()).stdout.strip())
    run([str(base.python), "-m", "ensurepip"], env=clean_env())  # as a distribution's python3-pip gives it
    home = tmp_path / "home"
    home.mkdir()
    user = failure != "no-tms"
    _pip(kit, base.python, *(["--user"] if user else []), str(kit["own"]), env={"HOME": str(home)})
    site = Path(run([str(base.python), "-c", "import site; print(site.getusersitepackages())"],
                    env=clean_env(HOME=str(home))).stdout.strip()) if user else base.site
    write_torch_standin(site, cuda="13.0", hip=None, deps_lib=kit["deps"])
    if user:
        _pip(kit, base.python, "--user", "torch-memory-saver==0.0.10", env={"HOME": str(home)})
        shutil.rmtree(site / "tms_autopreload")
    (stdlib / "EXTERNALLY-MANAGED").write_text("[externally-managed]\nError=use apt\n")
    env = {"HOME": str(home), "PATH": SYSTEM_PATH, "SLIME_OFFLOAD_TRAIN": "1", **_offline(kit, tmp_path)}
    r = kit["host"].run([str(base.python), "-c", "pass"], env)
    assert r.returncode == 78 and "is marked externally managed" in r.stderr and "PEP 668" in r.stderr, r.stderr
    fix = the_fix(r.stderr)
    assert "PIP_BREAK_SYSTEM_PACKAGES=1" in fix and "ensurepip" not in fix, fix
    after = kit["host"].run(["sh", "-c", f"{fix}; {base.python} -c pass"], env, timeout=600)
    assert after.returncode == 0, after.stderr[-3000:]


@pytest.mark.slow
def test_an_old_release_in_a_target_folder_is_upgraded_there(kit, tmp_path):
    """0.0.9.post1 (which reads LD_PRELOAD as one path) in a ``--target`` folder on PYTHONPATH, with another
    preload: the warning's fix installs 0.0.10 into that folder, where it shadows nothing, not into the venv."""
    w = World(kit, tmp_path, "target", "0.0.9.post1")
    env = {**w.env, "SLIME_OFFLOAD_TRAIN": "1", "LD_PRELOAD": "/usr/libexec/coreutils/libstdbuf.so",
           **_offline(kit, tmp_path)}
    r = kit["host"].run([w.python, "-c", "pass"], env)
    assert r.returncode == 0 and "reads LD_PRELOAD as a single path" in r.stderr, r.stderr
    fix = re.search(r"drop those entries or `([^`]+)`", r.stderr).group(1)
    assert f"--target {w.tms_site} --upgrade" in fix, fix
    after = kit["host"].run(["sh", "-c", f"{fix}; {w.python} -c pass"], env, timeout=600)
    assert after.returncode == 0 and "reads LD_PRELOAD as a single path" not in after.stderr, after.stderr


@pytest.mark.slow
def test_a_target_folder_upgraded_in_place_is_judged_by_its_newest_record(kit, tmp_path):
    """``pip install --target DIR --upgrade`` leaves the old release's ``.dist-info`` beside the new one's: the
    release installed there is the one whose record matches the files, so a deleted build is put back as
    that release."""
    w = World(kit, tmp_path, "target", "0.0.9")
    _pip(kit, Path(w.python), "--target", str(w.tms_site), "--upgrade", "torch-memory-saver==0.0.10")
    assert len(list(w.tms_site.glob("torch_memory_saver-*.dist-info"))) == 2  # pip's own leftover
    (w.tms_site / CU13).unlink()
    env = {**w.env, "SLIME_OFFLOAD_TRAIN": "1", **_offline(kit, tmp_path)}
    r = kit["host"].run([w.python, "-c", "pass"], env)
    fix = the_fix(r.stderr)
    assert r.returncode == 78 and "torch-memory-saver==0.0.10" in fix and "0.0.9" not in fix, r.stderr
    after = kit["host"].run(["sh", "-c", f"{fix}; {w.python} -c pass"], env, timeout=600)
    assert after.returncode == 0, after.stderr[-3000:]


@pytest.mark.parametrize("where", ["ray-worker", pytest.param("slurm-step", marks=pytest.mark.slow)])
def test_a_stop_read_off_the_node_says_where_to_run_the_fix(kit, tmp_path, where):
    """Read in a Ray worker's log or a Slurm job's output, "this shell" is the node's launcher: the stop names
    the node and the interpreter there."""
    w = _blocked_world(kit, tmp_path)
    script = tmp_path / "default_worker.py"  # the file Ray starts each worker with (ray/_private/workers/)
    script.write_text("print('worker')\n")
    env = {**w.env, "SLIME_OFFLOAD_TRAIN": "1"}
    if where == "slurm-step":
        env.update(SLURM_JOB_ID="4242", SLURMD_NODENAME="gpu-node-7")
    r = kit["host"].run([w.python, str(script) if where == "ray-worker" else "-c", *([] if where == "ray-worker"
                                                                                  else ["pass"])], env)
    message = assert_stopped(r)
    full = r.stderr
    assert message and "without the hook" in full
    if where == "ray-worker":
        assert f"This process is a Ray worker on node {os.uname().nodename}: run the fix there, for {w.python}" in full
    else:
        assert (f"This process is a step of Slurm job 4242 on node gpu-node-7: run the fix there, for {w.python} "
                f"(for example `srun --jobid 4242 -w gpu-node-7 --overlap COMMAND`)") in full, full


# ---------------------------------------------------------------- env --json where this shell finds the driver

def test_env_json_says_what_the_workers_lack_where_this_shells_path_finds_the_driver(scenario, parts):
    """NGC containers put the driver's directory on LD_LIBRARY_PATH: this shell has a plan (doctor, env), a
    worker started from its raylet's environment does not. ``env --json`` says that, and the fix that works
    there (send the flag); ``env --help`` says what ``--json`` leaves out."""
    from conftest import report_host

    scn = report_host(scenario, tms="0.0.10", host=("cuda13",))
    env = {"LD_LIBRARY_PATH": str(parts.stub)}
    assert scn.run(["-m", "tms_autopreload", "doctor"], env).returncode == 0
    assert scn.run(["-m", "tms_autopreload", "env"], env).returncode == 0
    r = scn.run(["-m", "tms_autopreload", "env", "--json"], env)
    assert r.returncode == 1 and r.stdout == "", r.stderr
    assert f"This shell has a plan only through its own LD_LIBRARY_PATH={str(parts.stub)!r}" in r.stderr, r.stderr
    assert 'Fix: send the flag instead of the variables (runtime_env={"env_vars": {"TMS_AUTOPRELOAD": "1"}}' \
        in r.stderr and "install the NVIDIA driver" not in r.stderr.partition("Fix:")[2], r.stderr
    helped = scn.run(["-m", "tms_autopreload", "env", "--help"]).stdout
    assert "without this shell's own LD_PRELOAD and LD_LIBRARY_PATH" in " ".join(helped.split()), helped
