"""Build the hosts the tests mean: real wheels, real venvs, real loader, a private ld.so.cache.

A *host* is what the dynamic loader can see: we write an ``ld.so.conf`` naming exactly the
directories we want, build a cache from it with ``ldconfig -C``, and run every process of
the scenario inside a private mount namespace (``unshare -m``) with that cache bind-mounted
over ``/etc/ld.so.cache``. The machine's own CUDA (if any) is then invisible, whatever the
machine has. Stand-ins exist only for what cannot be real here: the driver (``libcuda.so.1``),
torch builds without a wheel for this machine (CUDA 12, ROCm, CPU) and ROCm itself; and, for
``scripts/gpu-check.sh`` only, torch_memory_saver's ``test/examples/``, which its sdist leaves out and
the check takes from the user (:func:`write_examples_standin`: empty modules, enough to collect).

Where the torch stand-in (``tools/standins.py``: ``torch/version.py`` and
``torch/lib/libtorch_global_deps.so`` only; ``import torch`` raises) is used, and nowhere else:

* every venv made by the ``scenario`` fixture with ``torch=...`` (conftest.py): test_cli, test_guarantees,
  test_hook, test_inputs, test_packaging, test_resolver, and in test_inprocess and test_launchers the
  tests that take ``scenario`` (the toy-hook bindings, embedding, ``configure_subprocess()``'s contract,
  ``kernel`` without Jupyter);
* the Ray cluster's node venvs in test_ray (torch 2.14.1 has no CUDA 12 build for this machine);
* ``tools/demo.py`` without ``--real-torch`` and ``tools/bench.py``'s P1-P3.

Real torch 2.14.1 (the ``real_torch`` fixture) is what test_real_torch, test_launchers' SGLang,
torchrun and Jupyter tests, test_inprocess's ``activate()`` tests and test_runpath_model's
``configure_subprocess()`` parents import; test_peer_suite runs torch_memory_saver's own tests with it.
"""

from __future__ import annotations

import ast
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))

from basics import CACHE, cache_lock, clean_env, file_lock, run  # noqa: E402,F401
from downloads import RUNTIME_WHEELS, extract, runtime_wheel, wheel  # noqa: E402,F401
from sandbox import (BELOW_FLOOR, RAY_VERSION, RAY_VERSIONS, TORCH_VERSION, TORCH_VERSIONS, Venv,  # noqa: E402,F401
                     base_python, build_own_wheel, check_namespaces, ensurepip_venv, find_python, ld_cache,
                     locate_python, private_copy, python_for_every_account, ray_jobs_venv, ray_venv, repoint_scripts,
                     revision_source, tms_wheel, torch_venv, unshare_mounts, uv)
from basics import SetupError  # noqa: E402
from standins import cc, driver_stub, global_deps, hip_stub, write_torch_standin  # noqa: E402,F401
# ---------------------------------------------------------------- hosts

class Host:
    """The loader's view of a machine: the directories its ld.so.cache lists."""

    def __init__(self, root: Path, dirs: list[Path]) -> None:
        if shutil.which("unshare") is None or shutil.which("ldconfig") is None:
            raise SetupError("needs unshare and ldconfig (util-linux, libc-bin)")
        self.dirs = dirs
        self.cache = ld_cache(root, dirs)

    def wrap(self, argv: list[str], env: dict[str, str], setup: str = "") -> list[str]:
        """``argv`` run with exactly ``env``, in a private mount namespace seeing this host's cache.

        The environment is applied by ``env -i`` at the last exec, so that an LD_PRELOAD under
        test reaches the program, not unshare, sh or mount. ``setup`` is more shell run in the
        namespace first (more mounts, say).
        """
        script = 'mount --bind "$0" /etc/ld.so.cache && ' + (f"{setup} && " if setup else "") + 'exec env -i "$@"'
        return [*unshare_mounts(), "sh", "-c", script, str(self.cache), *(f"{k}={v}" for k, v in env.items()),
                *map(str, argv)]

    def run(self, argv: list[str], env: dict[str, str], setup: str = "", **kw) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        kw.setdefault("timeout", 120)
        return subprocess.run(self.wrap(argv, env, setup), env=clean_env(), **kw)

    def traces(self, runs: list[tuple[list[str], dict[str, str]]], cwd: Path | None = None) -> list:
        """The real loader's answer for each program of ``runs`` started under exactly its environment with
        ``LD_TRACE_LOADED_OBJECTS=1`` (its lines read by tms_autopreload.trace, as the package reads them),
        all from one shell in one private mount namespace seeing this host's cache: one start of the
        namespace for many traces."""
        sys.path.insert(0, str(ROOT))
        from tms_autopreload.trace import _parse

        commands = [shlex.join(["env", "-i", "LD_TRACE_LOADED_OBJECTS=1", *(f"{k}={v}" for k, v in env.items()), *argv])
                    for argv, env in runs]
        script = "".join(f"{command} 2>&1; printf '\\n{_TRACED}%s\\n' $?\n" for command in commands)
        r = self.run(["sh", "-c", script], {"PATH": os.environ.get("PATH", os.defpath)}, cwd=cwd)
        assert r.returncode == 0 and not r.stderr, r
        parts = re.split(rf"\n{_TRACED}(\d+)\n", r.stdout)
        assert len(parts) == 2 * len(runs) + 1 and parts[-1] == "", r.stdout
        return [_parse(text, int(status)) for text, status in zip(parts[0:-1:2], parts[1::2], strict=True)]


