"""Hostile and broken environments. One test per row of docs/guarantees.md.

Every case ends in one of three documented outcomes: the process runs hooked; it runs unhooked
after a warning; or it stops before user code with exit 78 (130 when interrupted) and one
``tms-autopreload:`` message. Never exit 127 from the loader, never a second exec, never a
Python traceback, never a change to a process that set no flag.

"Hooked" means the exact expected build is mapped and the process image was started by exactly
one re-exec of the hook (``support.REEXECD``: evidence from the process, not from its log).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import struct
import subprocess

import pytest
from conftest import report_host
from support import MAPPED, NO_DAC, REAL_CHECK, REEXECD, WAY_OUT, assert_stopped, clean_env, execs, wait_for

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PROBE = REEXECD + MAPPED + """
import json, os
maps = mapped()
print(json.dumps({'hooks': sorted({m for m in maps if 'torch_memory_saver' in m}),
                  'cudart': sorted({m for m in maps if os.path.basename(m).startswith('libcudart')}),
                  'preload': os.environ.get('LD_PRELOAD', ''), 'reexecd': reexecd()}))
"""


def start(scn, env=None, args=("-c", PROBE), prefix=(), setup="", flag=True, **kw):
    full = {"SLIME_OFFLOAD_TRAIN": "1"} if flag else {}
    full.update(env or {})
    r = scn.host.run([*prefix, str(scn.venv.python), *args], clean_env(**full), setup=setup, **kw)
    out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
    return r, out


def assert_hooked(r, out, scn, build=CU13):
    """Exactly ``build`` (under site-packages, or a path) mapped, after exactly one re-exec."""
    assert r.returncode == 0, r.stderr
    assert out["hooks"] == [str(scn.site / build)], out
    assert execs(out["reexecd"]) == 1 and "Traceback" not in r.stderr, (out, r.stderr)


@contextlib.contextmanager
def mode(path, bits):
    """``path`` with permission ``bits`` for the duration, its own restored after (so that a scenario other
    tests share is left as it was)."""
    before = path.stat().st_mode & 0o7777
    path.chmod(bits)
    try:
        yield path
    finally:
        path.chmod(before)


def candidate(scn, name, env=None):
    r = scn.run(["-m", "tms_autopreload", "doctor", "--json"], env)
    doc = json.loads(r.stdout)
    return doc, next(c for c in doc["candidates"] if os.path.basename(c["path"]) == name)


# ---------------------------------------------------------------- broken inputs

def _elf32(needed: str) -> bytes:
    """A minimal, well-formed 32-bit i386 shared object: one PT_LOAD, one PT_DYNAMIC, DT_NEEDED."""
    strtab = b"\0" + needed.encode() + b"\0"
    ehsize, phsize = 52, 32
    dyn_off = ehsize + 2 * phsize
    dyn = struct.pack("<8i", 1, 1, 5, dyn_off + 32, 10, len(strtab), 0, 0)  # NEEDED, STRTAB, STRSZ, NULL
    body = dyn + strtab
    size = dyn_off + len(body)
    ident = b"\x7fELF" + bytes([1, 1, 1, 0]) + bytes(8)
    header = ident + struct.pack("<HHIIIIIHHHHHH", 3, 3, 1, 0, ehsize, 0, 0, ehsize, phsize, 2, 40, 0, 0)
    load = struct.pack("<8I", 1, 0, 0, 0, size, size, 5, 0x1000)
    dynamic = struct.pack("<8I", 2, dyn_off, dyn_off, dyn_off, 32, 32, 6, 4)
    return header + load + dynamic + body


BROKEN = {
    "truncated": ("torch_memory_saver_hook_mode_preload_cu91.abi3.so", "truncated file"),
    "zero-length": ("torch_memory_saver_hook_mode_preload_cu92.abi3.so", "empty file"),
    "not-elf": ("torch_memory_saver_hook_mode_preload_cu93.abi3.so", "not an ELF file"),
    "aarch64": ("torch_memory_saver_hook_mode_preload_cu94.abi3.so", "built for aarch64"),
    "elf32": ("torch_memory_saver_hook_mode_preload_cu95.abi3.so", "32-bit"),
    "symlink-loop": ("torch_memory_saver_hook_mode_preload_cu96.abi3.so",
                     "cannot read it: Too many levels of symbolic links"),
}


@pytest.fixture(scope="module")
def broken(scenario):
    scn = report_host(scenario, tag="broken-files")
    real = (scn.site / CU13).read_bytes()
    files = {k: scn.site / name for k, (name, _) in BROKEN.items()}
    files["truncated"].write_bytes(real[:1000])
    files["zero-length"].write_bytes(b"")
    files["not-elf"].write_text("#!/bin/sh\necho this is not a shared object\n")
    files["aarch64"].write_bytes(real[:18] + (183).to_bytes(2, "little") + real[20:])
    files["elf32"].write_bytes(_elf32("libcudart.so.13"))
    if not files["symlink-loop"].is_symlink():
        files["symlink-loop"].symlink_to(files["symlink-loop"].name)
    return scn


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_build_files_are_rejected_with_the_reason(broken, case):
    name, words = BROKEN[case]
    doc, c = candidate(broken, name)
    assert c["status"] == "rejected" and words in c["reason"], c
    assert os.path.basename(doc["plan"]["build"]) == CU13


def test_broken_build_files_next_to_good_ones_still_run_hooked(broken):
    r, out = start(broken)
    assert_hooked(r, out, broken)


def test_garbage_torch_version_py_stops_clearly(scenario):
    scn = report_host(scenario, tag="no-version")
    (scn.site / "torch" / "version.py").write_bytes(b"\x00\xff garbage = = =\n" * 50)
    r, _ = start(scn)
    assert_stopped(r, "states neither `cuda` nor `hip`", "TMS_AUTOPRELOAD_CUDA_MAJOR")


def test_absent_torch_version_py_stops_clearly(scenario):
    scn = report_host(scenario, tag="no-version")
    (scn.site / "torch" / "version.py").unlink(missing_ok=True)
    r, _ = start(scn)
    assert_stopped(r, "no readable torch/version.py", "Fix: reinstall torch")


def test_override_still_works_with_a_broken_torch(scenario):
    scn = report_host(scenario, tag="no-version")
    (scn.site / "torch" / "version.py").unlink(missing_ok=True)
    r, out = start(scn, {"TMS_AUTOPRELOAD_CUDA_MAJOR": "13"})
    assert_hooked(r, out, scn)


def test_package_without_builds_stops_clearly(scenario, tmp_path):
    scn = report_host(scenario)
    builds = list(scn.site.glob("torch_memory_saver_*.so"))
    for so in builds:
        shutil.move(so, tmp_path / so.name)
    try:
        r, _ = start(scn)
    finally:
        for so in builds:
            shutil.move(tmp_path / so.name, so)
    assert_stopped(r, "ships no preload build", "pip install --force-reinstall")


def test_unreadable_torch_lib_dir_still_decides_from_version_py(scenario):
    scn = report_host(scenario)
    with mode(scn.site / "torch" / "lib", 0):
        r, out = start(scn, prefix=NO_DAC)
    assert_hooked(r, out, scn)


def test_unreadable_build_file_is_rejected(scenario):
    scn = report_host(scenario)
    with mode(scn.site / CU13, 0):
        r, _ = start(scn, prefix=NO_DAC)
    assert_stopped(r, "cannot read it: Permission denied")


# ---------------------------------------------------------------- hostile or stale environments

def test_missing_torch_memory_saver_file_in_ld_preload_is_dropped(scenario):
    scn = report_host(scenario)
    r, out = start(scn, {"LD_PRELOAD": "/gone/torch_memory_saver_hook_mode_preload_cu13.abi3.so"})
    assert_hooked(r, out, scn)
    assert out["preload"] == str(scn.site / CU13)


def test_wrong_major_libcudart_first_on_library_path(scenario, parts):
    scn = report_host(scenario)
    r, out = start(scn, {"LD_LIBRARY_PATH": str(parts.rt[12])})
    assert_hooked(r, out, scn)
    assert out["cudart"] == [str(parts.rt[13] / "libcudart.so.13")]


def test_another_libcudart_13_first_on_library_path_is_not_bound(scenario, parts, tmp_path):
    """A second copy of libcudart.so.13 ahead of torch's: the plan binds the hook to torch's copy."""
    scn = report_host(scenario)
    other = tmp_path / "other-cuda"
    other.mkdir()
    shutil.copy(parts.rt[13] / "libcudart.so.13", other / "libcudart.so.13")
    doc, _ = candidate(scn, CU13, {"LD_LIBRARY_PATH": str(other)})
    # torch's global deps resolve through LD_LIBRARY_PATH too, so torch would use that copy: bind to it.
    assert doc["runtime"]["library"] == str(other / "libcudart.so.13")
    r, out = start(scn, {"LD_LIBRARY_PATH": str(other)})
    assert_hooked(r, out, scn)
    assert out["cudart"] == [str(other / "libcudart.so.13")]


@pytest.mark.parametrize("tms", ["0.0.9.post1", "0.0.10"])
def test_stdbuf_preload_is_kept_and_old_tms_gets_the_warning_with_the_fix(scenario, tms):
    """AReaL #1482: `stdbuf -oL python ...` puts coreutils' libstdbuf.so in LD_PRELOAD. The hook keeps it
    (after itself); torch_memory_saver <= 0.0.9.post1 reads LD_PRELOAD as one path, so that start is warned,
    naming the fix. 0.0.10 splits on ':' and needs no warning."""
    stdbuf = shutil.which("stdbuf")
    if stdbuf is None:
        pytest.skip("stdbuf (coreutils) is not installed")
    scn = report_host(scenario, tms=tms)
    r, out = start(scn, prefix=(stdbuf, "-oL"))
    assert_hooked(r, out, scn)
    hook, *kept = out["preload"].split(":")
    assert hook == str(scn.site / CU13) and [os.path.basename(k) for k in kept] == ["libstdbuf.so"], out
    warned = "reads LD_PRELOAD as a single path" in r.stderr
    assert warned is (tms == "0.0.9.post1"), r.stderr
    if warned:
        assert (f"drop those entries or `env TMS_AUTOPRELOAD_DISABLE=1 {scn.venv.python} -m ensurepip && env "
                f"TMS_AUTOPRELOAD_DISABLE=1 {scn.venv.python} -m pip install 'torch-memory-saver>=0.0.10'`") \
            in r.stderr, r.stderr


def test_a_start_without_home_is_hooked(scenario):
    scn = report_host(scenario)
    env = clean_env(SLIME_OFFLOAD_TRAIN="1")
    env.pop("HOME", None)
    r = scn.host.run([str(scn.venv.python), "-c", PROBE], env)
    assert_hooked(r, json.loads(r.stdout), scn)


def test_read_only_filesystem(scenario):
    scn = report_host(scenario)
    root = scn.venv.path
    probe = PROBE + "\nimport sys\nopen(sys.prefix + '/probe-write', 'w')\n"  # must fail: read-only
    r, out = start(scn, setup=f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}"',
                   args=("-c", probe))
    assert r.returncode == 1 and "Read-only file system" in r.stderr  # the user code's own write failed ...
    r, out = start(scn, setup=f'mount --bind "{root}" "{root}" && mount -o remount,bind,ro "{root}"')
    assert_hooked(r, out, scn)  # ... and the hook, which writes nothing, ran hooked


def _with_startup_patch(scn, name: str, line: str, env: dict):
    """Start flagged with one more .pth, sorted before ours, that does ``line`` when TMS_TEST_PATCH is set."""
    patch = scn.site / f"aa_tms_test_{name}.pth"
    patch.write_text(f"import os, sys; os.environ.get('TMS_TEST_PATCH') and ({line})\n")
    try:
        return start(scn, {"TMS_TEST_PATCH": "1", **env})
    finally:
        patch.unlink()


def test_interpreter_removed_after_start_stops_clearly(scenario):
    scn = report_host(scenario)
    exe = scn.venv.python
    target = os.readlink(exe)
    try:
        r, _ = _with_startup_patch(scn, "remove_exe", "os.unlink(sys.executable)", {})
    finally:
        if not os.path.lexists(exe):
            exe.symlink_to(target)
    assert_stopped(r, "cannot read the interpreter", "No such file", "tms-autopreload env")


@pytest.mark.slow  # a venv of its own (its interpreter a copy); test_exec_failure_stops_clearly keeps the path
def test_interpreter_no_longer_executable_stops_clearly(scenario):
    scn = report_host(scenario, tag="exec-fails")
    exe = scn.venv.python
    if exe.is_symlink():  # a private copy, so that changing its mode touches nothing else
        real = os.path.realpath(exe)
        exe.unlink()
        shutil.copy2(real, exe)
    with mode(exe, 0o755):
        r, _ = _with_startup_patch(scn, "chmod_exe", "os.chmod(sys.executable, 0o644)", {})
    assert_stopped(r, "cannot run the interpreter", "Permission denied", "tms-autopreload env")


def test_exec_failure_stops_clearly(scenario):
    """execve itself fails (the interpreter changed between the loader trace and the exec)."""
    scn = report_host(scenario)
    r, _ = _with_startup_patch(scn, "execve", "setattr(os, 'execve', lambda *a: (_ for _ in ()).throw("
                               "PermissionError(13, 'Permission denied')))", {})
    assert_stopped(r, "cannot re-execute", "Permission denied", "tms-autopreload env")



def test_a_stop_whose_stderr_is_gone_still_stops(scenario):
    """A stop that cannot say why (its stderr a pipe whose reader is gone: EPIPE on every write) still stops
    before user code, exit 78."""
    scn = report_host(scenario, host=("cuda13",))  # no driver: no build loads
    p = subprocess.Popen(scn.host.wrap([str(scn.venv.python), "-c", "print('user code ran')"],
                                       clean_env(SLIME_OFFLOAD_TRAIN="1")),
                         env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stderr.close()  # before the start writes anything: its every write to fd 2 fails
    out = p.stdout.read()
    assert p.wait(timeout=120) == 78 and out == b"", (p.returncode, out)


def test_a_stop_in_a_package_broken_under_the_start_says_its_reason_and_fix(scenario):
    """The module with the stop's last line (the way out) is gone while the start runs (a package removed
    or upgraded under it): the stop still says its reason and fix, once, exit 78, with no traceback; only the
    way out is missing."""
    scn = report_host(scenario, host=("cuda13",))
    stopped = scn.site / "tms_autopreload" / "stopped.py"
    saved = stopped.read_bytes()
    stopped.unlink()
    try:
        r, _ = start(scn, args=("-c", "print('user code ran')"))
    finally:
        stopped.write_bytes(saved)
    assert r.returncode == 78 and r.stdout == "" and "Traceback" not in r.stderr, r.stderr
    said = [line for line in r.stderr.splitlines() if line.startswith("tms-autopreload: ")]
    assert len(said) == 1 and "libcuda.so.1 is not found by the loader" in said[0], r.stderr
    assert "\nFix: install the NVIDIA driver" in r.stderr and WAY_OUT.strip() not in r.stderr, r.stderr


def test_a_start_whose_stdout_cannot_take_what_an_earlier_pth_printed_is_hooked(scenario):
    """Another package's ``.pth`` printed a line before ours ran, and stdout is a full device: the start's
    flush before its exec fails, and the start goes on, hooked once. The program then ends as it would
    without the flag: Python's own exit 120, its own stdout unwritable."""
    scn = report_host(scenario)
    banner = scn.site / "aa_tms_test_banner.pth"
    banner.write_text("import sys; print('a banner from another package')\n")
    probe = PROBE.replace("import json, os", "import json, os, sys").replace("print(json.dumps(",
                                                                          "sys.stderr.write(json.dumps(")
    try:
        with open("/dev/full", "w") as full:
            r, _ = start(scn, args=("-c", probe), capture_output=False, stdout=full, stderr=subprocess.PIPE, text=True)
            plain, _ = start(scn, args=("-c", "pass"), flag=False, capture_output=False, stdout=full,
                             stderr=subprocess.PIPE, text=True)
    finally:
        banner.unlink()
    out = json.loads(r.stderr[:r.stderr.index("}") + 1])
    assert out["hooks"] == [str(scn.site / CU13)] and execs(out["reexecd"]) == 1, r.stderr
    assert r.returncode == plain.returncode == 120, (r.returncode, plain.returncode, r.stderr)


