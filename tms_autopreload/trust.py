"""Who may write a file that is preloaded: no one who could not already change this process's code.

A preloaded file runs inside every process that inherits ``LD_PRELOAD``, so whoever can write it
runs code in all of them. That is no new power for someone who can already write the code this
process runs: the interpreter's prefixes (``sys.prefix``, ``sys.base_prefix``), the directory of the
real interpreter binary, and the site directory the build sits in (the ``sys.path`` entry that holds
torch_memory_saver, whose Python side the job imports). A team's environment owned by a service
account is therefore trusted as far as that account's code already is; a build that more accounts
can write than that code is refused. :func:`refusal` is the one rule; everything else asks it.

Who can write a path, from its mode bits and owners (POSIX ACLs are not read):

* the owner of the file and of every directory above it (an owner can always ``chmod``);
* its group when group-writable, every user when world-writable;
* for each directory above it, whoever can replace an entry in it: its group and every user when
  writable, except in a sticky directory (``/tmp``), where only the directory's and the entry's
  owners (and root) may rename or remove an entry;
* both the path as named and its real path are walked: whoever can rewrite a symbolic link on the
  way decides where it leads.

Root is always trusted (it can write everything anyway), and so is this process's own effective
user: a file only it can write lets no one else in. Every user is never trusted, even where the environment's own code is
world-writable: such a file stays refused, and the refusal says so.
"""

import os
import stat

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    Writer = tuple[str, int]  # ("uid", N), ("gid", N) or EVERYONE

__all__ = ["Grant", "Refusal", "Trusted", "writers", "trusted_writers", "refusal", "CAUSE_WORLD_WRITABLE",
           "CAUSE_UNTRUSTED_WRITER", "CAUSE_UNCHECKED", "CAUSES"]

# Refusal.cause values (``doctor --json`` ``candidates[].cause``).
CAUSE_WORLD_WRITABLE = "world-writable"  # every user can write the file or replace it
CAUSE_UNTRUSTED_WRITER = "untrusted-writer"  # a user or group that cannot write this environment's code can
CAUSE_UNCHECKED = "unchecked"  # a component of its path could not be examined
CAUSES = (CAUSE_WORLD_WRITABLE, CAUSE_UNTRUSTED_WRITER, CAUSE_UNCHECKED)

EVERYONE = ("everyone", -1)  # the writer "every user"


class Grant:
    """How a writer can change a file: through which path component, in words."""

    __slots__ = ("component", "words")

    def __init__(self, component: str, words: str) -> None:
        self.component = component  # the file itself, or a directory above it
        self.words = words  # "<component> is owned by", "<component> (mode ...) is writable by"


class Refusal:
    """Why a file is not preloaded: a machine-readable cause, the message, and the fix."""

    __slots__ = ("cause", "message", "fix")

    def __init__(self, cause: str, message: str, fix: str) -> None:
        self.cause = cause
        self.message = message
        self.fix = fix


class Trusted:
    """The writers of this process's own code, plus root and this process's effective user."""

    __slots__ = ("writers", "owner")

    def __init__(self, writers: "frozenset[Writer]", owner: int) -> None:
        self.writers = writers
        self.owner = owner  # the owner of that code: whom a fix suggests giving a file to

    def admits(self, writer: "Writer") -> bool:
        """Whether ``writer`` could already change this process's code (every user never is): one of its
        writers, or an account in a group that is."""
        if writer == EVERYONE:
            return False
        if writer in self.writers:
            return True
        return writer[0] == "uid" and any(("gid", g) in self.writers for g in _groups_of(writer[1]))


