"""A real Slurm cluster on this machine: Debian's slurmctld and one slurmd per node view.

Each node is a ``slurmd -N NAME`` (Debian builds Slurm with multiple-slurmd support) started inside
its own host's mount namespace (a private ld.so.cache, the node's venv bind-mounted at one shared
path) and UTS namespace (its own hostname), so every task slurmd starts there sees that node's
loader and files, as on a real cluster where every node has its own install at the same path.
Authentication is ``auth/none`` and ``cred/none`` (no munge daemon), processes are tracked by
``proctrack/linuxproc`` and ``task/none`` (no cgroups); state, spool, logs and ports are private to
the cluster, and :meth:`Slurm.stop` ends exactly the daemons it started, by PID.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from basics import cache_lock
from support import Host, SetupError, clean_env, run

# Debian's packages: the controller, the node daemon, and srun/salloc/sinfo.
PACKAGES = ("slurmctld", "slurmd", "slurm-client")
PROGRAMS = ("slurmctld", "slurmd", "srun", "salloc", "sinfo")
PLUGIN_DIRS = "/usr/lib/*/slurm-wlm"  # Debian's multiarch plugin directory


def ensure_installed() -> None:
    """Install Debian's Slurm packages when missing (CI starts from a fresh machine)."""
    if not all(shutil.which(p) for p in PROGRAMS):
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            raise SetupError(f"Slurm is not installed and this is not root with apt-get: "
                             f"apt-get install {' '.join(PACKAGES)}")
        env = {**clean_env(), "DEBIAN_FRONTEND": "noninteractive"}
        with cache_lock("apt-slurm"):
            if not all(shutil.which(p) for p in PROGRAMS):
                run(["apt-get", "update", "-q"], env=env, timeout=600)
                run(["apt-get", "install", "-y", "-q", "--no-install-recommends", "-o", "DPkg::Lock::Timeout=600",
                     *PACKAGES], env=env, timeout=1200)
    for plugin in ("auth_none", "cred_none", "proctrack_linuxproc", "task_none"):
        if not glob.glob(f"{PLUGIN_DIRS}/{plugin}.so"):
            raise SetupError(f"this Slurm build has no {plugin} plugin in {PLUGIN_DIRS}")


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Node:
    """A node view: its host (loader cache) and the directory mounted at the cluster's shared path."""

    def __init__(self, name: str, host: Host, mount: Path) -> None:
        self.name = name
        self.host = host
        self.mount = mount


class Slurm:
    """slurmctld and one slurmd per node, configured in ``root``; ``shared`` is the path every node
    sees its own ``mount`` at."""

    def __init__(self, root: Path, shared: Path, nodes: list[Node]) -> None:
        ensure_installed()
        self.root, self.shared, self.nodes = root, shared, nodes
        shared.mkdir(parents=True, exist_ok=True)
        for d in ("state", "log", *(f"spool/{n.name}" for n in nodes)):
            (root / d).mkdir(parents=True, exist_ok=True)
        ctld, slurmd, *node_ports = free_ports(2 + len(nodes))
        self.conf = root / "slurm.conf"
        self.conf.write_text("\n".join([
            "ClusterName=tmstest", "SlurmctldHost=localhost", f"SlurmctldPort={ctld}", f"SlurmdPort={slurmd}",
            "AuthType=auth/none", "CredType=cred/none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_CPU", "SlurmUser=root", "SlurmdUser=root",
            "MpiDefault=none", "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
            "ReturnToService=2", f"StateSaveLocation={root}/state", f"SlurmdSpoolDir={root}/spool/%n",
            f"SlurmctldPidFile={root}/slurmctld.pid", f"SlurmdPidFile={root}/slurmd-%n.pid",
            f"SlurmctldLogFile={root}/log/slurmctld.log", f"SlurmdLogFile={root}/log/slurmd-%n.log",
            *(f"NodeName={n.name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} CPUs=2 State=UNKNOWN"
              for n, port in zip(nodes, node_ports, strict=True)),
            "PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP", ""]))
        self.daemons: list[subprocess.Popen] = []
        try:
            self._start(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
            for n in nodes:
                argv = ["unshare", "-u", "sh", "-c", 'hostname "$0" && exec "$@"', n.name,
                        "slurmd", "-D", "-N", n.name, "-f", str(self.conf)]
                self._start(n.host.wrap(argv, clean_env(), setup=f'mount --bind "{n.mount}" "{shared}"'),
                            f"slurmd-{n.name}")
            self._wait_idle()
        except BaseException:
            self.stop()
            raise

    def _start(self, argv: list[str], name: str) -> None:
        with open(self.root / "log" / f"{name}.out", "wb") as out:
            self.daemons.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
                                                 start_new_session=True))

    def _wait_idle(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        states = ""
        while time.monotonic() < deadline:
            for d in self.daemons:
                if d.poll() is not None:
                    raise SetupError(f"a Slurm daemon exited ({d.args[-1]}, {d.returncode}):\n{self.logs()}")
            r = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], env=self.env(), capture_output=True, text=True)
            states = r.stdout
            if sorted(states.split()) == sorted([n.name for n in self.nodes] + ["idle"] * len(self.nodes)):
                # Each daemon is the very process started (the namespace wrappers exec'd into it), so
                # stop() ends exactly these.
                files = ["slurmctld.pid", *(f"slurmd-{n.name}.pid" for n in self.nodes)]
                pids = [int((self.root / f).read_text().split()[0]) for f in files]
                if pids != [d.pid for d in self.daemons]:
                    raise SetupError(f"Slurm daemons' PIDs {pids} are not the processes started "
                                     f"{[d.pid for d in self.daemons]}")
                return
            time.sleep(0.5)
        raise SetupError(f"Slurm nodes not idle within {timeout} s: {states!r}\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                         for p in sorted((self.root / "log").iterdir()))

    def env(self, **extra: str) -> dict[str, str]:
        """A client's environment: this cluster's slurm.conf, and ``extra``."""
        return clean_env(SLURM_CONF=str(self.conf), **extra)

    def stop(self) -> None:
        """End the daemons this cluster started (their PIDs), slurmds first, then remove their state
        (the logs stay, for a failing run)."""
        for d in reversed(self.daemons):
            if d.poll() is None:
                d.terminate()
        for d in reversed(self.daemons):
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        for d in ("state", "spool"):
            shutil.rmtree(self.root / d, ignore_errors=True)
