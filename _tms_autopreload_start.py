# Written by tools/pthfile.py from the tms_autopreload package's source; do not edit.
"""tms_autopreload's start-up entry, imported by tms_autopreload.pth where a flag is set:
tms_autopreload.startup.process_startup with what it uses, copied here (imported from the checkout in an
editable install), so that a start with nothing to do imports no module of the package."""

# The entry, copied from the package (an editable install imports it instead):
import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


SLIME_FLAG = "SLIME_OFFLOAD_TRAIN"  # slime's: the hook, plus SLIME_DEFAULTS
GENERIC_FLAG = "TMS_AUTOPRELOAD"  # the hook only
FLAG_VARS = (SLIME_FLAG, GENERIC_FLAG)
DISABLE_VAR = "TMS_AUTOPRELOAD_DISABLE"
VERBOSE_VAR = "TMS_AUTOPRELOAD_VERBOSE"
CUDA_MAJOR_VAR = "TMS_AUTOPRELOAD_CUDA_MAJOR"
PATH_VAR = "TMS_AUTOPRELOAD_PATH"
STATE_VAR = "TMS_AUTOPRELOAD_STATE"
EXEC_VAR = "TMS_AUTOPRELOAD_EXEC_PID"
SLIME_DEFAULTS = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}
STARTED = "tms_autopreload_started"
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


def parse_flag(name: str, value: "str | None", unknown: bool = False) -> "tuple[bool, str | None]":
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
    return f"{name}={value!r} is not a recognised value (use {accepted}); using {used}"


def say(message: str) -> None:
    try:
        if sys.stderr is not None:
            sys.stderr.flush()
        os.write(2, ("tms-autopreload: " + message.rstrip("\n") + "\n").encode("utf-8", "replace"))
    except (OSError, ValueError):
        pass


TMS_WORDS = "torch_memory_saver"  # what torch_memory_saver's own preload check looks for in LD_PRELOAD


def is_tms_entry(entry: str) -> bool:
    return TMS_WORDS in entry


def split_preload(value: str) -> "list[str]":
    return [e for e in value.replace(" ", ":").split(":") if e]


def compose_preload(current: str, hook: str) -> str:
    kept = [e for e in split_preload(current) if not is_tms_entry(e)]
    return ":".join([hook, *kept])


_S_IFMT, _S_IFREG = 0o170000, 0o100000
_NOT_REGULAR = {0o040000: "a directory", 0o010000: "a FIFO", 0o140000: "a socket", 0o020000: "a character device",
                0o060000: "a block device"}
_EINVAL = 22
MAPS_LIMIT = 64 << 20  # far above any real /proc/self/maps (a process with torch loaded: under 1 MiB)


def open_regular(path: str) -> int:
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
    try:
        data = read_regular("/proc/self/maps", MAPS_LIMIT + 1)
    except OSError:
        return b""
    return b"" if len(data) > MAPS_LIMIT else data


def _maps_path(line: bytes) -> "str | None":
    fields = line.split(None, 5)
    return fields[5].decode("utf-8", "surrogateescape") if len(fields) == 6 and fields[5][:1] == b"/" else None


def _line_at(data: bytes, at: int) -> "tuple[int, int]":
    end = data.find(b"\n", at)
    return data.rfind(b"\n", 0, at) + 1, len(data) if end < 0 else end


def _mapped_as(data: bytes, planned: str) -> "str | None":
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
    if environ is not None:
        return environ.get(EXEC_VAR) == str(os.getpid())
    try:
        with open("/proc/self/environ", "rb") as f:
            started = f.read().split(b"\0")
    except OSError:
        return False
    return f"{EXEC_VAR}={os.getpid()}".encode() in started


def state_key(build: str, env: "Mapping[str, str] | None" = None) -> str:
    env = os.environ if env is None else env
    return "::".join((sys.prefix, env.get(CUDA_MAJOR_VAR, ""), env.get(PATH_VAR, ""), build))


def state_build(env: "Mapping[str, str] | None" = None) -> "str | None":
    env = os.environ if env is None else env
    state, head = env.get(STATE_VAR, ""), state_key("", env)
    return state[len(head):] or None if state.startswith(head) else None


def kill_switch(env: "Mapping[str, str] | None" = None) -> "tuple[bool, str | None]":
    return parse_flag(DISABLE_VAR, (os.environ if env is None else env).get(DISABLE_VAR), unknown=True)


def flag_values(env: "Mapping[str, str] | None" = None) -> "dict[str, tuple[bool, str | None]]":
    env = os.environ if env is None else env
    return {DISABLE_VAR: kill_switch(env),
            **{name: parse_flag(name, env.get(name)) for name in (*FLAG_VARS, VERBOSE_VAR)}}


