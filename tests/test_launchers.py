"""The programs that start torch_memory_saver-preloaded processes, each started the way its
users start it, with real torch 2.14.1+cu130, real torch_memory_saver wheels and the real loader, on a
host whose only ``libcudart.so.13`` is torch's pip wheel (the driver is the one stand-in).

SGLang starts its schedulers as ``multiprocessing`` children inside
``torch_memory_saver.configure_subprocess()``. Every child must start, map exactly one hook and one
libcudart (torch's), never re-exec, and pass torch_memory_saver's own preload-mode check.
"""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest
from conftest import TORCH_CUDA, TORCHES, assert_applied, mode_env
from support import KERNEL_CLIENT, MAPPED, REEXECD, cc, clean_env, execs

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
TMS_VERSIONS = ["0.0.9.post1", "0.0.10"]  # 0.0.9.post1 replaces LD_PRELOAD, 0.0.10 prepends its pick
# Built here from the 0.0.10 sdist (tools/tms_source.py): with upstream #108's two layers as modelled (RUNPATH
# hooks; configure_subprocess() also prepends the parent's libcudart directory to LD_LIBRARY_PATH), and
# with the patch this project ships for upstream (patches/torch_memory_saver/).
RUNPATH_BUILD = "0.0.10-source-runpath"
RELEASED_SOURCE = "0.0.10-source"
PATCHED_SOURCE = "0.0.10-source-patched"
RUNPATH_PATCHED = "0.0.10-source-runpath-patched"  # the same patch over the model of #108

LAUNCHER = REEXECD + MAPPED + r'''
import concurrent.futures as cf, ctypes, json, multiprocessing as mp, os, queue, sys


def report(kind):
    hooks = [m for m in mapped('.so') if 'torch_memory_saver' in os.path.basename(m)]
    preload = os.environ.get('LD_PRELOAD', '')
    import torch
    from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
    try:
        ctypes.CDLL(HookUtilModePreload().get_path_binary())  # what its BinaryWrapper does next
        verdict = 'accepted'
    except (AssertionError, OSError) as exc:
        verdict = f'refused: {exc}'
    return {'kind': kind, 'pid': os.getpid(), 'reexecd': reexecd(), 'hooks': hooks, 'preload': preload,
            'verdict': verdict, 'library_path': os.environ.get('LD_LIBRARY_PATH', ''),
            'cudart': [m for m in mapped('.so') if os.path.basename(m).startswith('libcudart')],
            'cuda': torch.version.cuda}


def child(q, kind):
    q.put(report(kind))


def collect(q, p, kind):
    while True:
        try:
            return q.get(timeout=1)
        except queue.Empty:
            if p.exitcode is not None:
                return {'kind': kind, 'exitcode': p.exitcode}


def main():
    which, spelling = sys.argv[1], sys.argv[2]
    if which == 'tms':
        from torch_memory_saver import configure_subprocess
    else:  # exactly what patches/sglang/ puts into SGLang's adapter
        def configure_subprocess():
            return SGLANG_PATCHED_EXPRESSION
    if spelling == 'non-normalised':  # a launcher that builds the path itself, as 'dir/./name'
        first = os.environ['LD_PRELOAD'].split(':')[0]
        os.environ['LD_PRELOAD'] = os.path.join(os.path.dirname(first), '.', os.path.basename(first))
    out = []
    for method in ('spawn', 'forkserver'):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        with configure_subprocess():
            p = ctx.Process(target=child, args=(q, method))
            try:
                p.start()
            except (EOFError, OSError) as exc:  # the forkserver itself died before answering
                out.append({'kind': method, 'exitcode': f'start failed: {exc!r}'})
                continue
        got = collect(q, p, method)
        p.join()
        got.update(started_pid=p.pid, exitcode=p.exitcode)
        out.append(got)
    with configure_subprocess():
        pool = cf.ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context('spawn'))
        future = pool.submit(report, 'pool')
    try:
        got = future.result(timeout=300)
        got.update(started_pid=next(iter(pool._processes)), exitcode=0)
    except cf.process.BrokenProcessPool as exc:
        got = {'kind': 'pool', 'exitcode': f'broken pool: {exc}'}
    pool.shutdown()
    out.append(got)
    print(json.dumps({'launcher': os.getpid(), 'reexecd': reexecd(), 'preload_after': os.environ.get('LD_PRELOAD'),
                      'hooks': [m for m in mapped('.so') if 'torch_memory_saver' in os.path.basename(m)],
                      'children': out}))


if __name__ == '__main__':
    main()
'''


