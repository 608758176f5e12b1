"""How this package composes search-path values, and which characters ld.so cannot take in them.

``LD_PRELOAD`` is split by ld.so on spaces and colons with no escaping (elf/rtld.c); its rules
(:func:`split_preload`, :func:`compose_preload`) live in the start-up module, which needs them in
every child of a hooked process, and are re-exported here.
"""

from . import compose_preload, is_tms_entry, split_preload

__all__ = ["split_preload", "is_tms_entry", "compose_preload", "prepend_search_path", "LD_UNSAFE_CHARS"]

# Characters ld.so cannot take inside one LD_PRELOAD / LD_LIBRARY_PATH entry.
LD_UNSAFE_CHARS = frozenset(" :\t\n;")


def prepend_search_path(current: str, directory: str) -> str:
    """``directory`` first on a colon list such as LD_LIBRARY_PATH, without duplicating it."""
    rest = [e for e in current.split(":") if e != directory] if current else []
    return ":".join([directory, *rest])
