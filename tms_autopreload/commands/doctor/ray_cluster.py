"""``tms-autopreload doctor --ray``: ask every node of a Ray cluster, in a real worker, before a job starts.

Each node decides for itself at start (that is the point), so a node without a plan is found only when
a job's worker dies there, minutes in. The preflight runs one task pinned to each alive node
(``NodeAffinitySchedulingStrategy(soft=False)``) in a worker started the way the job's workers start:
with the flag and the job's ``runtime_env``. ``TMS_AUTOPRELOAD_ON_ERROR=warn`` keeps a worker with no
plan alive, so that it can report the error the job would have died with.

The task is shipped by value (compiled from :data:`PROBE_SOURCE`, a module Ray cannot import by name),
so it also runs on a node whose environment lacks this package, and says so: there the flag does
nothing. Where the package is installed, it returns :func:`node_answer` (the ``doctor --json``
document and what the start-up hook really did). Rows and the table are :mod:`.node_table`,
shared with ``doctor --nodes``.

This module is the command's side, and the node's (:func:`node_answer`, which nodes of every
version import by this path). Ray runs in a child process, :mod:`tms_autopreload.commands.doctor.ray_driver`, whose
events :func:`run` reads; Ray is imported only there, it is not a dependency of the package.
"""

import json
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time

from ...environment import (FLAG_VARS, GENERIC_FLAG, MODE_VAR, ON_ERROR_VAR, mapped_hooks, mapped_objects, reexecuted,
                           state_build)
from ...errors import CAUSE_CLUSTER_LOST, CAUSE_NO_CLUSTER, CAUSE_NO_RAY, CAUSE_RAY_TOKEN, CAUSE_USAGE, Error

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable

__all__ = ["run", "node_answer", "check_address", "check_runtime_env", "worker_runtime_env", "port_answers",
           "PROBE_SOURCE", "NoRay", "Unreachable", "UsageError"]


class NoRay(Error, RuntimeError):
    """Ray is not installed for this interpreter; the message says what to install."""

    cause = CAUSE_NO_RAY


class Unreachable(Error, RuntimeError):
    """No Ray cluster answers at the address: ``cause`` "no-cluster" when none ever did, "cluster-lost"
    when it stopped answering during the preflight (a head that died), "ray-token" when Ray's token
    authentication stopped the connection (:func:`_refused`); the message says where and why."""

    cause = CAUSE_NO_CLUSTER


class UsageError(Error, ValueError):
    """An option the preflight refuses before connecting (a ValueError too, as it was before the base)."""

    cause = CAUSE_USAGE


# What ray.init does with these: start a new, empty cluster on this machine (Ray's "local"; "" is
# refused too), which the preflight would then report as if it were the user's.
_NEW_CLUSTER = ("local", "")


def check_address(address: str, environ: "dict[str, str] | None" = None) -> None:
    """Raise UsageError unless ``address`` names an existing cluster: ``auto`` (with RAY_ADDRESS, if
    set, naming one), ``HOST:PORT`` or ``ray://HOST:PORT``."""
    env = os.environ if environ is None else environ
    effective, via = address, "--address"
    if address == "auto" and env.get("RAY_ADDRESS"):
        effective, via = env["RAY_ADDRESS"], "RAY_ADDRESS"
    if effective.strip().lower() in _NEW_CLUSTER:
        raise UsageError(f"{via}={effective!r} would start a new, empty Ray cluster on this machine and check that "
                         f"one, not yours", fix="give the running cluster's address (HOST:PORT, as `ray start "
                         "--head` printed it) or auto")
    if effective == "auto":
        return
    rest = effective[len("ray://"):] if effective.startswith("ray://") else effective
    host, sep, port = rest.rpartition(":")
    if "://" in rest or not sep or not host or not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
        raise UsageError(f"{via}={effective!r} is not a Ray cluster address", fix="give HOST:PORT (the head's GCS "
                         "address, as `ray start --head` printed it), ray://HOST:PORT, or auto")