# Ends each program's output in Host.traces, with its exit status.
_TRACED = "@@ traced, exit status "


def ldconfig_listing(cache: Path) -> list[tuple[str, str, str | None, str]]:
    """Each entry of the loader cache ``cache`` as glibc's own reader prints it (``ldconfig -p -C``), in the
    cache's order: (name, its type and ABI such as ``libc6,x86-64``, the glibc-hwcaps subdirectory of its
    copy or None, path); none where it refuses the file (``Malformed extension data``, exit status 1)."""
    r = subprocess.run(["ldconfig", "-p", "-C", str(cache)], capture_output=True, text=True)
    entries = []
    for line in r.stdout.splitlines():
        m = re.fullmatch(r"\t(\S+) \((.*)\) => (.*)", line)
        if m:
            kind, *marks = m.group(2).split(", ")
            hwcaps = next((x[len('hwcap: "'):-1] for x in marks if x.startswith('hwcap: "')), None)
            entries.append((m.group(1), kind, hwcaps, m.group(3)))
    return entries


# GLIBC_TUNABLES that take ISA levels away from this CPU: none, x86-64-v4's and v3's, all but the baseline.
HWCAPS_TUNABLES = ["", "glibc.cpu.hwcaps=-AVX512F,-AVX2", "glibc.cpu.hwcaps=-AVX512F,-AVX2,-SSE4_2"]


def retyped(src: str, dst: Path, *, elf_class: int | None = None, machine: int | None = None) -> None:
    """A copy of ``src`` whose ELF header says another class (EI_CLASS) or machine (e_machine): the two
    fields the loader compares before it maps a candidate file, and the only ones changed."""
    data = bytearray(Path(src).read_bytes())
    if elf_class is not None:
        data[4] = {32: 1, 64: 2}[elf_class]
    if machine is not None:
        data[18:20] = machine.to_bytes(2, "little")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))


def marked_processes(marker: str) -> list[int]:
    """PIDs of the processes whose environment holds ``marker`` (a ``NAME=value`` string)."""
    want = marker.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if want in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def end_marked_processes(marker: str, grace: float = 30) -> None:
    """End exactly the processes a test started under ``marker`` in their environment (a Ray cluster's
    daemons and the workers they spawned inherit it): SIGTERM, then SIGKILL after ``grace`` seconds.

    Never ``ray stop --force``: it ends every Ray process on the machine, another run's too.
    """
    import os
    import signal
    import time

    deadline = time.monotonic() + grace
    sig = signal.SIGTERM
    while pids := [p for p in marked_processes(marker) if p != os.getpid()]:
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        if time.monotonic() > deadline:
            sig = signal.SIGKILL
        time.sleep(0.2)


def allocator_bindings(log_dir: Path) -> dict[str, dict[str, str]]:
    """{library name: {symbol: file it was bound to}} for cudaMalloc/cudaFree, from the loader's own
    ``LD_DEBUG=bindings`` log files in ``log_dir``, read with the package's own parser."""
    sys.path.insert(0, str(ROOT))
    from tms_autopreload.commands.doctor.deep import parse_binding

    out: dict[str, dict[str, str]] = {}
    for path in log_dir.iterdir():
        for line in path.read_text(errors="replace").splitlines():
            b = parse_binding(line)
            if b and b.symbol in ("cudaMalloc", "cudaFree"):
                out.setdefault(os.path.basename(b.referrer), {})[b.symbol] = os.path.realpath(b.target)
    return out


