# Written by tools/pthfile.py from the tms_autopreload package's source; do not edit.
"""The start of a process whose tms_autopreload package is gone (tms_autopreload/leftover.py)."""

import json
import os
import sys
from urllib.parse import unquote, urlsplit

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from types import FrameType
    from typing import Any


SLIME_FLAG = "SLIME_OFFLOAD_TRAIN"  # slime's: the hook, plus SLIME_DEFAULTS
GENERIC_FLAG = "TMS_AUTOPRELOAD"  # the hook only
FLAG_VARS = (SLIME_FLAG, GENERIC_FLAG)
DISABLE_VAR = "TMS_AUTOPRELOAD_DISABLE"
NO_HOOK = f"env {DISABLE_VAR}=1"
VERBOSE_VAR = "TMS_AUTOPRELOAD_VERBOSE"
ON_ERROR_VAR = "TMS_AUTOPRELOAD_ON_ERROR"
ON_ERROR_POLICIES = ("exit", "warn")
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


_S_IFMT, _S_IFREG = 0o170000, 0o100000
_NOT_REGULAR = {0o040000: "a directory", 0o010000: "a FIFO", 0o140000: "a socket", 0o020000: "a character device",
                0o060000: "a block device"}
_EINVAL = 22


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


def _location(url: str) -> str:
    parts = urlsplit(url)
    return unquote(parts.path) if parts.scheme == "file" and parts.netloc in ("", "localhost") else url


def local_path(record: "dict[str, Any]") -> "str | None":
    url = record["url"]
    return _location(url) if urlsplit(url).scheme == "file" and not record.get("vcs_info") else None


def source_gone(record: "dict[str, Any]") -> bool:
    path = local_path(record)
    return path is not None and not os.path.exists(path)


def source_args(record: "dict[str, Any]") -> "list[str] | None":
    url = record["url"]
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and isinstance(vcs.get("vcs"), str):
        spec = f"{vcs['vcs']}+{url}"
        revision = vcs.get("commit_id") or vcs.get("requested_revision")
        if isinstance(revision, str) and revision:
            spec += f"@{revision}"
        if isinstance(record.get("subdirectory"), str):
            spec += f"#subdirectory={record['subdirectory']}"
        return [spec]
    if isinstance(record.get("dir_info"), dict):
        path = _location(url)
        if isinstance(record.get("subdirectory"), str):
            path = f"{path.rstrip('/')}/{record['subdirectory']}"
        return ["-e", path] if record["dir_info"].get("editable") else [path]
    if isinstance(record.get("archive_info"), dict):
        return [_location(url)]
    return None


def pip_refusal(site: str) -> "str | None":
    import sysconfig

    real = os.path.realpath(site)
    if real in {os.path.realpath(sysconfig.get_path(p)) for p in ("stdlib", "platstdlib")}:
        return "in the standard library directory"
    if sys.prefix != sys.base_prefix and not real.startswith(os.path.realpath(sys.prefix) + os.sep):
        return "outside this environment"
    return None


def _user_site(site: str) -> bool:
    import site as site_module

    user = site_module.getusersitepackages()
    return bool(user) and os.path.realpath(site) == os.path.realpath(user)


def _externally_managed() -> "str | None":
    if sys.prefix != sys.base_prefix:
        return None
    import sysconfig

    marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
    return marker if os.path.isfile(marker) else None


def _not_writable(site: str) -> "str | None":
    if os.access(site, os.W_OK):
        return None
    try:
        import pwd

        owner = pwd.getpwuid(os.stat(site).st_uid).pw_name
    except (OSError, KeyError):
        owner = "its owner"
    return f"{site} is not writable by this account (it belongs to {owner}): run it as {owner}"


