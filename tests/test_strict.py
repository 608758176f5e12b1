"""``TMS_TEST_STRICT=1`` fails the run, by pytest's exit status, for every outcome but a real pass.

Each case runs a real pytest on a made-up test file with the suite's strict plugin
(``tests/strict.py``) and reads the exit status, which is what ``make test`` and CI act on: a summary
that says "failed" beside an exit status of 0 is a green that lies.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

# case: (test file, pytest's exit status, the words of the failure). 1 is "tests failed"; 2 is
# "interrupted", pytest's status for an error while collecting.
CASES = {
    "a_failing_xfail": ("import pytest\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    assert False\n",
                        1, "expected failure (xfail) under TMS_TEST_STRICT=1"),
    "an_xpass": ("import pytest\n@pytest.mark.xfail(reason='known')\ndef test_x():\n    pass\n",
                 1, "unexpected pass (XPASS) under TMS_TEST_STRICT=1"),
    "a_strict_xpass": ("import pytest\n@pytest.mark.xfail(reason='known', strict=True)\ndef test_x():\n    pass\n",
                       1, "[XPASS(strict)] known"),
    "a_skip": ("import pytest\ndef test_x():\n    pytest.skip('no gcc')\n", 1, "skipped under TMS_TEST_STRICT=1"),
    "a_skip_at_collection": ("import pytest\npytest.skip('no ray', allow_module_level=True)\n",
                             2, "skipped at collection under TMS_TEST_STRICT=1"),
    "an_allowed_skip": ("import pytest\n@pytest.mark.may_skip('no GPU here')\n"
                        "def test_x():\n    pytest.skip('no GPU')\n",
                        0, "(allowed: no GPU here)"),
    "a_pass": ("def test_x():\n    pass\n", 0, "2 passed"),
}


# The lanes run their tests on pytest-xdist's workers (the Makefile's `JOBS`), where the plugin's hooks run in
# each worker and the reports travel to the main process; `JOBS=0`, which docs/development.md offers for a
# debugger, runs them in one process. Each case runs both ways, with the options `make check` passes. Under
# xdist an error while collecting is a failed run (1), not an interrupted one.
WORKERS = {"in-process": "0", "two-workers": "2"}
XDIST_STATUS = {"a_skip_at_collection": 1}

# The fast lane runs the case `make check` itself cannot show (a skip fails it: the lane has none), as the lane
# runs it; the GPU check's allowed skip it meets itself (tests/test_cli.py, under TMS_TEST_STRICT=1). `make test`
# runs every case both ways (each is a pytest run of its own).
FAST = (("a_skip", "two-workers"),)


def own_temp(tmp_path: Path) -> list[str]:
    """The options that keep a made-up run's cache and temporary files inside ``tmp_path``: with pytest's
    numbered base temp under /tmp, the run would first delete the worlds of earlier sessions (gigabytes, up
    to a minute and a half), and nothing of this test's own may stay behind."""
    return ["-p", "no:cacheprovider", "--basetemp", str(tmp_path / "basetemp")]


def lane_options(jobs: str, args: str = "") -> list[str]:
    """The pytest options of ``make check JOBS=<jobs> PYTEST_ARGS=<args>``, read from the commands ``make -n``
    prints, but its ``-m "not slow"`` (the made-up files have no slow test)."""
    r = subprocess.run(["make", "-n", "-s", "check", f"JOBS={jobs}", f"PYTEST_ARGS={args}"], cwd=TESTS.parent,
                       capture_output=True, text=True, check=True)
    line = next(line for line in r.stdout.splitlines() if " -m pytest " in line)
    options = shlex.split(line.partition(" -m pytest ")[2])
    where = options.index("not slow")
    assert options[where - 1] == "-m", line
    return options[:where - 1] + options[where + 1:]


def test_the_makefiles_debugging_example_runs_one_file_in_one_process(tmp_path):
    """The Makefile's example, ``make check JOBS=0 PYTEST_ARGS="-x --pdb <file>"``, as pytest receives it."""
    makefile = (TESTS.parent / "Makefile").read_text()
    example = re.search(r'`make check JOBS=0 PYTEST_ARGS="([^"]*)"`', makefile)
    assert example, "the Makefile's PYTEST_ARGS example"
    args = example.group(1).replace("tests/test_ldso.py", "test_zz_one.py")
    (tmp_path / "test_zz_one.py").write_text("import os\n"
                                            "def test_x():\n    assert 'PYTEST_XDIST_WORKER' not in os.environ\n")
    (tmp_path / "test_zz_other.py").write_text("def test_y():\n    pass\n")
    # Not this run's own worker variables (this test may itself run on a worker).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {
        "TMS_TEST_STRICT": "1", "PYTHONPATH": str(TESTS)}
    r = subprocess.run([sys.executable, "-m", "pytest", *lane_options("0", args), "-p", "strict",
                        *own_temp(tmp_path), "--rootdir", str(tmp_path)],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


@pytest.mark.parametrize(("case", "workers"), [
    pytest.param(c, w, marks=() if (c, w) in FAST else pytest.mark.slow) for c in CASES for w in WORKERS])
def test_the_exit_status_fails_every_outcome_but_a_pass(case, workers, tmp_path):
    """Beside a passing test, each case fails the run, but a pass and an allowed skip."""
    body, status, words = CASES[case]
    if workers != "in-process":
        status = XDIST_STATUS.get(case, status)
    (tmp_path / "test_zz_case.py").write_text(textwrap.dedent(body))
    (tmp_path / "test_zz_ok.py").write_text("def test_ok():\n    pass\n")
    env = {**os.environ, "TMS_TEST_STRICT": "1", "PYTHONPATH": str(TESTS)}
    r = subprocess.run([sys.executable, "-m", "pytest", *lane_options(WORKERS[workers]), "-p", "strict",
                        *own_temp(tmp_path), "--rootdir", str(tmp_path), "test_zz_case.py", "test_zz_ok.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert (r.returncode, words in r.stdout) == (status, True), r.stdout + r.stderr


@pytest.mark.slow  # a pytest run of its own
def test_without_strict_an_xfail_is_only_an_xfail(tmp_path):
    """The plugin changes nothing unless ``TMS_TEST_STRICT=1``: the edit loop keeps pytest's own meaning."""
    (tmp_path / "test_zz_case.py").write_text(CASES["a_failing_xfail"][0])
    env = {k: v for k, v in os.environ.items() if k != "TMS_TEST_STRICT"} | {"PYTHONPATH": str(TESTS)}
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "strict", *own_temp(tmp_path),
                        "--rootdir", str(tmp_path), "test_zz_case.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 xfailed" in r.stdout, r.stdout + r.stderr
