"""The resolver's pure steps, in this process: which builds fit a runtime (``_fits``), the screen before any
trace (``_screen``), and the judgement of one loader trace (``judge.judge``), on builds, runtimes and traces made
here. The real loader's side of the same steps is in test_resolver.py.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import support

sys.path.insert(0, str(support.ROOT))

from tms_autopreload import attempt as judging
from tms_autopreload import decision, errors, reinstall, releases, verdict
from tms_autopreload import trace as tracing
from tms_autopreload.builds import Build, find_builds
from tms_autopreload.elf import DynamicInfo, read_dynamic
from tms_autopreload.ldso import Found, Object
from tms_autopreload.runtime import Runtime, _parse_version_py
from tms_autopreload.trace import Trace, _parse
from tms_autopreload.errors import CAUSE_WORLD_WRITABLE
from tms_autopreload.trust import Refusal, Trusted

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
PLAIN = "torch_memory_saver_hook_mode_preload.abi3.so"
DRIVER = "torch_memory_saver_cpp.abi3.so"


def build(path, kind="cuda", major=13, problem=None, refusal=None):
    b = Build(str(path), kind, major, None, problem)
    b._judged, b._refusal = True, refusal  # as if judged against the process's code writers
    return b


def cuda(major=13, library=None):
    found = Found(str(library), "/etc/ld.so.cache") if library else None
    return Runtime("cuda", major, "a test", found, None)


@pytest.mark.parametrize("kind, major, runtime, fits", [
    ("cuda", 13, ("cuda", 13), True),
    ("cuda", 12, ("cuda", 13), False),
    ("driver", None, ("cuda", 12), True),  # needs only libcuda.so.1: any CUDA runtime
    ("driver", None, ("hip", 6), False),
    ("hip", 6, ("hip", 6), True),
    ("hip", 5, ("hip", 6), False),
    ("cuda", 6, ("hip", 6), False),
    ("unusable", None, ("cuda", 13), False),
])
def test_fits(kind, major, runtime, fits):
    assert decision._fits(build("/x.so", kind, major), Runtime(*runtime, "a test", None, None)) is fits


def test_screen_rejects_with_causes_and_orders_the_rest_best_first():
    refused = Refusal(CAUSE_WORLD_WRITABLE, "/s is writable by every user", "chmod o-w /s")
    builds = [build(f"/s/{DRIVER}", "driver", None), build(f"/s/{PLAIN}"), build(f"/s/{CU12}", major=12),
              build(f"/s/{CU13}"), build("/s/broken.so", "unusable", None, problem="not a loadable ELF object"),
              build(f"/t/{CU13}", refusal=refused)]
    verdicts, eligible = decision._screen(builds, cuda(13))
    # The exact runtime before driver-only; a _cu13 name before an unsuffixed one.
    assert eligible == [3, 1, 0]
    assert {i: (v.status, v.cause) for i, v in verdicts.items()} == {
        2: (verdict.REJECTED, errors.CAUSE_WRONG_RUNTIME), 4: (verdict.REJECTED, errors.CAUSE_UNUSABLE),
        5: (verdict.REJECTED, CAUSE_WORLD_WRITABLE)}
    assert verdicts[2].reason == "built for CUDA 12 (needs libcudart.so.12), not for this process's CUDA 13"
    assert verdicts[5].fix == "chmod o-w /s" and "TMS_AUTOPRELOAD_PATH" in verdicts[5].reason
    assert repr(verdicts[2]) == f"Verdict(build='/s/{CU12}', status='rejected', cause='wrong-runtime')"


def test_screen_without_a_runtime_tries_nothing():
    verdicts, eligible = decision._screen([build(f"/s/{CU13}"), build("/s/x.so", problem="cannot read it")], None)
    assert eligible == []
    assert [(v.status, v.cause) for v in verdicts.values()] == [(verdict.UNTRIED, errors.CAUSE_NO_RUNTIME),
                                                               (verdict.REJECTED, errors.CAUSE_UNUSABLE)]


@pytest.fixture
def files(tmp_path):
    """A build and two copies of the runtime, as real files (the judge compares files, not names)."""
    for name in (CU13, DRIVER, "libcudart.so.13"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "libcudart.so.13").write_bytes(b"")
    return tmp_path


def judge(files, trace, kind="cuda", name=CU13):
    b = build(files / name, kind, 13 if kind == "cuda" else None)
    runtime = cuda(13, files / "libcudart.so.13")
    planned = verdict.Plan(b.path, b.path, None, runtime)
    return planned, judging.judge(b, planned, trace)


def test_judge_accepts_a_clean_trace_that_binds_torchs_copy(files):
    trace = Trace({"libcudart.so.13": str(files / "libcudart.so.13"), "libcuda.so.1": "/drv/libcuda.so.1"},
                  (str(files / CU13),))
    planned, v = judge(files, trace)
    assert (v.status, v.cause, v.loader_ok, v.plan) == (verdict.LOADS, None, True, planned)
    assert v.reason == f"loads; binds libcudart.so.13 to {files / 'libcudart.so.13'}"


def test_judge_accepts_a_bare_name_entry_found_through_the_search_path(files):
    trace = Trace({CU13: str(files / CU13), "libcudart.so.13": str(files / "libcudart.so.13")})
    assert judge(files, trace)[1].status == verdict.LOADS


def test_judge_refuses_a_second_runtime_copy(files):
    trace = Trace({"libcudart.so.13": str(files / "other" / "libcudart.so.13")}, (str(files / CU13),))
    v = judge(files, trace)[1]
    assert (v.status, v.cause, v.loader_ok, v.plan) == (verdict.REJECTED, errors.CAUSE_TWO_RUNTIMES, True, None)
    assert "two runtime copies" in v.reason


def test_judge_names_a_missing_driver(files):
    v = judge(files, Trace(missing=("libcuda.so.1",), loaded=(str(files / CU13),)))[1]
    assert (v.status, v.cause, v.loader_ok) == (verdict.REJECTED, errors.CAUSE_NO_DRIVER, False)
    assert v.reason.endswith("loader: libcuda.so.1 => not found") and "install the NVIDIA driver" in v.fix


def test_judge_gives_the_runtimes_install_hint_when_the_runtime_is_missing(files):
    v = judge(files, Trace(missing=("libcudart.so.13",), loaded=(str(files / CU13),)))[1]
    assert (v.cause, v.reason) == (errors.CAUSE_DOES_NOT_LOAD, "libcudart.so.13 => not found")
    assert v.fix is not None and "13" in v.fix


def test_judge_a_loader_log_that_skipped_the_build(files):
    """From the loader's own text: the skip message, then the program's trace lines."""
    log = (f"ERROR: ld.so: object '{files / CU13}' from LD_PRELOAD cannot be preloaded (wrong ELF class: "
           f"ELFCLASS32): ignored.\n\tlinux-vdso.so.1 (0x00007ffd)\n\tlibc.so.6 => /lib/libc.so.6 (0x00007f00)\n")
    v = judge(files, _parse(log, 0))[1]
    assert (v.status, v.cause, v.loader_ok, v.fix) == (verdict.REJECTED, errors.CAUSE_DOES_NOT_LOAD, False, None)
    assert v.reason == "the loader skipped it as a preload: wrong ELF class: ELFCLASS32"


def test_judge_a_silent_loader_that_did_not_preload_it(files):
    v = judge(files, Trace({"libc.so.6": "/lib/libc.so.6"}))[1]
    assert (v.status, v.cause, v.loader_ok) == (verdict.REJECTED, errors.CAUSE_NOT_PRELOADED, False)


def test_judge_a_driver_only_build_needs_no_runtime_binding(files):
    planned, v = judge(files, Trace(loaded=(str(files / DRIVER),)), kind="driver", name=DRIVER)
    assert (v.status, v.reason, v.plan) == (verdict.LOADS, "loads", planned)


@pytest.mark.parametrize("version, one_path", [("0.0.8", True), ("0.0.9", True), ("0.0.9.post1", True),
                                               ("0.0.10", False), ("0.0.10.post2", False), ("0.1.0", False)])
def test_the_installed_version_says_whether_ld_preload_is_read_as_one_path(tmp_path, version, one_path):
    """The distribution's metadata decides, whatever the code spells (here: nothing at all)."""
    (tmp_path / "torch_memory_saver").mkdir()
    info = tmp_path / f"torch_memory_saver-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_memory_saver\nVersion: {version}\n\n")
    assert releases.reads_one_path(str(tmp_path / "torch_memory_saver")) is one_path


