"""Hosts built from Debian root file systems (tools/rootfs.py): another glibc, read the same way.

The package reads the loader's own output (``LD_TRACE_LOADED_OBJECTS``) and ``ld.so.cache``; both
belong to glibc, which these roots bring in newer versions (trixie 2.41, sid 2.43) than this
machine's. The start-up tests of test_hook.py, test_startup_files.py, ``doctor``/``which``
(test_cli.py) and dlopen mode's bindings (test_inprocess.py) run there too; this module holds what
is about the roots themselves: how they are built, their glibc, and the loader's failure messages.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from conftest import DEFAULT_PYTHON
from rootfs import SUITES, mirror
from support import MAPPED, SetupError, assert_stopped, locate_python
from test_guarantees import _elf32

# Every test here builds or enters a Debian root file system: left out of `make check`.
pytestmark = pytest.mark.slow

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
# One interpreter per glibc: this machine's, trixie's and sid's.
GLIBCS = [DEFAULT_PYTHON, "trixie/3.13", "sid/3.15"]
TRACE = """
import json, os, sys
from tms_autopreload.trace import run_trace
t = run_trace(sys.executable, {**os.environ, 'LD_PRELOAD': sys.argv[1]})
print(json.dumps({'ok': t.ok, 'missing': list(t.missing), 'errors': list(t.errors),
                  'skipped': [[os.path.basename(e), why] for e, why in t.skipped], 'status': t.status}))
"""


def test_mirror_is_the_one_apt_uses(tmp_path):
    """Both source formats; security and update suites are not the archive."""
    deb822 = tmp_path / "debian.sources"
    deb822.write_text("Types: deb\n# a comment\nURIs: http://archive.example/debian-security\n"
                      "Suites: bookworm-security\nComponents: main\n\n"
                      "Types: deb-src deb\nURIs: http://archive.example/debian\nSuites: bookworm bookworm-updates\n")
    one_line = tmp_path / "sources.list"
    one_line.write_text("deb-src http://src.example/debian bookworm main\n"
                        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main\n")
    assert mirror((str(deb822),)) == "http://archive.example/debian"
    assert mirror((str(one_line),)) == "http://one.example/debian"
    assert mirror((str(tmp_path / "missing"), str(one_line), str(deb822))) == "http://one.example/debian"
    with pytest.raises(Exception, match="no Debian archive"):
        mirror((str(tmp_path / "missing"),))


@pytest.mark.parametrize("suite, glibc", [("trixie", (2, 41)), ("sid", (2, 43)),
                                          pytest.param("trixie-arm64", (2, 41), marks=pytest.mark.aarch64)])
def test_root_file_systems_bring_their_glibc_and_pythons(rootfs, suite, glibc):
    fs = rootfs(suite)
    seen = fs.glibc()
    versions = [fs.run([fs.python(v), "-c", "import platform; print(platform.python_version())"]).stdout.strip()
                for v in SUITES[suite]]
    print(f"Debian {suite}: glibc {seen}, CPython {', '.join(versions)}")
    assert tuple(map(int, seen.split("."))) >= glibc
    assert [v.rsplit(".", 1)[0] for v in versions] == list(SUITES[suite])


def _binfmt_misc() -> tuple[bool, list[str]]:
    """Whether this machine's binfmt_misc is mounted, and what it registers."""
    where = "/proc/sys/fs/binfmt_misc"
    return os.path.ismount(where), sorted(os.listdir(where)) if os.path.ismount(where) else []


@pytest.mark.aarch64
def test_the_arm64_root_runs_aarch64_programs_and_leaves_the_machine_alone(rootfs):
    """Its interpreter, the loader it maps and its children are aarch64 programs (qemu-user-static through a
    binfmt_misc of the test's own user namespace); this machine's binfmt_misc is as it was."""
    before = _binfmt_misc()
    fs = rootfs("trixie-arm64")
    probe = (MAPPED + "import os, platform, subprocess; "
             "print(platform.machine(), bool(mapped('ld-linux-aarch64.so.1')), "
             "subprocess.run(['uname', '-m'], capture_output=True, text=True).stdout.strip())")
    r = fs.run([fs.python("3.13"), "-c", probe])
    assert r.stdout.split() == ["aarch64", "True", "aarch64"], r.stdout + r.stderr
    assert _binfmt_misc() == before


def test_the_root_is_never_written(rootfs):
    """Writes inside land in a throw-away layer: the cached root is the same for every run."""
    fs = rootfs("sid")
    fs.run(["sh", "-c", "echo x > /etc/tms-autopreload-written && test -s /etc/tms-autopreload-written"])
    assert not (fs.path / "etc" / "tms-autopreload-written").exists()


