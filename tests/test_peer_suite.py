"""torch_memory_saver's own tests, run as they are: the judge of this project's changes that no one here wrote.

The 0.0.10 sdist on the package index carries upstream's ``test/`` directory. Its files run from the
unpacked sdist with their own imports, under pytest, in a venv of real torch 2.14.1 (a private copy of
the cached one) with torch_memory_saver built from that sdist (tools/tms_source.py), on a pip-only host
(no libcudart in ld.so.cache; the driver stand-in is the one stand-in). The variants:

* ``released``: the 0.0.10 source build as released, nothing of this project installed;
* ``patched``: built with this project's upstream patch (patches/torch_memory_saver/), tms_autopreload
  not installed, so the patch's guarded import finds nothing;
* ``patched-off``: the same with tms_autopreload installed and turned off (TMS_AUTOPRELOAD_DISABLE=1);
* ``hooked``: the released build with tms_autopreload installed and its flag set for the test process,
  which the start-up hook therefore starts with the verified build preloaded.

What passes released must pass in every variant: a failure elsewhere is this project's bug, or one of their
tests assuming that no hook is preloaded when it starts; :data:`VERDICTS` says which, test by test.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from conftest import DEFAULT_PYTHON, need
from support import (MAPPED, Host, Venv, clean_env, fenced_blocks, find_python, private_copy, run, tms_wheel,
                     torch_venv, write_examples_standin)

ROOT = Path(__file__).resolve().parent.parent
PYTEST = next(line.strip() for line in (ROOT / "tests" / "requirements.txt").read_text().splitlines()
              if line.startswith("pytest=="))
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

# The sdist's test files that run, in this order; within a file, pytest keeps its definition order.
RUN = ("test_configure_subprocess.py", "test_utils.py")
# Their tests, as pytest names them. None of them needs a GPU: the three of test_configure_subprocess.py
# replace get_binary_path_from_package; test_utils.py's raise before TorchMemorySaver loads its binary.
TESTS = (
    "test_configure_subprocess.py::test_sets_ld_preload_when_unset",
    "test_configure_subprocess.py::test_prepends_without_overwriting_existing",
    "test_configure_subprocess.py::test_restores_ld_preload_after_context",
    "test_utils.py::test_get_binary_path_from_package_uses_unsuffixed_rocm_binary",
    "test_utils.py::test_get_binary_path_from_package_keeps_cuda_suffix_selection",
    "test_utils.py::test_change_env_leaves_absent_key_absent",
    "test_utils.py::test_change_env_restores_previous_value",
    "test_utils.py::test_cpu_backup_backend_requires_enable",
    "test_utils.py::test_cpu_backup_backend_rejected_on_xpu",
    "test_utils.py::test_cpu_backup_backend_rejects_mmap_on_rocm",
)
# Not run, never counted as passed: (why, the collection error that shows it).
NOT_RUN = {
    "test_examples.py": ("imports test/examples/ (`from examples import ...`), which the sdist leaves out; "
                         "its tests drive a GPU (allocate, pause, resume device memory)",
                         "ModuleNotFoundError: No module named 'examples'"),
    "test_merge_cuda_wheels.py": ("loads scripts/merge_cuda_wheels.py, which the sdist leaves out",
                                  "merge_cuda_wheels.py"),
}

VARIANTS = {  # name: (torch_memory_saver build, tms_autopreload installed, environment of the test process)
    "released": ("0.0.10-source", False, {}),
    "patched": ("0.0.10-source-patched", False, {}),
    "patched-off": ("0.0.10-source-patched", True, {"TMS_AUTOPRELOAD_DISABLE": "1"}),
    "hooked": ("0.0.10-source", True, {"TMS_AUTOPRELOAD": "1"}),
}
# Per variant, every test's verdict. In "hooked" every test passes in a process started with the verified
# build preloaded (LD_PRELOAD is that one path, torch's libcudart bound through LD_LIBRARY_PATH): none of
# them assumes an unhooked start. The three of test_configure_subprocess.py set or remove LD_PRELOAD
# inside patch.dict, so the value the hook left is restored after each; test_utils.py never reads it.
VERDICTS = {name: dict.fromkeys(TESTS, "passed") for name in VARIANTS}
COUNTS = {name: {"passed": 10, "failed": 0, "not run": 2} for name in VARIANTS}

# The script the test process runs: what the start-up left in this process, then pytest in it.
DRIVER = MAPPED + r"""
import json, os, sys
maps = mapped()
with open(sys.argv[1], 'w') as out:
    json.dump({'hooks': sorted({m for m in maps if 'torch_memory_saver_hook' in os.path.basename(m)}),
               'cudart': sorted({m for m in maps if os.path.basename(m).startswith('libcudart.so')}),
               'preload': os.environ.get('LD_PRELOAD'), 'library_path': os.environ.get('LD_LIBRARY_PATH')}, out)
