"""A file named by ``TMS_AUTOPRELOAD_PATH`` is judged as the start judges it, and as torch_memory_saver's own
check will: ``doctor``, ``doctor --deep``, a flagged start in exec and in dlopen mode all agree.

* One answer to "is this a torch_memory_saver build" (:func:`tms_autopreload.environment.is_tms_entry`): the words
  ``torch_memory_saver`` anywhere in the path, as 0.0.10's check counts its entries (and 0.0.8 to 0.0.9.post1
  look for them in the whole value). A copy of the real cu13 build at ``builds/hook_cu13.so`` would be
  refused by that check in every process: it is refused here, everywhere, with cause ``bad-forced-path``.
* A symbolic link whose name holds the words, to a build whose path does not: LD_PRELOAD names the link
  (what the check reads), /proc/self/maps the target. The start knows the mapped file by what it is
  (device and inode), so the process is hooked, once, and torch_memory_saver's real check accepts it.
* A build known to intercept nothing (``hook_mode_torch``, a pluggable allocator that defines none of
  libcudart's symbols) is ``bad-forced-path``.
* A re-executed start says "LD_PRELOAD was dropped" only where it was.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest
from conftest import MODES, mode_env, report_host
from support import MAPPED, REAL_CHECK, REEXECD, assert_stopped, clean_env, execs, hash_outside

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
TORCH_MODE = "torch_memory_saver_hook_mode_torch_cu13.abi3.so"
PROBE = REEXECD + MAPPED + "import json, os; print(json.dumps([reexecd(), mapped('hook'), os.environ['LD_PRELOAD']]))"


@pytest.fixture
def scn(scenario):
    return report_host(scenario, tms="0.0.10")


def doctor(scn, env, *args):
    r = scn.run(["-m", "tms_autopreload", "doctor", *args], env)
    return r, (json.loads(r.stdout) if "--json" in args else None)


@pytest.mark.parametrize("mode", [MODES[0], pytest.param(MODES[1], marks=pytest.mark.slow)])
def test_a_copy_without_the_words_in_its_path_is_refused_everywhere(scn, tmp_path, mode):
    forced = tmp_path / "builds" / "hook_cu13.so"
    forced.parent.mkdir()
    shutil.copy(scn.site / CU13, forced)
    env = {"TMS_AUTOPRELOAD_PATH": str(forced)}
    r, doc = doctor(scn, env, "--json")
    assert r.returncode == 1 and doc["cause"] == "bad-forced-path", doc
    headline = doc["error"].partition(". Fix: ")[0]
    assert headline == (f"TMS_AUTOPRELOAD_PATH={str(forced)!r} has no \"torch_memory_saver\" in its path, so "
                        f"torch_memory_saver's own check (which finds its build in LD_PRELOAD by those words) would "
                        f"refuse every process preloading it"), doc["error"]
    link = forced.parent / "torch_memory_saver_hook_cu13.so"
    assert doc["fix"].endswith(f"`ln -s {forced} {link} && export TMS_AUTOPRELOAD_PATH={link}`"), doc["fix"]
    deep = scn.run(["-m", "tms_autopreload", "doctor", "--deep", "--json"], env)
    assert deep.returncode == 1 and "has no \"torch_memory_saver\" in its path" in json.loads(deep.stdout)["error"]
    message = assert_stopped(scn.flagged("print('user code ran')", {**env, **mode_env(mode)}), verbose=True)
    assert f"tms-autopreload: {headline}" in message and "drops or rewrites LD_PRELOAD" not in message, message
    # The fix, pasted where it was printed (the flag and the path exported), then the start is hooked.
    fix = doc["fix"].split("`")[-2]
    r = scn.host.run(["sh", "-c", f"{fix}; {scn.venv.python} -c 'print(1)'"],
                     clean_env(SLIME_OFFLOAD_TRAIN="1", **env, **mode_env(mode)))
    assert r.returncode == 0 and r.stdout == "1\n", r.stderr


@pytest.mark.parametrize("mode", [MODES[0], pytest.param(MODES[1], marks=pytest.mark.slow)])
def test_a_link_whose_name_holds_the_words_is_hooked_and_accepted_by_its_check(scn, tmp_path, mode):
    """Its target's path lacks the words (a build kept under another name); /proc/self/maps names the target."""
    target = tmp_path / "builds" / "hook_cu13.so"
    target.parent.mkdir()
    shutil.copy(scn.site / CU13, target)
    link = tmp_path / "torch_memory_saver_hook.so"
    link.symlink_to(target)
    env = {"TMS_AUTOPRELOAD_PATH": str(link), **mode_env(mode)}
    r, doc = doctor(scn, env, "--json")
    assert r.returncode == 0 and doc["plan"]["build"] == str(link), doc["error"]
    r = scn.flagged(PROBE, env)
    assert r.returncode == 0, r.stderr
    reexecd, hooks, preload = json.loads(r.stdout.strip().splitlines()[-1])
    assert hooks == [str(target)] and preload.split(":")[0] == str(link), (hooks, preload)
    assert execs(reexecd) == (1 if mode == "exec" else 0) and "still not" not in r.stderr, r.stderr
    check = scn.flagged(REAL_CHECK, env)
    assert check.returncode == 0 and check.stdout.strip().splitlines()[-1] == "accepted", check.stderr
    deep = scn.run(["-m", "tms_autopreload", "doctor", "--deep", "--json", "--import", "ctypes"], env)
    assert json.loads(deep.stdout)["hook_mapped"], deep.stdout