# The start of a script that drives a real Jupyter kernel with jupyter_client, as notebook front ends do:
# argv[1] is a kernels directory, argv[2] the kernel's name; run(code) executes one cell and returns
# what it printed.
KERNEL_CLIENT = r"""
import json, sys, time
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager

km = KernelManager(kernel_name=sys.argv[2], kernel_spec_manager=KernelSpecManager(kernel_dirs=[sys.argv[1]]))
km.start_kernel()
import atexit
atexit.register(lambda: km.shutdown_kernel(now=True) if km.is_alive() else None)  # also when a check fails
kc = km.client()
kc.start_channels()
kc.wait_for_ready(timeout=120)


def run(code):
    out = []
    reply = kc.execute_interactive(code, timeout=300, output_hook=out.append)
    assert reply['content']['status'] == 'ok', reply['content']
    return ''.join(m['content'].get('text', '') for m in out if m['msg_type'] == 'stream').strip()
"""


# ---------------------------------------------------------------- what a start did, from the process itself

# torch_memory_saver's own preload check (0.0.10: hooks/mode_preload.py), run from its installed source without
# importing torch: prints whether it accepts this process's LD_PRELOAD.
REAL_CHECK = """
import os, sys, types
site = [p for p in sys.path if p.endswith('site-packages')][0]
package = types.ModuleType('torch_memory_saver')
package.__path__ = [os.path.join(site, 'torch_memory_saver')]
sys.modules['torch_memory_saver'] = package
from torch_memory_saver.hooks.mode_preload import HookUtilModePreload
try:
    HookUtilModePreload().get_path_binary()
    print('accepted')
except AssertionError:
    print('refused')
"""

# Python source, defined once, for the probes tests start (they cannot import this module): whether a
# process's current image was started by the start-up hook's re-exec.
# /proc/<pid>/environ holds the environment the kernel gave the current image at execve; later
# changes to os.environ (the hook removes the marker from it) do not touch it. The hook's exec alone
# writes TMS_AUTOPRELOAD_EXEC_PID=<the PID that exec'd>, and an exec keeps the PID, so an image whose
# start environment holds its own PID there was started by the hook. This reads no log line: it
# holds whatever TMS_AUTOPRELOAD_VERBOSE says.
REEXECD = r"""
def reexecd(pid=None):
    import os
    pid = os.getpid() if pid is None else pid
    with open(f'/proc/{pid}/environ', 'rb') as f:
        return f'TMS_AUTOPRELOAD_EXEC_PID={pid}'.encode() in f.read().split(b'\0')
"""


# Python source, defined once, for the probes tests start: ``mapped(part='', pid='self')``, the files
# mapped into a process whose path holds ``part``, sorted, each once, from the kernel's own list
# (/proc/<pid>/maps, whose sixth field, where a line has one, is the file's path). It imports nothing,
# so that a probe of what a start imported sees the start's own modules only.
MAPPED = r"""
def mapped(part='', pid='self'):
    with open(f'/proc/{pid}/maps') as maps:
        lines = [line.split(None, 5) for line in maps]
    return sorted({f[5].strip() for f in lines if len(f) == 6 and part in f[5]})
"""


# The command prefix that drops root's permission bypass (CAP_DAC_*) so that file modes apply, while staying uid 0:
# a file or directory made unreadable by its mode is so for the program it starts.
NO_DAC = ["setpriv", "--inh-caps=-dac_override,-dac_read_search", "--bounding-set=-dac_override,-dac_read_search"]


def dynamic_offset(data: bytes) -> int:
    """The file offset of the dynamic section (PT_DYNAMIC) of a 64-bit little-endian ELF object's bytes."""
    import struct

    phoff, phnum = struct.unpack_from("<Q", data, 32)[0], struct.unpack_from("<H", data, 56)[0]
    return next(offset for i in range(phnum)
                for p_type, _flags, offset in [struct.unpack_from("<IIQ", data, phoff + 56 * i)] if p_type == 2)


