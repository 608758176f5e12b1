"""Every command answers for its caller: the same whether or not a flag is in its own environment, and
whether or not the plan is already applied there.

The ``tms-autopreload`` command is itself a Python process. A flag exported in the caller's shell (as
people do for slime scripts) would hook it before its code runs; a plan already applied (after ``eval
"$(tms-autopreload env)"``, inside ``run --``, in a hooked worker) would look like the caller's own
values. Either made ``env`` print the hook without the directory of its ``libcudart`` (exit 127 for every
worker of a pip-only node) and ``doctor`` stop with exit 78 where no build fits. The property is checked
in every world of the scenario fixture, for every command that answers locally, in each state the
caller can be in.
"""

from __future__ import annotations

import json
import os
import shlex

import pytest
from conftest import mode_env
from support import REEXECD
from test_sitepath import SCENARIO_WORLDS

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
# A caller's own entry: kept by the export lines (this shell's), left out of --json (a raylet's worker's).
CALLER_DIR = "/opt/caller/lib"
# What `run --` shows of the environment it gives its command.
SHOW = 'printf "%s|%s|%s" "${LD_PRELOAD-unset}" "${LD_LIBRARY_PATH-unset}" "${TMS_AUTOPRELOAD_STATE+state}"'
COMMANDS = {
    "env": ["env"],
    "env --json": ["env", "--json"],
    "which": ["which"],
    "doctor": ["doctor"],
    "doctor --json": ["doctor", "--json"],
    "run": ["run", "--", "sh", "-c", SHOW],
    "doctor --deep": ["doctor", "--deep", "--import", "ctypes", "--json"],  # the torch stand-ins refuse import
    "kernel install": ["kernel", "install", "--prefix", "/nonexistent/prefix"],  # no jupyter_client: exit 2
}
VARYING = ("seconds", "log_bytes")  # doctor --deep's measurements of its own run
# A hooked Python process that runs the command as its child (a worker, a kernel, a notebook cell).
FROM_HOOKED = REEXECD + r"""
import subprocess, sys
r = subprocess.run([sys.executable, '-m', 'tms_autopreload', *sys.argv[1:]], capture_output=True, text=True)
sys.stdout.write(r.stdout); sys.stderr.write(r.stderr); sys.exit(r.returncode)
"""


def _answer(scn, command: list[str], env: dict[str, str], how: str) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of one command, started as ``how`` says: ``-m`` (python -m
    tms_autopreload), the console script, or from a hooked Python process."""
    if how == "script":
        r = scn.host.run([str(scn.venv.path / "bin" / "tms-autopreload"), *command],
                         {"PATH": os.environ["PATH"], **env}, timeout=300)
    elif how == "hooked":
        r = scn.run(["-c", FROM_HOOKED, *command], {"TMS_AUTOPRELOAD": "1", **env}, timeout=300)
    else:
        r = scn.run(["-m", "tms_autopreload", *command], env, timeout=300)
    out = r.stdout
    if command[:2] == ["doctor", "--deep"] and out.startswith("{"):
        out = json.dumps({k: v for k, v in json.loads(out).items() if k not in VARYING})
    return r.returncode, out, r.stderr.replace(str(scn.venv.path / "bin" / "tms-autopreload"), "")


def _exports(stdout: str) -> dict[str, str]:
    """What ``eval`` of ``env``'s export lines sets."""
    out = {}
    for line in stdout.splitlines():
        name, _, value = line.removeprefix("export ").partition("=")
        out[name] = shlex.split(value)[0] if value else ""
    return out


def _states(scn, base: dict[str, str]) -> dict[str, tuple[dict[str, str], str]]:
    """The caller's states: (its environment, how the command is started)."""
    states = {"flag": ({**base, "TMS_AUTOPRELOAD": "1"}, "script"),
              "slime flag": ({**base, "SLIME_OFFLOAD_TRAIN": "1"}, "script"),
              "dlopen mode": ({**base, "TMS_AUTOPRELOAD": "1", **mode_env("dlopen")}, "-m")}
    code, out, _ = _answer(scn, ["env"], base, "-m")
    if code == 0:  # the plan applied: by a hooked parent, or as eval "$(tms-autopreload env)" applies it
        states["hooked parent"] = (base, "hooked")
        states["applied"] = ({**base, **_exports(out)}, "script")
        states["applied, flag"] = ({**base, **_exports(out), "SLIME_OFFLOAD_TRAIN": "1"}, "-m")
    return states