def test_a_hooked_child_whose_package_breaks_under_it_stops_with_the_internal_error(scenario):
    """A child that inherits its parent's plan (the hook already mapped, the state naming it) in a package
    broken since (a module of it that raises on import, as a half-finished upgrade leaves it): what the quick
    check of the inherited plan raises is not let into site.py; the full path runs and says the error and
    where to turn, once, with no traceback, and the child stops before user code, exit 78."""
    scn = report_host(scenario, tag="broken-under-a-child")
    _, out = start(scn, args=("-c", "import json, os; print(json.dumps(dict(os.environ)))"))
    inherited = {k: v for k, v in out.items() if k in ("LD_PRELOAD", "TMS_AUTOPRELOAD_STATE", "SLIME_OFFLOAD_TRAIN")}
    assert inherited["TMS_AUTOPRELOAD_STATE"].endswith(CU13), out
    builds = scn.site / "tms_autopreload" / "builds.py"
    saved = builds.read_bytes()
    builds.write_text("raise RuntimeError('a half-finished upgrade')\n")
    try:
        r = scn.host.run([str(scn.venv.python), "-c", "print('user code ran')"],
                         clean_env(**inherited, TMS_AUTOPRELOAD_VERBOSE="1"))
    finally:
        builds.write_bytes(saved)
    assert r.returncode == 78 and r.stdout == "" and "Traceback" not in r.stderr, (r.returncode, r.stdout, r.stderr)
    said = [line for line in r.stderr.splitlines() if line.startswith("tms-autopreload: ")]
    assert said == ["tms-autopreload: internal error while resolving the preload hook: "
                    "RuntimeError('a half-finished upgrade'); run `tms-autopreload doctor` and report it"], r.stderr


