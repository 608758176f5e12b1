"""The command line: every command, its output format and exit codes, on the host of slime #2186
(CUDA 13, a cu12 build beside the cu13 one)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest
from conftest import AARCH64, DEFAULT_PYTHON, MODES, ROOTFS_PYTHONS, assert_applied, mode_env, report_host
from support import MAPPED, REEXECD, ROOT, clean_env

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"


def cli(scn, *args, env=None):
    return scn.run(["-m", "tms_autopreload", *args], env)


def test_run_execs_a_non_python_command_with_the_hook_mapped(scenario):
    scn = report_host(scenario)
    r = cli(scn, "run", "--", "bash", "-c", 'grep -o "[^ ]*torch_memory_saver[^ ]*" /proc/$$/maps | sort -u')
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == [str(scn.site / CU13)]


def test_run_exit_codes(scenario):
    scn = report_host(scenario)
    assert cli(scn, "run", "--", "bash", "-c", "exit 7").returncode == 7
    r = cli(scn, "run", "--", "no-such-command-xyz")
    assert r.returncode == 127 and "command not found" in r.stderr
    r = cli(scn, "run")
    assert r.returncode == 2 and "give a command" in r.stderr


def test_env_output_evals_to_the_chosen_build_and_its_json_says_the_same(scenario):
    scn = report_host(scenario)
    r = cli(scn, "env")
    assert r.returncode == 0 and r.stdout.startswith("export LD_PRELOAD=")
    r2 = scn.host.run(["bash", "-c", f'eval "$({scn.venv.python} -m tms_autopreload env)"; echo "$LD_PRELOAD"'],
                      clean_env())
    assert r2.stdout.strip() == str(scn.site / CU13)
    doc = json.loads(cli(scn, "env", "--json").stdout)
    assert doc == {"LD_PRELOAD": str(scn.site / CU13)}


@pytest.mark.parametrize("python", [DEFAULT_PYTHON, *ROOTFS_PYTHONS, AARCH64])
def test_which_prints_the_chosen_build_and_doctor_reports_it_with_its_documented_keys(scenario, python):
    """Also in Debian's root file systems (arm64's too): their glibc's loader cache and loader decide there."""
    scn = report_host(scenario, python)
    r = cli(scn, "which")
    assert r.returncode == 0 and r.stdout.strip() == str(scn.site / CU13) and r.stderr == ""
    r = cli(scn, "doctor")
    assert r.returncode == 0
    for word in ("runtime:  CUDA 13", "CHOSEN", "REJECTED", "loads?", f"chosen:   {scn.site / CU13}"):
        assert word in r.stdout, (word, r.stdout)
    doc = json.loads(cli(scn, "doctor", "--json").stdout)
    assert set(doc) == {"ok", "hostname", "python", "versions", "executable", "torch_memory_saver_dir", "runtime",
                        "candidates", "plan", "warnings", "error", "cause", "fix", "driver", "start_up"}
    assert doc["start_up"] is None and doc["ok"], doc["start_up"]
    assert set(doc["runtime"]) == {"kind", "major", "source", "library", "library_rule", "library_why", "torch_dir",
                                  "torch_version", "second", "split"}
    assert set(doc["candidates"][0]) == {"path", "target", "kind", "major", "needs", "interposes", "loads", "status",
                                         "reason", "cause"}


