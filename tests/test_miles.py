"""miles' ``allocate_gpus_for_actor`` (``miles/ray/train/actor_factory.py``): its ``offload_train`` block,
before and after ``patches/miles/``, run on the driver of a real Ray 2.60.0 cluster whose nodes differ.

miles cannot be installed here (no wheel of it; it needs Megatron and a GPU), so the test takes the
block itself: the patches carry the whole ``if args.offload_train and args.train_backend == "megatron":``
block as context, and their pre- and post-image are the file at the commit each header names (checked
with ``git apply --check`` there, and here against their own pre-image by test_patches.py). The block
runs on the driver as ``exec`` of its own text with miles' ``args`` fields, then one actor is started on
each node with the ``runtime_env`` it built, as miles starts its train actors.

The cluster: node A (the driver's) is a CUDA 13 pip install, node B a CUDA 12 pip install (each a
private copy of the cached Ray venv with torch_memory_saver 0.0.10, NVIDIA's runtime wheel, our wheel
and a torch stand-in). Their loaders see only the driver stub. Every daemon and worker
carries a marker variable, and only those are ended afterwards; the cluster has no token authentication.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from conftest import Scenario, need
from support import (MAPPED, Host, RayCluster, find_python, private_copy, ray_venv, runtime_wheel, tms_wheel,
                     write_torch_standin)
from test_patches import parse

ROOT = Path(__file__).resolve().parent.parent
PATCHES = {"06de48eec": ROOT / "patches" / "miles" / "06de48eec.patch",
           "main": ROOT / "patches" / "miles" / "main-31f1ca961.patch"}
TMS = "0.0.10"  # the first release with the disk backend (TMS_INIT_ENABLE_DISK_BACKUP) main checks for
CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
START = '    if args.offload_train and args.train_backend == "megatron":'


def offload_block(patch: Path, side: str) -> str:
    """The ``offload_train`` block of the pre-image (``before``) or post-image (``after``), dedented."""
    _, hunks = parse(patch.read_text())
    (_, old, new), = hunks
    lines = old if side == "before" else new
    i = lines.index(START)
    end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() and not lines[j].startswith("     "))
    return textwrap.dedent("\n".join(lines[i:end])) + "\n"


DRIVER = MAPPED + r"""
import ctypes, importlib.machinery, importlib.util, json, os, sys, types
from pathlib import Path
import ray

RESULT = 'miles-test-result: '  # Ray's own lines may follow on stdout
block_file, target, disk_dir, shape = sys.argv[1:5]
site = next(p for p in sys.path if p.endswith('site-packages'))
# What `import torch` loads first on the driver (the stand-in torch cannot be imported): it links
# torch's own libcudart, which torch_memory_saver's probe then finds by its soname.
ctypes.CDLL(os.path.join(site, 'torch', 'lib', 'libtorch_global_deps.so'))
# torch_memory_saver's __init__ imports torch, which the stand-in cannot; the package, with its real
# path, without its __init__: its real utils.py then decides (its probe finds the libcudart.so.13
# loaded above, the answer torch.version.cuda gives with a real torch).
spec = importlib.machinery.ModuleSpec('torch_memory_saver', None, is_package=True)
spec.submodule_search_locations = [os.path.join(site, 'torch_memory_saver')]
package = importlib.util.module_from_spec(spec)
package.__file__ = os.path.join(site, 'torch_memory_saver', '__init__.py')
sys.modules['torch_memory_saver'] = package
args = types.SimpleNamespace(offload_train=True, train_backend='megatron', offload_train_target=target,
                             offload_train_disk_dir=disk_dir, offload_train_disk_chunk_mb=64)
env_vars = {'NCCL_CUMEM_ENABLE': '0'}  # one of the variables miles sets before the block
out = {'error': None}
try:
    exec(open(block_file).read(), {'os': os, 'Path': Path, 'args': args, 'env_vars': env_vars})
except Exception as exc:
    out['error'] = f'{type(exc).__name__}: {exc}'
out['env_vars'] = dict(env_vars)

