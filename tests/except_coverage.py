"""Which ``except`` clauses of the package the fast lane takes, measured by coverage.py in every interpreter its
tests start, and each one it does not take named, but for the written list of those no test can reach.

Most of the package runs in interpreters the tests start from venvs holding the built wheel, with an
environment of their own (``env -i``) and often as another account: coverage.py's own subprocess measurement
(an environment variable read by a ``.pth`` of the venv coverage is installed in) reaches none of them. So a
measured run (``TMS_TEST_COVERAGE`` names its data directory) puts one more ``.pth`` file, :data:`PTH`, into
every venv that holds the package (tests/conftest.py: where the suite installs a wheel), sorted before the
package's own: it imports coverage.py from the test venv's site-packages without leaving that directory on
``sys.path``, starts it with this run's configuration, and saves the data before an ``os.exec*`` replaces the
process (coverage.py's own ``patch = execv`` would add a variable to the new environment, which the tests
judge) and before ``os._exit`` (``patch = _exit``). The package's ``.pth`` and start-up path are not changed;
a run without ``TMS_TEST_COVERAGE`` writes no such file.

``python tests/except_coverage.py setup DIR`` makes the data directory and its configuration; a run of the
lane under it (``make except-coverage``, and ``make test``'s fast lane) writes one data file per process;
``check DIR`` combines them, the installed package's paths mapped back to the source tree (``[paths]``), and
fails naming every handler no test reached that :data:`UNREACHABLE` does not list, and every listed one that
a test reached or that no longer exists. ``report DIR`` prints the same without failing (a narrowed run).
"""

from __future__ import annotations

import ast
import os
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "tms_autopreload"
VAR = "TMS_TEST_COVERAGE"
PTH = "00_tms_test_coverage.pth"
CONFIG = "coverage.ini"

# What a handler is called by: its module (under the package), its function and the exceptions it names,
# with ``#2`` and on where one function has several alike. Why each listed one cannot be reached here.
UNREACHABLE: dict[str, str] = {
    "environment.py:open_regular:OSError":
        "fstat of the descriptor open() has just returned: it fails only on a fault of the kernel or the file "
        "system (EIO), which no test can make without injecting faults as root",
    "builds.py:shown_path:ElfError":
        "a child's verbose line for the build it inherits, mapped: the loader has just read that file's dynamic "
        "section to map it at this start, so it reads again unless the file is replaced in between (a race)",
    "commands/doctor/deep.py:_end_group:ProcessLookupError":
        "the child is not reaped when its group is ended (its returncode is None), so the group holds at least "
        "its zombie, which kill() still signals; it is gone only where SIGCHLD is ignored (the kernel reaps) and "
        "the child ends in the instant between a timeout or an interrupt and the kill (a race)",
    "sitepath.py:site_dirs:OSError":
        "pyvenv.cfg is read by site.py before any .pth runs, and an unreadable one stops the interpreter there "
        "(Fatal Python error: init_import_site): it cannot be read here only if made unreadable after the start",
    "leftover.py:start_gone:Exception":
        "start_gone runs only as the .pth file's second line, compiled from text that tools/pthfile.py generates, "
        "which coverage.py cannot map back to this file: taken for real (the package broken under a .pth whose "
        "start module is gone) by tests/test_startup_files.py's fail-closed tests, not measurable here",
    "leftover.py:start_gone:Exception#2":
        "as start_gone's first handler: the fallback module broken too, taken by the same tests, never measurable",
    "startup.py:process_startup:Exception":
        "wherever the package is installed, process_startup runs as the start module's copy (tools/pthfile.py), "
        "which coverage.py cannot map back to this file: taken for real (a module of the package that raises "
        "under a hooked child) by tests/test_guarantees.py's test of that child; the package's own entry runs "
        "after the copy, which marked the process (it returns), or in an editable install (the slow lane)",
    "startup.py:_shown:ImportError":
        "a hooked child runs the start module's copy of this function (tools/pthfile.py), which coverage.py "
        "cannot map back to this file: taken for real (the package removed under a hooked parent, verbose) by "
        "tests/test_guarantees.py's test of that child; the package's own copy runs only where the package imports",
    "trust.py:Trusted._find:OSError":
        "each path is one the running interpreter started or imported from (its prefixes, its executable's "
        "directory, the folder torch_memory_saver was imported from), so each component could be examined "
        "then; it cannot be only if removed or made unsearchable while the process runs (a race)",
}
if sys.version_info < (3, 13):
    UNREACHABLE["sitepath.py:pth_paths:UnicodeDecodeError"] = (
        "read as UTF-8 first from CPython 3.13 on only: reached in-process by tests/test_fuzz.py's .pth "
        "differential where the suite's own interpreter is 3.13 or later, not on this one")

