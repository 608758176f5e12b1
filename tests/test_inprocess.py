"""dlopen mode and ``activate()``: the plan loaded into a running interpreter, its fallbacks,
and every case where loading in-process and ``LD_PRELOAD`` could differ, each shown with both modes.

A toy hook stands in for torch_memory_saver's where a test must see *which* definition a call
reached: it defines ``cudaMalloc`` and ``cudaFree`` as 100 + the real function (found with
``dlsym(RTLD_NEXT)``), links NVIDIA's real ``libcudart.so.13``, and records what ``TMS_INIT_ENABLE``
its constructor saw. A toy consumer stands in for torch's ``libc10_cuda.so``: it links the same
runtime and calls ``cudaMalloc``, loaded after start as torch's libraries are. Without a GPU the
real ``cudaMalloc`` returns an error code (35 here); the hook's answer is that code + 100.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import textwrap

import pytest
from conftest import DEFAULT_PYTHON, assert_applied, mode_env, report_host
from support import (KERNEL_CLIENT, MAPPED, NO_DAC, REEXECD, allocator_bindings, assert_stopped, cc, clean_env,
                     hash_outside)

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
TOY_HOOK = r"""
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
static char seen[64] = "(unset)";
__attribute__((constructor)) static void toy_init(void) {
    const char *v = getenv("TMS_INIT_ENABLE");
    if (v) { strncpy(seen, v, sizeof seen - 1); }
}
const char *toy_constructor_saw(void) { return seen; }
int cudaMalloc(void **p, size_t n) {
    int (*real)(void **, size_t) = (int (*)(void **, size_t))dlsym(RTLD_NEXT, "cudaMalloc");
    return real ? 100 + real(p, n) : -1000;
}
int cudaFree(void *p) {
    int (*real)(void *) = (int (*)(void *))dlsym(RTLD_NEXT, "cudaFree");
    return real ? 100 + real(p) : -1000;
}
"""
CONSUMER = """
#include <stddef.h>
int cudaMalloc(void **p, size_t n);
int consumer_alloc(void) { void *p = 0; return cudaMalloc(&p, 16); }
"""
# Static TLS: loads at start (LD_PRELOAD), where the loader sizes the static TLS block; dlopen fails.
TLS_HOOK = TOY_HOOK + """
__thread char toy_big_tls[1 << 16] __attribute__((tls_model("initial-exec")));
int toy_touch_tls(void) { toy_big_tls[0] = 1; return toy_big_tls[0]; }
"""

PROBE = REEXECD + MAPPED + f"MAPPED = {MAPPED!r}\n" + r"""
import ctypes, json, os, subprocess, sys
runtime, consumer = sys.argv[1], sys.argv[2]
deepbind = len(sys.argv) > 3 and sys.argv[3] == 'deepbind'
lib = ctypes.CDLL(consumer, (os.RTLD_LAZY | os.RTLD_DEEPBIND) if deepbind else os.RTLD_LAZY)
real = ctypes.CDLL(runtime).cudaMalloc(ctypes.byref(ctypes.c_void_p()), 16)
hooks = mapped('torch_memory_saver')
saw = ctypes.CDLL(hooks[0]).toy_constructor_saw if hooks and 'toy' in hooks[0] else None
if saw:
    saw.restype = ctypes.c_char_p
child = subprocess.run([sys.executable, '-c', MAPPED + "import json; print(json.dumps(mapped('torch_memory_saver')))"],
                       capture_output=True, text=True)
print(json.dumps({'pid': os.getpid(), 'hooks': hooks, 'consumer': lib.consumer_alloc(), 'real': real,
                  'saw': saw().decode() if saw else None, 'child_hooks': json.loads(child.stdout or 'null'),
                  'preload': os.environ.get('LD_PRELOAD'), 'reexecd': reexecd()}))
