"""A shared environment: owned by one account, used by others. Real accounts, real permissions.

A team's venv on a cluster is owned by a service account and used read-only by everyone. That
account's files are already the code every user's process runs (the interpreter's prefix, its
site-packages, this package), so its preload builds are as trusted as that code; a build that
more accounts can write than the environment's own code is refused, naming who and what to fix.

The fixture creates system accounts (``useradd``) and removes them after; processes run as one of
them through ``setpriv`` inside the host's mount namespace (``support.Host``), so the file modes and
owners apply as they would on a cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import DEFAULT_PYTHON, need
from support import (MAPPED, REEXECD, Host, Venv, assert_stopped, clean_env, execs, python_for_every_account, tms_wheel,
                     write_torch_standin)

CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"
SETPRIV = "/usr/bin/setpriv"
PROBE = REEXECD + MAPPED + """
import json, os
maps = mapped()
print(json.dumps({'hooks': sorted({m for m in maps if 'torch_memory_saver' in m}),
                  'preload': os.environ.get('LD_PRELOAD', ''), 'uid': os.getuid(), 'reexecd': reexecd()}))
"""


class Account:
    """A system account made for this module (its own group too), removed after."""

    def __init__(self, name: str, groups: tuple[str, ...] = ()) -> None:
        args = ["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin"]
        if groups:
            args += ["--groups", ",".join(groups)]
        subprocess.run([*args, name], check=True, capture_output=True, text=True)
        self.name = name
        ids = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout
        gid = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout
        self.uid, self.gid = int(ids), int(gid)

    def remove(self) -> None:
        subprocess.run(["userdel", self.name], capture_output=True)  # its own group goes with it


def _group(name: str) -> int:
    subprocess.run(["groupadd", "--system", name], check=True, capture_output=True)
    return int(subprocess.run(["getent", "group", name], check=True, capture_output=True,
                              text=True).stdout.split(":")[2])


class Shared:
    """The environment, owned by ``owner``, with the host it runs on, and ways to run as an account."""

    def __init__(self, root: Path, parts) -> None:
        self.accounts: list[Account] = []
        self.groups: list[str] = []
        try:
            self._make(root, parts)
        except BaseException:
            self.remove()  # no account outlives a failed set-up
            raise

    def _make(self, root: Path, parts) -> None:
        tag = f"tms{os.getpid() % 100000}"
        self.team_gid = self._add_group(f"{tag}team")  # maintains the environment, in one test
        self.other_gid = self._add_group(f"{tag}grp")  # a group that cannot write the environment
        self.owner = self._add(f"{tag}own")  # the service account that owns the environment
        self.user = self._add(f"{tag}usr")  # who runs the job
        self.third = self._add(f"{tag}oth")  # another account
        self.member = self._add(f"{tag}mem", (f"{tag}team",))  # a member of the team group
        libs = root / "libs"
        shutil.copytree(parts.stub, libs / "driver")
        shutil.copytree(parts.rt[13], libs / "cuda13")
        self.host = Host(root / "host", [libs / "driver", libs / "cuda13"])
        self.root = root
        self.venv = Venv(root / "env", python_for_every_account(DEFAULT_PYTHON),
                         [parts.own_wheel, tms_wheel("0.0.9.post1")])
        write_torch_standin(self.venv.site, cuda="13.0", hip=None, deps_lib=parts.global_deps("cu13-sys"))
        subprocess.run(["chown", "-R", f"{self.owner.uid}:{self.owner.gid}", str(self.venv.path)], check=True)
        self.build = self.venv.site / CU13

    def _add(self, name: str, groups: tuple[str, ...] = ()) -> Account:
        account = Account(name, groups)
        self.accounts.append(account)
        return account

    def _add_group(self, name: str) -> int:
        gid = _group(name)
        self.groups.append(name)
        return gid

    def remove(self) -> None:
        for a in self.accounts:
            a.remove()
        for g in self.groups:
            subprocess.run(["groupdel", g], capture_output=True)

    def run(self, who: Account, args: list[str], env: dict[str, str] | None = None):
        """The environment's python with ``args``, as ``who`` (with its groups)."""
        argv = [SETPRIV, f"--reuid={who.uid}", f"--regid={who.gid}", "--init-groups", "--",
                str(self.venv.python), *args]
        return self.host.run(argv, clean_env(HOME="/nonexistent", **(env or {})), cwd=self.root)

    def doctor(self, who: Account, **env: str) -> dict:
        r = self.run(who, ["-m", "tms_autopreload", "doctor", "--json"], env)
        assert r.returncode in (0, 1), r.stderr
        return json.loads(r.stdout)

    def start(self, who: Account, **env: str):
        r = self.run(who, ["-c", PROBE], {"SLIME_OFFLOAD_TRAIN": "1", **env})
        out = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else None
        return r, out

    @contextlib.contextmanager
    def changed(self, path: Path, mode: int | None = None, uid: int | None = None, gid: int | None = None):
        """``path`` with another mode or owner for the duration, restored after."""
        st = os.stat(path)
        os.chown(path, st.st_uid if uid is None else uid, st.st_gid if gid is None else gid)
        if mode is not None:
            os.chmod(path, mode)
        try:
            yield path
        finally:
            os.chown(path, st.st_uid, st.st_gid)
            os.chmod(path, st.st_mode & 0o7777)

    @contextlib.contextmanager
    def group_maintained(self, gid: int):
        """The whole environment group-owned by ``gid`` and writable by it (a team's env, umask 002)."""
        subprocess.run(["chgrp", "-R", str(gid), str(self.venv.path)], check=True)
        subprocess.run(["chmod", "-R", "g+w", str(self.venv.path)], check=True)
        try:
            yield
        finally:
            subprocess.run(["chmod", "-R", "g-w", str(self.venv.path)], check=True)
            subprocess.run(["chgrp", "-R", str(self.owner.gid), str(self.venv.path)], check=True)