def where(verb: str, site: "str | None", reinstall: bool,
          beside: "str | None" = None) -> "tuple[list[str], list[str]]":
    words: "list[str]" = []
    options: "list[str]" = ["--force-reinstall"] if reinstall and verb == "install" else []
    if verb == "install" and site is not None:
        if pip_refusal(site):
            options += ["--target", site, "--upgrade"]
        elif _user_site(site):
            options.append("--user")
        blocked = None if "--target" in options else _not_writable(site)
        if blocked:
            words.append(blocked)
    elif verb == "install" and beside is not None and _user_site(beside):
        options.append("--user")
    marker = _externally_managed() if verb == "install" and "--target" not in options else None
    if marker is not None:
        options.append("--break-system-packages")
        words.insert(0, f"this interpreter is marked externally managed ({marker}, PEP 668), so pip installs for "
                        f"it only when told to (or use a venv)")
    return words, options


def pip_form(exe: str, verb: str, options: "list[str]", args: "list[str]", has_pip: bool, uv: bool,
             has_ensurepip: bool) -> str:
    import shlex

    # pip's own variable, not its option, where the interpreter is externally managed: ensurepip obeys it too.
    unmanaged = ["PIP_BREAK_SYSTEM_PACKAGES=1"] if "--break-system-packages" in options else []

    def line(*words: str) -> str:
        return " ".join([NO_HOOK, *(unmanaged if words[0] != "uv" else []), *map(shlex.quote, words)])

    own = (["-y"] if verb == "uninstall" else []) + [o for o in options if o != "--break-system-packages"]
    pip = line(exe, '-m', 'pip', verb, *own, *args)
    if has_pip:
        return f"`{pip}`"
    user = "--user" in options  # uv has no user site ("pip's `--user` is unsupported"): pip's command only
    uv_options = ["--reinstall" if o == "--force-reinstall" else o for o in options]
    if uv and not user:
        return f"`{line('uv', 'pip', verb, '--python', exe, *uv_options, *args)}`"
    if has_ensurepip and not unmanaged:  # ensurepip drops every PIP_ variable, so it obeys PEP 668's marker
        # pip itself goes where the install goes: the user site is this account's, the prefix may not be.
        return f"`{line(exe, '-m', 'ensurepip', *(['--user'] if user else []))} && {pip}`"
    then = pip if user else line('uv', 'pip', verb, '--python', exe, *uv_options, *args)
    return (f"{exe} has neither pip nor ensurepip (a distribution's interpreter without its pip package): install "
            f"your distribution's pip for it (Debian: python3-pip){'' if user else ' or uv'}, then `{then}`")


def _uv_on_path() -> bool:
    import shutil

    return shutil.which("uv") is not None


def _has_ensurepip() -> bool:
    return os.path.isdir(os.path.join(os.path.dirname(os.__file__), "ensurepip"))


PTH = "tms_autopreload.pth"
START = "_tms_autopreload_start"
FALLBACK = "_tms_autopreload_left_over"
START_UP_FILES = (PTH, f"{START}.py", f"{FALLBACK}.py")
EXIT_CONFIG = 78  # EX_CONFIG (sysexits.h): no preload plan, or the re-exec did not take


def parse_choice(name: str, value: "str | None", choices: "tuple[str, ...]") -> "tuple[str, str | None]":
    if value is None:
        return choices[0], None
    word = value.strip().lower()
    if not word or word in choices:
        return word or choices[0], None
    return choices[0], unrecognised(name, value, " or ".join(choices), choices[0])


def processed_pth(default: str) -> str:
    frame: "FrameType | None" = sys._getframe()
    while frame is not None:
        fullname = frame.f_locals.get("fullname")
        if frame.f_code.co_filename.rpartition("/")[2] in ("site.py", "<frozen site>") and isinstance(fullname, str):
            return fullname
        frame = frame.f_back
    return default


def shell_way_out() -> str:
    flags = " ".join(name for name in FLAG_VARS if name in os.environ)
    return (f"To run a command here without the hook: `{NO_HOOK} COMMAND` (every printed fix starts so), or "
            f"`unset {flags}` (or export {DISABLE_VAR}=1) for the rest of this shell.")