def test_without_metadata_the_code_says_whether_ld_preload_is_read_as_one_path(tmp_path):
    hooks = tmp_path / "torch_memory_saver" / "hooks"
    hooks.mkdir(parents=True)
    assert releases.reads_one_path(str(hooks.parent)) is True  # no mode_preload.py: 0.0.8's layout
    (hooks / "mode_preload.py").write_text('paths = [p for p in os.environ["LD_PRELOAD"].split(":")]\n')
    assert releases.reads_one_path(str(hooks.parent)) is False


def test_an_error_prints_its_fix_after_the_message_or_on_its_own_line():
    assert str(errors.ResolveError("no build", fix="install one", cause="no-build-fits")) == \
        "no build. Fix: install one"
    assert str(errors.ResolveError("no build:\n  - a.so: why", fix="install one")) == \
        "no build:\n  - a.so: why\nFix: install one"
    assert errors.ResolveError("x").cause == errors.CAUSE_NO_PLAN and errors.Error("x").cause == errors.CAUSE_ERROR


def test_reprs_are_short():
    p = verdict.Plan("/s/hook.so", "/s/hook.so", None, cuda())
    assert repr(p) == "Plan(build='/s/hook.so', ld_preload='/s/hook.so')"
    failure = errors.ResolveError("no build", cause=errors.CAUSE_NO_BUILDS)
    report = decision.Report("/bin/python", None, None, (), None, failure)
    assert repr(report) == "Report(cause='no-builds', verdicts=[])" and report.error == "no build"