"""


@pytest.fixture(scope="module")
def toys(parts):
    d = parts.root / "toys"
    link = ["-Wl,--no-as-needed", f"-L{parts.rt[13]}", "-l:libcudart.so.13", "-ldl"]
    out = {
        "hook": d / "torch_memory_saver_hook_mode_preload_toy.so",
        "tls": d / "torch_memory_saver_hook_mode_preload_toytls.so",
        "consumer": d / "libtoy_consumer.so",
        "defines": d / "libdefines_cudamalloc.so",
        "extra": d / "libtoy_only_on_llp.so",
    }
    if not out["hook"].exists():
        cc(out["hook"], TOY_HOOK, *link)
        cc(out["tls"], TLS_HOOK, *link)
        cc(out["consumer"], CONSUMER, *link)
        cc(out["defines"], "int cudaMalloc(void **p, unsigned long n) { return 2; }\n")
    return out


def probe(scn, parts, toys, mode, env=None, deepbind=False, hook="hook"):
    full = {"SLIME_OFFLOAD_TRAIN": "1", "TMS_AUTOPRELOAD_PATH": str(toys[hook]), **mode_env(mode), **(env or {})}
    args = ["-c", PROBE, str(parts.rt[13] / "libcudart.so.13"), str(toys["consumer"])]
    args += ["deepbind"] if deepbind else []
    r = scn.run(args, full)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def fallback_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "falling back to exec" in line]


# ---------------------------------------------------------------- the same bindings in both modes

@pytest.mark.parametrize("python", [DEFAULT_PYTHON, "sid/3.15"])
@pytest.mark.parametrize("bind_now", [False, True], ids=["lazy", "LD_BIND_NOW"])
def test_hook_intercepts_forwards_and_sees_tms_variables_in_both_modes(scenario, parts, toys, mode, bind_now, python):
    """A library loaded later binds cudaMalloc to the hook, the hook's dlsym(RTLD_NEXT) reaches the real
    runtime, the hook's constructor sees TMS_INIT_ENABLE=1 (set before it is loaded), children get the
    real LD_PRELOAD; with and without LD_BIND_NOW; on this machine's glibc and on sid's (2.43)."""
    scn = report_host(scenario, python=python)
    out, err = probe(scn, parts, toys, mode, {"LD_BIND_NOW": "1"} if bind_now else None)
    assert_applied(mode, out["reexecd"], out["hooks"], toys["hook"])
    assert out["real"] not in (None, -1000) and out["consumer"] == out["real"] + 100, out
    assert out["saw"] == "1" and out["child_hooks"] == [str(toys["hook"])] and out["preload"] == str(toys["hook"])


def test_deepbind_bypasses_the_hook_in_both_modes_alike(scenario, parts, toys, mode):
    """RTLD_DEEPBIND puts a library's own dependencies first: its calls reach libcudart, not the hook,
    whether the hook was preloaded or loaded in-process. Not a difference between the modes."""
    scn = report_host(scenario)
    out, err = probe(scn, parts, toys, mode, deepbind=True)
    assert_applied(mode, out["reexecd"], out["hooks"], toys["hook"])
    assert out["consumer"] == out["real"], out


def test_the_plans_library_path_reaches_children_only_in_dlopen_mode(scenario, parts, toys, mode):
    """The loader reads LD_LIBRARY_PATH once, at start. After an exec the process itself searches the
    plan's directories; in dlopen mode only its children do (os.environ is set for them)."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    lib_dir = scn.site / "nvidia" / "cu13" / "lib"
    extra = lib_dir / toys["extra"].name
    if not extra.exists():
        cc(extra, "int toy_only_on_llp(void) { return 7; }\n")
    code = REEXECD + MAPPED + textwrap.dedent(f"""
        import ctypes, subprocess, sys
        def found():
            try:
                ctypes.CDLL({extra.name!r})
                return True
            except OSError:
                return False
        child = subprocess.run([sys.executable, '-c', 'import ctypes; ctypes.CDLL("{extra.name}")']).returncode
        print(found(), child == 0, reexecd(), *mapped('torch_memory_saver'))
    """)
    r = scn.run(["-c", code], {"TMS_AUTOPRELOAD": "1", **mode_env(mode)})
    assert r.returncode == 0, r.stderr
    found, child, reexecd, *hooks = r.stdout.split()
    assert_applied(mode, reexecd == "True", hooks, scn.site / CU13)
    assert [found, child] == (["True", "True"] if mode == "exec" else ["False", "True"])