def sglang_patched_expression() -> str:
    """The expression the SGLang patch puts in place of ``torch_memory_saver.configure_subprocess()``."""
    patch = Path(__file__).resolve().parent.parent / "patches" / "sglang" / "torch_memory_saver_adapter.patch"
    added = [line[1:].strip() for line in patch.read_text().splitlines() if line.startswith("+ ")]
    assert len(added) == 1 and added[0].startswith("return "), added
    return added[0][len("return "):]


@pytest.fixture(scope="module")
def launcher(tmp_path_factory):
    path = tmp_path_factory.mktemp("launcher") / "launcher.py"
    path.write_text(LAUNCHER.replace("SGLANG_PATCHED_EXPRESSION", sglang_patched_expression()))
    return path


def launch(scn, launcher, which, spelling="plain", env=None, python=None):
    r = scn.host.run([str(python or scn.venv.python), str(launcher), which, spelling],
                     clean_env(**(env or {})), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def assert_children_hooked(scn, out, stderr, torch=TORCHES[0]):
    hook = os.path.realpath(scn.site / CU13)
    cudart = os.path.realpath(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    assert [c["kind"] for c in out["children"]] == ["spawn", "forkserver", "pool"]
    for c in out["children"]:
        assert c["exitcode"] == 0, (c, stderr[-3000:])
        assert c["verdict"] == "accepted", c
        assert c["hooks"] == [hook], c
        assert c["cudart"] == [cudart], c
        assert c["cuda"] == TORCH_CUDA[torch]
        assert c["pid"] == c["started_pid"], c  # the process the launcher started is the one that answered
    assert execs(*(c["reexecd"] for c in out["children"])) == 0, out["children"]  # no child re-exec'd
    for c in out["children"]:
        assert sum("torch_memory_saver" in os.path.basename(e) for e in c["preload"].split(":")) == 1, c


@pytest.fixture(scope="module")
def extra_preload(parts):
    lib = parts.root / "deps" / "libunrelated.so"
    if not lib.exists():
        cc(lib, "int unrelated_preload(void) { return 0; }\n")
    return lib


SPELLINGS = ["plain", "symlinked", "non-normalised", "unrelated-entry"]
# Every spelling with the released wheels; the launcher that also rewrites LD_LIBRARY_PATH with two; today's
# torch with the newest release, in the spelling every launcher has.
LAUNCHER_CASES = [(tms, spelling, TORCHES[0]) for tms in TMS_VERSIONS for spelling in SPELLINGS] + [
    (RUNPATH_BUILD, "plain", TORCHES[0]), (RUNPATH_BUILD, "unrelated-entry", TORCHES[0]),
    (TMS_VERSIONS[-1], "plain", TORCHES[-1])]


@pytest.mark.parametrize("tms, spelling, torch", LAUNCHER_CASES)
def test_sglang_pattern_flagged_launcher(real_torch, launcher, extra_preload, tmp_path, tms, spelling, torch, mode):
    """A flagged launcher's configure_subprocess() children: hooked once, accepted by torch_memory_saver.

    Child LD_PRELOAD before the hook rewrites it (0.0.10; 0.0.9.post1 always replaces it with one path):
    plain ``X:X``; symlinked ``L:L`` with L the same file through a symlinked venv; non-normalised
    ``X:dir/./X``; unrelated-entry ``X:X:libunrelated.so``. The RUNPATH build's configure_subprocess()
    also puts the launcher's libcudart directory first on LD_LIBRARY_PATH: the children are accepted as
    they are, not resolved again.
    """
    scn = real_torch(("driver",), tms=tms, torch=torch)
    env = {"TMS_AUTOPRELOAD": "1", **mode_env(mode)}
    python = None
    if spelling == "symlinked":
        link = tmp_path / "venv-link"
        link.symlink_to(scn.venv.path)
        python = link / "bin" / "python"
    if spelling == "unrelated-entry":
        env["LD_PRELOAD"] = str(extra_preload)
    out, err = launch(scn, launcher, "tms", spelling, env, python)
    assert_applied(mode, out["reexecd"], out["hooks"], scn.site / CU13)  # the launcher ...
    assert_children_hooked(scn, out, err, torch)  # ... and its children, none re-exec'd
    if spelling == "unrelated-entry" and tms != "0.0.9.post1":
        assert all(c["preload"].endswith(f":{extra_preload}") for c in out["children"])
    if tms == RUNPATH_BUILD:
        cudart_dir = str(scn.site / "nvidia" / "cu13" / "lib")
        assert all(c["library_path"].split(":")[0] == cudart_dir for c in out["children"]), out
    if spelling == "plain" and tms != "0.0.9.post1":
        rewritten = [line for line in err.splitlines() if "LD_PRELOAD rewritten as" in line]
        assert len(rewritten) >= 3, err[-3000:]  # spawn child, forkserver, pool worker


def test_sglang_36533_unflagged_dies_in_the_loader_and_ours_fixes_it(real_torch, launcher):
    """sglang #36533: torch_memory_saver's own configure_subprocess() on a pip-only CUDA 13 host
    gives children a hook whose libcudart.so.13 the loader cannot find (exit 127). The drop-in
    tms_autopreload.configure_subprocess(), called as patches/sglang/ calls it in SGLang's adapter,
    gives them the verified plan instead."""
    scn = real_torch(("driver",), tms="0.0.10")
    r = scn.host.run([str(scn.venv.python), str(launcher), "tms", "plain"], clean_env(), timeout=600)
    assert "libcudart.so.13: cannot open shared object file" in r.stderr, r.stderr[-3000:]
    assert r.returncode == 0, r.stderr[-3000:]
    children = json.loads(r.stdout.strip().splitlines()[-1])["children"]
    assert children[0]["exitcode"] == 127, children  # spawn: the loader kills the child
    assert "start failed" in children[1]["exitcode"], children  # the forkserver itself died (EOF or refused)
    assert "broken pool" in children[2]["exitcode"], children

    out, err = launch(scn, launcher, "ours")
    assert "error while loading shared libraries" not in err, err[-3000:]
    assert execs(out["reexecd"]) == 0 and out["hooks"] == [], out  # the unflagged launcher: untouched
    assert_children_hooked(scn, out, err)
    assert out["preload_after"] is None  # restored in the launcher, which stays unhooked


def test_sglang_36533_with_the_runpath_build_needs_no_flag(real_torch, launcher):
    """With upstream #108's layers (as modelled), torch_memory_saver's own configure_subprocess() starts
    the children on the pip-only host by itself: the hook finds torch's libcudart through its RUNPATH
    and the launcher's LD_LIBRARY_PATH entry, one copy mapped. tms_autopreload's drop-in then leaves
    LD_LIBRARY_PATH alone."""
    scn = real_torch(("driver",), tms=RUNPATH_BUILD)
    out, err = launch(scn, launcher, "tms")
    assert "error while loading shared libraries" not in err, err[-3000:]
    assert execs(out["reexecd"]) == 0 and out["hooks"] == [], out  # the unflagged launcher: untouched
    assert_children_hooked(scn, out, err)
    # tms_autopreload's drop-in: the loader finds torch's libcudart through the RUNPATH, so no binding.
    out, err = launch(scn, launcher, "ours")
    assert_children_hooked(scn, out, err)
    assert all(c["library_path"] == "" for c in out["children"]), out


def test_upstream_patch_fixes_sglang_36533_in_torch_memory_saver_itself(real_torch, launcher):
    """patches/torch_memory_saver/: the SGLang pattern, unchanged, on the pip-only host. Built from the
    released source the children die in the loader (exit 127); built from the patched source,
    torch_memory_saver's configure_subprocess() hands them tms_autopreload's verified plan: hooked,
    no exec, accepted by its own check, the launcher's environment restored. A flagged launcher's
    children get one LD_PRELOAD entry already, nothing left to rewrite."""
    before = real_torch(("driver",), tms=RELEASED_SOURCE)
    r = before.host.run([str(before.venv.python), str(launcher), "tms", "plain"], clean_env(), timeout=600)
    assert "libcudart.so.13: cannot open shared object file" in r.stderr, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["children"][0]["exitcode"] == 127

    after = real_torch(("driver",), tms=PATCHED_SOURCE)
    out, err = launch(after, launcher, "tms")
    assert "error while loading shared libraries" not in err, err[-3000:]
    assert execs(out["reexecd"]) == 0 and out["hooks"] == [], out  # the unflagged launcher: untouched
    assert_children_hooked(after, out, err)
    assert out["preload_after"] is None
    out, err = launch(after, launcher, "tms", env={"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_VERBOSE": "1"})
    assert_children_hooked(after, out, err)
    assert all(c["preload"] == str(after.site / CU13) for c in out["children"]), out
    assert "LD_PRELOAD rewritten as" not in err, err[-3000:]


@pytest.mark.parametrize("tms", [PATCHED_SOURCE, RUNPATH_PATCHED])
def test_upstream_patch_keeps_todays_pick_without_tms_autopreload(real_torch, tms):
    """The guarded import: with tms_autopreload not importable, or turned off (TMS_AUTOPRELOAD_DISABLE=1),
    the patched configure_subprocess() is torch_memory_saver's own (its pick in LD_PRELOAD; LD_LIBRARY_PATH
    untouched in 0.0.10, the parent's libcudart directory prepended with #108); with it, the verified plan
    (which needs no binding for #108's RUNPATH build beside torch's pip runtime)."""
    scn = real_torch(("driver",), tms=tms)
    code = textwrap.dedent("""
        import json, os, sys
        if sys.argv[1] == 'blocked':
            sys.modules['tms_autopreload'] = None  # what `import tms_autopreload` meets when it is not installed
        from torch_memory_saver.hooks.mode_preload import configure_subprocess
        with configure_subprocess():
            print(json.dumps({k: os.environ.get(k) for k in ('LD_PRELOAD', 'LD_LIBRARY_PATH')}))
        """)
    got = {}
    for case in ("blocked", "installed", "disabled"):
        env = clean_env(**({"TMS_AUTOPRELOAD_DISABLE": "1"} if case == "disabled" else {}))
        r = scn.host.run([str(scn.venv.python), "-c", code, case], env, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
        got[case] = json.loads(r.stdout.strip().splitlines()[-1])
    hook, runtime_dir = str(scn.site / CU13), str(scn.site / "nvidia" / "cu13" / "lib")
    if tms == PATCHED_SOURCE:
        assert got["blocked"] == got["disabled"] == {"LD_PRELOAD": hook, "LD_LIBRARY_PATH": None}
        assert got["installed"] == {"LD_PRELOAD": hook, "LD_LIBRARY_PATH": runtime_dir}
    else:
        assert got["blocked"] == got["disabled"] == {"LD_PRELOAD": hook,
                                                     "LD_LIBRARY_PATH": os.path.realpath(runtime_dir)}
        assert got["installed"] == {"LD_PRELOAD": hook, "LD_LIBRARY_PATH": None}


def test_upstream_patch_over_108_hooks_sglangs_children(real_torch, launcher):
    """The tree users will have next (#108, as modelled, with patches/torch_memory_saver/ on top): the
    SGLang pattern on the pip-only host starts hooked children with tms_autopreload's plan, and with
    tms_autopreload turned off, with #108's own values (the parent's libcudart directory first on
    LD_LIBRARY_PATH)."""
    scn = real_torch(("driver",), tms=RUNPATH_PATCHED)
    out, err = launch(scn, launcher, "tms")
    assert execs(out["reexecd"]) == 0 and out["hooks"] == [], out
    assert_children_hooked(scn, out, err)
    assert all(c["library_path"] == "" for c in out["children"]), out
    out, err = launch(scn, launcher, "tms", env={"TMS_AUTOPRELOAD_DISABLE": "1"})
    assert_children_hooked(scn, out, err)
    runtime_dir = os.path.realpath(scn.site / "nvidia" / "cu13" / "lib")
    assert all(c["library_path"] == runtime_dir for c in out["children"]), out


def test_configure_subprocess_contract(scenario, parts):
    """Children only, restored on exit (also on error), nestable, serialised across threads."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    code = MAPPED + f"MAPPED = {MAPPED!r}\n" + textwrap.dedent("""
        import json, os, subprocess, sys, threading, time
        import tms_autopreload
        from tms_autopreload import configure_subprocess
        names = ('LD_PRELOAD', 'LD_LIBRARY_PATH', 'TMS_AUTOPRELOAD_STATE')
        snap = lambda: {k: os.environ.get(k) for k in names}
        before = snap()
        out = {'before': before}
        with configure_subprocess() as plan:
            inside = snap()
            child = subprocess.run([sys.executable, '-c', MAPPED + 'import os; print(os.environ["LD_PRELOAD"]);'
                                    'print(mapped("torch_memory_saver"))'], capture_output=True, text=True)
            with configure_subprocess():
                out['nested'] = snap()
            out['after_nested'] = snap()
            out['self_maps'] = bool(mapped('torch_memory_saver'))
        out.update(inside=inside, plan_build=plan.build, child=child.stdout.splitlines(), after=snap())
        try:
            with configure_subprocess():
                raise KeyError('boom')
        except KeyError:
            out['after_error'] = snap()
        order = []
        def worker(tag):
            with configure_subprocess():
                order.append(tag + '-in'); time.sleep(0.2); order.append(tag + '-out')
        ts = [threading.Thread(target=worker, args=(t,)) for t in 'ab']
        [t.start() for t in ts]; [t.join() for t in ts]
        out['order'] = order
        out['final'] = snap()
        print(json.dumps(out))
    """)
    r = scn.run(["-c", code], {"LD_PRELOAD": "/opt/other.so"})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    hook = str(scn.site / CU13)
    before = {"LD_PRELOAD": "/opt/other.so", "LD_LIBRARY_PATH": None, "TMS_AUTOPRELOAD_STATE": None}
    assert out["before"] == before
    assert out["inside"]["LD_PRELOAD"] == f"{hook}:/opt/other.so"
    assert out["inside"]["LD_LIBRARY_PATH"] == str(scn.site / "nvidia" / "cu13" / "lib")
    assert out["inside"]["TMS_AUTOPRELOAD_STATE"].endswith(f"::{out['plan_build']}")
    assert out["child"] == [f"{hook}:/opt/other.so", repr([hook])]  # the child is hooked ...
    assert out["self_maps"] is False  # ... the caller is not
    assert out["nested"] == out["inside"] and out["after_nested"] == out["inside"]
    assert out["after"] == before and out["after_error"] == before and out["final"] == before
    assert out["order"] in (["a-in", "a-out", "b-in", "b-out"], ["b-in", "b-out", "a-in", "a-out"])


def test_configure_subprocess_without_a_plan_raises_what_which_prints(scenario):
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("cuda13",))  # no driver
    which = scn.run(["-m", "tms_autopreload", "which"])
    assert which.returncode == 1 and which.stderr.startswith("tms-autopreload: ")
    code = textwrap.dedent("""
        import os, subprocess, sys
        from tms_autopreload import ResolveError, configure_subprocess
        try:
            with configure_subprocess():
                subprocess.run([sys.executable, '-c', 'print("child started")'])
        except ResolveError as exc:
            print('ResolveError:', exc, file=sys.stderr)
            print(os.environ.get('LD_PRELOAD'), os.environ.get('LD_LIBRARY_PATH'))
    """)
    r = scn.run(["-c", code])
    assert r.returncode == 0 and r.stdout.split() == ["None", "None"], r.stdout + r.stderr
    assert r.stderr == "ResolveError: " + which.stderr[len("tms-autopreload: "):]
    assert "libcuda.so.1" in r.stderr


# ---------------------------------------------------------------- torchrun

RANK = REEXECD + MAPPED + r'''
import json, os, sys, time
import torch
import torch.distributed as dist

rank, attempt = int(os.environ['RANK']), int(os.environ['TORCHELASTIC_RESTART_COUNT'])
cudart = mapped('/libcudart')
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
report = {'rank': rank, 'attempt': attempt, 'pid': os.getpid(), 'agent': os.getppid(),
          'hooks': mapped('torch_memory_saver'), 'reexecd': reexecd(), 'agent_reexecd': reexecd(os.getppid()),
          'agent_hooks': mapped('torch_memory_saver', os.getppid()), 'sum': None,
          'tms_accepts': HookUtilModePreload().get_path_binary(), 'cudart': cudart}
def write(name):
    path = os.path.join(os.environ['RANK_REPORTS'], name)
    with open(path + '.part', 'w') as f:
        json.dump(report, f)
    os.replace(path + '.part', path)  # whole or absent: the other rank polls for it

if attempt == 0:
    # The first attempt fails before any rendezvous of its own (rank 1 exits; the agent stops rank 0),
    # so the restart is the only process group: no stale gloo addresses from a dead attempt. The agent
    # stops rank 0 as soon as rank 1 exits, so rank 1 waits for rank 0's report first (a file, polled:
    # rank 0 may be much slower to import torch on a loaded machine).
    write(f'0-{rank}.json')
    if rank == 1:
        first = os.path.join(os.environ['RANK_REPORTS'], '0-0.json')
        deadline = time.monotonic() + 300
        while not os.path.exists(first) and time.monotonic() < deadline:
            time.sleep(0.05)
        sys.exit(3)
    time.sleep(300)
dist.init_process_group('gloo')
total = torch.tensor([rank + 1.0])
dist.all_reduce(total)
report['sum'] = total.item()
write(f'{attempt}-{rank}.json')
dist.destroy_process_group()
'''


@pytest.mark.parametrize("torch", TORCHES)
def test_torchrun_agent_and_every_rank_hooked_also_after_a_restart(real_torch, tmp_path, torch):
    scn = real_torch(("driver",), torch=torch)
    script, reports = tmp_path / "rank.py", tmp_path / "reports"
    script.write_text(RANK)
    reports.mkdir()
    r = scn.host.run([str(scn.venv.path / "bin" / "torchrun"), "--standalone", "--nproc-per-node", "2",
                      "--max-restarts", "1", str(script)],
                     # TMPDIR: torchrun's agent keeps its run directory (torchelastic_*) there, and leaves it
                     clean_env(TMS_AUTOPRELOAD="1", TMS_AUTOPRELOAD_VERBOSE="1", RANK_REPORTS=str(reports),
                               TMPDIR=str(tmp_path)),
                     timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    got = sorted((json.loads(p.read_text()) for p in reports.glob("*.json")), key=lambda d: (d["attempt"], d["rank"]))
    assert [(d["attempt"], d["rank"]) for d in got] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    hook = os.path.realpath(scn.site / CU13)
    cudart = os.path.realpath(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    for d in got:
        assert d["hooks"] == [hook] and d["agent_hooks"] == [hook], d
        assert d["cudart"] == [cudart] and d["sum"] == (3.0 if d["attempt"] else None), d
        assert d["tms_accepts"] == str(scn.site / CU13)  # torch_memory_saver's own preload-mode check
    assert len({d["agent"] for d in got}) == 1  # one agent, which restarted its ranks
    assert len({d["pid"] for d in got}) == 4
    assert got[0]["agent_reexecd"] and execs(*(d["reexecd"] for d in got)) == 0, got  # the agent; no rank
    assert sum("is mapped (resolved for this interpreter)" in line for line in r.stderr.splitlines()) >= 4


# ---------------------------------------------------------------- Jupyter

KERNEL_DRIVER = KERNEL_CLIENT + r'''
PROBE = REEXECD + MAPPED + """
import json, os
print(json.dumps({'pid': os.getpid(), 'hooks': mapped('torch_memory_saver'),
                  'preload': os.environ.get('LD_PRELOAD'), 'reexecd': reexecd()}))
"""
res = {'started_pid': km.provisioner.process.pid, 'first': json.loads(run(PROBE))}
res['torch'] = json.loads(run(MAPPED + "import json, os, torch\n"
                              "from torch_memory_saver.hooks.mode_preload import HookUtilModePreload\n"
                              "print(json.dumps([torch.version.cuda, mapped('/libcudart'), "
                              "HookUtilModePreload().get_path_binary()]))"))
ready = sys.argv[1] + '/cell-running'  # the readiness marker: a file, no output stream in between
# stop_on_error=False: the interrupted cell's error must not abort the cells sent after it
msg_id = kc.execute(f"import time; open({ready!r}, 'w').close(); time.sleep(120)", stop_on_error=False)
deadline = time.monotonic() + 120
while not __import__('os').path.exists(ready):
    assert time.monotonic() < deadline, 'the cell never started'
    time.sleep(0.01)
km.interrupt_kernel()
while True:
    reply = kc.get_shell_msg(timeout=60)
    if reply['parent_header'].get('msg_id') == msg_id:
        break
res['interrupted'] = [reply['content']['status'], reply['content'].get('ename')]
res['after_interrupt'] = json.loads(run(PROBE))
km.restart_kernel(now=True)
kc.wait_for_ready(timeout=120)
res['restarted_pid'] = km.provisioner.process.pid
res['after_restart'] = json.loads(run(PROBE))
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps(res))
'''


def test_jupyter_kernel_starts_hooked_survives_interrupt_and_restart(real_torch, tmp_path):
    scn = real_torch(("driver",))
    cli = ["-m", "tms_autopreload", "kernel"]
    r = scn.run([*cli, "install", "--prefix", str(tmp_path), "--name", "tms-test",
                 "--env", "TMS_AUTOPRELOAD_VERBOSE=1"])
    assert r.returncode == 0, r.stderr
    kernels = tmp_path / "share" / "jupyter" / "kernels"
    spec = json.loads((kernels / "tms-test" / "kernel.json").read_text())
    assert spec["env"] == {"TMS_AUTOPRELOAD": "1", "TMS_AUTOPRELOAD_VERBOSE": "1"}
    assert spec["argv"][0] == str(scn.venv.python)
    driver = tmp_path / "driver.py"
    driver.write_text(f"REEXECD, MAPPED = {REEXECD!r}, {MAPPED!r}\n" + KERNEL_DRIVER)
    r = scn.host.run([str(scn.venv.python), str(driver), str(kernels), "tms-test"], clean_env(), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    hook = os.path.realpath(scn.site / CU13)
    for key in ("first", "after_interrupt", "after_restart"):
        assert res[key]["hooks"] == [hook] and res[key]["preload"] == str(scn.site / CU13), res
    assert res["first"]["pid"] == res["started_pid"]  # the exec kept the PID jupyter_client knows
    assert res["after_restart"]["pid"] == res["restarted_pid"] != res["started_pid"]
    assert res["interrupted"] == ["error", "KeyboardInterrupt"]
    assert res["torch"] == ["13.0", [os.path.realpath(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")],
                            str(scn.site / CU13)]  # the last: torch_memory_saver's own check accepts the kernel
    assert res["first"]["reexecd"] and res["after_interrupt"]["reexecd"]  # one image, exec'd once ...
    assert execs(res["first"]["reexecd"], res["after_restart"]["reexecd"]) == 2  # ... and the restart's

    r = scn.run([*cli, "uninstall", "--prefix", str(tmp_path), "--name", "tms-test"])
    assert r.returncode == 0 and not (kernels / "tms-test").exists(), r.stderr
    r = scn.run([*cli, "uninstall", "--prefix", str(tmp_path), "--name", "tms-test"])
    assert r.returncode == 1 and "no kernel named 'tms-test'" in r.stderr


def test_kernel_install_user_as_the_docs_show(real_torch, tmp_path):
    """`tms-autopreload kernel install --user` (the command in the README): the user's Jupyter data dir, which
    uninstall removes again where install made it (never ~/.local/share, which install made too)."""
    scn = real_torch(("driver",))
    env = {"HOME": str(tmp_path)}
    r = scn.run(["-m", "tms_autopreload", "kernel", "install", "--user"], env)
    assert r.returncode == 0, r.stderr
    spec = tmp_path / ".local" / "share" / "jupyter" / "kernels" / "python3-tms-autopreload" / "kernel.json"
    assert json.loads(spec.read_text())["env"] == {"TMS_AUTOPRELOAD": "1"}
    r = scn.run(["-m", "tms_autopreload", "kernel", "uninstall", "--user"], env)
    assert r.returncode == 0 and not spec.exists(), r.stderr
    assert (tmp_path / ".local" / "share").is_dir() and not (tmp_path / ".local" / "share" / "jupyter").exists()


def test_kernel_uninstall_refuses_a_kernel_it_did_not_write(real_torch, tmp_path):
    scn = real_torch(("driver",))
    foreign = tmp_path / "share" / "jupyter" / "kernels" / "python3"
    foreign.mkdir(parents=True)
    (foreign / "kernel.json").write_text(json.dumps({"argv": ["python3"], "display_name": "x", "language": "python"}))
    r = scn.run(["-m", "tms_autopreload", "kernel", "uninstall", "--prefix", str(tmp_path), "--name", "python3"])
    assert r.returncode == 1 and "was not installed by tms-autopreload" in r.stderr and foreign.exists()


def test_kernel_command_without_jupyter_says_what_to_install(scenario, tmp_path):
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    r = scn.run(["-m", "tms_autopreload", "kernel", "install", "--prefix", str(tmp_path)])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith("pip install jupyter_client ipykernel`"), r.stderr
