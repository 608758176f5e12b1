"""How many plausible bugs the suite catches: apply each mutant, run the tests that cover it, count.

A mutant is either generated or made by hand. ``--generated`` takes cosmic-ray's (the operators and each
module's test files: ``tools/generated_mutants.py``), as ``make mutants`` runs them. Without it, a mutant is
one small patch (``tests/mutants/NN-name.patch``, ``git apply`` format) that makes a bug a person could make
by hand and cosmic-ray cannot (a fix text, a dropped statement, another argument); its first lines say
what the bug is and which test files cover it (``make mutants-patches``)::

    # the wheel copy torch loads by path is ignored when ...
    # tests: tests/test_resolver.py tests/test_conda.py
    --- a/tms_autopreload/runtime.py
    ...

Each mutant is applied to a scratch copy of the tree (its tracked and untracked, not ignored files), and
its test files run there as the fast lane runs them (``-m "not slow"``, ``TMS_TEST_STRICT=1``), stopping at
the first failure: a failing run *kills* the mutant, a passing one lets it *survive*; ``--then-full`` runs
each survivor again with its files' slow tests too, as ``make test`` would. ``--tests-from REV``
takes ``tests/`` from another revision (the suite as it was, against the package as it is); a test file
that revision lacks is left out. ``--tests`` runs the given tests for every mutant instead (the tests a
change adds, against the mutants an older suite let through). Before any mutant, the unchanged copy must
pass every test named, or no count means anything. It is slow (each mutant is a pytest session that
builds its scenarios), so it is not part of ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generated_mutants import Generated, changed_lines, listed, selected

ROOT = Path(__file__).resolve().parent.parent
KILLED, SURVIVED, ERROR, NOT_RUN = "killed", "survived", "error", "not run"
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
        self.outcome = ""
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

    def apply(self, tree: Path, cosmic_ray: Path) -> str:
        """Make this bug in ``tree``; what went wrong, or ``""``."""
        r = subprocess.run(["git", "apply", str(self.path)], cwd=tree, capture_output=True, text=True)
        return "" if r.returncode == 0 else f"does not apply: {r.stderr.strip()}"


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


def run_tests(tree: Path, tests: list[str], timeout: float, lane: str = "check",
              workers: int = 0) -> tuple[int | None, str]:
    """(pytest's exit code or None on timeout, the tail of its output) for ``tests`` in ``tree``, as the
    lane runs them: ``check`` leaves out the tests marked slow, ``test`` runs them all. One process stopping
    at the first failure (a mutant's run), or ``workers`` of them running every test (the baseline).

    Each run keeps its worlds in a base temp of its own beside ``tree``, removed with it: pytest's default,
    numbered directories under /tmp, would make each run delete the worlds of runs before it (gigabytes),
    and the mutants judged at once would spend their time on that."""
    command = [sys.executable, "-m", "pytest", "-q", *(["-m", "not slow"] if lane == "check" else []),
               "-p", "no:cacheprovider", "--basetemp", str(basetemp(tree)),
               *(["-n", str(workers), "--dist", "loadscope"] if workers else ["-x"]), *tests]
    env = {**os.environ, "TMS_TEST_STRICT": "1"}
    with subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as child:
        RUNNING.add(child)
        try:
            out, _ = child.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            return None, f"no answer within {timeout:.0f} s"
        finally:
            RUNNING.discard(child)
    return child.returncode, out[-2000:]


# The test runs under way: SIGTERM or SIGINT ends them before this process unwinds, so that its scratch trees
# go too.
RUNNING: set[subprocess.Popen[str]] = set()


def _terminated(signum: int, frame: object) -> None:
    for child in list(RUNNING):
        child.terminate()
    raise KeyboardInterrupt


def present(tree: Path, tests: list[str]) -> list[str]:
    return [t for t in tests if (tree / t.partition("::")[0]).exists()]


def try_mutant(mutant: Mutant | Generated, base: Path, work: Path, options: argparse.Namespace,
               lane: str = "check") -> tuple[str, float, str]:
    """(outcome, seconds, detail) of one mutant in a copy of ``base`` made under ``work``."""
    tree = Path(tempfile.mkdtemp(prefix="mutant-", dir=work))
    shutil.copytree(base, tree, symlinks=True, dirs_exist_ok=True)
    started = time.monotonic()
    try:
        failed = mutant.apply(tree, options.cosmic_ray) or regenerate(tree)
        if failed:
            return ERROR, 0.0, failed
        tests = present(tree, mutant.tests)
        if not tests:
            return ERROR, 0.0, "none of its test files exists in this tree"
        code, tail = run_tests(tree, tests, options.timeout, lane)
        outcome = SURVIVED if code == 0 else KILLED if code in _KILLING else ERROR
        return outcome, time.monotonic() - started, "" if outcome != ERROR else f"pytest exit {code}: {tail}"
    finally:
        shutil.rmtree(tree, ignore_errors=True)
        shutil.rmtree(basetemp(tree), ignore_errors=True)



def regenerate(tree: Path) -> str:
    """The start-up files written again from ``tree``'s package (tools/pthfile.py), as its author would after the
    change: the start module and the fallback hold copies of the package's rules, and a wheel built from the tree
    ships them (setup.py); what went wrong, or ``""``. A tree without the generator has nothing to write."""
    if not (tree / "tools" / "pthfile.py").exists():
        return ""
    r = subprocess.run([sys.executable, "tools/pthfile.py"], cwd=tree, capture_output=True, text=True)
    return "" if r.returncode == 0 else f"tools/pthfile.py failed on the mutant: {r.stderr.strip()[-500:]}"

def basetemp(tree: Path) -> Path:
    """Where the tests run in ``tree`` keep their temporary files: beside it, not in it, so that nothing a
    test copies of the tree carries them."""
    return tree.with_name(tree.name + "-tmp")


def options(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the source tree (default: this checkout)")
    parser.add_argument("--mutants", type=Path, help="the directory of patches (default: ROOT/tests/mutants)")
    parser.add_argument("--tests-from", metavar="REV", help="take tests/ from this git revision")
    parser.add_argument("--only", nargs="*", default=[], help="only mutants whose name holds one of these")
    parser.add_argument("--tests", nargs="+", metavar="TEST",
                        help="run these (files or node ids) for every mutant instead of the files it names")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds one test run may take")
    generated = parser.add_argument_group("generated mutants (cosmic-ray's, tools/generated_mutants.py)")
    generated.add_argument("--generated", action="store_true", help="cosmic-ray's mutants instead of the patches")
    generated.add_argument("--cosmic-ray", type=Path, default=ROOT / ".venv-mutants" / "bin" / "cosmic-ray",
                           help="the cosmic-ray program (default: .venv-mutants's, which `make mutants` makes)")
    generated.add_argument("--sample", type=int, metavar="N", help="N of them, in an order fixed by --seed")
    generated.add_argument("--seed", type=int, default=0, help="the sample's seed (default 0)")
    generated.add_argument("--since", metavar="REV", help="only those on lines changed since this revision")
    generated.add_argument("--shard", metavar="K/N", help="only the K-th of N shards (every N-th, from the K-th)")
    parser.add_argument("--budget", type=float, metavar="MINUTES",
                        help="start no test run after this many minutes (--then-full's too); those left are "
                             "counted as not run")
    parser.add_argument("--lane", choices=("check", "test"), default="check",
                        help="run each mutant's tests as `make check` runs them (the default: no slow tests) or as "
                             "`make test` does (all of them)")
    parser.add_argument("--then-full", action="store_true",
                        help="run each survivor again with all its tests, as `make test` runs them (slow ones too)")
    parser.add_argument("--report", type=Path, metavar="FILE", help="write each outcome as a JSON line here")
    args = parser.parse_args(argv)
    generated_only = [o for o, given in (("--sample", args.sample is not None), ("--since", args.since),
                                         ("--shard", args.shard)) if given]
    if generated_only and not args.generated:
        parser.error(f"{', '.join(generated_only)} select among generated mutants: add --generated")
    if args.then_full and args.lane == "test":
        parser.error("--then-full runs the fast lane's survivors in make test's lane; with --lane test there are none")
    if args.shard:
        k, _, n = args.shard.partition("/")
        if not (k.isdigit() and n.isdigit() and 1 <= int(k) <= int(n)):
            parser.error(f"--shard {args.shard}: give K/N with 1 <= K <= N, such as 2/8")
        args.shard = (int(k), int(n))
    if args.generated and not args.cosmic_ray.exists():
        parser.error(f"{args.cosmic_ray} does not exist: `make mutants` installs cosmic-ray there "
                     "(tests/mutants-requirements.txt), or pass --cosmic-ray PATH")
    return args


def chosen(args: argparse.Namespace, base: Path, work: Path) -> list[Mutant | Generated]:
    """The mutants this run tries: the patches, or cosmic-ray's as the options select them."""
    if not args.generated:
        found: list[Mutant | Generated] = list(load(args.mutants or args.root / "tests" / "mutants", args.only))
    else:
        since = changed_lines(args.root, args.since) if args.since else None
        every = listed(base, args.cosmic_ray, work)
        found = list(selected([g for g in every if not args.only or any(o in g.name for o in args.only)],
                              sample=args.sample, seed=args.seed, since=since, shard=args.shard))
        print(f"cosmic-ray: {len(every)} mutants of the kept operators; this run tries {len(found)}", flush=True)
        if not found:
            raise SystemExit("no generated mutant matches" + (f" {' '.join(args.only)}" if args.only else "")
                             + (" on the lines changed since " + args.since if args.since else "")
                             + ": names are module:line:operator#occurrence, and lines move as the code changes")
    if args.tests:
        for mutant in found:
            mutant.tests = args.tests
    return found


def main(argv: list[str] | None = None) -> int:
    args = options(argv)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _terminated)
    args.root, args.cosmic_ray = args.root.resolve(), args.cosmic_ray.absolute()
    started = time.monotonic()
    deadline = started + 60 * args.budget if args.budget else None
    with tempfile.TemporaryDirectory(prefix="tms-mutants-") as tmp:
        base = Path(tmp) / "base"
        base.mkdir()
        scratch_tree(args.root, base, args.tests_from)
        mutants = chosen(args, base, Path(tmp))

        def baseline(some: Sequence[Mutant | Generated], lane: str) -> bool:
            """Whether the unchanged copy passes every test file of ``some`` in ``lane``: else no count means
            anything."""
            union = present(base, sorted({t for m in some for t in m.tests}))
            code, tail = run_tests(base, union, args.timeout * 4, lane, workers=max(1, args.jobs))
            if code != 0:
                print(f"the unchanged tree does not pass {' '.join(union)} as `make {lane}` runs them (pytest exit "
                      f"{code}); no mutant can be judged:\n{tail}", file=sys.stderr)
                return False
            print(f"unchanged tree, as `make {lane}` runs them: {' '.join(union)} pass", flush=True)
            return True

        if not baseline(mutants, args.lane):
            return 2

        def judge(mutant: Mutant | Generated, lane: str = args.lane) -> tuple[str, float, str]:
            if deadline and time.monotonic() > deadline:
                return NOT_RUN, 0.0, ""
            return try_mutant(mutant, base, Path(tmp), args, lane)

        report = args.report.open("w") if args.report else None
        try:
            counts = judge_all(mutants, judge, args.jobs, args.lane, report)
            judged = counts[KILLED] + counts[SURVIVED]
            print(f"kill rate: {rate(counts[KILLED], judged)}"
                  + (f"; {counts[ERROR]} not judged" if counts[ERROR] else "")
                  + (f"; {counts[NOT_RUN]} not run within the budget" if counts[NOT_RUN] else "")
                  + f"; {time.monotonic() - started:.0f} s in all", flush=True)
            survivors = [m for m in mutants if m.outcome == SURVIVED]
            if args.then_full and survivors:
                if deadline and time.monotonic() > deadline:
                    print(f"make test on the survivors: none run, {len(survivors)} not run within the budget")
                    return 1 if counts[ERROR] else 0
                if not baseline(survivors, "test"):
                    return 2
                full = judge_all(survivors, lambda m: judge(m, "test"), args.jobs, "test", report)
                counts[ERROR] += full[ERROR]
                print(f"make test on the survivors: {rate(full[KILLED], full[KILLED] + full[SURVIVED])} more killed"
                      + (f"; {full[ERROR]} not judged" if full[ERROR] else "")
                      + (f"; {full[NOT_RUN]} not run within the budget" if full[NOT_RUN] else "")
                      + f"; {time.monotonic() - started:.0f} s in all")
        finally:
            if report:
                report.close()
    return 1 if counts[ERROR] else 0


def judge_all(mutants: Sequence[Mutant | Generated], judge: Callable[[Mutant | Generated], tuple[str, float, str]],
              jobs: int, lane: str, report: IO[str] | None) -> dict[str, int]:
    """Judge each mutant (``jobs`` at once), print each outcome as it comes, write it to ``report``; the counts.
    Each mutant keeps its last outcome (``.outcome``)."""
    counts = {KILLED: 0, SURVIVED: 0, ERROR: 0, NOT_RUN: 0}
    pool = ThreadPoolExecutor(max(1, jobs))
    try:
        for mutant, (outcome, seconds, detail) in zip(mutants, pool.map(judge, mutants), strict=True):
            counts[outcome] += 1
            mutant.outcome = outcome
            if outcome != NOT_RUN:
                print(f"{outcome:8} {mutant.name:45} {seconds:6.1f} s  {lane}: {mutant.why}", flush=True)
            if detail:
                print(f"         {detail}", flush=True)
            if report:
                report.write(json.dumps({"name": mutant.name, "lane": lane, "outcome": outcome,
                                         "seconds": round(seconds, 1), "detail": detail}) + "\n")
    finally:
        pool.shutdown(cancel_futures=True)  # interrupted: start no other mutant
    return counts


def rate(killed: int, judged: int) -> str:
    return f"{killed}/{judged} ({100 * killed / judged:.0f}%)" if judged else f"{killed}/0 (n/a)"


if __name__ == "__main__":
    sys.exit(main())
