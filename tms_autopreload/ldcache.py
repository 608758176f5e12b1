"""Look names up in the loader's cache, ``/etc/ld.so.cache`` (written by ``ldconfig(8)``).

Why our own reader: the usual way, ``ldconfig -p``, is a subprocess that costs several
milliseconds and prints every entry; the resolver needs two or three names in well under
one. This reads glibc's "new" cache format (``glibc-ld.so.cache1.1``, elf/cache.c and
sysdeps/generic/dl-cache.h), alone or behind the old ``ld.so-1.7.0`` table, and keeps only
entries the running interpreter's loader would accept (libc6 type, this machine's arch flag).

A name may have entries for copies in ``glibc-hwcaps/NAME/`` subdirectories too (glibc 2.33 and later:
their hwcap word holds ``DL_CACHE_HWCAP_EXTENSION`` and an index into the cache's list of NAMEs, and they come
before the plain entry). The loader takes the one whose NAME is best in its own order of the names it uses,
and the plain entry only where there is none (elf/dl-cache.c, ``search_cache``); which names it uses is
asked of the loader (``glibc_hwcaps``), and only where such an entry is met.

The cache is in the byte order of the machine that wrote it, which is the machine that reads it: its
words are read with one ``memoryview.cast``, not ``struct`` (on the start-up path, where ``_struct``
may be one more shared object to map).
"""

import sys

from .environment import read_regular
from .elf import positions

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable

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
# The hwcap word's upper half: DL_CACHE_HWCAP_EXTENSION (1 << 62) and, in its low 10 bits, the x86 ISA level
# the copy needs (dl_cache_hwcap_extension, sysdeps/x86/dl-cache.h).
_EXTENSION_HIGH = 1 << 30
_ISA_LEVEL_MASK = 0x3FF
_X86_64 = 62
# struct cache_file_new's extension_offset (from the file's start); struct cache_extension: magic, count,
# then count sections of tag, flags, offset, size (4-byte words); tag 1 lists the glibc-hwcaps NAMEs.
_EXTENSION_OFFSET_AT = 32
_EXTENSION_MAGIC = 0xEAA42174
_TAG_GLIBC_HWCAPS = 1