import pytest
sys.exit(pytest.main(sys.argv[2:]))
"""


class PeerRun:
    """One run of their tests: each test's outcome, what the process started with, pytest's output."""

    def __init__(self, outcomes: dict[str, str], start: dict, output: str, returncode: int) -> None:
        self.outcomes = outcomes
        self.start = start
        self.output = output
        self.returncode = returncode


def outcomes(junit: Path) -> dict[str, str]:
    """{file::name: passed/failed/error/skipped} from pytest's JUnit XML report."""
    got = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        kind = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), "passed")
        got[f"{case.get('classname').rpartition('.')[2]}.py::{case.get('name')}"] = {"failure": "failed"}.get(kind,
                                                                                                            kind)
    return got


class PeerVenv:
    """A private copy of the real torch venv with pytest, one torch_memory_saver build and, optionally,
    tms_autopreload; its host sees the driver stand-in only."""

    def __init__(self, base: Venv, root: Path, build: str, own_wheel: Path | None, host: Host) -> None:
        self.venv = private_copy(base, root / "venv")
        self.venv.install(tms_wheel(build))
        if own_wheel is not None:
            self.venv.install(own_wheel)
        elif (self.venv.site / "tms_autopreload").exists():  # the shared venv is not ours to trust: not here
            run([sys.executable, "-m", "pip", "--python", str(self.venv.python), "uninstall", "-q", "-y",
                 "tms-autopreload"])
        importable = run([str(self.venv.python), "-c", "import importlib.util as u; "
                          "print(u.find_spec('tms_autopreload') is not None)"], env=clean_env()).stdout.strip()
        assert importable == str(own_wheel is not None), (build, importable)
        self.root = root
        self.host = host

    def pytest(self, tests: list[str], env: dict[str, str], tag: str) -> PeerRun:
        """Run pytest on ``tests`` (paths or node ids) from a directory outside the sdist, so that
        ``torch_memory_saver`` is the installed one, as in their CI."""
        driver, junit, start = self.root / "driver.py", self.root / f"{tag}.xml", self.root / f"{tag}.json"
        driver.write_text(DRIVER)
        cwd = self.root / "cwd"
        cwd.mkdir(exist_ok=True)
        r = self.host.run([str(self.venv.python), str(driver), str(start), "-q", "-p", "no:cacheprovider",
                           f"--junitxml={junit}", "-o", "junit_family=xunit2", *tests], clean_env(**env),
                          cwd=cwd, timeout=600)
        found = outcomes(junit) if junit.exists() else {}
        return PeerRun(found, json.loads(start.read_text()), r.stdout + r.stderr, r.returncode)


@pytest.fixture(scope="module")
def sdist_tests(tmp_path_factory) -> Path:
    import tms_source

    return need(tms_source.unpack, tmp_path_factory.mktemp("peer-sdist")) / "test"


@pytest.fixture(scope="module")
def peer(parts, tmp_path_factory):
    """Factory: the :class:`PeerVenv` of a variant (made once)."""
    shared = need(torch_venv, find_python(DEFAULT_PYTHON))
    base = need(private_copy, shared, tmp_path_factory.mktemp("peer-base") / "venv")
    need(base.install, PYTEST, deps=True)
    host = need(Host, tmp_path_factory.mktemp("peer-host"), parts.host_dirs(("driver",)))
    made: dict[tuple[str, bool], PeerVenv] = {}

    def make(variant: str) -> PeerVenv:
        build, own, _ = VARIANTS[variant]
        if (build, own) not in made:
            made[build, own] = need(PeerVenv, base, tmp_path_factory.mktemp(f"peer-{variant}"), build,
                                    parts.own_wheel if own else None, host)
        return made[build, own]

    return make


def test_the_sdist_test_files_are_run_or_listed(sdist_tests):
    """Every file of the sdist's test/ is either run or listed as not run, with its reason."""
    assert sorted(p.name for p in sdist_tests.glob("test_*.py")) == sorted([*RUN, *NOT_RUN])