@ray.remote
class Probe:
    def report(self):
        maps = mapped()
        return {'prefix': sys.prefix, 'hooks': [m for m in maps if 'torch_memory_saver' in m],
                'cudart': [m for m in maps if os.path.basename(m).startswith('libcudart')],
                'env': {k: v for k, v in os.environ.items() if k.startswith(('TMS_', 'LD_PRELOAD'))}}

ray.init(address=os.environ['RAY_ADDRESS_FOR_TEST'], log_to_driver=False)
for rank, node in enumerate(('cu13node', 'cu12node')):
    env = dict(env_vars)
    if shape == 'main' and target == 'disk':
        # main sets the directory per rank, after the block (unchanged by the patch).
        env['TMS_DISK_BACKUP_DIR'] = os.path.join(disk_dir, f'cell0_rank{rank}')
    actor = Probe.options(runtime_env={'env_vars': env}, resources={node: 0.01}, num_cpus=0).remote()
    try:
        out[node] = ray.get(actor.report.remote(), timeout=float(os.environ['ACTOR_TIMEOUT_FOR_TEST']))
    except Exception as exc:
        out[node] = {'died': f'{type(exc).__name__}: {str(exc)[:300]}'}
    ray.kill(actor)
print(RESULT + json.dumps(out), flush=True)
"""


def _world(parts, root: Path, world: str, major: int) -> Scenario:
    """A node's venv: a private copy of the cached Ray venv with our wheel, torch_memory_saver, NVIDIA's
    runtime wheel for ``major`` and a torch stand-in for ``major``."""
    venv = need(private_copy, need(ray_venv, find_python("3.11"), world), root / "venv")
    need(venv.install, parts.own_wheel, tms_wheel(TMS), runtime_wheel(major))
    write_torch_standin(venv.site, cuda=f"{major}.0", hip=None, deps_lib=parts.global_deps(f"cu{major}-pip"))
    return Scenario(venv, need(Host, root / "host", parts.host_dirs(("driver",))), parts)


@pytest.fixture(scope="module")
def miles_cluster(parts, tmp_path_factory):
    a = _world(parts, tmp_path_factory.mktemp("miles-cu13"), "cu13", 13)
    b = _world(parts, tmp_path_factory.mktemp("miles-cu12"), "cu12", 12)
    cluster = RayCluster()
    try:
        cluster.start(a.host, a.venv.path, '--resources={"cu13node": 1}', head=True, name="a")
        cluster.start(b.host, b.venv.path, '--resources={"cu12node": 1}', name="b")
        yield a, b, cluster.address, cluster
    finally:
        cluster.stop()  # exactly this cluster's processes, never `ray stop`; its directory goes too
    assert not cluster.leftovers()


def raylet_errors(temp: Path, node: str) -> str:
    """A node's raylet stderr: where the loader's error lands when the bash that Ray starts each worker
    through dies before the worker's Python starts."""
    return "".join(p.read_text(errors="replace") for p in (temp / node).glob("session_2*/logs/raylet.err"))