def check_runtime_env(text: "str | None") -> "dict[str, Any] | None":
    """The job's runtime_env from ``--runtime-env`` JSON, checked as Ray would check it, before connecting."""
    if text is None:
        return None
    try:
        env = json.loads(text)
    except ValueError as exc:
        raise UsageError(f"--runtime-env is not JSON ({exc})") from None
    if not isinstance(env, dict):
        raise UsageError(f"--runtime-env must be a JSON object (a runtime_env), not {type(env).__name__}")
    env_vars = env.get("env_vars")
    if env_vars is not None:
        if not isinstance(env_vars, dict):
            raise UsageError(f"--runtime-env: env_vars must be an object of names to strings, not "
                             f"{type(env_vars).__name__} ({json.dumps(env_vars)[:60]})")
        bad = [f"{k}={json.dumps(v)[:40]}" for k, v in env_vars.items() if not isinstance(v, str)]
        if bad:
            raise UsageError(f"--runtime-env: every env_vars value must be a string (Ray refuses others): "
                             f"{', '.join(bad)}", fix='quote them, e.g. "1"')
        empty = [k for k in env_vars if not k or "=" in k or "\0" in k]
        if empty:
            raise UsageError(f"--runtime-env: env_vars names cannot be empty or hold '=': {empty!r}")
    return env


def worker_runtime_env(job_runtime_env: "dict[str, Any] | None") -> "dict[str, Any]":
    """The job's runtime_env, with the flag (unless it sets one) and ON_ERROR=warn in its env_vars."""
    env = dict(job_runtime_env or {})
    env_vars = dict(env.get("env_vars") or {})
    if not any(env_vars.get(name) for name in FLAG_VARS):
        env_vars[GENERIC_FLAG] = "1"
    env_vars[ON_ERROR_VAR] = "warn"
    env["env_vars"] = env_vars
    return env


# The task each node runs, given the distributions to report (doctor.VERSIONED). Only the standard library,
# so that it runs where this package is missing.
PROBE_SOURCE = '''
def probe(names):
    import os, sys
    from importlib import metadata

    def version(name):
        try:
            return metadata.version(name.replace("_", "-"))
        except Exception:
            return None

    answer = {"hostname": os.uname().nodename, "pid": os.getpid(), "python": sys.version.split()[0],
              "executable": sys.executable, "prefix": sys.prefix,
              "versions": {name: version(name) for name in names}}
    try:
        from tms_autopreload.commands.preflight import node_answer  # the name nodes of every version have
    except ModuleNotFoundError as exc:
        if exc.name != "tms_autopreload":
            raise
        answer["missing"] = str(exc)
        return answer
    except ImportError as exc:
        answer["error"] = (f"the tms_autopreload installed there cannot answer this preflight ({exc}): "
                           f"install the same version as here")
        return answer
    answer.update(node_answer())
    return answer
'''


def node_answer() -> "dict[str, Any]":
    """Runs in the worker: its survey (the ``doctor --json`` document) and what its start-up hook did."""
    from ..caller_env import before_plan
    from .document import document
    from ...decision import survey
    from ...gpu_libraries import runtime_of

    hooks = mapped_hooks(state_build())
    runtimes = [path for path in mapped_objects() if runtime_of(os.path.basename(path))]
    execs = int(reexecuted())
    env = before_plan()  # the worker is hooked: its survey answers for the environment it was started with
    doc = document(survey(env, check_all=True), env)
    planned = doc["plan"]["build"] if doc["plan"] else None
    return {"mode": os.environ.get(MODE_VAR) or "exec",
            "started": {"hooked": bool(hooks) and hooks == [planned], "mapped": hooks, "libcudart": runtimes,
                        "execs": execs},
            "survey": doc}


def port_answers(address: str, timeout: float = 3.0) -> bool:
    """Whether something accepts a TCP connection at HOST:PORT (a Ray GCS or client server)."""
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


