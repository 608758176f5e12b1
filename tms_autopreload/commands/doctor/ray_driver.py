"""The Ray driver of ``doctor --ray``: a child process that connects, probes every node, and reports.

:func:`.ray_cluster.run` starts it (``python -c "from tms_autopreload.commands.doctor.ray_driver import main;
main()"``) rather than talking to Ray itself: a driver whose cluster vanishes can hang in Ray
or be ended by Ray's core worker, and Ray's C++ side prints its connection retries on fd 2. So the
parent keeps this child's stderr off the terminal and ends it at the deadline.

The request is one JSON object on stdin (address, runtime_env, timeout, deadline, gcs_check); the
answer is JSON lines on stdout, one event each: ``noray``, ``badenv`` and ``unreachable`` (each with
``why``) end it before connecting, and so does ``refused`` (:func:`_refusal`: Ray's token authentication
stopped it); then ``connected``, ``progress`` per node answered, ``rows`` and ``done``; or ``lost`` when
the cluster's GCS stops accepting connections while nodes are awaited.

Ray is imported only here; it is not a dependency of the package.
"""

import json
import sys
import time

from .document import VERSIONED
from .ray_cluster import PROBE_SOURCE, port_answers, worker_runtime_env
from .node_table import node_row

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["main"]

# Seconds between checks that the cluster's GCS still accepts connections while nodes are awaited.
_LIVENESS_EVERY = 5.0


def _emit(event: "dict[str, Any]") -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _last_line(exc: BaseException) -> str:
    """The last non-empty line of an exception's message (Ray puts the reason last, after its
    context), or the exception's type when it has no message."""
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(exc).__name__


def _shipped_probe() -> "Callable[[tuple[str, ...]], dict[str, Any]]":
    """:data:`~tms_autopreload.commands.doctor.ray_cluster.PROBE_SOURCE` as a function of a module no node can import,
    so Ray pickles it by value."""
    namespace: "dict[str, Any]" = {"__name__": "tms_autopreload_probe"}
    exec(compile(PROBE_SOURCE, "<tms_autopreload preflight probe>", "exec"), namespace)
    probe: "Callable[[tuple[str, ...]], dict[str, Any]]" = namespace["probe"]
    return probe


def _refusal(exc: BaseException, gcs: "str | None") -> "dict[str, Any] | None":
    """The ``refused`` event when Ray's token authentication (Ray 2.52 and later) is why ``ray.init`` raised
    ``exc``, else None; ``gcs``: the cluster's GCS address, where the command was given one.

    Facts, each Ray's own: ``ray.init`` raises ``AuthenticationError`` itself when this process is in token
    mode and finds no token to send. When the cluster refuses what this process sent (no token, without
    ``RAY_AUTH_MODE=token``; or another token) it retries for about 20 s and raises a ``ConnectionError``
    that names only the address, so the GCS is asked once more here the way ``ray status`` asks it
    (``ray._raylet.GcsClient``), which raises ``AuthenticationError`` at once when the GCS refuses this
    process. Not with a token mode and no token: there Ray 2.60's GcsClient aborts the process, where
    ``ray.init`` raised first. The event carries Ray's message and whether this process is in token mode
    and has a token (``AuthenticationTokenLoader``, as Ray's CLI asks it), which decide the fix.
    """
    try:
        from ray._raylet import AuthenticationMode, AuthenticationTokenLoader, GcsClient, get_authentication_mode
        from ray.exceptions import AuthenticationError
    except ImportError:  # a Ray before token authentication
        return None
    token_mode = get_authentication_mode() == AuthenticationMode.TOKEN
    try:
        has_token = bool(AuthenticationTokenLoader.instance().has_token(ignore_auth_mode=True))
    except AuthenticationError:  # RAY_AUTH_TOKEN_PATH names a file that cannot be read
        has_token = False
    refusal = exc if isinstance(exc, AuthenticationError) else None
    if refusal is None and gcs is not None and (has_token or not token_mode) and port_answers(gcs, 2.0):
        try:
            GcsClient(address=gcs)
        except AuthenticationError as refused:
            refusal = refused
        except Exception:  # noqa: BLE001 - any other failure is not an answer about authentication
            pass
    if refusal is None:
        return None
    return {"event": "refused", "why": refusal.message, "token_mode": token_mode, "has_token": has_token}


def main() -> None:
    """Connect, probe every alive node, and emit JSON lines: connected, progress, rows."""
    request = json.loads(sys.stdin.read())
    try:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
    except ImportError:
        _emit({"event": "noray"})
        return
    try:
        from ray.runtime_env import RuntimeEnv

        RuntimeEnv(**worker_runtime_env(request["runtime_env"]))  # Ray's own checks of every field, offline
    except Exception as exc:  # noqa: BLE001 - Ray raises TypeError, ValueError, its own kinds
        _emit({"event": "badenv", "why": _last_line(exc)})
        return
    try:
        ray.init(address=request["address"], log_to_driver=False, logging_level="ERROR")
    except Exception as exc:  # noqa: BLE001 - Ray raises several kinds for "no cluster there"
        _emit(_refusal(exc, request["gcs_check"]) or {"event": "unreachable", "why": _last_line(exc)})
        return
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    _emit({"event": "connected", "gcs": ray.get_runtime_context().gcs_address, "nodes": len(nodes)})
    task = ray.remote(_shipped_probe())
    runtime_env = worker_runtime_env(request["runtime_env"])
    pending = {task.options(num_cpus=0, max_retries=0, runtime_env=runtime_env,
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=n["NodeID"], soft=False))
               .remote(VERSIONED): n for n in nodes}
    answers: "dict[str, tuple[dict | None, str | None]]" = {}
    deadline = request["deadline"]
    gcs = request["gcs_check"] or ray.get_runtime_context().gcs_address
    next_check = time.time() + _LIVENESS_EVERY
    while pending and time.time() < deadline:
        if time.time() >= next_check:  # a head that died is said at once, not at the deadline
            if not port_answers(gcs, 2.0):
                _emit({"event": "lost"})
                return
            next_check = time.time() + _LIVENESS_EVERY
        done, _ = ray.wait(list(pending), num_returns=1, timeout=max(0.0, min(1.0, deadline - time.time())))
        for ref in done:
            node = pending.pop(ref)
            try:
                answers[node["NodeID"]] = (ray.get(ref), None)
            except Exception as exc:  # noqa: BLE001 - the task's own failure is that node's answer
                answers[node["NodeID"]] = (None, f"the task failed on that node: {_last_line(exc)}")
            _emit({"event": "progress", "answered": len(answers), "total": len(nodes)})
    for node in pending.values():
        answers[node["NodeID"]] = (None, f"no answer within {request['timeout']:g} s: its worker did not start "
                                         f"(or is still starting) with this runtime_env")
    if pending and not port_answers(gcs):
        _emit({"event": "lost"})
        return
    rows = [node_row(n.get("NodeName") or n.get("NodeManagerHostname"), n.get("NodeManagerAddress"), n["NodeID"],
                     *answers[n["NodeID"]], gpus=(n.get("Resources") or {}).get("GPU", 0)) for n in nodes]
    _emit({"event": "rows", "rows": rows})
    for ref in pending:
        ray.cancel(ref, force=True)
    ray.shutdown()
    _emit({"event": "done"})