def way_out() -> str:
    lines = [shell_way_out()]
    node = os.uname().nodename
    if os.path.basename(sys.argv[0] if sys.argv else "") == "default_worker.py":
        lines.append(f"This process is a Ray worker on node {node}: run the fix there, for {sys.executable} (the "
                     f"environment Ray starts that node's workers from); `tms-autopreload doctor --ray` checks every "
                     f"node.")
    elif os.environ.get("SLURM_JOB_ID"):
        node = os.environ.get("SLURMD_NODENAME") or node
        lines.append(f"This process is a step of Slurm job {os.environ['SLURM_JOB_ID']} on node {node}: run the fix "
                     f"there, for {sys.executable} (for example `srun --jobid {os.environ['SLURM_JOB_ID']} -w {node} "
                     f"--overlap COMMAND`).")
    return "\n".join(lines)


def _record(site: str) -> "dict[str, object] | None":
    try:
        infos = [n for n in os.listdir(site) if n.startswith("tms_autopreload-") and n.endswith(".dist-info")]
        with open(os.path.join(site, *infos[:1], "direct_url.json"), "rb") as f:
            record = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return record if len(infos) == 1 and isinstance(record, dict) and isinstance(record.get("url"), str) else None


def _pip_found(site: str) -> bool:
    dirs = [site, *sys.path]
    if sys.prefix == sys.base_prefix:
        import site as site_module

        dirs += site_module.getsitepackages()
    return any(os.path.isdir(os.path.join(d, "pip")) for d in dirs if d)


def removal(pth: str) -> str:
    import shlex

    site = os.path.dirname(pth)
    files = [pth, *(os.path.join(site, name) for name in START_UP_FILES[1:])]
    return " ".join([NO_HOOK, "rm", "-f", "--", *map(shlex.quote, files)])


def _again(python: str, options: "list[str]", editable: bool) -> str:
    source = "from where its checkout is now, in editable mode (pip's -e)" if editable else \
        "from your wheel or checkout"
    return (f"to hook {python} again, install tms-autopreload for it {source}, with pip's {' '.join(options)}; "
            f"it is not on the package index")


def fix(pth: str, read: bool = True) -> str:
    site = os.path.dirname(pth)
    words, options = where("install", site if read else None, True)
    record = _record(site)
    args = source_args(record) if record is not None else None
    editable = args is not None and args[:1] == ["-e"]
    if record is not None and args and not source_gone(record):
        facts = (_pip_found(site), _uv_on_path(), _has_ensurepip())
        fix = (f"{pip_form(sys.executable, 'install', options, args, *facts)}; or remove the start-up files "
               f"(`{removal(pth)}`)")
    else:
        why = ("nothing records where this copy came from" if record is None else
               "its record names no source pip installs from" if not args else
               f"its editable checkout {local_path(record)} is gone (moved or deleted)" if editable else
               f"the source it was installed from, {local_path(record)}, is gone")
        fix = f"`{removal(pth)}` ({why}: {_again(sys.executable, options, editable)})"
    return f"{'; '.join(words)}: {fix}" if words else fix


def left_over(pth: str) -> None:
    if sys.platform != "linux" or hasattr(sys, "tms_autopreload_left_over"):
        return  # said once: in a venv site.py runs this file twice (3.10-3.14)
    program = unhooked_program()
    if program is not None:
        if program != COMMAND:
            os.environ[DISABLE_VAR] = "1"  # for its children, as the package does
        return
    if not flags(warn=False)[0]:
        return  # a misspelt flag is the package's to warn about, where it is installed
    stop(pth, "the tms_autopreload package it starts cannot be imported")


def stop(pth: str, why: str) -> None:
    sys.tms_autopreload_left_over = pth  # type: ignore[attr-defined]  # a mark of this start: said once
    warn = parse_choice(ON_ERROR_VAR, os.environ.get(ON_ERROR_VAR), ON_ERROR_POLICIES)[0] == "warn"
    message = (f"tms-autopreload: {pth} is left over: {why}, so this process is not hooked. Fix: {fix(pth)}"
               + (f"; continuing without the hook ({ON_ERROR_VAR}=warn)" if warn else f"\n{way_out()}") + "\n")
    os.write(2, message.encode("utf-8", "surrogateescape"))
    if not warn:
        os._exit(EXIT_CONFIG)  # EX_CONFIG, as the package stops; a SystemExit here would abort start-up


left_over(processed_pth(os.path.join(os.path.dirname(__file__), 'tms_autopreload.pth')))
