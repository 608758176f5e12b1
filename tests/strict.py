"""``TMS_TEST_STRICT=1``: a green run means every scenario ran on this machine and passed.

Set by ``make test`` and so by CI, it turns every outcome that is not a real pass into a failure:
skips (at set-up, in the test, or of a whole module at collection), expected failures (``xfail``)
and unexpected passes (XPASS). The one exception is a test marked ``@pytest.mark.may_skip("why")``:
its own skip stays a skip, shown with both reasons (the test's and the marker's), e.g. a check that
needs a GPU on a machine without one.

A pytest plugin of its own (``tests/conftest.py`` registers its hooks; ``tests/test_strict.py`` loads
it with ``-p strict`` into a pytest run of made-up test files) so that its effect on pytest's exit
status is tested, not only on the summary line. The lanes run on pytest-xdist's workers: the hooks run in
each worker, and the reports they change travel to the main process, whose exit status counts them
(``tests/test_strict.py`` runs each case both ways).
"""

from __future__ import annotations

import os

import pytest

STRICT = os.environ.get("TMS_TEST_STRICT") == "1"


def pytest_configure(config):
    config.addinivalue_line("markers", "may_skip(reason): this test's skip is allowed under TMS_TEST_STRICT=1, "
                                       "for the reason given")


def _strict_failure(report, what: str) -> None:
    """Make ``report`` a failure that pytest counts.

    pytest's exit status counts a failed report only when it has no ``wasxfail`` (its
    ``Session.pytest_runtest_logreport``): a report left with that attribute is shown as failed but
    exits 0. So the xfail reason moves into the message and the attribute goes.
    """
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
    if hasattr(report, "wasxfail"):
        reason = f"{reason or ''} (xfail: {report.wasxfail})".strip()
        del report.wasxfail
    report.outcome = "failed"
    report.longrepr = f"{what} under TMS_TEST_STRICT=1 (every scenario must run and pass in CI): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not STRICT:
        return
    if report.skipped and hasattr(report, "wasxfail"):
        _strict_failure(report, "expected failure (xfail)")
    elif report.passed and hasattr(report, "wasxfail"):
        _strict_failure(report, "unexpected pass (XPASS)")
    elif report.skipped:
        allowed = item.get_closest_marker("may_skip")
        if allowed is None or not allowed.args:
            _strict_failure(report, "skipped")
        else:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            report.longrepr = (*report.longrepr[:2], f"{reason} (allowed: {allowed.args[0]})") \
                if isinstance(report.longrepr, tuple) else report.longrepr


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module or class skipped while being collected (``pytest.skip(allow_module_level=True)``,
    ``importorskip``) never reaches the per-test hook above."""
    outcome = yield
    report = outcome.get_result()
    if STRICT and report.skipped:
        _strict_failure(report, "skipped at collection")
