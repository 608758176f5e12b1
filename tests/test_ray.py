"""Real Ray 2.60.0 workers (2.58.0 in one named scenario), on two nodes that differ the way real clusters do.

Two Ray nodes run on this machine, each started from its own venv inside its own mount namespace:
node A is a CUDA 13 world (torch built for 13, NVIDIA's cu13 runtime wheel), node B a CUDA 12 world
(torch built for 12, the cu12 runtime wheel). Neither sees the machine's own CUDA: the host cache lists
only the driver stub. The driver runs on node A. Actors get only ``SLIME_OFFLOAD_TRAIN=1`` through
``runtime_env`` and must come up with their own node's build; a path resolved on the driver, as slime
does today, must be shown wrong for node B.

The cluster has token authentication, as a new user of Ray 2.60 gets it (support.RayCluster: a token in
the cluster's own ``~/.ray``, found by a plain ``ray start --head``); its drivers and ``doctor --ray`` say
``RAY_AUTH_MODE=token``, and without it ``doctor --ray`` names that cause and the fix. The clusters of
test_preflight.py and test_miles.py, and the 2.58.0 scenario here, have none.
"""

from __future__ import annotations

import json
import os
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import Scenario, assert_applied, need
from support import (MAPPED, RAY_VERSION, RAY_VERSIONS, REEXECD, ROOT, Host, RayCluster, clean_env, fenced_blocks,
                     find_python, private_copy, ray_venv, runtime_wheel, tms_wheel, write_torch_standin)

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

ACTOR = REEXECD + MAPPED + r"""
import json, os, subprocess, sys
import ray

@ray.remote
class Probe:
    def report(self):
        maps = mapped()
        child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
        return {'pid': os.getpid(), 'prefix': sys.prefix,
                'hooks': sorted({m for m in maps if 'torch_memory_saver' in m}),
                'cudart': sorted({m for m in maps if os.path.basename(m).startswith('libcudart')}),
                'tms_init': [os.environ.get('TMS_INIT_ENABLE'), os.environ.get('TMS_INIT_ENABLE_CPU_BACKUP')],
                'child': child.returncode, 'child_err': child.stderr.strip(),
                'exe': os.path.realpath('/proc/self/exe'), 'reexecd': reexecd()}

def slime_today(site):
    # slime/ray/actor_group.py as it ships now (cu13 first), evaluated on the driver.
    for name in ('torch_memory_saver_hook_mode_preload_cu13.abi3.so',
                 'torch_memory_saver_hook_mode_preload_cu12.abi3.so',
                 'torch_memory_saver_hook_mode_preload.abi3.so'):
        if os.path.exists(os.path.join(site, name)):
            return os.path.join(site, name)

ray.init(address=os.environ['RAY_ADDRESS_FOR_TEST'], log_to_driver=False)
flag = {'env_vars': {'SLIME_OFFLOAD_TRAIN': '1', 'TMS_AUTOPRELOAD_MODE': os.environ['MODE_FOR_TEST']}}
out = {}
for node in ('cu13node', 'cu12node'):
    actor = Probe.options(runtime_env=flag, resources={node: 0.01}, num_cpus=0).remote()
    out[node] = ray.get(actor.report.remote(), timeout=180)
    info = ray._private.state.actors(actor_id=actor._actor_id.hex())
    out[node]['ray_pid'] = info['Pid']
site = next(p for p in sys.path if p.endswith('site-packages'))
out['driver_path'] = slime_today(site)
out['ray'] = ray.__version__
print(json.dumps(out))
"""


def _ray_world(parts, tmp_path_factory, world: str, major: int, version: str = RAY_VERSION) -> Scenario:
    venv = need(private_copy, need(ray_venv, find_python("3.11"), world, version),
                tmp_path_factory.mktemp(f"ray-venv-{world}") / "venv")
    need(venv.install, parts.own_wheel, tms_wheel("0.0.9.post1"), runtime_wheel(major))
    torch = f"cu{major}-pip"
    write_torch_standin(venv.site, cuda=f"{major}.0", hip=None, deps_lib=parts.global_deps(torch))
    return Scenario(venv, need(Host, tmp_path_factory.mktemp(f"ray-{world}"), parts.host_dirs(("driver",))), parts)


# Every node here offers Ray one GPU (`ray start --num-gpus=1`), as GPU nodes do: the preflight counts them.
GPU = "--num-gpus=1"


