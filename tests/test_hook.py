"""The installed start-up hook, from venvs holding the built wheel, on every CPython 3.10-3.15:
this machine's 3.10-3.13, and Debian's 3.13 (trixie, glibc 2.41), 3.14 and 3.15 (sid, glibc 2.43) in
their own root file systems; the seed's case and spawn children also on aarch64 (trixie for arm64, emulated).

Evidence of what the hook did comes from the process itself: ``/proc/self/maps``, its PID, argv,
flags, environment, and whether its image was started by the hook's re-exec (``support.REEXECD``,
from ``/proc/self/environ``). ``TMS_AUTOPRELOAD_VERBOSE=1`` adds one line per decision, for the
record and for the decisions that leave no other trace (``is mapped`` after an exec).
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap

import pytest
from conftest import AARCH64, ROOTFS_PYTHONS, assert_applied, report_host
from conftest import python_version as version
from support import MAPPED, REEXECD, assert_stopped, execs

PYTHONS = ["3.10", "3.11", "3.12", "3.13", *ROOTFS_PYTHONS]
CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

REPORT = REEXECD + MAPPED + """
import json, os, sys
maps = mapped('torch_memory_saver')
print(json.dumps({'pid': os.getpid(), 'orig_argv': sys.orig_argv, 'argv': sys.argv, 'cwd': os.getcwd(),
                  'isolated': sys.flags.isolated, 'utf8': sys.flags.utf8_mode, 'warnoptions': sys.warnoptions,
                  'write_through': getattr(sys.stdout, 'write_through', None), 'maps': maps,
                  'stdin': sys.stdin.read() if not sys.stdin.isatty() else None,
                  'modules': sorted(m for m in sys.modules if m.startswith('tms_autopreload')),
                  'env': dict(os.environ), 'reexecd': reexecd()}))
