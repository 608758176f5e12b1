"""Every word a user reads is on record: ``doctor --deep``'s report, and the node tables of ``doctor --nodes`` and
``doctor --ray``.

``--deep`` judges the loader's own binding log (``LD_DEBUG=bindings``); real torch's is 33 MB and needs the slow
lane, so the reports here come from recorded logs (tests/data/binding-logs/: each case the child's answer and
its log files, binding lines in the loader's format, cut to the lines the reader keeps) read by the package's
own reader (``binding_log.judge``), and from ``--deep`` runs of a module that binds nothing (the fast lane's
real loader). The node tables come from node answers: ``doctor --json`` documents that the scenario fixture's
worlds print, as ``srun --label`` collects them, and Ray workers' answers recorded with them (what a worker
says of its own start); each table is printed by the command's own code, in the world's interpreter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import report_host
from support import ROOT
from test_sitepath import SCENARIO_WORLDS
from words import SYSTEM_PATH, normalise, places_of, transcript

sys.path.insert(0, str(ROOT))
from tms_autopreload.commands.doctor.deep import Evidence, judge

LOGS = Path(__file__).resolve().parent / "data" / "binding-logs"


# Where the recorded files lay: each case's paths under it are laid out again under a directory of the test's, as
# empty files (the reader compares files as the loader named them; it reads no byte of them).
RECORDED = "/recorded/"


@pytest.mark.parametrize("case", sorted(p.name for p in LOGS.iterdir()))
def test_what_doctor_deep_says_of_a_recorded_binding_log(case, tmp_path, said):
    """Each recorded case read as ``doctor --deep`` reads a fresh log: its text report, then its ``--json``."""
    here = f"{tmp_path}/"
    meta = json.loads((LOGS / case / "case.json").read_text().replace(RECORDED, here))
    (tmp_path / "log").mkdir()
    for log in (LOGS / case / "log").iterdir():
        (tmp_path / "log" / log.name).write_text(log.read_text().replace(RECORDED, here))
    for path in {meta["hook"], meta["runtime_library"], *meta["answer"]["maps"]}:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).touch()
    ev = Evidence(meta["module"], meta["hook"], meta["runtime_library"], tuple(meta["interposed"]))
    ev.bound_fix = meta["bound_fix"]
    judge(ev, meta["answer"], str(tmp_path / "log"), "libcudart.so.13")
    said_there = f"{ev.text(meta['under'])}\n\n{json.dumps(ev.to_dict(), indent=2)}\n"
    assert normalise(said_there, {"<recorded>": tmp_path}) == said


def test_what_doctor_deep_says_where_the_module_binds_nothing_or_there_is_no_plan(scenario, said):
    """The real loader's log of ``import json`` under the plan (no reference to the hook's symbols), as the plan,
    as this environment is, in dlopen mode; and where no build fits (no driver)."""
    scn = report_host(scenario)
    deep = [str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--deep", "--import", "json"]
    steps = [("tms-autopreload doctor --deep --import json", deep),
             ("tms-autopreload doctor --deep --import json --json", [*deep, "--json"]),
             ("tms-autopreload doctor --deep --import json --as-is", [*deep, "--as-is"]),
             ("tms-autopreload doctor --deep --import json --mode dlopen", [*deep, "--mode", "dlopen"])]
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH})
    no_driver = scenario(**SCENARIO_WORLDS["cu13-sys-no-driver"])
    text += transcript(no_driver.host, [("no driver: tms-autopreload doctor --deep", deep[:-2]),
                                        ("no driver: tms-autopreload doctor --deep --json", [*deep[:-2], "--json"])],
                       {"PATH": SYSTEM_PATH})
    assert normalise(text, places_of(scn)) == said


# The nodes: a world of the scenario fixture each, the name its document gives.
NODES = {"gpu-1": "0.0.9.post1-cu13-sys", "gpu-2": "cu13-pip-only", "gpu-3": "cu13-sys-no-driver",
         "gpu-4": "no-torch-memory-saver"}

# doctor --ray's table and summary from rows of recorded answers (``answers.json``: {name: [ip, node id, answer,
# error, GPUs]}); the versions here are the driving machine's.
RAY_TABLE = r"""
import argparse, json, sys
from tms_autopreload.commands.doctor import command as doctor
from tms_autopreload.commands.doctor import node_table
answers = json.load(open(sys.argv[1]))
rows = [node_table.node_row(name, *row) for name, row in answers.items()]
here = {"tms_autopreload": "0.1.0", "torch_memory_saver": "0.0.10"}
for as_json, all_nodes in ((False, False), (False, True), (True, False)):
    print(f"# --json: {as_json}, --all-nodes: {all_nodes}")
    code = doctor._show_nodes(rows, argparse.Namespace(json=as_json, all_nodes=all_nodes), " (12.5 s)", here)
    print(f"# exit {code}\n")
