"""Look names up in the loader's cache, ``/etc/ld.so.cache`` (written by ``ldconfig(8)``).

Why our own reader: the usual way, ``ldconfig -p``, is a subprocess that costs several
milliseconds and prints every entry; the resolver needs two or three names in well under
one. This reads glibc's "new" cache format (``glibc-ld.so.cache1.1``, elf/cache.c and
sysdeps/generic/dl-cache.h), alone or behind the old ``ld.so-1.7.0`` table, and keeps only
entries the running interpreter's loader would accept (libc6 type, this machine's arch flag).

The cache is in the byte order of the machine that wrote it, which is the machine that reads it: its
words are read with one ``memoryview.cast``, not ``struct`` (on the start-up path, where ``_struct``
may be one more shared object to map).
"""

import sys

from . import read_regular

__all__ = ["CACHE_PATH", "LdCache", "load"]

CACHE_PATH = "/etc/ld.so.cache"
_MAGIC_NEW = b"glibc-ld.so.cache1.1"
# struct cache_file_new: magic and version (20 bytes), nlibs, len_strings, flags, padding, extension_offset,
# unused: 48 bytes; then nlibs entries of struct file_entry_new: flags, key, value, osversion (4 bytes
# each) and hwcap (8), six 4-byte words.
_HEADER_SIZE = 48
_NLIBS_AT = 20
_ENTRY_WORDS = 6
_ENTRY_SIZE = 4 * _ENTRY_WORDS
FLAG_TYPE_MASK = 0x00FF
FLAG_ELF_LIBC6 = 0x0003
FLAG_ARCH_MASK = 0xFF00
# e_machine -> the arch flag ldconfig writes for that machine's 64-bit (or only) ABI.
_ARCH_FLAG = {62: 0x0300, 183: 0x0A00, 3: 0x0000, 21: 0x0500, 22: 0x0600, 243: 0x1000}


class LdCache:
    """Soname -> path, as the loader's cache step (ld.so(8): "/etc/ld.so.cache") would answer.

    Entries are scanned per lookup rather than decoded up front: a start-up resolve asks for
    three or four names out of hundreds.
    """

    def __init__(self, data: bytes = b"", machine: "int | None" = None) -> None:
        self._data = data
        self._start = data.find(_MAGIC_NEW)
        self._want_arch = _ARCH_FLAG.get(machine) if machine is not None else None
        self._nlibs = 0
        if self._start >= 0 and len(data) >= self._start + _HEADER_SIZE:
            at = self._start + _NLIBS_AT
            nlibs = int.from_bytes(data[at:at + 4], sys.byteorder)
            room = (len(data) - self._start - _HEADER_SIZE) // _ENTRY_SIZE
            self._nlibs = max(0, min(nlibs, room))
        self._words: "memoryview | None" = None  # the entries, as 4-byte words, once a name is asked
        self._memo: "dict[str, str | None]" = {}

    def _cstr(self, offset: int) -> "str | None":
        pos = self._start + offset
        end = self._data.find(b"\0", pos)
        if not self._start <= pos < len(self._data) or end < 0:
            return None
        return self._data[pos:end].decode("utf-8", "surrogateescape")

    def lookup(self, soname: str) -> "str | None":
        if soname not in self._memo:
            self._memo[soname] = self._scan(soname.encode("utf-8", "surrogateescape") + b"\0")
        return self._memo[soname]

    def _scan(self, key: bytes) -> "str | None":
        """The path of the first entry for ``key`` (a name and its NUL) that this loader accepts.

        The entries whose key is that name are found from the name's places in the file: ldconfig may
        store a name as the tail of a longer string (glibc 2.32 and later share suffixes), so every
        place it occurs counts, in the order of the entries that point there."""
        data, start = self._data, self._start
        if start < 0:
            return None
        places = set()
        at = data.find(key, start)
        while at >= 0:
            places.add(at - start)
            at = data.find(key, at + 1)
        if not places:
            return None
        if self._words is None:
            base = start + _HEADER_SIZE
            self._words = memoryview(data[base:base + self._nlibs * _ENTRY_SIZE]).cast("I")
        words = self._words
        hwcaps_path = None
        for i in [i for i, k in enumerate(words[1::_ENTRY_WORDS]) if k in places]:
            flags, value, hwcap_low, hwcap_high = (words[_ENTRY_WORDS * i + j] for j in (0, 2, 4, 5))
            if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6:
                continue
            if self._want_arch is not None and flags & FLAG_ARCH_MASK != self._want_arch:
                continue
            path = self._cstr(value)
            if path is not None and not (hwcap_low or hwcap_high):
                return path  # first plain entry wins
            hwcaps_path = hwcaps_path or path  # a glibc-hwcaps subdirectory entry, if nothing else
        return hwcaps_path


def load(machine: "int | None", path: str = CACHE_PATH) -> LdCache:
    """Read the cache at ``path``; a missing, unreadable or non-regular cache is an empty one, as for ld.so."""
    try:
        data = read_regular(path, 64 << 20)
    except OSError:
        return LdCache()
    return LdCache(data, machine)