"""


def start(scn, argv, env=None, stdin=None, cwd=None, verbose=True, flag="SLIME_OFFLOAD_TRAIN"):
    """Start the venv's python under the host; return (pid seen by the parent, report, stderr, rc)."""
    full = dict(env or {})
    if flag:
        full.setdefault(flag, "1")
    if verbose:
        full.setdefault("TMS_AUTOPRELOAD_VERBOSE", "1")
    from support import clean_env

    proc = subprocess.Popen(scn.host.wrap([str(scn.venv.python), *argv], clean_env(**full)), env=clean_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=cwd)
    try:
        out, err = proc.communicate(stdin, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    report = json.loads(out.strip().splitlines()[-1]) if proc.returncode == 0 and out.strip() else None
    return proc.pid, report, err, proc.returncode


def hook_lines(err, word):
    return [line for line in err.splitlines() if line.startswith("tms-autopreload:") and word in line]


# ---------------------------------------------------------------- the seed, side by side

@pytest.mark.parametrize("python", [*PYTHONS, AARCH64])
def test_slime_2186_side_by_side(scenario, python):
    scn = report_host(scenario, python)
    # slime today: first existing of (cu12, unsuffixed) -> cu12 -> every child dies with 127.
    slime_pick = str(scn.site / CU12)
    r = scn.host.run(["bash", "-c", "true"], {"PATH": os.environ["PATH"], "LD_PRELOAD": slime_pick})
    assert r.returncode == 127
    assert "error while loading shared libraries: libcudart.so.12: cannot open shared object file" in r.stderr
    # The flag instead: the same process starts hooked with cu13, and its bash child runs.
    code = REPORT.replace("import json, os, sys", "import json, os, subprocess, sys\n"
                          "assert subprocess.run(['bash', '-c', 'true']).returncode == 0")
    pid, rep, err, rc = start(scn, ["-c", code])
    assert rc == 0, err
    assert rep["maps"] == [str(scn.site / CU13)] and execs(rep["reexecd"]) == 1


# ---------------------------------------------------------------- argv, flags, PID, cwd, stdin

HOW = ["-c", "-m", "script", "stdin-script", "-X", "-u", "-I", "-W"]


@pytest.mark.parametrize("python", PYTHONS)
@pytest.mark.parametrize("how", HOW)
def test_exec_preserves_the_process(scenario, tmp_path, python, how, mode):
    """Parity: the same process in both TMS_AUTOPRELOAD_MODEs, exec'd once or loaded in-process."""
    scn = report_host(scenario, python)
    (tmp_path / "probe_mod.py").write_text(REPORT)
    (tmp_path / "probe.py").write_text(REPORT)
    stdin = "data for the program\n"
    argv = {
        "-c": ["-c", REPORT, "a1", "a 2"],
        "-m": ["-m", "probe_mod", "a1", "a 2"],
        "script": [str(tmp_path / "probe.py"), "a1", "a 2"],
        "stdin-script": ["-", "a1", "a 2"],
        "-X": ["-X", "utf8", "-c", REPORT, "a1", "a 2"],
        "-u": ["-u", "-c", REPORT, "a1", "a 2"],
        "-I": ["-I", "-c", REPORT, "a1", "a 2"],
        "-W": ["-W", "error::DeprecationWarning", "-c", REPORT, "a1", "a 2"],
    }[how]
    if how == "stdin-script":
        stdin = REPORT  # the program itself comes on stdin, unread at .pth time
    pid, rep, err, rc = start(scn, argv, env={"TMS_AUTOPRELOAD_MODE": mode}, stdin=stdin, cwd=tmp_path)
    assert rc == 0, err
    assert_applied(mode, rep["reexecd"], rep["maps"], scn.site / CU13)
    assert len(hook_lines(err, "is mapped")) == (1 if mode == "exec" else 0), err
    assert rep["pid"] == pid  # what the parent started: an exec keeps it, so this says nothing about execs
    assert rep["orig_argv"][1:] == argv
    assert rep["argv"][1:] == ["a1", "a 2"]
    assert rep["cwd"] == str(tmp_path)
    if how != "stdin-script":
        assert rep["stdin"] == stdin
    assert rep["utf8"] == (1 if how == "-X" or version(python) >= (3, 15) else 0)  # PEP 686: default from 3.15
    assert rep["isolated"] == (1 if how == "-I" else 0)
    assert rep["write_through"] is (how == "-u")
    assert rep["warnoptions"] == (["error::DeprecationWarning"] if how == "-W" else [])
    assert rep["env"]["LD_PRELOAD"].endswith(CU13) and "TMS_AUTOPRELOAD_EXEC_PID" not in rep["env"]


# ---------------------------------------------------------------- once, and only once

@pytest.mark.parametrize("python", PYTHONS)
def test_pth_runs_twice_per_start_but_hook_acts_once(scenario, tmp_path, python):
    scn = report_host(scenario, python)
    counter = tmp_path / "count"
    (scn.site / "aa_tms_test_counter.pth").write_text(
        "import os; p = os.environ.get('TMS_TEST_PTH_COUNTER'); p and open(p, 'a').write('x')\n")
    try:
        pid, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_TEST_PTH_COUNTER": str(counter)})
    finally:
        (scn.site / "aa_tms_test_counter.pth").unlink()
    assert rc == 0, err
    runs = len(counter.read_text())
    # The counter sorts before tms_autopreload.pth. The first start counts once: our .pth re-execs it
    # during the first scan of site-packages. The exec'd start scans twice in a venv on 3.10-3.14
    # (1 + 2); from 3.15 on, site.py reads each site directory's .pth files once (PEP 829): 1 + 1.
    scans = 1 if version(python) >= (3, 15) else 2
    assert runs == 1 + scans, runs
    assert execs(rep["reexecd"]) == 1 and rep["maps"] == [str(scn.site / CU13)]
    assert len(hook_lines(err, "is mapped")) == 1, err


def test_a_hooked_child_imports_no_module_of_the_package_and_the_entry_runs_once(scenario, mode):
    """The start module holds its own copy of the entry and the rules it reads (tools/pthfile.py): a child of a
    hooked process, and in exec mode the hooked process after its re-exec, imports no module of the package
    (in dlopen mode the first start loaded the plan with the package). The package's own entry, called after
    the start module's copy ran, does nothing: one mark between them (``sys.tms_autopreload_started``), so a
    child told to say what the hook does (``TMS_AUTOPRELOAD_VERBOSE``, which imports what names the build)
    says it once."""
    scn = report_host(scenario)
    child = ("import json, sys; before = sorted(m for m in sys.modules if m.startswith('tms_'))\n"
             "import tms_autopreload; tms_autopreload.process_startup()\n"
             "print(json.dumps([before, sys.tms_autopreload_started]))")
    code = REPORT.replace("print(json.dumps({", textwrap.dedent(f"""
        import subprocess
        kids = [subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True,
                               env={{**os.environ, **extra}}) for extra in ({{}}, {{'TMS_AUTOPRELOAD_VERBOSE': '1'}})]
        print(json.dumps({{'children': [(json.loads(k.stdout), k.stderr) for k in kids], """).strip("\n") + " ", 1)
    _, rep, err, rc = start(scn, ["-c", code], env={"TMS_AUTOPRELOAD_MODE": mode}, verbose=False)
    assert rc == 0, err
    assert_applied(mode, rep["reexecd"], rep["maps"], scn.site / CU13)
    assert (rep["modules"] == []) is (mode == "exec"), rep["modules"]
    (quiet, said), (loud, told) = rep["children"]
    assert quiet == [[], True] and said == "", (quiet, said)
    assert loud[1] is True and len(hook_lines(told, "resolved for this interpreter")) == 1, told


@pytest.mark.parametrize("python", PYTHONS)
def test_loop_guard_stops_with_a_clear_error(scenario, python):
    """An exec'd PID whose hook is still not mapped stops; it never execs again."""
    scn = report_host(scenario, python)
    from support import clean_env

    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_AUTOPRELOAD_VERBOSE="1")
    # bash's $$ becomes python's PID through exec: the marker says "this PID already re-exec'd".
    argv = ["bash", "-c", f'TMS_AUTOPRELOAD_EXEC_PID=$$ exec "{scn.venv.python}" -c "print(1)"']
    r = subprocess.run(scn.host.wrap(argv, env), env=clean_env(), capture_output=True, text=True, timeout=60)
    # A second exec would start python with the hook mapped, and it would print 1 and exit 0.
    assert_stopped(r, "it is not mapped", "no longer names it", "not trying again")