def recorded_spawns(monkeypatch) -> list[tuple[int, int]]:
    """Every loader trace the trace module starts from now on, as (its PID, the read end of its pipe), in order."""
    spawned = []
    real_spawn = tracing.spawn

    def spawn(argv, env):
        pid, fd = real_spawn(argv, env)
        spawned.append((pid, fd))
        return pid, fd

    monkeypatch.setattr(tracing, "spawn", spawn)
    return spawned


def test_traces_started_together_are_all_reaped_when_collecting_one_is_interrupted(monkeypatch):
    """An interrupt while the first answer is read (Ctrl-C at start-up) still reaps every traced program
    started beside it, and closes their pipes: no zombie, no descriptor left to a long-lived caller."""
    class InterruptedOnce:
        """``os`` for the trace module, but its first ``read`` is interrupted."""

        def __init__(self):
            self.interrupted = False

        def __getattr__(self, name):
            return getattr(os, name)

        def read(self, fd, n):
            if not self.interrupted:
                self.interrupted = True
                raise KeyboardInterrupt
            return os.read(fd, n)

    spawned = recorded_spawns(monkeypatch)
    collect = tracing.start_traces([sys.executable, "/bin/sh", "/bin/sh"], dict(os.environ))
    monkeypatch.setattr(tracing, "os", InterruptedOnce())
    with pytest.raises(KeyboardInterrupt):
        collect()
    assert len(spawned) == 3
    for pid, fd in spawned:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reaped already
        with pytest.raises(OSError):
            os.fstat(fd)  # closed


def test_a_tracing_block_reaps_its_traces_on_every_way_out(monkeypatch):
    """The real loader's traces that a ``with Tracing`` block started are reaped however it is left: started
    again under another environment (the first ones reaped then), left by an exception with nobody waiting for
    their answers, or answered, once. No zombie, no descriptor left to a long-lived caller."""
    spawned = recorded_spawns(monkeypatch)

    def reaped(pid, fd):
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        with pytest.raises(OSError):
            os.fstat(fd)  # closed (checked where no pipe opened since can have its number)
        return True

    env = dict(os.environ)
    with pytest.raises(LookupError), tracing.Tracing([sys.executable, "/bin/sh"], env) as traced:
        traced.restart({**env, "LD_LIBRARY_PATH": "/nonexistent"})
        assert len(spawned) == 4
        for pid, _ in spawned[:2]:
            with pytest.raises(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)  # reaped already
        raise LookupError
    assert all(reaped(*s) for s in spawned)
    with tracing.Tracing([sys.executable], env) as traced:
        answer, = traced.answers()
        assert traced.answers() == []
    assert isinstance(answer, Trace) and answer.loaded and reaped(*spawned[-1])


# ---------------------------------------------------------------- a damaged release's reinstall command