@pytest.mark.parametrize("verbose", ["", "1"])
def test_a_hooked_child_whose_package_is_removed_under_it_is_hooked_still(scenario, verbose):
    """A child that inherits its parent's plan after the package's directory was removed (an uninstall while the
    job runs): it needs no module of the package, so it starts hooked and runs user code, told more
    (``TMS_AUTOPRELOAD_VERBOSE``: the build it found mapped, by its path) or not. Being told more never changes
    what a start does."""
    scn = report_host(scenario, tag="removed-under-a-child")
    _, out = start(scn, args=("-c", "import json, os; print(json.dumps(dict(os.environ)))"))
    inherited = {k: v for k, v in out.items() if k in ("LD_PRELOAD", "TMS_AUTOPRELOAD_STATE", "SLIME_OFFLOAD_TRAIN")}
    package = scn.site / "tms_autopreload"
    aside = scn.site.parent / "tms_autopreload-removed"
    package.rename(aside)
    try:
        r, out = start(scn, {**inherited, "TMS_AUTOPRELOAD_VERBOSE": verbose})
    finally:
        aside.rename(package)
    assert r.returncode == 0 and out["hooks"] == [str(scn.site / CU13)] and not out["reexecd"], (r.stderr, out)
    assert r.stderr == (f"tms-autopreload: {scn.site / CU13} is mapped (resolved for this interpreter); nothing to "
                        f"do\n" if verbose else ""), r.stderr