# Where a Ray process finds the token it sends (Ray 2.60, each tried: RAY_AUTH_TOKEN is read first, then the
# file RAY_AUTH_TOKEN_PATH names, then ~/.ray/auth_token), and where a cluster's own is.
_TOKEN_PLACES = ("the cluster's token (on its head: `ray get-auth-token`, or the file ~/.ray/auth_token of the user "
                 "who started it) in RAY_AUTH_TOKEN, in a file named by RAY_AUTH_TOKEN_PATH, or in ~/.ray/auth_token")
_TOKEN_MODE_FIX = f"`export RAY_AUTH_MODE=token`, with {_TOKEN_PLACES}"


def _times(n: int) -> str:
    return f"{n} time{'s' if n > 1 else ''}"


def _ray_said(log: str) -> str:
    """Ray's own stderr, summarised in a clause: its connection warnings counted, never printed.

    Matched by their wording, for want of a fact (checked with ray==2.58.0): against a port that
    accepts connections but is no GCS, ``ray.init`` retries past 170 s printing ``Failed to connect
    to GCS at address ... within 5 seconds``; no exception reaches Python, the TCP probe
    (:func:`port_answers`) answers, and when Ray's core worker ends the driver it exits 1 as a Python
    traceback does. Whether the cluster ever answered is not decided here: the driver's ``connected``
    event says that. Against a cluster with token authentication that refuses what this process sends,
    ``ray.init`` retries for about 20 s printing ``Failed to get cluster ID from GCS server:
    Unauthenticated: ...`` (ray==2.60.0) before it raises, and the driver then says so from Ray's facts
    (the ``refused`` event); a ``--timeout`` that ends it sooner leaves only these lines, counted here with
    the likely cause, as words and not as a fact.
    """
    lines = [line for line in log.splitlines() if line.strip()]
    refused = [line for line in lines if "Unauthenticated" in line]
    if refused:
        return (f"; Ray: `Unauthenticated` {_times(len(refused))}: the cluster wants a token and refused what this "
                f"process sent. If RAY_AUTH_MODE is not `token` here: {_TOKEN_MODE_FIX}")
    gcs = [line for line in lines if "Failed to connect to GCS" in line]
    if gcs:
        return f"; Ray: `Failed to connect to GCS ...` {_times(len(gcs))}"
    return ""


def _refused(address: str, event: "dict[str, Any]") -> Unreachable:
    """The error of the driver's ``refused`` event (ray_driver._refusal): Ray's token authentication stopped
    the connection. Which of three it was, and so the fix, follows from the event's facts: this process
    was not in token mode (the cluster wants a token, none was sent); it was, and found no token to send
    (Ray refused before connecting); or it sent one the cluster refused (another cluster's, or an old one).
    """
    said = f"(Ray: {event['why']})"
    if not event["token_mode"]:
        return Unreachable(f"the Ray cluster at {address} refused this connection: it wants a token (Ray's token "
                           f"authentication), and RAY_AUTH_MODE is not `token` here, so none was sent {said}",
                           fix=_TOKEN_MODE_FIX, cause=CAUSE_RAY_TOKEN)
    if not event["has_token"]:
        return Unreachable(f"RAY_AUTH_MODE is `token` here, but Ray found no token to send the Ray cluster at "
                           f"{address} {said}", fix=f"put {_TOKEN_PLACES}; or, for a cluster without token "
                           "authentication, unset RAY_AUTH_MODE", cause=CAUSE_RAY_TOKEN)
    return Unreachable(f"the Ray cluster at {address} refused the token this process sent: it is not the cluster's "
                       f"{said}", fix=f"put {_TOKEN_PLACES} (the first of these that is set is the one sent)",
                       cause=CAUSE_RAY_TOKEN)


def _no_ray() -> "NoRay":
    from ...installer import pip_command

    return NoRay(f"Ray is not installed for {sys.executable}", fix=pip_command("install", "ray"))