def flags(env: "Mapping[str, str] | None" = None, warn: bool = True) -> "tuple[bool, bool]":
    values = flag_values(env)
    for _, warning in values.values():
        if warning and warn:
            say("warning: " + warning)
    if values[DISABLE_VAR][0]:
        return False, False
    slime, generic = values[SLIME_FLAG][0], values[GENERIC_FLAG][0]
    return slime or generic, slime


def _names(entry: str, path: str) -> bool:
    return entry == path or entry == os.path.basename(path) or same_file(entry, path)


def same_file(a: "str | None", b: "str | None") -> bool:
    if not a or not b:
        return False
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def inherited_hook(mapped: "list[str]", planned: "str | None") -> "tuple[str, str] | None":
    if planned is None or mapped != [planned]:
        return None  # none, another, or two builds fighting over the same symbols: resolve
    path = planned
    env = os.environ
    preload = env.get("LD_PRELOAD", "")
    named = [e for e in split_preload(preload) if is_tms_entry(e)]
    if not named or not all(_names(e, path) for e in named):
        return None
    return path, compose_preload(preload, named[0])


COMMAND = "tms-autopreload"  # the console script (pyproject.toml); also ``python -m tms_autopreload``
_SCRIPTS = {COMMAND: (b"from tms_autopreload.commands.main import", b"from tms_autopreload.cli import"),
            "pip": (b"from pip",), "virtualenv": (b"from virtualenv",)}
_MODULES = {"tms_autopreload": COMMAND, "tms_autopreload.__main__": COMMAND, "pip": "pip", "pip.__main__": "pip",
            "ensurepip": "ensurepip", "venv": "venv", "virtualenv": "virtualenv"}
_SCRIPT_FILES = {"__pip-runner__.py": "pip"}
_COMMANDS = {"from python.get_interpreter_info import main; main()": "uv"}


def _script_name(name: str) -> str:
    return "pip" if name[:3] == "pip" and name[3:].replace(".", "").isdigit() else name


def original_argv() -> "list[str]":
    orig: "list[str] | None" = getattr(sys, "orig_argv", None)
    if orig is not None:
        return orig
    try:
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(arg) for arg in f.read().split(b"\0")[:-1]]
    except OSError:
        return []


def unhooked_program(argv: "list[str] | None" = None, orig_argv: "list[str] | None" = None) -> "str | None":
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


def process_startup() -> None:
    if getattr(sys, STARTED, False):  # the package's entry or the start module's copy of it ran
        return
    setattr(sys, STARTED, True)
    env = os.environ
    if sys.platform != "linux" or not any(env.get(name) for name in FLAG_VARS):
        return
    program = unhooked_program()
    if program is not None:
        if program != COMMAND:
            env[DISABLE_VAR] = "1"  # for its children: a build backend, the pip that ensurepip starts
        return
    try:
        on, slime = flags(warn=not reexecuted(env))  # said once, before the exec
        if not on:
            return
        if slime:
            for name, value in SLIME_DEFAULTS.items():
                env.setdefault(name, value)
        planned = state_build()
        maps = read_maps()
        mapped = mapped_hooks(planned, maps)
        inherited = inherited_hook(mapped, planned)
        if inherited is not None:
            path, preload = inherited
            rewritten = preload != env.get("LD_PRELOAD")
            if rewritten:
                env["LD_PRELOAD"] = preload
            env.pop(EXEC_VAR, None)
            if parse_flag(VERBOSE_VAR, env.get(VERBOSE_VAR))[0]:
                say(f"{_shown(path)} is mapped (resolved for this interpreter); "
                    + (f"LD_PRELOAD rewritten as {preload}" if rewritten else "nothing to do"))
            return
    except Exception:  # noqa: BLE001 - the full path below reports anything, without a traceback
        maps = None
    from tms_autopreload.startup import run  # by its absolute name: the start module runs a copy of this

    run(maps or None)  # an empty read (no /proc) is tried again there


def _shown(path: str) -> str:
    try:
        from tms_autopreload.builds import shown_path
    except ImportError:
        return path
    return shown_path(path)


# The call.
try:
    process_startup()
except ModuleNotFoundError as exc:  # work to do, and no package: its .pth left over; say so once, with the fix
    if exc.name != "tms_autopreload" and not (exc.name or "").startswith("tms_autopreload."):
        raise
    import _tms_autopreload_left_over  # noqa: F401 - it runs on import
