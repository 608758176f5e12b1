"""The mutants a maintained tool generates: cosmic-ray's operators over the package, each given its tests.

cosmic-ray (pinned in ``tests/mutants-requirements.txt``, in a venv of its own, ``.venv-mutants``: its
aiohttp and SQLAlchemy have no place in the test venv) rewrites the module on disk, which is what this
suite needs: each test session builds the wheel from a copy of the tree and runs the package in
interpreters of venvs that hold that wheel, so a mutation must be in the files before that build.
(mutmut 3.8 turns each function into a trampoline that imports mutmut when it runs, and measures coverage
inside its own process: neither reaches an interpreter started from a venv holding the built wheel.)

``cosmic-ray init`` lists every mutation of the package and ``cosmic-ray dump`` prints the list; this module
keeps the operators :data:`KEPT` allows, gives each mutation the test files of its module's group
(:data:`GROUPS`), and selects what one run tries: all of them, a fixed-seed sample, those on lines changed
since a revision, or one shard of N. ``cosmic-ray apply`` makes one of them in a scratch copy.
"""

from __future__ import annotations

import json
import random
import re
import subprocess
from fnmatch import fnmatch
from pathlib import Path

PACKAGE = "tms_autopreload"

# Each module of the package, by the first group whose patterns match it, and the test files that cover
# that group, cheapest first (a run stops at the first failure). A module no group names is an error.
GROUPS: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("aliases", ("__main__.py", "cli.py"), ("tests/test_cli.py", "tests/test_calls.py")),
    ("loader", ("elf.py", "symbols.py", "ldcache.py", "glibc_hwcaps.py", "ldso.py", "trace.py"),
     ("tests/test_ldso.py", "tests/test_runpath_model.py", "tests/test_symbols.py", "tests/test_ldso_property.py",
      "tests/test_fuzz.py", "tests/test_mutant_kinds.py", "tests/test_resolver.py", "tests/test_edges.py")),
    ("decision", ("decision.py", "no_plan.py", "attempt.py", "verdict.py", "runtime.py", "builds.py",
                  "gpu_libraries.py", "releases.py", "reinstall.py", "wheels.py", "install_source.py", "errors.py",
                  "installer.py"),
     ("tests/test_plan_steps.py", "tests/test_install_commands.py", "tests/test_mutant_kinds.py",
      "tests/test_conda.py", "tests/test_forced_path.py", "tests/test_second_runtime.py", "tests/test_misuse.py",
      "tests/test_inputs.py", "tests/test_cli.py", "tests/test_resolver.py", "tests/test_words.py",
      "tests/test_edges.py", "tests/test_outcomes.py")),
    ("start", ("__init__.py", "environment.py", "startup.py", "stopped.py", "trust.py", "sitepath.py", "leftover.py",
               "subprocesses.py", "inprocess.py"),
     ("tests/test_sitepath.py", "tests/test_startup_files.py", "tests/test_inputs.py", "tests/test_misuse.py",
      "tests/test_fuzz.py", "tests/test_guarantees.py", "tests/test_hook.py", "tests/test_words.py",
      "tests/test_way_out.py", "tests/test_launchers.py", "tests/test_inprocess.py", "tests/test_edges.py",
      "tests/test_outcomes.py")),
    ("commands", ("commands/*.py", "commands/doctor/*.py"),
     ("tests/test_cli.py", "tests/test_words_nodes.py", "tests/test_caller.py", "tests/test_forced_path.py",
      "tests/test_misuse.py", "tests/test_words.py", "tests/test_way_out.py", "tests/test_troubleshooting.py",
      "tests/test_driver.py", "tests/test_edges.py", "tests/test_calls.py", "tests/test_docs.py",
      "tests/test_preflight.py", "tests/test_outcomes.py")),
)

# The operators kept, by cosmic-ray's names. Left out, as the upstream guide suggests for a first scope:
# NumberReplacer and the ReplaceBinaryOperator family (this code computes little: they mostly change
# constants and string concatenation into type errors), the USub family of ReplaceUnaryOperator (numbers
# again), and comparison swaps other than a negation or a boundary (``==`` to ``<``, or a value compared
# with ``is``: type errors or, on interned strings and small ints, the same program).
KEPT = re.compile(r"core/(AddNot|ExceptionReplacer|RemoveDecorator|ReplaceAndWithOr|ReplaceOrWithAnd"
                  r"|ReplaceBreakWithContinue|ReplaceContinueWithBreak|ReplaceTrueWithFalse|ReplaceFalseWithTrue"
                  r"|ZeroIterationForLoop|ReplaceUnaryOperator_Delete_Not"
                  r"|ReplaceComparisonOperator_(Eq_NotEq|NotEq_Eq|Is_IsNot|IsNot_Is|Lt_LtE|LtE_Lt|Gt_GtE|GtE_Gt))$")