def hash_outside(src: Path, dst: Path) -> Path:
    """A copy of the ELF object ``src`` at ``dst`` whose DT_HASH points past its end: its DT_HASH entry where it
    has one, else its DT_RELACOUNT entry (a hint the loader does without) turned into one. Where it has
    DT_GNU_HASH the loader sizes and searches its symbol table by that alone and loads it as it loads ``src``; a
    reader that sizes the table by DT_HASH's chain count cannot."""
    import struct

    sys.path.insert(0, str(ROOT))
    from tms_autopreload import elf

    data = bytearray(Path(src).read_bytes())
    fd = os.open(src, os.O_RDONLY)
    try:
        tags = elf.read_layout(fd).tags
    finally:
        os.close(fd)
    entry = tags.index(4 if 4 in tags else 0x6FFFFFF9)  # DT_HASH, else DT_RELACOUNT
    struct.pack_into("<qQ", data, dynamic_offset(data) + 16 * entry, 4, len(data) << 4)
    Path(dst).write_bytes(bytes(data))
    os.chmod(dst, 0o755)
    return Path(dst)

def execs(*images: bool) -> int:
    """How many of these process images the hook's re-exec started (each ``reexecd()`` from a probe)."""
    assert all(isinstance(i, bool) for i in images), images
    return sum(images)


def mentions_variable(text: str, variable: str) -> bool:
    """True when ``text`` names the environment variable ``variable`` as a whole token:
    ``TMS_AUTOPRELOAD`` is not named by ``TMS_AUTOPRELOAD_PATH=...``."""
    return re.search(rf"(?<![A-Za-z0-9_]){re.escape(variable)}(?![A-Za-z0-9_])", text) is not None


# glibc's notice for a preload entry it cannot load: "ERROR: ld.so: object '%s' from %s cannot be preloaded
# (%s): ignored.\n", any number of them.
_LOADER_NOTICES = r"(?:ERROR: ld\.so: object '.*?' from \S+ cannot be preloaded \(.*?\): ignored\.\n)*"


def assert_stopped(r, *words: str, code: int = 78, verbose: bool = False) -> str:
    """The documented stop: exit ``code`` (78, or 130 when interrupted) before any user code ran, one
    ``tms-autopreload:`` message (warnings aside, and with ``verbose`` the notes TMS_AUTOPRELOAD_VERBOSE
    prints before it), ``words`` in what it printed, no traceback, no loader error. Returns the message
    (from its first line on). ``r`` is a CompletedProcess, text or bytes."""
    out = r.stdout.decode("utf-8", "replace") if isinstance(r.stdout, bytes) else r.stdout
    err = r.stderr.decode("utf-8", "replace") if isinstance(r.stderr, bytes) else r.stderr
    assert r.returncode == code, (r.returncode, err[-3000:])
    assert out == "" and "Traceback" not in err and "error while loading shared libraries" not in err, err[-3000:]
    first = err.find("tms-autopreload: ")
    # Before it, only the loader's own notices about LD_PRELOAD entries it ignored (the user's input), each
    # whole: an entry may hold a newline (glibc elf/rtld.c prints it as it is).
    assert first >= 0 and re.fullmatch(_LOADER_NOTICES, err[:first], re.S), err[-3000:]
    ours = [line for line in err.splitlines()
            if line.startswith("tms-autopreload: ") and not line.startswith("tms-autopreload: warning:")]
    assert len(ours) == 1 or (verbose and ours), err[-3000:]
    message = err[err.index(ours[-1]):]
    for w in words:  # the stop message, or a warning said on the way (a misspelt variable's)
        assert w in err, (w, err[-3000:])
    if code == 78:  # every stop ends with the way out of it: how to run a command here without the hook
        assert WAY_OUT in message, message
        message = message[:message.index(WAY_OUT)]
    return message


def pip_fix(python, verb: str, *args: str, options: tuple[str, ...] = ()) -> str:
    """The fix the package prints for pip's ``verb`` in the suite's venvs, which are made ``--without-pip``
    (so it runs ensurepip first): that the form runs as printed is tests/test_install_commands.py's."""
    from tms_autopreload.installer import pip_form

    return pip_form(str(python), verb, list(options), list(args), False, False, True)