def join(cluster: RayCluster, world: Scenario, resource: str, *args: str) -> None:
    """Start a Ray node from ``world``'s venv, in its own namespace, joined to ``cluster``."""
    cluster.start(world.host, world.venv.path, f'--resources={{"{resource}": 1}}', *args)


def two_node_cluster(a: Scenario, b: Scenario, cluster: RayCluster) -> None:
    """Node A, the head, and node B joined to it, each offering its resource name (``cu13node``, ``cu12node``)."""
    cluster.start(a.host, a.venv.path, '--resources={"cu13node": 1}', GPU, head=True)
    join(cluster, b, "cu12node", GPU)


@pytest.fixture(scope="module")
def ray_cluster(parts, tmp_path_factory):
    a = _ray_world(parts, tmp_path_factory, "cu13", 13)
    b = _ray_world(parts, tmp_path_factory, "cu12", 12)
    cluster = RayCluster(token=True)
    try:
        two_node_cluster(a, b, cluster)
        yield a, b, cluster.address, cluster
    finally:
        cluster.stop()
    assert not cluster.leftovers()  # nothing left behind: no process, no state, the user's ~/.ray as it was


def test_the_cluster_keeps_its_state_in_its_own_directory(ray_cluster):
    """A test cluster is ended by PID, so Ray's own clean-up never runs: its state must not be Ray's shared
    ``/tmp/ray``, where ``ray_current_cluster`` would point a later plain ``ray.init(num_cpus=2)`` on this
    machine at a dead cluster ("When connecting to an existing cluster, num_cpus and num_gpus must not be
    provided"). Each node writes under the cluster's own directory, which ``stop()`` removes (the fixture
    checks that nothing is left)."""
    _, _, address, cluster = ray_cluster
    port = f":{address.rpartition(':')[2]}"  # Ray writes the head's address, with the node's own IP
    own = cluster.temp / cluster.nodes[0] / "ray_current_cluster"
    assert own.read_text().strip().endswith(port), own.read_text()
    shared = "/tmp/ray/ray_current_cluster"
    assert not os.path.exists(shared) or not open(shared).read().strip().endswith(port)