# The fast lane's commands: those the bugs were in (env printing the hook without its runtime's directory,
# doctor stopping with exit 78) and run's environment; make test asks every command.
FAST_COMMANDS = ("env", "doctor --json", "run")


def assert_answers_alike(scn, names=tuple(COMMANDS)) -> dict[str, tuple[int, str, str]]:
    """Every command of ``names`` answers in every state as it does unflagged, with no plan applied; returns
    those answers."""
    commands = {name: COMMANDS[name] for name in names}
    base = {"LD_LIBRARY_PATH": CALLER_DIR}
    plain = {name: _answer(scn, argv, base, "-m") for name, argv in commands.items()}
    for state, (env, how) in _states(scn, base).items():
        for name, argv in commands.items():
            assert _answer(scn, argv, env, how) == plain[name], (state, name, plain[name])
    return plain


@pytest.mark.slow
@pytest.mark.parametrize("world", SCENARIO_WORLDS)
def test_every_command_answers_alike_in_every_scenario_world(scenario, world):
    assert_answers_alike(scenario(**SCENARIO_WORLDS[world]))


@pytest.mark.parametrize("world", ["cu13-pip-only", pytest.param("no-torch-no-runtime", marks=pytest.mark.slow)])
def test_every_command_answers_alike_from_a_flagged_shell(scenario, world):
    """The fast lane's share of the property: the report's world (pip-only CUDA 13, 0.0.9.post1); and in
    ``make test`` one where no build fits (there a flagged ``doctor`` stopped with exit 78 and printed no
    report; the fast lane keeps that start in the test below). The fast lane asks :data:`FAST_COMMANDS`;
    ``make test`` asks every command, here and in every world above."""
    assert_answers_alike(scenario(**SCENARIO_WORLDS[world]), FAST_COMMANDS)


