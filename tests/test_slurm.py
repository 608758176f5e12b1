"""Slurm: ``srun`` with the flag hooks every task, and ``doctor --nodes`` is the preflight without Ray.

A real Slurm 22.05 from Debian's packages runs here (tests/slurm.py): slurmctld and four slurmd, each
slurmd in its own node view, every node with its own install at the same path (``/…/opt/venv``):

* n1: a CUDA 13 node (torch built for 13, NVIDIA's cu13 runtime wheel), the driver mounted;
* n2: a CUDA 12 node (torch built for 12, the cu12 runtime wheel), the driver mounted;
* n3: n1's install on a node whose driver is not mounted (the loader sees no libcuda.so.1);
* n4: a node whose install lacks tms_autopreload (torch_memory_saver only).

The commands are the ones docs/integrations.md shows, run as written inside an allocation (``salloc``)
from n1, the submitting machine.
"""

from __future__ import annotations

import json
import os
import re
import shlex

import pytest
from conftest import DEFAULT_PYTHON, need
from slurm import Node, Slurm
from support import MAPPED, ROOT, Host, Venv, fenced_blocks, find_python, runtime_wheel, tms_wheel

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
HEADER = ("node  ip  GPUs  python  tms_autopreload  torch_memory_saver  torch (runtime)  driver  hooked  build, or the "
          "first line of the error")

# What a task reports: where it runs, what is mapped, whether its start re-exec'd once.
PROBE = MAPPED + r"""
import json, os, socket, sys
maps = mapped()
initial = open('/proc/self/environ', 'rb').read().split(b'\0')
out = {'task': os.environ['SLURM_PROCID'], 'node': os.environ['SLURMD_NODENAME'], 'hostname': socket.gethostname(),
       'prefix': sys.prefix, 'hooks': [m for m in maps if 'torch_memory_saver' in m],
       'cudart': [m for m in maps if os.path.basename(m).startswith('libcudart')],
       'execs': (f'TMS_AUTOPRELOAD_EXEC_PID={os.getpid()}'.encode() in initial)}
"""
REPORT = "print(json.dumps(out), flush=True)\n"
# With real torch: torch_memory_saver's own preload-mode check, and what its BinaryWrapper does with the value.
TORCH_CHECK = r"""
import ctypes, torch
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
out['accepted'] = HookUtilModePreload().get_path_binary()
ctypes.CDLL(out['accepted'])
out['torch'] = torch.__version__
out['cudart'] = [m for m in mapped() if os.path.basename(m).startswith('libcudart')]
"""


def slurm_blocks() -> list[str]:
    """The command blocks (fences without a language; ``text`` ones show output) of docs/integrations.md's
    Slurm section, as a user copies them."""
    text = (ROOT / "docs" / "integrations.md").read_text()
    section = text[text.index("\n## Slurm"):]
    section = section[:section.index("\n## ", 1)]
    return fenced_blocks(section)


def docs_block(first_word: str, contains: str) -> str:
    found = [b for b in slurm_blocks() if b.startswith(first_word) and contains in b]
    assert len(found) == 1, slurm_blocks()
    return found[0]


@pytest.fixture(scope="module")
def cluster(scenario, tmp_path_factory):
    cu13 = scenario(tms="0.0.9.post1", torch="cu13-pip", pip=(13,), host=("driver",))
    cu12 = scenario(tms="0.0.9.post1", torch="cu12-pip", pip=(12,), host=("driver",))
    root = tmp_path_factory.mktemp("slurm")
    bare = need(Venv, root / "bare", find_python(DEFAULT_PYTHON), [tms_wheel("0.0.9.post1"), runtime_wheel(13)])
    nodriver = need(Host, root / "nodriver", [])
    shared = root / "opt" / "venv"
    nodes = [Node("n1", cu13.host, cu13.venv.path), Node("n2", cu12.host, cu12.venv.path),
             Node("n3", nodriver, cu13.venv.path), Node("n4", cu13.host, bare.path)]
    slurm = need(Slurm, root / "cluster", shared, nodes)
    try:
        yield slurm, {"n1": cu13, "n2": cu12}
    finally:
        slurm.stop()


