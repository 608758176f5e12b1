"""The environment variables this package reads and writes, and how their values are composed.

``LD_PRELOAD`` is split by ld.so on spaces and colons with no escaping (elf/rtld.c). We always
write it colon-joined, hook first: torch_memory_saver 0.0.10 splits only on ':' and wants
exactly one entry naming it, and a library ahead of the hook would win symbol lookup.
"""

from __future__ import annotations

import os

__all__ = ["split_preload", "is_tms_entry", "compose_preload", "prepend_search_path",
           "FLAG_VARS", "TRUE_WORDS", "FALSE_WORDS", "parse_flag", "LD_UNSAFE_CHARS",
           "DISABLE_VAR", "VERBOSE_VAR", "ON_ERROR_VAR", "STATE_VAR", "EXEC_VAR", "SLIME_DEFAULTS"]

DISABLE_VAR = "TMS_AUTOPRELOAD_DISABLE"
VERBOSE_VAR = "TMS_AUTOPRELOAD_VERBOSE"
ON_ERROR_VAR = "TMS_AUTOPRELOAD_ON_ERROR"
# Written by the hook: what this environment was resolved for, and the PID that re-exec'd.
STATE_VAR = "TMS_AUTOPRELOAD_STATE"
EXEC_VAR = "TMS_AUTOPRELOAD_EXEC_PID"
# What slime's actor_group.py sets next to LD_PRELOAD today.
SLIME_DEFAULTS = {"TMS_INIT_ENABLE": "1", "TMS_INIT_ENABLE_CPU_BACKUP": "1"}

# Characters ld.so cannot take inside one LD_PRELOAD / LD_LIBRARY_PATH entry.
LD_UNSAFE_CHARS = frozenset(" :\t\n;")

FLAG_VARS = ("SLIME_OFFLOAD_TRAIN", "TMS_AUTOPRELOAD")
TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
FALSE_WORDS = frozenset({"", "0", "false", "no", "off"})


def parse_flag(name: str, value: str | None) -> tuple[bool, str | None]:
    """(is it on, a warning) for a boolean variable; unknown spellings are off, with a warning."""
    if value is None:
        return False, None
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True, None
    if word in FALSE_WORDS:
        return False, None
    return False, (f"{name}={value!r} is not a recognised value (use 1/true/yes/on or "
                   f"0/false/no/off); treating it as off")


def split_preload(value: str) -> list[str]:
    """LD_PRELOAD entries as ld.so reads them (space and colon separate, empties ignored)."""
    return [e for e in value.replace(" ", ":").replace("\t", ":").split(":") if e]


def is_tms_entry(entry: str) -> bool:
    """An entry that is (any) torch_memory_saver build, as its own Python side recognises one."""
    return "torch_memory_saver" in os.path.basename(entry)


def compose_preload(current: str, hook: str) -> str:
    """``hook`` first, then the other entries of ``current`` in order, stale hooks dropped."""
    kept = [e for e in split_preload(current) if not is_tms_entry(e)]
    return ":".join([hook, *kept])


def prepend_search_path(current: str, directory: str) -> str:
    """``directory`` first on a colon list such as LD_LIBRARY_PATH, without duplicating it."""
    rest = [e for e in current.split(":") if e != directory] if current else []
    return ":".join([directory, *rest])