"""


def test_what_doctor_nodes_and_doctor_ray_say_of_the_nodes_answers(scenario, tmp_path, said):
    """``doctor --nodes`` of the documents four nodes printed (a plan, a pip-only plan, no driver, no
    torch_memory_saver), as ``srun --label`` collects them, with one cut short; and ``doctor --ray``'s table of
    Ray workers' answers: hooked, started unhooked, two runtimes mapped, the package missing, a driver too old,
    a node that did not answer, a CPU-only node."""
    scns = {name: scenario(**SCENARIO_WORLDS[world]) for name, world in NODES.items()}
    docs = {name: _recorded(scn, name) for name, scn in scns.items()}
    # doctor --nodes knows a document that breaks off by how every document begins: its first key.
    assert {next(iter(scn.doctor())) for scn in scns.values()} == {"hostname"}
    labelled = [f"{i}: {line}" for i, doc in enumerate(docs.values())
                for line in json.dumps(doc, indent=2).splitlines()]
    labelled += ["4: {", '4:   "hostname": "gpu-5",']  # a node whose output was cut short
    (tmp_path / "documents").write_text("\n".join(labelled) + "\n")
    ok, pip = docs["gpu-1"], docs["gpu-2"]
    build, library = ok["plan"]["build"], ok["runtime"]["library"]
    versions = {"tms_autopreload": "0.1.0", "torch_memory_saver": "0.0.9.post1"}
    started = {"hooked": True, "mapped": [build], "libcudart": [library]}
    answer = {"python": PYTHON, "versions": versions, "survey": ok, "started": started}
    old_driver = {**ok["driver"], "verdict": "failing", "library_version": "535.104.05",
                  "message": "driver 535.104.05 runs CUDA 12.2 at most; torch needs CUDA 13.0.",
                  "fix": "upgrade the driver to 580 or newer, or install NVIDIA's forward-compatibility package"}
    answers = {
        "hooked": ["10.0.0.1", "a1" * 14, answer, None, 8],
        "pip-only": ["10.0.0.2", "b2" * 14, {**answer, "survey": pip, "started": {**started, "mapped": [
            pip["plan"]["build"]], "libcudart": [pip["runtime"]["library"]]}}, None, 8],
        "unhooked": ["10.0.0.3", "c3" * 14, {**answer, "started": {"hooked": False, "mapped": [], "libcudart": []}},
                     None, 8],
        "two-runtimes": ["10.0.0.4", "d4" * 14, {**answer, "started": {**started, "libcudart": [library, library]}},
                         None, 8],
        "no-package": ["10.0.0.5", "e5" * 14, {"missing": True, "executable": "/opt/job/bin/python",
                                              "prefix": "/opt/job", "python": PYTHON}, None, 8],
        "old-driver": ["10.0.0.6", "f6" * 14, {**answer, "survey": {**ok, "driver": old_driver}}, None, 8],
        "silent": ["10.0.0.7", "a7" * 14, None, "no answer within 60 s", 8],
        "cpu-only": ["10.0.0.8", "b8" * 14, {**answer, "survey": docs["gpu-3"], "started": None}, None, 0],
    }
    (tmp_path / "answers.json").write_text(json.dumps(answers))
    scn = scns["gpu-1"]
    tms = [str(scn.venv.python), "-m", "tms_autopreload", "doctor", "--nodes", str(tmp_path / "documents")]
    steps = [("tms-autopreload doctor --nodes documents", tms),
             ("tms-autopreload doctor --nodes documents --all-nodes --json", [*tms, "--all-nodes", "--json"]),
             ("doctor --ray's table of the recorded answers",
              [str(scn.venv.python), "-c", RAY_TABLE, str(tmp_path / "answers.json")])]
    text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH})
    assert normalise(text, {"<answers>": tmp_path}) == said


def test_what_doctor_nodes_says_of_documents_it_cannot_trust(tmp_path, said, capsys):
    """Documents other nodes wrote, read as they are: one whose words carry a terminal's control characters (an
    escape sequence in its name and its error, a carriage return, a bell), shown as Python writes them, never
    sent to the terminal; one whose ``ok`` is not true or false, one whose plan names no build, one whose plan's
    file is not a path, each that node's row, naming the value; a plan whose node's own doctor says it is not ok
    (its start-up files, an override that splits the runtime, named or not, a reason this version does not
    know), failing with its reason; an error whose first line is empty, shown from its first line with words;
    one that breaks off (its node died while printing it), its row under the name it printed; a node's own
    warning between two documents, skipped; a log line before one node's document, which begins with a time
    (never taken for ``srun --label``'s task number) and, as any output outside the documents of an unlabelled
    stream but the package's own warnings, is a failing row of its own (no node that could not run ``doctor``
    vanishes); and no document at all, which checked nothing."""
    from tms_autopreload.commands.main import main

    hostile = {"hostname": "gpu-1\x1b[2J", "python": PYTHON, "ok": False, "plan": None, "runtime": None,
               "error": "\x1b[31mno plan\x1b[0m\rall fine\x07"}
    wrong = [{"hostname": "gpu-2", "ok": "yes", "error": None, "plan": None, "runtime": None},
             {"hostname": "gpu-3", "ok": True, "error": None, "plan": {"build": 7}, "runtime": {}},
             {"hostname": "gpu-4", "ok": True, "error": None, "plan": {"build": "/b/x.so", "file": 7}, "runtime": {}}]
    plan = {"build": "/opt/v/site-packages/torch_memory_saver_hook_mode_preload_cu13.abi3.so"}
    not_ok = [{"hostname": "gpu-5", "ok": False, "error": None, "plan": plan, "runtime": {}, "start_up": {
                  "cause": "start-up-files", "message": "the start-up file _tms_autopreload_start.py is missing from "
                  "/opt/v/site-packages, where tms-autopreload is installed: flagged starts of /opt/v/bin/python are "
                  "not hooked", "fix": "`env TMS_AUTOPRELOAD_DISABLE=1 /opt/v/bin/python -m pip install "
                  "--force-reinstall tms-autopreload`"}},
              {"hostname": "gpu-6", "ok": False, "error": None, "plan": plan, "runtime": {
                  "kind": "cuda", "major": 12, "torch_version": "2.14.1+cu130", "split": {
                  "torch_library": "libcudart.so.13", "overrides": ["TMS_AUTOPRELOAD_CUDA_MAJOR"], "cause":
                  "split-runtime", "fix": "`unset TMS_AUTOPRELOAD_CUDA_MAJOR`"}}},
              {"hostname": "gpu-7", "ok": False, "error": None, "plan": plan, "runtime": {}},
              {"hostname": "gpu-8", "ok": False, "error": None, "plan": plan, "runtime": {
                  "kind": "cuda", "major": 12, "torch_version": "2.14.1+cu130", "split": {
                  "overrides": "LD_LIBRARY_PATH", "fix": "`unset LD_LIBRARY_PATH`"}}},
              {"hostname": "gpu-9", "ok": False, "error": "\nthe reason, on its second line\x1cand more",
               "plan": None, "runtime": None}]
    said_text = ""
    # A log line before a node's document, its time first: not srun's label, which no such line is.
    logged = f"12:34:56 WARNING something the job printed\n{json.dumps(wrong[0])}\n"
    # A node that died while it printed its document, between two others: its row, under the name it printed.
    died = json.dumps({"hostname": "gpu-10", "python": PYTHON, "ok": True})[:40]
    nodes = [json.dumps(d) for d in [hostile, *wrong, *not_ok]]
    warned = "tms-autopreload: warning: TMS_AUTOPRELOAD_MODE='fast' is not exec or dlopen; using exec"
    for name, text in (("ten nodes", "\n".join([*nodes[:4], died, *nodes[4:6], warned, *nodes[6:]]) + "\n"),
                       ("one node, after a log line", logged), ("no document", "")):
        (tmp_path / name).write_text(text)
        code = main(["doctor", "--nodes", str(tmp_path / name)])
        said_text += f"$ tms-autopreload doctor --nodes <{name}>\n{capsys.readouterr().out}--- exit {code}\n\n"
    assert all(c.isprintable() for line in said_text.split("\n") for c in line), said_text
    assert said_text == said


# The interpreter the recorded nodes run: a version that is no CPython release's, so that no run's own is taken
# for it (the table's columns are as wide as what they hold, before any placeholder).
PYTHON = "3.11.4"


def _recorded(scn, name: str) -> dict:
    """``doctor --json`` of a scenario, as node ``name`` printed it: its paths those of a node (``/opt/<name>/...``),
    its interpreter :data:`PYTHON`. A table's columns and its cut cells are as wide as what they hold: a node's own
    paths keep them the same on every machine that runs this."""
    places = {f"/opt/{name}/{placeholder.strip('<>')}": path for placeholder, path in places_of(scn).items()}
    doc = json.loads(normalise(json.dumps(scn.doctor()), places))
    return {**doc, "hostname": name, "python": PYTHON}


# A Ray that answers as a cluster would, from recorded answers (``TMS_TEST_RAY_ANSWERS``: its nodes, its GCS
# address, and each node's answer, or the failure of its task): what ``doctor --ray``'s driver asks of Ray, and
# nothing more. Real Ray clusters: tests/test_preflight.py and tests/test_ray.py, in the slow lane.
RAY_STANDIN = {
    "ray/__init__.py": '''
import json, os, time
_recorded = json.load(open(os.environ["TMS_TEST_RAY_ANSWERS"]))


def init(**kw):
    pass


def nodes():
    return _recorded["nodes"]


class _Context:
    gcs_address = _recorded["gcs"]


def get_runtime_context():
    return _Context()


class _Task:
    def options(self, **kw):
        self.node = kw["scheduling_strategy"].node_id
        return self

    def remote(self, *args):
        return self.node


def remote(function):
    return _Task()


def wait(refs, num_returns=1, timeout=None):
    done = [ref for ref in refs if ref in _recorded["answers"]][:num_returns]
    if not done:
        time.sleep(timeout or 0)
    return done, [ref for ref in refs if ref not in done]


def get(ref):
    answer = _recorded["answers"][ref]
    if isinstance(answer, str):
        raise RuntimeError(answer)
    return answer


def cancel(ref, force=False):
    pass


def shutdown():
    pass
''',
    "ray/util/__init__.py": "",
    "ray/util/scheduling_strategies.py": "class NodeAffinitySchedulingStrategy:\n"
                                         "    def __init__(self, node_id, soft):\n        self.node_id = node_id\n",
    "ray/runtime_env.py": "class RuntimeEnv(dict):\n    pass\n",
}


def _ray_standin(root: Path, nodes: dict, answers: dict, gcs: str) -> dict[str, str]:
    """The stand-in under ``root``, and the variables that make a ``doctor --ray`` use it."""
    for name, text in RAY_STANDIN.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    recorded = {"nodes": [{"NodeID": node_id, "Alive": True, "NodeName": name, "NodeManagerAddress": ip,
                           "Resources": {"GPU": gpus}} for name, (ip, node_id, gpus) in nodes.items()],
                "gcs": gcs, "answers": answers}
    (root / "answers.json").write_text(json.dumps(recorded))
    return {"PYTHONPATH": str(root), "TMS_TEST_RAY_ANSWERS": str(root / "answers.json")}


def test_what_doctor_ray_says_of_a_clusters_answers(scenario, tmp_path, said):
    """``doctor --ray`` end to end, its driver and its table, against a Ray that answers from recorded answers: a
    hooked node, one without the package, one whose task failed, a CPU-only node; text, ``--json``, and
    ``--all-nodes``."""
    import socket

    scn = report_host(scenario)
    ok = _recorded(scn, "gpu-1")
    versions = {"tms_autopreload": "0.1.0", "torch_memory_saver": "0.0.9.post1"}
    started = {"hooked": True, "mapped": [ok["plan"]["build"]], "libcudart": [ok["runtime"]["library"]]}
    cpu = _recorded(scenario(**SCENARIO_WORLDS["cu13-sys-no-driver"]), "cpu-1")
    nodes = {"gpu-1": ("10.0.0.1", "a1" * 14, 8), "gpu-2": ("10.0.0.2", "b2" * 14, 8),
             "gpu-3": ("10.0.0.3", "c3" * 14, 8), "cpu-1": ("10.0.0.4", "d4" * 14, 0)}
    answers = {"a1" * 14: {"python": PYTHON, "versions": versions, "survey": ok, "started": started},
               "b2" * 14: {"missing": True, "executable": "/opt/gpu-2/venv/bin/python", "prefix": "/opt/gpu-2/venv",
                           "python": PYTHON},
               "c3" * 14: "ray.exceptions.WorkerCrashedError: The worker died unexpectedly",
               "d4" * 14: {"python": PYTHON, "versions": versions, "survey": cpu, "started": None}}
    with socket.socket() as gcs:  # the head's GCS, which answers throughout
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        env = _ray_standin(tmp_path, nodes, answers, f"127.0.0.1:{gcs.getsockname()[1]}")
        ray = ["env", *(f"{k}={v}" for k, v in env.items()), str(scn.venv.python), "-m", "tms_autopreload", "doctor",
               "--ray"]
        steps = [("tms-autopreload doctor --ray", ray),
                 ("tms-autopreload doctor --ray --all-nodes", [*ray, "--all-nodes"]),
                 ("tms-autopreload doctor --ray --json", [*ray, "--json"])]
        text = transcript(scn.host, steps, {"PATH": SYSTEM_PATH})
    assert normalise(text, {**places_of(scn), "<ray-standin>": tmp_path}) == said


@pytest.mark.slow
def test_what_doctor_ray_says_where_the_cluster_stops_answering(scenario, tmp_path, said):
    """The stand-in Ray answers ``ray.init`` and lists a node, whose worker never answers, and its GCS stops
    answering: the preflight says the cluster was lost, within ``--timeout``."""
    scn = report_host(scenario)
    env = _ray_standin(tmp_path, {"gpu-1": ("10.0.0.1", "a1" * 14, 8)}, {}, "127.0.0.1:9")
    ray = ["env", *(f"{k}={v}" for k, v in env.items()), str(scn.venv.python), "-m", "tms_autopreload", "doctor",
           "--ray", "--timeout", "3"]
    probe = ["env", *(f"{k}={v}" for k, v in env.items()), str(scn.venv.python), "-c",
             "from tms_autopreload.commands.doctor import ray_cluster\ntry:\n    ray_cluster.run('auto', None, 3.0)\n"
             "except ray_cluster.Error as exc:\n    print(f'cause: {exc.cause}')"]
    text = transcript(scn.host, [("tms-autopreload doctor --ray --timeout 3", ray), ("its cause", probe)],
                      {"PATH": SYSTEM_PATH})
    assert normalise(text, {**places_of(scn), "<ray-standin>": tmp_path}) == said