def test_a_build_reached_through_a_link_under_another_majors_name_is_shown_as_the_link_and_its_file(scenario):
    """The field's layout (awslabs agentcore-rl-toolkit's slime example): the cu12 name is a symbolic link to the
    cu13 build. The plan preloads the link (LD_PRELOAD keeps the name torch_memory_saver's check reads), the
    loader maps the cu13 file; wherever a chosen build is printed for a reader (doctor's text, its JSON's new
    ``plan.file``, a node's row, ``which``'s and ``env``'s note on stderr, the verbose start in both modes and
    the image it re-executes) it is the link, the file it names and the runtime that file needs, never the
    cu12 name alone. stdout stays what scripts read: the link's path, the export lines."""
    scn = report_host(scenario, tms="0.0.10", layout="cu12-link")
    link, file = scn.site / CU12, scn.site / CU13
    shown = f"{link} -> {file} (needs libcudart.so.13"
    doc = scn.doctor()
    assert doc["plan"]["build"] == str(link) and doc["plan"]["file"] == str(file), doc["plan"]
    sys.path.insert(0, str(ROOT))
    from tms_autopreload.commands.doctor import node_table as rows

    row = rows.node_row("n", "10.0.0.1", "n" * 16, rows.document_answer(doc), None, gpus=8)
    assert f" {CU12} -> {CU13} (needs libcudart.so.13)" in rows.render([row]), rows.render([row])  # a node's row
    r = cli(scn, "doctor")
    chosen = next(line for line in r.stdout.splitlines() if line.startswith("chosen:"))
    assert chosen == f"chosen:   {shown}, found through {doc['plan']['runtime_rule']})", r.stdout
    r = cli(scn, "which")
    assert r.returncode == 0 and r.stdout == f"{link}\n" and r.stderr == f"tms-autopreload which: {shown})\n", r
    r = cli(scn, "env")
    assert r.returncode == 0 and f"export LD_PRELOAD={link}\n" in r.stdout, r.stdout
    assert r.stderr == f"tms-autopreload env: {shown})\n", r.stderr
    probe = REEXECD + MAPPED + "import json; print(json.dumps([reexecd(), mapped('hook_mode')]))"
    for mode in MODES:
        r = scn.flagged(probe, mode_env(mode))
        assert r.returncode == 0, r.stderr
        assert_applied(mode, *json.loads(r.stdout.strip().splitlines()[-1]), file)  # the file the loader maps
        said = f"tms-autopreload: chose {shown}) for " if mode == "exec" else f"tms-autopreload: loaded {shown}) in-"
        assert said in r.stderr, r.stderr
        if mode == "exec":  # and the image it re-executed, which inherits the plan as every child does
            assert f"tms-autopreload: {shown}) is mapped (resolved for this interpreter)" in r.stderr, r.stderr


def test_doctor_prints_the_table_when_there_is_no_plan(scenario):
    scn = scenario(tms="0.0.9", torch="cu13-sys", host=("driver", "cuda13"))
    r = cli(scn, "doctor")
    assert r.returncode == 1
    assert "REJECTED" in r.stdout and "NO PLAN:" in r.stdout and "torch-memory-saver>=0.0.9.post1" in r.stdout


def test_usage_error_is_exit_2(scenario):
    scn = report_host(scenario)
    r = cli(scn, "frobnicate")
    assert r.returncode == 2 and "usage:" in r.stderr


def test_console_script_is_installed(scenario):
    scn = report_host(scenario)
    r = scn.host.run([str(scn.venv.path / "bin" / "tms-autopreload"), "which"], clean_env())
    assert r.returncode == 0 and r.stdout.strip().endswith(CU13), r.stderr


