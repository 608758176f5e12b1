"""The order the suite's workers take the test modules in: the longest first, as the last run of the same lane
timed them.

pytest-xdist's ``--dist loadscope`` hands out whole modules as workers come free: by default the modules with the
most tests first, and with ``--no-loadscope-reorder`` (the Makefile's lanes) in collection order. A module of a
few long tests (test_outcomes, test_calls) then comes late, and runs alone at the end while the other CPUs wait:
on two cores about 10 s of ``make check``'s 140. Handing out the longest first (the longest-processing-time rule
of scheduling) leaves the short modules to fill the gaps at the end.

The times are the last run's of the same lane, module by module, kept in pytest's cache (``.pytest_cache``, which
``--cache-clear`` or ``-p no:cacheprovider`` leave out): a module no run has timed keeps its place after the timed
ones, in file-name order, as a fresh checkout runs them all. The order changes when tests run, never which run
or what they judge; ``drift`` tests still run last (tests/conftest.py).
"""

from __future__ import annotations

import re
from collections import defaultdict

import pytest

KEY = "tms_autopreload/lane_seconds"


def cache_key(config: pytest.Config) -> str:
    """Where one lane's times are kept: each ``-m`` expression its own (``make check``'s fast lane, ``make test``'s
    measured and slow runs), so that a module's slow tests never order the fast lane, nor its measured run
    (about three times the CPU) the plain one."""
    lane = re.sub(r"\W+", "_", config.option.markexpr or "").strip("_")
    return f"{KEY}/{lane or 'all'}"


def module(nodeid: str) -> str:
    """The test file a test's node id names: the unit ``--dist loadscope`` hands out (and its classes with it)."""
    return nodeid.split("::", 1)[0]


def order_key(config: pytest.Config):
    """A sort key for collected items: the modules the last run timed longest first, each module's tests
    together and in their own order (the sort is stable)."""
    cache = getattr(config, "cache", None)
    kept = cache.get(cache_key(config), {}) if cache is not None else {}
    # A cache another version wrote, or edited by hand, is no time at all rather than a failed collection.
    seconds = {m: float(t) for m, t in kept.items() if isinstance(t, (int, float))} if isinstance(kept, dict) else {}
    return lambda item: -seconds.get(module(item.nodeid), 0.0)


class Timer:
    """Sums each module's test time (set-up, call and tear-down) from the reports the main process receives
    (from every worker under xdist), and keeps the sums in the cache at the end for the next run's order."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[module(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        cache = getattr(session.config, "cache", None)
        if cache is not None and self.seconds:
            # A narrowed run (one file, -k) times only what it ran: the other modules keep their last times.
            key = cache_key(session.config)
            kept = cache.get(key, {})
            cache.set(key, {**(kept if isinstance(kept, dict) else {}),
                            **{m: round(s, 2) for m, s in self.seconds.items()}})


def pytest_configure(config: pytest.Config) -> None:
    """Time the run in the main process only: a worker's reports reach it, and it alone writes the cache."""
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(Timer(), "tms_autopreload_schedule")