def submit(slurm: Slurm, nodes: list[str], block: str, cwd, path: str, tasks_per_node: int = 1):
    """Run a docs block in an allocation of ``nodes`` (salloc), from n1, with ``path`` first on PATH."""
    argv = ["salloc", f"-N{len(nodes)}", "-w", ",".join(nodes), f"--ntasks-per-node={tasks_per_node}",
            "bash", "-c", block]
    env = slurm.env(PATH=f"{path}:{os.environ['PATH']}")
    r = slurm.nodes[0].host.run(argv, env, setup=f'mount --bind "{slurm.nodes[0].mount}" "{slurm.shared}"',
                                cwd=cwd, timeout=300)
    print(f"$ {shlex.join(argv)}\n{r.stdout}{r.stderr}")
    return r


def answers(stdout: str) -> dict[str, dict]:
    return {a["task"]: a for a in (json.loads(line) for line in stdout.splitlines() if line.startswith("{"))}


def in_shared(slurm: Slurm, venv, path) -> str:
    """``path`` of ``venv`` as a task sees it: under the shared path where its node mounts it."""
    return str(slurm.shared / os.path.relpath(path, venv.path))


def test_srun_with_the_flag_hooks_every_task_with_its_nodes_build(cluster, tmp_path):
    slurm, worlds = cluster
    (tmp_path / "train.py").write_text(PROBE + REPORT)
    r = submit(slurm, ["n1", "n2"], docs_block("srun --export", "python train.py"), tmp_path,
               f"{slurm.shared}/bin", tasks_per_node=2)
    assert r.returncode == 0, r.stdout + r.stderr
    got = answers(r.stdout)
    assert sorted(got) == ["0", "1", "2", "3"], r.stdout
    for task in got.values():
        world, build, runtime = {"n1": (worlds["n1"], CU13, "nvidia/cu13/lib/libcudart.so.13"),
                                 "n2": (worlds["n2"], CU12, "nvidia/cuda_runtime/lib/libcudart.so.12")}[task["node"]]
        assert task["hostname"] == task["node"] and task["prefix"] == str(slurm.shared), task
        assert task["hooks"] == [in_shared(slurm, world.venv, world.site / build)], task
        assert task["cudart"] == [in_shared(slurm, world.venv, world.site / runtime)], task
        assert task["execs"], task  # the task's interpreter re-executed once with the plan
    assert sorted(t["node"] for t in got.values()) == ["n1", "n1", "n2", "n2"]


def test_srun_export_of_named_variables_only_hooks_too(cluster, tmp_path):
    """AReaL's Slurm launcher writes ``--export=K=V,...`` without ALL: the task gets those variables
    and Slurm's own, no PATH. The flag alone is enough there too."""
    slurm, worlds = cluster
    listing = "out['env'] = sorted(k for k in os.environ if not k.startswith('SLURM'))\n"
    (tmp_path / "train.py").write_text(PROBE + listing + REPORT)
    block = f"srun --export=TMS_AUTOPRELOAD=1 {slurm.shared}/bin/python {tmp_path}/train.py"
    r = submit(slurm, ["n1", "n2"], block, tmp_path, f"{slurm.shared}/bin")
    assert r.returncode == 0, r.stdout + r.stderr
    got = {task["node"]: task for task in answers(r.stdout).values()}
    assert "PATH" not in got["n1"]["env"] and "TMS_AUTOPRELOAD" in got["n1"]["env"], got["n1"]["env"]
    for node, build in (("n1", CU13), ("n2", CU12)):
        world = worlds[node]
        assert got[node]["hooks"] == [in_shared(slurm, world.venv, world.site / build)] and got[node]["execs"]
        assert len(got[node]["cudart"]) == 1, got[node]