def _has_nvidia_gpu() -> bool:
    try:
        return subprocess.run(["nvidia-smi", "-L"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.may_skip("the real GPU check needs an NVIDIA GPU; on a machine without one it can only say so")
def test_gpu_check_runs_on_a_gpu_and_says_clearly_when_there_is_none():
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh")], capture_output=True, text=True,
                       env=clean_env(), timeout=600)
    # First, which torch it runs with: python3's own, as python3 itself reports it.
    said = r.stdout.splitlines()[0] if r.stdout else ""
    own = subprocess.run(["python3", "-c", "import sys, torch; print(sys.executable, torch.__version__, "
                          "torch.version.cuda)"], capture_output=True, text=True, env=clean_env(), timeout=300)
    if own.returncode == 0:
        exe, version, cuda = own.stdout.split()
        assert said.startswith(f"gpu-check: {exe}: torch {version} (CUDA {cuda}) from "), r.stdout
    else:
        assert said.startswith("gpu-check: ") and ": no torch (" in said, r.stdout
    if _has_nvidia_gpu():  # the real check must run and pass: a missing wheel or torch here is a failure
        assert r.returncode == 0, r.stdout + r.stderr
        return
    assert r.returncode == 2 and r.stderr.startswith("gpu-check: no NVIDIA GPU here"), r.stdout + r.stderr
    pytest.skip("no NVIDIA GPU on this machine: gpu-check said so (exit 2) and checked nothing")


def test_doctor_says_when_an_override_splits_the_hook_from_torchs_runtime(scenario):
    """``TMS_AUTOPRELOAD_CUDA_MAJOR=12`` on a CUDA 13 torch where a CUDA 12 runtime is installed: the plan
    takes the cu12 build, and ``runtime.split`` says what torch links, which override and the fix; not ok."""
    scn = report_host(scenario, host=("driver", "cuda13", "cuda12"))
    doc = scn.doctor({"TMS_AUTOPRELOAD_CUDA_MAJOR": "12"})
    assert doc["plan"]["build"].endswith("_cu12.abi3.so") and not doc["ok"], doc
    assert doc["runtime"]["split"] == {"torch_library": "libcudart.so.13",
                                       "overrides": ["TMS_AUTOPRELOAD_CUDA_MAJOR='12'"], "cause": "split-runtime",
                                       "fix": "`unset TMS_AUTOPRELOAD_CUDA_MAJOR` to use torch's runtime"}, doc
    doc = scn.doctor()
    assert doc["ok"] and doc["runtime"]["split"] is None, doc


def test_a_second_runtime_copys_warning_says_whence_it_comes():
    from tms_autopreload.commands.doctor.document import warning_of_second

    second = {"path": "/x/nvidia/cuda_runtime/lib/libcudart.so.12", "shared": "/x/nvidia/cu13/lib/libcudart.so.13",
              "wheel": "nvidia-cuda-runtime-cu12", "site": "/x", "pip_refuses": None, "required_by": ["vllm"],
              "conditions": {}, "fix": None}
    said = warning_of_second(second)
    assert said.endswith("; it comes with nvidia-cuda-runtime-cu12, and it stays while vllm requires it"), said
    said = warning_of_second({**second, "wheel": None, "required_by": []})
    assert said.endswith("; no installed distribution records it, and remove it if nothing needs it"), said


# Shells whose variables a flagged start warns about, or whose kill switch is on (the way out a stop prints says to
# export it for the rest of the shell); each with the flag exported, or a misspelt one.
SHELLS = [{"TMS_AUTOPRELOAD_DISABLE": "1", "TMS_AUTOPRELOAD": "1"}, {"TMS_AUTOPRELOAD": "ture"},
          {"TMS_AUTOPRELOAD_DISABLE": "ture", "SLIME_OFFLOAD_TRAIN": "1"},
          {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_VERBOSE": "ture", "TMS_AUTOPRELOAD_MODE": "dlopn",
           "TMS_AUTOPRELOAD_ON_ERROR": "wran"}]


@pytest.mark.parametrize("shell", SHELLS, ids=lambda e: ",".join(f"{k}={v}" for k, v in e.items()))
def test_doctor_says_of_each_variable_what_a_flagged_start_says(scenario, shell):
    """``doctor`` in a shell, and a start from it: every warning the start prints of a variable (a misspelt value
    of a flag, the kill switch, VERBOSE, MODE, ON_ERROR), doctor prints in the same words, text and ``--json``;
    and where the kill switch is on, so that the start runs unhooked and says nothing, doctor says so, with the
    command that turns it off, which pasted into that shell lets the next flagged start be hooked."""
    scn = report_host(scenario)
    probe = REEXECD + MAPPED + "import json; print(json.dumps(mapped('torch_memory_saver')))"
    start = scn.run(["-c", probe], shell)
    assert start.returncode == 0, start.stderr
    said = [line.removeprefix("tms-autopreload: warning: ") for line in start.stderr.splitlines()
            if line.startswith("tms-autopreload: warning: ")]
    r = cli(scn, "doctor", env=shell)
    doc = json.loads(cli(scn, "doctor", "--json", env=shell).stdout)
    assert r.returncode == 0 and doc["plan"], r.stderr
    warned = [line.removeprefix("warning: ") for line in r.stdout.splitlines() if line.startswith("warning: ")]
    assert warned == doc["warnings"], (warned, doc["warnings"])
    killed = [w for w in warned if w.startswith("the kill switch is on")]
    assert [w for w in warned if w not in killed] == said, (warned, said)
    switch = shell.get("TMS_AUTOPRELOAD_DISABLE")
    assert bool(killed) == (switch is not None) and bool(said) == (shell != SHELLS[0]), (warned, said)
    if killed:
        assert json.loads(start.stdout) == [], start.stdout  # unhooked, as said
        (fix,) = re.findall(r"`([^`]+)`", killed[0])
        r = scn.host.run(["sh", "-c", f"{fix}; {shlex.join([str(scn.venv.python), '-c', probe])}"],
                         clean_env(**shell))
        assert r.returncode == 0 and json.loads(r.stdout.splitlines()[-1]) == [str(scn.site / CU13)], r.stderr