# The line that ends every stop (tms_autopreload.stopped.way_out), and what it says to run.
WAY_OUT = "\nTo run a command here without the hook: `env TMS_AUTOPRELOAD_DISABLE=1 COMMAND`"


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until ``path`` exists (a readiness marker the process writes); fails if it ends first or
    ``timeout`` passes (a timeout, not a bound on how fast it should be)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"the process ended ({proc.returncode}) before it was ready: "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no readiness marker {path} within {timeout} s")
        time.sleep(0.01)


# ---------------------------------------------------------------- Ray clusters a test starts

RAY_NODE = ["--num-cpus=1", "--disable-usage-stats", "--object-store-memory=100000000", "--node-ip-address=127.0.0.1"]
MARKER_VAR = "TMS_TEST_RAY_CLUSTER"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def user_ray_dir() -> list[tuple[str, int, int]] | None:
    """What ``~/.ray`` of the user running the tests holds (each file's path in it, size and mtime), or None
    where there is none: Ray 2.60 writes its authentication token there (``~/.ray/auth_token``) when a
    ``ray.init()`` starts a cluster, and a ``ray start --head`` that finds one turns authentication on.
    A test's Ray runs with a HOME of its own (:attr:`RayCluster.home`); this is the check that it did."""
    root = Path.home() / ".ray"
    if not root.is_dir():
        return None
    return sorted((str(f.relative_to(root)), f.lstat().st_size, f.lstat().st_mtime_ns) for f in root.rglob("*"))


