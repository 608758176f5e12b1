"""Every way a command is called, generated from its parser, each call judged by the same oracles.

The calls are made from ``tms_autopreload.commands.main``'s own parser: every command and subcommand, each
optional argument left out and given (each choice, a repeatable one once and twice, values users get wrong),
every pair of them (each with its mode, in doctor's rules), and for each member of a mutually exclusive
group (doctor's modes, kernel's locations) every option that goes with it, together; each parser's --help.
Whether a call is valid
is the parser's own answer (``parse``: argparse, then ``doctor``'s mode rules), so that a new option, or a
new rule, gets its calls the day it is written. ``run`` is given its command with and without ``--``.

Each call runs as a user runs it, in one of two shared worlds of the scenario fixture (torch_memory_saver's
report host, with a plan; and torch_memory_saver 0.0.9 there, without), with this shell's own
``LD_PRELOAD`` entry (so that the plan's ``LD_PRELOAD`` is more than the build, and 0.0.9.post1's
one-path check makes the survey warn). One process runs every call of a world in the host's namespace and
reports a JSON line each. The oracles: the exit code is one docs/reference.md documents; a usage error is
exit 2 with the parser's own words; ``which`` prints one absolute path, the plan's build; ``env``'s
``export`` lines evaluate in ``sh`` to the plan; ``env --json`` is the plan of this environment without its
``LD_PRELOAD`` and ``LD_LIBRARY_PATH``, as ``doctor --json`` gives it; ``run`` executes its command under the
plan, the hook mapped in it; the survey's warnings reach stderr of every command that prints a plan;
without a plan, each command says ``doctor``'s error; and ``doctor --deep`` under ``nohup`` outlives a SIGHUP.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need, report_host
from support import ROOT, cc, clean_env

sys.path.insert(0, str(ROOT))

from tms_autopreload.commands.doctor import command as doctor_command
from tms_autopreload.commands.main import build_parser, parse

COLUMNS = "100"  # argparse wraps usage and help to the terminal's width: the same here and in the calls
OWN_PRELOAD = "libcalls-own.so"
# What `run` shows of the environment it gives its command, and the hook mapped in it.
SHOW = ('grep -o "[^ ]*torch_memory_saver[^ ]*" /proc/$$/maps | sort -u; '
        'printf "LD_PRELOAD=%s\\n" "${LD_PRELOAD-unset}"')
# The commands `run` is given (each with and without `--`), and what each prints and exits with when run
# without the hook: the oracle adds the plan's part.
RUN_COMMANDS = {
    "show": (["sh", "-c", SHOW], None, 0),
    "options of its own": (["printf", "%s|", "a", "--json", "-x", "--", "b"], "a|--json|-x|--|b|", 0),
    "its exit code": (["sh", "-c", "exit 7"], "", 7),
    "not found": (["tms-calls-no-such-command"], "", 127),
    "not executable": (["@NOEXEC@"], "", 126),
}
# What a user gives each option that takes a value, by (command, dest): a new option without an entry
# fails test_every_option_is_called. "@DOC@" is the world's own `doctor --json` document.
VALUES = {
    ("doctor", "nodes"): ["@DOC@", "-"],
    ("doctor", "import_"): ["json"],
    ("doctor", "address"): ["127.0.0.1:6379"],
    ("doctor", "runtime_env"): ['{"env_vars": {"A": "1"}}'],
    ("doctor", "timeout"): ["5"],
    ("kernel install", "name"): ["calls-kernel"],
    ("kernel install", "display_name"): ["Calls kernel"],
    ("kernel install", "env"): ["A=1", "B=2"],
    ("kernel install", "prefix"): ["@PREFIX@"],
    ("kernel uninstall", "name"): ["calls-kernel"],
    ("kernel uninstall", "prefix"): ["@PREFIX@"],
}
# Values users get wrong, each a call of its own (with the option's mode where it has one).
WRONG_VALUES = {
    ("doctor", "timeout"): ["0", "soon"],
    ("doctor", "mode"): ["fork"],
    ("doctor", "runtime_env"): ["[1]"],
    ("doctor", "nodes"): ["/nonexistent/nodes.txt"],
    ("kernel install", "env"): ["A"],
    ("kernel install", "prefix"): [""],
}


# ---------------------------------------------------------------- the calls, from the parser

def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of every command that runs: each subparser's, recursively."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from leaves(sub, (*path, name))
            return
    yield path, parser


def parsers(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) of the root and every subparser: each has its own --help."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


def forms(command: str, action: argparse.Action) -> list[list[str]]:
    """How users give ``action``: a flag as it is, each choice, each value (a repeatable one once and twice)."""
    opt = max(action.option_strings, key=len)
    if action.nargs == 0:
        return [[opt]]
    given = list(action.choices) if action.choices else VALUES.get((command, action.dest))
    assert given, f"{command} {opt}: no value to call it with; add one to VALUES"
    if isinstance(action, argparse._AppendAction):
        return [[opt, given[0]], [opt, given[0], opt, given[1]]]
    return [[opt, v] for v in given]


def mode_of(command: str, action: argparse.Action) -> list[str]:
    """The member of a mutually exclusive group ``action`` goes with in doctor's rules, if any, as a form."""
    if command != "doctor":
        return []
    modes = {o: m for o, _dest, m in doctor_command._DOCTOR_MODE_OPTIONS}
    mode = modes.get(max(action.option_strings, key=len))
    return [mode] if mode else []