@pytest.mark.parametrize("mode", [MODES[0], pytest.param(MODES[1], marks=pytest.mark.slow)])
def test_a_build_that_intercepts_nothing_is_refused(scn, mode):
    """0.0.10's ``hook_mode_torch`` build links libcudart.so.13 but defines none of its symbols."""
    env = {"TMS_AUTOPRELOAD_PATH": str(scn.site / TORCH_MODE), **mode_env(mode)}
    r, doc = doctor(scn, env, "--json")
    assert r.returncode == 1 and doc["cause"] == "bad-forced-path", doc
    assert "defines nothing that" in doc["error"] and "intercepts no call" in doc["error"], doc["error"]
    assert doc["fix"].startswith("`unset TMS_AUTOPRELOAD_PATH` (or point it at a preload build"), doc["fix"]
    assert_stopped(scn.flagged("print('user code ran')", env), "defines nothing that", verbose=True)


def test_doctor_prints_interposes_nothing_and_unknown_apart():
    from tms_autopreload.commands.doctor.document import text

    row = {"path": "/s/b.so", "target": "CUDA 13", "loads": True, "status": "rejected", "reason": "r"}
    doc = {"executable": "/v/bin/python", "torch_memory_saver_dir": "/s/torch_memory_saver", "runtime": None,
           "driver": None, "warnings": [], "plan": None, "error": "e",
           "candidates": [{**row, "interposes": []}, {**row, "path": "/s/c.so", "interposes": None},
                          {**row, "path": "/s/d.so", "interposes": ["cudaFree", "cudaMalloc"]}]}
    table = {line.split()[0]: line for line in text(doc).splitlines() if line.startswith(("b.so", "c.so", "d.so"))}
    assert " none " in table["b.so"] and " unknown " in table["c.so"] and " cudaFree, cudaMalloc " in table["d.so"]


@pytest.mark.parametrize("case", ["dropped", "named-not-mapped", "mapped-not-alone"])
def test_a_reexecuted_start_says_what_happened_to_its_preload(scn, tmp_path, case):
    """The marker says this PID re-executed for the build the state names: the message says whether LD_PRELOAD
    lost it (a launcher cleaned the environment), kept it while the loader did not map it, or mapped it
    beside another build."""
    prefix = scn.run(["-c", "import sys; print(sys.prefix)"]).stdout.strip()
    build = {"dropped": scn.site / CU13, "named-not-mapped": tmp_path / "gone" / "torch_memory_saver_x.so",
             "mapped-not-alone": scn.site / CU13}[case]
    preload = {"dropped": "", "named-not-mapped": str(build),
               "mapped-not-alone": f"{build}:{scn.site / TORCH_MODE}"}[case]
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_AUTOPRELOAD_STATE=f"{prefix}::::::{build}")
    # bash's $$ becomes python's PID through exec; LD_PRELOAD is set for python alone.
    argv = ["bash", "-c", f'LD_PRELOAD="{preload}" TMS_AUTOPRELOAD_EXEC_PID=$$ exec "{scn.venv.python}" -c "print(1)"']
    r = subprocess.run(scn.host.wrap(argv, env), env=clean_env(), capture_output=True, text=True, timeout=60)
    message = assert_stopped(r, "not trying again")
    said = {"dropped": "no longer names it", "named-not-mapped": "although LD_PRELOAD still names it",
            "mapped-not-alone": "it is mapped, but not alone"}
    for name, words in said.items():
        assert (words in message) is (name == case), (case, message)
    assert os.path.basename(str(build)) in message


def test_a_build_whose_symbol_table_cannot_be_read_is_preloaded_with_what_it_intercepts_unknown(scn, tmp_path):
    """The build the variable names loads (the loader reads its DT_GNU_HASH), but its DT_HASH points outside it,
    so what it defines cannot be read: ``doctor`` chooses it with a warning that names it and says why, and its
    row says ``unknown``; ``doctor --deep`` proves nothing and says what it could not read; a flagged start in
    dlopen mode, which must know what the hook defines before it loads it in-process, falls back to exec and is
    hooked, once."""
    forced = hash_outside(scn.site / CU13, tmp_path / "torch_memory_saver_hook_cu13.so")
    env = {"TMS_AUTOPRELOAD_PATH": str(forced)}
    r, doc = doctor(scn, env, "--json")
    assert r.returncode == 0 and doc["plan"]["build"] == str(forced), r.stdout + r.stderr
    library, why = doc["runtime"]["library"], "DT_HASH is not inside any PT_LOAD segment"
    assert doc["warnings"] == [f"TMS_AUTOPRELOAD_PATH={str(forced)!r}: what it intercepts is unknown (the symbol "
                               f"tables of it and {library} cannot be read: {why}); preloading it anyway"], doc
    assert [c["interposes"] for c in doc["candidates"]] == [None], doc["candidates"]
    deep = scn.run(["-m", "tms_autopreload", "doctor", "--deep", "--json", "--import", "json"], env)
    said = json.loads(deep.stdout)
    assert deep.returncode == 1 and said["ok"] is False, deep.stdout + deep.stderr
    assert said["error"] == f"cannot read the symbol tables of {forced} and {library}: {why}", said
    r = scn.flagged(PROBE, {**env, **mode_env("dlopen")})
    reexecd, hooks, preload = json.loads(r.stdout)
    assert r.returncode == 0 and execs(reexecd) == 1 and hooks == [str(forced)] and preload == str(forced), r.stderr
    assert (f"dlopen mode: cannot read the symbols of {forced} and {library}: {why}; falling back to exec"
            in r.stderr), r.stderr