@pytest.fixture(scope="module")
def shared(parts):
    if os.geteuid() != 0:  # tools/prereqs.py says so before any test
        pytest.skip("needs root: creates accounts and changes file owners")
    root = Path(tempfile.mkdtemp(prefix="tms-shared-", dir="/tmp"))  # not under pytest's 0700 base
    root.chmod(0o755)
    env = None
    try:
        env = need(Shared, root, parts)
        yield env
    finally:
        if env is not None:
            env.remove()
        shutil.rmtree(root, ignore_errors=True)


def candidate(doc: dict, path: Path) -> dict:
    return next(c for c in doc["candidates"] if c["path"] == str(path))


def assert_hooked_as(shared, who, doc, r, out):
    """``who``'s flagged start mapped exactly the build doctor chose, with doctor's LD_PRELOAD, after one exec."""
    assert doc["ok"] and doc["plan"]["build"] == str(shared.build), (doc["error"], doc["candidates"])
    assert r.returncode == 0, r.stderr
    assert out["uid"] == who.uid and out["hooks"] == [str(shared.build)], out
    assert out["preload"] == doc["plan"]["env"]["LD_PRELOAD"] and execs(out["reexecd"]) == 1, out
    assert "Traceback" not in r.stderr, r.stderr


def assert_refused(shared, who, cause, *words):
    """doctor and the flagged start of ``who`` both refuse the build for ``cause``, with the same message:
    its headline and Fix say what is wrong (``words``), never to install another torch_memory_saver."""
    doc = shared.doctor(who)
    assert not doc["ok"], doc["candidates"]
    headline, _, _ = doc["error"].partition("\n")
    fix = doc["error"].splitlines()[-1]
    assert fix.startswith("Fix: ") and "install a torch_memory_saver" not in doc["error"], doc["error"]
    for w in words:
        assert w in headline or w in fix, (w, doc["error"])
    assert candidate(doc, shared.build)["cause"] == cause, doc["candidates"]
    r, _ = shared.start(who)
    message = assert_stopped(r)  # doctor traces every candidate, so only its lines may say more
    assert message.startswith(f"tms-autopreload: {headline}\n") and message.rstrip().endswith(fix), \
        (doc["error"], message)
    return doc["error"]


# ---------------------------------------------------------------- hooked

def test_shared_environment_owned_by_another_account_is_hooked(shared):
    """The owner's files are already this process's code: their build is preloaded for every user."""
    doc = shared.doctor(shared.user)
    r, out = shared.start(shared.user)
    assert_hooked_as(shared, shared.user, doc, r, out)


