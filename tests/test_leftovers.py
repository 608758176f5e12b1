"""A run that leaves a process's temporary directory behind fails, by pytest's exit status (tests/leftovers.py).

Each case runs a real pytest on a made-up test file with the suite's plugin, the made-up run's TMPDIR a folder
of this test's own (so that what it leaves is this test's to remove), in one process and on two workers, as the
lanes run: the check runs in the main process, after the workers' tests.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_strict import TESTS, WORKERS, lane_options, own_temp

MADE = "import tempfile\ndef test_x():\n    made = tempfile.mkdtemp(prefix={prefix!r})\n"
# case: (the made-up test, pytest's exit status)
CASES = {
    "a_listener_directory_left": (MADE.format(prefix="pymp-"), 1),
    "a_cluster_directory_left": (MADE.format(prefix="tmsray-"), 1),
    "one_removed": (MADE.format(prefix="pymp-") + "    import os; os.rmdir(made)\n", 0),
    "another_name": (MADE.format(prefix="mine-"), 0),
}


@pytest.mark.parametrize(("case", "workers"), [
    pytest.param(c, w, marks=() if (c, w) == ("a_listener_directory_left", "two-workers") else pytest.mark.slow)
    for c in CASES for w in WORKERS])
def test_a_run_that_leaves_a_process_directory_behind_fails_naming_it(case, workers, tmp_path):
    body, status = CASES[case]
    temp = tmp_path / "tmp"
    temp.mkdir()
    (tmp_path / "test_zz_case.py").write_text(body)
    (tmp_path / "test_zz_ok.py").write_text("def test_ok():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")} | {
        "PYTHONPATH": str(TESTS), "TMPDIR": str(temp)}
    r = subprocess.run([sys.executable, "-m", "pytest", *lane_options(WORKERS[workers]), "-p", "leftovers",
                        *own_temp(tmp_path), "--rootdir", str(tmp_path), "test_zz_case.py", "test_zz_ok.py"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    left = sorted(p.name for p in temp.iterdir())
    said = f"left behind in {temp} by this run: {', '.join(str(temp / name) for name in left)}"
    assert r.returncode == status and "2 passed" in r.stdout, r.stdout + r.stderr
    assert (said in r.stdout) is (status == 1), r.stdout
