"""The suite's own order (tests/schedule.py): the modules the last run of a lane timed longest go first, each
module's tests together and in their order; a run records its own times under its lane; a cache it cannot read
is no order at all, never a failed collection. Made-up modules in pytest runs of their own: the orders come
from times written into the cache, and a run's record is judged by lower bounds only (a sleep is at least its
length), so that a loaded machine cannot change what these tests see."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODULES = {
    "test_a.py": "def test_a1(): pass\ndef test_a2(): pass\n",
    "test_b.py": "import time, pytest\n@pytest.mark.slow\ndef test_b1(): time.sleep(0.3)\ndef test_b2(): pass\n",
    "test_c.py": "import time\ndef test_c1(): time.sleep(0.1)\n",
    "test_d.py": "def test_d1(): pass\n",
}
FILE_ORDER = ["test_a1", "test_a2", "test_b1", "test_b2", "test_c1", "test_d1"]

CONFTEST = textwrap.dedent("""
    import schedule
    pytest_configure = schedule.pytest_configure

    def pytest_collection_modifyitems(config, items):
        items.sort(key=schedule.order_key(config))
""")


@pytest.fixture
def modules(tmp_path):
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    return tmp_path


def _times(root: Path, lane: str) -> Path:
    return root / ".cache" / "v" / "tms_autopreload" / "lane_seconds" / lane


def _order(root: Path, *extra: str) -> list[str]:
    """The test names in the order a run of the made-up modules ran them (one process: the order collected)."""
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-o", "cache_dir=.cache", *extra], cwd=root,
                       capture_output=True, text=True,
                       env={"PYTHONPATH": str(Path(__file__).parent), "PATH": "/usr/bin:/bin",
                            "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"})  # none of the venv's plugins: a second each
    assert r.returncode == 0, r.stdout + r.stderr
    return [line.split(" ", 1)[1].split("::")[1] for line in r.stdout.splitlines() if line.startswith("PASSED ")]


def _keep(root: Path, lane: str, seconds: dict[str, float]) -> None:
    _times(root, lane).parent.mkdir(parents=True, exist_ok=True)
    _times(root, lane).write_text(json.dumps(seconds))


def test_an_untimed_run_keeps_file_order_and_records_its_times(modules):
    assert _order(modules) == FILE_ORDER
    seconds = json.loads(_times(modules, "all").read_text())
    assert set(seconds) == set(MODULES) and seconds["test_b.py"] >= 0.3 and seconds["test_c.py"] >= 0.1, seconds


def test_the_longest_module_goes_first_and_a_narrowed_run_keeps_the_others_times(modules):
    _keep(modules, "all", {"test_c.py": 9.0, "test_a.py": 5.0, "test_b.py": 1.0})
    assert _order(modules) == ["test_c1", "test_a1", "test_a2", "test_b1", "test_b2", "test_d1"]
    _keep(modules, "all", {"test_c.py": 9.0, "test_a.py": 5.0, "test_b.py": 1.0})
    assert _order(modules, "test_d.py") == ["test_d1"]
    kept = json.loads(_times(modules, "all").read_text())
    assert kept["test_c.py"] == 9.0 and kept["test_a.py"] == 5.0 and "test_d.py" in kept, kept


def test_each_lane_is_ordered_and_recorded_by_its_own_times(modules):
    """A ``-m`` expression's run (a lane) reads and writes that lane's times alone: a module's slow tests never
    order the fast lane."""
    _keep(modules, "all", {"test_b.py": 9.0})
    _keep(modules, "not_slow", {"test_d.py": 9.0, "test_c.py": 5.0})
    assert _order(modules, "-m", "not slow") == ["test_d1", "test_c1", "test_a1", "test_a2", "test_b2"]
    assert json.loads(_times(modules, "all").read_text()) == {"test_b.py": 9.0}
    assert _order(modules)[:2] == ["test_b1", "test_b2"]


@pytest.mark.parametrize("kept", ['"not a table"', '{"test_b.py": "long", "test_c.py": null}', "[1, 2]"])
def test_a_cache_it_cannot_read_is_no_time(modules, kept):
    _times(modules, "all").parent.mkdir(parents=True)
    _times(modules, "all").write_text(kept)
    assert _order(modules) == FILE_ORDER
    assert set(json.loads(_times(modules, "all").read_text())) == set(MODULES)  # the run's own times replace it
