"""AReaL's ``get_tms_env_vars()`` (``areal/utils/offload.py``), its real file, before and after
``patches/areal/main-4aef98d8d.patch``.

The file comes from AReaL's own wheel on the package index (``areal==1.0.4``, whose
``offload.py`` is the blob the patch names); the patched copy is what ``git apply`` makes of it.
A launcher process imports each copy as it is (the file imports only ``os``, ``contextlib`` and,
guarded, ``torch_memory_saver``: nothing of AReaL is stubbed), calls ``get_tms_env_vars()`` and
starts a trainer stand-in with that environment through ``bash``, as AReaL's launchers start
trainers through a shell. The trainer reports what it mapped, asks torch_memory_saver's own
preload-mode check (``HookUtilModePreload().get_path_binary()`` and the ``ctypes.CDLL`` that
follows it) and AReaL's own ``is_tms_enabled()`` from the same file.

Hosts: real torch 2.14.1+cu130 with a system CUDA 13 and with only torch's pip runtime; a CUDA 12
torch (a stand-in: no CUDA 12 torch wheel installs here) with a system CUDA 12 and with only the
pip runtime. The driver is the only other stand-in.
"""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from conftest import need
from support import MAPPED, clean_env, wheel

ROOT = Path(__file__).resolve().parent.parent
PATCH = ROOT / "patches" / "areal" / "main-4aef98d8d.patch"
AREAL = "areal==1.0.4"
MEMBER = "areal/utils/offload.py"
CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

LAUNCHER = r"""
import importlib.util, json, os, shlex, subprocess, sys
offload_file, worker, kind, shape = sys.argv[1:5]
if kind == 'standin':
    # The torch stand-in cannot be imported, and torch_memory_saver's __init__ imports torch. The
    # unpatched function reads only the package's __file__: a bare package with the real one.
    import types
    site = next(p for p in sys.path if p.endswith('site-packages'))
    package = types.ModuleType('torch_memory_saver')
    package.__path__ = [os.path.join(site, 'torch_memory_saver')]
    package.__file__ = os.path.join(site, 'torch_memory_saver', '__init__.py')
    sys.modules['torch_memory_saver'] = package
spec = importlib.util.spec_from_file_location('areal_offload', offload_file)
offload = importlib.util.module_from_spec(spec)
spec.loader.exec_module(offload)
env = offload.get_tms_env_vars()
argv = [sys.executable, worker, kind, offload_file]
if shape == 'stdbuf':  # AReaL's local launcher: "K=V ... stdbuf -oL <cmd>" through a shell
    line = ' '.join(f'{k}={v}' for k, v in env.items()) + ' stdbuf -oL ' + shlex.join(argv)
    r = subprocess.run(line, shell=True, capture_output=True, text=True)
else:
    r = subprocess.run(['bash', '-c', 'exec "$0" "$@"', *argv], env={**os.environ, **env},
                       capture_output=True, text=True)
print(json.dumps({'env': env, 'rc': r.returncode, 'out': r.stdout, 'err': r.stderr}))
"""

WORKER = MAPPED + r"""
import ctypes, importlib.util, json, os, sys, types
kind, offload_file = sys.argv[1:3]
maps = mapped('.so')
hooks = [m for m in maps if 'torch_memory_saver' in os.path.basename(m)]
site = next(p for p in sys.path if p.endswith('site-packages'))
if kind == 'real':
    import torch
    cuda = torch.version.cuda
else:
    # The torch stand-in cannot be imported, and torch_memory_saver's __init__ imports torch; its
    # preload check (hooks/mode_preload.py, hooks/base.py, utils.py) does not, so load just those.
    cuda = None
    package = types.ModuleType('torch_memory_saver')
    package.__path__ = [os.path.join(site, 'torch_memory_saver')]
    sys.modules['torch_memory_saver'] = package
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
try:
    accepted = HookUtilModePreload().get_path_binary()
    ctypes.CDLL(accepted)  # what torch_memory_saver's BinaryWrapper does with it
    verdict = 'accepted'
except (AssertionError, OSError) as exc:
    accepted, verdict = None, f'refused: {exc}'
spec = importlib.util.spec_from_file_location('areal_offload', offload_file)
offload = importlib.util.module_from_spec(spec)
spec.loader.exec_module(offload)
after = mapped('.so')
print(json.dumps({'hooks': hooks, 'accepted': accepted, 'verdict': verdict, 'cuda': cuda,
                  'preload': os.environ.get('LD_PRELOAD'),
                  'cudart': [m for m in after if os.path.basename(m).startswith('libcudart')],
                  'is_tms_enabled': offload.is_tms_enabled(),
                  'tms_init': [os.environ.get('TMS_INIT_ENABLE'), os.environ.get('TMS_INIT_ENABLE_CPU_BACKUP')]}))
"""