def test_shared_environment_hooked_in_dlopen_mode_too(shared):
    doc = shared.doctor(shared.user)
    r, out = shared.start(shared.user, TMS_AUTOPRELOAD_MODE="dlopen")
    assert r.returncode == 0 and out["hooks"] == [doc["plan"]["build"]] == [str(shared.build)], (r.stderr, doc)
    assert execs(out["reexecd"]) == 0, out


def test_group_maintained_environment_is_hooked(shared):
    """A team's env, writable by the team's group (umask 002): the group already writes its code."""
    with shared.group_maintained(shared.team_gid):
        doc = shared.doctor(shared.user)
        r, out = shared.start(shared.user)
    assert_hooked_as(shared, shared.user, doc, r, out)


def test_build_installed_by_a_member_of_the_maintaining_group_is_hooked(shared):
    """Its owner is in the group that can write the environment's code, so it could change that code."""
    with shared.group_maintained(shared.team_gid), shared.changed(shared.build, uid=shared.member.uid):
        doc = shared.doctor(shared.user)
        r, out = shared.start(shared.user)
    assert_hooked_as(shared, shared.user, doc, r, out)


# ---------------------------------------------------------------- refused, each for its own cause

def test_world_writable_build_in_a_shared_environment_is_refused(shared):
    with shared.changed(shared.build, mode=0o777):
        error = assert_refused(shared, shared.user, "world-writable", "writable by every user",
                               f"chmod o-w {shared.build}")
    assert "TMS_AUTOPRELOAD_PATH" in error


def test_build_owned_by_a_third_account_is_refused(shared):
    with shared.changed(shared.build, uid=shared.third.uid):
        assert_refused(shared, shared.user, "untrusted-writer", f"uid {shared.third.uid} ({shared.third.name})",
                       "cannot write this environment's code", f"chown {shared.owner.uid} {shared.build}")


def test_build_writable_by_a_group_outside_the_environment_is_refused(shared):
    """Refused for the environment's owner too: that group's members could not change its code."""
    with shared.changed(shared.build, mode=0o775, gid=shared.other_gid):
        for who in (shared.user, shared.owner):
            assert_refused(shared, who, "untrusted-writer", f"group {shared.other_gid}",
                           "cannot write this environment's code", f"chmod g-w {shared.build}")


def test_directory_holding_the_build_owned_by_a_third_account_is_refused(shared):
    """Whoever can rename or replace the file can change what is preloaded: its directory counts."""
    pkg = shared.venv.site / "torch_memory_saver"
    moved = pkg / CU13
    os.rename(shared.build, moved)
    try:
        with shared.changed(pkg, uid=shared.third.uid):
            doc = shared.doctor(shared.user)
    finally:
        os.rename(moved, shared.build)
    c = candidate(doc, moved)
    assert not doc["ok"] and c["cause"] == "untrusted-writer" and str(pkg) in c["reason"], doc["candidates"]
    assert f"uid {shared.third.uid}" in doc["error"].partition("\n")[0], doc["error"]


def test_owner_of_the_site_directory_is_trusted_for_the_builds_in_it(shared):
    """Whoever owns site-packages can already put code into every start (a .pth file): their build is no
    new power, even where another account owns the rest of the environment."""
    with shared.changed(shared.venv.site, uid=shared.third.uid), shared.changed(shared.build, uid=shared.third.uid):
        doc = shared.doctor(shared.user)
        r, out = shared.start(shared.user)
    assert_hooked_as(shared, shared.user, doc, r, out)


def test_build_linked_into_a_directory_of_a_third_account_is_refused(shared):
    """The real path is walked too: a symbolic link in site-packages that leads into a third account's
    directory preloads whatever that account puts there (refused for the environment's owner as well)."""
    elsewhere = shared.root / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / CU13
    shutil.copy2(shared.build, target)
    os.chown(target, shared.owner.uid, shared.owner.gid)
    os.chown(elsewhere, shared.third.uid, shared.third.gid)
    saved = shared.build.with_name(CU13 + ".saved")
    os.rename(shared.build, saved)
    try:
        shared.build.symlink_to(target)
        os.lchown(shared.build, shared.owner.uid, shared.owner.gid)
        doc = shared.doctor(shared.owner)
        r, _ = shared.start(shared.owner)
    finally:
        shared.build.unlink()
        os.rename(saved, shared.build)
        shutil.rmtree(elsewhere)
    c = candidate(doc, shared.build)
    assert not doc["ok"] and c["cause"] == "untrusted-writer" and str(elsewhere) in c["reason"], doc["candidates"]
    assert_stopped(r, f"uid {shared.third.uid}", "cannot write this environment's code")