def run(address: str, job_runtime_env: "dict[str, Any] | None", timeout: float,
        progress: "Callable[[int, int], None] | None" = None) -> "list[dict[str, Any]]":
    """One row per alive node (:func:`.node_table.node_row`), within ``timeout`` seconds in all.

    Raises NoRay, or Unreachable when nothing answers at ``address`` or the cluster stops answering
    before every node did (a head that died)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise _no_ray()
    start = time.time()
    if address != "auto" and not address.startswith("ray://") and not port_answers(address, min(5.0, timeout)):
        raise Unreachable(f"cannot reach the Ray cluster at {address}: nothing accepts connections there "
                          f"(no head started, a wrong port, or the head died)")
    # Leave the child time to cancel, report and disconnect before the deadline.
    request = {"address": address, "runtime_env": job_runtime_env, "timeout": timeout,
               "deadline": start + max(timeout - min(5.0, timeout / 4), timeout / 2),
               "gcs_check": None if address == "auto" or address.startswith("ray://") else address}
    with tempfile.TemporaryFile() as log:
        # The driver is a process of this command, which is never hooked (a flag in the caller's shell
        # would hook it, or stop it on a CPU-only head): the workers get the flag from their runtime_env.
        unflagged = {k: v for k, v in os.environ.items() if k not in FLAG_VARS}
        driver = "from tms_autopreload.commands.doctor.ray_driver import main; main()"
        child = subprocess.Popen([sys.executable, "-c", driver],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, env=unflagged,
                                 start_new_session=True)
        ended = False
        try:
            events, ended = _events(child, json.dumps(request), start + timeout, progress)
        finally:
            if ended:  # its stdout closed as it exited, a moment before its exit can be waited for
                try:
                    child.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass
            exited = child.poll() is not None
            if not exited:
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            log.seek(0)
            stderr = log.read().decode("utf-8", "replace")
            said = _ray_said(stderr)
    kinds = {e["event"]: e for e in events}
    if "noray" in kinds:
        raise _no_ray()
    if "badenv" in kinds:
        raise UsageError(f"--runtime-env: Ray refuses it: {kinds['badenv']['why']}")
    if "rows" in kinds:
        rows: "list[dict[str, Any]]" = kinds["rows"]["rows"]  # the driver's JSON (ray_driver.main)
        return rows
    if "refused" in kinds:
        raise _refused(address, kinds["refused"])
    if "unreachable" in kinds:
        raise Unreachable(f"cannot reach the Ray cluster at {address}: {kinds['unreachable']['why']}{said}")
    if "connected" in kinds:  # ray.init returned: the cluster answered once
        raise Unreachable(f"cannot reach the Ray cluster at {address}: it stopped answering during the preflight "
                          f"(the head node died, or its network went away){said}", cause=CAUSE_CLUSTER_LOST)
    if exited and not said:
        last = [line.strip() for line in stderr.splitlines() if line.strip()][-1:] or [f"exit {child.returncode}"]
        raise Unreachable(f"cannot reach the Ray cluster at {address}: Ray's client ended: {last[0]}")
    raise Unreachable(f"cannot reach the Ray cluster at {address}: no answer within {timeout:g} s{said}")


def _events(child: "subprocess.Popen[bytes]", request: str, deadline: float,
            progress: "Callable[[int, int], None] | None") -> "tuple[list[dict[str, Any]], bool]":
    """The child's events until it is done, it exits, or the deadline passes; and whether its stdout ended."""
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write(request.encode())
    child.stdin.close()
    events: "list[dict[str, Any]]" = []
    buffer = b""
    fd = child.stdout.fileno()
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, min(1.0, deadline - time.time())))
        if not ready:
            continue
        chunk = os.read(fd, 65536)
        if not chunk:
            return events, True
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # not ours: something printed on the child's stdout
            events.append(event)
            if event["event"] == "progress" and progress is not None:
                progress(event["answered"], event["total"])
            if event["event"] in ("done", "noray", "badenv", "unreachable", "refused", "lost"):
                return events, False
    return events, False