def _signalled_during_the_trace(scn, tmp_path, name, sig, *, before_spawn):
    """Start flagged, wait until the start-up hook is inside its loader trace, send ``sig``; return
    (the finished process, its stdout, its stderr).

    A .pth sorted before ours wraps ``os.posix_spawn`` (which starts the trace): it writes a readiness
    marker and waits, before or after starting the trace child. The signal itself is real.
    """
    ready = tmp_path / f"{name}.ready"
    wait = "__import__('time').sleep(300)"
    mark = "open(os.environ['TMS_TEST_READY'], 'w').close()"
    call = (f"({mark}, {wait}, spawn(*a, **k))[-1]" if before_spawn else
            f"(lambda pid: ({mark}, {wait}, pid)[-1])(spawn(*a, **k))")
    patch = scn.site / f"aa_tms_test_{name}.pth"
    patch.write_text(f"import os; os.environ.get('TMS_TEST_PATCH') and setattr(os, 'posix_spawn', "
                     f"(lambda spawn: lambda *a, **k: {call})(os.posix_spawn))\n")
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_TEST_PATCH="1", TMS_TEST_READY=str(ready))
    try:
        # As from a terminal: the signal's default action, whatever this runner inherited (a job started
        # in the background by a shell without job control ignores SIGINT, and so would every child).
        proc = subprocess.Popen(scn.host.wrap([str(scn.venv.python), "-c", "print('user code ran')"], env),
                                env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
        try:
            wait_for(ready, proc)
            proc.send_signal(sig)  # proc.pid is python's: unshare, sh and env exec into it
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    finally:
        patch.unlink()
    return proc, out, err


def test_interrupt_during_resolution_exits_130(scenario, tmp_path):
    """A real SIGINT while resolution waits on its loader trace: exit 130 and one message."""
    scn = report_host(scenario)
    proc, out, err = _signalled_during_the_trace(scn, tmp_path, "sigint", signal.SIGINT, before_spawn=True)
    assert_stopped(subprocess.CompletedProcess(proc.args, proc.returncode, out, err),
                   "interrupted while resolving", code=130)


def test_sigterm_during_start_ends_the_process_and_leaves_nothing(scenario, tmp_path):
    """A real SIGTERM once the loader trace child exists: the process ends by the signal, no user code
    ran, and no process of this venv is left (the trace child included)."""
    scn = report_host(scenario)
    proc, out, err = _signalled_during_the_trace(scn, tmp_path, "sigterm", signal.SIGTERM, before_spawn=False)
    assert proc.returncode == -signal.SIGTERM and out == "", (proc.returncode, out, err)
    left = subprocess.run(["pgrep", "-f", str(scn.venv.python)], capture_output=True, text=True, timeout=30)
    assert left.stdout == "", left.stdout


def test_python_S_skips_site_and_runs_unhooked(scenario):
    scn = report_host(scenario)
    r, out = start(scn, args=("-S", "-c", PROBE))
    assert r.returncode == 0 and out["hooks"] == [] and r.stderr == ""


def test_python_E_is_hooked(scenario):
    scn = report_host(scenario)
    r, out = start(scn, args=("-E", "-c", PROBE))
    assert_hooked(r, out, scn)


def test_stale_exec_marker_of_another_pid_is_ignored(scenario):
    scn = report_host(scenario)
    r, out = start(scn, {"TMS_AUTOPRELOAD_EXEC_PID": "1"})
    assert_hooked(r, out, scn)  # one exec, although the marker was set


def test_unknown_on_error_policy_warns_and_exits(scenario):
    scn = report_host(scenario, tms="0.0.9")
    r, _ = start(scn, {"TMS_AUTOPRELOAD_ON_ERROR": "ignore"})
    assert_stopped(r, "TMS_AUTOPRELOAD_ON_ERROR='ignore' is not a recognised value (use exit or warn); using exit")


def test_unknown_on_error_policy_is_warned_at_start_even_when_nothing_fails(scenario):
    scn = report_host(scenario)
    r, out = start(scn, {"TMS_AUTOPRELOAD_ON_ERROR": "wran"})
    assert_hooked(r, out, scn)
    assert r.stderr.count("TMS_AUTOPRELOAD_ON_ERROR='wran' is not a recognised value (use exit or warn); "
                          "using exit") == 1, r.stderr


# ---------------------------------------------------------------- who may be preloaded

def test_world_writable_build_is_refused(scenario):
    scn = report_host(scenario)
    with mode(scn.site / CU13, 0o777):
        r, _ = start(scn)
    assert_stopped(r, "writable by every user", "TMS_AUTOPRELOAD_PATH")


def test_world_writable_directory_is_refused(scenario, tmp_path):
    scn = report_host(scenario, layout="source13", tms="0.0.10")
    pkg = scn.site / "torch_memory_saver"
    build = scn.site / "torch_memory_saver_hook_mode_preload.abi3.so"
    moved = pkg / build.name
    shutil.move(build, moved)
    try:
        with mode(pkg, 0o777):
            r, _ = start(scn)
    finally:
        shutil.move(moved, build)
    assert_stopped(r, "writable by every user")


def test_a_build_owned_by_another_account_is_refused_naming_it(scenario):
    """A build another account owns (so can rewrite) is refused, the message naming the account as the
    system does, by uid and user name (``nobody``, whose group is ``nogroup``); an owner with no entry in the
    user database (a tarball's uid, in a container) by its number alone, refused all the same."""
    import pwd

    scn = report_host(scenario)
    build = scn.site / CU13
    unknown = next(uid for uid in range(54321, 60000) if not _has_entry(pwd.getpwuid, uid))
    before = build.stat().st_uid
    for uid, named in ((pwd.getpwnam("nobody").pw_uid, f"uid {pwd.getpwnam('nobody').pw_uid} (nobody)"),
                       (unknown, f"uid {unknown}")):
        os.chown(build, uid, -1)
        try:
            r, _ = start(scn)
        finally:
            os.chown(build, before, -1)
        assert_stopped(r, f"{build} is owned by {named}, who cannot write this environment's code")


def _has_entry(lookup, key) -> bool:
    try:
        lookup(key)
    except KeyError:
        return False
    return True


def test_world_writable_build_named_explicitly_runs_with_a_warning(scenario):
    scn = report_host(scenario)
    with mode(scn.site / CU13, 0o777) as build:
        r, out = start(scn, {"TMS_AUTOPRELOAD_PATH": str(build)})
    assert_hooked(r, out, scn)
    assert "warning: TMS_AUTOPRELOAD_PATH names a file others can change" in r.stderr


def test_pythonpath_shadow_decides_what_import_would_find(scenario, tmp_path):
    """A torch_memory_saver on PYTHONPATH is the one `import` finds, so its build is the one preloaded."""
    scn = report_host(scenario)
    shadow = tmp_path / "shadow"
    shutil.copytree(scn.site / "torch_memory_saver", shadow / "torch_memory_saver")
    shutil.copy(scn.site / CU13, shadow / CU13)
    r, out = start(scn, {"PYTHONPATH": str(shadow)})
    assert_hooked(r, out, scn, build=shadow / CU13)
    r, out = start(scn, {"PYTHONPATH": str(shadow)}, args=("-E", "-c", PROBE))  # -E: PYTHONPATH ignored
    assert_hooked(r, out, scn)


def test_current_directory_shadow_is_not_what_the_hook_uses(scenario, tmp_path):
    """At .pth time the script directory / cwd is not on sys.path yet: the site-packages build is used."""
    scn = report_host(scenario)
    shutil.copytree(scn.site / "torch_memory_saver", tmp_path / "torch_memory_saver")
    shutil.copy(scn.site / CU13, tmp_path / CU13)
    r, out = start(scn, cwd=tmp_path)
    assert_hooked(r, out, scn)


def test_no_flag_is_unchanged_even_in_a_hostile_environment(scenario):
    scn = report_host(scenario)
    env = clean_env(LD_PRELOAD="/gone/torch_memory_saver_x.so", TMS_AUTOPRELOAD_STATE="junk",
                    TMS_AUTOPRELOAD_EXEC_PID="1")
    code = "import json, os, sys; print(json.dumps([dict(os.environ), sorted(m for m in sys.modules if 'tms' in m)]))"
    r = scn.host.run([str(scn.venv.python), "-c", code], env)
    got_env, modules = json.loads(r.stdout)
    assert got_env == env and modules == []


# ---------------------------------------------------------------- load

LOAD = r"""
import json, os, subprocess, sys
python, n, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
env = dict(os.environ)
procs = [subprocess.Popen([python, '-c', code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
         for _ in range(n)]
res = []
for p in procs:
    try:
        out, err = p.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        p.kill(); out, err = p.communicate(); res.append({'rc': 'hung'}); continue
    res.append({'rc': p.returncode, 'out': out, 'err': err})
print(json.dumps(res))
"""


def _storm(scn, env, n=200):
    import sys

    r = scn.host.run([sys.executable, "-c", LOAD, str(scn.venv.python), str(n), PROBE], clean_env(**env), timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout)


@pytest.mark.slow  # 200 starts: a stress test, not the edit loop
def test_storm_of_200_flagged_starts_all_hooked_once(scenario):
    scn = report_host(scenario)
    res = _storm(scn, {"SLIME_OFFLOAD_TRAIN": "1"})
    assert [x["rc"] for x in res] == [0] * 200
    outs = [json.loads(x["out"]) for x in res]
    assert all(out["hooks"] == [str(scn.site / CU13)] for out in outs)
    assert [execs(out["reexecd"]) for out in outs] == [1] * 200  # zero loops, zero skipped


@pytest.mark.slow  # 200 starts: a stress test, not the edit loop
def test_storm_of_200_failing_starts_all_stop_clearly(scenario):
    scn = report_host(scenario, host=("cuda13",))  # no driver: every verification fails
    res = _storm(scn, {"SLIME_OFFLOAD_TRAIN": "1"})
    assert [x["rc"] for x in res] == [78] * 200
    for x in res:
        assert_stopped(subprocess.CompletedProcess([], x["rc"], x["out"], x["err"]), "libcuda.so.1")


def test_a_preload_entry_that_torch_memory_saver_counts_as_its_own_is_dropped_and_said(scenario, tmp_path):
    """0.0.10's check counts every LD_PRELOAD entry whose path holds "torch_memory_saver" (its own
    ``get_path_binary``, run here) and refuses more than one: the one answer to "is this a torch_memory_saver
    build" (tms_autopreload.environment.is_tms_entry). A user's entry from such a path (a work directory named after it)
    cannot stay beside the hook: the plan drops it, its check accepts the process, and the start and doctor
    say what was lost, with the fix; the same file elsewhere is kept and nothing is said."""
    scn = report_host(scenario, tms="0.0.10")
    for folder, counted in (("torch_memory_saver_work", True), ("work", False)):
        (tmp_path / folder).mkdir()
        entry = tmp_path / folder / "libstdbuf.so"
        shutil.copy("/usr/libexec/coreutils/libstdbuf.so", entry)
        r = scn.flagged(REAL_CHECK + "print(os.environ['LD_PRELOAD'])", {"LD_PRELOAD": str(entry)})
        assert r.returncode == 0, r.stderr
        accepted, preload = r.stdout.strip().splitlines()[-2:]
        assert accepted == "accepted", (folder, r.stdout)
        assert (str(entry) in preload.split(":")) is not counted, (folder, preload)
        warned = [w for w in scn.doctor({"LD_PRELOAD": str(entry)})["warnings"] if "counts every entry" in w]
        assert bool(warned) is counted, (folder, warned)
        assert (f"warning: LD_PRELOAD loses {entry}: torch_memory_saver's check counts" in r.stderr) is counted
        assert ("move that file to a path without those words" in r.stderr) is counted