# ---------------------------------------------------------------- dlopen mode falls back to exec

def test_falls_back_when_a_runtime_library_is_already_loaded(scenario, parts, toys):
    """Another .pth (sorted before ours) loaded libcudart: references bound before the hook existed
    would not move, so dlopen mode re-execs instead, and the process ends hooked."""
    scn = report_host(scenario, tag="pth-loads-cudart")
    pth = scn.site / "aa_loads_cudart.pth"
    pth.write_text(f"import ctypes; ctypes.CDLL({str(parts.rt[13] / 'libcudart.so.13')!r})\n")
    out, err = probe(scn, parts, toys, "dlopen")
    assert "a runtime library is already loaded" in fallback_line(err)[0], err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["hook"])
    assert out["consumer"] == out["real"] + 100


def test_falls_back_when_an_interposed_symbol_is_already_global(scenario, parts, toys):
    """An earlier LD_PRELOAD entry defines cudaMalloc: in the global scope it would come before a hook
    loaded later, where LD_PRELOAD puts the hook first. dlopen mode re-execs with the hook first."""
    scn = report_host(scenario)
    out, err = probe(scn, parts, toys, "dlopen", {"LD_PRELOAD": str(toys["defines"])})
    assert "cudaMalloc is already defined in the global scope" in fallback_line(err)[0], err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["hook"])
    assert out["preload"] == f"{toys['hook']}:{toys['defines']}"
    assert out["consumer"] >= 100  # the hook first; its RTLD_NEXT finds the next definition


def test_falls_back_when_the_plan_has_no_runtime_library_file(scenario):
    """torch_memory_saver 0.0.8's driver-only build, on a host where torch's libcudart is not visible:
    the plan loads, but names no runtime library to load before the hook."""
    scn = scenario(tms="0.0.8", torch="cu13-sys", host=("driver",))
    code = REEXECD + MAPPED + "print(reexecd(), *mapped('torch_memory_saver'))"
    r = scn.run(["-c", code], {"TMS_AUTOPRELOAD": "1", **mode_env("dlopen")})
    assert r.returncode == 0, r.stderr
    assert "the plan names no runtime library file" in fallback_line(r.stderr)[0], r.stderr
    reexecd, *hooks = r.stdout.split()
    assert_applied("exec", reexecd == "True", hooks, scn.site / "torch_memory_saver_cpp.abi3.so")


def test_falls_back_when_dlopen_itself_fails(scenario, parts, toys):
    """A hook with a large initial-exec TLS block loads at start (the loader sizes static TLS then) but
    dlopen refuses it: dlerror's text is reported and the process is exec'd with LD_PRELOAD."""
    scn = report_host(scenario)
    out, err = probe(scn, parts, toys, "dlopen", hook="tls")
    line = fallback_line(err)[0]
    assert "dlopen failed:" in line and "cannot allocate memory in static TLS block" in line, err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["tls"])



def test_falls_back_when_the_runtime_library_cannot_be_loaded_in_process(scenario, parts, toys, tmp_path):
    """torch's runtime library (a libcudart.so.13 first on LD_LIBRARY_PATH) has a large initial-exec TLS block:
    the loader maps it at start, but dlopen refuses it; dlopen mode says so, loads nothing, and the process is
    exec'd hooked."""
    lib = cc(tmp_path / "lib" / "libcudart.so.13",
             "int cudaMalloc(void **p, unsigned long n) { return 0; }\nint cudaFree(void *p) { return 0; }\n"
             "__thread char big_tls[1 << 16] __attribute__((tls_model(\"initial-exec\")));\n"
             "int touch_tls(void) { big_tls[0] = 1; return big_tls[0]; }\n", "-Wl,-soname,libcudart.so.13")
    scn = report_host(scenario)
    out, err = probe(scn, parts, toys, "dlopen", {"LD_LIBRARY_PATH": str(lib.parent)})
    line = fallback_line(err)[0]
    assert f"dlopen failed: {lib}: cannot allocate memory in static TLS block" in line, err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["hook"])