class LdCache:
    """Soname -> path, as the loader's cache step (ld.so(8): "/etc/ld.so.cache") would answer.

    Entries are scanned per lookup rather than decoded up front: a start-up resolve asks for
    three or four names out of hundreds.
    """

    def __init__(self, data: bytes = b"", machine: "int | None" = None,
                 hwcaps_used: "Callable[[], tuple[str, ...]]" = tuple,
                 cpu_hwcaps: "Callable[[], tuple[str, ...]]" = tuple) -> None:
        """``hwcaps_used``: the glibc-hwcaps NAMEs the loader uses, best first; ``cpu_hwcaps``: those this CPU
        runs, ``GLIBC_TUNABLES`` aside (each asked once, when needed)."""
        self._data = data
        self._machine = machine
        self._hwcaps_used = hwcaps_used
        self._cpu_hwcaps = cpu_hwcaps
        self._cpu: "tuple[str, ...] | None" = None
        self._priority: "dict[str, int] | None" = None  # NAME -> its rank in the loader's order (0: best)
        self._hwcaps_names: "list[str | None] | None" = None  # the cache's NAMEs, by index
        self._start = data.find(_MAGIC_NEW)
        self._want_arch = _ARCH_FLAG.get(machine) if machine is not None else None
        self._nlibs = 0
        if self._start >= 0 and len(data) >= self._start + _HEADER_SIZE:
            at = self._start + _NLIBS_AT
            nlibs = int.from_bytes(data[at:at + 4], sys.byteorder)
            room = (len(data) - self._start - _HEADER_SIZE) // _ENTRY_SIZE
            self._nlibs = max(0, min(nlibs, room))
        self._words: "memoryview | None" = None  # the entries, as 4-byte words, once a name is asked
        self._keys: "list[int]" = []  # each entry's key (its name's offset), once a name is asked
        self._memo: "dict[str, str | None]" = {}

    def _cstr(self, offset: int, base: "int | None" = None) -> "str | None":
        """The NUL-terminated string at ``offset`` from ``base``: the new header's start (an entry's strings)
        by default, the file's start for the glibc-hwcaps NAMEs; None where it lies outside the file."""
        base = self._start if base is None else base
        pos = base + offset
        end = self._data.find(b"\0", pos)
        if not base <= pos < len(self._data) or end < 0:
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
            self._keys = self._words[1::_ENTRY_WORDS].tolist()
        words, keys = self._words, self._keys
        hits = [i for place in places for i in positions(keys, place)]
        best: "tuple[int, str] | None" = None  # (rank, path) of the best glibc-hwcaps copy so far
        legacy = None
        for i in sorted(hits):
            flags, value, hwcap_low, hwcap_high = (words[_ENTRY_WORDS * i + j] for j in (0, 2, 4, 5))
            if flags & FLAG_TYPE_MASK != FLAG_ELF_LIBC6:
                continue
            if self._want_arch is not None and flags & FLAG_ARCH_MASK != self._want_arch:
                continue
            path = self._cstr(value)
            if path is None:
                continue
            if hwcap_high & ~_ISA_LEVEL_MASK == _EXTENSION_HIGH:
                rank = self._rank(hwcap_low, hwcap_high & _ISA_LEVEL_MASK)
                if rank is not None and (best is None or rank < best[0]):
                    best = (rank, path)
            elif best is not None:
                return best[1]  # the glibc-hwcaps entries come first; the first other one ends the search
            elif hwcap_low or hwcap_high:
                legacy = legacy or path  # a legacy hwcaps subdirectory (tls, haswell): not modelled, a last resort
            else:
                return path  # the first plain entry
        return legacy if best is None else best[1]

    def _rank(self, index: int, isa_level: int) -> "int | None":
        """Where the glibc-hwcaps NAME at ``index`` of the cache's list stands in the loader's order (0: best),
        or None where the loader does not use it (glibc_hwcaps_priority). On x86-64 a copy also needs the ISA
        level its mark names (ldconfig reads it from the library's GNU property note): level N > 0 is
        x86-64-v(N+1)'s, and the loader checks it against what the CPU runs, whatever ``GLIBC_TUNABLES``
        takes away from the subdirectories it uses (``cpu_features->isa_1``, sysdeps/x86/dl-cache.h)."""
        if self._priority is None:
            self._priority = {name: rank for rank, name in enumerate(self._hwcaps_used())}
        names = self._names()
        name = names[index] if index < len(names) else None
        if name is None or name not in self._priority:
            return None
        if isa_level and self._machine == _X86_64:
            if self._cpu is None:
                self._cpu = self._cpu_hwcaps()
            if f"x86-64-v{isa_level + 1}" not in self._cpu:
                return None
        return self._priority[name]

    def _names(self) -> "list[str | None]":
        """The cache's glibc-hwcaps NAMEs by index (cache_extension_load, sysdeps/generic/dl-cache.h): none
        where the extension is missing or malformed, as the loader then uses no such entry."""
        if self._hwcaps_names is not None:
            return self._hwcaps_names
        self._hwcaps_names = []
        data, at = self._data, self._start + _EXTENSION_OFFSET_AT
        offset = int.from_bytes(data[at:at + 4], sys.byteorder) if self._start >= 0 else 0
        if not offset or offset % 4 or offset + 8 > len(data):
            return self._hwcaps_names
        magic, count = (int.from_bytes(data[offset + k:offset + k + 4], sys.byteorder) for k in (0, 4))
        if magic != _EXTENSION_MAGIC or offset + 8 + 16 * count > len(data):
            return self._hwcaps_names
        names: "list[str | None]" = []
        for k in range(count):
            tag, _, start, size = (int.from_bytes(data[offset + 8 + 16 * k + w:offset + 12 + 16 * k + w],
                                                  sys.byteorder) for w in (0, 4, 8, 12))
            if start + size > len(data):
                return self._hwcaps_names  # the loader drops every extension then, whichever came first
            if tag == _TAG_GLIBC_HWCAPS and size and not start % 4 and not size % 4:
                names = [self._cstr(int.from_bytes(data[start + w:start + w + 4], sys.byteorder), 0)
                         for w in range(0, size, 4)]
        self._hwcaps_names = names
        return names



def load(machine: "int | None", path: str = CACHE_PATH, hwcaps_used: "Callable[[], tuple[str, ...]]" = tuple,
         cpu_hwcaps: "Callable[[], tuple[str, ...]]" = tuple) -> LdCache:
    """Read the cache at ``path``; a missing, unreadable or non-regular cache is an empty one, as for ld.so."""
    try:
        data = read_regular(path, 64 << 20)
    except OSError:
        return LdCache()
    return LdCache(data, machine, hwcaps_used, cpu_hwcaps)
