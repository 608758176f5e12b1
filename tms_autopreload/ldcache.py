"""Look names up in the loader's cache, ``/etc/ld.so.cache`` (written by ``ldconfig(8)``).

Why our own reader: the usual way, ``ldconfig -p``, is a subprocess that costs several
milliseconds and prints every entry; the resolver needs two or three names in well under
one. This reads glibc's "new" cache format (``glibc-ld.so.cache1.1``, elf/cache.c and
sysdeps/generic/dl-cache.h), alone or behind the old ``ld.so-1.7.0`` table, and keeps only
entries the running interpreter's loader would accept (libc6 type, this machine's arch flag).
"""

from __future__ import annotations

import struct

__all__ = ["CACHE_PATH", "LdCache", "load"]

CACHE_PATH = "/etc/ld.so.cache"
_MAGIC_NEW = b"glibc-ld.so.cache1.1"
_HEADER = struct.Struct("<20sIIB3xI12x")  # magic+version, nlibs, len_strings, flags, extension_offset
_ENTRY = struct.Struct("<iIIIQ")  # flags, key, value, osversion, hwcap
FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
# e_machine -> the arch flag ldconfig writes for that machine's 64-bit (or only) ABI.
_ARCH_FLAG = {62: 0x0300, 183: 0x0A00, 3: 0x0000, 21: 0x0500, 22: 0x0600, 243: 0x1000}


class LdCache:
    """Soname -> path, as the loader's cache step (ld.so(8): "/etc/ld.so.cache") would answer."""

    def __init__(self, entries: dict[str, str]) -> None:
        self._entries = entries

    def lookup(self, soname: str) -> str | None:
        return self._entries.get(soname)

    def __len__(self) -> int:
        return len(self._entries)


def parse(data: bytes, machine: int | None) -> LdCache:
    """Parse cache bytes; malformed data gives an empty cache (the loader ignores it too)."""
    start = data.find(_MAGIC_NEW)
    if start < 0 or len(data) < start + _HEADER.size:
        return LdCache({})
    _magic, nlibs, _len_strings, _flags, _ext = _HEADER.unpack_from(data, start)
    want_arch = _ARCH_FLAG.get(machine) if machine is not None else None
    plain: dict[str, str] = {}
    hwcaps: dict[str, str] = {}
    base = start + _HEADER.size
    nlibs = min(nlibs, max(0, (len(data) - base) // _ENTRY.size))

    def cstr(off: int) -> str | None:
        pos = start + off
        end = data.find(b"\0", pos)
        if not start <= pos < len(data) or end < 0:
            return None
        return data[pos:end].decode("utf-8", "surrogateescape")

    for i in range(nlibs):
        flags, key, value, _osv, hwcap = _ENTRY.unpack_from(data, base + i * _ENTRY.size)
        if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6:
            continue
        if want_arch is not None and flags & FLAG_ARCH_MASK != want_arch:
            continue
        name, path = cstr(key), cstr(value)
        if name is not None and path is not None:
            # First entry of a name wins; a plain entry beats a glibc-hwcaps subdirectory one.
            (hwcaps if hwcap else plain).setdefault(name, path)
    return LdCache({**hwcaps, **plain})


def load(machine: int | None, path: str = CACHE_PATH) -> LdCache:
    """Read the cache at ``path``; a missing or unreadable cache is an empty one, as for ld.so."""
    try:
        with open(path, "rb") as f:
            data = f.read(64 << 20)
    except OSError:
        return LdCache({})
    return parse(data, machine)