def test_falls_back_when_a_global_symbol_comes_from_a_preload_whose_symbols_cannot_be_read(scenario, parts, toys,
                                                                                          tmp_path):
    """The LD_PRELOAD entry that defines cudaMalloc has a DT_HASH that points outside it (the loader reads its
    DT_GNU_HASH): which entry defines the symbol cannot be read, so dlopen mode says only that it is defined in the
    global scope, falls back to exec, and the hook comes first."""
    source = cc(tmp_path / "src" / "libdefines.so", "int cudaMalloc(void **p, unsigned long n) { return 2; }\n",
                "-Wl,--hash-style=both")
    definer = hash_outside(source, tmp_path / "libdefines.so")
    out, err = probe(report_host(scenario), parts, toys, "dlopen", {"LD_PRELOAD": str(definer)})
    assert fallback_line(err) == ["tms-autopreload: dlopen mode: cudaMalloc is already defined in the global scope, "
                                  "where it would come before the hook; falling back to exec"], err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["hook"])
    assert out["preload"] == f"{toys['hook']}:{definer}"

@pytest.mark.unmeasured
def test_dlopen_mode_start_imports_no_threading(scenario):
    """P2' (tools/bench.py): a dlopen-mode start, hooked in-process, imports what it needs and not
    ``threading`` (for activate()'s lock the interpreter's own ``_thread`` has one), which would pull
    ``functools``, ``collections`` and more into every such start."""
    scn = report_host(scenario)
    code = MAPPED + ("import gc, sys; print(' '.join(sorted(sys.modules))); print(bool(mapped('torch_memory_saver')));"
                     "print(gc.isenabled())")
    r = scn.run(["-c", code], {"SLIME_OFFLOAD_TRAIN": "1", **mode_env("dlopen")})
    assert r.returncode == 0 and "falling back to exec" not in r.stderr, r.stderr
    modules, hooked, collecting = r.stdout.splitlines()
    assert hooked == "True" and "tms_autopreload.inprocess" in modules.split(), r.stdout
    assert collecting == "True", "the start paused garbage collection and left it off"  # the program's, not ours
    assert not {"threading", "functools", "collections", "_weakrefset"} & set(modules.split()), modules


def test_unknown_mode_warns_and_execs(scenario, parts, toys):
    scn = report_host(scenario)
    out, err = probe(scn, parts, toys, "fork")
    assert "TMS_AUTOPRELOAD_MODE='fork' is not a recognised value (use exec or dlopen); using exec" in err
    assert_applied("exec", out["reexecd"], out["hooks"], toys["hook"])


# ---------------------------------------------------------------- activate()

ACTIVATE = MAPPED + r"""
import ctypes, json, os, sys
import tms_autopreload
first = tms_autopreload.activate()
second = tms_autopreload.activate()
lib = ctypes.CDLL(sys.argv[2])
real = ctypes.CDLL(sys.argv[1]).cudaMalloc(ctypes.byref(ctypes.c_void_p()), 16)
print(json.dumps({'same': first is second, 'build': first.build, 'consumer': lib.consumer_alloc(), 'real': real,
                  'hooks': mapped('torch_memory_saver'),
                  'preload': os.environ.get('LD_PRELOAD')}))
"""


def test_activate_binds_in_process_once(scenario, parts, toys):
    scn = report_host(scenario)
    r = scn.run(["-c", ACTIVATE, str(parts.rt[13] / "libcudart.so.13"), str(toys["consumer"])],
                {"TMS_AUTOPRELOAD_PATH": str(toys["hook"])})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["same"] and out["hooks"] == [str(toys["hook"])] == [out["build"]]
    assert out["consumer"] == out["real"] + 100 and out["preload"] == str(toys["hook"])


