"""The environment's rules: what the package reads from a process's environment and writes into it.

The variable names and the words a flag takes, and how a flag's value is read; ``LD_PRELOAD`` as ld.so
splits it and as this package writes it, ``LD_LIBRARY_PATH`` likewise, the record of what a plan added to
them (``TMS_AUTOPRELOAD_ADDED``) and the kernel's limit on one environment string; the state record a
resolved environment carries; the kill switch; the programs never hooked; the inherited-child shortcut;
reading ``/proc/self/maps`` and opening files without blocking.

It uses ``os`` and ``sys`` alone and imports nothing of the package: the start-up entry
(:func:`tms_autopreload.startup.process_startup`) needs these rules in every flagged process of a node,
and tools/pthfile.py copies those it reaches from here into ``_tms_autopreload_start.py``, the module
``tms_autopreload.pth`` imports, so that a hooked child imports no module of the package at all.

Private, like every module of the package: these rules serve the hook and the commands, and may change in
any release.
"""

import os
import sys

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Mapping

# The two flags (tms_autopreload.pth spells them out too: it must stay one line of os alone).
SLIME_FLAG = "SLIME_OFFLOAD_TRAIN"  # slime's: the hook, plus SLIME_DEFAULTS
GENERIC_FLAG = "TMS_AUTOPRELOAD"  # the hook only
FLAG_VARS = (SLIME_FLAG, GENERIC_FLAG)
DISABLE_VAR = "TMS_AUTOPRELOAD_DISABLE"
# What makes a command run unhooked in any shell, flag exported or not (``env`` runs in csh too): every
# command the package prints starts so (tms_autopreload.installer), and every stop says so.
NO_HOOK = f"env {DISABLE_VAR}=1"
VERBOSE_VAR = "TMS_AUTOPRELOAD_VERBOSE"
# The two overrides the resolver reads (a resolution depends on them, so the state key does too).
CUDA_MAJOR_VAR = "TMS_AUTOPRELOAD_CUDA_MAJOR"
PATH_VAR = "TMS_AUTOPRELOAD_PATH"
# How the start-up hook applies a plan: "exec" (re-exec once, the default) or "dlopen" (in-process).
MODE_VAR = "TMS_AUTOPRELOAD_MODE"
MODES = ("exec", "dlopen")
# What a flagged start does when no plan can be applied: "exit" (EX_CONFIG, the default) or "warn".
ON_ERROR_VAR = "TMS_AUTOPRELOAD_ON_ERROR"
ON_ERROR_POLICIES = ("exit", "warn")
# Written by the hook: what this environment was resolved for, and the PID that re-exec'd.
STATE_VAR = "TMS_AUTOPRELOAD_STATE"
EXEC_VAR = "TMS_AUTOPRELOAD_EXEC_PID"
# Written wherever a plan is applied: the entries it added (:func:`added_record`).
ADDED_VAR = "TMS_AUTOPRELOAD_ADDED"
# Every variable of the package's own, each a row of docs/reference.md's table. The fuzz targets and that
# table are checked against this tuple, and the tuple against the package's source, so that a new
# variable cannot go unfuzzed or undocumented.
OWN_VARS = (*FLAG_VARS, DISABLE_VAR, VERBOSE_VAR, CUDA_MAJOR_VAR, PATH_VAR, MODE_VAR, ON_ERROR_VAR, STATE_VAR,
            EXEC_VAR, ADDED_VAR)
# What slime's actor_group.py sets next to LD_PRELOAD today.
SLIME_DEFAULTS = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
# Where the start-up entry marks that it ran in this process (:func:`tms_autopreload.startup.process_startup`).
STARTED = "tms_autopreload_started"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})

def parse_flag(name: str, value: "str | None", unknown: bool = False) -> "tuple[bool, str | None]":
    """(is it on, a warning) for a boolean variable; an unknown spelling means ``unknown``, with a warning.

    Off (``False``) for every flag that turns something on; the kill switch passes ``True``
    (:func:`kill_switch`), so that a typo there fails safe.
    """
    if value is None:
        return False, None
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True, None
    if word in FALSE_WORDS:
        return False, None
    return unknown, unrecognised(name, value, "1/true/yes/on or 0/false/no/off",
                                 "on (the hook is off)" if unknown else "off")