def _groups_of(uid: int) -> "tuple[int, ...]":
    """The groups account ``uid`` is in (its primary group included); () when it has no entry."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
        return tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OSError):
        return ()


def _chain(path: str) -> "tuple[str, ...]":
    """``path`` and every directory above it, leaf first."""
    out = [path]
    while os.path.dirname(out[-1]) != out[-1]:
        out.append(os.path.dirname(out[-1]))
    return tuple(out)


def _grants(component: str, note: str, st: os.stat_result) -> "dict[Writer, Grant]":
    """Who can write the inode ``st`` of ``component`` (a directory: add, rename and remove its entries);
    ``note`` says what the component is to the file judged ("" for the file itself)."""
    mode = f"mode {stat.filemode(st.st_mode)}"
    writable = Grant(component, f"{component} ({f'{note}, ' if note else ''}{mode}) is writable by")
    out = {("uid", st.st_uid): Grant(component, f"{component}{f' ({note})' if note else ''} is owned by")}
    if st.st_mode & stat.S_IWGRP:
        out[("gid", st.st_gid)] = writable
    if st.st_mode & stat.S_IWOTH:
        out[EVERYONE] = writable
    return out


def writers(path: str) -> "dict[Writer, Grant]":
    """Everyone who can change what ``path`` holds, each with the first component (leaf first) that
    lets them. Raises OSError when a component cannot be examined."""
    out: "dict[Writer, Grant]" = {}
    for chain in dict.fromkeys((_chain(os.path.abspath(path)), _chain(os.path.realpath(path)))):
        stats = [os.stat(p) for p in chain]
        found = [_grants(chain[0], "", stats[0])]
        for child, parent, parent_st in zip(chain, chain[1:], stats[1:]):
            grants = _grants(parent, f"the directory holding {os.path.basename(child)}", parent_st)
            if parent_st.st_mode & stat.S_ISVTX:  # sticky: only the owners may replace an entry
                grants = {("uid", parent_st.st_uid): grants[("uid", parent_st.st_uid)]}
            found.append(grants)
        for grants in found:
            for who, grant in grants.items():
                out.setdefault(who, grant)
    return out


def trusted_writers(code: "Iterable[str | None]") -> Trusted:
    """The writers of the code this process already runs: the paths in ``code`` (its prefixes, its real
    interpreter's directory, the site directory of the build; the first names the owner), plus root and
    this process's user. A path that cannot be examined adds no one."""
    found: "set[Writer]" = {("uid", 0), ("uid", os.geteuid())}
    owner = None
    for path in code:
        if not path:
            continue
        try:
            found |= set(writers(path))
            owner = os.stat(path).st_uid if owner is None else owner
        except OSError:
            continue
    found.discard(EVERYONE)
    return Trusted(frozenset(found), 0 if owner is None else owner)


def _who(writer: "Writer") -> str:
    """``uid 1001 (alice)``, ``group 50 (staff)``, or ``every user``."""
    if writer == EVERYONE:
        return "every user"
    import grp
    import pwd

    kind = "uid" if writer[0] == "uid" else "group"
    try:
        name = pwd.getpwuid(writer[1]).pw_name if kind == "uid" else grp.getgrgid(writer[1]).gr_name
    except KeyError:
        return f"{kind} {writer[1]}"
    return f"{kind} {writer[1]} ({name})"


def refusal(path: str, trusted: Trusted) -> "Refusal | None":
    """Why ``path`` must not be preloaded into a process whose own code ``trusted`` can write, or None.

    The one rule: refused when anyone who could not already change this process's code can change
    the file or an entry of a directory on the way to it; every user never could. The fix names the
    component and the command that takes that power away.
    """
    try:
        found = writers(path)
    except OSError as exc:
        return Refusal(CAUSE_UNCHECKED, f"cannot check who can write {path} ({exc.strerror or exc})",
                       "make it and the directories above it searchable by this user")
    if EVERYONE in found:
        grant = found[EVERYONE]
        return Refusal(CAUSE_WORLD_WRITABLE, f"{grant.words} every user", f"chmod o-w {grant.component}")
    for who, grant in found.items():
        if not trusted.admits(who):
            if who[0] == "uid":
                return Refusal(CAUSE_UNTRUSTED_WRITER,
                               f"{grant.words} {_who(who)}, who cannot write this environment's code",
                               f"chown {trusted.owner} {grant.component} ({_who(('uid', trusted.owner))} owns "
                               f"this environment's code), or reinstall torch-memory-saver as that account")
            return Refusal(CAUSE_UNTRUSTED_WRITER,
                           f"{grant.words} {_who(who)}, which cannot write this environment's code",
                           f"chmod g-w {grant.component}")
    return None