class RayCluster:
    """Ray nodes one test starts, each from its own venv in its own mount namespace.

    Every process of the cluster (``ray start``'s GCS, raylet, agents, and the workers they start) inherits
    a marker variable naming this cluster; :meth:`stop` ends exactly the processes that carry it, by PID
    (:func:`end_marked_processes`), never ``ray stop``. Ending them by PID means Ray's own clean-up never
    runs, so every node keeps its state (sessions, sockets, ``ray_current_cluster``) in this cluster's own
    temporary directory, ``temp / name``, which :meth:`stop` removes: Ray's shared ``/tmp/ray`` is never
    written, and a later ``ray.init()`` on the machine does not find a dead test cluster there.

    Its processes and its clients (:meth:`client_env`) have a HOME and a TMPDIR of their own, :attr:`home` and
    :attr:`tmp`, under that directory: Ray reads and writes its authentication token in ``~/.ray``, so the user's
    own would decide whether a test cluster wants a token, and a test's would be left in the user's. ``token=True`` is a
    cluster with token authentication, made as a new user of Ray 2.60 gets one: a token in ``~/.ray``
    (``ray get-auth-token --generate``, the file ``ray.init()`` writes) and a plain ``ray start --head``,
    which finds it and turns authentication on; the nodes that join it, and its clients, say
    ``RAY_AUTH_MODE=token`` (Ray turns it on by itself only for a head and for ``ray.init()`` without an
    address). Without, no token exists there and no process says ``RAY_AUTH_MODE``.
    """

    def __init__(self, token: bool = False) -> None:
        self.marker = f"{os.getpid()}-{uuid.uuid4().hex[:12]}"
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.temp = Path(tempfile.mkdtemp(prefix="tmsray-"))  # short: Ray's socket paths live under it
        self.home = self.temp / "home"
        self.home.mkdir()
        # The temporary directory of its processes (TMPDIR): what they make there by Python's tempfile, which
        # Ray's own clean-up would remove and ending them by PID does not (multiprocessing's pymp-* listener
        # of a job's supervisor), goes with the cluster's directory.
        self.tmp = self.temp / "tmp"
        self.tmp.mkdir()
        self.token = token
        self.user_ray = user_ray_dir()
        self.nodes: list[str] = []

    def env(self, **extra: str) -> dict[str, str]:
        """The environment of this cluster's processes: a clean one with the marker and :attr:`home`."""
        return clean_env(**{"RAY_USAGE_STATS_ENABLED": "0", "HOME": str(self.home), "TMPDIR": str(self.tmp),
                            MARKER_VAR: self.marker, **extra})

    def client_env(self, **extra: str) -> dict[str, str]:
        """The environment of a driver or a command that connects to this cluster: :meth:`env`, with
        ``RAY_AUTH_MODE=token`` where the cluster wants a token (its own, found in :attr:`home`)."""
        return self.env(**({"RAY_AUTH_MODE": "token"} if self.token else {}), **extra)

    def start(self, host: Host, venv_path: Path, *args: str, head: bool = False, env: dict[str, str] | None = None,
              name: str | None = None, timeout: int = 180, dashboard: int | None = None,
              cwd: Path | None = None) -> None:
        """``ray start`` from ``venv_path`` on ``host``: the head (``head=True``), or a node joining it;
        ``env``: more variables for the node's daemons (and so for every worker they start); ``name``: the
        node's directory under :attr:`temp` (default ``node<N>``); ``dashboard``: the head's dashboard port
        (``ray job submit`` talks to it; needs ``ray[default]``), none by default; ``cwd``: where it starts."""
        name = name or f"node{len(self.nodes)}"
        self.nodes.append(name)
        ray = str(venv_path / "bin" / "ray")
        board = (["--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}"]
                 if dashboard else ["--include-dashboard=false"])
        where = ["--head", f"--port={self.port}", *board] if head else [f"--address={self.address}"]
        node_env = (self.env if head else self.client_env)(**(env or {}))
        if head and self.token:
            r = host.run([ray, "get-auth-token", "--generate"], node_env, timeout=timeout)
            if r.returncode != 0 or not (self.home / ".ray" / "auth_token").is_file():
                raise AssertionError(f"ray get-auth-token --generate failed:\n{r.stdout}\n{r.stderr}")
        # One node starts at a time on this machine (the lanes run modules on parallel workers): on two cores
        # a node starting beside another cluster's overran Ray's fixed 30 s wait for it to register.
        with cache_lock("ray-start"):
            r = host.run([ray, "start", *where, f"--temp-dir={self.temp / name}", *RAY_NODE, *worker_ports(), *args],
                         node_env, timeout=timeout, cwd=cwd)
        if r.returncode != 0:
            raise AssertionError(f"ray start failed:\n{r.stdout}\n{r.stderr}")

    def pids(self) -> list[int]:
        return [pid for pid in marked_processes(f"{MARKER_VAR}={self.marker}") if pid != os.getpid()]

    def stop(self, grace: float = 10.0) -> None:
        """End this cluster's processes (:func:`end_marked_processes`), then remove its directory."""
        end_marked_processes(f"{MARKER_VAR}={self.marker}", grace)
        shutil.rmtree(self.temp, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What this cluster left behind once stopped, each said in a line: none of its processes may live
        on, its directory must be gone, and the user's ``~/.ray`` must be as it was when it was made."""
        left = [f"process {pid} of the cluster" for pid in self.pids()]
        if self.temp.exists():
            left.append(f"its directory {self.temp}")
        if user_ray_dir() != self.user_ray:
            left.append(f"{Path.home() / '.ray'} changed: {self.user_ray} then, {user_ray_dir()} now")
        return left


def worker_ports() -> list[str]:
    """A window of worker ports of a node's own: Ray's default window (10002-19999), shared by every
    cluster on the machine, made a driver collide with another run's worker ("Failed to start the grpc
    server ... port 10006")."""
    low = random.randrange(20000, 30000, 200)
    return [f"--min-worker-port={low}", f"--max-worker-port={low + 199}"]


def fenced_blocks(text: str, lang: str = "") -> list[str]:
    """The bodies of ``text``'s fenced Markdown blocks whose info string is ``lang`` ("" for plain ones, as
    a user copies commands from), read line by line: a closing fence is never taken for an opening one."""
    blocks: list[str] = []
    body: list[str] | None = None
    info = ""
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            if body is None:
                body, info = [], line[3:].strip()
            else:
                if info == lang:
                    blocks.append("".join(body))
                body = None
        elif body is not None:
            body.append(line)
    return blocks


def write_examples_standin(sdist: Path, dest: Path) -> list[str]:
    """In ``dest``, an empty module for each scenario the ``sdist``'s ``test/test_examples.py`` imports from
    ``examples`` (their ``test/examples/``, which the sdist leaves out): what ``scripts/gpu-check.sh`` checks
    is there, and enough for pytest to collect their GPU tests. Returns the names, in import order."""
    with tarfile.open(sdist) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/test/test_examples.py"))
        source = tar.extractfile(member).read().decode()
    names = [a.name for node in ast.walk(ast.parse(source))
             if isinstance(node, ast.ImportFrom) and node.module == "examples" for a in node.names]
    dest.mkdir(parents=True)
    for name in names:
        (dest / f"{name}.py").write_text("")
    return names
