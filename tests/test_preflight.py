"""`doctor --ray` on the clusters users really have: a head left over from a venv with Ray only, a CPU-only
node, a daemon with a stale LD_LIBRARY_PATH, an address where nothing answers, a head that dies.

Real Ray 2.60.0, real torch_memory_saver 0.0.10 and NVIDIA's cu13 runtime wheel; GPUs are declared to
Ray with `ray start --num-gpus` (there are none here), the driver is the tests' stub. Each Ray process
carries the cluster's marker and is ended by PID (support.RayCluster), never by `ray stop`. These clusters
have no token authentication (no token in their own HOME, no `RAY_AUTH_MODE`); test_ray.py's has.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import Scenario, need, report_host
from support import ROOT, Host, RayCluster, build_own_wheel, clean_env, find_python, private_copy, ray_venv, \
    revision_source, runtime_wheel, tms_wheel, write_torch_standin

sys.path.insert(0, str(ROOT))
from tms_autopreload.commands.doctor import node_table as rows

HANG = "TMS_TEST_HANG_WORKER"
RUNTIME13 = "nvidia/cu13/lib"


def _world(parts, tmp_path_factory, world: str, host: tuple[str, ...], own_wheel: Path | None = None) -> Scenario:
    """A node's venv: Ray, this package (``own_wheel``: another revision's), torch_memory_saver 0.0.10, the cu13
    runtime wheel, a torch for CUDA 13."""
    venv = need(private_copy, need(ray_venv, find_python("3.11"), world), tmp_path_factory.mktemp(f"ray-venv-{world}")
                / "venv")
    need(venv.install, own_wheel or parts.own_wheel, tms_wheel("0.0.10"), runtime_wheel(13))
    write_torch_standin(venv.site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-pip"))
    (venv.site / "aa_tms_test_hang.pth").write_text(
        f"import os, time; os.environ.get({HANG!r}) and time.sleep(100000)\n")
    return Scenario(venv, need(Host, tmp_path_factory.mktemp(f"ray-{world}"), parts.host_dirs(host)), parts)


@pytest.fixture(scope="module")
def field(parts, tmp_path_factory):
    """Head: a venv with Ray only (the leftover cluster of agentcore-rl-toolkit #78), one GPU declared.
    ``stale``: a GPU node whose daemons carry LD_LIBRARY_PATH naming ANOTHER venv's nvidia/cu13/lib (UniRL,
    agentcore #96). ``cpu``: a node offering Ray no GPU, and no driver (a CPU-only node where a driver runs)."""
    bare = need(ray_venv, find_python("3.11"), "bare")
    bare_host = need(Host, tmp_path_factory.mktemp("ray-bare"), parts.host_dirs(("driver",)))
    stale = _world(parts, tmp_path_factory, "fieldstale", ("driver",))
    cpu = _world(parts, tmp_path_factory, "fieldcpu", ())
    cluster = RayCluster()
    try:
        cluster.start(bare_host, bare.path, "--num-gpus=1", head=True)
        cluster.start(stale.host, stale.venv.path, "--num-gpus=1",
                      env={"LD_LIBRARY_PATH": str(cpu.site / RUNTIME13)})
        cluster.start(cpu.host, cpu.venv.path, "--num-gpus=0")
        yield cluster, bare, stale, cpu
    finally:
        cluster.stop()
    assert not cluster.leftovers()


def preflight(world: Scenario, address: str, *args: str, timeout: int = 300, env: dict | None = None):
    return world.host.run([str(world.venv.python), "-m", "tms_autopreload", "doctor", "--ray", "--address", address,
                           *args], clean_env(**{"RAY_USAGE_STATS_ENABLED": "0", **(env or {})}), timeout=timeout)


def ask(world: Scenario, cluster: RayCluster, *args: str, env: dict | None = None):
    """:func:`preflight` of ``cluster``, as its client (its HOME, :meth:`RayCluster.client_env`)."""
    return preflight(world, cluster.address, *args, env=cluster.client_env(**(env or {})))


def by_prefix(doc: dict) -> dict:
    return {row["answer"]["prefix"]: row for row in doc["nodes"] if row["answer"]}


def test_node_without_the_package_and_a_cpu_only_node(field, parts, capsys):
    cluster, bare, stale, cpu = field
    r = ask(stale, cluster)
    with capsys.disabled():
        print("\n" + r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.strip().splitlines()
    assert lines[-1].startswith("3 nodes: 1 ok, 1 failing, 1 without a GPU for Ray (shown, not counted: 1 of them "
                                "failing; --all-nodes counts them)"), r.stdout
    bare_python = str(bare.path / "bin" / "python")
    row_line = next(line for line in lines if "NOT INSTALLED" in line)
    assert f"tms_autopreload is not installed for {bare_python}: the flag does nothing there" in row_line, row_line
    assert any(line.startswith("versions differ on ") and "tms_autopreload not installed" in line for line in lines)
    doc = json.loads(ask(stale, cluster, "--json").stdout)
    assert not doc["ok"]
    rows = by_prefix(doc)
    missing = rows[str(bare.path)]
    assert not missing["ok"] and missing["gpus"] == 1 and missing["answer"]["missing"]
    assert missing["error"].startswith(f"tms_autopreload is not installed for {bare_python}: the flag does nothing "
                                       f"there") and (f"`env TMS_AUTOPRELOAD_DISABLE=1 {bare_python} -m pip install "
                                                      f"{parts.own_wheel}`") in missing["error"]
    assert missing["answer"]["versions"] == {"tms_autopreload": None, "torch_memory_saver": None}
    assert rows[str(stale.venv.path)]["ok"]
    gpuless = rows[str(cpu.venv.path)]
    assert gpuless["gpus"] == 0 and not gpuless["ok"]
    assert gpuless["error"].startswith("the NVIDIA driver library libcuda.so.1 is not found by the loader")
    # --all-nodes counts the CPU-only node too.
    r = ask(stale, cluster, "--all-nodes")
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith("3 nodes: 1 ok, 2 failing"), r.stdout


# The package before doctor had rooms of its own: its node answer lived in commands/preflight.py, the module
# drivers of every version name in the probe they ship (doctor/ray_cluster.py's PROBE_SOURCE).
BEFORE_ROOMS = "c2f4592a8a"


@pytest.fixture(scope="module")
def two_versions(parts, tmp_path_factory):
    """A cluster of two GPU nodes: the head with this package, a node with the package as it was before
    doctor's rooms (built from that revision's source, as a user of that version installed it)."""
    _, source = need(revision_source, BEFORE_ROOMS, tmp_path_factory.mktemp("before-rooms"))
    before = need(build_own_wheel, tmp_path_factory.mktemp("before-rooms-dist"), source, isolated=False)
    now = _world(parts, tmp_path_factory, "roomsnow", ("driver",))
    old = _world(parts, tmp_path_factory, "roomsold", ("driver",), own_wheel=before)
    cluster = RayCluster()
    try:
        cluster.start(now.host, now.venv.path, "--num-gpus=1", head=True)
        cluster.start(old.host, old.venv.path, "--num-gpus=1")
        yield cluster, now, old
    finally:
        cluster.stop()
    assert not cluster.leftovers()


@pytest.mark.parametrize("driver", ["this version", "before the rooms"])
def test_a_driver_and_a_node_of_other_versions_understand_each_other(two_versions, driver):
    """The probe is shipped by the driver and imports the node's answer by name: a driver of this version
    reads a node of the version before, and a driver of that version reads a node of this one, each node's
    row its own answer (what its worker really did), none of them an error."""
    cluster, now, old = two_versions
    world = now if driver == "this version" else old
    r = ask(world, cluster, "--json")
    doc = json.loads(r.stdout)
    rows = by_prefix(doc)
    assert set(rows) == {str(now.venv.path), str(old.venv.path)}, r.stdout + r.stderr
    for row in rows.values():
        assert row["ok"] and not row["error"], row
        assert row["answer"]["started"]["hooked"] and row["answer"]["started"]["execs"] == 1, row
    assert doc["ok"] and r.returncode == 0, r.stdout + r.stderr
    r = ask(world, cluster)
    assert r.returncode == 0 and r.stdout.strip().splitlines()[-1].startswith("2 nodes: 2 ok"), r.stdout + r.stderr


def test_stale_daemon_library_path_still_gives_one_libcudart(field):
    """UniRL / agentcore #96: the node's Ray daemons were started with LD_LIBRARY_PATH naming ANOTHER venv's
    nvidia/cu13/lib, and every worker inherits it. The worker still starts hooked and maps one libcudart,
    its own venv's (the plan puts torch's runtime directory first), not the other venv's copy."""
    cluster, _, stale, _ = field
    doc = json.loads(ask(stale, cluster, "--json").stdout)
    good = by_prefix(doc)[str(stale.venv.path)]
    started = good["answer"]["started"]
    assert good["ok"] and started["hooked"] and started["execs"] == 1, good
    assert started["libcudart"] == [str(stale.site / RUNTIME13 / "libcudart.so.13")], started
    # The worker's own survey, made under the applied plan: torch's runtime is its own venv's copy.
    assert good["answer"]["survey"]["runtime"]["library"] == str(stale.site / RUNTIME13 / "libcudart.so.13")
    assert good["answer"]["versions"]["torch_memory_saver"] == "0.0.10"


def test_cpu_only_nodes_do_not_fail_the_preflight():
    """The verdict from plain documents, as a file of `doctor --json` answers would give them."""
    ok = {"survey": {"plan": {"build": "/x/hook.so"}, "driver": {"verdict": "ok"}, "error": None},
          "versions": {"tms_autopreload": "1", "torch_memory_saver": "0.0.10"}}
    bad = {"survey": {"plan": None, "driver": None, "error": "the NVIDIA driver library libcuda.so.1 is not found"},
           "versions": {"tms_autopreload": "1", "torch_memory_saver": "0.0.9"}}
    got = [rows.node_row("gpu", "10.0.0.1", "a" * 16, ok, None, gpus=8),
           rows.node_row("head", "10.0.0.2", "b" * 16, bad, None, gpus=0)]
    assert not rows.failing(got, all_nodes=False) and rows.failing(got, all_nodes=True) == [got[1]]
    lines = rows.summary(got, {"tms_autopreload": "1", "torch_memory_saver": "0.0.10"}, all_nodes=False)
    assert lines[0].startswith("2 nodes: 1 ok, 0 failing, 1 without a GPU")
    assert lines[1:] == ["versions differ on head bbbbbbbb (10.0.0.2): torch_memory_saver 0.0.9 (here 0.0.10)"]
    assert "none" in rows.render(got).splitlines()[2]


def test_a_preflight_that_counted_no_node_does_not_pass():
    """Only nodes that offer Ray no GPU (shown, not counted): nothing was checked, so the verdict is not a
    pass, and the summary says so and how to count them; --all-nodes counts them. The same rule as an
    empty ``doctor --nodes`` input (no row at all)."""
    ok = {"survey": {"plan": {"build": "/x/hook.so"}, "driver": {"verdict": "ok"}, "error": None},
          "versions": {"tms_autopreload": "1", "torch_memory_saver": "0.0.10"}}
    head = [rows.node_row("head", "10.0.0.2", "b" * 16, ok, None, gpus=0)]
    assert not rows.passed(head, all_nodes=False) and rows.passed(head, all_nodes=True)
    assert not rows.passed([], all_nodes=False) and not rows.passed([], all_nodes=True)
    assert rows.summary(head, None, all_nodes=False) == [
        "1 node: 0 ok, 0 failing, 1 without a GPU for Ray (shown, not counted: 0 of them failing; --all-nodes "
        "counts them); no node was counted, so nothing was checked: declare each GPU node's GPUs to Ray (`ray start "
        "--num-gpus N`), or pass --all-nodes to count every node"]
    assert rows.summary(head, None, all_nodes=True) == ["1 node: 1 ok, 0 failing"]


def test_preflight_errors_are_the_packages_errors_with_their_fix_apart():
    """Each refusal is an errors.Error (and still the builtin it was): the fix in its own field, printed as before."""
    from tms_autopreload.commands.doctor import ray_cluster as preflight
    from tms_autopreload.errors import Error

    with pytest.raises(preflight.UsageError) as info:
        preflight.check_address("local", {})
    err = info.value
    assert isinstance(err, Error) and isinstance(err, ValueError) and err.cause == "usage"
    assert err.message == "--address='local' would start a new, empty Ray cluster on this machine and check that " \
                          "one, not yours"
    assert str(err) == f"{err.message}. Fix: give the running cluster's address (HOST:PORT, as `ray start --head` " \
                       f"printed it) or auto"
    with pytest.raises(preflight.UsageError) as info:
        preflight.check_runtime_env('{"env_vars": {"A": 1}}')
    assert info.value.fix == 'quote them, e.g. "1"' and "Fix:" not in info.value.message
    assert issubclass(preflight.NoRay, (Error, RuntimeError)) and preflight.NoRay("x").cause == "no-ray"
    assert issubclass(preflight.Unreachable, (Error, RuntimeError)) and preflight.Unreachable("x").cause == "no-cluster"


def test_a_refusal_by_rays_token_authentication_says_which_and_its_fix():
    """The driver's ``refused`` event carries Ray's facts (token mode here, a token found here); each of the
    three cases has its own sentence and fix, of cause ``ray-token``, and Ray's own words in parentheses. A
    run ended by ``--timeout`` before Ray gave up has only Ray's ``Unauthenticated`` lines: counted, with
    the same fix. (Against a real Ray 2.60 cluster: test_ray.py's
    test_doctor_ray_names_the_token_a_cluster_wants_and_where_it_goes.)"""
    from tms_autopreload.commands.doctor import ray_cluster as preflight

    why = "RPC error: InvalidAuthToken: Authentication token is missing or incorrect"
    said = {}
    for token_mode, has_token in ((False, False), (False, True), (True, False), (True, True)):
        err = preflight._refused("10.0.0.1:6379", {"why": why, "token_mode": token_mode, "has_token": has_token})
        assert isinstance(err, preflight.Unreachable) and err.cause == "ray-token", err
        assert f"(Ray: {why})" in err.message and err.fix, err
        said[token_mode, has_token] = str(err)
    assert said[False, False] == said[False, True]  # without token mode no token is sent, found or not
    assert said[False, False].startswith("the Ray cluster at 10.0.0.1:6379 refused this connection: it wants a token")
    assert "RAY_AUTH_MODE is not `token` here" in said[False, False]
    assert ". Fix: `export RAY_AUTH_MODE=token`, with the cluster's token" in said[False, False]
    assert said[True, False].startswith("RAY_AUTH_MODE is `token` here, but Ray found no token to send the Ray "
                                        "cluster at 10.0.0.1:6379")
    assert said[True, False].endswith("or, for a cluster without token authentication, unset RAY_AUTH_MODE")
    assert said[True, True].startswith("the Ray cluster at 10.0.0.1:6379 refused the token this process sent: it is "
                                       "not the cluster's")
    for text in said.values():
        assert all(place in text for place in ("RAY_AUTH_TOKEN,", "RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token")), text
    log = "[2026-12-04 W gcs_client.cc:210] Failed to get cluster ID from GCS server: Unauthenticated: RPC error\n"
    assert preflight._ray_said(log * 3).startswith("; Ray: `Unauthenticated` 3 times: the cluster wants a token")
    assert preflight._ray_said(log).endswith(f"If RAY_AUTH_MODE is not `token` here: {preflight._TOKEN_MODE_FIX}")
    assert preflight._ray_said("Failed to connect to GCS at address x within 5 seconds\n") == \
        "; Ray: `Failed to connect to GCS ...` 1 time"


def test_reexecuted_means_the_marker_names_this_pid():
    """The one rule node_answer's `execs` and doctor --deep's probe ask: the environment this image started
    with holds TMS_AUTOPRELOAD_EXEC_PID=<its PID> (an exec keeps the PID); a marker of another PID is inherited."""
    code = ("import os; from tms_autopreload import environment as t; os.environ.pop(t.EXEC_VAR, None); "
            "print(t.reexecuted())")
    env = clean_env(PYTHONPATH=str(ROOT))
    for marker, said in (("$$", "True"), ("1", "False")):
        r = subprocess.run(["bash", "-c", f'TMS_AUTOPRELOAD_EXEC_PID={marker} exec "$0" -c "$1"', sys.executable,
                            code], env=env, capture_output=True, text=True, timeout=60)
        assert r.stdout.strip() == said, (marker, r.stdout, r.stderr)


@pytest.fixture(scope="module")
def gpuless_cluster(parts, tmp_path_factory):
    """A cluster of one head started as `ray start --head` is, without --num-gpus: on this machine (no GPU) it
    offers Ray no GPU, as a CPU head or a test cluster does. Its loader sees no driver, so its row says NO."""
    head = _world(parts, tmp_path_factory, "fieldcpu", ())
    cluster = RayCluster()
    try:
        cluster.start(head.host, head.venv.path, head=True)
        yield cluster, head
    finally:
        cluster.stop()
    assert not cluster.leftovers()


def test_doctor_ray_that_counted_no_node_exits_1(gpuless_cluster):
    cluster, head = gpuless_cluster
    r = ask(head, cluster)
    assert r.returncode == 1, r.stdout + r.stderr
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("1 node: 0 ok, 0 failing, 1 without a GPU for Ray (shown, not counted: 1 of them "
                           "failing; --all-nodes counts them); no node was counted, so nothing was checked: declare "
                           "each GPU node's GPUs to Ray (`ray start --num-gpus N`), or pass --all-nodes to count "
                           "every node"), r.stdout
    doc = json.loads(ask(head, cluster, "--json").stdout)
    assert not doc["ok"] and doc["nodes"][0]["gpus"] == 0 and "no node was counted" in doc["summary"], doc
    r = ask(head, cluster, "--all-nodes")
    assert r.returncode == 1 and r.stdout.strip().splitlines()[-1].startswith("1 node: 0 ok, 1 failing"), r.stdout


def test_doctor_ray_from_a_flagged_shell_answers_as_from_any_other(gpuless_cluster):
    """The command and its Ray driver are never hooked: from a shell that exported the flag, on a head whose
    loader sees no driver (a flagged Python there stops with exit 78), ``doctor --ray`` prints the same rows
    and summary as without the flag."""
    import re

    cluster, head = gpuless_cluster
    docs = []
    for env in ({}, {"TMS_AUTOPRELOAD": "1"}, {"SLIME_OFFLOAD_TRAIN": "1", "TMS_AUTOPRELOAD_MODE": "dlopen"}):
        r = ask(head, cluster, "--json", env=env)
        assert r.returncode == 1 and r.stdout, (env, r.returncode, r.stderr[-2000:])
        doc = json.loads(r.stdout)
        doc["summary"] = re.sub(r" \(\d+\.\d s\)$", "", doc["summary"])
        for row in doc["nodes"]:
            row["answer"].pop("pid")  # each run asks a new worker
        docs.append(doc)
    assert docs[1] == docs[0] and docs[2] == docs[0], docs


@pytest.fixture(scope="module")
def client(parts, tmp_path_factory) -> Scenario:
    """A machine with Ray and the package, to run the preflight against addresses where no cluster is."""
    return _world(parts, tmp_path_factory, "fieldcpu", ("driver",))


def test_nothing_listening_ends_at_once_with_exit_2(client):
    from support import free_port

    address = f"127.0.0.1:{free_port()}"
    r = preflight(client, address, "--timeout", "20")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.startswith(f"tms-autopreload doctor --ray: cannot reach the Ray cluster at {address}: "), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_a_runtime_env_ray_refuses_is_a_usage_error_before_connecting(client):
    """Fields this package does not check itself go through Ray's own RuntimeEnv checks, offline."""
    r = preflight(client, "auto", "--runtime-env", json.dumps({"pip": 5}), "--timeout", "20")
    assert r.returncode == 2 and r.stdout == "", r.stderr
    assert r.stderr.strip() == ("tms-autopreload doctor --ray: --runtime-env: Ray refuses it: runtime_env['pip'] must "
                                "be of type str or List[str], got <class 'int'>"), r.stderr


def test_an_address_that_never_answers_ends_within_the_timeout_without_rays_warnings(client):
    """Something accepts connections but never speaks Ray (a firewall, a wrong service): Ray retries for
    minutes printing `Failed to connect to GCS`; the preflight ends at --timeout, one line, exit 2."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.5)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        # A timeout, not a bound on speed: a preflight that did not end at --timeout fails by the run's timeout.
        r = preflight(client, address, "--timeout", "15", timeout=15 + 15)
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
    print(f"\n{elapsed:.1f} s: {r.stderr}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.startswith(f"tms-autopreload doctor --ray: cannot reach the Ray cluster at {address}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr  # Ray's own retries summarised, never printed


def test_refuses_addresses_that_start_a_new_cluster_and_bad_runtime_envs(scenario):
    """Checked before Ray is even imported (this venv has none), exit 2 with the fix."""
    scn = scenario(tms="0.0.10", torch="cu13-pip", pip=(13,), host=("driver",))
    cases = {
        ("--address", "local"): "would start a new, empty Ray cluster",
        ("--address", ""): "would start a new, empty Ray cluster",
        ("--address", "10.0.0.1"): "is not a Ray cluster address",
        ("--runtime-env", '{"env_vars": 5}'): "env_vars must be an object of names to strings, not int",
        ("--runtime-env", '{"env_vars": {"TMS_AUTOPRELOAD": 1}}'): "every env_vars value must be a string",
        ("--runtime-env", "[1]"): "must be a JSON object",
        ("--runtime-env", "{"): "is not JSON",
        ("--timeout", "0"): "--timeout must be a positive number",
    }
    for args, words in cases.items():
        r = scn.run(["-m", "tms_autopreload", "doctor", "--ray", *args])
        assert r.returncode == 2 and r.stdout == "" and words in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr
    r = scn.run(["-m", "tms_autopreload", "doctor", "--ray"], {"RAY_ADDRESS": "local"})
    assert r.returncode == 2 and "RAY_ADDRESS='local' would start a new, empty Ray cluster" in r.stderr, r.stderr


def test_a_head_that_dies_mid_preflight_ends_within_the_timeout(field):
    """Last in this module: it ends the cluster. Workers hang at start (HANG), the head goes away while the
    preflight waits: it ends within --timeout with `cannot reach`, exit 2, Ray's noise kept off."""
    cluster, _, stale, _ = field
    argv = stale.host.wrap([str(stale.venv.python), "-m", "tms_autopreload", "doctor", "--ray", "--address",
                            cluster.address, "--timeout", "40", "--runtime-env",
                            json.dumps({"env_vars": {HANG: "1"}})],
                           # the cluster's HOME, without its marker: stop() must not end the preflight too
                           clean_env(RAY_USAGE_STATS_ENABLED="0", HOME=str(cluster.home)))
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(12)
        assert proc.poll() is None, proc.communicate()
        cluster.stop(grace=2)
        out, err = proc.communicate(timeout=40 + 15)  # a timeout: it must end by its own --timeout 40
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    elapsed = time.monotonic() - t0
    print(f"\n{elapsed:.1f} s: {err}")
    assert proc.returncode == 2, out + err
    assert err.startswith(f"tms-autopreload doctor --ray: cannot reach the Ray cluster at {cluster.address}: it "
                          f"stopped answering during the preflight"), err
    assert len(err.strip().splitlines()) == 1, err
    assert not cluster.pids()


@pytest.mark.parametrize("driver, said", [
    ({"verdict": "failing", "message": "driver too old.", "fix": "upgrade the driver"},
     "driver too old. Fix: upgrade the driver"),
    ({"verdict": "failing", "message": None, "fix": ""}, "the driver cannot run this torch"),
])
def test_a_failing_drivers_row_error_reads_whole_from_a_foreign_document(driver, said):
    """A node's document may come from another version: a missing message or an empty fix still reads as
    one sentence and its fix, never "None. Fix: " (found by review)."""
    from tms_autopreload.commands.doctor import node_table as rows

    row = rows.node_row("n", "192.0.2.1", "id", {"survey": {"plan": {"build": "/x.so"}, "driver": driver}}, None)
    assert row["ok"] is False and row["error"] == said


def test_a_nodes_row_names_its_torch_and_the_hooks_its_worker_mapped():
    """The table's torch column from the node's survey, and the error of a worker that started unhooked:
    what it mapped instead, or none."""
    survey = {"plan": {"build": "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so"}, "driver": {"verdict": "ok"},
              "error": None, "runtime": {"kind": "cuda", "major": 13, "torch_version": "2.9.1+cu130"}}
    other = "/y/torch_memory_saver_hook_mode_preload_cu12.abi3.so"
    for mapped, said in (([other], f"mapped: {[other]}"), ([], "mapped: none")):
        answer = {"survey": survey, "started": {"hooked": False, "mapped": mapped, "libcudart": ["/x/libcudart.so.13"]}}
        row = rows.node_row("gpu", "10.0.0.1", "a" * 16, answer, None, gpus=8)
        assert not row["ok"] and row["error"] == f"the worker started unhooked ({said}, 1 libcudart)", row
    line = rows.render([row]).splitlines()[1]
    assert "2.9.1+cu130 (CUDA 13)" in line and "the worker started unhooked" in line, line


def test_doctor_json_documents_of_many_nodes_are_read_back_one_row_each():
    """``doctor --nodes``: the documents nodes printed into one stream, each a row named by its hostname."""
    doc = {"ok": True, "error": None, "plan": {"build": "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so"},
           "runtime": {"kind": "cuda", "major": 13}, "driver": {"verdict": "ok"}, "hostname": "gpu1",
           "python": "3.11.9", "versions": {"tms_autopreload": "1", "torch_memory_saver": "0.0.10"}}
    text = "\n".join(json.dumps({**doc, "hostname": name}) for name in ("gpu1", "gpu2"))
    got = rows.document_rows(text)
    assert [(r["name"], r["ok"], r["error"]) for r in got] == [("gpu1", True, None), ("gpu2", True, None)], got
    anonymous = {k: v for k, v in doc.items() if k not in ("hostname", "python")}
    assert [(r["name"], r["ok"]) for r in rows.document_rows(json.dumps(anonymous))] == [(None, True)]


# A stand-in for Ray, for what the driver asks of it, each answer chosen by TMS_TEST_RAY_STANDIN: ``raise`` (ray.init
# raises; a Ray before token authentication, ray._raylet cannot be imported), ``exit`` (Ray's core worker ends the
# driver), ``refused`` and ``gcs-fails`` (ray.init raises; asked again, the GCS refuses this process's token, or
# fails otherwise; the token loader cannot read its file), ``badenv`` (Ray refuses the runtime_env), ``noutil`` (a
# Ray without ray.util.scheduling_strategies), ``task-fails`` (one node, whose task raises), ``hang`` (the driver
# closes its stdout and never ends). Every one first prints a line of its own on the driver's stdout.
RAY_STANDIN = {
    "ray/__init__.py": "import os, sys, time\n\nHOW = os.environ['TMS_TEST_RAY_STANDIN']\n"
                       "sys.stdout.write('stand-in: not an event\\n')\nsys.stdout.flush()\n"
                       "if HOW == 'hang':\n    os.close(1)\n    time.sleep(600)\n\n\n"
                       "def init(**kw):\n"
                       "    if HOW == 'exit':\n"
                       "        sys.stderr.write('stand-in: the core worker ended this driver\\n')\n"
                       "        sys.stderr.flush()\n"
                       "        os._exit(1)\n"
                       "    if HOW != 'task-fails':\n"
                       "        raise ConnectionError('ray.init: stand-in context\\n'\n"
                       "                              'no cluster answers at this address')\n\n\n"
                       "class _Context:\n    gcs_address = '127.0.0.1:1'\n\n\n"
                       "def get_runtime_context():\n    return _Context()\n\n\n"
                       "def nodes():\n    return [{'NodeID': 'n1', 'Alive': True, 'NodeName': 'node1', "
                       "'NodeManagerAddress': '192.0.2.1', 'Resources': {'GPU': 1.0}}]\n\n\n"
                       "class _Task:\n    def options(self, **kw):\n        return self\n\n"
                       "    def remote(self, *args):\n        return object()\n\n\n"
                       "def remote(fn):\n    return _Task()\n\n\n"
                       "def wait(refs, num_returns=1, timeout=None):\n    return list(refs), []\n\n\n"
                       "def get(ref):\n    raise RuntimeError('the stand-in task\\nits worker died')\n\n\n"
                       "def cancel(ref, force=False):\n    pass\n\n\ndef shutdown():\n    pass\n",
    "ray/util/__init__.py": "",
    "ray/util/scheduling_strategies.py": "import os\nif os.environ['TMS_TEST_RAY_STANDIN'] == 'noutil':\n"
                                         "    raise ImportError('this Ray has no scheduling strategies')\n\n\n"
                                         "class NodeAffinitySchedulingStrategy:\n"
                                         "    def __init__(self, **kw):\n        pass\n",
    "ray/runtime_env.py": "import os\n\n\nclass RuntimeEnv(dict):\n    def __init__(self, **kw):\n"
                          "        if os.environ['TMS_TEST_RAY_STANDIN'] == 'badenv':\n"
                          "            raise ValueError(\"stand-in context\\nruntime_env['pip'] must be a list\")\n",
    "ray/exceptions.py": "class AuthenticationError(Exception):\n    def __init__(self, message):\n"
                         "        super().__init__(message)\n        self.message = message\n",
    "ray/_raylet.py": "import os\nfrom ray.exceptions import AuthenticationError\n\n"
                      "HOW = os.environ['TMS_TEST_RAY_STANDIN']\nif HOW == 'raise':\n"
                      "    raise ImportError('a Ray before token authentication')\n\n\n"
                      "class AuthenticationMode:\n    TOKEN = 'token'\n    DISABLED = 'disabled'\n\n\n"
                      "def get_authentication_mode():\n    return AuthenticationMode.DISABLED\n\n\n"
                      "class AuthenticationTokenLoader:\n    @classmethod\n    def instance(cls):\n"
                      "        return cls()\n\n    def has_token(self, ignore_auth_mode=False):\n"
                      "        raise AuthenticationError('RAY_AUTH_TOKEN_PATH names a file that cannot be read')\n\n\n"
                      "class GcsClient:\n    def __init__(self, address):\n        if HOW == 'refused':\n"
                      "            raise AuthenticationError('Authentication failed: no token was sent')\n"
                      "        raise RuntimeError('the stand-in GCS client failed')\n",
}


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-standin")
    for name, text in RAY_STANDIN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture
def listening():
    """An address where something accepts connections and never answers: a GCS only the stand-in speaks for."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"127.0.0.1:{server.getsockname()[1]}"


def standin_preflight(scenario, standin, how, address):
    scn = report_host(scenario)
    return scn.run(["-m", "tms_autopreload", "doctor", "--ray", "--address", address, "--timeout", "20"],
                   {"PYTHONPATH": str(standin), "TMS_TEST_RAY_STANDIN": how}, timeout=120)


def driver_events(scenario, standin, how, address):
    """The events the driver prints for a request as the preflight makes it, the driver let to end by itself (the
    preflight ends its process group once it has its answer). Its lines that are no event are left out."""
    request = {"address": address, "runtime_env": None, "timeout": 20, "deadline": time.time() + 15,
               "gcs_check": None if address == "auto" else address}
    r = report_host(scenario).run(["-c", "from tms_autopreload.commands.doctor.ray_driver import main; main()"],
                                  {"PYTHONPATH": str(standin), "TMS_TEST_RAY_STANDIN": how}, input=json.dumps(request),
                                  timeout=120)
    assert r.stdout.startswith("stand-in: not an event\n"), r.stdout + r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()[1:]]


@pytest.mark.parametrize("how, said", [
    ("raise", "cannot reach the Ray cluster at auto: no cluster answers at this address"),
    ("exit", "cannot reach the Ray cluster at auto: Ray's client ended: stand-in: the core worker ended this driver"),
    ("badenv", "--runtime-env: Ray refuses it: runtime_env['pip'] must be a list"),
    ("noutil", "Ray is not installed for "),
    ("hang", "cannot reach the Ray cluster at auto: no answer within 20 s"),
])
def test_a_driver_that_ray_ends_says_why_at_once(scenario, standin, how, said):
    """``doctor --ray``'s driver reports what Ray said: what ``ray.init`` raised (its last line), a runtime_env
    Ray refuses, a Ray it cannot use; a driver that Ray's core worker ends without a word of its own is said as
    that, with Ray's last line, and one that closes its output and never ends is ended; never a silence until
    ``--timeout``, and never a line of its output that is not an event. Ray is a stand-in here (the real one,
    against real addresses: test_nothing_listening_ends_at_once_with_exit_2 and its neighbours)."""
    r = standin_preflight(scenario, standin, how, "auto")
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith(f"tms-autopreload doctor --ray: {said}") and r.stderr.count("\n") == 1, r.stderr
    if how in EVENTS:
        assert driver_events(scenario, standin, how, "auto") == [EVENTS[how]]


# The driver's one event for each stand-in that ends it before it connects (where it prints one).
EVENTS = {"raise": {"event": "unreachable", "why": "no cluster answers at this address"}, "noutil": {"event": "noray"},
          "badenv": {"event": "badenv", "why": "runtime_env['pip'] must be a list"}}


@pytest.mark.parametrize("how, said", [
    ("refused", "refused this connection: it wants a token (Ray's token authentication), and RAY_AUTH_MODE is not "
                "`token` here, so none was sent (Ray: Authentication failed: no token was sent)"),
    ("gcs-fails", "no cluster answers at this address"),
])
def test_a_connection_refused_for_its_token_is_told_from_any_other_failure(scenario, standin, listening, how, said):
    """``ray.init`` raised, and the GCS, asked again, refused this process's token: the cause is Ray's token
    authentication, with its fix, whatever the token loader could read; a GCS that fails otherwise is no answer
    about authentication, and what ``ray.init`` said is the reason."""
    r = standin_preflight(scenario, standin, how, listening)
    assert r.returncode == 2 and r.stdout == "", r.stdout + r.stderr
    assert r.stderr.startswith("tms-autopreload doctor --ray: ") and said in r.stderr, r.stderr
    assert ("Fix: `export RAY_AUTH_MODE=token`" in r.stderr) == (how == "refused"), r.stderr
    assert driver_events(scenario, standin, how, listening) == [
        {"event": "refused", "why": "Authentication failed: no token was sent", "token_mode": False, "has_token": False}
        if how == "refused" else {"event": "unreachable", "why": "no cluster answers at this address"}]


def test_a_node_whose_task_fails_is_a_row_that_says_why(scenario, standin):
    """The cluster answers, and the task on its one node raises: that node's row says the task failed, with the
    last line of its error, and the preflight fails (exit 1)."""
    r = standin_preflight(scenario, standin, "task-fails", "auto")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the task failed on that node: its worker died" in r.stdout, r.stdout
    events = driver_events(scenario, standin, "task-fails", "auto")
    assert [e["event"] for e in events] == ["connected", "progress", "rows", "done"], events
    assert events[2]["rows"][0]["error"] == "the task failed on that node: its worker died", events[2]


def test_an_address_where_nothing_listens_ends_before_any_driver(scenario, standin):
    """Ray is there, and nothing accepts connections at the address: said at once, before any driver starts."""
    from support import free_port

    address = f"127.0.0.1:{free_port()}"
    r = standin_preflight(scenario, standin, "raise", address)
    assert r.returncode == 2 and r.stderr == (
        f"tms-autopreload doctor --ray: cannot reach the Ray cluster at {address}: nothing accepts connections there "
        f"(no head started, a wrong port, or the head died)\n"), r.stderr