def each_node_resolves_its_own(a: Scenario, b: Scenario, cluster: RayCluster, mode: str, version: str,
                                script: os.PathLike) -> None:
    """The ACTOR driver on node A: an actor on each node, with the flag only, maps its own node's build and
    runtime (in ``mode``), its bash child starts, and the driver ran Ray ``version``; the path slime makes
    on the driver today names node A's build, which kills a worker's bash on node B."""
    with open(script, "w") as fh:
        fh.write(textwrap.dedent(ACTOR))
    r = a.host.run([str(a.venv.python), str(script)],
                   cluster.client_env(RAY_ADDRESS_FOR_TEST=cluster.address, MODE_FOR_TEST=mode), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["ray"] == version, out["ray"]
    for node, world, build, runtime in (("cu13node", a, CU13, "nvidia/cu13/lib/libcudart.so.13"),
                                        ("cu12node", b, CU12, "nvidia/cuda_runtime/lib/libcudart.so.12")):
        got = out[node]
        assert got["prefix"] == str(world.venv.path), got
        assert_applied(mode, got["reexecd"], got["hooks"], world.site / build)  # dlopen: loaded in-process
        assert got["cudart"] == [str(world.site / runtime)], got
        assert got["tms_init"] == ["1", "1"]
        assert got["child"] == 0, got["child_err"]
        assert got["pid"] == got["ray_pid"]  # the worker Ray started is the actor (an exec keeps the PID)
        assert got["exe"] == os.path.realpath(world.venv.python)
    # slime today: the path made on the driver (node A) names node A's cu13 build ...
    driver_path = out["driver_path"]
    assert driver_path == str(a.site / CU13)
    # ... which on node B is another venv's file and cannot load there: Ray's worker bash dies first.
    r = b.host.run(["bash", "-c", "true"], clean_env(LD_PRELOAD=driver_path))
    assert r.returncode == 127 and "libcudart.so.13: cannot open shared object file" in r.stderr


def test_heterogeneous_nodes_each_resolve_their_own(ray_cluster, tmp_path, mode):
    a, b, _, cluster = ray_cluster
    each_node_resolves_its_own(a, b, cluster, mode, RAY_VERSION, tmp_path / "driver.py")


@pytest.mark.slow  # real Ray: a cluster of its own
def test_ray_2_58_heterogeneous_nodes_each_resolve_their_own(parts, tmp_path_factory, tmp_path):
    """The release before today's, Ray 2.58.0 (token authentication off unless asked), kept for one scenario:
    the same two nodes from 2.58.0 venvs, a cluster without a token, each node's actor hooked with its own
    build, and ``doctor --ray`` passing both nodes."""
    version = RAY_VERSIONS[1]
    a = _ray_world(parts, tmp_path_factory, "cu13", 13, version)
    b = _ray_world(parts, tmp_path_factory, "cu12", 12, version)
    cluster = RayCluster()
    try:
        two_node_cluster(a, b, cluster)
        each_node_resolves_its_own(a, b, cluster, "exec", version, tmp_path / "driver.py")
        r = preflight(a, cluster)
        assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("2 nodes: 2 ok, 0 failing"), \
            r.stdout + r.stderr
    finally:
        cluster.stop()
    assert not cluster.leftovers()


def test_local_actor_pid_and_no_stray_process(ray_cluster, tmp_path):
    """The exec keeps the PID Ray started: no second process appears for the worker."""
    a, _, address, cluster = ray_cluster
    code = REEXECD + textwrap.dedent("""
        import json, os, ray
        ray.init(address=os.environ['RAY_ADDRESS_FOR_TEST'], log_to_driver=False)
        @ray.remote
        def where():
            ppid = int(open('/proc/self/stat').read().rsplit(')', 1)[1].split()[1])
            def environ(p):
                try:
                    return open(f'/proc/{p}/environ', 'rb').read()
                except OSError:
                    return b''
            # A process left behind by the exec would carry the marker naming this PID.
            assert reexecd()  # this worker did re-exec
            marker = f'TMS_AUTOPRELOAD_EXEC_PID={os.getpid()}'.encode()
            siblings = [p for p in os.listdir('/proc')
                        if p.isdigit() and p != str(os.getpid()) and marker in environ(p)]
            return {'pid': os.getpid(),
                    'ppid_cmd': open(f'/proc/{ppid}/cmdline', 'rb').read().split(b'\\0')[0].decode(),
                    'strays': siblings}
        f = where.options(runtime_env={'env_vars': {'TMS_AUTOPRELOAD': '1'}}, resources={'cu13node': 0.01})
        print(json.dumps(ray.get(f.remote(), timeout=180)))
    """)
    script = tmp_path / "local.py"
    script.write_text(code)
    r = a.host.run([str(a.venv.python), str(script)], cluster.client_env(RAY_ADDRESS_FOR_TEST=address), timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["strays"] == []
    assert "raylet" in out["ppid_cmd"], out


# ---------------------------------------------------------------- the preflight, `doctor --ray`

HANG = "TMS_TEST_HANG_WORKER"


def preflight(world, cluster, *args, timeout=300, env=None):
    """``doctor --ray --address`` the cluster's, from ``world``'s venv, as a client of it (``env``: instead of
    :meth:`RayCluster.client_env`)."""
    return world.host.run([str(world.venv.python), "-m", "tms_autopreload", "doctor", "--ray", "--address",
                           cluster.address, *args], cluster.client_env() if env is None else env, timeout=timeout)


# The job runtime_env of docs/integrations.md's example.
SLIME_JOB = json.dumps({"env_vars": {"SLIME_OFFLOAD_TRAIN": "1"}})


def table_then_document(world, cluster, code, summary):
    """Run the preflight twice: the table (printed, for the record; exit code and summary line checked),
    then ``--json`` with the docs' slime runtime_env. Returns (the table, the document)."""
    r = preflight(world, cluster)
    assert r.returncode == code, r.stdout + r.stderr
    print(r.stdout)
    assert r.stdout.strip().splitlines()[-1].startswith(summary), r.stdout
    return r.stdout, json.loads(preflight(world, cluster, "--json", "--runtime-env", SLIME_JOB).stdout)


def rows_by_build(doc):
    out = {}
    for row in doc["nodes"]:
        plan = row["answer"]["survey"]["plan"] if row["answer"] else None
        out[os.path.basename(plan["build"]) if plan else None] = row
    return out


def test_preflight_every_node_answers_with_its_own_build(ray_cluster):
    a, b, _, cluster = ray_cluster
    _, doc = table_then_document(a, cluster, 0, "2 nodes: 2 ok, 0 failing")
    assert doc["ok"] and len(doc["nodes"]) == 2
    got = rows_by_build(doc)
    for build, world, major in ((CU13, a, 13), (CU12, b, 12)):
        row = got[build]
        assert row["ok"] and row["error"] is None, row
        answer = row["answer"]
        assert answer["prefix"] == str(world.venv.path)
        assert answer["started"]["hooked"] and answer["started"]["execs"] == 1
        assert answer["survey"]["runtime"]["major"] == major
        assert [os.path.basename(p) for p in answer["started"]["libcudart"]] == [f"libcudart.so.{major}"]


@pytest.fixture(scope="module")
def driverless_node(ray_cluster, parts, tmp_path_factory):
    """A third node whose driver is not mounted (its loader sees no libcuda.so.1). Its venv also hangs a
    worker's start when HANG is set, standing in for a node whose workers cannot start."""
    a, _, address, cluster = ray_cluster
    from support import find_python

    venv = need(private_copy, need(ray_venv, find_python("3.11"), "nodriver"),
                tmp_path_factory.mktemp("ray-venv-nodriver") / "venv")
    need(venv.install, parts.own_wheel, tms_wheel("0.0.9.post1"), runtime_wheel(13))
    write_torch_standin(venv.site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    (venv.site / "aa_tms_test_hang.pth").write_text(
        f"import os, time; os.environ.get({HANG!r}) and time.sleep(100000)\n")
    c = Scenario(venv, need(Host, tmp_path_factory.mktemp("ray-nodriver"), []), parts)
    join(cluster, c, "nodrivernode", GPU)
    return c


def test_preflight_shows_the_driverless_node_failing(ray_cluster, driverless_node):
    a, _, _, cluster = ray_cluster
    table, doc = table_then_document(a, cluster, 1, "3 nodes: 2 ok, 1 failing")
    assert not doc["ok"]
    got = rows_by_build(doc)
    assert got[CU13]["ok"] and got[CU12]["ok"]
    bad = got[None]
    assert not bad["ok"] and bad["answer"]["prefix"] == str(driverless_node.venv.path)
    assert bad["error"].startswith("the NVIDIA driver library libcuda.so.1 is not found by the loader"), bad["error"]
    assert not bad["answer"]["started"]["hooked"]  # it lived, unhooked, to say so (ON_ERROR=warn)
    line = next(row for row in table.splitlines() if "NO" in row.split())
    assert "the NVIDIA driver library libcuda.so.1 is not found" in line


def test_preflight_ends_within_its_timeout_when_a_worker_cannot_start(ray_cluster, driverless_node):
    a, _, _, cluster = ray_cluster
    # A timeout, not a bound on speed: if --timeout 20 did not end the wait, the run's timeout fails the test.
    r = preflight(a, cluster, "--timeout", "20", "--json", "--runtime-env", json.dumps({"env_vars": {HANG: "1"}}),
                  timeout=180)
    assert r.returncode == 1, r.stdout + r.stderr
    doc = json.loads(r.stdout)
    silent = [row for row in doc["nodes"] if row["answer"] is None]
    assert len(silent) == 1 and silent[0]["error"].startswith("no answer within 20 s"), doc
    assert sum(row["ok"] for row in doc["nodes"]) == 2


def test_preflight_without_ray_says_what_to_install(scenario):
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    r = scn.run(["-m", "tms_autopreload", "doctor", "--ray"])
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().endswith(f"env TMS_AUTOPRELOAD_DISABLE=1 {scn.venv.python} -m pip install ray`"), r.stderr


def test_preflight_shows_progress_on_a_terminal(ray_cluster):
    """On a terminal (a pty from script(1)), stderr carries `N/M nodes answered` while it waits."""
    import shlex
    import shutil

    if shutil.which("script") is None:
        pytest.skip("script(1) from util-linux is needed for a pty")
    a, _, address, cluster = ray_cluster
    cmd = shlex.join([str(a.venv.python), "-m", "tms_autopreload", "doctor", "--ray", "--address", address])
    r = a.host.run(["script", "-q", "-e", "-c", cmd, "/dev/null"], cluster.client_env(), timeout=300)
    assert "nodes answered" in r.stdout and "nodes:" in r.stdout, r.stdout + r.stderr


def test_doctor_ray_names_the_token_a_cluster_wants_and_where_it_goes(ray_cluster, tmp_path):
    """The cluster wants a token (its head found one in ``~/.ray``, as Ray 2.60 does after a ``ray.init()``).
    ``doctor --ray --address`` from a shell without ``RAY_AUTH_MODE=token`` said only Ray's ``Failed to
    connect to Ray cluster at <the node's own IP>``; it says the cause and the fix, from Ray's own facts:
    the cluster refused a process that sent no token, a process in token mode found none to send, a token
    that is not the cluster's was refused (``RAY_AUTH_TOKEN`` is sent before the right one in ``~/.ray``).
    A ``--timeout`` shorter than Ray's 20 s of retries still names the cause, from Ray's words."""
    a, _, address, cluster = ray_cluster
    assert (cluster.home / ".ray" / "auth_token").is_file()
    empty = tmp_path / "home"
    empty.mkdir()
    prefix = "tms-autopreload doctor --ray: "
    cases = {
        "no mode": ((), cluster.env()),
        "no token": ((), cluster.client_env(HOME=str(empty))),
        "another token": ((), cluster.client_env(RAY_AUTH_TOKEN="0123456789abcdef" * 4)),
        "no mode, short timeout": (("--timeout", "8"), cluster.env()),
    }
    with ThreadPoolExecutor(len(cases)) as pool:  # Ray retries for 20 s before it gives up: wait once, not thrice
        futures = {name: pool.submit(preflight, a, cluster, *args, env=env, timeout=120)
                   for name, (args, env) in cases.items()}
        runs = {name: future.result() for name, future in futures.items()}
    for name, r in runs.items():
        print(f"{name}: {r.stderr}")
        assert r.returncode == 2 and r.stdout == "" and len(r.stderr.strip().splitlines()) == 1, (name, r.stderr)
        assert "Failed to connect to Ray cluster" not in r.stderr, (name, r.stderr)
    fix = ("`export RAY_AUTH_MODE=token`, with the cluster's token (on its head: `ray get-auth-token`, or the file "
           "~/.ray/auth_token of the user who started it) in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, "
           "or in ~/.ray/auth_token")
    assert runs["no mode"].stderr.strip() == (
        f"{prefix}the Ray cluster at {address} refused this connection: it wants a token (Ray's token "
        f"authentication), and RAY_AUTH_MODE is not `token` here, so none was sent (Ray: RPC error: InvalidAuthToken: "
        f"Authentication token is missing or incorrect). Fix: {fix}")
    assert runs["no token"].stderr.startswith(
        f"{prefix}RAY_AUTH_MODE is `token` here, but Ray found no token to send the Ray cluster at {address} (Ray: "
        f"Token authentication is enabled but no authentication token was found). Fix: put the cluster's token "), \
        runs["no token"].stderr
    assert runs["another token"].stderr.startswith(
        f"{prefix}the Ray cluster at {address} refused the token this process sent: it is not the cluster's (Ray: "
        f"RPC error: InvalidAuthToken: "), runs["another token"].stderr
    # docs/integrations.md shows the first, for its example address, as printed
    shown = [line for block in fenced_blocks((ROOT / "docs" / "integrations.md").read_text(), "text")
             for line in block.splitlines() if line.startswith(f"{prefix}the Ray cluster at ")]
    assert shown == [runs["no mode"].stderr.strip().replace(address, "10.0.0.1:6379")], shown
    short = runs["no mode, short timeout"].stderr
    assert short.startswith(f"{prefix}cannot reach the Ray cluster at {address}: no answer within 8 s; Ray: "
                            f"`Unauthenticated` ") and short.strip().endswith(fix), short


# ---------------------------------------------------------------- `ray job submit` with resolved values

JOB = REEXECD + MAPPED + r"""
import json, os, subprocess
import ray

def report():
    maps = mapped()
    child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
    return {'hooks': sorted({m for m in maps if 'torch_memory_saver' in m}),
            'cudart': sorted({m for m in maps if os.path.basename(m).startswith('libcudart')}),
            'child': child.returncode, 'child_err': child.stderr.strip(), 'reexecd': reexecd()}

ray.init(log_to_driver=False)
print('JOB ' + json.dumps({'entrypoint': report(), 'worker': ray.get(ray.remote(num_cpus=0)(report).remote(),
                                                                      timeout=180)}), flush=True)
"""


@pytest.fixture
def jobs_node(parts, tmp_path):
    """One pip-only CUDA 13 node (torch_memory_saver 0.0.10, NVIDIA's cu13 runtime wheel, a CUDA 13 torch
    stand-in; the host cache lists the driver stub only) running a head with its dashboard, started
    without any flag, from ``tmp_path`` (the jobs' working directory)."""
    from support import find_python, free_port, ray_jobs_venv

    venv = need(private_copy, need(ray_jobs_venv, find_python("3.11")), tmp_path / "venv")
    need(venv.install, parts.own_wheel, tms_wheel("0.0.10"), runtime_wheel(13))
    write_torch_standin(venv.site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    node = Scenario(venv, need(Host, tmp_path / "host", parts.host_dirs(("driver",))), parts)
    cluster, port = RayCluster(), free_port()
    path = f"{venv.path / 'bin'}:{os.environ['PATH']}"
    try:
        cluster.start(node.host, venv.path, head=True, dashboard=port, env={"PATH": path}, cwd=tmp_path)
        yield node, cluster, f"http://127.0.0.1:{port}", path
    finally:
        cluster.stop()
    assert not cluster.leftovers()


def test_ray_job_submit_with_resolved_values_from_a_flagged_shell(jobs_node, tmp_path):
    """docs/integrations.md's resolved ``ray job submit`` line, run as shown from a shell that exported the
    flag (as people do for slime scripts), against a real Ray head whose raylet started without any flag:
    the job's entrypoint and its worker are hooked with the cu13 build and one libcudart, and their bash
    child starts. (The command printed only ``LD_PRELOAD`` there before: every child died with exit 127.)"""
    from test_snippets import shown_line

    node, cluster, address, path = jobs_node
    (tmp_path / "train.py").write_text(JOB)
    lines = shown_line(ROOT / "docs" / "integrations.md", "ray job submit --runtime-env-json \"")
    assert len(lines) == 1, lines
    r = node.host.run(["bash", "-c", lines[0]], cluster.env(TMS_AUTOPRELOAD="1", RAY_ADDRESS=address, PATH=path),
                      cwd=tmp_path, timeout=600)
    found = [json.loads(line[4:]) for line in r.stdout.splitlines() if line.startswith("JOB ")]
    assert r.returncode == 0 and found, r.stdout[-4000:] + r.stderr[-3000:]
    hook, cudart = (os.path.realpath(node.site / p) for p in (CU13, "nvidia/cu13/lib/libcudart.so.13"))
    for who, seen in found[0].items():
        assert seen["hooks"] == [hook] and seen["cudart"] == [cudart], (who, seen)
        assert seen["child"] == 0 and not seen["reexecd"], (who, seen)


FLAG_PROBE = r"""
import json, os, sys
import ray
address, temp = sys.argv[1:3]
if address == 'local':
    ray.init(_temp_dir=temp, include_dashboard=False, num_cpus=1, log_to_driver=False)
else:
    ray.init(address=address, log_to_driver=False)

@ray.remote(num_cpus=0)
class Actor:
    def flag(self):
        return os.environ.get('SLIME_OFFLOAD_TRAIN')

print('flag-probe: ' + json.dumps(ray.get(Actor.remote().flag.remote(), timeout=120)), flush=True)
ray.shutdown()
"""


@pytest.mark.slow  # real Ray: a cluster of its own, and one the driver starts
def test_a_flag_on_the_driver_reaches_the_actors_only_of_a_cluster_the_driver_starts(parts, tmp_path):
    """README's slime section: `SLIME_OFFLOAD_TRAIN=1` in the driver's environment is not in the actors' on a
    cluster started with `ray start` (Ray 2.60.0); only a cluster that the driver's own `ray.init()` starts
    copies it. So for slime the patch, which puts the flag in each actor's runtime_env, is what matters.
    That `ray.init()` is the one that writes Ray 2.60's token, ``~/.ray/auth_token``: in the cluster's own
    HOME, and the user's ``~/.ray`` is left as it was (``leftovers()``)."""
    venv = need(ray_venv, find_python("3.11"), "bare")
    host = need(Host, tmp_path / "host", parts.host_dirs(("driver",)))
    script = tmp_path / "probe.py"
    script.write_text(FLAG_PROBE)
    cluster = RayCluster()
    token = cluster.home / ".ray" / "auth_token"
    seen = {}
    try:
        cluster.start(host, venv.path, head=True)
        for address in (cluster.address, "local"):
            assert not token.exists()  # none for `ray start`, nor for a driver that connects to its cluster
            r = host.run([str(venv.python), str(script), address, str(cluster.temp / "local")],
                         cluster.env(SLIME_OFFLOAD_TRAIN="1"), timeout=300)
            line = next((x for x in r.stdout.splitlines() if x.startswith("flag-probe: ")), None)
            assert line is not None, r.stdout[-2000:] + r.stderr[-2000:]
            seen[address] = json.loads(line.split(": ", 1)[1])
        assert token.is_file()  # the driver that started a cluster wrote one
    finally:
        cluster.stop()
    assert seen == {cluster.address: None, "local": "1"}, seen
    assert not cluster.leftovers()
