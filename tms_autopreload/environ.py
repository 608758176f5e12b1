"""The environment variables this package reads and writes, and how their values are composed.

``LD_PRELOAD`` is split by ld.so on spaces and colons with no escaping (elf/rtld.c). We always
write it colon-joined, hook first: torch_memory_saver 0.0.10 splits only on ':' and wants
exactly one entry naming it, and a library ahead of the hook would win symbol lookup.
"""

from . import is_tms_entry

__all__ = ["split_preload", "is_tms_entry", "compose_preload", "prepend_search_path", "LD_UNSAFE_CHARS"]

# Characters ld.so cannot take inside one LD_PRELOAD / LD_LIBRARY_PATH entry.
LD_UNSAFE_CHARS = frozenset(" :\t\n;")


def split_preload(value: str) -> "list[str]":
    """LD_PRELOAD entries as ld.so reads them: space and colon separate (a tab does not), empties ignored."""
    return [e for e in value.replace(" ", ":").split(":") if e]


def compose_preload(current: str, hook: str) -> str:
    """``hook`` first, then the other entries of ``current`` in order, stale hooks dropped."""
    kept = [e for e in split_preload(current) if not is_tms_entry(e)]
    return ":".join([hook, *kept])


def prepend_search_path(current: str, directory: str) -> str:
    """``directory`` first on a colon list such as LD_LIBRARY_PATH, without duplicating it."""
    rest = [e for e in current.split(":") if e != directory] if current else []
    return ":".join([directory, *rest])
