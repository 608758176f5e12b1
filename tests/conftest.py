"""Session fixtures: the parts every scenario is built from, made once and cached.

``TMS_TEST_STRICT=1`` (set by ``make test`` and so by CI) turns every outcome that is not a real
pass into a failure: see ``tests/strict.py``, whose hooks this module registers.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import except_coverage
import schedule
import strict
import support
from leftovers import pytest_sessionfinish, pytest_sessionstart  # noqa: F401 (hooks)
from strict import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401 (hooks)
from rootfs import Rootfs, RootfsHost, RootfsVenv, arch
from support import Host, SetupError, Venv

DEFAULT_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"


def pytest_configure(config):
    """The two plugins of this directory: tests/strict.py's marker, tests/schedule.py's timer."""
    strict.pytest_configure(config)
    schedule.pytest_configure(config)


if os.environ.get(except_coverage.VAR):
    # A measured run (tests/except_coverage.py): every venv the suite installs into that then holds the package
    # gets the .pth that measures its interpreters.
    def _install_measured(self, *wheels, _install=Venv.install, **kw):
        _install(self, *wheels, **kw)
        except_coverage.measure(self.site)

    Venv.install = _install_measured

# Interpreters in Debian root file systems (tools/rootfs.py): glibc 2.41 and 2.43, CPython 3.13-3.15.
ROOTFS_PYTHONS = ["trixie/3.13", "sid/3.14", "sid/3.15"]
# Debian trixie for arm64, run under emulation: its interpreter, loader and children are aarch64 programs,
# with the aarch64 wheels and stand-ins built for aarch64.
AARCH64 = "trixie-arm64/3.13"


def python_version(python: str) -> tuple[int, ...]:
    """The CPython version of an interpreter as the scenarios name it ("3.11", "sid/3.15")."""
    return tuple(map(int, python.rpartition("/")[2].split(".")))


@pytest.fixture(scope="session", autouse=True)
def neutral_cwd(tmp_path_factory):
    """Every process a test starts runs outside the source tree: with the tree as the current directory,
    ``python -m tms_autopreload`` and ``-c`` probes would import the source, not the installed wheel."""
    here = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("cwd"))
    yield
    os.chdir(here)


@pytest.fixture(scope="session", autouse=True)
def suite_temp(tmp_path_factory, run_temp):
    """The session's base temp, which the words on record call ``<tmp>`` (tests/words.py): pytest's numbered
    one, or the one ``--basetemp`` names (each mutant's run names one: tools/mutants.py); and the run's, where
    the workers' shared parts are (the same directory without xdist)."""
    from words import SUITE_TEMP

    bases = {str(tmp_path_factory.getbasetemp()), str(run_temp)}
    SUITE_TEMP.extend(bases)
    yield
    for base in bases:
        SUITE_TEMP.remove(base)


# What only the whole suite sets up: a test using one of these fixtures, or parametrized over an
# interpreter other than the one running the tests, is marked slow and left out of `make check`.
SLOW_FIXTURES = {"real_torch", "ray_cluster", "field", "two_versions", "client", "gpuless_cluster", "miles_cluster",
                 "cluster", "source_files", "peer", "jobs_node"}  # real torch, Ray, Slurm, source builds


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark slow what needs the whole suite's set-up, before ``-m "not slow"`` deselects; mark the
    aarch64 lane (interpreters of an arm64 root file system), which ``-m aarch64`` selects; run the
    tests marked ``drift`` last, so that under ``-x`` a behaviour test speaks first, and the others the longest
    module first (tests/schedule.py)."""
    longest_first = schedule.order_key(config)
    items.sort(key=lambda item: (item.get_closest_marker("drift") is not None, longest_first(item)))  # stable
    for item in items:
        params = getattr(item, "callspec", None)
        python = params.params.get("python", DEFAULT_PYTHON) if params else DEFAULT_PYTHON
        source_build = params is not None and any("-source" in str(v) for v in params.params.values())
        if SLOW_FIXTURES & set(item.fixturenames) or python != DEFAULT_PYTHON or source_build:
            item.add_marker(pytest.mark.slow)
        if arch(python.rpartition("/")[0]) is not None:
            item.add_marker(pytest.mark.aarch64)


def need(fn, *args, **kw):
    """Call a setup step; a missing capability of this machine skips (a failure under STRICT)."""
    try:
        return fn(*args, **kw)
    except SetupError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def run_temp(tmp_path_factory) -> Path:
    """The whole run's base temp: with pytest-xdist the parent of each worker's own (``--basetemp`` names it
    too), where the workers build once what they all read (:class:`Parts`, the scenarios' installed venvs)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class Parts:
    """Shared, built-once ingredients: driver stub, runtime dirs, stand-in libraries, our wheel; for this
    machine, or for the Debian architecture ``arch`` (its wheels, built by its cross compiler).

    Built once a run at ``root``, which every worker of the run names alike: the first to ask builds (a wheel
    build and three compilers, seconds), the others wait on the lock and open what it built."""

    def __init__(self, root: Path, arch: str | None = None, own_wheel: Path | None = None) -> None:
        self.root = root
        self.arch = arch
        support.check_namespaces()
        self.stub = root / "driver"
        self.rt = {12: root / "cuda12", 13: root / "cuda13"}
        self.hip = root / "rocm6"
        with support.file_lock(root.with_name(f"{root.name}.lock")):
            if not (root / ".complete").exists():
                support.driver_stub(self.stub, arch=arch)
                for major, member in ((12, "nvidia/cuda_runtime/lib/libcudart.so.12"),
                                      (13, "nvidia/cu13/lib/libcudart.so.13")):
                    support.extract(support.runtime_wheel(major, arch), member, self.rt[major])
                support.hip_stub(self.hip, 6, arch=arch)
                if own_wheel is None:
                    support.build_own_wheel(root / "dist", isolated=False)
                (root / ".complete").touch()
        self.own_wheel = own_wheel or sorted((root / "dist").glob("tms_autopreload-*.whl"))[-1]
        self._deps: dict[str, Path] = {}

    def host_dirs(self, names: tuple[str, ...]) -> list[Path]:
        table = {"driver": self.stub, "cuda12": self.rt[12], "cuda13": self.rt[13], "rocm6": self.hip}
        return [table[n] for n in names]

    def global_deps(self, torch: str) -> Path:
        """libtorch_global_deps.so for a stand-in torch kind, linked like the real one."""
        if torch not in self._deps:
            spec = {
                "cu13-sys": (self.rt[13], "libcudart.so.13", None),
                "cu13-pip": (self.rt[13], "libcudart.so.13", "$ORIGIN/../../nvidia/cu13/lib"),
                "cu12-sys": (self.rt[12], "libcudart.so.12", None),
                "cu12-pip": (self.rt[12], "libcudart.so.12", "$ORIGIN/../../nvidia/cuda_runtime/lib"),
                "rocm6": (self.hip, "libamdhip64.so.6", None),
                "cpu": (None, None, None),
            }[torch]
            lib = self.root / "deps" / torch / "libtorch_global_deps.so"
            with support.file_lock(lib.with_name("build.lock")):
                if not lib.exists():
                    support.global_deps(lib, *spec, arch=self.arch)
            self._deps[torch] = lib
        return self._deps[torch]


TORCH_FIELDS = {"cu13-sys": ("13.0", None), "cu13-pip": ("13.0", None), "cu12-sys": ("12.8", None),
                "cu12-pip": ("12.8", None), "rocm6": (None, "6.2.41133"), "cpu": (None, None)}


class Scenario:
    """A venv (with our built wheel) on a host, and ways to start processes in it."""

    def __init__(self, venv: Venv, host: Host, parts: Parts) -> None:
        self.venv = venv
        self.host = host
        self.parts = parts

    @property
    def site(self) -> Path:
        return self.venv.site

    def run(self, args: list[str], env: dict[str, str] | None = None, **kw):
        return self.host.run([str(self.venv.python), *args], support.clean_env(**(env or {})), **kw)

    def doctor(self, env: dict[str, str] | None = None) -> dict:
        r = self.run(["-m", "tms_autopreload", "doctor", "--json"], env)
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)

    def flagged(self, code: str, env: dict[str, str] | None = None, flag: str = "SLIME_OFFLOAD_TRAIN", **kw):
        return self.run(["-c", code], {flag: "1", **(env or {})}, **kw)


@pytest.fixture
def said(snapshot):
    """Syrupy's snapshot, one text file each (tests/words.py): what a user reads, on record."""
    from words import Text

    return snapshot.use_extension(Text)


MODES = ["exec", "dlopen"]


@pytest.fixture(params=MODES)
def mode(request) -> str:
    """Parity of the two modes: a behaviour test that takes this runs once per TMS_AUTOPRELOAD_MODE."""
    return request.param


def mode_env(mode: str) -> dict[str, str]:
    """The variables that start a flagged process in ``mode`` (verbose, so that a failure shows why)."""
    return {"TMS_AUTOPRELOAD_MODE": mode, "TMS_AUTOPRELOAD_VERBOSE": "1"}


def assert_applied(mode: str, reexecd: bool, hooks: list[str], build: str | os.PathLike) -> None:
    """Exec mode: the process image was started by the hook's one re-exec; dlopen mode: it was not (the
    hook was loaded in-process). Either way exactly ``build`` is mapped. ``reexecd`` and ``hooks`` come
    from the process itself (``support.REEXECD``, /proc/self/maps), never from its log."""
    assert support.execs(reexecd) == (1 if mode == "exec" else 0), (mode, reexecd)
    assert [os.path.realpath(h) for h in hooks] == [os.path.realpath(build)], (hooks, str(build))


@pytest.fixture(scope="session")
def parts(run_temp) -> Parts:
    return need(Parts, run_temp / "parts")


@pytest.fixture(scope="session")
def arch_parts(parts, run_temp):
    """Factory: the :class:`Parts` of a Debian architecture (``arch_parts("arm64")``), with our same wheel."""
    made: dict[str, Parts] = {}

    def make(name: str) -> Parts:
        if name not in made:
            made[name] = need(Parts, run_temp / f"parts-{name}", name, parts.own_wheel)
        return made[name]

    return make


@pytest.fixture(scope="session")
def rootfs(run_temp):
    """Factory: the Debian root file system ``suite`` (cached), sharing this run's temporary
    directories (the workers' shared parts with them) and the cached wheels at their own paths."""
    made: dict[str, Rootfs] = {}

    def make(suite: str) -> Rootfs:
        if suite not in made:
            made[suite] = need(Rootfs, suite, [run_temp, support.CACHE / "wheels"])
        return made[suite]

    return make


@pytest.fixture(scope="session")
def scenario(parts, arch_parts, rootfs, run_temp, tmp_path_factory):
    """Factory: ``scenario(tms=..., torch=..., pip=(13,), host=("driver", "cuda13"), python=...)``.

    ``python`` is a version on this machine ("3.11") or one in a Debian root file system
    ("sid/3.15"), whose host is then that root with the loader cache built for ``host``. In a root of
    another architecture ("trixie-arm64/3.13") every part is that architecture's.
    """
    made: dict[tuple, Scenario] = {}
    venvs: dict[tuple, Venv] = {}
    installed: dict[tuple, Venv] = {}

    def make(tms: str | None = "0.0.9.post1", torch: str | None = None, pip: tuple[int, ...] = (),
             host: tuple[str, ...] = ("driver", "cuda13"), python: str = DEFAULT_PYTHON,
             layout: str | None = None, tag: str = "", own_pip: bool = False) -> Scenario:
        """``tag`` gives a scenario of its own, for a test that damages its venv on purpose. Scenarios that
        differ only in ``host`` share one venv (the host is only the loader cache they run under), and
        venvs of the same wheels are copies of one that pip installed them into, once a run for all its workers:
        a pip run costs seconds, a copy and a host (``ldconfig``) a few milliseconds. The suite's venvs are made
        ``--without-pip`` (the fixes printed there install pip first); ``own_pip`` gives one of this machine's
        interpreters pip of its own, as ``python -m venv`` makes it, where what a test pastes is not that step
        (ensurepip costs seconds: once a machine, :func:`support.ensurepip_venv`)."""
        key = (tms, torch, pip, host, python, layout, tag, own_pip)
        if key in made:
            return made[key]
        suite = python.rpartition("/")[0]
        foreign = arch(suite) if suite else None
        own = arch_parts(foreign) if foreign else parts
        name = hashlib.sha1(repr(key).encode()).hexdigest()[:10]
        root = tmp_path_factory.mktemp(f"scn-{name}")
        venv_key = (tms, torch, pip, python, layout, tag, own_pip)
        if venv_key not in venvs:
            venvs[venv_key] = _scenario_venv(root / "venv", tms, torch, pip, python, layout, own, own_pip)
        dirs = own.host_dirs(host)
        made[key] = Scenario(venvs[venv_key], need(RootfsHost, rootfs(suite), root / "host", dirs) if suite
                             else need(Host, root / "host", dirs), own)
        return made[key]

    def _installed(key: tuple, python: str, wheels: list[Path], own_pip: bool) -> Venv:
        """The venv pip installed ``wheels`` into, for ``python`` (with pip itself where ``own_pip``): built by the
        first of the run's workers to ask (under a lock), opened by the others. ``key`` names it alike in each."""
        path = run_temp / "installed" / hashlib.sha1(repr(key).encode()).hexdigest()[:10] / "venv"
        with support.file_lock(path.with_name("build.lock")):
            if not path.with_name(".complete").exists():
                shutil.rmtree(path, ignore_errors=True)
                interpreter = need(support.locate_python, python)
                if own_pip:  # its ensurepip's pip, made once per interpreter (the cache), then the wheels
                    need(support.private_copy, need(support.ensurepip_venv, interpreter), path).install(*wheels)
                else:
                    need(Venv, path, interpreter, wheels)
                path.with_name(".complete").touch()
        return Venv(path)

    def _scenario_venv(path: Path, tms: str | None, torch: str | None, pip: tuple[int, ...], python: str,
                       layout: str | None, own: Parts, own_pip: bool = False) -> Venv:
        """The venv of a scenario: our wheel, NVIDIA's runtime wheels of ``pip``, torch_memory_saver ``tms``
        (released, or in ``layout``) and a torch stand-in of kind ``torch``, for ``python``; pip itself where
        ``own_pip``."""
        suite, _, version = python.rpartition("/")
        foreign = own.arch
        wheels = [own.own_wheel] + [need(support.runtime_wheel, m, foreign) for m in pip]
        if tms and layout in (None, *INSTALLED_LAYOUTS):
            wheels.append(need(support.tms_wheel, tms, foreign))
        if suite:
            if own_pip:  # not silently a venv without one: a root file system's venvs are made its own way
                raise ValueError(f"own_pip is for this machine's interpreters, not {python}")
            fs = rootfs(suite)
            venv = need(RootfsVenv, fs, path, need(fs.python, version), wheels)
        else:
            key = (python, own_pip, *wheels)
            if key not in installed:
                installed[key] = _installed(key, python, wheels, own_pip)
            venv = need(support.private_copy, installed[key], path, links=False)
        if layout is not None:
            _custom_layout(venv, tms or "0.0.10", layout, own)
        if torch:
            cuda, hip = TORCH_FIELDS[torch]
            support.write_torch_standin(venv.site, cuda=cuda, hip=hip, deps_lib=own.global_deps(torch))
        return venv

    return make


def report_host(scenario, python: str = DEFAULT_PYTHON, *, tag: str = "", **kw) -> Scenario:
    """The scenario of the first report (slime #2186) that most tests start from: torch_memory_saver
    0.0.9.post1 and a CUDA 13 system torch, on a host with the driver and the CUDA 13 runtime.
    ``scenario`` is the fixture; ``python``, ``tag`` and any other of its arguments (``tms``, ``host``,
    ``layout``) as it takes them."""
    kw = {"tms": "0.0.9.post1", "torch": "cu13-sys", "host": ("driver", "cuda13"), **kw}
    return scenario(python=python, tag=tag, **kw)


# The layouts made on top of the installed release, not beside its Python side alone.
INSTALLED_LAYOUTS = ("cu12-link",)


def _custom_layout(venv: Venv, tms: str, layout: str, parts: Parts) -> None:
    """Layouts no PyPI wheel has, with the released Python side of ``tms``.

    ``source13``: what ``TMS_CUDA_MAJOR=13 pip install git+...`` leaves, one unsuffixed build
    linking CUDA 13 (the released cu13 binary under that name).
    ``rocm``: a ROCm source build, one unsuffixed build linking libamdhip64 (a stand-in: no
    ROCm wheel exists for this machine).
    ``cu12-link``: the release as pip installed it, then its cu12 preload build replaced by a symbolic link
    to the cu13 build, so that a launcher that picks the cu12 name gets CUDA 13's (awslabs
    agentcore-rl-toolkit's slime example does this).
    """
    import zipfile

    if layout == "cu12-link":
        link = venv.site / "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
        link.unlink()
        link.symlink_to("torch_memory_saver_hook_mode_preload_cu13.abi3.so")
        return
    with zipfile.ZipFile(support.tms_wheel(tms, parts.arch)) as z:
        for name in z.namelist():
            if name.startswith("torch_memory_saver/"):
                target = venv.site / name
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(z.read(name))
        cu13 = z.read("torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    out = venv.site / "torch_memory_saver_hook_mode_preload.abi3.so"
    if layout == "source13":
        out.write_bytes(cu13)
        out.chmod(0o755)
    else:
        support.cc(out, "int tms_hip_hook_standin(void) { return 0; }\n", "-Wl,--no-as-needed",
                   f"-L{parts.hip}", "-l:libamdhip64.so.6", arch=parts.arch)


# The real torch releases the real-torch scenarios run with (tools/sandbox.py): the first is every test's default.
TORCHES = list(support.TORCH_VERSIONS)
# Each one's torch.version.cuda (pip's builds of both link CUDA 13: libcudart.so.13 from nvidia/cu13/lib).
TORCH_CUDA = {"2.14.1": "13.0", "2.15.0": "13.2"}


@pytest.fixture(scope="session")
def real_torch(parts, tmp_path_factory):
    """Factory: ``real_torch(host, tms, torch=..., pip=())``: real torch (a CUDA 13 build; ``torch`` one of
    :data:`TORCHES`) + a real torch_memory_saver wheel + our wheel (+ NVIDIA's runtime wheels of the majors in
    ``pip``, installed beside torch's own), on a host.

    One cached venv per torch release holds it (5.5 GB); this run installs into a hard-linked private copy of
    it (:func:`support.private_copy`) per (torch, pip), where ``tms`` switches the torch_memory_saver installed
    (a pip reinstall of a small wheel) when a test asks for another version than the last one.
    """
    made: dict[tuple, Scenario] = {}
    venvs: dict[tuple, Venv] = {}  # the private copies, made on first use
    installed: dict[tuple, str] = {}

    def make(host: tuple[str, ...] = ("driver",), tms: str = "0.0.9.post1", torch: str = TORCHES[0],
             pip: tuple[int, ...] = ()) -> Scenario:
        key = (torch, pip)
        if key not in venvs:
            shared = need(support.torch_venv, support.find_python(DEFAULT_PYTHON), torch)
            venv = need(support.private_copy, shared, tmp_path_factory.mktemp("torch-venv") / "venv")
            need(venv.install, parts.own_wheel, *(need(support.runtime_wheel, m) for m in pip))
            venvs[key] = venv
        venv = venvs[key]
        if installed.get(key) != tms:
            need(venv.install, support.tms_wheel(tms))
            installed[key] = tms
        if (key, host) not in made:
            root = tmp_path_factory.mktemp("torch-host")
            made[(key, host)] = Scenario(venv, need(Host, root, parts.host_dirs(host)), parts)
        return made[(key, host)]

    return make
