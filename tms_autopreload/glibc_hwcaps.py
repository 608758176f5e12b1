"""The glibc-hwcaps subdirectories this machine's loader uses, best first, in the loader's own words.

ld.so(8), glibc 2.33 and later: a library may be installed again under ``glibc-hwcaps/NAME/`` (``x86-64-v3``,
``power10``, ``z15`` ...), and where the CPU runs NAME's code the loader maps that copy instead. Which names
it uses depends on the CPU and on ``GLIBC_TUNABLES``; rather than copy glibc's rules for every architecture,
the loader is asked. ``ld.so --help`` lists them under "Subdirectories of glibc-hwcaps directories, in
priority order:", each it uses marked "(supported, searched)". Asked only where the loader's cache holds such
a copy of a name looked up (``ldcache``): starting the loader costs a millisecond or two.
"""

import os

from . import trace

__all__ = ["parse", "used"]

_HEADING = "Subdirectories of glibc-hwcaps directories, in priority order:"
_USED = "(supported, searched)"


def parse(text: str) -> "tuple[str, ...]":
    """The names ``ld.so --help`` marks used, in its order (best first); none where it has no such list
    (glibc before 2.33, or not glibc's loader).

    The list is the indented lines after its heading, up to the first line that is not indented."""
    before, found, after = text.partition(_HEADING + "\n")
    if not found:
        return ()
    names: list[str] = []
    for line in after.split("\n"):
        if not line.startswith("  "):
            break
        name, _, marks = line.strip().partition(" ")
        if marks.strip() == _USED and name:
            names.append(name)
    return tuple(names)


def used(loader: str, env: "dict[str, str] | None" = None) -> "tuple[str, ...]":
    """The glibc-hwcaps names ``loader`` (a PT_INTERP path) uses under ``env`` (default: this process's),
    best first; none where it cannot be started or says nothing of them."""
    try:
        pid, fd = trace.spawn([loader, "--help"], dict(os.environ) if env is None else env)
    except OSError:
        return ()
    text, status = trace.collect(pid, fd)
    return parse(text) if status == 0 else ()
