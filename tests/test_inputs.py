"""Every input a user can set gets a clear answer, never a hang.

1. Property tests, in this process: every variable the package reads, given generated values (empty,
   whitespace, huge, non-ASCII and undecodable bytes, separators, relative and dangling paths,
   directories, FIFOs, files others can write, numbers out of range) alone and in combinations, on top
   of an environment that has a plan. ``decision.survey(environ=...)`` and the start-up hook's decision
   never raise anything but their documented outcomes, never say "internal error", and an error's
   first line names a variable that was changed.
2. End to end: a sample of those environments started flagged in real interpreters on a built host.
3. Files: every path the start-up path opens, replaced by a FIFO, a directory, a dangling symlink, an
   unreadable file and a huge file: a clear answer, not a hang (each start has a timeout).

``TMS_FUZZ_EXAMPLES`` sets the number of examples of (1) (``make fuzz``: 100,000), ``TMS_FUZZ_E2E``
those of (2) (``make fuzz``: 200).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import MAPPED, NO_DAC, REEXECD, assert_stopped, clean_env, execs, mentions_variable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tms_autopreload import decision, startup
from tms_autopreload import environment as rules
from tms_autopreload.environment import MAX_ARG_STRLEN

EXAMPLES = int(os.environ.get("TMS_FUZZ_EXAMPLES", "200"))
E2E_EXAMPLES = int(os.environ.get("TMS_FUZZ_E2E", "30"))
CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
# Read by the resolver (a plan depends on them) and by the start-up hook only: the package's own list
# (rules.OWN_VARS), so that a new variable is fuzzed the day it is added.
RESOLVER_VARS = (rules.CUDA_MAJOR_VAR, rules.PATH_VAR, "LD_PRELOAD", "LD_LIBRARY_PATH")
HOOK_VARS = tuple(v for v in rules.OWN_VARS if v not in RESOLVER_VARS)
VARS = RESOLVER_VARS + HOOK_VARS


class Executed(Exception):
    """Raised by the patched ``os.execve``: the hook decided to re-exec with a plan."""


@pytest.fixture(scope="module")
def world(scenario, parts, tmp_path_factory):
    """A venv whose plan exists (pip-only CUDA 13, torch_memory_saver 0.0.10), and paths of every kind."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    d = tmp_path_factory.mktemp("inputs")
    fifo = d / "torch_memory_saver_hook_mode_preload_fifo.so"
    os.mkfifo(fifo)
    (d / "a-directory.so").mkdir()
    (d / "dangling.so").symlink_to(d / "nowhere")
    shared = d / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    writable = shared / CU13
    writable.write_bytes((scn.site / CU13).read_bytes())
    writable.chmod(0o666)
    huge = d / "huge.so"
    with open(huge, "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB of zeros, no disk
    paths = [str(p) for p in (fifo, d / "a-directory.so", d / "dangling.so", writable, huge, scn.site / CU13,
                              scn.site / CU12, parts.rt[12] / "libcudart.so.12")]
    paths += ["/etc/passwd", "/lib/x86_64-linux-gnu/libm.so.6", "relative.so", "./" + CU13, "/", "/dev/null",
              "/dev/zero", str(d)]
    base = {"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(parts.stub)}
    return {"scn": scn, "paths": paths, "base": base, "stub": str(parts.stub)}


def _real_env_value(raw: bytes) -> str:
    """What os.environ would hold for these bytes (no NUL can be in an environment)."""
    return raw.replace(b"\0", b"").decode("utf-8", "surrogateescape")


def values(paths):
    words = ["", " ", "\t", "\n", "0", "1", "12", "13", "14", "-1", "99", "100", "1e3", "0x0d", "13.0", " 13 ",
             "١٣", "²", "true", "YES", "off", "maybe", "exec", "dlopen", "DLOPEN", "fork", "warn", "exit",
             ":", "::", ";", " : ", str(os.getpid()), "x::13::/nope::/nope.so"]
    entry = st.one_of(st.sampled_from(paths), st.sampled_from(words))
    return st.one_of(
        st.sampled_from(words),
        st.sampled_from(paths),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), max_size=40),
        st.binary(max_size=40).map(_real_env_value),
        st.integers(1, 6000).map(lambda n: "9" * n),
        st.lists(entry, max_size=6).map(":".join),
        st.lists(entry, max_size=6).map(" ".join),
        st.integers(MAX_ARG_STRLEN - 200, MAX_ARG_STRLEN + 200).map(lambda n: "/x" * (n // 2)),
    )


def environments(world, names=VARS, paths=None):
    """(changed variables, environment): the baseline with 1-4 variables given generated values.

    LD_LIBRARY_PATH keeps the driver's directory at its end, as a node's would: dropping the driver
    is a scenario of its own (test_resolver.py), not a variable's value.
    """
    def build(changes):
        env = dict(world["base"])
        for name, value in changes.items():
            env[name] = f"{value}:{world['stub']}" if name == "LD_LIBRARY_PATH" else value
        return set(changes), env

    return st.dictionaries(st.sampled_from(names), values(paths or world["paths"]), min_size=1, max_size=4).map(build)


FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@contextmanager
def installed(world):
    """This process sees the world's site-packages first, as its interpreter would."""
    site = str(world["scn"].site)
    sys.path.insert(0, site)
    try:
        yield
    finally:
        sys.path.remove(site)
        sys.path_importer_cache.pop(site, None)


def first_line(message: str) -> str:
    return message.splitlines()[0] if message else ""


def test_baseline_has_a_plan(world):
    with installed(world):
        report = decision.survey(world["base"], executable=str(world["scn"].venv.python))
    assert report.plan is not None, report.error


def test_survey_answers_every_environment(world):
    exe = str(world["scn"].venv.python)

    @FUZZ
    @given(environments(world, RESOLVER_VARS))
    def check(case):
        changed, env = case
        report = decision.survey(env, executable=exe)  # never raises
        assert (report.plan is None) == (report.error is not None)
        if report.error:
            assert "internal error" not in report.error
            line = first_line(report.error)
            assert any(mentions_variable(line, name) for name in changed), (changed, report.error)

    with installed(world):
        check()


@contextmanager
def environment(env):
    with mock.patch.dict(os.environ, env, clear=True):
        yield


TRUE_WORDS = ("1", "true", "yes", "on")  # as docs/reference.md's variable table documents them
FALSE_WORDS = ("", "0", "false", "no", "off")
# The words of each variable a user sets that has words (docs/reference.md), any case, spaces around them.
WORDS = {**{name: TRUE_WORDS + FALSE_WORDS for name in (*rules.FLAG_VARS, rules.DISABLE_VAR,
                                                         rules.VERBOSE_VAR)},
         rules.MODE_VAR: ("", *rules.MODES),
         rules.ON_ERROR_VAR: ("", *rules.ON_ERROR_POLICIES)}


def test_start_up_decision_answers_every_environment(world):
    """The hook's own reading of its variables and its resolve, in this process: exec (patched out) or
    one message naming a changed variable; never anything that would surface as an internal error. Every
    variable that has words and is given another value is warned about, alike (once per start: test_hook.py)."""
    said: list[str] = []

    @FUZZ
    @given(environments(world))
    def check(case):
        changed, env = case
        said.clear()
        with environment(env):
            on, _slime = rules.flags()  # warnings for values it cannot read, never an exception
            startup._choice(rules.MODE_VAR, rules.MODES)
            startup._choice(rules.ON_ERROR_VAR, rules.ON_ERROR_POLICIES)
            rules.inherited_hook([], rules.state_build())
            rules.inherited_hook([str(world["scn"].site / CU13)], rules.state_build())
            try:
                startup._apply(None)
            except Executed:
                pass
            except startup._Stop as stop:
                assert "internal error" not in str(stop)
                assert any(mentions_variable(first_line(str(stop)), name) for name in changed), (changed, str(stop))
        for message in said:
            if message.startswith("warning:") and "is not" in message:
                assert any(mentions_variable(message, name) for name in changed), (changed, message)
        for name, words in WORDS.items():  # and every variable given a value outside its words is said
            if name in changed and env[name].strip().lower() not in words:
                assert any(message.startswith(f"warning: {name}=") for message in said), (name, env[name], said)

    def no_exec(*args):
        raise Executed()

    with installed(world), mock.patch.object(os, "execve", no_exec), \
            mock.patch.object(startup, "_load_in_process", lambda env, verbose: "not loaded in the test process"), \
            mock.patch.object(rules, "say", said.append), mock.patch.object(startup, "say", said.append):
        check()


@pytest.mark.parametrize("value", ["ture", "disable", "2", " On "])
def test_every_word_but_an_off_word_turns_the_kill_switch_on(value):
    """The kill switch fails safe, a misspelling included (with a warning for an unknown word). The
    environments generated above reach such a word only by chance: this asks each kind of one every run."""
    on, warning = rules.kill_switch({"TMS_AUTOPRELOAD_DISABLE": value})
    assert on, value
    assert (warning is None) is (value.strip().lower() in TRUE_WORDS), (value, warning)
    assert rules.kill_switch({"TMS_AUTOPRELOAD_DISABLE": "off"}) == (False, None)


def test_a_mapped_build_that_ld_preload_does_not_name_is_resolved_again(tmp_path):
    """A start reuses what a parent resolved only where every torch_memory_saver entry of LD_PRELOAD names the
    one mapped build: where LD_PRELOAD names none (the build mapped some other way, or through a name without
    the words), there is nothing to rewrite it from, and the start resolves (None), whatever the value."""
    build = tmp_path / CU13
    build.write_bytes(b"")
    path = str(build)
    for preload, want in (("", None), ("/opt/other.so", None), (f"/opt/{CU12}", None),
                          (path, (path, path)), (f"/opt/a.so {path}", (path, f"{path}:/opt/a.so"))):
        with environment({"LD_PRELOAD": preload}):
            assert rules.inherited_hook([path], path) == want, preload


def test_a_file_whose_path_cannot_be_examined_is_refused_not_raised(tmp_path):
    """Who can write a file is judged component by component; a component that cannot be examined (gone
    between the listing and the check, here never there) is a refusal naming the path, never an exception
    out of the survey."""
    from tms_autopreload import trust

    gone = tmp_path / "gone" / CU13
    refused = trust.refusal(str(gone), trust.Trusted([sys.prefix]))
    assert refused is not None and refused.cause == "unchecked", refused
    assert refused.message == f"cannot check who can write {gone} (No such file or directory)", refused.message


def test_the_trust_walk_follows_as_many_symbolic_links_as_the_kernel(tmp_path):
    """The trust rule walks a path as the kernel resolves it; where the kernel gives up on too many symbolic
    links (ELOOP), the walk does too, with the kernel's own words, at the same count: judged by ``os.stat`` on
    chains one link below and one above the limit, never by a number written here."""
    from tms_autopreload import trust

    build = tmp_path / CU13
    build.write_bytes(b"")
    for length in range(38, 43):
        chain = tmp_path / f"chain{length}"
        chain.mkdir()
        target = str(build)
        for i in range(length):
            (chain / f"l{i}").symlink_to(target)
            target = str(chain / f"l{i}")
        try:
            os.stat(target)
        except OSError as exc:
            kernel: "str | None" = exc.strerror
        else:
            kernel = None
        refused = trust.refusal(target, trust.Trusted([str(tmp_path)]))
        if kernel is None:
            assert refused is None or refused.cause != "unchecked", (length, refused)
        else:
            assert refused is not None and refused.cause == "unchecked", (length, refused)
            assert refused.message == f"cannot check who can write {target} ({kernel})", refused.message
            assert refused.fix == "name the file itself, or through fewer symbolic links", refused.fix


def test_a_forced_path_the_kernel_cannot_reach_says_why_in_its_words(world, tmp_path):
    """``TMS_AUTOPRELOAD_PATH`` through more symbolic links than the kernel follows exists, but cannot be
    reached: the answer gives the kernel's own reason (``os.stat``'s), never "does not exist"."""
    exe = str(world["scn"].venv.python)
    target = str(tmp_path / CU13)
    Path(target).write_bytes(b"")
    for i in range(41):
        os.symlink(target, tmp_path / f"torch_memory_saver_link{i}.so")
        target = str(tmp_path / f"torch_memory_saver_link{i}.so")
    try:
        os.stat(target)
    except OSError as exc:
        kernel = exc.strerror
    with installed(world):
        error = decision.survey({**world["base"], "TMS_AUTOPRELOAD_PATH": target}, executable=exe).error
    assert error.startswith(f"TMS_AUTOPRELOAD_PATH={target!r} cannot be reached ({kernel})."), error


def test_the_three_reported_inputs(world):
    """Three answers that once named the wrong thing: each now names the variable the user set."""
    exe = str(world["scn"].venv.python)
    with installed(world):
        for path in ("/etc/passwd", "/lib/x86_64-linux-gnu/libm.so.6"):
            error = decision.survey({**world["base"], "TMS_AUTOPRELOAD_PATH": path}, executable=exe).error
            assert first_line(error).startswith(f"TMS_AUTOPRELOAD_PATH={path!r} does not name a torch_memory_saver "
                                                f"preload build"), error
            assert "`unset TMS_AUTOPRELOAD_PATH` (or point it at one" in error and "pip install" not in error
        error = decision.survey({**world["base"], "TMS_AUTOPRELOAD_CUDA_MAJOR": "9" * 5000}, executable=exe).error
        assert error.startswith("TMS_AUTOPRELOAD_CUDA_MAJOR='9999") and "(5000 characters)" in error
        assert "internal error" not in error and len(error) < 400
        # A deep path (a conda env's site-packages, 180 characters here) is quoted whole, as the user copies
        # it; a path no file system holds (5000 characters) is cut.
        deep = "/home/a-user/miniconda3/envs/" + "x" * 80 + "/lib/python3.11/site-packages/torch_memory_saver_hook.so"
        error = decision.survey({**world["base"], "TMS_AUTOPRELOAD_PATH": deep}, executable=exe).error
        assert error.startswith(f"TMS_AUTOPRELOAD_PATH={deep!r} does not exist."), error
        error = decision.survey({**world["base"], "TMS_AUTOPRELOAD_PATH": "/" + "x" * 4999}, executable=exe).error
        assert "(5000 characters)" in error and len(error) < 1500, error
    fifo = next(p for p in world["paths"] if p.endswith("_fifo.so"))
    scn = world["scn"]
    link = scn.site / "torch_memory_saver_hook_mode_preload_cu14.abi3.so"
    os.symlink(fifo, link)
    try:
        r = scn.run(["-m", "tms_autopreload", "which"], {"LD_LIBRARY_PATH": world["stub"]}, timeout=60)
        assert r.returncode == 0, r.stderr  # and no hang on the FIFO: the timeout would fail the test
        doc = scn.doctor({"LD_LIBRARY_PATH": world["stub"]})
        reason = next(c["reason"] for c in doc["candidates"] if c["path"].endswith("_cu14.abi3.so"))
        assert reason == "cannot read it: not a regular file (a FIFO)"
    finally:
        link.unlink()


# ---------------------------------------------------------------- 2. end to end, real interpreters

E2E_PROBE = REEXECD + MAPPED + r"""
import json, os, sys
maps = mapped('torch_memory_saver')
print(json.dumps({'argv': sys.argv[1:], 'stdin': sys.stdin.read(), 'hooks': maps, 'reexecd': reexecd(),
                  'bytes': os.environb.get(b'TMS_TEST_BYTES', b'').hex()}))
"""


def _is_on(env: dict, name: str) -> bool:
    return env.get(name, "").strip().lower() in TRUE_WORDS


def _kill_switch_on(env: dict) -> bool:
    """The kill switch fails safe: set to anything but an off word, it is on."""
    return env.get("TMS_AUTOPRELOAD_DISABLE", "").strip().lower() not in FALSE_WORDS


def _expected_build(env: dict, scn) -> "str | None":
    """The build a start with ``env`` must end with mapped when it runs, or None for an unhooked start:
    no flag on, or TMS_AUTOPRELOAD_DISABLE on. Else the file TMS_AUTOPRELOAD_PATH names, or the
    installed build for this host's CUDA 13."""
    if _kill_switch_on(env) or not (_is_on(env, "SLIME_OFFLOAD_TRAIN")
                                                        or _is_on(env, "TMS_AUTOPRELOAD")):
        return None
    forced = env.get("TMS_AUTOPRELOAD_PATH", "").strip()
    return os.path.realpath(forced or scn.site / CU13)


def test_flagged_starts_answer_every_environment(world):
    scn = world["scn"]
    argv = ["a1", "a 2", "\u00e9"]
    stdin = "data for the program\n"

    # The loader opens every LD_PRELOAD entry at start, before any of this package runs: it blocks on a
    # FIFO there, and a preload whose dependency is missing (a CUDA build without its libcudart on this
    # host: the crash of slime #2186) kills the process with 127. Those outcomes are glibc's, with inputs this
    # package never sees, so such entries stay out of the started environments' LD_PRELOAD.
    fatal_at_start = [p for p in world["paths"] if p.endswith(("_fifo.so", "_cu12.abi3.so", "_cu13.abi3.so"))]
    paths = [p for p in world["paths"] if not p.endswith("_fifo.so")]

    @settings(max_examples=E2E_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(environments(world, paths=paths))
    def check(case):
        changed, env = case
        if "LD_PRELOAD" in env:
            env["LD_PRELOAD"] = ":".join(e for e in env["LD_PRELOAD"].replace(" ", ":").split(":")
                                         if e not in fatal_at_start)
        env = {**env, "TMS_AUTOPRELOAD": env.get("TMS_AUTOPRELOAD", "1")}
        benv = {k.encode(): v.encode("utf-8", "surrogateescape") for k, v in env.items()}
        benv = {k: v for k, v in benv.items() if len(k) + len(v) + 2 <= MAX_ARG_STRLEN}  # what exec can carry
        env = {k.decode(): v.decode("utf-8", "surrogateescape") for k, v in benv.items()}  # what the start gets
        benv[b"TMS_TEST_BYTES"] = b"\xff\xfe undecodable \x80"
        cmd = [*scn.host.wrap([], {}), *(k + b"=" + v for k, v in benv.items()), str(scn.venv.python), "-c",
               E2E_PROBE, *argv]
        r = subprocess.run(cmd, input=stdin.encode(), capture_output=True, timeout=120, env=clean_env())
        err = r.stderr.decode("utf-8", "replace")
        assert r.returncode in (0, 78), (changed, r.returncode, err[-2000:])
        assert "Traceback" not in err and "error while loading shared libraries" not in err, err[-2000:]
        expected = _expected_build(env, scn)
        if r.returncode == 78:
            assert expected is not None, (changed, err[-2000:])  # an unflagged start never stops
            assert_stopped(r, verbose=_is_on(env, "TMS_AUTOPRELOAD_VERBOSE"))
            return
        out = json.loads(r.stdout.decode().strip().splitlines()[-1])
        assert out["argv"] == argv and out["stdin"] == stdin
        assert bytes.fromhex(out["bytes"]) == b"\xff\xfe undecodable \x80"
        hooks = [os.path.realpath(h) for h in out["hooks"]]
        if expected is None:  # no flag: nothing happened
            assert hooks == [] and execs(out["reexecd"]) == 0, (changed, out, err[-2000:])
        elif not hooks:  # it failed and was told to go on: it says so
            assert env.get("TMS_AUTOPRELOAD_ON_ERROR", "").strip().lower() == "warn", (changed, err[-2000:])
            assert "continuing without the hook" in err and execs(out["reexecd"]) == 0, (changed, err[-2000:])
        else:
            assert hooks == [expected], (changed, hooks, expected, err[-2000:])
            # exec mode (the default, and any value other than dlopen) always re-execs once here: no start
            # environment names a build that loads (see fatal_at_start); dlopen mode may fall back to exec
            if env.get("TMS_AUTOPRELOAD_MODE", "").strip().lower() != "dlopen":
                assert execs(out["reexecd"]) == 1, (changed, err[-2000:])

    check()


# ---------------------------------------------------------------- 3. files on the start-up path

KINDS = ["fifo", "directory", "dangling-symlink", "unreadable", "huge"]
MAKE = {  # shell that puts each kind at "$p" (sparse: the huge file costs no disk)
    "fifo": 'rm -rf "$p" && mkfifo "$p"',
    "directory": 'rm -rf "$p" && mkdir "$p"',
    "dangling-symlink": 'rm -rf "$p" && ln -s /nowhere/at/all "$p"',
    "unreadable": 'chmod 000 "$p"',
    "huge": 'rm -rf "$p" && truncate -s 4G "$p"',
}
SITE_FILES = {  # where, relative to site-packages, and what a start must then answer
    "candidate": (f"{CU13[:-len('_cu13.abi3.so')]}_cu14.abi3.so", "hooked"),
    "torch/version.py": ("torch/version.py", "stopped"),
    "libtorch_global_deps.so": ("torch/lib/libtorch_global_deps.so", "hooked"),
    "hooks/mode_preload.py": ("torch_memory_saver/hooks/mode_preload.py", "hooked"),
    "METADATA": ("torch_memory_saver-0.0.10.dist-info/METADATA", "hooked"),
}
PROBE_MAPS = REEXECD + MAPPED + """
import json
print(json.dumps({'hooks': mapped('torch_memory_saver'), 'reexecd': reexecd()}))
"""


@pytest.fixture(scope="module")
def files_scn(scenario):
    return scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",), tag="start-up-files")


def _assert_clear(r, expect, scn):
    """Hooked with exactly the installed CUDA 13 build after one exec, or stopped with one message.
    Each start runs under a timeout: a wait on a FIFO or a read of 4 GiB fails the test there."""
    if expect == "hooked":
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stdout + r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["hooks"] == [str(scn.site / CU13)] and execs(out["reexecd"]) == 1, (out, r.stderr)
    else:
        assert_stopped(r)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("place", list(SITE_FILES))
def test_site_files_of_every_kind_get_a_clear_answer(files_scn, place, kind):
    relative, expect = SITE_FILES[place]
    target = files_scn.site / relative
    saved = target.with_name(target.name + ".saved")
    if target.exists():
        os.replace(target, saved)
        if kind == "unreadable":
            target.write_bytes(saved.read_bytes())
    elif kind == "unreadable":
        target.write_bytes((files_scn.site / CU13).read_bytes())
    try:
        subprocess.run(["sh", "-c", MAKE[kind]], env={"p": str(target), "PATH": os.environ["PATH"]}, check=True)
        # Another LD_PRELOAD entry, which the plan keeps: whether torch_memory_saver reads LD_PRELOAD as one path is
        # then asked of its files (dist-info/METADATA, hooks/mode_preload.py).
        r = files_scn.host.run([*(NO_DAC if kind == "unreadable" else []), str(files_scn.venv.python), "-c",
                                PROBE_MAPS], clean_env(TMS_AUTOPRELOAD="1", LD_PRELOAD="libm.so.6"), timeout=60)
        _assert_clear(r, expect, files_scn)
        if place == "torch/version.py":
            assert "torch/version.py" in r.stderr
    finally:
        subprocess.run(["rm", "-rf", str(target)], check=True)
        if saved.exists():
            os.replace(saved, target)


SYSTEM_LIBS = "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu"


@pytest.mark.parametrize("kind", KINDS)
def test_loader_cache_of_every_kind_gets_a_clear_answer(files_scn, parts, kind):
    """/etc/ld.so.cache replaced (a tmpfs over /etc). LD_LIBRARY_PATH names the system libraries, so that
    the loader itself never needs the cache (glibc's own open of a FIFO there would block every program)."""
    setup = ('mount -t tmpfs none /etc && p=/etc/ld.so.cache && cp "$0" "$p" && ' + MAKE[kind] +
             f" && export LD_LIBRARY_PATH={SYSTEM_LIBS}")
    env = clean_env(TMS_AUTOPRELOAD="1", LD_LIBRARY_PATH=f"{SYSTEM_LIBS}:{parts.stub}")
    r = files_scn.host.run([*(NO_DAC if kind == "unreadable" else []), str(files_scn.venv.python), "-c", PROBE_MAPS],
                           env, setup=setup, timeout=60)
    _assert_clear(r, "hooked", files_scn)


@pytest.mark.parametrize("kind", KINDS)
def test_proc_self_maps_of_every_kind_gets_a_clear_answer(files_scn, kind):
    """/proc replaced by a tmpfs whose self/maps is the kind under test: the hook cannot see what is
    mapped, so it cannot confirm any plan, and says so once (exit 78) instead of looping or hanging."""
    setup = 'mount -t tmpfs none /proc && mkdir /proc/self && p=/proc/self/maps && touch "$p" && ' + MAKE[kind]
    r = files_scn.host.run([*(NO_DAC if kind == "unreadable" else []), str(files_scn.venv.python), "-c", "print(1)"],
                           clean_env(TMS_AUTOPRELOAD="1"), setup=setup, timeout=60)
    _assert_clear(r, "stopped", files_scn)
    assert "is /proc mounted?" in r.stderr, r.stderr


# ---------------------------------------------------------------- 4. the kernel's limit on one environment string

@pytest.mark.parametrize("name", ["LD_PRELOAD", "LD_LIBRARY_PATH"])
def test_a_planned_value_over_the_kernels_limit_stops_before_any_exec(world, name):
    """A value that still fits now but not with the plan's entries added: a clear error naming the
    variable and the limit, exit 78 before the exec the kernel would refuse (E2BIG)."""
    scn = world["scn"]
    tail = f":{world['stub']}" if name == "LD_LIBRARY_PATH" else ""
    room = MAX_ARG_STRLEN - 10 - len(f"{name}=") - 1 - len(tail)  # 10 bytes left: no path fits in them
    value = ":".join(["/opt/" + "x" * 100] * (room // 106))
    value += ":/opt/" + "y" * (room - len(value) - 6) + tail
    assert len(f"{name}={value}") + 1 == MAX_ARG_STRLEN - 10  # the process itself can start with it
    r = scn.run(["-c", "print('user code ran')"], {"TMS_AUTOPRELOAD": "1", "LD_LIBRARY_PATH": world["stub"],
                                                   name: value}, timeout=60)
    message = assert_stopped(r, f"over the kernel's limit of {MAX_ARG_STRLEN} bytes")
    assert message.startswith(f"tms-autopreload: {name} would be "), r.stderr[-2000:]


@pytest.mark.parametrize("past", [0, 1], ids=["at-the-limit", "one-byte-past"])
def test_the_kernels_limit_is_kept_to_the_byte(world, past):
    """MAX_ARG_STRLEN counts the string's NUL: a planned LD_PRELOAD of exactly that many bytes is applied
    (the kernel's execve takes it and the hooked program runs), one byte more stops before any exec."""
    scn, base = world["scn"], {"LD_LIBRARY_PATH": world["stub"]}
    r = scn.run(["-m", "tms_autopreload", "env"], {**base, "LD_PRELOAD": "/opt/a"})
    planned = next(line.split("=", 1)[1] for line in shlex.split(r.stdout) if line.startswith("LD_PRELOAD="))
    assert planned.endswith(":/opt/a"), r.stdout  # the plan's entries, then this process's own
    room = MAX_ARG_STRLEN - len("LD_PRELOAD=") - (len(planned) - len("/opt/a")) - 1 + past  # the NUL
    value = ":".join(["/opt/" + "x" * 100] * (room // 106))
    value += ":/opt/" + "y" * (room - len(value) - 6)
    assert len(value) == room
    r = scn.run(["-c", "import os; print('user code ran', len(os.environ['LD_PRELOAD']))"],
                {**base, "TMS_AUTOPRELOAD": "1", "LD_PRELOAD": value}, timeout=60)
    if past:
        message = assert_stopped(r, f"over the kernel's limit of {MAX_ARG_STRLEN} bytes")
        assert f"LD_PRELOAD would be {MAX_ARG_STRLEN + 1} bytes" in message, message
    else:
        assert r.returncode == 0, r.stderr[-2000:]
        assert r.stdout.split() == ["user", "code", "ran", str(MAX_ARG_STRLEN - len("LD_PRELOAD=") - 1)], r.stdout


def test_doctor_answers_where_the_kernel_refuses_every_trace(world):
    """No runtime is decided (the override names no major), and LD_PRELOAD is so long that a build's entry put
    before it passes the kernel's limit: doctor's loader trace of each candidate cannot be started (E2BIG), and
    doctor still answers with the cause, each candidate's load unknown where, without that LD_PRELOAD, the
    loader answers it."""
    scn, base = world["scn"], {"LD_LIBRARY_PATH": world["stub"], "TMS_AUTOPRELOAD_CUDA_MAJOR": "x"}
    room = MAX_ARG_STRLEN - 10 - len("LD_PRELOAD=") - 1  # the process itself can start with it
    value = ":".join(["/opt/" + "x" * 100] * (room // 106))
    docs = [json.loads(scn.run(["-m", "tms_autopreload", "doctor", "--json"], {**base, **extra}, timeout=60).stdout)
            for extra in ({}, {"LD_PRELOAD": value})]
    assert [d["cause"] for d in docs] == ["bad-version", "bad-version"], docs
    loads = [[c["loads"] for c in d["candidates"] if c["cause"] == "no-runtime"] for d in docs]
    assert loads[0] and None not in loads[0] and loads[1] == [None] * len(loads[0]), docs


def test_a_bash_on_path_that_is_a_script_is_no_child_the_plan_is_judged_by(world, tmp_path):
    """PATH finds a ``bash`` that is a shell script first (a wrapper some environments put there): no ELF program
    the loader could trace, so the plan is judged by the programs that are; the start is hooked once, and that
    ``bash`` starts under the plan."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "bash").write_text('#!/bin/sh\nexec /bin/bash "$@"\n')
    (bindir / "bash").chmod(0o755)
    probe = PROBE_MAPS + "import subprocess; subprocess.run(['bash', '-c', 'echo child ran'], check=True)"
    r = world["scn"].run(["-c", probe], {"TMS_AUTOPRELOAD": "1", "LD_LIBRARY_PATH": world["stub"],
                                          "PATH": f"{bindir}:{os.environ['PATH']}"}, timeout=60)
    said, ran = sorted(r.stdout.splitlines(), key=lambda line: line == "child ran")  # the child writes unbuffered
    assert r.returncode == 0 and ran == "child ran", r.stdout + r.stderr
    out = json.loads(said)
    assert out["hooks"] == [str(world["scn"].site / CU13)] and execs(out["reexecd"]) == 1, (out, r.stderr)