@pytest.mark.parametrize("python", PYTHONS)
def test_inherited_build_from_another_venv_is_replaced(scenario, python):
    a = report_host(scenario, python)
    b = scenario(tms="0.0.10", torch="cu13-sys", host=("driver", "cuda13"), python=python)
    _, rep_a, err, rc = start(a, ["-c", REPORT])
    assert rc == 0, err
    inherited = {k: v for k, v in rep_a["env"].items() if k.startswith(("LD_", "TMS_"))}
    _, rep_b, err, rc = start(b, ["-c", REPORT], env=inherited)
    assert rc == 0, err
    assert rep_b["maps"] == [str(b.site / CU13)], rep_b["maps"]
    assert rep_b["env"]["LD_PRELOAD"] == str(b.site / CU13)
    assert execs(rep_b["reexecd"]) == 1


@pytest.mark.parametrize("python", PYTHONS)
def test_inherited_wrong_major_is_replaced(scenario, python):
    scn = scenario(tms="0.0.9.post1", torch="cu13-sys", host=("driver", "cuda12", "cuda13"), python=python)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"LD_PRELOAD": str(scn.site / CU12)})
    assert rc == 0, err
    assert rep["maps"] == [str(scn.site / CU13)]
    assert execs(rep["reexecd"]) == 1


def test_right_build_preset_is_not_reexecuted(scenario):
    scn = report_host(scenario)
    pid, rep, err, rc = start(scn, ["-c", REPORT], env={"LD_PRELOAD": f"{scn.site / CU13}"})
    assert rc == 0, err
    assert execs(rep["reexecd"]) == 0 and rep["maps"] == [str(scn.site / CU13)]
    assert len(hook_lines(err, "already mapped")) == 1, err
    assert rep["env"]["TMS_AUTOPRELOAD_STATE"].endswith(CU13)


@pytest.mark.parametrize("python", [*PYTHONS, AARCH64])
def test_spawn_children_inherit_and_do_not_reexec(scenario, python, mode):
    scn = report_host(scenario, python)
    code = REEXECD + MAPPED + textwrap.dedent("""
        import json, multiprocessing as mp, os
        def child(q):
            q.put((reexecd(), mapped('torch_memory_saver')))
        if __name__ == '__main__':
            ctx = mp.get_context('spawn')
            q = ctx.Queue()
            ps = [ctx.Process(target=child, args=(q,)) for _ in range(3)]
            [p.start() for p in ps]
            got = [q.get(timeout=60) for _ in ps]
            [p.join() for p in ps]
            print(json.dumps({'codes': [p.exitcode for p in ps], 'children': got, 'reexecd': reexecd(),
                              'maps': mapped('torch_memory_saver')}))
    """)
    script = scn.venv.path / "spawner.py"
    script.write_text(code)
    _, rep, err, rc = start(scn, [str(script)], env={"TMS_AUTOPRELOAD_MODE": mode})
    assert rc == 0, err
    assert rep["codes"] == [0, 0, 0]
    assert [maps for _, maps in rep["children"]] == [[str(scn.site / CU13)]] * 3, rep["children"]
    assert_applied(mode, rep["reexecd"], rep["maps"], scn.site / CU13)  # the parent ...
    assert execs(*(reexecd for reexecd, _ in rep["children"])) == 0  # ... and no child
    # the 3 children and multiprocessing's resource tracker (and in exec mode the parent after its exec)
    assert len(hook_lines(err, "resolved for this interpreter")) == (1 if mode == "exec" else 0) + 3 + 1


