"""What a test run leaves in the machine's temporary directory: nothing of its own.

The tests end the processes they start by PID (Ray's among them, never ``ray stop``), so a clean-up those
processes would do on a normal exit does not run: a directory such a process made by Python's tempfile stays
behind unless the test gave it a temporary directory of its own (support.RayCluster gives its processes one).
This plugin lists, at the start of the run, the names in the temporary directory that the kinds of process the
tests start leave there (:data:`LEFT_BEHIND`), and at its end fails the run (its exit status, in the main
process under pytest-xdist) naming each new one: a leak is found by the run that makes it, not by the next
person to look in ``/tmp``. Another program making such names at the same time on the machine would be
counted too; CI runs nothing beside the suite.
"""

from __future__ import annotations

import glob
import os
import tempfile

import pytest

# multiprocessing's listener directories (a forkserver, a manager: pymp-*), support.RayCluster's directories.
LEFT_BEHIND = ("pymp-*", "tmsray-*")
_BEFORE = pytest.StashKey[set]()


def _present() -> set[str]:
    return {path for pattern in LEFT_BEHIND for path in glob.glob(os.path.join(tempfile.gettempdir(), pattern))}


def pytest_sessionstart(session):
    if not hasattr(session.config, "workerinput"):  # the main process: the workers' tests run after this
        session.config.stash[_BEFORE] = _present()


def pytest_sessionfinish(session, exitstatus):
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    left = sorted(_present() - before)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"left behind in {tempfile.gettempdir()} by this run: {', '.join(left)} (a process "
                                f"a test started and ended without its clean-up: give it a TMPDIR of its own)",
                                red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