# The measured processes' configuration. coverage.py's warnings would reach the stderr the tests judge.
_CONFIG = """\
[run]
branch = true
parallel = true
data_file = {data}/.coverage
source_pkgs = tms_autopreload
patch = _exit, fork
disable_warnings = module-not-imported, module-not-measured, no-data-collected, already-imported, no-ctracer,
    couldnt-parse, include-ignored, no-sysmon

[paths]
package =
    {package}/
    */tms_autopreload/
"""

# The start of coverage.py in a measured process: the one line of :data:`PTH`, which site.py runs.
_START = """\
import os, sys
sys.path.insert(0, {site!r})
try:
    import coverage
    os.environ['COVERAGE_PROCESS_START'] = {config!r}
    try:
        cov = coverage.process_startup()
    finally:
        del os.environ['COVERAGE_PROCESS_START']
except Exception:
    cov = None  # coverage.py cannot start here (a working directory that is gone): this process is not measured
finally:
    sys.path.remove({site!r})
if cov is not None:
    def saving(replace):
        def saved_first(*args, **kw):
            cov.save()
            return replace(*args, **kw)
        return saved_first
    os.execv, os.execve = saving(os.execv), saving(os.execve)
"""


def setup(data: Path) -> Path:
    """Make ``data`` empty, writable by every account (the tests start processes as other users), with the
    run's configuration in it; return that configuration's path."""
    data.mkdir(parents=True, exist_ok=True)
    for old in data.iterdir():
        old.unlink()
    data.chmod(0o1777)
    config = data / CONFIG
    config.write_text(_CONFIG.format(data=data.resolve(), package=PACKAGE))
    return config


def measure(site: Path) -> None:
    """In a measured run, put :data:`PTH` into ``site`` (a site-packages directory holding the package)."""
    data = os.environ.get(VAR)
    if not data or not (site / "tms_autopreload.pth").exists():
        return
    import coverage

    start = _START.format(site=str(Path(coverage.__file__).parent.parent), config=str(Path(data) / CONFIG))
    (site / PTH).write_text(f"import sys; exec({start!r}, {{}})\n")


@dataclass(frozen=True)
class Handler:
    """One ``except`` clause: its file, the line it starts on, its handler's first statement, its key."""

    path: Path
    line: int
    body: int
    key: str


def handlers(package: Path = PACKAGE) -> list[Handler]:
    """Every ``except`` clause of the package's modules, in file and line order."""
    found: list[Handler] = []
    for path in sorted(package.rglob("*.py")):
        seen: dict[str, int] = {}
        for node, scope in _walk(ast.parse(path.read_text(), str(path)), ""):
            what = ast.unparse(node.type) if node.type is not None else "BaseException"
            key = f"{path.relative_to(package)}:{scope or '<module>'}:{what}"
            seen[key] = seen.get(key, 0) + 1
            found.append(Handler(path, node.lineno, node.body[0].lineno,
                                 key + (f"#{seen[key]}" if seen[key] > 1 else "")))
    return found


def _walk(node: ast.AST, scope: str):
    """(each ``except`` clause under ``node``, the dotted name of the function or class it is in), in order."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ExceptHandler):
            yield child, scope
        inner = scope
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}.{child.name}" if scope else child.name
        yield from _walk(child, inner)


def reached(data: Path) -> set[tuple[str, int]]:
    """(file, line) of every line an arc of the combined data of ``data`` ends on, the installed package's
    paths mapped to the source tree."""
    import coverage

    cov = coverage.Coverage(config_file=str(data / CONFIG), data_file=str(data / ".coverage"))
    cov.combine([str(data)], keep=True)
    got = cov.get_data()
    return {(f, end) for f in got.measured_files() for _start, end in (got.arcs(f) or ()) if end > 0}


def findings(data: Path) -> tuple[list[Handler], list[str]]:
    """The handlers no test reached and :data:`UNREACHABLE` does not list, and what is wrong with that list:
    a listed handler a test reached, or one that no longer exists."""
    done = reached(data)
    every = handlers()
    missed = [h for h in every if (str(h.path), h.body) not in done]
    stale = [f"{key}: reached by a test, so not unreachable" for key in sorted(UNREACHABLE)
             if key in {h.key for h in every if h not in missed}]
    stale += [f"{key}: no such handler" for key in sorted(set(UNREACHABLE) - {h.key for h in every})]
    return [h for h in missed if h.key not in UNREACHABLE], stale


def main(argv: list[str]) -> int:
    verb, data = argv[0], Path(argv[1]).resolve()
    if verb == "setup":
        print(setup(data))
        return 0
    missed, stale = findings(data)
    total = len(handlers())
    print(f"except clauses of the package: {total}; reached by the fast lane: "
          f"{total - len(missed) - len(UNREACHABLE) + len([s for s in stale if 'reached by' in s])}; "
          f"listed as unreachable: {len(UNREACHABLE)}")
    for h in missed:
        print(f"not reached: {h.key} ({h.path.relative_to(ROOT)}:{h.line})")
    for line in stale:
        print(f"the list of unreachable handlers: {line}")
    return 1 if verb == "check" and (missed or stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