# ---------------------------------------------------------------- no flag: nothing at all

@pytest.mark.parametrize("python", PYTHONS)
def test_no_flag_changes_nothing(scenario, python):
    scn = report_host(scenario, python)
    from support import clean_env

    pid, rep, err, rc = start(scn, ["-c", REPORT, "x"], flag=None, verbose=False)
    assert rc == 0 and err == ""
    assert rep["pid"] == pid and rep["argv"] == ["-c", "x"] and rep["maps"] == []
    assert rep["modules"] == []  # the .pth line imported nothing
    assert rep["env"] == clean_env()


@pytest.mark.parametrize("value", ["0", "false", "off", "no", ""])
def test_false_flags_are_off(scenario, value):
    scn = report_host(scenario)
    pid, rep, err, rc = start(scn, ["-c", REPORT], env={"SLIME_OFFLOAD_TRAIN": value}, verbose=False)
    assert rc == 0 and err == "" and rep["maps"] == [] and "TMS_INIT_ENABLE" not in rep["env"]


def test_odd_flag_value_warns_and_is_off(scenario):
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_AUTOPRELOAD": "maybe"}, flag=None)
    assert rc == 0 and rep["maps"] == []
    assert err.count("\n") == 1 and "TMS_AUTOPRELOAD='maybe' is not a recognised value" in err


# A value outside each variable's words (docs/reference.md), on a flagged start that is hooked all the same.
ODD_VALUES = [("SLIME_OFFLOAD_TRAIN", "banana", "1/true/yes/on or 0/false/no/off", "off"),
              ("TMS_AUTOPRELOAD_VERBOSE", "ture", "1/true/yes/on or 0/false/no/off", "off"),
              ("TMS_AUTOPRELOAD_MODE", "fork", "exec or dlopen", "exec"),
              ("TMS_AUTOPRELOAD_ON_ERROR", "wran", "exit or warn", "exit")]


@pytest.mark.parametrize("name, value, accepted, used", ODD_VALUES, ids=[v[0] for v in ODD_VALUES])
def test_odd_value_of_a_flagged_start_is_warned_once_not_again_after_the_exec(scenario, name, value, accepted,
                                                                              used):
    """Every variable a user sets warns alike: a value outside its words is said once per start, in the
    package's one wording, before the exec and not again in the image it starts, and taken as its default
    (a misspelt ``TMS_AUTOPRELOAD_VERBOSE`` is off: the warning is all that start says)."""
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_AUTOPRELOAD": "1", name: value}, flag=None,
                            verbose=False)
    assert rc == 0 and rep["maps"] == [str(scn.site / CU13)] and execs(rep["reexecd"]) == 1, err
    assert err == (f"tms-autopreload: warning: {name}={value!r} is not a recognised value (use {accepted}); "
                   f"using {used}\n"), err


@pytest.mark.parametrize("value", ["ture", "banana", " 2 ", "disable"])
def test_kill_switch_fails_safe(scenario, value):
    """Any TMS_AUTOPRELOAD_DISABLE but the off words turns the hook off: a misspelt ``true`` disables, with
    one warning naming the value and what it meant; nothing is mapped, nothing re-exec'd."""
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_DISABLE": value},
                            flag=None, verbose=False)
    assert rc == 0 and rep["maps"] == [] and execs(rep["reexecd"]) == 0, err
    assert err == (f"tms-autopreload: warning: TMS_AUTOPRELOAD_DISABLE={value!r} is not a recognised value (use "
                   f"1/true/yes/on or 0/false/no/off); using on (the hook is off)\n"), err