def test_srun_real_torch_task_is_hooked_and_torch_memory_saver_accepts_it(cluster, real_torch, tmp_path):
    """Real torch 2.14.1 (CUDA 13, pip runtime only) started by srun on n1 with the docs' command line."""
    slurm, _ = cluster
    scn = real_torch(("driver",))
    (tmp_path / "train.py").write_text(PROBE + TORCH_CHECK + REPORT)
    r = submit(slurm, ["n1"], docs_block("srun --export", "python train.py"), tmp_path, str(scn.venv.path / "bin"))
    assert r.returncode == 0, r.stdout + r.stderr
    (task,) = answers(r.stdout).values()
    hook = str(scn.site / CU13)
    assert task["node"] == "n1" and task["torch"].startswith("2.14.1"), task
    assert task["hooks"] == [hook] and task["accepted"] == hook and task["execs"], task
    assert task["cudart"] == [str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")], task


def rows(stdout: str) -> dict[str, str]:
    """The preflight table's rows by their node column."""
    lines = stdout.strip().splitlines()
    assert lines[0].split() == HEADER.split(), stdout
    return {line.split()[0] + ("" if line.split()[0] != "task" else " " + line.split()[1]): line
            for line in lines[1:-1]}


def words(table: str) -> list[list[str]]:
    return [[re.sub(r"^3\.\d+\.\d+$", "3.x", w) for w in line.split()] for line in table.strip().splitlines()]


def test_preflight_every_node_answers_with_its_own_build(cluster, tmp_path):
    slurm, _ = cluster
    block = docs_block("srun --ntasks-per-node=1", "--nodes -")
    r = submit(slurm, ["n1", "n2"], block, tmp_path, f"{slurm.shared}/bin")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "2 nodes: 2 ok, 0 failing"
    got = rows(r.stdout)
    assert set(got) == {"n1", "n2"}
    assert got["n1"].split()[-2:] == ["yes", CU13] and "(CUDA 13)" in got["n1"]
    assert got["n2"].split()[-2:] == ["yes", CU12] and "(CUDA 12)" in got["n2"]


def test_preflight_shows_the_driverless_node_and_the_node_without_the_package(cluster, tmp_path):
    slurm, worlds = cluster
    block = docs_block("srun --ntasks-per-node=1", "--nodes -")
    r = submit(slurm, ["n1", "n2", "n3", "n4"], block, tmp_path, f"{slurm.shared}/bin")
    assert r.returncode == 1, r.stdout + r.stderr
    assert r.stdout.strip().splitlines()[-1] == "4 nodes: 2 ok, 2 failing"
    got = rows(r.stdout)
    assert set(got) == {"n1", "n2", "n3", "task 3"}, got
    assert " NO " in got["n3"] and "the NVIDIA driver library libcuda.so.1 is not found by the loader" in got["n3"]
    assert " NO " in got["task 3"] and "tms-autopreload" in got["task 3"], got["task 3"]
    # The table docs/integrations.md shows is this one (its Python version aside).
    shown = re.search(r"```text\n(node .*?)```", (ROOT / "docs" / "integrations.md").read_text(), re.S).group(1)
    assert words(shown) == words(r.stdout)

    # The documents kept in a file, read again as --json: the same rows, and each node's document.
    r = submit(slurm, ["n1", "n2", "n3", "n4"], docs_block("srun --ntasks-per-node=1", "nodes.txt"), tmp_path,
               f"{slurm.shared}/bin")
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    assert set(doc) == {"ok", "nodes", "summary", "notes"} and not doc["ok"]
    assert doc["summary"] == "4 nodes: 2 ok, 2 failing"
    by_name = {row["name"]: row for row in doc["nodes"]}
    for name, build in (("n1", CU13), ("n2", CU12)):
        survey = by_name[name]["answer"]["survey"]
        assert by_name[name]["ok"] and survey["hostname"] == name
        # The console script's interpreter is the node's venv by its own path (its #! line), not the shared one.
        assert survey["plan"]["build"] == str(worlds[name].site / build)
    assert by_name["n3"]["error"].startswith("the NVIDIA driver library libcuda.so.1 is not found by the loader")
    assert by_name["task 3"]["answer"] is None


def test_readme_srun_commands_are_the_tested_ones():
    """The README's Slurm command lines are the docs' blocks that the tests above run."""
    tested = {line for block in slurm_blocks() for line in block.splitlines()}
    readme = (ROOT / "README.md").read_text().replace("\\|", "|")
    found = re.findall(r"srun [^`#\n]*[^`#\s]", readme)
    assert found and all(command.strip() in tested for command in found), (found, tested)


def test_nodes_file_that_cannot_be_read_is_a_usage_error(scenario, tmp_path):
    scn = scenario(tms="0.0.9.post1", torch="cu13-pip", pip=(13,), host=("driver",))
    r = scn.run(["-m", "tms_autopreload", "doctor", "--nodes", str(tmp_path / "missing.txt")])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip() == f"tms-autopreload doctor --nodes: cannot read {tmp_path / 'missing.txt'}: " \
                               f"No such file or directory", r.stderr
    r = scn.run(["-m", "tms_autopreload", "doctor", "--nodes", "-"], input="")
    assert r.returncode == 1 and r.stdout.splitlines()[-1] == (
        "0 nodes: 0 ok, 0 failing; no node's doctor --json document was read, so nothing was checked"), r.stdout