CONFIG = """[cosmic-ray]
module-path = {modules}
timeout = 3600.0
excluded-modules = []
test-command = "false"

[cosmic-ray.distributor]
name = "local"
"""


class Generated:
    """One mutation cosmic-ray makes: the module, the operator and its occurrence there, the line it changes,
    and the test files of the module's group."""

    def __init__(self, module: str, operator: str, occurrence: int, line: int, tests: list[str]) -> None:
        self.module, self.operator, self.occurrence, self.line = module, operator, occurrence, line
        self.tests = tests
        self.outcome = ""
        self.name = f"{module}:{line}:{operator.removeprefix('core/')}#{occurrence}"
        self.why = f"cosmic-ray {operator} (occurrence {occurrence}) at {module} line {line}"

    def apply(self, tree: Path, cosmic_ray: Path) -> str:
        """Make this mutation in ``tree``; what went wrong, or ``""``."""
        r = subprocess.run([str(cosmic_ray), "apply", self.module, self.operator, str(self.occurrence)],
                           cwd=tree, capture_output=True, text=True)
        return "" if r.returncode == 0 else f"cosmic-ray apply failed: {(r.stdout + r.stderr).strip()[-500:]}"


def tests_for(module: str) -> list[str]:
    """The test files of the first group whose patterns match ``module`` (a path under the package)."""
    inside = module.removeprefix(PACKAGE + "/")
    for _name, patterns, tests in GROUPS:
        if any(fnmatch(inside, p) and ("/" in p) == ("/" in inside) for p in patterns):
            return list(tests)
    raise SystemExit(f"{module}: no group of tools/generated_mutants.py names it; add it to GROUPS")


def listed(tree: Path, cosmic_ray: Path, work: Path) -> list[Generated]:
    """Every mutation cosmic-ray makes of the package in ``tree`` that :data:`KEPT` allows, in a stable order."""
    config, db = work / "cosmic-ray.toml", work / "session.sqlite"
    config.write_text(CONFIG.format(modules=json.dumps(PACKAGE)))
    subprocess.run([str(cosmic_ray), "init", str(config), str(db)], cwd=tree, check=True, capture_output=True)
    dump = subprocess.run([str(cosmic_ray), "dump", str(db)], cwd=tree, check=True, capture_output=True,
                          text=True).stdout
    found = []
    for line in dump.splitlines():
        item, _result = json.loads(line)
        for m in item["mutations"]:
            if KEPT.match(m["operator_name"]):
                found.append(Generated(m["module_path"], m["operator_name"], m["occurrence"], m["start_pos"][0],
                                       tests_for(m["module_path"])))
    return sorted(found, key=lambda g: (g.module, g.operator, g.occurrence))


def changed_lines(root: Path, revision: str) -> dict[str, set[int]]:
    """The lines of each package file that differ from ``revision`` (added or changed, as they are now)."""
    diff = subprocess.run(["git", "diff", "-U0", revision, "--", PACKAGE], cwd=root, check=True,
                          capture_output=True, text=True).stdout
    lines: dict[str, set[int]] = {}
    current = ""
    for text in diff.splitlines():
        if text.startswith("+++ "):
            current = text[6:] if text.startswith("+++ b/") else ""
        elif text.startswith("@@") and current:
            hunk = re.match(r"@@ -\S+ \+(\d+)(?:,(\d+))? @@", text)
            if hunk:
                start, count = int(hunk[1]), int(hunk[2] or 1)
                lines.setdefault(current, set()).update(range(start, start + count))
    return lines


def selected(mutants: list[Generated], *, sample: int | None = None, seed: int = 0,
             since: dict[str, set[int]] | None = None, shard: tuple[int, int] | None = None) -> list[Generated]:
    """What one run tries: those on changed lines (``since``), then one shard ``(k, n)`` (every n-th from the
    k-th, 1-based), then ``sample`` of them in an order fixed by ``seed``."""
    if since is not None:
        mutants = [m for m in mutants if m.line in since.get(m.module, ())]
    if shard is not None:
        k, n = shard
        mutants = mutants[k - 1::n]
    if sample is not None:
        mutants = random.Random(seed).sample(mutants, min(sample, len(mutants)))
    return mutants