def test_env_prints_the_whole_plan_for_this_shell_and_only_the_plan_for_ray(scenario):
    """Pip-only CUDA 13 host, 0.0.10: the export lines keep this shell's own entries and evaluate to the
    same values twice over; ``--json`` carries the hook and the directory of its libcudart, nothing of
    this shell's and no ``${VAR}`` (Ray turns an unset one into an empty entry: the current directory)."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    base = {"LD_LIBRARY_PATH": CALLER_DIR}
    code, out, err = _answer(scn, ["env"], {**base, "SLIME_OFFLOAD_TRAIN": "1"}, "script")
    assert code == 0, err
    first = _exports(out)
    lib = str(scn.site / "nvidia" / "cu13" / "lib")
    assert first["TMS_AUTOPRELOAD_ADDED"] == f";{lib}" and first["TMS_AUTOPRELOAD_STATE"], out  # the record
    assert {k: v for k, v in first.items() if k.startswith("LD_")} == {
        "LD_PRELOAD": str(scn.site / CU13), "LD_LIBRARY_PATH": f"{lib}:{CALLER_DIR}"}, out
    code, out, err = _answer(scn, ["env"], {**base, **first}, "-m")
    assert code == 0 and _exports(out) == first, (out, err)
    code, out, err = _answer(scn, ["env", "--json"], {**base, **first, "TMS_AUTOPRELOAD": "1"}, "script")
    assert code == 0 and json.loads(out) == {"LD_PRELOAD": str(scn.site / CU13), "LD_LIBRARY_PATH": lib}, out


def test_the_command_is_never_hooked(scenario):
    """With the flag exported, neither the console script nor ``python -m tms_autopreload`` is re-exec'd
    or maps a hook: the start-up hook leaves the command alone. A script of another name is hooked."""
    scn = scenario(torch="cu13-pip", pip=(13,), host=("driver",))
    for how in ("script", "-m"):
        code, out, err = _answer(scn, ["which"], {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_VERBOSE": "1"}, how)
        assert code == 0 and out.strip() == str(scn.site / CU13) and err == "", (how, out, err)
    script = scn.venv.path / "bin" / "tms-autopreload-not"
    script.write_text(f"#!{scn.venv.python}\nimport os; print(os.environ.get('TMS_AUTOPRELOAD_STATE', 'none'))\n")
    script.chmod(0o755)
    r = scn.host.run([str(script)], {"TMS_AUTOPRELOAD": "1"})
    assert r.returncode == 0 and r.stdout.strip() != "none", (r.stdout, r.stderr)


def _script(path, body: str = "from tms_autopreload.commands.main import main\nmain()\n"):
    path.write_text(f"#!/usr/bin/python3\n# -*- coding: utf-8 -*-\nimport re\nimport sys\n{body}")
    return str(path)


@pytest.mark.parametrize("orig, program", [
    (["/v/bin/python", "-m", "tms_autopreload", "env"], "tms-autopreload"),
    (["/v/bin/python", "-m", "tms_autopreload.__main__", "env"], "tms-autopreload"),
    (["/v/bin/python", "-mtms_autopreload", "env"], "tms-autopreload"),
    (["/v/bin/python", "-Imtms_autopreload", "env"], "tms-autopreload"),
    (["/v/bin/python", "-X", "dev", "-m", "tms_autopreload", "env"], "tms-autopreload"),
    (["/v/bin/python", "-m", "pip", "env"], "pip"),
    (["/v/bin/python", "-Impip", "env"], "pip"),
    (["/v/bin/python", "-m", "pip.__main__", "env"], "pip"),
    (["/v/bin/python", "-m", "ensurepip", "env"], "ensurepip"),
    (["/v/bin/python", "-m", "venv", "env"], "venv"),
    (["/v/bin/python", "-m", "virtualenv", "env"], "virtualenv"),
    (["/v/bin/python", "-m", "json.tool", "env"], None),
    (["/v/bin/python", "-m", "tms_autopreload.cli", "env"], None),
    (["/v/bin/python", "-m", "tms_autopreload.commands.main", "env"], None),
    (["/v/bin/python", "-m", "tms_autopreload_x", "env"], None),
    (["/v/bin/python", "-mxtms_autopreload", "env"], None),
    (["/v/bin/python", "-m", "pipx", "env"], None),
    (["/v/bin/python", "-m", "pip.x", "env"], None),
    (["/v/bin/python", "-m", "pip._internal", "env"], None),
], ids=lambda v: " ".join(v[1:]) if isinstance(v, list) else str(v))
def test_unhooked_programs_read_dash_m_as_site_py_leaves_it(orig, program):
    """While the ``.pth`` line runs, ``sys.argv`` is ``['-m', *args]``: the module's name is the entry of
    ``sys.orig_argv`` just before the arguments, alone or joined to its option."""
    from tms_autopreload.environment import unhooked_program

    assert unhooked_program(["-m", "env"], orig) == program


def test_uvs_interpreter_query_is_known_by_its_text():
    """uv asks an interpreter what it is with ``-I -B -c TEXT`` (its text as uv 0.13.9 writes it, seen in
    the suite's own uv); another ``-c`` is hooked."""
    from tms_autopreload.environment import unhooked_program

    query = ('import sys; sys.path = [__import__("os").fsdecode(b"/root/.cache/uv/.tmpukRwJJ")] + sys.path; '
             'from python.get_interpreter_info import main; main()')
    assert unhooked_program(["-c"], ["/v/bin/python", "-I", "-B", "-c", query]) == "uv"
    assert unhooked_program(["-c"], ["/v/bin/python", "-c", "import torch"]) is None
    assert unhooked_program(["-c", "x"], ["/v/bin/python", "-c", query, "x"]) == "uv"


def test_console_scripts_are_known_by_name_and_content(tmp_path):
    """The console script pip or uv writes (named tms-autopreload, importing the command; pip's, named pip,
    pip3 or pip3.N, importing pip); a user's own program of that name, or the script under another name,
    is not the program (it is hooked). pip's runner script is known by its name."""
    from tms_autopreload.environment import unhooked_program

    ours = _script(tmp_path / "tms-autopreload")
    (tmp_path / "user").mkdir()
    theirs = _script(tmp_path / "user" / "tms-autopreload", "print('train')\n")
    renamed = _script(tmp_path / "tap")
    assert unhooked_program([ours, "env"], []) == "tms-autopreload"
    # The console script of an install before the commands' wing, until pip rewrites it.
    (tmp_path / "older").mkdir()
    older = _script(tmp_path / "older" / "tms-autopreload", "from tms_autopreload.cli import main\nmain()\n")
    assert unhooked_program([older, "env"], []) == "tms-autopreload"
    assert unhooked_program([theirs, "env"], []) is None
    assert unhooked_program([renamed, "env"], []) is None
    assert unhooked_program([str(tmp_path / "gone" / "tms-autopreload")], []) is None
    assert unhooked_program(["-c", "tms-autopreload"], ["/v/bin/python", "-c", "pass", "tms-autopreload"]) is None
    assert unhooked_program([], []) is None
    pip = "from pip._internal.cli.main import main\nsys.exit(main())\n"
    for name in ("pip", "pip3", "pip3.11"):
        assert unhooked_program([_script(tmp_path / name, pip), "install"], []) == "pip", name
    assert unhooked_program([_script(tmp_path / "pipx", pip)], []) is None
    assert unhooked_program([_script(tmp_path / "user" / "pip", "print('train')\n")], []) is None
    assert unhooked_program(["/v/lib/python3.11/site-packages/pip/__pip-runner__.py", "install"], []) == "pip"
    assert unhooked_program([_script(tmp_path / "virtualenv", "from virtualenv.__main__ import run\n")]) \
        == "virtualenv"


def test_flagged_joined_dash_m_doctor_reports_where_no_build_fits(scenario):
    """``python -mtms_autopreload doctor`` (the option and its value joined, as CPython accepts) from a
    flagged shell on a node where no build fits: the report and exit 1, not the hook's exit 78."""
    scn = scenario(**SCENARIO_WORLDS["no-torch-no-runtime"])
    for spelling in ("-mtms_autopreload", "-Imtms_autopreload"):
        r = scn.run([spelling, "doctor"], {"TMS_AUTOPRELOAD": "1"})
        assert r.returncode == 1 and "NO PLAN" in r.stdout, (spelling, r.returncode, r.stderr)


@pytest.mark.parametrize("own", ["first", "last", "only", "with ;", "after libstdbuf"])
def test_a_callers_own_runtime_directory_stays_theirs(scenario, own):
    """The caller put the runtime's directory on LD_LIBRARY_PATH themselves (as troubleshooting advice
    often says): the plan binds it as found and adds nothing there, so after ``eval`` every command
    answers as before, and a second eval changes nothing: the record says what the plan added, the
    values are never guessed from."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    lib = str(scn.site / "nvidia" / "cu13" / "lib")
    base = {"first": {"LD_LIBRARY_PATH": f"{lib}:{CALLER_DIR}"}, "last": {"LD_LIBRARY_PATH": f"{CALLER_DIR}:{lib}"},
            "only": {"LD_LIBRARY_PATH": lib}, "with ;": {"LD_LIBRARY_PATH": f"{CALLER_DIR};{lib}"},
            "after libstdbuf": {"LD_LIBRARY_PATH": f"{CALLER_DIR}:{lib}",
                                "LD_PRELOAD": "/usr/libexec/coreutils/libstdbuf.so"}}[own]
    code, first, err = _answer(scn, ["env"], base, "-m")
    assert code == 0, err
    applied = {**base, **_exports(first)}
    for how in ("-m", "script"):
        code, second, err = _answer(scn, ["env"], applied, how)
        assert (code, second) == (0, first), (how, first, second, err)
    assert {**applied, **_exports(second)} == applied
    docs = [json.loads(_answer(scn, ["doctor", "--json"], env, "-m")[1])["plan"] for env in (base, applied)]
    assert docs[0] == docs[1], docs



def test_only_the_plans_build_is_taken_out_of_the_callers_preload():
    """``before_plan``: a torch_memory_saver build goes by its released name or as the build the state
    names (a link of another name); a caller's own file in a folder named after torch_memory_saver stays."""
    from tms_autopreload.environment import STATE_VAR, state_key
    from tms_autopreload.commands.caller_env import before_plan

    own = {"LD_PRELOAD": "/opt/torch_memory_saver/libmine.so", "HOME": "/root"}
    assert before_plan(own) == own
    link = "/opt/torch_memory_saver/hook.so"
    applied = {"LD_PRELOAD": f"{link}:/usr/libexec/coreutils/libstdbuf.so", STATE_VAR: state_key(link, {}),
               "HOME": "/root"}
    assert before_plan(applied) == {"LD_PRELOAD": "/usr/libexec/coreutils/libstdbuf.so", "HOME": "/root"}
    released = {"LD_PRELOAD": f"/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so:{own['LD_PRELOAD']}"}
    assert before_plan(released) == {"LD_PRELOAD": own["LD_PRELOAD"]}


@pytest.mark.slow  # two venvs of its own
def test_a_plan_applied_by_another_environment_is_taken_out(scenario):
    """A hooked process of venv A runs venv B's command (a notebook of one environment calling another's
    tools): A's hook and A's runtime directory, both recorded, are not B's caller's; B answers as from a
    clean shell."""
    a = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), tag="venv-a")
    b = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), tag="venv-b")
    code, out, err = _answer(a, ["env"], {}, "-m")
    assert code == 0, err
    from_a = _exports(out)
    for command in (["env"], ["env", "--json"], ["doctor", "--json"]):
        assert _answer(b, command, from_a, "-m") == _answer(b, command, {}, "-m"), command


