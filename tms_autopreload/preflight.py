"""``tms-autopreload doctor --ray``: ask every node of a Ray cluster, in a real worker, before a job starts.

The rows and the table are shared with ``doctor --nodes``, which reads the ``doctor --json``
documents another launcher (Slurm's ``srun``) collected from every node (:func:`document_rows`).

Each node decides for itself at start (that is the point), so a node without a plan is found only when
a job's worker dies there, minutes in. The preflight runs one task pinned to each alive node
(``NodeAffinitySchedulingStrategy(soft=False)``) in a worker started the way the job's workers start:
with the flag and the job's ``runtime_env``. ``TMS_AUTOPRELOAD_ON_ERROR=warn`` keeps a worker with no
plan alive, so that it can report the error the job would have died with. Each task returns its
worker's survey (the ``doctor --json`` document) and what really happened at its start.

Ray is imported only here; it is not a dependency of the package.
"""

import os
import sys
import time

from . import FLAG_VARS, GENERIC_FLAG, MODE_VAR, ON_ERROR_VAR, mapped_hooks, mapped_objects

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["probe", "run", "worker_runtime_env", "node_row", "document_answer", "document_rows", "NoRay", "Unreachable"]


class NoRay(RuntimeError):
    """Ray is not installed for this interpreter; the message says what to install."""


class Unreachable(RuntimeError):
    """No Ray cluster answers at the address; the message says where and Ray's own reason."""


def worker_runtime_env(job_runtime_env: "dict[str, Any] | None") -> "dict[str, Any]":
    """The job's runtime_env, with the flag (unless it sets one) and ON_ERROR=warn in its env_vars."""
    env = dict(job_runtime_env or {})
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    if not any(env_vars.get(name) for name in FLAG_VARS):
        env_vars[GENERIC_FLAG] = "1"
    env_vars[ON_ERROR_VAR] = "warn"
    env["env_vars"] = env_vars
    return env


def probe() -> "dict[str, Any]":
    """Runs in the worker: its survey, and what its start-up hook did (hooked, build, runtimes, execs)."""
    import socket

    from .cli import doctor_document
    from .plan import survey
    from .sonames import runtime_of

    hooks = mapped_hooks()
    runtimes = [path for path in mapped_objects() if runtime_of(os.path.basename(path))]
    try:
        with open("/proc/self/environ", "rb") as f:
            initial = f.read().split(b"\0")
    except OSError:
        initial = []
    execs = int(f"TMS_AUTOPRELOAD_EXEC_PID={os.getpid()}".encode() in initial)
    report = survey(check_all=True)
    planned = report.plan.build if report.plan else None
    return {
        "hostname": socket.gethostname(), "pid": os.getpid(), "python": sys.version.split()[0],
        "executable": sys.executable, "prefix": sys.prefix, "mode": os.environ.get(MODE_VAR) or "exec",
        "started": {"hooked": bool(hooks) and hooks == [planned], "mapped": hooks, "libcudart": runtimes,
                    "execs": execs},
        "survey": doctor_document(report),
    }


def node_row(name: "str | None", ip: "str | None", node_id: "str | None", answer: "dict[str, Any] | None",
             error: "str | None") -> "dict[str, Any]":
    """One node's row of the preflight: ok, and the error to show.

    ``answer`` is what the node said: a Ray worker's :func:`probe` (its survey, and what its start-up
    hook did), or :func:`document_answer` of a plain ``doctor --json`` document, which says what the
    hook will do there. None when the node did not answer (``error`` says why).
    """
    row = {"node_id": node_id, "ip": ip, "name": name, "ok": False, "answer": answer, "error": error}
    if answer is not None:
        started, doc = answer.get("started"), answer["survey"]
        row["ok"] = doc["ok"] if started is None else started["hooked"] and len(started["libcudart"]) <= 1
        if doc["error"] and not row["error"]:
            row["error"] = doc["error"]
        elif not row["ok"] and not row["error"]:
            row["error"] = ("its doctor found no plan" if started is None else
                            f"the worker started unhooked (mapped: {started['mapped'] or 'none'}, "
                            f"{len(started['libcudart'])} libcudart)")
    return row


def document_answer(doc: "dict[str, Any]") -> "dict[str, Any]":
    """A node's plain ``doctor --json`` document in the shape of a worker's answer (no start facts)."""
    return {"hostname": doc.get("hostname"), "python": doc.get("python"), "survey": doc}


def document_rows(text: str) -> "list[dict[str, Any]]":
    """One row per ``doctor --json`` document in ``text`` (many nodes' output, :mod:`.nodes` reads it)."""
    from .nodes import read_documents

    rows = []
    for entry in read_documents(text):
        doc = entry.document
        name = (doc or {}).get("hostname") or (f"task {entry.task}" if entry.task is not None else None)
        rows.append(node_row(name, None, None, None if doc is None else document_answer(doc), entry.error))
    return rows


def _row(node: "dict[str, Any]", answer: "dict[str, Any] | None", error: "str | None") -> "dict[str, Any]":
    return node_row(node.get("NodeName") or node.get("NodeManagerHostname"), node.get("NodeManagerAddress"),
                    node["NodeID"], answer, error)


def run(address: str, job_runtime_env: "dict[str, Any] | None", timeout: float,
        progress: "Any" = None) -> "list[dict[str, Any]]":
    """One row per alive node: its answer, or why there is none. ``progress(answered, total)`` while waiting."""
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        raise NoRay(f"Ray is not installed for {sys.executable}: pip install ray") from None

    try:
        ray.init(address=address, log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds for "no cluster there"
        raise Unreachable(f"cannot reach the Ray cluster at {address}: {_first_line(exc)}") from None
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        task = ray.remote(probe)
        runtime_env = worker_runtime_env(job_runtime_env)
        pending = {task.options(num_cpus=0, max_retries=0, runtime_env=runtime_env,
                                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
                   .remote(): n for n in nodes}
        answers: "dict[str, tuple[dict | None, str | None]]" = {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in done:
                node = pending.pop(ref)
                try:
                    answers[node["NodeID"]] = (ray.get(ref), None)
                except Exception as exc:  # noqa: BLE001 - the task's own failure is that node's answer
                    answers[node["NodeID"]] = (None, f"the task failed on that node: {_first_line(exc)}")
            if progress is not None:
                progress(len(answers), len(nodes))
        for ref, node in pending.items():
            answers[node["NodeID"]] = (None, f"no answer within {timeout:g} s: its worker did not start (or is "
                                             f"still starting) with this runtime_env")
            ray.cancel(ref, force=True)
        return [_row(n, *answers[n["NodeID"]]) for n in nodes]
    finally:
        ray.shutdown()


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__
