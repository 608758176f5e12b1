"""The loader's path lists: how ld.so splits ``LD_LIBRARY_PATH``, how this package adds to it, and which
characters an entry of it or of ``LD_PRELOAD`` cannot hold.

``LD_PRELOAD``'s rules (:func:`tms_autopreload.split_preload`, :func:`tms_autopreload.compose_preload`)
live in the start-up module, which needs them in every child of a hooked process.
"""

__all__ = ["split_search_path", "prepend_search_path", "search_path_unsafe", "added_record", "read_added",
           "SEARCH_PATH_SEPARATORS", "LD_UNSAFE_CHARS"]

# ld.so splits LD_LIBRARY_PATH on these, with no escaping (elf/dl-load.c: _dl_init_paths, fillin_rpath).
SEARCH_PATH_SEPARATORS = ":;"
# What a directory this package puts on LD_LIBRARY_PATH may not hold: a separator, or a newline, which
# would also split the loader trace's report of it into two lines.
_SEARCH_PATH_UNSAFE = frozenset(SEARCH_PATH_SEPARATORS + "\n")
# What a path this package writes as one LD_PRELOAD entry may not hold: ld.so splits that variable on
# spaces and colons; tabs, newlines and semicolons are refused too, so that the entry also survives
# LD_LIBRARY_PATH's rules and the trace's line-based report.
LD_UNSAFE_CHARS = frozenset(" :\t\n;")


def split_search_path(value: str) -> list[str]:
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
