"""The suite's own order (tests/schedule.py): the modules the last run timed longest go first, each module's
tests together and in their order, and a cache it cannot read is no order at all, never a failed collection."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Four made-up modules; b's tests take longest, then c's; a's and d's were never timed.
MODULES = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": "import time\ndef test_b1(): time.sleep(0.3)\ndef test_b2(): pass\n",
    "test_c.py": "import time\ndef test_c1(): time.sleep(0.1)\n",
    "test_d.py": "def test_d1(): pass\n",
}

CONFTEST = textwrap.dedent("""
    import schedule
    pytest_configure = schedule.pytest_configure

    def pytest_collection_modifyitems(config, items):
        items.sort(key=schedule.order_key(config))
""")


def _order(tmp_path, *extra: str) -> list[str]:
    """The test ids in the order a run of the made-up modules ran them (one process: the order collected)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA",
                        f"--rootdir={tmp_path}", "-o", "cache_dir=.cache", *extra], cwd=tmp_path,
                       capture_output=True, text=True,
                       env={"PYTHONPATH": str(Path(__file__).parent), "PATH": "/usr/bin:/bin",
                            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # none of the venv's plugins: a second each
    assert r.returncode == 0, r.stdout + r.stderr
    return [line.split(" ", 1)[1].split("::")[1] for line in r.stdout.splitlines() if line.startswith("PASSED ")]


@pytest.fixture
def modules(tmp_path):
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    return tmp_path


def test_the_longest_module_goes_first_as_the_last_run_timed_it(modules):
    first = _order(modules)
    assert first == ["test_a1", "test_a2", "test_b1", "test_b2", "test_c1", "test_d1"], first  # untimed: file order
    assert _order(modules) == ["test_b1", "test_b2", "test_c1", "test_a1", "test_a2", "test_d1"]
    # A narrowed run times what it ran; the others keep their times.
    assert _order(modules, "test_d.py") == ["test_d1"]
    assert _order(modules)[:3] == ["test_b1", "test_b2", "test_c1"]


def test_each_lane_keeps_its_own_times(modules):
    """A ``-m`` expression's run (a lane) is ordered by that lane's times alone: here the lane without b's
    slow test first times c longest, while the whole run's order stays b's."""
    (modules / "test_b.py").write_text("import time, pytest\n@pytest.mark.slow\ndef test_b1(): time.sleep(0.3)\n"
                                       "def test_b2(): pass\n")
    (modules / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    assert _order(modules)[:2] == ["test_a1", "test_a2"]
    assert _order(modules)[:3] == ["test_b1", "test_b2", "test_c1"]
    assert _order(modules, "-m", "not slow")[:2] == ["test_a1", "test_a2"]  # this lane untimed: file order
    assert _order(modules, "-m", "not slow")[0] == "test_c1"
    assert _order(modules)[:3] == ["test_b1", "test_b2", "test_c1"]


@pytest.mark.parametrize("kept", ['"not a table"', '{"test_b.py": "long", "test_c.py": null}', "[1, 2]"])
def test_a_cache_it_cannot_read_is_no_time(modules, kept):
    cache = modules / ".cache" / "v" / "tms_autopreload" / "lane_seconds"
    cache.mkdir(parents=True)
    (cache / "all").write_text(kept)
    assert _order(modules) == ["test_a1", "test_a2", "test_b1", "test_b2", "test_c1", "test_d1"]
    assert _order(modules)[:3] == ["test_b1", "test_b2", "test_c1"]  # and the run's own times replace it
