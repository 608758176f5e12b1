"""How many plausible bugs the suite catches: apply each mutant, run the tests that cover it, count.

A mutant is one small patch (``tests/mutants/NN-name.patch``, ``git apply`` format) that makes a bug a
person could make by hand in the decision core. Its first lines say what the bug is and which test files
cover it::

    # the wheel copy torch loads by path is ignored when ...
    # tests: tests/test_resolver.py tests/test_conda.py
    --- a/tms_autopreload/runtime.py
    ...

Each mutant is applied to a scratch copy of the tree (its tracked and untracked, not ignored files), and
its test files run there as the fast lane runs them (``-m "not slow"``, ``TMS_TEST_STRICT=1``), stopping at
the first failure: a failing run *kills* the mutant, a passing one lets it *survive*. ``--tests-from REV``
takes ``tests/`` from another revision (the suite as it was, against the package as it is); a test file
that revision lacks is left out. ``--tests`` runs the given tests for every mutant instead (the tests a
change adds, against the mutants an older suite let through). Before any mutant, the unchanged copy must
pass every test named, or no count means anything. ``make mutants`` runs it; it is slow (each mutant is a
pytest session that builds its scenarios), so it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KILLED, SURVIVED, ERROR = "killed", "survived", "error"
# pytest's exit codes: 0 all passed, 1 some failed, 2 a collection error (an import the mutant broke);
# 3 internal error, 4 usage error, 5 no tests: the run says nothing about the mutant.
_KILLING = (1, 2)


class Mutant:
    """One patch: its name (the file's stem), what bug it makes, the test files that cover it, its text."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = path.stem
        self.why = ""
        self.tests: list[str] = []
        for line in path.read_text().splitlines():
            if not line.startswith("#"):
                break
            key, sep, value = line[1:].strip().partition(":")
            if sep and key == "tests":
                self.tests = value.split()
            elif not self.why:
                self.why = line[1:].strip()
        if not self.tests:
            raise SystemExit(f"{path}: no '# tests: FILE ...' line before the patch")


def load(directory: Path, only: list[str]) -> list[Mutant]:
    mutants = [Mutant(p) for p in sorted(directory.glob("*.patch"))]
    if only:
        mutants = [m for m in mutants if any(o in m.name for o in only)]
    if not mutants:
        raise SystemExit(f"no mutants in {directory}" + (f" matching {' '.join(only)}" if only else ""))
    return mutants


def scratch_tree(root: Path, dest: Path, tests_from: str | None) -> None:
    """The files of ``root`` that git tracks or would track, copied to ``dest``; ``tests/`` from
    ``tests_from`` when given."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        src = root / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    if tests_from:
        shutil.rmtree(dest / "tests", ignore_errors=True)
        archive = subprocess.run(["git", "archive", tests_from, "tests"], cwd=root, check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)


def run_tests(tree: Path, tests: list[str], timeout: float) -> tuple[int | None, str]:
    """(pytest's exit code or None on timeout, the tail of its output) for ``tests`` in ``tree``."""
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-m", "not slow", "-p", "no:cacheprovider", *tests]
    env = {**os.environ, "TMS_TEST_STRICT": "1"}
    try:
        r = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"no answer within {timeout:.0f} s"
    return r.returncode, (r.stdout + r.stderr)[-2000:]


def present(tree: Path, tests: list[str]) -> list[str]:
    return [t for t in tests if (tree / t.partition("::")[0]).exists()]


def try_mutant(mutant: Mutant, base: Path, work: Path, timeout: float) -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one mutant in a copy of ``base`` made under ``work``."""
    tree = work / mutant.name
    shutil.copytree(base, tree, symlinks=True)
    started = time.monotonic()
    try:
        applied = subprocess.run(["git", "apply", str(mutant.path)], cwd=tree, capture_output=True, text=True)
        if applied.returncode != 0:
            return ERROR, 0.0, f"does not apply: {applied.stderr.strip()}"
        tests = present(tree, mutant.tests)
        if not tests:
            return ERROR, 0.0, "none of its test files exists in this tree"
        code, tail = run_tests(tree, tests, timeout)
        outcome = SURVIVED if code == 0 else KILLED if code in _KILLING else ERROR
        return outcome, time.monotonic() - started, "" if outcome != ERROR else f"pytest exit {code}: {tail}"
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the source tree (default: this checkout)")
    parser.add_argument("--mutants", type=Path, help="the directory of patches (default: ROOT/tests/mutants)")
    parser.add_argument("--tests-from", metavar="REV", help="take tests/ from this git revision")
    parser.add_argument("--only", nargs="*", default=[], help="only mutants whose name holds one of these")
    parser.add_argument("--tests", nargs="+", metavar="TEST",
                        help="run these (files or node ids) for every mutant instead of the files it names")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one test run may take")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    started = time.monotonic()
    mutants = load(args.mutants or root / "tests" / "mutants", args.only)
    if args.tests:
        for mutant in mutants:
            mutant.tests = args.tests
    with tempfile.TemporaryDirectory(prefix="tms-mutants-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        scratch_tree(root, base, args.tests_from)
        union = present(base, sorted({t for m in mutants for t in m.tests}))
        code, tail = run_tests(base, union, args.timeout)
        if code != 0:
            print(f"the unchanged tree does not pass {' '.join(union)} (pytest exit {code}); no mutant can be "
                  f"judged:\n{tail}", file=sys.stderr)
            return 2
        print(f"unchanged tree: {' '.join(union)} pass", flush=True)
        counts = {KILLED: 0, SURVIVED: 0, ERROR: 0}
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            results = pool.map(lambda m: (m, *try_mutant(m, base, Path(tmp), args.timeout)), mutants)
            for mutant, outcome, seconds, detail in results:
                counts[outcome] += 1
                print(f"{outcome:8} {mutant.name:45} {seconds:6.1f} s  {mutant.why}", flush=True)
                if detail:
                    print(f"         {detail}", flush=True)
    judged = counts[KILLED] + counts[SURVIVED]
    rate = f"{100 * counts[KILLED] / judged:.0f}%" if judged else "n/a"
    print(f"kill rate: {counts[KILLED]}/{judged} ({rate})" + (f"; {counts[ERROR]} not judged" if counts[ERROR] else "")
          + f"; {time.monotonic() - started:.0f} s in all")
    return 1 if counts[ERROR] else 0


if __name__ == "__main__":
    sys.exit(main())
