"""ruff and mypy run on every `make check` and `make test`, at the versions tests/requirements.txt pins."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _prerequisites(target: str) -> list[str]:
    """The prerequisites of ``target`` in the Makefile (its ``target: ...`` line)."""
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(f"{target}:"):
            return line.partition(":")[2].split()
    raise AssertionError(f"the Makefile has no {target} target")


def _recipe(target: str) -> list[str]:
    """The commands of ``target``'s recipe (its tab-indented lines)."""
    lines = (ROOT / "Makefile").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe


@pytest.mark.parametrize("target", ["check", "test"])
def test_the_make_targets_lint_first(target):
    assert "lint" in _prerequisites(target)


def test_lint_runs_ruff_and_mypy_from_the_test_venv():
    assert "$(VENV)/.ready" in _prerequisites("lint")
    recipe = " ".join(_recipe("lint"))
    assert "$(VENV)/bin/ruff check ." in recipe and "$(VENV)/bin/mypy" in recipe


@pytest.mark.parametrize("tool", ["ruff", "mypy", "check-jsonschema", "zizmor", "twine", "check-wheel-contents",
                                  "setuptools"])
def test_the_tools_are_pinned(tool):
    """Pinned, with a pin of its own for CPython 3.10 where the newest release has left 3.10 behind."""
    pins = (ROOT / "tests" / "requirements.txt").read_text().splitlines()
    lines = [line for line in pins if line.startswith(f"{tool}==")]
    assert lines and all(re.fullmatch(rf'{tool}==\d+(\.\d+)+(; python_version [<>]=? "3\.\d+")?', line)
                         for line in lines), pins
    assert len(lines) in (1, 2) and (len(lines) == 1) == ("; " not in lines[0]), lines


def test_the_development_guide_says_how_to_run_them():
    text = (ROOT / "docs" / "development.md").read_text()
    assert "`make lint`" in text and "ruff" in text and "mypy" in text