def drive(miles_cluster, tmp_path, shape: str, side: str, target: str, actor_timeout: int) -> dict:
    a, _, address, cluster = miles_cluster
    block = tmp_path / f"{shape}-{side}.py"
    block.write_text(offload_block(PATCHES[shape], side))
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    r = a.host.run([str(a.venv.python), str(script), str(block), target, str(tmp_path / "disk"), shape],
                   cluster.client_env(RAY_ADDRESS_FOR_TEST=address, ACTOR_TIMEOUT_FOR_TEST=str(actor_timeout)),
                   timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    line = next(line for line in r.stdout.splitlines() if line.startswith("miles-test-result: "))
    return json.loads(line.split(": ", 1)[1])


def test_the_blocks_are_whole():
    for patch in PATCHES.values():
        for side in ("before", "after"):
            block = offload_block(patch, side)
            assert block.startswith("if args.offload_train") and 'env_vars["TMS_INIT_ENABLE_CPU_BACKUP"] = "1"' in block
            compile(block, str(patch), "exec")
        assert "LD_PRELOAD" in offload_block(patch, "before") and "LD_PRELOAD" not in offload_block(patch, "after")


@pytest.mark.parametrize("shape", list(PATCHES))
def test_before_every_actor_gets_the_drivers_pick_and_dies(miles_cluster, tmp_path, shape):
    a, b, _, cluster = miles_cluster
    seen = {node: len(raylet_errors(cluster.temp, node)) for node in "ab"}
    out = drive(miles_cluster, tmp_path, shape, "before", "cpu", 30)
    assert out["error"] is None, out
    # The driver (node A, torch for CUDA 13) picks its own cu13 build and sends that path to every node.
    assert out["env_vars"]["LD_PRELOAD"] == str(a.site / CU13)
    # Node A's loader does not search torch's nvidia/cu13/lib (sglang #36533); node B is a CUDA 12 node
    # handed node A's cu13 build. On both, the bash Ray starts the worker through dies in the loader.
    for node, log in (("cu13node", "a"), ("cu12node", "b")):
        assert "died" in out[node], out[node]
        new = raylet_errors(cluster.temp, log)[seen[log]:]
        assert "bash: error while loading shared libraries: libcudart.so.13: cannot open shared object file" \
            in new, new[-3000:]


CASES = [("06de48eec", "cpu"), ("06de48eec", "disk"), ("main", "cpu"), ("main", "disk")]


@pytest.mark.parametrize("shape,target", CASES, ids=[f"{s}-{t}" for s, t in CASES])
def test_after_each_actor_is_hooked_with_its_own_build_and_keeps_miles_variables(miles_cluster, tmp_path,
                                                                                 shape, target):
    a, b, _, _ = miles_cluster
    out = drive(miles_cluster, tmp_path, shape, "after", target, 180)
    assert out["error"] is None, out
    tms = {k: v for k, v in out["env_vars"].items() if k.startswith("TMS_")}
    if target == "cpu":
        assert tms == {"TMS_AUTOPRELOAD": "1", "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
    else:
        assert tms == {"TMS_AUTOPRELOAD": "1", "TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "0",
                       "TMS_INIT_ENABLE_DISK_BACKUP": "1", "TMS_DISK_BACKUP_CHUNK_MB": "64",
                       **({"TMS_DISK_BACKUP_DIR": str(tmp_path / "disk")} if shape == "06de48eec" else {})}
    assert "LD_PRELOAD" not in out["env_vars"]
    for rank, (node, world, build, runtime) in enumerate((
            ("cu13node", a, CU13, "nvidia/cu13/lib/libcudart.so.13"),
            ("cu12node", b, CU12, "nvidia/cuda_runtime/lib/libcudart.so.12"))):
        got = out[node]
        assert "died" not in got, got
        assert got["prefix"] == str(world.venv.path), got
        assert got["hooks"] == [str(world.site / build)], got
        assert got["cudart"] == [str(world.site / runtime)], got
        assert got["env"]["LD_PRELOAD"] == str(world.site / build), got
        want = dict(tms)
        if shape == "main" and target == "disk":
            want["TMS_DISK_BACKUP_DIR"] = str(tmp_path / "disk" / f"cell0_rank{rank}")
        for name, value in want.items():  # every value miles set reaches the actor unchanged
            assert got["env"].get(name) == value, (name, got["env"])


def test_main_disk_check_still_refuses_a_build_without_the_disk_backend(miles_cluster, tmp_path):
    """main asserts that the build has the disk backend; after the patch it checks every preload build
    of the driver's torch_memory_saver. 0.0.10's builds have it (the test above); 0.0.9.post1's do not."""
    a, _, _, _ = miles_cluster
    block = tmp_path / "main-after.py"
    block.write_text(offload_block(PATCHES["main"], "after"))
    need(a.venv.install, tms_wheel("0.0.9.post1"))
    try:
        code = ("import os, types, sys; from pathlib import Path; "
                "args = types.SimpleNamespace(offload_train=True, train_backend='megatron', "
                "offload_train_target='disk', offload_train_disk_dir='/x', offload_train_disk_chunk_mb=64); "
                "exec(open(sys.argv[1]).read(), {'os': os, 'Path': Path, 'args': args, 'env_vars': {}})")
        r = a.run(["-c", code, str(block)])
    finally:
        need(a.venv.install, tms_wheel(TMS))
    assert r.returncode == 1 and "AssertionError" in r.stderr and "has no disk backend" in r.stderr, r.stderr