def test_activate_where_proc_is_not_mounted_says_so(scenario):
    """Without /proc (a container that does not mount it) dlopen returns, but that the hook is mapped cannot
    be confirmed: activate() says that, with the fix (mount /proc), not that the hook is not mapped."""
    scn = report_host(scenario)
    code = ("import tms_autopreload\ntry:\n    tms_autopreload.activate()\n"
            "except tms_autopreload.ResolveError as exc:\n    print(exc.cause); print(exc.fix); print(exc.message)")
    r = scn.host.run([str(scn.venv.python), "-c", code], clean_env(), setup="mount -t tmpfs tmpfs /proc")
    assert r.returncode == 0, r.stderr
    cause, fix, message = r.stdout.splitlines()
    assert (cause, fix) == ("no-proc-maps", "mount /proc"), r.stdout
    assert message == ("cannot bind the hook in this running process: dlopen returned, but /proc/self/maps cannot "
                       "be read, so that the hook is mapped cannot be confirmed"), r.stdout


def test_activate_in_a_process_started_hooked_changes_nothing(scenario):
    scn = report_host(scenario)
    code = ("import os, tms_autopreload; before = dict(os.environ); p = tms_autopreload.activate(); "
            "print(p.build, dict(os.environ) == before)")
    r = scn.run(["-c", code], {"TMS_AUTOPRELOAD": "1"})
    assert r.returncode == 0 and r.stdout.split() == [str(scn.site / CU13), "True"], r.stderr


def test_activate_after_the_runtime_is_loaded_says_restart(scenario, parts):
    scn = report_host(scenario)
    code = textwrap.dedent(f"""
        import ctypes, os
        import tms_autopreload
        ctypes.CDLL({str(parts.rt[13] / 'libcudart.so.13')!r})
        try:
            tms_autopreload.activate()
        except tms_autopreload.ResolveError as exc:
            print(exc)
            print(exc.cause)
        print('LD_PRELOAD' in os.environ)
    """)
    r = scn.run(["-c", code])
    assert r.returncode == 0, r.stderr
    message, cause, changed = r.stdout.strip().splitlines()
    assert "a runtime library is already loaded" in message and ". Fix: restart the interpreter" in message
    assert "call tms_autopreload.activate() first, before anything imports torch" in message
    assert cause == "runtime-loaded" and changed == "False"


# ---------------------------------------------------------------- an interpreter embedded in a C program

EMBED = r"""
#include <Python.h>
int main(int argc, char **argv) {
    PyConfig config;
    PyConfig_InitPythonConfig(&config);
    /* The venv's python as program name: its pyvenv.cfg makes sys.prefix the venv, so site runs its .pth. */
    PyConfig_SetBytesString(&config, &config.program_name, argv[1]);
    PyStatus status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) { Py_ExitStatusException(status); }
    int rc = PyRun_SimpleString(argv[2]);
    Py_FinalizeEx();
    return rc == 0 ? 0 : 1;
}
"""


@pytest.fixture(scope="module")
def embedder(parts, tmp_path_factory):
    """A C program that embeds this CPython, built with its own compile and link settings."""
    import shutil
    import sys
    import sysconfig

    from support import SetupError

    cfg = {k: sysconfig.get_config_var(k) for k in ("INCLUDEPY", "LIBDIR", "LDVERSION", "Py_ENABLE_SHARED")}
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None or not os.path.exists(os.path.join(cfg["INCLUDEPY"], "Python.h")):
        pytest.skip(f"needs a C compiler and Python.h for {sys.executable}")
    d = tmp_path_factory.mktemp("embed")
    (d / "embed.c").write_text(EMBED)
    r = subprocess.run([compiler, "-o", str(d / "embed"), str(d / "embed.c"), f"-I{cfg['INCLUDEPY']}",
                        f"-L{cfg['LIBDIR']}", f"-lpython{cfg['LDVERSION']}", f"-Wl,-rpath,{cfg['LIBDIR']}",
                        "-ldl", "-lm", "-lpthread"], capture_output=True, text=True)
    if r.returncode != 0:
        raise SetupError(f"cannot build the embedding program: {r.stderr}")
    return d / "embed"