def test_repair_tools_pass_the_kill_switch_to_their_children_and_the_own_command_does_not(scenario, tmp_path):
    """A flagged start of a program the package never hooks is left alone; a repair tool (a ``pip`` console
    script, known by its name and what it imports) gets TMS_AUTOPRELOAD_DISABLE=1 for its children (a build
    backend), while ``tms-autopreload`` itself does not: it answers for its caller's environment, hook on."""
    scn = report_host(scenario)
    for name, marker, disabled in (("pip", "from pip._internal.cli.main import main", "1"),
                                   ("tms-autopreload", "from tms_autopreload.commands.main import main", None)):
        script = tmp_path / name
        script.write_text(f"# {marker}  (what the launcher imports; not run here)\n{REPORT}")
        _, rep, err, rc = start(scn, [str(script)], flag="TMS_AUTOPRELOAD", verbose=False)
        assert rc == 0 and err == "", (name, err)
        assert rep["maps"] == [] and execs(rep["reexecd"]) == 0, (name, rep)
        assert rep["env"].get("TMS_AUTOPRELOAD_DISABLE") == disabled, (name, rep["env"])


def test_disable_beats_everything(scenario):
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_AUTOPRELOAD_DISABLE": "1", "TMS_AUTOPRELOAD": "1"})
    assert rc == 0 and rep["maps"] == [] and err == ""


def test_generic_flag_sets_only_the_preload(scenario):
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], flag="TMS_AUTOPRELOAD")
    assert rc == 0, err
    assert rep["maps"] == [str(scn.site / CU13)] and execs(rep["reexecd"]) == 1
    assert "TMS_INIT_ENABLE" not in rep["env"]


def test_slime_defaults_do_not_override_user_values(scenario):
    scn = report_host(scenario)
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_INIT_ENABLE_CPU_BACKUP": "0"})
    assert rc == 0, err
    assert rep["env"]["TMS_INIT_ENABLE"] == "1" and rep["env"]["TMS_INIT_ENABLE_CPU_BACKUP"] == "0"


# ---------------------------------------------------------------- failures

def test_on_error_warn_continues_unhooked(scenario):
    scn = scenario(tms="0.0.9", torch="cu13-sys", host=("driver", "cuda13"))
    _, rep, err, rc = start(scn, ["-c", REPORT], env={"TMS_AUTOPRELOAD_ON_ERROR": "warn"})
    assert rc == 0 and rep["maps"] == []
    assert "continuing without the hook" in err and "Traceback" not in err


def test_not_a_python_executable_is_hooked_in_process(scenario):
    """Run through ld.so itself: /proc/self/exe is the loader, so a re-exec would not repeat this start.
    The hook is loaded in-process instead (dlopen mode), with no exec."""
    scn = report_host(scenario)
    from support import clean_env

    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_AUTOPRELOAD_VERBOSE="1")
    r = subprocess.run(scn.host.wrap(["/lib64/ld-linux-x86-64.so.2", str(scn.venv.python), "-c", REPORT], env),
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    assert_applied("dlopen", rep["reexecd"], rep["maps"], scn.site / CU13)
    assert rep["env"]["LD_PRELOAD"] == str(scn.site / CU13) and rep["env"]["TMS_INIT_ENABLE"] == "1"


def test_not_a_python_executable_that_cannot_load_in_process_stops_clearly(scenario, parts):
    """The same, with cudaMalloc already defined in the global scope (an earlier preload): neither an
    exec nor an in-process load can hook it as LD_PRELOAD would, so it stops with the fix."""
    scn = report_host(scenario)
    from support import cc, clean_env

    toy = parts.root / "deps" / "libdefines_cudamalloc.so"
    if not toy.exists():
        cc(toy, "int cudaMalloc(void **p, unsigned long n) { return 2; }\n")
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", LD_PRELOAD=str(toy))
    r = subprocess.run(scn.host.wrap(["/lib64/ld-linux-x86-64.so.2", str(scn.venv.python), "-c", "print(1)"], env),
                       env=clean_env(), capture_output=True, text=True, timeout=60)
    assert_stopped(r, "embedded in another program", "cudaMalloc is already defined", "tms-autopreload env")


def test_keeps_other_preloads_in_order_and_warns_for_old_tms(scenario, parts):
    scn = report_host(scenario)
    libs = [parts.root / "deps" / "extra1.so", parts.root / "deps" / "extra2.so"]
    from support import cc

    for lib in libs:
        if not lib.exists():
            cc(lib, "int extra_lib(void) { return 0; }\n")
    _, rep, err, rc = start(scn, ["-c", REPORT],
                            env={"LD_PRELOAD": f"{libs[0]} /gone/torch_memory_saver_old.so:{libs[1]}"})
    assert rc == 0, err
    assert rep["env"]["LD_PRELOAD"] == f"{scn.site / CU13}:{libs[0]}:{libs[1]}"
    assert "reads LD_PRELOAD as a single path" in err  # 0.0.9.post1's CDLL(LD_PRELOAD) would refuse this
