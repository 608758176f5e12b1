"""``tools/mutants.py`` (``make mutants``) on a small tree of its own: a mutant its tests catch is killed,
one that changes nothing the tests can see survives, and the kill rate counts both."""

from __future__ import annotations

import subprocess
import sys

import pytest
import support

TOOL = support.ROOT / "tools" / "mutants.py"

SOURCE = "def double(x):\n    # twice x\n    return 2 * x\n"
TEST = ("import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\nimport pkg\n\n\n"
        "def test_double():\n    assert pkg.double(3) == 6\n")


def patch(why: str, old: str, new: str) -> str:
    return (f"# {why}\n# tests: tests/test_pkg.py\n--- a/pkg.py\n+++ b/pkg.py\n@@ -1,3 +1,3 @@\n def double(x):\n"
            + "".join(f"-{line}\n" for line in old.splitlines()) + "".join(f"+{line}\n" for line in new.splitlines()))


@pytest.mark.slow  # two pytest sessions
def test_a_caught_mutant_is_killed_and_a_no_op_survives(tmp_path):
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "pkg.py").write_text(SOURCE)
    (tree / "tests" / "test_pkg.py").write_text(TEST)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    (mutants / "01-adds.patch").write_text(
        patch("adds where it should multiply", "    # twice x\n    return 2 * x", "    # twice x\n    return 2 + x"))
    (mutants / "02-comment.patch").write_text(
        patch("a comment reworded", "    # twice x\n    return 2 * x", "    # two times x\n    return 2 * x"))
    r = subprocess.run([sys.executable, str(TOOL), "--root", str(tree), "--mutants", str(mutants), "-j", "2"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    outcomes = [line.split()[:2] for line in r.stdout.splitlines() if line.startswith(("killed", "survived"))]
    assert outcomes == [["killed", "01-adds"], ["survived", "02-comment"]], r.stdout
    assert r.stdout.splitlines()[-1].startswith("kill rate: 1/2 (50%); "), r.stdout
    assert (tree / "pkg.py").read_text() == SOURCE  # the tree itself is never patched


def test_every_mutant_applies_to_this_tree_and_names_tests_that_exist():
    """The mutants are data about this code: a change that moves the lines a mutant edits must bring the
    patch along (regenerate it with `git diff`), or `make mutants` measures nothing for it."""
    from support import ROOT

    for patch in sorted((ROOT / "tests" / "mutants").glob("*.patch")):
        r = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, (patch.name, r.stderr)
        named = [line.split(":", 1)[1].split() for line in patch.read_text().splitlines()
                 if line.startswith("# tests:")]
        assert named and all((ROOT / t).exists() for t in named[0]), (patch.name, named)