def test_embedded_interpreter_is_hooked_in_process(scenario, parts, toys, embedder):
    """Where exec is impossible (the process is a C program), asking for the hook gets dlopen mode."""
    scn = report_host(scenario)
    code = PROBE.replace("sys.argv[1], sys.argv[2]",
                         f"{str(parts.rt[13] / 'libcudart.so.13')!r}, {str(toys['consumer'])!r}")
    code = code.replace("deepbind = len(sys.argv) > 3 and sys.argv[3] == 'deepbind'", "deepbind = False")
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_AUTOPRELOAD_VERBOSE="1", TMS_AUTOPRELOAD_PATH=str(toys["hook"]))
    r = scn.host.run([str(embedder), str(scn.venv.python), code], env)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert_applied("dlopen", out["reexecd"], out["hooks"], toys["hook"])
    assert out["consumer"] == out["real"] + 100 and out["saw"] == "1" and out["child_hooks"] == [str(toys["hook"])]



def test_an_embedding_program_that_cannot_be_read_stops_naming_the_symbol_already_defined(scenario, toys, embedder,
                                                                                          tmp_path):
    """The embedding program is execute-only (mode 0111, root without its permission bypass): the preloaded
    library that defines cudaMalloc cannot be looked for through the program's own search path, so the stop says
    only that the symbol is already defined, and how to set the plan before the program starts; exit 78."""
    scn = report_host(scenario)
    program = tmp_path / "embed"
    shutil.copy(embedder, program)
    program.chmod(0o111)
    env = clean_env(SLIME_OFFLOAD_TRAIN="1", TMS_AUTOPRELOAD_PATH=str(toys["hook"]), LD_PRELOAD=str(toys["defines"]))
    r = scn.host.run([*NO_DAC, str(program), str(scn.venv.python), "print('user code ran')"], env)
    message = assert_stopped(r, "is embedded in another program")
    assert "cudaMalloc is already defined in the global scope, where it would come before the hook." in message, message
    assert f"LD_PRELOAD={toys['hook']}:{toys['defines']}" in message and "from LD_PRELOAD" not in message, message

# ---------------------------------------------------------------- activate() with real torch and a real Jupyter kernel

ACTIVATE_KERNEL = KERNEL_CLIENT + f"MAPPED = {MAPPED!r}\n" + r'''
res = {'first_cell': run('import tms_autopreload\nplan = tms_autopreload.activate()\nprint(plan.build)')}
res['torch'] = json.loads(run(MAPPED +
    "import ctypes, json, os, torch\n"
    "from torch_memory_saver.hooks.mode_preload import HookUtilModePreload\n"
    "accepted = HookUtilModePreload().get_path_binary()\n"
    "ctypes.CDLL(accepted)\n"
    "print(json.dumps({'accepted': accepted, 'cuda': torch.version.cuda, 'pid': os.getpid(),\n"
    "    'cudart': mapped('/libcudart')}))"))
res['again'] = run('print(tms_autopreload.activate() is plan)')
res['kernel_pid'] = km.provisioner.process.pid
kc.stop_channels()
km.shutdown_kernel(now=True)
print(json.dumps(res))
'''