@contextlib.contextmanager
def terminal():
    """This process's argparse as the calls' sees its terminal: :data:`COLUMNS` wide."""
    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = COLUMNS
    try:
        yield
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def outcome(argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of parsing ``argv`` in this process: 0 where it parses, else what the
    parser itself says and exits with (a usage error, --help, --version)."""
    out, err = io.StringIO(), io.StringIO()
    with terminal(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            parse(argv)
        except SystemExit as exc:
            return int(exc.code or 0), out.getvalue(), err.getvalue()
    return 0, "", ""


def generated_calls() -> list[list[str]]:
    """Every command bare, each option form alone, each wrong value, every pair of forms of two options (with
    the mode doctor's rules give each: a member of the mutually exclusive group), and for each member of a
    mutually exclusive group (doctor's modes, kernel's locations) every form the parser accepts beside it,
    together."""
    calls: list[list[str]] = []
    for path, parser in leaves(build_parser()):
        command = " ".join(path)
        if path == ("run",):
            calls.append(["run"])
            calls += [["run", *dashes, *argv] for argv, _, _ in RUN_COMMANDS.values() for dashes in ([], ["--"])]
            calls += [["run", "--"], ["run", "--", ""]]
            continue
        acts = options(parser)
        calls.append(list(path))
        for a in acts:
            for form in forms(command, a):
                calls.append([*path, *form])
            for value in WRONG_VALUES.get((command, a.dest), []):
                calls.append([*path, *mode_of(command, a), max(a.option_strings, key=len), value])
        members = [m for group in parser._mutually_exclusive_groups for m in group._group_actions]
        for a, b in itertools.combinations(acts, 2):
            modes = [] if {a, b} & set(members) else list(dict.fromkeys(mode_of(command, a) + mode_of(command, b)))
            for fa, fb in itertools.product(forms(command, a), forms(command, b)):
                calls.append([*path, *modes, *fa, *fb])
        for group in parser._mutually_exclusive_groups:
            for member in group._group_actions:
                for first in forms(command, member):
                    together = [*path, *first]
                    for a in acts:
                        if a is member:
                            continue
                        for form in forms(command, a):
                            if outcome([*together, *form])[0] == 0:
                                together += form
                                break
                    calls.append(together)
    unique: dict[str, list[str]] = {}
    for call in calls:
        unique.setdefault(shlex.join(call), call)
    return list(unique.values())


def wrong(command: str, call: list[str]) -> bool:
    """Whether ``call`` gives one of its options a value of :data:`WRONG_VALUES`."""
    dests = {o: a.dest for a in options(leaf_of(call)) for o in a.option_strings}
    return any(value in WRONG_VALUES.get((command, dests.get(opt, "")), ()) for opt, value in itertools.pairwise(call))


def all_calls() -> list[list[str]]:
    """The generated calls, the root's own (none, an unknown command, --version) and each parser's --help."""
    root = [[], ["frobnicate"], ["--version"]]
    helps = [[*path, "--help"] for path, _ in parsers(build_parser())]
    return [*root, *generated_calls(), *helps]


# Usage errors that only running the command finds (argparse accepts the line): each call's message.
EXECUTE_USAGE = {
    ("run",): "give a command: tms-autopreload run -- CMD [ARGS...]",
    ("run", "--"): "give a command: tms-autopreload run -- CMD [ARGS...]",
    ("run", "--", ""): "the command name is empty (''): give a command: tms-autopreload run -- CMD [ARGS...]",
    ("kernel", "install", "--env", "A"): "--env wants NAME=VALUE, got 'A'",
}


def documented_codes() -> set[int]:
    """The exit codes docs/reference.md's table lists."""
    text = (ROOT / "docs" / "reference.md").read_text()
    table = text.split("| exit | meaning |", 1)[1].split("\n\n", 1)[0]
    return {int(code) for cell in re.findall(r"^\| `([\d/]+)` \|", table, re.M) for code in cell.split("/")}


def leaf_of(call: list[str]) -> argparse.ArgumentParser:
    """The parser of the command ``call`` names (the root's where it names none)."""
    found = build_parser()
    for word in call:
        sub = next((a for a in found._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        found = sub.choices[word]
    return found


# ---------------------------------------------------------------- the worlds, each run in one process

# Runs every call of a world in the host's namespace: argv[1] the calls (JSON: argv, env, the index of an
# earlier call whose stdout is its stdin), argv[2] where each call's stdout is kept; one JSON line a call.
# SIGHUP as from a terminal, whatever this runner inherited (nohup sets its own).
DRIVER = r"""
import json, os, signal, subprocess, sys
signal.signal(signal.SIGHUP, signal.SIG_DFL)
calls, outdir = json.load(open(sys.argv[1])), sys.argv[2]
for i, call in enumerate(calls):
    stdin = subprocess.DEVNULL if call["stdin"] is None else open(os.path.join(outdir, f"{call['stdin']}.out"), "rb")
    r = subprocess.run(call["argv"], env=call["env"], stdin=stdin, capture_output=True, timeout=300)
    with open(os.path.join(outdir, f"{i}.out"), "wb") as f:
        f.write(r.stdout)
    print(json.dumps({"rc": r.returncode, "out": r.stdout.decode("utf-8", "replace"),
                      "err": r.stderr.decode("utf-8", "replace")}), flush=True)
"""
# Imported by `doctor --deep --import tms_calls_hup`: says it is about to, then sends SIGHUP to doctor.
HUP_MODULE = """import os, signal
open(os.environ["CALLS_HUP_SENT"], "w").close()
os.kill(os.getppid(), signal.SIGHUP)
"""
NOT_PLAN_VARS = ("LD_PRELOAD", "LD_LIBRARY_PATH")
# sh: evaluate $1 (env's export lines), then print each variable named after it, NUL-terminated.
EVALUATED = r"""eval "$1"; shift; for n in "$@"; do eval "v=\${$n-}"; printf '%s\0' "$v"; done"""


class World:
    """One scenario's calls and what they did: ``results[i]`` (rc, out, err) of ``calls[i]``; ``doc`` is its
    ``doctor --json``, ``own`` that of its environment without LD_PRELOAD and LD_LIBRARY_PATH."""

    def __init__(self, scn, calls: list[list[str]], tmp: Path, own_preload: Path) -> None:
        self.scn, self.calls, self.tmp = scn, calls, tmp
        tmp.mkdir()
        mods, out = tmp / "mods", tmp / "out"
        mods.mkdir()
        out.mkdir()
        (mods / "tms_calls_hup.py").write_text(HUP_MODULE)
        (tmp / "prefix").mkdir()
        self.noexec = tmp / "not-executable"
        self.noexec.write_text("#!/bin/sh\n")
        self.noexec.chmod(0o644)
        self.env = clean_env(LD_PRELOAD=str(own_preload), COLUMNS=COLUMNS)
        own_env = {k: v for k, v in self.env.items() if k not in NOT_PLAN_VARS}
        python = [str(scn.venv.python), "-m", "tms_autopreload"]
        places = {"@DOC@": str(out / "0.out"), "@PREFIX@": str(tmp / "prefix"), "@NOEXEC@": str(self.noexec)}
        items = [{"argv": [*python, "doctor", "--json"], "env": self.env, "stdin": None},
                 {"argv": [*python, "doctor", "--json"], "env": own_env, "stdin": None}]
        for call in calls:
            argv = [places.get(word, word) for word in call]
            items.append({"argv": [*python, *argv], "env": self.env, "stdin": 0 if reads_stdin(call) else None})
        hup = {**self.env, "PYTHONPATH": str(mods), "CALLS_HUP_SENT": str(tmp / "hup-sent")}
        deep = [*python, "doctor", "--deep", "--import", "tms_calls_hup"]
        items += [{"argv": ["nohup", *deep], "env": hup, "stdin": None}, {"argv": deep, "env": hup, "stdin": None}]
        (tmp / "calls.json").write_text(json.dumps(items))
        (tmp / "driver.py").write_text(DRIVER)
        r = scn.host.run([str(scn.venv.python), str(tmp / "driver.py"), str(tmp / "calls.json"), str(out)],
                         clean_env(), timeout=900)
        assert r.returncode == 0, r.stderr[-3000:]
        lines = [json.loads(line) for line in r.stdout.splitlines()]
        assert len(lines) == len(items), r.stderr[-3000:]
        results = [(x["rc"], x["out"], x["err"]) for x in lines]
        self.doc, self.own = (json.loads(results[i][1]) for i in (0, 1))
        self.results = dict(zip(map(shlex.join, calls), results[2:-2], strict=True))
        self.nohup, self.hup = results[-2:]

    def __getitem__(self, call: list[str]) -> tuple[int, str, str]:
        return self.results[shlex.join(call)]


@pytest.fixture(scope="module")
def own_preload(tmp_path_factory) -> Path:
    """A library of this shell's own in LD_PRELOAD: kept after the hook, and a second entry 0.0.9.post1's
    check refuses (so the survey warns)."""
    return need(cc, tmp_path_factory.mktemp("own") / OWN_PRELOAD, "int calls_own(void) { return 0; }\n",
                f"-Wl,-soname,{OWN_PRELOAD}")


# The calls of the world without a plan: those whose answer depends on the plan.
NO_PLAN_CALLS = [["doctor"], ["doctor", "--json"], ["doctor", "--deep"], ["doctor", "--json", "--deep"],
                 ["which"], ["env"], ["env", "--json"], *[["run", *d, *argv] for argv, _, _ in RUN_COMMANDS.values()
                                                          for d in ([], ["--"])]]


def reads_stdin(call: list[str]) -> bool:
    """``doctor --nodes -``: the world's own document comes on stdin."""
    return any(a == "--nodes" and b == "-" for a, b in itertools.pairwise(call))


def run_in_processes(calls: list[list[str]]) -> list[list[str]]:
    """The calls that run as processes: every call the parser accepts (and --help, --version), and of those
    it refuses one for each of its messages and commands (the options and values it names aside); the
    parser alone judges the rest (test_every_call_the_parser_refuses_is_a_usage_error)."""
    out, seen = [], set()
    for call in calls:
        code, _, err = outcome(call)
        if code == 2:
            key = (leaf_of(call).prog, re.sub(r"--[\w-]+|'[^']*'", "_", err.strip().splitlines()[-1]))
            if key in seen:
                continue
            seen.add(key)
        out.append(call)
    return out


@pytest.fixture(scope="module")
def worlds(scenario, own_preload, tmp_path_factory) -> dict[str, World]:
    """Every generated call in the world with a plan; the calls a plan decides in the world without one."""
    plan = World(report_host(scenario), run_in_processes(all_calls()), tmp_path_factory.mktemp("calls") / "plan",
                 own_preload)
    none = World(scenario(tms="0.0.9", torch="cu13-sys", host=("driver", "cuda13")), NO_PLAN_CALLS,
                 tmp_path_factory.mktemp("calls") / "none", own_preload)
    return {"plan": plan, "no plan": none}


# ---------------------------------------------------------------- the parser's own rules, judged in this process

def test_every_option_is_called_and_every_value_is_an_options():
    """Each option of each command is in a generated call; each entry of VALUES and WRONG_VALUES names one."""
    calls = all_calls()
    named = set()
    for path, parser in leaves(build_parser()):
        for action in options(parser):
            named.add((" ".join(path), action.dest))
            assert any(c[:len(path)] == list(path) and set(action.option_strings) & set(c) for c in calls), \
                (path, action.option_strings)
    assert set(VALUES) | set(WRONG_VALUES) <= named, (set(VALUES) | set(WRONG_VALUES)) - named


def test_each_mode_option_needs_its_mode():
    """doctor's mode rules (its ``_DOCTOR_MODE_OPTIONS``): an option of one mode without it is a usage error
    naming the rule; with it, the line parses."""
    for option, dest, mode in doctor_command._DOCTOR_MODE_OPTIONS:
        action = next(a for a in options(leaf_of(["doctor"])) if a.dest == dest)
        for form in forms("doctor", action):
            code, out, err = outcome(["doctor", *form])
            assert code == 2 and f"{option} only with {mode}" in err.splitlines()[-1], (form, err)
            assert outcome(["doctor", mode, *form])[0] == 0 or (dest, form) == ("as_is", ["--as-is"]), (mode, form)


def test_every_call_the_parser_refuses_is_a_usage_error():
    """Every generated call that does not parse: exit 2, nothing on stdout, the usage of the command it
    names, then ``PROG: error: ...`` (argparse's own form, doctor's rules included)."""
    refused = [c for c in all_calls() if outcome(c)[0] != 0 or outcome(c)[1]]
    assert refused
    for call in refused:
        code, out, err = outcome(call)
        if "--help" in call or call == ["--version"]:
            assert code == 0 and out and not err, call
            continue
        assert code == 2 and out == "" and err.startswith("usage: "), (call, code, err)
        assert re.fullmatch(r"tms-autopreload( \w+)*: error: .+", err.splitlines()[-1]), (call, err)


# ---------------------------------------------------------------- every call, run

def results(worlds):
    for name, world in worlds.items():
        for call in world.calls:
            yield name, world, call, world[call]


def test_every_call_exits_with_a_documented_code_and_no_traceback(worlds):
    codes = documented_codes()
    assert {0, 1, 2, 126, 127} <= codes, codes
    own = {code for _, _, code in RUN_COMMANDS.values()}
    for name, _, call, (rc, _out, err) in results(worlds):
        assert rc in codes | (own if call[:1] == ["run"] else set()), (name, call, rc, err[-2000:])
        assert "Traceback" not in err, (name, call, err[-3000:])


def test_a_refused_call_says_what_the_parser_says(worlds):
    """What the parser says in this process (usage errors, --help, --version), the command says: the
    same exit code, the same words. ``kernel``'s help names where a kernel goes, which jupyter_client
    decides for the interpreter it runs in: there, every option is named."""
    world = worlds["plan"]
    for call in world.calls:
        code, out, err = outcome(call)
        if code == 0 and not out:
            continue
        rc, got_out, got_err = world[call]
        if "--help" in call and call[:1] == ["kernel"] and call != ["kernel", "--help"]:
            assert rc == 0 and got_out.startswith(out.split("\n\n")[0]), (call, got_out)
            assert all(o in got_out for a in options(leaf_of(call)) for o in a.option_strings), got_out
            continue
        assert (rc, got_out, got_err) == (code, out, err), call


def test_usage_errors_only_the_command_finds_are_said_as_the_parser_says_them(worlds):
    """A line argparse accepts but the command refuses (``run`` without a command, ``--env`` without ``=``)
    is a usage error in argparse's own form: the command's usage, ``PROG: error: MESSAGE``, exit 2; and no
    other accepted call is."""
    for name, _, call, (rc, out, err) in results(worlds):
        if outcome(call) != (0, "", ""):
            continue
        if tuple(call) in EXECUTE_USAGE:
            leaf = leaf_of(call)
            with terminal():
                usage = leaf.format_usage()
            assert (rc, out, err) == (2, "", f"{usage}{leaf.prog}: error: {EXECUTE_USAGE[tuple(call)]}\n"), \
                (name, call, err)
        else:
            assert not err.startswith("usage:"), (name, call, err)


def _doctor_calls(world):
    for call in world.calls:
        if call[:1] == ["doctor"] and outcome(call) == (0, "", ""):
            with terminal():
                yield call, parse(call), world[call]


def test_doctor_says_the_survey_in_every_mode_it_is_called(worlds):
    """Plain: the same document as the world's ``doctor --json``, its warnings and its plan or error in the
    text, exit 0 exactly where it is ok. ``--deep``: the module asked, the plan's hook, the survey's warnings
    on stderr, exit 0 exactly where the proof holds; without a plan, the same error. ``--ray``: Ray is not
    installed here (exit 2, said in one line). ``--nodes``: the world's own document read back as one node's
    row, exit 0 exactly where that node is ok; an unreadable FILE, exit 2."""
    for name, world in worlds.items():
        doc = world.doc
        deep_rc: dict[tuple, int] = {}
        for call, args, (rc, out, err) in _doctor_calls(world):
            said = (name, call, rc, out[-1500:], err[-1500:])
            if args.deep:
                key = (args.import_, args.as_is, args.mode)
                if doc["plan"] is None and not args.json:
                    assert (rc, out) == (1, "") and says_the_error(err, doc), said
                if args.json:
                    ev = json.loads(out)
                    assert ev["module"] == args.import_ and rc == (0 if ev["ok"] else 1), said
                    if doc["plan"] is None:
                        assert rc == 1 and says_the_error(f"tms-autopreload: {ev['error']}\n", doc), said
                    else:
                        assert os.path.realpath(ev["hook"]) == os.path.realpath(doc["plan"]["file"]), said
                if doc["plan"] is not None:
                    assert _warned(err, doc["warnings"]), said
                assert deep_rc.setdefault(key, rc) == rc, (said, deep_rc)  # text and --json agree
            elif args.ray:
                assert rc == 2 and out == "" and err.count("\n") == 1, said
                assert err.startswith("tms-autopreload doctor --ray: "), said
                if not wrong("doctor", call):
                    assert "Ray is not installed for " in err, said
            elif args.nodes is not None:
                if args.nodes.startswith("/nonexistent"):
                    assert (rc, out) == (2, "") and err.startswith(f"tms-autopreload doctor --nodes: cannot read "
                                                                   f"{args.nodes}: "), said
                    continue
                assert rc == (0 if doc["ok"] else 1), said
                if args.json:
                    table = json.loads(out)
                    assert table["ok"] == doc["ok"] and len(table["nodes"]) == 1, said
                    assert table["nodes"][0]["name"] == doc["hostname"], said
                else:
                    assert doc["hostname"] in out, said
            elif args.json:
                assert (rc, json.loads(out)) == (0 if doc["ok"] else 1, doc), said
            else:
                assert rc == (0 if doc["ok"] else 1), said
                lines = out.splitlines()
                assert [line for line in lines if line.startswith("warning: ")] == \
                    [f"warning: {w}" for w in doc["warnings"]], said
                if doc["plan"] is None:
                    assert f"\nNO PLAN:  {doc['error']}" in out, said
                else:
                    assert any(line.startswith(f"chosen:   {doc['plan']['build']}") for line in lines), said


def says_the_error(err: str, doc: dict, head: str = "") -> bool:
    """``err`` is ``tms-autopreload: HEAD`` and the error ``doctor --json`` gives, as the commands print it:
    ``doctor`` traces every candidate, so a candidate's reason there may go on with what the loader said of
    it (``; loader: ...``)."""
    if not err.startswith(f"tms-autopreload: {head}") or not err.endswith("\n"):
        return False
    said, full = err[len(f"tms-autopreload: {head}"):-1].split("\n"), doc["error"].split("\n")
    return len(said) == len(full) and all(f == s or f.startswith(f"{s}; loader: ")
                                          for s, f in zip(said, full, strict=True))


# How env --json says an error: the plan it looked for is a Ray worker's.
RAY_WORKER = ("for a process started without this shell's LD_PRELOAD and LD_LIBRARY_PATH (a Ray worker, from its "
              "raylet's environment): ")


def _warned(err: str, warnings: list[str]) -> bool:
    lines = err.splitlines()
    return all(f"tms-autopreload: warning: {w}" in lines for w in warnings)


def test_which_prints_the_plans_build_alone_and_env_evaluates_to_the_plan(worlds):
    """``which``: one absolute path, the plan's build (not its whole LD_PRELOAD, which here holds this
    shell's own entry too). ``env``: ``export`` lines that ``sh`` evaluates to the plan's variables.
    ``env --json``: the plan of this environment without its LD_PRELOAD and LD_LIBRARY_PATH. Each says the
    survey's warnings on stderr; without a plan, each says doctor's error and prints nothing."""
    plan = worlds["plan"]
    doc = plan.doc
    assert doc["plan"] is not None and doc["plan"]["env"]["LD_PRELOAD"] != doc["plan"]["build"], doc["plan"]
    assert doc["warnings"] and doc["runtime"]["second"] is None, doc  # the survey's own warnings, all of them
    rc, out, err = plan[["which"]]
    assert rc == 0 and out == f"{doc['plan']['build']}\n" and os.path.isabs(out.strip()), (out, err)
    assert _warned(err, doc["warnings"]), err
    rc, out, err = plan[["env"]]
    assert rc == 0 and all(line.startswith("export ") for line in out.splitlines()), out
    assert _warned(err, doc["warnings"]), err
    names = sorted(doc["plan"]["env"])
    shown = subprocess.run(["sh", "-c", EVALUATED, "sh", out, *names], capture_output=True, text=True,
                           env=clean_env(), check=True)
    assert dict(zip(names, shown.stdout.split("\0")[:-1], strict=True)) == doc["plan"]["env"], shown
    rc, out, err = plan[["env", "--json"]]
    assert rc == 0 and json.loads(out) == plan.own["plan"]["env"], (out, plan.own["plan"])
    assert _warned(err, plan.own["warnings"]), err
    none = worlds["no plan"]
    assert none.doc["plan"] is None and none.own["plan"] is None
    for call in (["which"], ["env"]):
        rc, out, err = none[call]
        assert (rc, out) == (1, "") and says_the_error(err, none.doc), (call, none[call])
    rc, out, err = none[["env", "--json"]]
    assert (rc, out) == (1, "") and says_the_error(err, none.own, RAY_WORKER), err


def test_run_executes_its_command_under_the_plan_with_and_without_dashes(worlds):
    """``run CMD`` and ``run -- CMD`` alike: the command runs with the plan's environment, the hook mapped in
    it, its own options and exit code its own; 127 and 126 where it cannot run; the survey's warnings on
    stderr. Without a plan: exit 1, doctor's error, the command not run."""
    plan, none = worlds["plan"], worlds["no plan"]
    doc = plan.doc
    for what, (argv, printed, code) in RUN_COMMANDS.items():
        for world in (plan, none):
            answers = {tuple(d): world[["run", *d, *argv]] for d in ([], ["--"])}
            assert answers[()] == answers[("--",)], (what, answers)
        rc, out, err = plan[["run", *argv]]
        said = (what, rc, out, err)
        if what == "show":
            assert out.splitlines() == [os.path.realpath(doc["plan"]["file"]),
                                        f"LD_PRELOAD={doc['plan']['env']['LD_PRELOAD']}"], said
        elif code in (126, 127):
            name = plan.noexec if argv == ["@NOEXEC@"] else argv[0]
            assert err.endswith(f"tms-autopreload run: {name}: "
                                f"{'command not found' if code == 127 else 'Permission denied'}\n"), said
        else:
            assert out == printed, said
        assert rc == code and _warned(err, doc["warnings"]), said
        rc, out, err = none[["run", *argv]]
        assert (rc, out) == (1, "") and says_the_error(err, none.doc), (what, rc, out, err)


def test_kernel_says_what_to_install_in_every_way_it_is_called(worlds):
    """Without jupyter_client (the fast lane's worlds), every accepted ``kernel`` line but a usage error
    ends the same way: exit 2, one line naming what to install."""
    world = worlds["plan"]
    for call in world.calls:
        if call[:1] != ["kernel"] or outcome(call) != (0, "", "") or tuple(call) in EXECUTE_USAGE:
            continue
        rc, out, err = world[call]
        assert (rc, out) == (2, "") and err.startswith("tms-autopreload kernel: jupyter_client is not installed for "
                                                       f"{world.scn.venv.python}"), (call, err)


def test_deep_outlives_a_sighup_under_nohup(worlds):
    """``nohup tms-autopreload doctor --deep``: the module it imports sends doctor SIGHUP, which nohup's
    ignored disposition keeps away (doctor reports, exit 0 or 1); from a terminal the same signal ends it
    as documented (129, its child ended, its log deleted)."""
    world = worlds["plan"]
    rc, out, err = world.nohup
    assert (world.tmp / "hup-sent").exists()
    assert rc in (0, 1) and out.startswith("deep:     `import tms_calls_hup` under the plan"), (rc, out, err)
    assert "interrupted" not in err, err
    rc, out, err = world.hup
    assert (rc, out) == (129, "") and err.endswith("interrupted by SIGHUP; its child was ended and its binding log "
                                                   "deleted\n"), (rc, err)
    none = worlds["no plan"]  # there doctor --deep stops before it imports anything: said as everywhere
    for rc, out, err in (none.nohup, none.hup):
        assert (rc, out) == (1, "") and says_the_error(err, none.doc), (rc, err)
