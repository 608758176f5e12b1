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
* the path is walked as the kernel resolves it, through every symbolic link on the way: whoever can
  replace a link (or an entry of a directory a link leads through) decides where it leads.

Root is always trusted (it can write everything anyway), and so is this process's own effective
user: a file only it can write lets no one else in. Every user is never trusted, even where the
environment's own code is world-writable: such a file stays refused, and the refusal says so.
"""

import os
import stat

from .errors import CAUSE_UNCHECKED, CAUSE_UNTRUSTED_WRITER, CAUSE_WORLD_WRITABLE

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    Writer = tuple[str, int]  # ("uid", N), ("gid", N) or EVERYONE

__all__ = ["Grant", "Refusal", "Trusted", "writers", "refusal", "TRUST_CAUSES"]

# Refusal.cause values (``doctor --json`` ``candidates[].cause``), named with every other cause in errors.py.
TRUST_CAUSES = (CAUSE_WORLD_WRITABLE, CAUSE_UNTRUSTED_WRITER, CAUSE_UNCHECKED)

EVERYONE = ("everyone", -1)  # the writer "every user"


class Grant:
    """How a writer can change a file: through which path component (worded only when shown)."""

    __slots__ = ("component", "note", "mode")

    def __init__(self, component: str, note: str = "", mode: int | None = None) -> None:
        self.component = component  # the file itself, or a directory on the way to it
        self.note = note  # what the component is to the file ("the directory holding X"), "" for the file
        self.mode = mode  # the mode that lets its group or every user write it; None: its owner

    @property
    def words(self) -> str:
        """``<component> is owned by``, or ``<component> (mode ...) is writable by``."""
        if self.mode is None:
            return f"{self.component}{f' ({self.note})' if self.note else ''} is owned by"
        return (f"{self.component} ({f'{self.note}, ' if self.note else ''}mode {stat.filemode(self.mode)}) "
                f"is writable by")


class Refusal:
    """Why a file is not preloaded: a machine-readable cause, the message, and the fix."""

    __slots__ = ("cause", "message", "fix")

    def __init__(self, cause: str, message: str, fix: str) -> None:
        self.cause = cause
        self.message = message
        self.fix = fix


class Trusted:
    """Who could already change this process's code: root, this process's effective user, and the writers
    of ``code`` (its prefixes, its real interpreter's directory, the site directory of the builds), found
    only when a file has another writer (a start whose builds only root or the user can write walks no
    more). Holds the stat results of one survey, so that paths sharing directories examine them once."""

    __slots__ = ("code", "stats", "_writers", "_owner")

    def __init__(self, code: "Iterable[str | None]") -> None:
        self.code = tuple(p for p in code if p)
        self.stats: "dict[tuple[bool, str], os.stat_result]" = {}  # (follow links, path) -> its stat
        self._writers: "frozenset[Writer] | None" = None
        self._owner = 0

    def _find(self) -> "frozenset[Writer]":
        if self._writers is None:
            found: "set[Writer]" = set()
            owner = None
            for path in self.code:  # a path that cannot be examined adds no one
                try:
                    found |= set(writers(path, self.stats))
                    owner = _stat(path, True, self.stats).st_uid if owner is None else owner
                except OSError:
                    continue
            found.discard(EVERYONE)
            self._writers, self._owner = frozenset(found), 0 if owner is None else owner
        return self._writers

    @property
    def owner(self) -> int:
        """The owner of that code (the first of ``code``): whom a fix suggests giving a file to."""
        self._find()
        return self._owner

    def admits(self, writer: "Writer") -> bool:
        """Whether ``writer`` could already change this process's code (every user never is): root, this
        process's user, one of the code's writers, or an account in a group that is one."""
        if writer == EVERYONE:
            return False
        if writer in (("uid", 0), ("uid", os.geteuid())) or writer in self._find():
            return True
        return writer[0] == "uid" and any(("gid", g) in self._find() for g in _groups_of(writer[1]))


def _stat(path: str, follow: bool, cache: "dict[tuple[bool, str], os.stat_result]") -> os.stat_result:
    """``path``'s stat (``follow``) or lstat, from ``cache`` where it holds it: a path's lstat is its stat
    too where it names no symbolic link (each directory on the way to a file is asked both ways)."""
    key = (follow, path)
    if key not in cache:
        seen = cache.get((False, path)) if follow else None
        cache[key] = seen if seen is not None and not stat.S_ISLNK(seen.st_mode) else (
            os.stat(path) if follow else os.lstat(path))
    return cache[key]


def _groups_of(uid: int) -> "tuple[int, ...]":
    """The groups account ``uid`` is in (its primary group included); () when it has no entry."""
    import pwd

    try:
        pw = pwd.getpwuid(uid)
        return tuple(os.getgrouplist(pw.pw_name, pw.pw_gid))
    except (KeyError, OSError):
        return ()


def _lookups(path: str, cache: "dict[tuple[bool, str], os.stat_result]"
             ) -> "tuple[str, list[tuple[str, str, os.stat_result]]]":
    """(the real path, every directory entry the kernel looks up to reach ``path``: the directory, the
    entry's path, the entry's lstat), following symbolic links as path resolution does (a link's target
    is looked up from the directory holding the link; ``..`` is the parent of the real directory
    reached). Raises OSError when an entry cannot be examined, and ELOOP past 40 links as the kernel does."""
    pending = [p for p in reversed(path.split("/"))]
    cur, out, links = "/", [], 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            cur = os.path.dirname(cur)
            continue
        entry = os.path.join(cur, name)
        st = _stat(entry, False, cache)
        out.append((cur, entry, st))
        if stat.S_ISLNK(st.st_mode):
            links += 1
            if links > 40:
                import errno  # only here: importing it costs a flagged start about 0.24 million instructions

                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), path)
            target = os.readlink(entry)
            cur = "/" if target.startswith("/") else cur
            pending.extend(reversed(target.split("/")))
        else:
            cur = entry
    return cur, out


def _grants(component: str, note: str, st: os.stat_result) -> "dict[Writer, Grant]":
    """Who can write the inode ``st`` of ``component`` (a directory: add, rename and remove its entries);
    ``note`` says what the component is to the file judged ("" for the file itself)."""
    out = {("uid", st.st_uid): Grant(component, note)}
    if st.st_mode & stat.S_IWGRP:
        out[("gid", st.st_gid)] = Grant(component, note, st.st_mode)
    if st.st_mode & stat.S_IWOTH:
        out[EVERYONE] = Grant(component, note, st.st_mode)
    return out


def writers(path: str, cache: "dict[tuple[bool, str], os.stat_result] | None" = None) -> "dict[Writer, Grant]":
    """Everyone who can change what ``path`` holds, each with the first component (leaf first) that
    lets them. ``cache`` keeps stat results between calls. Raises OSError when a component cannot be
    examined."""
    cache = {} if cache is None else cache
    if not os.path.isabs(path):
        path = os.path.join(os.getcwd(), path)
    real, lookups = _lookups(path, cache)
    found: "list[dict[Writer, Grant]]" = [_grants(real, "", _stat(real, True, cache))]
    for directory, entry, st in reversed(lookups):
        dst = _stat(directory, True, cache)
        note = "the directory holding " + os.path.basename(entry)
        if dst.st_mode & stat.S_ISVTX:  # sticky: only the directory's and the entry's owners may replace it
            grants = {("uid", dst.st_uid): Grant(directory, note), ("uid", st.st_uid): Grant(entry)}
        else:
            grants = _grants(directory, note, dst)
        found.append(grants)
    out: "dict[Writer, Grant]" = {}
    for grants in found:
        for who, grant in grants.items():
            out.setdefault(who, grant)
    return out


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
        found = writers(path, trusted.stats)
    except OSError as exc:
        import errno

        loop = exc.errno == errno.ELOOP  # a chain of links longer than the kernel follows (40), or a loop
        return Refusal(CAUSE_UNCHECKED, f"cannot check who can write {path} ({exc.strerror or exc})",
                       "name the file itself, or through fewer symbolic links" if loop else
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