def unrecognised(name: str, value: str, accepted: str, used: str) -> str:
    """The one wording of a warning about a variable's unknown value."""
    return f"{name}={value!r} is not a recognised value (use {accepted}); using {used}"


def say(message: str) -> None:
    """One message on fd 2, prefixed (sys.stderr may be None or replaced this early)."""
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.write(2, ("tms-autopreload: " + message.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except (OSError, ValueError):
        pass


TMS_WORDS = "torch_memory_saver"  # what torch_memory_saver's own preload check looks for in LD_PRELOAD


def is_tms_entry(entry: str) -> bool:
    """An LD_PRELOAD entry or mapped path that is (any) torch_memory_saver build, as its own Python side
    recognises one: the words ``torch_memory_saver`` anywhere in the path. 0.0.10's check counts every
    ``:``-separated entry that holds them and wants exactly one; 0.0.8 to 0.0.9.post1 look for them in the
    whole value. The one answer to "is this a torch_memory_saver build" for every LD_PRELOAD entry and
    every name of a file: a build on a path without the words is refused by its check, so by this package
    too (a forced path: :func:`tms_autopreload.decision.survey`); a planned file mapped under another name (a
    symbolic link's target) is known by what it is (:func:`mapped_hooks`)."""
    return TMS_WORDS in entry


def split_preload(value: str) -> "list[str]":
    """LD_PRELOAD entries as ld.so reads them: space and colon separate (a tab does not), empties ignored."""
    return [e for e in value.replace(" ", ":").split(":") if e]


def compose_preload(current: str, hook: str) -> str:
    """``hook`` first, then the other entries of ``current`` in order, every torch_memory_saver entry dropped.

    The one form this package writes: colon-joined, because torch_memory_saver 0.0.10 splits only on
    ':' and wants exactly one entry naming it; hook first, because a library ahead of it would win
    symbol lookup.
    """
    kept = [e for e in split_preload(current) if not is_tms_entry(e)]
    return ":".join([hook, *kept])


# st_mode file types (sys/stat.h), named without importing ``stat`` on the start-up path.
_S_IFMT, _S_IFREG = 0o170000, 0o100000
_NOT_REGULAR = {0o040000: "a directory", 0o010000: "a FIFO", 0o140000: "a socket", 0o020000: "a character device",
                0o060000: "a block device"}
_EINVAL = 22
MAPS_LIMIT = 64 << 20  # far above any real /proc/self/maps (a process with torch loaded: under 1 MiB)


def open_regular(path: str) -> int:
    """A read-only file descriptor for ``path`` when it is a regular file; raises OSError otherwise.

    Every file this package reads is named by something outside it (a build in site-packages,
    torch's version.py, the loader's cache), and ``open()`` of a FIFO waits for a writer, forever
    if none comes. So files are opened ``O_NONBLOCK`` (which regular files ignore) and refused
    unless ``fstat`` says regular; the error's ``strerror`` says what the path is instead.
    """
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    try:
        kind = os.fstat(fd).st_mode & _S_IFMT
    except OSError:
        os.close(fd)
        raise
    if kind != _S_IFREG:
        os.close(fd)
        raise OSError(_EINVAL, f"not a regular file ({_NOT_REGULAR.get(kind, 'of an unknown type')})", path)
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """The first ``limit`` bytes of the regular file ``path`` (:func:`open_regular`); raises OSError.

    Read with ``os.read`` into bytes: a file object (``open``, ``os.fdopen``) costs more system calls
    and objects than the small files this package reads, on a path every flagged start takes.
    """
    fd = open_regular(path)
    try:
        chunks, size = [], 0
        while size < limit and (chunk := os.read(fd, min(65536, limit - size))):
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_maps() -> bytes:
    """This process's /proc/self/maps, or b"" when it cannot be read (or is implausibly large)."""
    try:
        data = read_regular("/proc/self/maps", MAPS_LIMIT + 1)
    except OSError:
        return b""
    return b"" if len(data) > MAPS_LIMIT else data


def _maps_path(line: bytes) -> "str | None":
    """The file of one /proc/self/maps line, or None (anonymous mappings, [heap], [vdso])."""
    fields = line.split(None, 5)
    return fields[5].decode("utf-8", "surrogateescape") if len(fields) == 6 and fields[5][:1] == b"/" else None


def mapped_objects() -> "list[str]":
    """Paths of the files mapped into this process, in order, once each (/proc/self/maps)."""
    seen: "dict[str, None]" = {}
    for line in read_maps().split(b"\n"):  # not splitlines: a path may hold \r
        path = _maps_path(line)
        if path is not None:
            seen.setdefault(path, None)
    return list(seen)


def _line_at(data: bytes, at: int) -> "tuple[int, int]":
    """(start, end) of the line of ``data`` that holds offset ``at``."""
    end = data.find(b"\n", at)
    return data.rfind(b"\n", 0, at) + 1, len(data) if end < 0 else end


def _mapped_as(data: bytes, planned: str) -> "str | None":
    """The path under which /proc/self/maps (``data``) shows the file ``planned`` names, or None.

    Known by what it is, as the loader knows an object it has loaded: the device and inode each maps line
    gives (``major:minor inode``, in hex and decimal), so that a symbolic link, a second hard link or a
    non-normalised spelling is the same file. Its resolved path too, where a file system shows another
    device in maps than ``stat`` gives (overlayfs): resolved (a ``lstat`` per component) only where maps
    names a file of that name, which it does not in a first start, or where the name is a symbolic link.
    """
    try:
        st = os.stat(planned)
    except OSError:
        return None
    needle = f" {os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x} {st.st_ino} ".encode()
    at = data.find(needle)
    if at < 0 and (os.path.basename(planned).encode("utf-8", "surrogateescape") in data or os.path.islink(planned)):
        real = os.path.realpath(planned).encode("utf-8", "surrogateescape")
        at = data.find(b" " + real + b"\n")
        if at < 0 and data.endswith(b" " + real):
            at = len(data) - len(real)
    if at < 0:
        return None
    start, end = _line_at(data, at)
    return _maps_path(data[start:end])


def mapped_hooks(planned: "str | None" = None, maps: "bytes | None" = None) -> "list[str]":
    """Paths of torch_memory_saver objects mapped into this process, from /proc/self/maps: each file whose
    path holds its name (:func:`is_tms_entry`), and the file ``planned`` names, whatever its mapped name,
    given as ``planned`` (:func:`_mapped_as`). ``maps``: the file as read earlier (:func:`read_maps`), where
    nothing can have been mapped since; by default it is read now (the kernel writes it out on each read:
    about 60 microseconds).

    Only lines naming torch_memory_saver, or the planned file's, are cut out and parsed: this runs in every
    child of a hooked process, and /proc/self/maps holds a hundred other lines.
    """
    data = read_maps() if maps is None else maps
    found: "list[str]" = []
    planned_as = _mapped_as(data, planned) if planned else None
    if planned_as is not None and planned:
        found.append(planned)
    at = data.find(TMS_WORDS.encode())
    while at >= 0:
        start, end = _line_at(data, at)
        path = _maps_path(data[start:end])
        if path is not None and is_tms_entry(path) and path not in found and path != planned_as:
            found.append(path)
        at = data.find(TMS_WORDS.encode(), end)
    return found


def reexecuted(environ: "Mapping[str, str] | None" = None) -> bool:
    """Whether the start-up hook re-exec'd this process image: :data:`EXEC_VAR` names this PID.

    The hook writes the marker just before its one exec, and an exec keeps the PID, so a marker that
    names another PID was inherited, not written for this image. ``environ``: the environment to read
    (the start-up path passes ``os.environ``, before the hook removes the marker); by default the
    environment this image started with (``/proc/self/environ``), which keeps the marker after the
    hook removed it from ``os.environ``: what a worker or a probe asks later, whatever was logged.
    """
    if environ is not None:
        return environ.get(EXEC_VAR) == str(os.getpid())
    try:
        with open("/proc/self/environ", "rb") as f:
            started = f.read().split(b"\0")
    except OSError:
        return False
    return f"{EXEC_VAR}={os.getpid()}".encode() in started


def state_key(build: str, env: "Mapping[str, str] | None" = None) -> str:
    """What a resolution depends on besides the files: this prefix and the two overrides (of ``env``,
    default this process's environment)."""
    env = os.environ if env is None else env
    return "::".join((sys.prefix, env.get(CUDA_MAJOR_VAR, ""), env.get(PATH_VAR, ""), build))


def state_build(env: "Mapping[str, str] | None" = None) -> "str | None":
    """The build :data:`STATE_VAR` of ``env`` (default: this process's) says it was resolved for, where it
    was resolved for this prefix and the overrides as they are now (:func:`state_key`); else None."""
    env = os.environ if env is None else env
    state, head = env.get(STATE_VAR, ""), state_key("", env)
    return state[len(head):] or None if state.startswith(head) else None


def kill_switch(env: "Mapping[str, str] | None" = None) -> "tuple[bool, str | None]":
    """(is TMS_AUTOPRELOAD_DISABLE on, a warning) for ``env`` (default: this process's).

    The kill switch fails safe: unset or an off word (``0``, ``false``, ``no``, ``off``, empty) leaves
    the hook alone; any other value, ``ture`` as much as ``1``, turns it off, an unknown one with a warning.
    (``tms_autopreload.pth`` mirrors this rule for a start whose package is gone.)
    """
    return parse_flag(DISABLE_VAR, (os.environ if env is None else env).get(DISABLE_VAR), unknown=True)


def flag_values(env: "Mapping[str, str] | None" = None) -> "dict[str, tuple[bool, str | None]]":
    """Each boolean a start reads (the kill switch, the flags, :data:`VERBOSE_VAR`) as :func:`parse_flag` judges
    it in ``env`` (default: this process's): (is it on, a warning)."""
    env = os.environ if env is None else env
    return {DISABLE_VAR: kill_switch(env),
            **{name: parse_flag(name, env.get(name)) for name in (*FLAG_VARS, VERBOSE_VAR)}}


def flags(env: "Mapping[str, str] | None" = None, warn: bool = True) -> "tuple[bool, bool]":
    """(hook on, slime mode) for ``env`` (default: this process's); one warning per unrecognised value of the
    booleans a start reads: the flags, the kill switch and :data:`VERBOSE_VAR` (read where a decision is said,
    by :func:`parse_flag` alone: its warning is said here, once per start, as the others')."""
    values = flag_values(env)
    for _, warning in values.values():
        if warning and warn:
            say("warning: " + warning)
    if values[DISABLE_VAR][0]:
        return False, False
    slime, generic = values[SLIME_FLAG][0], values[GENERIC_FLAG][0]
    return slime or generic, slime


def _names(entry: str, path: str) -> bool:
    """True when the LD_PRELOAD ``entry`` names the mapped file ``path``.

    The same string, the bare file name (found through LD_LIBRARY_PATH), or another spelling of the
    same file: launchers build their own path (torch_memory_saver's ``configure_subprocess()`` joins
    its package's ``__file__``), which may run through a symlinked or non-normalised directory,
    while /proc/self/maps names the file the kernel opened. Compared as the loader compares
    objects it has already loaded: by device and inode.
    """
    return entry == path or entry == os.path.basename(path) or same_file(entry, path)


def same_file(a: "str | None", b: "str | None") -> bool:
    """True when two paths name one file, as the loader decides "already loaded" (device, inode).

    One ``stat`` each instead of ``realpath``, which costs an ``lstat`` per path component.
    """
    if not a or not b:
        return False
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def inherited_hook(mapped: "list[str]", planned: "str | None") -> "tuple[str, str] | None":
    """(the mapped hook, LD_PRELOAD as this package writes it) when this environment was resolved
    for that hook here (``planned``: :func:`state_build`), it is the one mapped, and every
    torch_memory_saver entry of LD_PRELOAD names it; else None.

    A launcher may rewrite LD_PRELOAD between a hooked parent and its child: torch_memory_saver
    0.0.10's ``configure_subprocess()`` prepends its own pick, so the child gets the same build
    twice, perhaps spelled two ways. Nothing needs resolving then, but the value must be rewritten
    with one entry, or torch_memory_saver's own check refuses the child.
    """
    if planned is None or mapped != [planned]:
        return None  # none, another, or two builds fighting over the same symbols: resolve
    path = planned
    env = os.environ
    preload = env.get("LD_PRELOAD", "")
    named = [e for e in split_preload(preload) if is_tms_entry(e)]
    if not named or not all(_names(e, path) for e in named):
        return None
    return path, compose_preload(preload, named[0])



# ld.so splits LD_LIBRARY_PATH on these, with no escaping (elf/dl-load.c: _dl_init_paths, fillin_rpath).
SEARCH_PATH_SEPARATORS = ":;"
# What a directory this package puts on LD_LIBRARY_PATH may not hold: a separator, or a newline, which
# would also split the loader trace's report of it into two lines.
_SEARCH_PATH_UNSAFE = frozenset(SEARCH_PATH_SEPARATORS + "\n")
# What a path this package writes as one LD_PRELOAD entry may not hold: ld.so splits that variable on
# spaces and colons; tabs, newlines and semicolons are refused too, so that the entry also survives
# LD_LIBRARY_PATH's rules and the trace's line-based report.
LD_UNSAFE_CHARS = frozenset(" :\t\n;")


def split_search_path(value: str) -> "list[str]":
    """Split LD_LIBRARY_PATH as ld.so does: on ':' and ';'; an empty entry means the cwd."""
    if not value:
        return []
    return [p or "." for p in value.replace(";", ":").split(":")]


def search_path_unsafe(directory: str) -> bool:
    """True when ``directory`` cannot be one LD_LIBRARY_PATH entry."""
    return bool(_SEARCH_PATH_UNSAFE & set(directory))


def prepend_search_path(current: str, directory: str) -> str:
    """``directory`` first on LD_LIBRARY_PATH (``current`` split as ld.so splits it), without duplicating it."""
    rest = [e for e in split_search_path(current) if e != directory]
    return ":".join([directory, *rest])


def added_record(preload: "tuple[str, ...]", library_path: "tuple[str, ...]") -> str:
    """``TMS_AUTOPRELOAD_ADDED``'s value: the entries a plan added to ``LD_PRELOAD`` (besides its hook) and
    to ``LD_LIBRARY_PATH``, each list ':'-joined, the two joined by ';'. Neither kind of entry can hold
    either separator (the plan refuses a path that would: :data:`LD_UNSAFE_CHARS`, :func:`search_path_unsafe`)."""
    return ":".join(preload) + ";" + ":".join(library_path)


def read_added(value: str) -> "tuple[list[str], list[str]]":
    """The two lists of :func:`added_record`'s ``value``; a value from anywhere else gives what it spells,
    and never raises (empty entries are no entries)."""
    preload, _, library_path = value.partition(";")
    return [e for e in preload.split(":") if e], [e for e in library_path.split(":") if e]


# Linux's limit on one "NAME=value" string of an exec'd environment, NUL included (32
# pages): execve fails with E2BIG beyond it.
MAX_ARG_STRLEN = 32 * 4096


def env_string_size(name: str, value: str) -> int:
    return len(os.fsencode(f"{name}={value}")) + 1


COMMAND = "tms-autopreload"  # the console script (pyproject.toml); also ``python -m tms_autopreload``
# How a shell takes the plan's variables, as every message prints it: ``env`` prints nothing and fails where it
# finds no plan (or where the loader kills it: a bad LD_PRELOAD exported), and a bare ``eval "$(...)"`` would hide
# that and return 0; so the status is checked before anything is evaluated.
APPLY_ENV = f'v="$({COMMAND} env)" && eval "$v"'
# The programs a flagged start never hooks, by what site.py leaves in sys.argv while the .pth line runs.
# This package's own command: it answers for its caller's environment, which the hook would change before
# its code runs, or stop (exit 78) on the very node ``doctor`` is for. The tools a user repairs an
# environment with: a fix printed in a flagged shell must run there, and none of them needs the hook; each
# passes the kill switch to its children (pip's build backends, ``venv``'s ensurepip).
# Console scripts: the name (``pip3.12`` is ``pip``) and what the script imports (pip's, uv's and
# setuptools' launchers all write ``from MODULE import``), so that another program of the same name is hooked.
_SCRIPTS = {COMMAND: (b"from tms_autopreload.commands.main import", b"from tms_autopreload.cli import"),
            "pip": (b"from pip",), "virtualenv": (b"from virtualenv",)}
# ``-m MODULE``, as ``-m MODULE``, ``-mMODULE`` or joined to other options (``-ImMODULE``).
_MODULES = {"tms_autopreload": COMMAND, "tms_autopreload.__main__": COMMAND, "pip": "pip", "pip.__main__": "pip",
            "ensurepip": "ensurepip", "venv": "venv", "virtualenv": "virtualenv"}
# A script file by its name: what ``pip --python PY`` runs in PY (pip 22.3 and later).
_SCRIPT_FILES = {"__pip-runner__.py": "pip"}
# ``-c`` text: how uv asks an interpreter what it is (uv 0.4 to 0.13 end it so), before installing into it.
_COMMANDS = {"from python.get_interpreter_info import main; main()": "uv"}


def _script_name(name: str) -> str:
    """A console script's name as :data:`_SCRIPTS` knows it: pip's versioned names (``pip3``, ``pip3.12``) as pip."""
    return "pip" if name[:3] == "pip" and name[3:].replace(".", "").isdigit() else name


def original_argv() -> "list[str]":
    """The interpreter's own command line, as it was given (``-m`` and its module, ``-c`` and its text, which
    ``sys.argv`` has lost while site.py runs): ``sys.orig_argv``, or before Python 3.10, which has none, the
    kernel's record of it. An install forced below the package's floor still reads its own command there, so
    that ``python -m tms_autopreload`` from a flagged shell says what it says from any shell."""
    orig: "list[str] | None" = getattr(sys, "orig_argv", None)
    if orig is not None:
        return orig
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(arg) for arg in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def unhooked_program(argv: "list[str] | None" = None, orig_argv: "list[str] | None" = None) -> "str | None":
    """The program this interpreter runs when it is one a flagged start never hooks (:data:`COMMAND`, or
    the name of a repair tool: ``pip``, ``ensurepip``, ``venv``, ``virtualenv``, ``uv``); else None.

    Read as site.py leaves ``sys.argv`` while the ``.pth`` line runs: a console script's path (its name and
    what it imports), a script file's, ``-m`` with the module name cut out of ``sys.argv`` and still in
    ``sys.orig_argv`` just before the arguments they share, or ``-c`` likewise with its text. The list cannot
    be complete (poetry, pdm, a distribution's byte-compiler): docs/troubleshooting.md says how to run any
    other program without the hook.
    """
    argv = sys.argv if argv is None else argv
    if not argv:
        return None
    first = argv[0]
    if first in ("-m", "-c"):
        orig = original_argv() if orig_argv is None else orig_argv
        if len(orig) <= len(argv):
            return None
        slot = orig[-len(argv)]
        if first == "-c":
            return next((tool for text, tool in _COMMANDS.items() if slot.endswith(text)), None)
        if slot in _MODULES:
            return _MODULES[slot]
        if slot[:1] == "-" and slot[1:2] != "-" and "m" in slot:
            return _MODULES.get(slot[slot.index("m") + 1:])
        return None
    name = os.path.basename(first)
    if name in _SCRIPT_FILES:
        return _SCRIPT_FILES[name]
    markers = _SCRIPTS.get(_script_name(name))
    if markers is None:
        return None
    try:
        head = read_regular(first, 4096)
    except OSError:
        return None
    return _script_name(name) if any(m in head for m in markers) else None