def test_build_reached_through_a_link_in_a_third_accounts_directory_is_refused(shared):
    """Every link on the way counts, not only the named path and the real one: site-packages' link leads to
    a link in a directory of a third account, which leads to a file the owner's own directory holds. That
    account can point the middle link elsewhere."""
    hop, real = shared.root / "hop", shared.root / "real"
    hop.mkdir()
    real.mkdir()
    shutil.copy2(shared.build, real / CU13)
    (hop / CU13).symlink_to(real / CU13)
    for path in (real, real / CU13, hop / CU13):
        os.lchown(path, shared.owner.uid, shared.owner.gid)
    os.chown(hop, shared.third.uid, shared.third.gid)
    saved = shared.build.with_name(CU13 + ".saved")
    os.rename(shared.build, saved)
    try:
        shared.build.symlink_to(hop / CU13)
        os.lchown(shared.build, shared.owner.uid, shared.owner.gid)
        doc = shared.doctor(shared.owner)
    finally:
        shared.build.unlink()
        os.rename(saved, shared.build)
        shutil.rmtree(hop)
        shutil.rmtree(real)
    c = candidate(doc, shared.build)
    assert not doc["ok"] and c["cause"] == "untrusted-writer", doc["candidates"]
    assert f"{hop} (the directory holding {CU13}) is owned by uid {shared.third.uid}" in c["reason"], c


def test_world_writable_site_directory_refuses_every_build_that_fits(shared):
    """Every user is never trusted, even where the environment's own code is world-writable: both CUDA 12
    builds that fit are refused, the headline says so once, and the Fix names the directory once."""
    with shared.changed(shared.venv.site, mode=0o777):
        doc = shared.doctor(shared.user, TMS_AUTOPRELOAD_CUDA_MAJOR="12")
        start, _ = shared.start(shared.user, TMS_AUTOPRELOAD_CUDA_MAJOR="12")
    headline, fix = doc["error"].splitlines()[0], doc["error"].splitlines()[-1]
    assert headline == ("every torch_memory_saver preload build for CUDA 12 can be changed by someone who cannot "
                        "change this environment's code, so none is preloaded:"), doc["error"]
    assert fix.count(f"chmod o-w {shared.venv.site}") == 1 and "install a torch_memory_saver" not in fix, fix
    causes = {os.path.basename(c["path"]): c["cause"] for c in doc["candidates"]}
    assert causes == {"torch_memory_saver_hook_mode_preload.abi3.so": "world-writable",
                      "torch_memory_saver_hook_mode_preload_cu12.abi3.so": "world-writable",
                      CU13: "wrong-runtime"}, doc["candidates"]
    assert assert_stopped(start).startswith(f"tms-autopreload: {headline}\n")


def test_a_fix_for_an_environment_this_account_cannot_write_names_whose_it_is(shared):
    """The owner's build gone (moved aside for the test): the user's stop and doctor say the fix, and that it
    is the owner's to run, since this account cannot write the environment; the owner's says only the fix."""
    moved = shared.build.with_name(shared.build.name + ".moved")
    os.rename(shared.build, moved)
    try:
        fix = shared.doctor(shared.user)["fix"]
        owners = shared.doctor(shared.owner)["fix"]
        r, _ = shared.start(shared.user)
    finally:
        os.rename(moved, shared.build)
    words = (f"{shared.venv.site} is not writable by this account (it belongs to {shared.owner.name}): run it as "
             f"{shared.owner.name}: `env TMS_AUTOPRELOAD_DISABLE=1 {shared.venv.python} -m ")
    assert words in fix and words in assert_stopped(r), fix
    assert "not writable" not in owners and "`env TMS_AUTOPRELOAD_DISABLE=1 " in owners, owners
