"""Foreign-architecture programs run here: Debian's qemu-user-static through a private binfmt_misc.

An arm64 root file system only means something when its programs really run as aarch64 programs:
its interpreter, the loader it starts, every re-exec and child. The kernel hands an ELF of a
foreign machine to the interpreter registered for it in binfmt_misc. The registration is made in
a binfmt_misc instance of a fresh user namespace (Linux 6.7 and later let a user namespace mount
its own), so it exists only for the processes of that namespace and goes away with them: the
machine's own binfmt_misc is never mounted, written or read. The line registered is Debian's own
(``/usr/lib/binfmt.d/qemu-<machine>.conf``, flags ``OPF``): ``F`` opens the emulator when it is
registered, so it runs inside a chroot that has no emulator; ``P`` hands it argv[0] unchanged.

The user namespace maps every ID to itself (0-65535), so a root file system built or entered
there has the owners it would have on an aarch64 machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import apt
from basics import SetupError

# Debian architecture name -> the machine name qemu and binfmt.d use.
MACHINES = {"arm64": "aarch64"}
IDS = "0,0,65536"  # outer ID, inner ID, count: every ID of a Debian system, mapped to itself


def registration(arch: str) -> str:
    """Debian's binfmt_misc line for ``arch`` (from qemu-user-static), with the ``F`` flag."""
    conf = Path(f"/usr/lib/binfmt.d/qemu-{MACHINES[arch]}.conf")
    try:
        line = conf.read_text().strip()
    except OSError:
        raise SetupError(f"no {conf}: running {arch} programs needs Debian's qemu-user-static "
                         "(`apt-get install qemu-user-static`, as root)") from None
    fields = line.split(":")
    if "F" not in fields[-1]:
        fields[-1] += "F"
    return ":".join(fields)


def install_qemu() -> None:
    """qemu-user-static, and mmdebstrap, which builds foreign root file systems, from Debian (with
    arch-test, which mmdebstrap asks for a foreign architecture: "install arch-test for foreign
    architecture support", a recommendation that a --no-install-recommends install leaves out)."""
    apt.ensure({"qemu-user-static": "/usr/bin/qemu-aarch64-static", "mmdebstrap": "mmdebstrap",
                "arch-test": "arch-test"}, "running arm64 root file systems")


def namespace(arch: str) -> list[str]:
    """The command prefix that runs a program in a new user and mount namespace where ``arch``'s
    programs run through qemu-user-static (a private binfmt_misc); the program follows it.

    The program keeps the PID of the prefix's first process (its caller waits for and signals that
    one). The ID maps are written from outside the namespace, as the kernel requires of a map of
    more than one ID: a helper forked before the ``exec`` waits until the PID has entered its new
    user namespace, writes the maps and ends; the namespace waits for them before it goes on.
    util-linux's own ``--map-users`` needs newuidmap and /etc/subuid entries, which root need not have.
    """
    install_qemu()
    line = registration(arch)
    maps = "; ".join(f"echo '{IDS.replace(',', ' ')}' > /proc/$$/{m}_map" for m in ("uid", "gid"))
    outer = (f"( ( while [ /proc/$$/ns/user -ef /proc/self/ns/user ]; do :; done; {maps} ) 2>/dev/null & ); "
             'exec unshare --user -m sh -c "$0" binfmt "$@"')
    inner = ("until read -r m < /proc/self/gid_map 2>/dev/null; do :; done; "
             "mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc && "
             f"printf '%s\\n' {shlex.quote(line)} > /proc/sys/fs/binfmt_misc/register && exec \"$@\"")
    return ["sh", "-c", outer, inner]


def check(arch: str) -> None:
    """Raise SetupError unless :func:`namespace` works here (root, a kernel with private binfmt_misc)."""
    if os.geteuid() != 0:
        raise SetupError(f"the {arch} lane maps every user ID into its namespace, which needs root")
    if shutil.which("unshare") is None:  # else the helper namespace() forks waits for a namespace that never comes
        raise SetupError(f"cannot start a namespace for {arch} programs: no unshare on PATH (util-linux)")
    try:
        r = subprocess.run([*namespace(arch), "cat", f"/proc/sys/fs/binfmt_misc/qemu-{MACHINES[arch]}"],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SetupError(f"cannot start a namespace for {arch} programs: {exc}") from None
    if r.returncode != 0 or "enabled" not in r.stdout:
        raise SetupError(f"no private binfmt_misc for {arch} programs here (a user namespace mounts its own "
                         f"from Linux 6.7 on): {r.stderr.strip() or r.stdout.strip()}")


__all__ = ["MACHINES", "registration", "install_qemu", "namespace", "check"]