def test_files_listed_as_not_run_cannot_be_collected_from_the_sdist(peer, sdist_tests):
    """Their collection fails in the released build for the reason :data:`NOT_RUN` gives."""
    scn = peer("released")
    for name, (_, shown) in NOT_RUN.items():
        r = scn.pytest([str(sdist_tests / name)], {}, f"collect-{name}")
        assert r.returncode == 2 and "passed" not in r.outcomes.values(), r.output[-3000:]
        assert "error" in r.output.lower() and shown in r.output, r.output[-3000:]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_their_suite(peer, sdist_tests, variant):
    scn = peer(variant)
    r = scn.pytest([str(sdist_tests / name) for name in RUN], VARIANTS[variant][2], variant)
    assert r.outcomes == VERDICTS[variant], r.output[-5000:]
    passed = [t for t, o in r.outcomes.items() if o == "passed"]
    assert {"passed": len(passed), "failed": len(r.outcomes) - len(passed), "not run": len(NOT_RUN)} \
        == COUNTS[variant]
    assert r.returncode == (0 if len(passed) == len(TESTS) else 1), r.output[-3000:]
    site = scn.venv.site
    if variant == "hooked":  # the evidence that their tests ran in a hooked process
        assert r.start["hooks"] == [str(site / CU13)], r.start
        assert r.start["preload"] == str(site / CU13), r.start
        assert r.start["cudart"] == [str(site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")], r.start
    else:
        assert r.start["hooks"] == [] and r.start["preload"] is None, r.start


def test_what_passes_released_passes_in_every_variant():
    """The rule itself, on the tables the runs are checked against."""
    released = {t for t, o in VERDICTS["released"].items() if o == "passed"}
    assert released == set(TESTS)
    for variant in VARIANTS:
        assert released <= {t for t, o in VERDICTS[variant].items() if o == "passed"}, variant


def test_their_suite_does_not_depend_on_its_order(peer, sdist_tests):
    """Released, their tests pass in the reverse order too: no fixture of theirs needs what an earlier test
    loaded, so the order above (files as listed, tests as defined) is pinned for reading, not for passing."""
    r = peer("released").pytest([str(sdist_tests / t) for t in reversed(TESTS)], {}, "reversed")
    assert r.outcomes == VERDICTS["released"], r.output[-5000:]


def test_with_tms_autopreload_on_the_patched_pick_is_the_verified_build(peer, sdist_tests):
    """Not a variant of the rule above: with tms_autopreload installed and on, the patched
    configure_subprocess() hands children the verified plan, by design. Two tests of
    test_configure_subprocess.py replace get_binary_path_from_package with a fake path and expect that
    path in LD_PRELOAD: they see the verified build instead and fail; the third only checks that
    LD_PRELOAD changes and is restored, and passes. Their CI (no tms_autopreload) is unaffected, and
    TMS_AUTOPRELOAD_DISABLE=1 gives today's pick back (patched-off above)."""
    scn = peer("patched-off")
    r = scn.pytest([str(sdist_tests / name) for name in RUN], {}, "patched-on")
    fake_path = {"test_configure_subprocess.py::test_sets_ld_preload_when_unset",
                 "test_configure_subprocess.py::test_prepends_without_overwriting_existing"}
    assert r.outcomes == {t: "failed" if t in fake_path else "passed" for t in TESTS}, r.output[-5000:]
    assert r.output.count(f"+ {scn.venv.site / CU13}") == len(fake_path), r.output[-5000:]  # what they saw
    assert r.start["hooks"] == [], r.start  # the test process itself is not hooked (no flag)


# ---------------------------------------------------------------- on a GPU: scripts/gpu-check.sh

GPU_CHECK = ROOT / "scripts" / "gpu-check.sh"


def their_tests(sdist: Path, dest: Path, fetched: Path | None = None, **env: str) -> subprocess.CompletedProcess:
    """``scripts/gpu-check.sh --their-tests dest`` with ``sdist`` as the only file of its wheel directory, and
    ``fetched`` as its ``examples/`` (where ``--fetch`` copies ``TMS_EXAMPLES``); ``env`` added."""
    wheels = dest.parent / f"{dest.name}-wheels"
    wheels.mkdir()
    (wheels / "torch_memory_saver-0.0.10.tar.gz").symlink_to(sdist)
    if fetched:
        shutil.copytree(fetched, wheels / "examples")
    return subprocess.run(["bash", str(GPU_CHECK), "--their-tests", str(dest)], capture_output=True, text=True,
                          env=clean_env(WHEELS=str(wheels), **env), timeout=120)


def test_the_gpu_check_runs_every_file_of_the_sdists_tests_or_says_why_not(tmp_path):
    """The GPU check puts torch_memory_saver's tests together from the 0.0.10 sdist's ``test/`` and the
    scenarios test_examples.py imports, their ``test/examples/``, which the sdist leaves out and the user
    gives (``TMS_EXAMPLES``, or the copy ``--fetch`` made of it; here a stand-in of empty modules). Every file
    of the sdist's ``test/`` runs or is listed with why not. Without the examples test_examples.py, their
    GPU tests, is listed as not run, and the selection passes; with them every scenario it imports must be
    there. A test file the check does not know, or a scenario it lacks, fails the selection."""
    import tms_source

    sdist = need(tms_source.sdist)
    head = ["their tests: run test_configure_subprocess.py", "their tests: run test_utils.py"]
    merge = ("their tests: not run test_merge_cuda_wheels.py: loads scripts/merge_cuda_wheels.py, which the "
             "sdist leaves out (and needs no GPU)")
    r = their_tests(sdist, tmp_path / "none")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in (tmp_path / "none").glob("test_*.py")) == sorted([*RUN, *NOT_RUN])
    assert not (tmp_path / "none" / "examples").exists()
    assert r.stdout.splitlines() == [
        *head,
        "their tests: not run test_examples.py: its scenarios, test/examples/, are not in the sdist; give "
        "TMS_EXAMPLES=DIR (torch_memory_saver's test/examples at 4a43c97, see docs/gpu.md) to run it",
        merge], r.stdout
    names = write_examples_standin(sdist, tmp_path / "examples")
    given = [f"their tests: examples/ has the {len(names)} scenarios test_examples.py imports", *head,
             "their tests: run test_examples.py (needs the GPU)", merge]
    for case, r in (("TMS_EXAMPLES", their_tests(sdist, tmp_path / "given", TMS_EXAMPLES=str(tmp_path / "examples"))),
                    ("fetched", their_tests(sdist, tmp_path / "fetched", fetched=tmp_path / "examples"))):
        assert r.returncode == 0, (case, r.stdout + r.stderr)
        assert r.stdout.splitlines() == given, (case, r.stdout)
    assert sorted(p.stem for p in (tmp_path / "given" / "examples").iterdir()) == sorted(names)
    r = their_tests(sdist, tmp_path / "typo", TMS_EXAMPLES=str(tmp_path / "exmaples"))
    assert r.returncode == 2 and r.stderr.startswith(f"gpu-check: TMS_EXAMPLES={tmp_path / 'exmaples'} is not a "
                                                     "directory: give torch_memory_saver's test/examples"), r.stderr
    # The next sdist, say: one test file more, and a scenario that the examples given lack.
    tree = need(tms_source.unpack, tmp_path / "next")
    (tree / "test" / "test_new.py").write_text("def test_new():\n    pass\n")
    examples = tree / "test" / "test_examples.py"
    examples.write_text(examples.read_text().replace("    simple,\n", "    simple,\n    sleep_mode,\n"))
    changed = tmp_path / "torch_memory_saver-next.tar.gz"
    with tarfile.open(changed, "w:gz") as tar:
        tar.add(tree, arcname=tree.name)
    r = their_tests(changed, tmp_path / "their-next", TMS_EXAMPLES=str(tmp_path / "examples"))
    assert r.returncode == 1, r.stdout + r.stderr
    errors = [line for line in r.stdout.splitlines() if "ERROR" in line]
    assert errors == ["their tests: ERROR test_new.py: in the sdist, neither run nor listed",
                      "their tests: ERROR test_examples.py imports examples.sleep_mode: no examples/sleep_mode.py"], \
        r.stdout


def test_the_docs_take_the_examples_from_the_commit_the_sdist_was_made_from():
    """docs/gpu.md's commands that give the GPU check torch_memory_saver's scenarios: a clone of its
    repository, beside the checkout, at the commit whose sources the 0.0.10 sdist carries, whose
    ``test/examples`` ``TMS_EXAMPLES`` names for ``--fetch``."""
    import tms_source

    lines = [line.split() for block in fenced_blocks((ROOT / "docs" / "gpu.md").read_text())
             for line in block.splitlines()]
    clone = [line for line in lines if line[:2] == ["git", "clone"]]
    assert len(clone) == 1 and clone[0][2] == "https://github.com/fzyzcjy/torch_memory_saver", clone
    where = clone[0][3]
    assert not (ROOT / where).resolve().is_relative_to(ROOT), where  # not inside the checkout
    assert ["git", "-C", where, "checkout", tms_source.UPSTREAM_COMMIT] in lines, lines
    assert [f"TMS_EXAMPLES={where}/test/examples", "scripts/gpu-check.sh", "--fetch"] in lines, lines