@pytest.fixture(scope="module")
def offload(tmp_path_factory) -> dict[str, Path]:
    """{'unpatched': AReaL's released offload.py, 'patched': the same after ``git apply`` of the patch}."""
    root = tmp_path_factory.mktemp("areal")
    with zipfile.ZipFile(need(wheel, AREAL)) as z:
        text = z.read(MEMBER)
    src = root / "tree"
    (src / MEMBER).parent.mkdir(parents=True)
    (src / MEMBER).write_bytes(text)
    (root / "unpatched.py").write_bytes(text)
    subprocess.run(["git", "init", "-q"], cwd=src, check=True)
    r = subprocess.run(["git", "apply", str(PATCH)], cwd=src, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    (root / "patched.py").write_bytes((src / MEMBER).read_bytes())
    (root / "launcher.py").write_text(LAUNCHER)
    (root / "worker.py").write_text(WORKER)
    return {"unpatched": root / "unpatched.py", "patched": root / "patched.py", "dir": root}


def launch(scn, offload, which: str, kind: str, shape: str = "bash") -> dict:
    """Run the launcher (unflagged, as AReaL's launchers run) with one copy of offload.py."""
    d = offload["dir"]
    r = scn.host.run([str(scn.venv.python), str(d / "launcher.py"), str(offload[which]), str(d / "worker.py"), kind,
                      shape], clean_env(), timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def worker_report(out: dict) -> dict:
    assert out["rc"] == 0, out["err"][-3000:]
    return json.loads(out["out"].strip().splitlines()[-1])


# host id: (real torch or a stand-in, what builds the host)
HOSTS = {
    "cuda13-system": ("real", ("driver", "cuda13")),
    "cuda13-pip-only": ("real", ("driver",)),
    "cuda12-system": ("standin", ("cu12-sys", (), ("driver", "cuda12"))),
    "cuda12-pip-only": ("standin", ("cu12-pip", (12,), ("driver",))),
}
TMS_VERSIONS = ["0.0.9.post1", "0.0.10"]  # the first with a CUDA 13 build; the newest release


def host_for(name: str, tms: str, real_torch, scenario):
    kind, spec = HOSTS[name]
    if kind == "real":
        return kind, real_torch(spec, tms=tms)
    torch, pip, host = spec
    return kind, scenario(tms=tms, torch=torch, pip=pip, host=host)


def expected(name: str, scn, parts) -> tuple[str, str]:
    """(the hook, the one libcudart) a worker on this host must map."""
    major = 13 if name.startswith("cuda13") else 12
    build = str(scn.site / (CU13 if major == 13 else CU12))
    if major == 13:  # torch's own runtime, whatever else the host has
        return build, str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    if name == "cuda12-system":
        return build, str(parts.rt[12] / "libcudart.so.12")
    return build, str(scn.site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12")


@pytest.mark.parametrize("tms", TMS_VERSIONS)
@pytest.mark.parametrize("host", list(HOSTS))
def test_areal_trainer_before_and_after_the_patch(real_torch, scenario, parts, offload, host, tms):
    kind, scn = host_for(host, tms, real_torch, scenario)
    hook, cudart = expected(host, scn, parts)

    before = launch(scn, offload, "unpatched", kind)
    assert before["env"] == {"LD_PRELOAD": str(scn.site / "torch_memory_saver_hook_mode_preload.abi3.so"),
                             "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
    if host == "cuda12-system":
        # The unsuffixed name is the CUDA 12 build: it loads where the loader finds libcudart.so.12.
        got = worker_report(before)
        assert got["hooks"] == [before["env"]["LD_PRELOAD"]] and got["verdict"] == "accepted", got
    else:
        # The report: CUDA 13 hosts (and a CUDA 12 pip install) kill the trainer in the loader.
        assert before["rc"] == 127, before
        assert "libcudart.so.12: cannot open shared object file" in before["err"], before["err"]

    after = launch(scn, offload, "patched", kind)
    assert after["env"] == {"TMS_AUTOPRELOAD": "1", "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
    got = worker_report(after)
    assert got["hooks"] == [hook], got
    assert got["cudart"] == [cudart], got
    assert got["verdict"] == "accepted" and got["accepted"] == hook, got
    assert got["is_tms_enabled"] is True and got["tms_init"] == ["1", "1"]
    if kind == "real":
        assert got["cuda"] == "13.0"


def test_patched_get_tms_env_vars_does_not_import_torch_memory_saver(real_torch, offload):
    """The function no longer imports torch_memory_saver (and torch) to build a path; the module's own
    guarded import, which AReaL's engines use for the singleton, is unchanged by the patch."""
    scn = real_torch(("driver",), tms="0.0.10")
    code = ("import importlib.util, sys; s = importlib.util.spec_from_file_location('o', sys.argv[1]); "
            "m = importlib.util.module_from_spec(s); sys.modules['torch_memory_saver'] = None; "
            "s.loader.exec_module(m); print(sorted(m.get_tms_env_vars())); print('torch' in sys.modules)")
    r = scn.run(["-c", code, str(offload["patched"])])
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["['TMS_AUTOPRELOAD', 'TMS_INIT_ENABLE', 'TMS_INIT_ENABLE_CPU_BACKUP']", "False"]
    r = scn.run(["-c", code, str(offload["unpatched"])])
    assert r.returncode != 0 and "ModuleNotFoundError" in r.stderr  # the old one needs torch_memory_saver


def test_areal_pin_0_0_9_on_cuda13_is_a_clear_error(real_torch, offload):
    """AReaL pins torch_memory_saver 0.0.9, which has no CUDA 13 build: before, the trainer dies in the
    loader; after, it stops before any user code with one message naming the cause and the upgrade."""
    scn = real_torch(("driver", "cuda13"), tms="0.0.9")
    before = launch(scn, offload, "unpatched", "real")
    assert before["rc"] == 127 and "libcudart.so.12: cannot open shared object file" in before["err"], before
    after = launch(scn, offload, "patched", "real")
    print(after["err"])
    assert after["rc"] == 78 and after["out"] == "", after
    err = after["err"]
    assert err.startswith("tms-autopreload: ") and "Traceback" not in err
    assert "error while loading shared libraries" not in err
    assert "no torch_memory_saver preload build fits CUDA 13" in err, err
    assert ("install a torch_memory_saver that ships a CUDA 13 build (0.0.9.post1 and later ship one): "
            f"`env TMS_AUTOPRELOAD_DISABLE=1 {scn.venv.python} -m ") in err, err
    assert "-m pip install 'torch-memory-saver>=0.0.9.post1'`" in err, err


STDBUF_VERDICTS = {"0.0.9.post1": "refused", "0.0.10": "accepted"}


@pytest.mark.parametrize("tms", list(STDBUF_VERDICTS))
def test_areal_local_launcher_through_stdbuf(real_torch, offload, tms):
    """AReaL's local launcher runs ``K=V ... stdbuf -oL <cmd>``, and stdbuf appends its libstdbuf.so to
    LD_PRELOAD (AReaL #1482). After the patch the trainer is hooked with its own build, the hook first and
    libstdbuf kept; torch_memory_saver 0.0.10 accepts one torch_memory_saver entry among others, while
    0.0.9.post1 reads the whole value as one path and refuses it, and tms-autopreload says so with the fix."""
    scn = real_torch(("driver",), tms=tms)
    got = worker_report(after := launch(scn, offload, "patched", "real", "stdbuf"))
    hook = str(scn.site / CU13)
    assert got["hooks"] == [hook], got
    entries = got["preload"].split(":")
    assert entries[0] == hook and len(entries) == 2 and entries[1].endswith("/libstdbuf.so"), got
    assert got["verdict"].startswith(STDBUF_VERDICTS[tms]), got
    if tms == "0.0.9.post1":
        assert "pip install 'torch-memory-saver>=0.0.10'" in after["err"], after["err"]
