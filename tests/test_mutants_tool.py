"""``tools/mutants.py`` (``make mutants``, ``make mutants-patches``) on a small tree of its own: a mutant its
tests catch is killed, one that changes nothing the tests can see survives, and the kill rate counts both."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

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


@pytest.mark.drift
def test_every_mutant_applies_to_this_tree_and_names_tests_that_exist():
    """The mutants are data about this code: a change that moves the lines a mutant edits must bring the
    patch along (regenerate it with `git diff`), or `make mutants-patches` measures nothing for it."""
    from support import ROOT

    for patch in sorted((ROOT / "tests" / "mutants").glob("*.patch")):
        r = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
        assert r.returncode == 0, (patch.name, r.stderr)
        named = [line.split(":", 1)[1].split() for line in patch.read_text().splitlines()
                 if line.startswith("# tests:")]
        assert named and all((ROOT / t).exists() for t in named[0]), (patch.name, named)


# ---------------------------------------------------------------- generated mutants (cosmic-ray)

TINY = ("def double(x):\n    if x == 0:\n        return 0\n    return 2 * x\n\n\n"
        "def quiet(flag):\n    return not flag\n")
TINY_TEST = ("import pathlib, sys\nsys.path.insert(0, str(pathlib.Path(__file__).parent.parent))\n"
             "from tms_autopreload import cli\n\n\ndef test_double():\n    assert cli.double(3) == 6\n")


def cosmic_ray() -> Path:
    """cosmic-ray as `make mutants` installs it (tests/mutants-requirements.txt), in a venv kept in the cache."""
    from support import CACHE, cache_lock

    requirements = support.ROOT / "tests" / "mutants-requirements.txt"
    venv = CACHE / "venvs" / ("cosmic-ray-" + hashlib.sha1(requirements.read_bytes()).hexdigest()[:10])
    with cache_lock(f"venv-{venv.name}"):
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            "-r", str(requirements)], check=True)
            (venv / ".complete").touch()
    return venv / "bin" / "cosmic-ray"


@pytest.mark.slow  # a venv for cosmic-ray, and a pytest session per mutant
def test_generated_mutants_are_made_by_cosmic_ray_and_judged_by_their_modules_tests(tmp_path):
    """cosmic-ray's kept operators over a package of one module: the two mutations its test sees are killed,
    the one it cannot see survives, the counts say so, and the tree itself is never changed."""
    tree = tmp_path / "tree"
    (tree / "tms_autopreload").mkdir(parents=True)
    (tree / "tests").mkdir()
    (tree / "tms_autopreload" / "cli.py").write_text(TINY)  # cli.py: its group's tests are tests/test_cli.py
    (tree / "tests" / "test_cli.py").write_text(TINY_TEST)
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    r = subprocess.run([sys.executable, str(TOOL), "--generated", "--root", str(tree), "--cosmic-ray",
                        str(cosmic_ray()), "-j", "2", "--report", str(tmp_path / "report.jsonl")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (r.stdout, r.stderr)
    outcomes = sorted(tuple(line.split()[:2]) for line in r.stdout.splitlines()
                      if line.startswith(("killed", "survived")))
    assert outcomes == [("killed", "tms_autopreload/cli.py:2:AddNot#0"),
                        ("killed", "tms_autopreload/cli.py:2:ReplaceComparisonOperator_Eq_NotEq#0"),
                        ("survived", "tms_autopreload/cli.py:8:ReplaceUnaryOperator_Delete_Not#0")], r.stdout
    assert "cosmic-ray: 3 mutants of the kept operators; this run tries 3" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1].startswith("kill rate: 2/3 (67%); "), r.stdout
    report = [json.loads(line) for line in (tmp_path / "report.jsonl").read_text().splitlines()]
    assert sorted(e["outcome"] for e in report) == ["killed", "killed", "survived"], report
    assert (tree / "tms_autopreload" / "cli.py").read_text() == TINY


def test_every_module_of_the_package_has_a_group_whose_tests_exist():
    """A new module must be given its tests in tools/generated_mutants.py, or `make mutants` stops on it."""
    from generated_mutants import tests_for

    for module in sorted(support.ROOT.glob("tms_autopreload/**/*.py")):
        tests = tests_for(str(module.relative_to(support.ROOT)))
        assert tests and all((support.ROOT / t).exists() for t in tests), (module, tests)


def test_a_run_selects_by_changed_lines_shard_and_seeded_sample(tmp_path):
    """--since keeps the mutants on lines changed since a revision, --shard K/N every N-th from the K-th, and
    --sample the same N for the same seed."""
    from generated_mutants import Generated, changed_lines, selected

    repo = tmp_path / "repo"
    (repo / "tms_autopreload").mkdir(parents=True)
    source = repo / "tms_autopreload" / "m.py"
    source.write_text("a = 1\nb = 2\nc = 3\nd = 4\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    source.write_text("a = 1\nb = 20\nc = 3\nd = 40\ne = 5\n")
    assert changed_lines(repo, "HEAD") == {"tms_autopreload/m.py": {2, 4, 5}}

    mutants = [Generated("tms_autopreload/m.py", "core/AddNot", i, line, ["t"]) for i, line in enumerate(range(1, 7))]
    since = selected(mutants, since=changed_lines(repo, "HEAD"))
    assert [m.line for m in since] == [2, 4, 5]
    assert [m.line for m in selected(mutants, shard=(2, 3))] == [2, 5]
    assert [m.line for m in selected(mutants, shard=(3, 3))] == [3, 6]
    one, two = selected(mutants, sample=3, seed=7), selected(mutants, sample=3, seed=7)
    assert [m.name for m in one] == [m.name for m in two] and len(one) == 3


def test_the_options_refuse_a_bad_shard_and_a_missing_cosmic_ray(tmp_path):
    missing = str(tmp_path / "none")
    for argv, words in ((["--generated", "--shard", "4/3"], "--shard 4/3: give K/N with 1 <= K <= N"),
                        (["--generated", "--cosmic-ray", missing], "`make mutants` installs cosmic-ray")):
        r = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and words in r.stderr, r.stderr


def test_options_that_need_generated_mutants_or_a_fast_lane_say_so():
    for argv, words in ((["--since", "main"], "--since select among generated mutants: add --generated"),
                        (["--shard", "1/2", "--sample", "3"], "--sample, --shard select among generated mutants"),
                        (["--then-full", "--lane", "test"], "with --lane test there are none")):
        r = subprocess.run([sys.executable, str(TOOL), *argv], capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and words in r.stderr, (argv, r.stderr)


@pytest.mark.slow  # a pytest session, interrupted
def test_a_terminated_run_ends_its_tests_and_leaves_no_scratch_tree(tmp_path):
    """SIGTERM while a mutant's tests run: they are ended, no other mutant starts, and the scratch copies (one
    of them mutated) are gone, within seconds."""
    tree = tmp_path / "tree"
    (tree / "tests").mkdir(parents=True)
    (tree / "pkg.py").write_text(SOURCE)
    (tree / "tests" / "test_pkg.py").write_text(TEST + "\n\ndef test_slow_in_a_mutant():\n"
                                                "    if 'mutant-' in __file__:\n        import time\n"
                                                "        time.sleep(300)\n")
    subprocess.run(["git", "init", "-q", str(tree)], check=True)
    mutants = tmp_path / "mutants"
    mutants.mkdir()
    for n in (1, 2):
        (mutants / f"0{n}-comment.patch").write_text(
            patch("a comment reworded", "    # twice x\n    return 2 * x", f"    # {n} times x\n    return 2 * x"))
    temp = tmp_path / "temp"
    temp.mkdir()
    p = subprocess.Popen([sys.executable, str(TOOL), "--root", str(tree), "--mutants", str(mutants)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**support.clean_env(), "TMPDIR": str(temp)})
    try:
        assert p.stdout is not None
        assert p.stdout.readline().startswith("unchanged tree"), p.stderr
        deadline = time.monotonic() + 60
        while not list(temp.glob("tms-mutants-*/mutant-*")):
            assert time.monotonic() < deadline and p.poll() is None
            time.sleep(0.1)
        time.sleep(2)  # its pytest has started
        p.terminate()
        out, err = p.communicate(timeout=30)
        assert p.returncode != 0 and "killed" not in out and "survived" not in out, (out, err)
        assert list(temp.glob("tms-mutants-*")) == []  # (the inner pytest keeps its own base in TMPDIR)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
