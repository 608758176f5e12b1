"""How the package starts on each CPython: one ``.pth`` import line, and no PEP 829 ``.start`` file.

On CPython 3.15 a ``tms_autopreload.start`` beside the ``.pth`` makes site.py import ``pkgutil`` (with
``importlib.util``, ``weakref``) to resolve its entry point, and then this package, in every
interpreter of the environment, flag or not: each start took 1.7-1.8x as long (tools/bench.py,
docs/performance.md). PEP 829 keeps running ``.pth`` import lines that have no matching ``.start``
through 3.17 and ignores them from 3.18, so the wheel ships the ``.pth`` alone, and the tests below
fail on the first interpreter where that stops being enough. What 3.18 needs, and what pip's wheel-tag
order allows for it, is the last test here.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DEFAULT_PYTHON, ROOTFS_PYTHONS, need, report_host
from conftest import python_version as version
from rootfs import RootfsVenv
from basics import pip_env
from support import BELOW_FLOOR, MAPPED, REEXECD, WAY_OUT, Venv, clean_env, execs, locate_python, run, uv
from words import SYSTEM_PATH, normalise, places_of, transcript

PYTHONS = ["3.10", "3.11", "3.12", "3.13", *ROOTFS_PYTHONS]
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
MODULES = "import json, sys; print(json.dumps(sorted(sys.modules)))"
HOOKED = REEXECD + MAPPED + "import json, os; print(json.dumps([reexecd(), mapped('torch_memory_saver')]))"


@pytest.fixture(scope="module")
def bare(rootfs, tmp_path_factory):
    """Factory: a venv of the same interpreter with nothing installed."""
    made: dict[str, Venv] = {}

    def make(python: str) -> Venv:
        if python not in made:
            suite, _, ver = python.rpartition("/")
            path = tmp_path_factory.mktemp("bare") / "venv"
            if suite:
                fs = rootfs(suite)
                made[python] = need(RootfsVenv, fs, path, need(fs.python, ver))
            else:
                made[python] = need(Venv, path, need(locate_python, ver))
        return made[python]

    return make


@pytest.mark.parametrize("python", PYTHONS)
def test_import_lines_run_where_no_start_file_is_installed(scenario, tmp_path, python):
    """Fails on any interpreter that ignores ``.pth`` import lines while the wheel installs no ``.start``:
    there a flagged start would silently not be hooked."""
    scn = report_host(scenario, python)
    assert not (scn.site / "tms_autopreload.start").exists()
    marker = tmp_path / "import-line-ran"
    probe = scn.site / "aa_tms_test_import_line.pth"
    probe.write_text(f"import os; open({str(marker)!r}, 'w').close()\n")
    try:
        r = scn.run(["-c", "pass"])
    finally:
        probe.unlink()
    assert r.returncode == 0, r.stderr
    assert marker.exists(), (
        f"CPython {python} ignores import lines in .pth files (PEP 829 does so from 3.18) and this wheel installs "
        "no tms_autopreload.start: a flagged start is NOT hooked on it. Ship the .start for these versions "
        "(docs/performance.md, 'Python 3.15 and later').")
    r = scn.flagged(HOOKED)
    assert r.returncode == 0 and json.loads(r.stdout) == [True, [str(scn.site / CU13)]], r.stderr  # one exec


@pytest.mark.unmeasured
@pytest.mark.parametrize("python", PYTHONS)
def test_no_flag_start_imports_what_a_bare_venv_imports(scenario, bare, python):
    """P1's floor as a fact: with the package installed and no flag, the interpreter imports the modules
    of a venv without it (same interpreter, same root file system), and nothing else but what site.py
    needs to read any ``.pth`` at all: from 3.13 it decodes each with the ``utf-8-sig`` codec, which a
    venv holding one ``.pth`` of a single ``import os`` line imports just the same."""
    scn = report_host(scenario, python)
    base = bare(python)
    ours = scn.run(["-c", MODULES])
    theirs = scn.host.run([str(base.python), "-c", MODULES], clean_env())
    floor_pth = base.site / "zz_tms_test_floor.pth"
    floor_pth.write_text("import os\n")
    try:
        floor = scn.host.run([str(base.python), "-c", MODULES], clean_env())
    finally:
        floor_pth.unlink()
    assert ours.returncode == theirs.returncode == floor.returncode == 0, ours.stderr + theirs.stderr + floor.stderr
    extra = set(json.loads(ours.stdout)) - set(json.loads(theirs.stdout))
    assert extra == (set() if version(python) < (3, 13) else {"encodings.utf_8_sig"}), sorted(extra)
    assert set(json.loads(ours.stdout)) == set(json.loads(floor.stdout))


@pytest.mark.parametrize("python", [p for p in PYTHONS if version(p) >= (3, 15)])
def test_a_start_file_would_import_pkgutil_and_the_package_in_every_start(scenario, bare, python):
    """Why the wheel ships no ``.start``: with one beside the ``.pth``, a no-flag start runs the entry
    point (site.py's own ``-v`` lines say so) and imports what a bare venv never does."""
    scn = report_host(scenario, python)
    start = scn.site / "tms_autopreload.start"
    start.write_text("tms_autopreload:process_startup\n")
    try:
        verbose = scn.run(["-v", "-c", "pass"])
        ours = scn.run(["-c", MODULES])
    finally:
        start.unlink()
    lines = [line for line in verbose.stderr.splitlines() if "tms_autopreload" in line and "site-packages" in line
             and ("entry point" in line or "suppressed" in line)]
    print("\n".join(lines))
    assert any(line.startswith("Executing entry point: tms_autopreload:process_startup") for line in lines), lines
    assert any(line.startswith("import lines in ") and "are suppressed due to matching" in line for line in lines)
    base = json.loads(scn.host.run([str(bare(python).python), "-c", MODULES], clean_env()).stdout)
    extra = set(json.loads(ours.stdout)) - set(base)
    print(f"CPython {python}, modules a .start adds to a no-flag start: {sorted(extra)}")
    assert {"pkgutil", "tms_autopreload"} <= extra, sorted(extra)


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("how", ["-S", "-I", "-s", "-E", "PYTHONNOUSERSITE"])
def test_site_options_follow_the_same_rules_on_every_version(scenario, python, how):
    """``-S`` skips site (no ``.pth``, no hook, nothing said); ``-I``, ``-s``, ``-E`` and
    ``PYTHONNOUSERSITE`` keep site-packages, so a flagged start is hooked, by one exec."""
    scn = report_host(scenario, python)
    args = ["-c", HOOKED] if how == "PYTHONNOUSERSITE" else [how, "-c", HOOKED]
    env = {"SLIME_OFFLOAD_TRAIN": "1", "TMS_AUTOPRELOAD_VERBOSE": "1"}
    if how == "PYTHONNOUSERSITE":
        env["PYTHONNOUSERSITE"] = "1"
    r = scn.run(args, env)
    assert r.returncode == 0, r.stderr
    reexecd, hooks = json.loads(r.stdout)
    if how == "-S":
        assert hooks == [] and execs(reexecd) == 0 and r.stderr == ""
    else:
        assert hooks == [str(scn.site / CU13)] and execs(reexecd) == 1, r.stderr



# The three files the wheel puts at the root of site-packages (setup.py's STARTUP_FILES), and a start's user code.
START_UP_FILES = ("tms_autopreload.pth", "_tms_autopreload_start.py", "_tms_autopreload_left_over.py")
USER = ["-c", "print('user code ran')"]


def removal(pth) -> str:
    """The command that removes the three start-up files beside ``pth``, as a shell reads it, from any shell."""
    return "env TMS_AUTOPRELOAD_DISABLE=1 " + shlex.join(["rm", "-f", "--", *(str(pth.parent / n) for n in
                                                                                START_UP_FILES)])


def paste(scn, fix: str, env: dict[str, str]):
    """``fix`` pasted into the shell that showed it (its variables, the flag among them), then the start again."""
    return scn.host.run(["sh", "-c", f"{fix}; {shlex.join([str(scn.venv.python), *USER])}"], clean_env(**env))


def assert_pasted_removal_works(scn, fix: str, env: dict[str, str]) -> None:
    """The removal, pasted into the flagged shell: every start-up file is gone, and the next start runs unhooked
    and says nothing, the flag still set."""
    assert fix == removal(scn.site / "tms_autopreload.pth"), fix
    r = paste(scn, fix, env)
    assert (r.returncode, r.stdout, r.stderr) == (0, "user code ran\n", ""), (fix, r.returncode, r.stderr)
    assert not [n for n in START_UP_FILES if (scn.site / n).exists()], fix


PACKAGE_GONE = "the tms_autopreload package it starts cannot be imported"


def assert_left_over_said(r, pth, python: str, warn: bool, why: str = PACKAGE_GONE) -> str:
    """One ``tms-autopreload:`` message naming the left-over ``.pth``, ``why``, and both fixes (reinstall this
    package from the wheel pip recorded, for this interpreter, unhooked; or remove the three start-up files), then
    the policy: exit 78 before user code, with the way out of a stop, or (``warn``) user code runs; never site.py's
    traceback. Returns the removal as printed. That the reinstall works as printed: tests/test_way_out.py."""
    assert "Traceback" not in r.stderr and "Error processing line" not in r.stderr, r.stderr
    lines = r.stderr.splitlines()
    # once, though site.py reads a venv's site-packages twice on 3.10-3.14
    assert len(lines) == (1 if warn else 2) and not (warn and WAY_OUT in r.stderr), r.stderr
    head = (f"tms-autopreload: {pth} is left over: {why}, so this "
            f"process is not hooked. Fix: `env TMS_AUTOPRELOAD_DISABLE=1 {python} -m ")
    assert lines[0].startswith(head) and " -m pip install --force-reinstall /" in lines[0], r.stderr
    warned = "; continuing without the hook (TMS_AUTOPRELOAD_ON_ERROR=warn)" if warn else ""
    assert lines[0].endswith(f"; or remove the start-up files (`{removal(pth)}`){warned}"), r.stderr
    assert warn or ("\n" + lines[1]).startswith(WAY_OUT), r.stderr
    assert (r.returncode, r.stdout) == ((0, "user code ran\n") if warn else (78, "")), (r.returncode, r.stdout)
    return removal(pth)


def unread_values_only(stderr: str) -> bool:
    """Whether ``stderr`` says nothing but what a start says of a variable's value it cannot read."""
    return all(w.startswith("tms-autopreload: warning: ") and " not a recognised value " in w
               for w in stderr.splitlines())


@pytest.mark.parametrize("python", [DEFAULT_PYTHON, "3.13", "sid/3.15"])
def test_a_left_over_pth_whose_package_is_gone(scenario, python):
    """The wheel installed, then its package directory removed (``tms_autopreload.pth`` left over): a
    flagged start says so in one line naming the file and the fix, then follows TMS_AUTOPRELOAD_ON_ERROR
    as the package does (exit 78, or continue with ``warn``; an unknown policy is ``exit``); without a flag
    on (none, an off word, or the kill switch on, misspelt or not) the program runs, and nothing is said but
    what the start module, which reads the flags as the package does, says of a value it cannot read.
    The other fix, pasted into the flagged shell, removes every start-up file the wheel put there."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), python=python, tag="left-over")
    shutil.rmtree(scn.site / "tms_autopreload")
    pth = scn.site / "tms_autopreload.pth"
    for env in ({}, {"TMS_AUTOPRELOAD": "0"}, {"SLIME_OFFLOAD_TRAIN": "maybe"}, {"TMS_AUTOPRELOAD": ""},
                {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": "1"},
                {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": "ture"}):
        r = scn.run(USER, env)
        assert (r.returncode, r.stdout, unread_values_only(r.stderr)) == (0, "user code ran\n", True), (env, r.stderr)
    for env, warn in (({"TMS_AUTOPRELOAD": "1"}, False), ({"SLIME_OFFLOAD_TRAIN": " Yes "}, False),
                      ({"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_ON_ERROR": "exit"}, False),
                      ({"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_ON_ERROR": "fail"}, False),
                      ({"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": "off", "TMS_AUTOPRELOAD_ON_ERROR": " WARN"},
                       True)):
        fix = assert_left_over_said(scn.run(USER, env), pth, str(scn.venv.python), warn)
    assert_pasted_removal_works(scn, fix, {"TMS_AUTOPRELOAD": "1"})


@pytest.mark.parametrize("how", ["from-an-index", "dist-info-gone"])
def test_a_left_over_pth_that_no_record_explains_prints_a_fix_that_works(scenario, how):
    """Where pip recorded no source (an install from an index: no ``direct_url.json``), or the
    ``.dist-info`` went with the package, no command can name the wheel or checkout to install again, and
    tms-autopreload is not on the package index. The fix is the removal of the start-up files, which pasted
    into the flagged shell lets the next start run, unhooked and silent; what hooks it again is said in
    words, with no placeholder path, and done as said (the wheel installed again, ``--force-reinstall``:
    from an index the ``.dist-info`` is still there), the next flagged start is hooked."""
    scn = report_host(scenario, tag=f"left-over-{how}")
    shutil.rmtree(scn.site / "tms_autopreload")
    (info,) = scn.site.glob("tms_autopreload-*.dist-info")
    if how == "from-an-index":
        (info / "direct_url.json").unlink()
    else:
        shutil.rmtree(info)
    pth, python = scn.site / "tms_autopreload.pth", str(scn.venv.python)
    r = scn.run(USER, {"SLIME_OFFLOAD_TRAIN": "1"})
    assert (r.returncode, r.stdout) == (78, "") and "Traceback" not in r.stderr, r.stderr
    message, _, way_out = r.stderr.partition("\n")
    assert ("\n" + way_out).startswith(WAY_OUT) and "/path/to" not in r.stderr, r.stderr
    assert message == (
        f"tms-autopreload: {pth} is left over: the tms_autopreload package it starts cannot be imported, so this "
        f"process is not hooked. Fix: `{removal(pth)}` (nothing records where this copy came from: to hook {python} "
        f"again, install tms-autopreload for it from your wheel or checkout, with pip's --force-reinstall; it is not "
        f"on the package index)"), message
    assert_pasted_removal_works(scn, removal(pth), {"SLIME_OFFLOAD_TRAIN": "1"})
    run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--disable-pip-version-check", "--no-deps",
         "--no-index", "--force-reinstall", str(scn.parts.own_wheel)], env=clean_env())
    r = scn.flagged(HOOKED)
    assert r.returncode == 0 and json.loads(r.stdout) == [True, [str(scn.site / CU13)]], r.stderr


# What gone leaves: the start module alone (the package and the fallback are there), the start module and the
# package (the fallback is there), or the package with the fallback its start module imports (nothing of the
# package's can be imported: the line's own words).
GONE = {"start-module": ("_tms_autopreload_start.py",),
        "start-module-and-package": ("_tms_autopreload_start.py", "tms_autopreload"),
        "package-and-fallback": ("tms_autopreload", "_tms_autopreload_left_over.py")}


@pytest.mark.parametrize("python", [DEFAULT_PYTHON, "3.10", "sid/3.15"])
@pytest.mark.parametrize("gone", list(GONE))
def test_a_pth_whose_start_up_files_are_gone_fails_closed(scenario, tmp_path, python, gone):
    """The ``.pth`` kept, what its line imports gone (the start module; or the package and the fallback the
    start module imports): site.py would print ``ModuleNotFoundError`` (twice in a venv) and a flagged start
    would run unhooked. Its line catches that itself: without a flag on, or with the kill switch on, nothing
    is said (where the start module is there, but what the package says of a value it cannot read); pip (by its
    name) and uv's interpreter query run, and pass the kill switch on; the package's own command is never stopped;
    a flagged start stops with 78 and one message, or with TMS_AUTOPRELOAD_ON_ERROR=warn it is said once and the
    program runs. Where the package or its fallback can
    still be imported, the message is the package's own, its fix the wheel pip recorded installed again, which
    pasted into the flagged shell puts the start-up files back: the next flagged start is hooked. Where neither
    can, its fix removes the start-up files, and the next start runs."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), python=python,
                   tag=f"start-gone-{gone}", own_pip="/" not in python)  # this machine's: pip of their own
    for name in GONE[gone]:
        (shutil.rmtree if name == "tms_autopreload" else Path.unlink)(scn.site / name)
    pth, python_path = scn.site / "tms_autopreload.pth", str(scn.venv.python)
    for env in ({}, {"TMS_AUTOPRELOAD": "0"}, {"SLIME_OFFLOAD_TRAIN": "maybe"},
                {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": "1"},
                {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": " Ture"}):
        r = scn.run(USER, env)
        # Where the start module is there, it reads the flags as the package does (its copy of the rules) and says
        # what the package says of a value it cannot read; where it is gone, nothing is said.
        said = unread_values_only(r.stderr) if gone == "package-and-fallback" else r.stderr == ""
        assert (r.returncode, r.stdout, said) == (0, "user code ran\n", True), (env, r.returncode, r.stderr)
    # The repair tools, by the names pip's launcher and uv's query give them; each passes the kill switch on.
    shown = "import os; print(os.environ.get('TMS_AUTOPRELOAD_DISABLE'))"
    (tmp_path / "pip3.12").write_text(shown + "\n")
    (tmp_path / "python").mkdir()
    (tmp_path / "python" / "get_interpreter_info.py").write_text(f"def main():\n    {shown}\n")
    query = f"import sys; sys.path = [{str(tmp_path)!r}]; from python.get_interpreter_info import main; main()"
    for args in ([str(tmp_path / "pip3.12")], ["-I", "-B", "-c", query]):
        r = scn.run(args, {"TMS_AUTOPRELOAD": "1"})
        assert (r.returncode, r.stdout, r.stderr) == (0, "1\n", ""), (args, r.returncode, r.stderr)
    # The package's own command, its console script and -m: never stopped, and it runs where the package is there.
    for args in ([str(scn.venv.path / "bin" / "tms-autopreload"), "--version"], ["-m", "tms_autopreload", "--version"]):
        argv = args if args[0] != "-m" else [python_path, *args]
        r = scn.host.run(argv, clean_env(TMS_AUTOPRELOAD="1"))
        assert "left over" not in r.stderr, (args, r.stderr)
        assert r.returncode == 0 or "tms_autopreload" in GONE[gone], (args, r.returncode, r.stderr)
    error = "No module named " + repr("_tms_autopreload_left_over" if gone == "package-and-fallback" else
                                      "_tms_autopreload_start")
    if gone != "package-and-fallback":  # the package's own stop, or its fallback's: the recorded wheel again
        why = error if gone == "start-module" else PACKAGE_GONE
        assert_left_over_said(scn.run(USER, {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_ON_ERROR": "Warn"}), pth,
                              python_path, True, why)
        r = scn.run(USER, {"SLIME_OFFLOAD_TRAIN": "1"})
        assert_left_over_said(r, pth, python_path, False, why)
        offline = {"SLIME_OFFLOAD_TRAIN": "1", "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        fix = r.stderr[r.stderr.index("Fix: `") + 6:]
        r = paste(scn, fix[:fix.index("`")], offline)
        assert r.returncode == 0, r.stderr[-3000:]
        assert [n for n in START_UP_FILES if (scn.site / n).is_file()] == list(START_UP_FILES), r.stderr[-3000:]
        r = scn.flagged(HOOKED)
        assert r.returncode == 0 and json.loads(r.stdout) == [True, [str(scn.site / CU13)]], r.stderr
        return
    said = (f"tms-autopreload: {pth} is left over: {error}, so this process is not hooked. Fix: `{removal(pth)}` "
            f"(then install tms-autopreload for {python_path} again from your wheel or checkout, with pip's "
            f"--force-reinstall, to hook it)")
    r = scn.run(USER, {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_ON_ERROR": "Warn"})
    assert (r.returncode, r.stdout) == (0, "user code ran\n"), r.stderr
    assert r.stderr == f"{said}; continuing without the hook (TMS_AUTOPRELOAD_ON_ERROR=warn)\n", r.stderr
    r = scn.run(USER, {"SLIME_OFFLOAD_TRAIN": "1"})
    assert (r.returncode, r.stdout) == (78, ""), r.stderr
    assert r.stderr == (f"{said}\nTo run a command here without the hook: `env TMS_AUTOPRELOAD_DISABLE=1 COMMAND` "
                        f"(every printed fix starts so), or `unset SLIME_OFFLOAD_TRAIN` (or export "
                        f"TMS_AUTOPRELOAD_DISABLE=1) for the rest of this shell.\n"), r.stderr
    assert_pasted_removal_works(scn, removal(pth), {"SLIME_OFFLOAD_TRAIN": "1"})


def _fix_of(said: str) -> str:
    """The fix as printed: the first command in backticks after ``Fix:``."""
    fix = said[said.index("Fix: `") + 6:]
    return fix[:fix.index("`")]


@pytest.mark.parametrize("gone", [*START_UP_FILES, "read-by-no-site"])
def test_doctor_says_what_a_flagged_start_does_where_a_start_up_file_is_gone(scenario, tmp_path, gone):
    """A start-up file removed from the site directory the package is installed in, or the whole install moved
    to a folder on ``PYTHONPATH`` (a ``--target`` install: site.py runs no ``.pth`` there): ``doctor``, text and
    ``--json``, has its plan but says what a flagged start does (not hooked, where the ``.pth`` or the start module
    is gone or unread; hooked, where only the fallback is gone), exits 1 with cause ``start-up-files``, and gives
    the fix the start gives (the same words, where the start says any); ``which`` and ``env`` warn on stderr and
    print their plan. The fix, pasted into a flagged shell, puts every start-up file back where site.py runs it:
    the next flagged start is hooked, and ``doctor`` exits 0."""
    scn = report_host(scenario, tag=f"doctor-start-up-{gone}", own_pip=True)
    env = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    site = scn.site
    if gone == "read-by-no-site":
        site = tmp_path / "target"
        site.mkdir()
        for name in (*START_UP_FILES, "tms_autopreload", *(p.name for p in scn.site.glob("tms_autopreload-*"))):
            shutil.move(str(scn.site / name), site / name)
        env["PYTHONPATH"] = str(site)
    else:
        (scn.site / gone).unlink()
    pth = site / "tms_autopreload.pth"
    doc = scn.doctor(env)
    assert doc["ok"] is False and doc["plan"] is not None and doc["start_up"]["cause"] == "start-up-files", doc
    r = scn.run(["-m", "tms_autopreload", "doctor"], env)
    line = next(x for x in r.stdout.splitlines() if x.startswith("START-UP: "))
    assert r.returncode == 1 and line == f"START-UP: {doc['start_up']['message']}. Fix: {doc['start_up']['fix']}", r
    hooked = gone == "_tms_autopreload_left_over.py"
    assert (" are hooked, " if hooked else " are not hooked") in line and str(site) in line, line
    for command in ("which", "env"):
        r = scn.run(["-m", "tms_autopreload", command], env)
        assert r.returncode == 0 and r.stdout, r.stderr
        assert r.stderr == f"tms-autopreload {command}: warning: {doc['start_up']['message']}. Fix: " \
                           f"{doc['start_up']['fix']}\n", r.stderr
    start = scn.flagged(HOOKED, env)  # what a flagged start does, as doctor says
    if hooked:
        assert start.returncode == 0 and json.loads(start.stdout) == [True, [str(scn.site / CU13)]], start.stderr
    elif gone == "_tms_autopreload_start.py":
        assert start.returncode == 78 and _fix_of(start.stderr) == _fix_of(line), (start.stderr, line)
    else:
        assert (start.returncode, start.stderr) == (0, "") and json.loads(start.stdout)[1] == [], start
    r = paste(scn, _fix_of(line), {"SLIME_OFFLOAD_TRAIN": "1", **env})
    assert r.returncode == 0, r.stderr[-3000:]
    assert [n for n in START_UP_FILES if (scn.site / n).is_file()] == list(START_UP_FILES), r.stderr[-3000:]
    r = scn.flagged(HOOKED, env)
    assert r.returncode == 0 and json.loads(r.stdout)[1] == [str(scn.site / CU13)], r.stderr
    r = scn.run(["-m", "tms_autopreload", "doctor"], env)
    assert r.returncode == 0 and "START-UP" not in r.stdout, r.stdout
    assert pth.exists() or gone == "tms_autopreload.pth"


def test_doctor_judges_no_start_up_files_where_pip_has_no_record_of_the_package(scenario):
    """The package's dist-info removed (pip's record gone, its files in place, as a copy put there by hand leaves
    them): nothing says which directory the start-up files belong to, so ``doctor`` judges none (``start_up``
    null, exit 0), and agrees with a flagged start, which is hooked."""
    scn = report_host(scenario, tag="doctor-no-record")
    for info in scn.site.glob("tms_autopreload-*.dist-info"):
        shutil.rmtree(info)
    doc = scn.doctor()
    assert doc["ok"] is True and doc["start_up"] is None, doc
    r = scn.flagged(HOOKED)
    assert r.returncode == 0 and json.loads(r.stdout) == [True, [str(scn.site / CU13)]], r.stderr


@pytest.mark.parametrize("stray", ["another copy", "not a copy"])
def test_a_start_module_earlier_on_sys_path_is_said_by_doctor_and_where_it_starts_a_flagged_start(scenario, tmp_path,
                                                                                                   stray):
    """A start module found before the one beside the ``.pth`` (a ``PYTHONPATH`` folder holding another install's
    start-up files, or a file of that name that is no start module at all) is what flagged starts import: it runs
    its own copy of the start-up rules, or none. ``doctor`` names it and the one it stands in for (exit 1, cause
    ``start-up-files``), and so does a flagged start that has work to do, once, in the same words (it is hooked,
    where the copy starts the package); one beside the ``.pth`` is said nothing of. The fix, pasted where it was
    printed, takes the stray one away: the next flagged start is hooked and says nothing of it, and ``doctor``
    exits 0."""
    scn = report_host(scenario, tag="stray-start")
    older = tmp_path / "older"
    older.mkdir()
    found = older / "_tms_autopreload_start.py"
    if stray == "another copy":
        shutil.copy(scn.site / "_tms_autopreload_start.py", found)
    else:
        found.write_text("print('a start module of some other making')\n")
    env = {"PYTHONPATH": str(older)}
    plain = scn.flagged(HOOKED)
    assert plain.returncode == 0 and "start module" not in plain.stderr, plain.stderr
    words = (f"the start module {found}, earlier on sys.path, is what flagged starts import instead of "
             f"{scn.site / '_tms_autopreload_start.py'} beside {scn.site / 'tms_autopreload.pth'}: its copy of the "
             f"start-up rules may not be this package's")
    fix = f"`env TMS_AUTOPRELOAD_DISABLE=1 rm -f -- {found}` (or take its folder off PYTHONPATH)"
    doc = scn.doctor(env)
    said = doc["start_up"]
    assert doc["ok"] is False and (said["message"], said["fix"], said["cause"]) == (words, fix, "start-up-files"), said
    for shell in (env, {**env, "SLIME_OFFLOAD_TRAIN": "1"}):  # and from a shell that exported the flag
        r = scn.run(["-m", "tms_autopreload", "doctor"], shell)
        assert r.returncode == 1 and f"START-UP: {words}. Fix: {fix}" in r.stdout.splitlines(), r.stdout
    r = scn.flagged(HOOKED, env)
    if stray == "another copy":
        assert r.returncode == 0 and json.loads(r.stdout)[1] == [str(scn.site / CU13)], r.stderr
        said = [line for line in r.stderr.splitlines() if "start module" in line]
        assert said == [f"tms-autopreload: warning: {words}. Fix: {fix}"], r.stderr
    else:  # nothing of the package runs: doctor is where it is said
        assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1])[1] == [], r
    r = paste(scn, _fix_of(f"Fix: {fix}"), {"SLIME_OFFLOAD_TRAIN": "1", **env})
    assert r.returncode == 0 and not found.exists(), r.stderr[-3000:]
    r = scn.flagged(HOOKED, env)
    assert r.returncode == 0 and json.loads(r.stdout)[1] == [str(scn.site / CU13)] and "start module" not in r.stderr
    assert scn.run(["-m", "tms_autopreload", "doctor"], env).returncode == 0


@pytest.mark.parametrize("damage", ["cut short", "emptied"])
def test_doctor_says_a_start_up_file_that_is_not_what_the_install_wrote(scenario, damage):
    """The start module edited in place (cut short, emptied: site.py then runs what is left, and a flagged start
    is not hooked, silently or with site.py's traceback): ``doctor`` compares each start-up file with pip's record
    of it, says which differs (exit 1, cause ``start-up-files``), and gives the fix a left-over start gives (the
    recorded source installed again); pasted, it writes the file back: the next flagged start is hooked and
    ``doctor`` exits 0."""
    scn = report_host(scenario, tag=f"start-changed-{damage}", own_pip=True)
    env = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    start = scn.site / "_tms_autopreload_start.py"
    whole = start.read_bytes()
    start.write_bytes(whole[:len(whole) // 2] if damage == "cut short" else b"")
    doc = scn.doctor(env)
    assert doc["ok"] is False and doc["start_up"]["cause"] == "start-up-files", doc
    assert doc["start_up"]["message"] == (f"the start-up file _tms_autopreload_start.py in {scn.site} differs from "
                                          f"what tms-autopreload's install wrote there (pip's record of it): flagged "
                                          f"starts of {scn.venv.python} may not be hooked"), doc["start_up"]
    r = scn.flagged(HOOKED, env)
    assert r.returncode != 0 or json.loads(r.stdout)[1] == [], r
    r = scn.run(["-m", "tms_autopreload", "doctor"], env)
    line = next(x for x in r.stdout.splitlines() if x.startswith("START-UP: "))
    r = paste(scn, _fix_of(line), {"SLIME_OFFLOAD_TRAIN": "1", **env})
    assert r.returncode == 0 and start.read_bytes() == whole, r.stderr[-3000:]
    r = scn.flagged(HOOKED, env)
    assert r.returncode == 0 and json.loads(r.stdout)[1] == [str(scn.site / CU13)], r.stderr
    assert scn.run(["-m", "tms_autopreload", "doctor"], env).returncode == 0


def test_the_lines_own_fallback_decides_as_the_package_does(tmp_path, monkeypatch, capfd):
    """:func:`tms_autopreload.leftover.start_gone`, which the ``.pth``'s second line runs where what its line
    imports is gone, stops a start (exit 78) where the package would hook it, and nowhere else: for every
    flag and kill-switch word (``flags()`` is the judge) and every program the package never hooks, as
    site.py leaves ``sys.argv`` for it (``unhooked_program`` and its tables are the judge), each of which it
    leaves with the kill switch on for its children; the package's own command runs, as it does there, with
    the kill switch as it was; ``TMS_AUTOPRELOAD_ON_ERROR=warn`` goes on. In this process, as the real starts
    above run it written into the file (here the package can be imported: its own stop says it)."""
    import os
    from unittest import mock

    from tms_autopreload import environment as package
    from tms_autopreload import leftover

    class Stopped(BaseException):  # as os._exit, nothing start_gone catches
        pass

    def stop(code):
        raise Stopped(code)

    monkeypatch.setattr(os, "_exit", stop)
    pth = str(tmp_path / "tms_autopreload.pth")

    def start(env: dict[str, str], argv: list[str], orig: list[str]) -> tuple[str, str | None]:
        """(what start_gone did, the kill switch it leaves) for a start whose start module is gone."""
        monkeypatch.setattr(sys, "argv", argv)
        monkeypatch.setattr(sys, "orig_argv", orig)
        with mock.patch.dict(os.environ, env, clear=True):
            if hasattr(sys, "tms_autopreload_left_over"):
                del sys.tms_autopreload_left_over
            try:
                raise ModuleNotFoundError("No module named '_tms_autopreload_start'", name="_tms_autopreload_start")
            except ImportError:
                try:
                    leftover.start_gone(pth)
                except Stopped as code:
                    assert code.args == (78,)
                    return "stopped", os.environ.get("TMS_AUTOPRELOAD_DISABLE")
                finally:
                    if hasattr(sys, "tms_autopreload_left_over"):
                        del sys.tms_autopreload_left_over
            return "ran", os.environ.get("TMS_AUTOPRELOAD_DISABLE")

    python = sys.executable
    programs = [([str(tmp_path / "train.py")], [python, str(tmp_path / "train.py")]), (["-c"], [python, "-c", "pass"]),
                (["-m", "a"], [python, "-m", "mymod", "a"]), ([""], [python])]
    for name, markers in (*package._SCRIPTS.items(), ("pip3.12", package._SCRIPTS["pip"])):
        script = tmp_path / name
        script.write_bytes(markers[0] + b" main\n")
        programs.append(([str(script), "install"], [python, "-E", str(script), "install"]))
    for module in package._MODULES:
        programs += [(["-m", "install"], [python, "-m", module, "install"]), (["-m"], [python, f"-Im{module}"])]
    for name in package._SCRIPT_FILES:
        programs.append(([str(tmp_path / name), "install"], [python, str(tmp_path / name), "install"]))
    for text in package._COMMANDS:
        programs.append((["-c"], [python, "-I", "-B", "-c", f"import sys; sys.path = ['/x']; {text}"]))
    for argv, orig in programs:
        tool = package.unhooked_program(argv, orig)
        want = ("stopped", None) if tool is None else ("ran", None) if tool == package.COMMAND else ("ran", "1")
        assert start({"TMS_AUTOPRELOAD": "1"}, argv, orig) == want, (orig, tool)
    words = sorted(package.TRUE_WORDS | package.FALSE_WORDS) + [" On ", "maybe", "ture"]
    hooked = programs[0]
    for name in (*package.FLAG_VARS, package.DISABLE_VAR):
        for word in words:
            env = {name: word} if name != package.DISABLE_VAR else {"SLIME_OFFLOAD_TRAIN": "1", name: word}
            want = "stopped" if package.flags(env, warn=False)[0] else "ran"
            assert start(env, *hooked)[0] == want, env
    assert start({"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_ON_ERROR": " warn"}, *hooked)[0] == "ran"
    err = capfd.readouterr().err
    assert "continuing without the hook (TMS_AUTOPRELOAD_ON_ERROR=warn)" in err and "Traceback" not in err


def test_the_left_over_fallback_says_it_once_per_process(tmp_path, monkeypatch, capfd):
    """site.py runs a venv's ``.pth`` twice (3.10-3.14), and copies of the start-up files may run it again:
    :func:`tms_autopreload.leftover.left_over`, the code the fallback is written from, says it once however
    often it is called (here in this process, under ``warn``, so that it returns)."""
    from tms_autopreload import leftover

    pth = tmp_path / "site-packages" / "tms_autopreload.pth"
    pth.parent.mkdir()
    monkeypatch.setattr(sys, "argv", [str(tmp_path / "prog")])
    for name in ("TMS_AUTOPRELOAD_DISABLE", "SLIME_OFFLOAD_TRAIN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TMS_AUTOPRELOAD", "1")
    monkeypatch.setenv("TMS_AUTOPRELOAD_ON_ERROR", "warn")
    assert not hasattr(sys, "tms_autopreload_left_over")
    try:
        leftover.left_over(str(pth))
        leftover.left_over(str(pth))
    finally:
        if hasattr(sys, "tms_autopreload_left_over"):
            del sys.tms_autopreload_left_over
    err = capfd.readouterr().err
    assert err.count(f"tms-autopreload: {pth} is left over") == 1, err


def test_the_left_over_fix_looks_for_pip_where_this_interpreter_would_find_it(tmp_path, monkeypatch):
    """Outside a venv the site directories site.py has still to add count (a user site's ``.pth`` runs before
    the system's site-packages is on the path); in a venv the base's do not, pip there or not for the venv."""
    import site as site_module

    from tms_autopreload import leftover

    base, user_site = tmp_path / "base-site", tmp_path / "site"
    (base / "pip").mkdir(parents=True)
    user_site.mkdir()
    monkeypatch.setattr(sys, "path", [])
    monkeypatch.setattr(site_module, "getsitepackages", lambda: [str(base)])
    monkeypatch.setattr(sys, "base_prefix", sys.prefix)
    assert leftover._pip_found(str(user_site))  # not a venv: the system's site-packages, still to be added
    monkeypatch.setattr(sys, "base_prefix", str(tmp_path / "base"))
    assert not leftover._pip_found(str(user_site))  # a venv: its base's pip is not the venv's


# ---------------------------------------------------------------- what 3.18 needs

# (version, wheels offered, the one pip must choose). The plain wheel is this project's; the tagged
# copies stand for a second wheel that would carry the .start. pip ranks a wheel by the first of the
# interpreter's supported tags it matches (packaging.tags): cpNN-abi3-<platform> tags of every earlier
# CPython come before any py3-none-any, while pyNN-none-any ranks after py3-none-any except on NN itself.
ABI3 = "cp318-abi3-manylinux_2_17_x86_64"
PY318 = "py318-none-any"
TAG_ORDER = [
    ("3.15", (ABI3,), "py3-none-any"), ("3.17", (ABI3,), "py3-none-any"),
    ("3.18", (ABI3,), ABI3), ("3.19", (ABI3,), ABI3), ("3.24", (ABI3,), ABI3),
    ("3.18", (PY318,), PY318), ("3.19", (PY318,), "py3-none-any"),
]


def _chosen_by(installer: str, index, target: str, tmp_path) -> str:
    """The file ``installer`` (real pip or uv) picks from ``index`` for CPython ``target`` on x86-64 Linux."""
    if installer == "pip":
        r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--no-deps",
                            "--no-index", "--find-links", str(index), "--only-binary=:all:", "--python-version", target,
                            "--implementation", "cp", "--platform", "manylinux_2_17_x86_64",
                            "-d", str(tmp_path / "got"), "tms-autopreload"],
                           capture_output=True, text=True, env=clean_env(), timeout=120)
        assert r.returncode == 0, r.stderr
        return "".join(p.name for p in (tmp_path / "got").iterdir())
    r = subprocess.run([uv(), "pip", "install", "-v", "--dry-run", "--no-cache", "--no-deps", "--no-index",
                        "--find-links", str(index), "--python-version", target, "--python-platform",
                        "x86_64-manylinux_2_17", "--target", str(tmp_path / "target"), "tms-autopreload"],
                       capture_output=True, text=True, env=clean_env(), timeout=120)
    assert r.returncode == 0, r.stderr
    picked = re.findall(r"Selecting: tms-autopreload==\S+ \[compatible\] \((\S+\.whl)\)", r.stderr)
    assert len(picked) == 1, r.stderr
    return picked[0]


# pip's choices take a second each: make test asks it, the fast lane uv.
@pytest.mark.parametrize("installer", [pytest.param("pip", marks=pytest.mark.slow), "uv"])
@pytest.mark.parametrize("target, offered, chosen", TAG_ORDER)
def test_installers_choose_a_start_wheel_only_as_cp318_abi3(parts, tmp_path, target, offered, chosen, installer):
    """A second wheel for CPython >= 3.18 can carry the ``.start`` only if installers prefer it there and
    never install it before: real pip's and uv's choice among the files, for CPython 3.15 to 3.24."""
    index = tmp_path / "index"
    index.mkdir()
    shutil.copy(parts.own_wheel, index)
    stem = parts.own_wheel.name.rsplit("-", 3)[0]
    for tag in offered:
        shutil.copy(parts.own_wheel, index / f"{stem}-{tag}.whl")
    assert _chosen_by(installer, index, target, tmp_path) == f"{stem}-{chosen}.whl", (installer, target)


@pytest.mark.parametrize("python", [DEFAULT_PYTHON, "sid/3.15"])
def test_a_left_over_pth_names_the_file_site_py_read(scenario, tmp_path, python):
    """Copies of the start-up files in two more directories: one on ``PYTHONPATH`` (ahead of every site
    directory on ``sys.path``, its ``.pth`` never processed by site.py, its modules found first) and a second
    site directory (``site.addsitedir`` from a ``.pth`` line, after the venv's). Whichever copy's modules run,
    the message names the ``.pth`` site.py read (the venv's, read first) and is said once per process."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda13"), python=python,
                   tag="left-over-copies")
    shutil.rmtree(scn.site / "tms_autopreload")
    pth = scn.site / "tms_autopreload.pth"
    for where in (tmp_path / "pythonpath", tmp_path / "second-site"):
        where.mkdir()
        for name in ("tms_autopreload.pth", "_tms_autopreload_start.py", "_tms_autopreload_left_over.py"):
            shutil.copy(scn.site / name, where / name)
    (scn.site / "zz_second_site.pth").write_text(f"import site; site.addsitedir({str(tmp_path / 'second-site')!r})\n")
    r = scn.run(["-c", "print('user code ran')"], {"TMS_AUTOPRELOAD": "1", "PYTHONPATH": str(tmp_path / "pythonpath")})
    assert_left_over_said(r, pth, str(scn.venv.python), False)


@pytest.mark.slow  # another interpreter, and pip
@pytest.mark.parametrize("below", BELOW_FLOOR)
def test_an_install_forced_below_the_python_floor_says_so_everywhere_and_its_fix_removes_it(
        scenario, parts, tmp_path, said, below):
    """pip installs the package on a Python older than its requires-python only when told to
    (``--ignore-requires-python``). There a flagged start stops (78, the way out after it) or, told to warn, runs
    user code; every command exits 1; all say the same words (which Python, the floor, the fix), never a
    traceback, before anything imports a module written for a newer Python. The fix, pasted into the flagged
    shell, uninstalls it: the start-up files go with it, and the next flagged start runs and says nothing. The
    commands say the same from a flagged shell (their own exit 1: these interpreters have no ``sys.orig_argv``,
    and ``-m tms_autopreload`` is still known there); and where the ``.pth`` is left behind alone, a flagged start
    stops with the left-over's words and pip runs from that shell, without a traceback."""
    scn = report_host(scenario)
    python = locate_python(below)
    venv = tmp_path / "old"
    run([python, "-m", "venv", str(venv)])  # with its own pip, as users make one
    old = str(venv / "bin" / "python")
    run([old, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--ignore-requires-python",
         str(parts.own_wheel)], env=pip_env())
    version = run([old, "-c", "import platform; print(platform.python_version())"]).stdout.strip()
    tms = [old, "-m", "tms_autopreload"]
    steps = [("SLIME_OFFLOAD_TRAIN=1 python -c 'print(1)'", ["env", "SLIME_OFFLOAD_TRAIN=1", old, "-c", "print(1)"]),
             ("SLIME_OFFLOAD_TRAIN=1 TMS_AUTOPRELOAD_ON_ERROR=warn python -c 'print(1)'",
              ["env", "SLIME_OFFLOAD_TRAIN=1", "TMS_AUTOPRELOAD_ON_ERROR=warn", old, "-c", "print(1)"])]
    commands = (["doctor"], ["doctor", "--json"], ["which"], ["env"], ["run", "--", "true"], ["--version"])
    steps += [(shlex.join(["tms-autopreload", *args]), [*tms, *args]) for args in commands]
    steps += [(shlex.join(["SLIME_OFFLOAD_TRAIN=1", "python", "-m", "tms_autopreload", *args]),
               ["env", "SLIME_OFFLOAD_TRAIN=1", *tms, *args]) for args in commands]
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH})
    assert "Traceback" not in text, text
    words = {line for line in text.splitlines() if line.startswith("tms-autopreload: ")}
    assert len(words) == 1 and f"is Python {version}," in next(iter(words)), text
    assert re.findall(r"^--- exit (\d+)$", text, re.M) == ["78", "0", *["1"] * 12], text
    assert normalise(text.replace(version, "<older-python-version>"), {"<old-venv>": venv, **places_of(scn)}) == said
    site = Path(run([old, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    pth = (site / START_UP_FILES[0]).read_bytes()
    r = scn.host.run(["sh", "-c", f"{_fix_of(next(iter(words)))}; {shlex.join([old, *USER])}"],
                     clean_env(SLIME_OFFLOAD_TRAIN="1"))
    assert (r.returncode, r.stderr) == (0, "") and r.stdout.endswith("user code ran\n"), r
    assert not [n for n in (*START_UP_FILES, "tms_autopreload") if (site / n).exists()], list(site.iterdir())
    (site / START_UP_FILES[0]).write_bytes(pth)  # left behind alone: its start module and package gone
    stopped = scn.host.run([old, *USER], clean_env(SLIME_OFFLOAD_TRAIN="1"))
    assert stopped.returncode == 78 and "Traceback" not in stopped.stderr, stopped
    assert f"{site / START_UP_FILES[0]} is left over" in stopped.stderr, stopped
    pip = scn.host.run([old, "-m", "pip", "--version"], clean_env(SLIME_OFFLOAD_TRAIN="1"))
    assert (pip.returncode, pip.stderr) == (0, "") and pip.stdout.startswith("pip "), pip