# What a hooked or evaluated process shows of the plan's variables: each as bytes, hex, so that any byte survives.
SHOW_PLAN = ("import os; print(' '.join(f'{k}=' + os.environb.get(k.encode(), b'-unset-').hex() for k in "
             "('LD_PRELOAD', 'LD_LIBRARY_PATH', 'TMS_AUTOPRELOAD_ADDED', 'TMS_AUTOPRELOAD_STATE')))")
# Characters a shell treats specially, a quote of each kind and a glob that matches.
ODD = "a&b(c)*d$HOME'e\"f`g\\h|i<j>k!l{m}n~o#p"


@pytest.mark.parametrize("shell", ["sh", "bash"])
def test_env_lines_evaluated_by_a_real_shell_set_what_a_flagged_start_sets(scenario, tmp_path, shell):
    """A venv whose path holds every character a shell reads specially (``&``, ``(``, ``*``, ``$``, quotes)
    and a caller's LD_LIBRARY_PATH just as odd, with ``;`` (the separator of TMS_AUTOPRELOAD_ADDED, and one of
    LD_LIBRARY_PATH's for ld.so) and a byte that is not UTF-8 too: ``eval "$(tms-autopreload env)"``, run twice
    under ``set -e`` by ``sh`` and ``bash``, leaves exactly the values a flagged start of the same interpreter
    sets, byte for byte."""
    from sandbox import private_copy

    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    venv = private_copy(scn.venv, tmp_path / ODD / "venv")
    python = str(venv.path / "bin" / "python")
    caller = os.fsencode(tmp_path / ODD) + b";x\xff"  # a byte that is not UTF-8, as a caller may have
    os.makedirs(caller)
    caller = os.fsdecode(caller)
    base = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": caller}  # the driver: the host's loader cache
    hooked = scn.host.run([python, "-c", SHOW_PLAN], {**base, "TMS_AUTOPRELOAD": "1"}, timeout=120)
    assert hooked.returncode == 0, hooked.stderr
    script = 'set -e; eval "$("$0" -m tms_autopreload env)"; eval "$("$0" -m tms_autopreload env)"; "$0" -c "$1"'
    evaluated = scn.host.run([shell, "-c", script, python, SHOW_PLAN], base, timeout=120)
    assert evaluated.returncode == 0, evaluated.stderr
    shown = {k: bytes.fromhex(v) for k, v in (w.split("=") for w in hooked.stdout.split())}
    assert b"-unset-".hex() not in hooked.stdout, shown  # the plan sets all four
    assert b";" in shown["TMS_AUTOPRELOAD_ADDED"] and b"&b(c)" in shown["TMS_AUTOPRELOAD_ADDED"], shown
    # The caller's entries kept byte for byte; ld.so splits LD_LIBRARY_PATH at ';' as at ':', and so does the plan.
    assert shown["LD_LIBRARY_PATH"].endswith(os.fsencode(tmp_path / ODD) + b":x\xff"), shown
    assert evaluated.stdout == hooked.stdout, (evaluated.stdout, hooked.stdout)