def installed_release(site, version="0.0.10", live=True, record=None):
    """torch_memory_saver ``version`` as pip leaves it in ``site`` (its package, a RECORD with sizes, maybe a
    ``direct_url.json``), its CUDA 13 build removed since; ``live=False``: the old record a ``pip install
    --target DIR --upgrade`` leaves beside the new one, whose files it lists are not those on disk."""
    package = site / "torch_memory_saver"
    package.mkdir(parents=True, exist_ok=True)
    code = package / "__init__.py"
    code.write_text("# the installed release's code\n")
    info = site / f"torch_memory_saver-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_memory_saver\nVersion: {version}\n")
    size = code.stat().st_size if live else code.stat().st_size + 1
    (info / "RECORD").write_text(f"torch_memory_saver/__init__.py,,{size}\n{CU13},,123456\n"
                                 f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
    if record is not None:
        (info / "direct_url.json").write_text(json.dumps(record))
    return str(package)


def test_a_removed_build_of_an_index_release_is_forced_back_as_that_release(tmp_path):
    """pip's record lists the CUDA 13 build, which is gone: the fix names it and reinstalls that release by
    ``--force-reinstall`` (a plain install of the installed version does nothing), for a CUDA 13 runtime."""
    package = installed_release(tmp_path / "site")
    hint = reinstall.reinstall_hint(package, 13)
    assert hint and hint.startswith(f"torch-memory-saver 0.0.10 is installed but its {CU13} is missing: "), hint
    assert "--force-reinstall" in hint and "torch-memory-saver==0.0.10" in hint, hint
    assert reinstall.build_install_hint("cuda", 13, package) == hint


@pytest.mark.parametrize("live", ["0.0.9.post1", "0.0.10"])
def test_of_two_records_left_in_one_folder_the_one_whose_files_are_there_is_reinstalled(tmp_path, live):
    """Two records of torch_memory_saver in one folder (``pip install --target DIR --upgrade`` leaves the
    old one): the release whose recorded files are on disk is the installed one, whichever is newer."""
    for version in ("0.0.9.post1", "0.0.10"):
        package = installed_release(tmp_path / "site", version, live=version == live)
    hint = reinstall.reinstall_hint(package, 13)
    assert hint and hint.startswith(f"torch-memory-saver {live} is installed but") and f"=={live}`" in hint, hint


def test_a_removed_build_is_reinstalled_from_the_recorded_source_while_it_is_there(tmp_path):
    """A copy pip installed from a wheel file (PEP 610 ``archive_info``) is installed again from that file
    while it is there; once it is gone, from the index as its release."""
    wheel = tmp_path / "dl" / "torch_memory_saver-0.0.10-cp39-abi3-linux_x86_64.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"a wheel")
    package = installed_release(tmp_path / "site", record={"url": wheel.as_uri(), "archive_info": {}})
    hint = reinstall.reinstall_hint(package, 13)
    assert hint and "--force-reinstall" in hint and str(wheel) in hint and "==0.0.10" not in hint, hint
    wheel.unlink()
    hint = reinstall.reinstall_hint(package, 13)
    assert hint and "torch-memory-saver==0.0.10" in hint and str(wheel) not in hint, hint



def test_a_removed_build_whose_record_cannot_be_read_is_reinstalled_as_its_release(tmp_path):
    """The ``direct_url.json`` pip wrote is not JSON any more (a file cut short): no source is known, so the fix
    reinstalls the release from the index, as for a copy pip installed from it."""
    package = installed_release(tmp_path / "site", record={"url": "file:///gone.whl", "archive_info": {}})
    record = next((tmp_path / "site").glob("torch_memory_saver-*.dist-info")) / "direct_url.json"
    record.write_text(record.read_text()[:10])
    hint = reinstall.reinstall_hint(package, 13)
    assert hint and "--force-reinstall" in hint and "torch-memory-saver==0.0.10" in hint and "gone" not in hint, hint

# ---------------------------------------------------------------- builds: where they are found, who may write them

def test_a_usable_build_others_can_write_is_refused_and_a_broken_one_is_not_judged(tmp_path):
    """Who can write a build is judged for the builds that could be preloaded: a usable one every user can
    write is refused (the fix takes that away); one with a problem is never preloaded, so never judged."""
    trusted = Trusted([str(tmp_path)])
    usable, broken = tmp_path / CU13, tmp_path / CU12
    for path in (usable, broken):
        path.write_bytes(b"")
        path.chmod(0o666)
    refused = Build(str(usable), "cuda", 13, None, None, trusted).refusal
    assert refused is not None and refused.cause == CAUSE_WORLD_WRITABLE and refused.fix == f"chmod o-w {usable}"
    assert Build(str(broken), "unusable", None, None, "not a loadable ELF object", trusted).refusal is None


def test_builds_beside_a_package_directory_that_cannot_be_listed_are_still_found(tmp_path):
    """The builds in the directory above the package's are found also where the package's own directory
    cannot be listed (here: gone since the import found it)."""
    for name in (CU13, CU12):
        (tmp_path / name).write_bytes(b"")
    want = read_dynamic(os.path.realpath(sys.executable))
    found = find_builds(str(tmp_path / "torch_memory_saver"), want, Trusted([str(tmp_path)]))
    assert [b.name for b in found] == [CU12, CU13]


# ---------------------------------------------------------------- a child program's own problem

def test_a_child_that_finds_a_library_of_the_hooks_closure_by_its_own_runpath_poses_its_own_problem(tmp_path):
    """A child whose DT_RUNPATH holds a library the hook's closure needs is traced on its own (the
    interpreter's trace is not its answer); one whose DT_RUNPATH holds only what the closure does not need
    is not; before the interpreter's trace has answered, only that trace can tell."""
    own = tmp_path / "own"
    own.mkdir()
    (own / "libcudart.so.13").write_bytes(b"")
    exe = Object("/venv/bin/python", DynamicInfo(64, 62, ("libc.so.6",), None, (), None))
    loader = SimpleNamespace(executable=exe)
    child = ("/usr/bin/tool", DynamicInfo(64, 62, ("libcudart.so.13", "libc.so.6"), None, (), (str(own),)))
    assert judging._own_problem(loader, child, [], {"libcudart.so.13", "libcuda.so.1"}) == judging.OWN_PROBLEM
    assert judging._own_problem(loader, child, [], {"libcuda.so.1"}) == judging.INTERPRETERS_PROBLEM
    assert judging._own_problem(loader, child, [], None) == judging.ASK_AFTER_TRACE


# ---------------------------------------------------------------- the children read while the interpreter is traced

def _one_build_attempt(monkeypatch, exe_info, options, predict, collect, kid_info=None):
    """attempt() for one build, its bindings ``options`` (``predict``: why one would not hold, given the
    children), each trace answered by ``collect(executables)``, the children /bin/dash and /bin/bash
    (``kid_info``: their dynamic section); returns (the verdict or the exception, the groups of executables
    whose traces were started, those reaped)."""
    started, reaped = [], []

    def start_traces(executables, env):
        started.append(list(executables))

        def answers():
            reaped.extend(executables)
            return collect(executables)
        return answers

    monkeypatch.setattr(judging, "_options", options)
    monkeypatch.setattr(judging.Option, "predict", predict)
    monkeypatch.setattr(tracing, "start_traces", start_traces)
    monkeypatch.setattr(judging, "judge", lambda b, plan, trace: verdict.Verdict(b, verdict.LOADS, "loads",
                                                                                 loader_ok=True, plan=plan))
    loader = SimpleNamespace(executable=Object("/env/bin/python", exe_info))
    kid_info = kid_info or DynamicInfo(64, 62, ("libc.so.6",), None, (), None)
    kids = [("/bin/dash", kid_info), ("/bin/bash", kid_info)]
    try:
        got = judging.attempt(build(f"/s/{CU13}"), cuda(13, "/s/nvidia/cu13/lib/libcudart.so.13"), {"PATH": "/usr/bin"},
                              loader, "/env/bin/python", children=lambda: kids)
    except BaseException as exc:  # noqa: BLE001 - what the caller would see
        got = exc
    return got, started, reaped


def test_an_interrupted_wait_for_the_interpreters_trace_still_reaps_the_childrens_traces(monkeypatch):
    """A conda interpreter (DT_RPATH): its children are traced beside it. Interrupted while the interpreter's
    answer is awaited, every trace started is still reaped (start_traces: call each collector once)."""
    conda = DynamicInfo(64, 62, ("libc.so.6",), None, ("/env/lib",), None)

    def collect(executables):
        if executables == ["/env/bin/python"]:
            raise KeyboardInterrupt
        return [Trace({}, (), (), (), (), 0) for _ in executables]

    got, started, reaped = _one_build_attempt(
        monkeypatch, conda, lambda *a: iter([judging.Option(judging.AS_FOUND, f"/s/{CU13}", "")]),
        lambda self, *a: None, collect)
    assert isinstance(got, KeyboardInterrupt)
    assert started == [["/env/bin/python"], ["/bin/dash", "/bin/bash"]]  # the interpreter's first, alone
    assert sorted(reaped) == ["/bin/bash", "/bin/dash", "/env/bin/python"]


def test_a_plan_too_large_for_the_interpreter_alone_is_made_with_the_children_at_once(monkeypatch):
    """The plan made for the interpreter alone (its children read while it is traced) would be too large for
    any exec where the children would have ruled that binding out: the plan is then made with them first,
    as if they had been read before, and only that plan is traced."""
    big = "/d" * 65520  # LD_LIBRARY_PATH near MAX_ARG_STRLEN

    def options(b, runtime, env, loader, package_dir, entry, entry_dir):
        yield judging.Option(judging.SEARCH_PATH, entry, "/s/nvidia/cu13/lib:" + big)  # over the limit
        yield judging.Option(judging.RUNTIME_PRELOADED, f"/s/nvidia/cu13/lib/libcudart.so.13:{entry}", big)

    def predict(self, b, runtime, loader, children):
        return "a child would not find it" if self.binding == judging.SEARCH_PATH and children else None

    got, started, _ = _one_build_attempt(monkeypatch, DynamicInfo(64, 62, ("libc.so.6",), None, (), None),
                                         options, predict,
                                         lambda executables: [Trace({}, (), (), (), (), 0) for _ in executables])
    assert got.status == verdict.LOADS and got.plan.ld_preload.startswith("/s/nvidia/cu13/lib/libcudart.so.13:")
    assert started == [["/env/bin/python"], []]  # one trace of the interpreter, none beside it


@pytest.mark.parametrize("child_rejects, traced", [
    (True, [["/env/bin/python"], ["/env/bin/python"], ["/bin/dash", "/bin/bash"]]),  # planned again, traced again
    (False, [["/env/bin/python"], ["/bin/dash", "/bin/bash"]]),  # planned again, the same: the first trace stands
])
def test_a_child_whose_search_differs_makes_the_plan_again_while_the_interpreter_is_traced(monkeypatch,
                                                                                            child_rejects, traced):
    """A child with its own DT_RPATH (the interpreter has none) is read while the plan for the interpreter
    alone is traced; the plan is made again with it, and traced again only where that changed the plan."""
    def options(b, runtime, env, loader, package_dir, entry, entry_dir):
        yield judging.Option(judging.AS_FOUND, entry, "")
        yield judging.Option(judging.SEARCH_PATH, entry, "/s/nvidia/cu13/lib")

    def predict(self, b, runtime, loader, children):
        return "a child would not find it" if self.binding == judging.AS_FOUND and children and child_rejects else None

    got, started, reaped = _one_build_attempt(
        monkeypatch, DynamicInfo(64, 62, ("libc.so.6",), None, (), None), options, predict,
        lambda executables: [Trace({}, (), (), (), (), 0) for _ in executables],
        kid_info=DynamicInfo(64, 62, ("libc.so.6",), None, ("/opt/tool/lib",), None))
    assert got.status == verdict.LOADS
    assert got.plan.ld_library_path == ("/s/nvidia/cu13/lib" if child_rejects else None)
    assert started == traced and sorted(reaped) == sorted(e for group in traced for e in group)


# ---------------------------------------------------------------- what a plan drops of the process's LD_PRELOAD

def test_a_plan_warns_of_a_dropped_entry_that_is_no_build_but_not_of_a_replaced_build(tmp_path):
    """An LD_PRELOAD entry whose path holds ``torch_memory_saver`` but is no preload build is dropped by the
    plan (its check would count it as a build): said. A build the plan replaces by the chosen one: not said."""
    plan = verdict.Plan(str(tmp_path / CU13), str(tmp_path / CU13), None, cuda())
    other = "/opt/torch_memory_saver_tools/libtrace.so"
    warned = decision._with_check_warning(plan, None, None, f"{other}:{tmp_path / CU12}")
    assert len(warned.warnings) == 1 and warned.warnings[0].startswith(f"LD_PRELOAD loses {other}: "), warned.warnings
    assert decision._with_check_warning(plan, None, None, str(tmp_path / CU12)).warnings == ()


# ---------------------------------------------------------------- torch/version.py

def test_torch_version_lines_that_are_no_quoted_string_are_not_read():
    """``name = 'value'`` and ``name = None`` are read; a line without a value, an unclosed quote or an
    unquoted word gives nothing for its name (and never raises)."""
    assert _parse_version_py("__version__ = '2.14.1'\ncuda: Optional[str] = \"13.0\"\nhip = None\n") == {
        "__version__": "2.14.1", "cuda": "13.0", "hip": None}
    assert _parse_version_py("cuda =\n") == {}
    assert _parse_version_py("__version__ = '2.14.1\ncuda = 13.0 # '\nhip = 6.6\n") == {}