# ---------------------------------------------------------------- the loader's failures, per glibc

def _normal(text: str, *paths) -> str:
    for p in paths:
        text = text.replace(str(p), "<site>")
    return text


TRACE_CASES = {
    # case: (host dirs, what LD_PRELOAD names, the parsed answer expected on every glibc)
    "no driver": (("cuda13",), CU13, {"ok": False, "missing": ["libcuda.so.1"], "errors": [], "skipped": [],
                                      "status": 0}),
    "missing runtime": (("driver", "cuda13"), CU12,
                        {"ok": False, "missing": ["libcudart.so.12"], "errors": [], "skipped": [], "status": 0}),
    "wrong ELF class": (("driver", "cuda13"), "elf32.so",
                        {"ok": True, "missing": [], "errors": [],
                         "skipped": [["elf32.so", "wrong ELF class: ELFCLASS32"]], "status": 0}),
    # The loader maps a segment past the end of the file and dies of SIGBUS, on every glibc here: why the
    # package reads a build's ELF headers itself before asking the loader (the doctor case below).
    "truncated file": (("driver", "cuda13"), "truncated.so",
                       {"ok": False, "missing": [], "errors": [], "skipped": [], "status": -7}),
}


def _broken_builds_host(scenario, host, python):
    """The scenario of ``python`` on ``host``, with a 32-bit build and a truncated one beside the real builds."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=host, python=python)
    (scn.site / "elf32.so").write_bytes(_elf32("libcudart.so.13"))
    (scn.site / "truncated.so").write_bytes((scn.site / CU13).read_bytes()[:1000])
    return scn


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_loader_trace_failures_read_the_same_on_every_glibc(scenario, case):
    """The real loader of glibc 2.36, 2.41 and 2.43, asked about the same preload, parsed by the package:
    the same answer on each."""
    host, preload, expected = TRACE_CASES[case]
    answers = {}
    for python in GLIBCS:
        scn = _broken_builds_host(scenario, host, python)
        r = scn.run(["-c", TRACE, str(scn.site / preload)])
        assert r.returncode == 0, r.stderr
        answers[python] = json.loads(r.stdout)
    print(case, answers)
    assert all(a == expected for a in answers.values()), answers


DOCTOR_CASES = {
    "no driver": (("cuda13",), {}, ["libcuda.so.1", "install the NVIDIA driver"]),
    "missing runtime": (("driver",), {}, ["libcudart.so.13"]),
    "wrong ELF class": (("driver", "cuda13"), {"TMS_AUTOPRELOAD_PATH": "elf32.so"}, ["32-bit"]),
    "truncated file": (("driver", "cuda13"), {"TMS_AUTOPRELOAD_PATH": "truncated.so"}, ["truncated"]),
}


@pytest.mark.parametrize("case", list(DOCTOR_CASES))
def test_failures_give_the_same_clear_error_on_every_glibc(scenario, case):
    """``doctor`` and a flagged start: the same error text (paths aside) on every glibc, exit 78 before
    user code, never the loader's exit 127."""
    host, env, words = DOCTOR_CASES[case]
    errors = {}
    for python in GLIBCS:
        scn = _broken_builds_host(scenario, host, python)
        full = {k: str(scn.site / v) for k, v in env.items()}
        doc = scn.doctor(full)
        assert not doc["ok"], (python, doc)
        errors[python] = _normal(doc["error"], scn.site, scn.venv.path)
        assert_stopped(scn.flagged("print('user code ran')", full))
    print(case, errors)
    assert len(set(errors.values())) == 1, errors
    for w in words:
        assert w in errors[GLIBCS[0]], (w, errors)



# ---------------------------------------------------------------- interpreters anywhere

@pytest.mark.parametrize("minor", ["3.10", "3.11", "3.12", "3.13", "3.14", "3.15"])
def test_each_interpreter_is_found_or_said_plainly_why_not(rootfs, minor):
    """On this machine (PATH, pyenv, uv), else in a root file system; when neither, one message naming
    where it looked and what ``uv python install`` answered (its download host may be unreachable)."""
    try:
        found = locate_python(minor)
    except SetupError as exc:
        print(exc)
        assert f"`uv python install {minor}`" in str(exc) and "not on PATH, under pyenv or known to uv" in str(exc)
        suite = next(s for s, versions in SUITES.items() if minor in versions)
        fs = rootfs(suite)
        found = fs.python(minor)
        r = fs.run([found, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"])
    else:
        r = subprocess.run([found, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    assert r.stdout.strip() == minor, (found, r.stdout, r.stderr)