def test_activate_in_a_jupyter_kernel_binds_torch_to_the_hook(real_torch, tmp_path):
    """First cell activate(), then torch imports with its allocator bound to the hook (binding log),
    and torch_memory_saver's own check accepts the kernel. The kernel is started without any flag."""
    scn = real_torch(("driver",))
    kernels, log = tmp_path / "kernels", tmp_path / "bind"
    log.mkdir()
    (kernels / "plain").mkdir(parents=True)
    (kernels / "plain" / "kernel.json").write_text(json.dumps({
        "argv": [str(scn.venv.python), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "plain", "language": "python",
        "env": {"LD_BIND_NOW": "1", "LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log / "kernel")}}))
    driver = tmp_path / "driver.py"
    driver.write_text(ACTIVATE_KERNEL)
    r = scn.host.run([str(scn.venv.python), str(driver), str(kernels), "plain"], clean_env(), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    hook = str(scn.site / CU13)
    assert res["first_cell"] == hook and res["again"] == "True"
    assert res["torch"]["accepted"] == hook and res["torch"]["cuda"] == "13.0"
    assert res["torch"]["cudart"] == [str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")]
    for f in log.iterdir():  # keep only the kernel's own log
        if not f.name.endswith(f".{res['kernel_pid']}"):
            f.unlink()
    bound = allocator_bindings(log)
    for lib in ("libc10_cuda.so", "libtorch_cuda.so"):
        assert bound[lib] == {"cudaMalloc": hook, "cudaFree": hook}, bound


def test_activate_after_import_torch_says_restart(real_torch):
    scn = real_torch(("driver",))
    code = ("import torch, tms_autopreload\ntry:\n    tms_autopreload.activate()\n"
            "except tms_autopreload.ResolveError as exc:\n    print(exc)")
    r = scn.run(["-c", code])
    assert r.returncode == 0, r.stderr
    assert "torch is already imported" in r.stdout and "restart the kernel" in r.stdout


# ---------------------------------------------------------------- activate() misused

THREADS = MAPPED + r"""
import json, sys, threading
import tms_autopreload
barrier = threading.Barrier(16)
results = []
def worker():
    barrier.wait()
    try:
        results.append(id(tms_autopreload.activate()))
    except Exception as exc:
        results.append(f'{type(exc).__name__}: {exc}')
threads = [threading.Thread(target=worker) for _ in range(16)]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps({'results': results, 'hooks': mapped('torch_memory_saver')}))
"""


def test_activate_from_many_threads_at_once(scenario, parts, toys):
    """16 threads released together: one does the work, every other gets its plan; none raises."""
    scn = report_host(scenario)
    for _ in range(3):
        r = scn.run(["-c", THREADS], {"TMS_AUTOPRELOAD_PATH": str(toys["hook"])})
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert len(out["results"]) == 16 and len(set(out["results"])) == 1, out["results"]
        assert isinstance(out["results"][0], int) and out["hooks"] == [str(toys["hook"])], out


def test_activate_leaves_the_environment_as_it_found_it_when_it_raises(scenario, parts):
    """With SLIME_OFFLOAD_TRAIN on, activate() sets TMS_INIT_* before loading; a refusal takes them back."""
    scn = report_host(scenario)
    code = textwrap.dedent(f"""
        import ctypes, os
        import tms_autopreload
        ctypes.CDLL({str(parts.rt[13] / 'libcudart.so.13')!r})
        os.environ['SLIME_OFFLOAD_TRAIN'] = '1'  # set after start, as a notebook cell would
        before = dict(os.environ)
        try:
            tms_autopreload.activate()
        except tms_autopreload.ResolveError:
            print(dict(os.environ) == before, 'TMS_INIT_ENABLE' in os.environ)
    """)
    r = scn.run(["-c", code])
    assert r.returncode == 0 and r.stdout.split() == ["True", "False"], r.stdout + r.stderr


@pytest.mark.parametrize("entry", ["path", "bare name"])
def test_activate_advice_fits_a_preload_that_defines_cudamalloc(scenario, parts, toys, entry, tmp_path):
    """Restarting cannot help when LD_PRELOAD itself holds a library defining cudaMalloc: it must go.
    A bare name (no slash) is the file the loader found on its search path (LD_LIBRARY_PATH here), as
    for a DT_NEEDED entry, not one in the working directory."""
    scn = report_host(scenario)
    if entry == "path":
        library = toys["defines"]
        env = {"LD_PRELOAD": str(library)}
    else:
        library = cc(tmp_path / "lib" / "libfoo.so", "int cudaMalloc(void **p, unsigned long n) { return 2; }\n")
        env = {"LD_PRELOAD": "libfoo.so", "LD_LIBRARY_PATH": str(library.parent)}
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    code = ("import tms_autopreload\ntry:\n    tms_autopreload.activate()\n"
            "except tms_autopreload.ResolveError as exc:\n    print(exc)\n    print(exc.cause)")
    r = scn.run(["-c", code], env, cwd=elsewhere)
    assert r.returncode == 0, r.stderr
    message, cause = r.stdout.strip().splitlines()
    assert f"cudaMalloc is already defined in the global scope, where it would come before the hook, by {library} " \
           f"from LD_PRELOAD. Fix: every start with this LD_PRELOAD has it: remove {env['LD_PRELOAD']} from " \
           f"LD_PRELOAD" in message, message
    assert "restart" not in message.lower() and cause == "preload-defines", r.stdout


@pytest.mark.parametrize("value", ["1", "ture"])
def test_disable_turns_off_activate_and_configure_subprocess(scenario, value):
    """TMS_AUTOPRELOAD_DISABLE=1, the rollback switch, turns off every way the package applies a plan:
    activate() returns None and loads nothing, configure_subprocess() yields None and changes nothing;
    each says so once, as a RuntimeWarning. It fails safe: a value that is no off word (``ture``) does the
    same, and the warning says that value is not recognised and was taken as on."""
    scn = report_host(scenario)
    code = MAPPED + f"MAPPED = {MAPPED!r}\n" + textwrap.dedent("""
        import json, os, subprocess, sys, warnings
        import tms_autopreload
        warnings.simplefilter('always')
        before = dict(os.environ)
        plan = tms_autopreload.activate()
        with tms_autopreload.configure_subprocess() as child_plan:
            inside = dict(os.environ) == before
            child = subprocess.run([sys.executable, '-c', MAPPED + "print(bool(mapped('torch_memory_saver')))"],
                                   capture_output=True, text=True).stdout.strip()
        print(json.dumps({'plan': plan is None, 'child_plan': child_plan is None, 'inside': inside, 'child': child,
                          'self': bool(mapped('torch_memory_saver')),
                          'same': dict(os.environ) == before}))
    """)
    r = scn.run(["-c", code], {"TMS_AUTOPRELOAD_DISABLE": value})
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"plan": True, "child_plan": True, "inside": True, "child": "False", "self": False, "same": True}
    named = ("TMS_AUTOPRELOAD_DISABLE=1: " if value == "1" else
             "TMS_AUTOPRELOAD_DISABLE='ture' is not a recognised value (use 1/true/yes/on or 0/false/no/off); "
             "using on (the hook is off): ")
    said = [line for line in r.stderr.splitlines() if named in line]
    assert len(said) == 2 and f"{named}activate() changes nothing" in said[0], r.stderr
    assert f"{named}configure_subprocess() changes nothing" in said[1], r.stderr


def test_an_interpreter_named_by_a_hard_link_is_loaded_in_process_a_symlink_is_reexecd(tmp_path, monkeypatch):
    """``sys.executable`` names the running file through a symbolic link: re-exec'ing it runs the same
    program, as the loader trace saw it. Through a hard link under another name it is another path to the
    kernel, which names the file it runs as it was reached: that counts as embedded (dlopen mode)."""
    from tms_autopreload import startup

    running = (tmp_path / "bin" / "python3.11").resolve()  # the kernel's name has no link in it
    running.parent.mkdir()
    running.write_bytes(b"")
    (tmp_path / "bin" / "python3").symlink_to("python3.11")
    os.link(running, tmp_path / "bin" / "python-hard")
    readlink = os.readlink
    monkeypatch.setattr(startup.os, "readlink",
                        lambda path: str(running) if path == "/proc/self/exe" else readlink(path))
    monkeypatch.setattr(startup.sys, "orig_argv", ["python3", "-c", "pass"])
    monkeypatch.setattr(startup.sys, "executable", str(tmp_path / "bin" / "python3"))
    assert startup._cannot_exec() is None
    monkeypatch.setattr(startup.sys, "executable", str(tmp_path / "bin" / "python-hard"))
    assert startup._cannot_exec() == (f"this interpreter ({tmp_path / 'bin' / 'python-hard'}) is embedded in "
                                      f"another program ({running})")
