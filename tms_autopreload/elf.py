"""An ELF object's dynamic section and dynamic symbol table, read without loading it.

The dynamic section (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH) and the dynamic symbol table (what the
object defines and what it needs from others).

Why our own reader: the resolver runs inside interpreter start-up with a 10 ms budget, and
pyelftools costs about 35 ms to import. This reader reads just the headers and the part of the string
table it needs (never the whole file), and bounds every count and size it takes from the file, so a
hostile or truncated file costs at most a few reads and raises :class:`ElfError`, never anything else.
Every table is decoded with ``int.from_bytes`` and ``memoryview.cast``, not ``struct``: where ``_struct`` is
an extension module (pyenv, conda), importing it maps one more shared object, about a quarter of the
instructions the flagged start-up's imports take (callgrind). A symbol table's columns are cut out whole
(every entry's name offset in one slice), not entry by entry: libcudart's has 600 entries, and dlopen
mode reads it at every start.

Layout follows the System V gABI (``elf(5)``): ELF header -> program headers -> PT_DYNAMIC ->
dynamic entries; DT_STRTAB and DT_SYMTAB are virtual addresses mapped back to file offsets through
PT_LOAD. The symbol table is read as the loader reads it, from the dynamic section (section headers
may be stripped); its length comes from DT_HASH (nchain) or, as glibc computes it, from the highest
chain of DT_GNU_HASH.
"""

import os
import sys

from . import open_regular

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Literal, TypeVar

    ByteOrder = Literal["little", "big"]
    T = TypeVar("T")

__all__ = ["ElfError", "UnreadableFile", "DynamicInfo", "Symbols", "read_dynamic", "read_symbols", "defined_among",
           "read_kind", "positions", "MACHINE_NAMES"]

PT_LOAD = 1
PT_DYNAMIC = 2
PT_INTERP = 3
DT_NULL = 0
DT_NEEDED = 1
DT_HASH = 4
DT_STRTAB = 5
DT_SYMTAB = 6
DT_STRSZ = 10
DT_SYMENT = 11
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
DT_GNU_HASH = 0x6FFFFEF5
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_HIDDEN, STV_INTERNAL = 2, 1

# Bounds on what a file may make us read: far above any real shared object.
_MAX_PHNUM = 4096
_MAX_DYN_ENTRIES = 65536
_MAX_INTERP = 4096  # PATH_MAX: the kernel reads no longer PT_INTERP
_MAX_STRTAB = 64 << 20  # libtorch_cuda.so's is 4.5 MB
_MAX_SYMBOLS = 1 << 22  # libtorch_cpu.so has about 300,000
# How far past the last wanted string offset a first read of the string table goes (a path in DT_RUNPATH
# or a soname is far shorter); a longer string is read on to the table's end.
_STRING_SPAN = 4096

MACHINE_NAMES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390", 40: "arm", 62: "x86-64",
                 183: "aarch64", 243: "riscv"}


class ElfError(ValueError):
    """The file is not a readable ELF shared object; the message says what is wrong with it. Every reader
    here raises it and nothing else for a file it cannot use, so a caller has one answer to catch."""


class UnreadableFile(ElfError):
    """The file could not be opened or read (missing, no permission, not a regular file, an I/O error): the
    message is the system's reason. Told apart from a file read and found to be no ELF object."""


def _parsed(path: str, parse: "Callable[[int], T]") -> "T":
    """``parse`` of ``path`` opened for reading (:func:`tms_autopreload.open_regular`: regular files only, no
    blocking); the one place an :class:`OSError` of a file becomes an answer, :class:`UnreadableFile`
    (packaging's ``_parse_elf`` turns both kinds of failure into one, as this does)."""
    try:
        fd = open_regular(path)
        try:
            return parse(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise UnreadableFile(exc.strerror or str(exc)) from None


class DynamicInfo:
    """What the dynamic loader reads from one object before it maps it.

    (Plain slotted classes here and elsewhere on the start-up path: ``dataclasses`` costs 11-16 ms to
    import, more than the whole resolve, ``python3 tools/bench.py --imports``.)
    """

    __slots__ = ("elf_class", "machine", "needed", "soname", "rpath", "runpath", "interpreter")

    def __init__(self, elf_class: int, machine: int, needed: tuple[str, ...], soname: str | None,
                 rpath: tuple[str, ...], runpath: tuple[str, ...], interpreter: "str | None" = None) -> None:
        self.elf_class = elf_class  # 32 or 64
        self.machine = machine  # e_machine
        self.needed = needed
        self.soname = soname
        self.rpath = rpath
        self.runpath = runpath
        self.interpreter = interpreter  # PT_INTERP: the loader a program is started by (None for a library)

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"e_machine={self.machine}")


class Symbols:
    """Names in an object's dynamic symbol table: those it defines for others (global, weak or
    unique binding, not hidden), and those it needs from others (undefined)."""

    __slots__ = ("defined", "undefined")

    def __init__(self, defined: frozenset, undefined: frozenset) -> None:
        self.defined = defined
        self.undefined = undefined


def _read_at(fd: int, size_limit: int, offset: int, size: int, what: str) -> bytes:
    """``size`` bytes of the open file ``fd`` (``size_limit`` bytes long) at ``offset``: one positioned
    read, no seek and no buffer (a resolve reads a dozen objects, a few small reads each)."""
    if offset < 0 or size < 0:
        raise ElfError(f"{what}: negative offset or size")
    if offset + size > size_limit:  # also keeps pread() from an offset past off_t
        raise ElfError(f"truncated file: {what} at offset {offset} needs {size} bytes")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ElfError(f"truncated file: {what} at offset {offset} needs {size} bytes")
    return data


def _cstr(table: bytes, offset: int, start: int = 0, size: int | None = None) -> str:
    """The string at ``offset`` of a string table of ``size`` bytes (``len(table)`` by default) of which
    ``table`` holds the bytes from ``start`` on."""
    size = len(table) if size is None else size
    if not 0 <= offset < size:
        raise ElfError(f"string offset {offset} outside the string table ({size} bytes)")
    end = table.find(b"\0", offset - start)
    if end < 0:
        raise ElfError("unterminated string in the string table")
    return table[offset - start:end].decode("utf-8", "surrogateescape")


def read_kind(path: str) -> "tuple[int, int]":
    """(ELF class 32/64, e_machine) from the first 20 bytes: what the loader checks before mapping."""
    head = _parsed(path, lambda fd: os.pread(fd, 20, 0))
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise ElfError("not an ELF file")
    return 32 * head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


class _Layout:
    """An open object's header facts and dynamic entries: what both readers start from."""

    __slots__ = ("fd", "size", "order", "is64", "machine", "loads", "tags", "values", "interpreter")

    def __init__(self, fd: int, size: int, order: "ByteOrder", is64: bool, machine: int,
                 loads: "list[tuple[int, int, int]]", tags: "list[int]", values: "list[int]",
                 interpreter: "str | None" = None) -> None:
        self.fd = fd
        self.size = size  # the file's length: no read goes past it
        self.order = order  # the file's byte order
        self.is64 = is64
        self.machine = machine
        self.loads = loads  # (vaddr, offset, filesz) of each PT_LOAD
        self.tags = tags  # the dynamic entries' tags up to DT_NULL, and their values
        self.values = values
        self.interpreter = interpreter  # PT_INTERP's path: a program's loader

    @property
    def elf_class(self) -> int:
        return 64 if self.is64 else 32

    def value(self, tag: int) -> "int | None":
        """The value of the first dynamic entry with ``tag``, or None."""
        return self.values[self.tags.index(tag)] if tag in self.tags else None

    def offset(self, vaddr: int, what: str) -> int:
        """The file offset of a virtual address, through the PT_LOAD segment that maps it."""
        for start, offset, filesz in self.loads:
            if start <= vaddr < start + filesz:
                return vaddr - start + offset
        raise ElfError(f"{what} is not inside any PT_LOAD segment")

    def read(self, offset: int, size: int, what: str) -> bytes:
        return _read_at(self.fd, self.size, offset, size, what)

    def strings(self, wanted: "tuple[int, ...] | None" = None) -> "tuple[bytes, int, int]":
        """(bytes, their offset in the table, the table's size) of DT_STRTAB: all of it, or, for the
        ``wanted`` offsets, from the lowest to just past the end of the highest one's string. A
        program's table is mostly symbol names (bash's 41 KB, libstdc++'s 300 KB), and the strings
        of the dynamic entries lie together, at its start."""
        strtab, strsz = self.value(DT_STRTAB), self.value(DT_STRSZ)
        if strtab is None or strsz is None:
            raise ElfError("dynamic section has no DT_STRTAB/DT_STRSZ")
        if strsz > _MAX_STRTAB:
            raise ElfError(f"implausible string table size {strsz}")
        base = self.offset(strtab, "DT_STRTAB")
        if not wanted or not 0 <= min(wanted) <= max(wanted) < strsz:
            return self.read(base, strsz, "dynamic string table"), 0, strsz  # _cstr names the bad offset
        lo, hi = min(wanted), min(strsz, max(wanted) + _STRING_SPAN)
        data = self.read(base + lo, hi - lo, "dynamic string table")
        if hi < strsz and data.find(b"\0", max(wanted) - lo) < 0:  # a longer last string: read on
            data = self.read(base + lo, strsz - lo, "dynamic string table")
        return data, lo, strsz


def _field(data: bytes, offset: int, width: int, order: "ByteOrder") -> int:
    """The unsigned integer of ``width`` bytes at ``offset`` of ``data``, in byte order ``order``."""
    return int.from_bytes(data[offset:offset + width], order)


_CAST: "dict[int, Literal['H', 'I', 'Q']]" = {2: "H", 4: "I", 8: "Q"}


def positions(values: "list[int]", value: int) -> "list[int]":
    """Where ``value`` occurs in ``values``, in order: each found by ``list.index``, in C, not by a Python
    loop over every item (a dynamic section has dozens, a loader cache hundreds, a symbol table more)."""
    found: "list[int]" = []
    at = -1
    for _ in range(values.count(value)):
        at = values.index(value, at + 1)
        found.append(at)
    return found


def _words(data: bytes, width: int, order: "ByteOrder") -> "list[int]":
    """``data`` (a multiple of ``width`` bytes long) as unsigned integers of ``width`` bytes: one cast
    where the file's byte order is this machine's, which is how every object a process loads is."""
    if order == sys.byteorder:
        return memoryview(data).cast(_CAST[width]).tolist()
    return [int.from_bytes(data[i:i + width], order) for i in range(0, len(data), width)]


def _column(data: bytes, width: int, order: "ByteOrder", start: int, step: int) -> "list[int]":
    """The unsigned integers of ``width`` bytes at ``start``, ``start + step``, ... of ``data`` (a table of
    ``step``-byte entries): one strided view where the byte order is this machine's (only the column's
    integers are made, not every word of the table)."""
    if order == sys.byteorder:
        return memoryview(data).cast(_CAST[width])[start // width::step // width].tolist()
    return [int.from_bytes(data[at:at + width], order) for at in range(start, len(data) - width + 1, step)]


# Where the ELF header fields this reader needs lie (elf(5)), by class: (header size, e_machine, e_phoff,
# e_phentsize, e_phnum); and a program header's size. A word is 8 bytes in ELFCLASS64, 4 in ELFCLASS32.
_EHDR = {False: (52, 18, 28, 42, 44), True: (64, 18, 32, 54, 56)}
_PHSIZE = {False: 32, True: 56}
# A program header as words: p_offset, p_vaddr and p_filesz are words 1, 2 and 4 in both classes; p_type
# is word 0 in ELFCLASS32 and the first half of word 0 (p_flags the second) in ELFCLASS64.
_P_OFFSET, _P_VADDR, _P_FILESZ = 1, 2, 4
# The first read of a file: its ELF header and, in every object seen, its program headers.
_HEAD = 4096


def _layout(fd: int) -> _Layout:
    size = os.fstat(fd).st_size
    head = os.pread(fd, _HEAD, 0)
    if len(head) < 16 or head[:4] != b"\x7fELF":
        raise ElfError("not an ELF file (bad magic)" if head else "empty file")
    ei_class, ei_data = head[4], head[5]
    if ei_class not in (1, 2):
        raise ElfError(f"unknown ELF class {ei_class}")
    if ei_data not in (1, 2):
        raise ElfError(f"unknown ELF data encoding {ei_data}")
    order: "ByteOrder" = "little" if ei_data == 1 else "big"
    is64 = ei_class == 2
    ehsize, at_machine, at_phoff, at_phentsize, at_phnum = _EHDR[is64]
    word, phsize = (8 if is64 else 4), _PHSIZE[is64]
    if len(head) < ehsize:
        raise ElfError("truncated file: ELF header")
    machine = _field(head, at_machine, 2, order)
    phoff = _field(head, at_phoff, word, order)
    phentsize, phnum = _field(head, at_phentsize, 2, order), _field(head, at_phnum, 2, order)
    if phnum == 0:
        raise ElfError("no program headers (not a loadable object)")
    if phnum > _MAX_PHNUM or phentsize != phsize:  # the loader refuses another e_phentsize too (elf/dl-load.c)
        raise ElfError(f"implausible program header table (phnum={phnum}, phentsize={phentsize})")
    span = phnum * phsize
    table = head[phoff:phoff + span] if phoff + span <= len(head) else _read_at(fd, size, phoff, span,
                                                                                 "program header table")
    headers = _words(table, word, order)

    types = _column(table, 4, order, 0, phsize)  # p_type: the first 4 bytes of a program header in both classes
    per = phsize // word
    loads = [(headers[at + _P_VADDR], headers[at + _P_OFFSET], headers[at + _P_FILESZ])
             for at in (i * per for i in positions(types, PT_LOAD))]
    if PT_DYNAMIC not in types:
        raise ElfError("no PT_DYNAMIC segment (statically linked or not a shared object)")
    at = types.index(PT_DYNAMIC) * per
    dynamic = (headers[at + _P_OFFSET], headers[at + _P_FILESZ])
    interpreter = None
    if PT_INTERP in types:  # a bad one is no reason to refuse the object: only the kernel reads it, of a program
        at = types.index(PT_INTERP) * per
        offset, length = headers[at + _P_OFFSET], min(headers[at + _P_FILESZ], _MAX_INTERP)
        try:  # in the first read already, in every program seen: no read more
            path = head[offset:offset + length] if offset + length <= len(head) else _read_at(
                fd, size, offset, length, "PT_INTERP")
        except ElfError:
            path = b""
        interpreter = path.partition(b"\0")[0].decode("utf-8", "surrogateescape") or None

    count = min(dynamic[1] // (2 * word), _MAX_DYN_ENTRIES)
    words = _words(_read_at(fd, size, dynamic[0], count * 2 * word, "dynamic section"), word, order)
    # d_tag is signed, read unsigned here: no tag this reader knows is negative. Up to DT_NULL, found with
    # list.index rather than a Python loop over each entry (a resolve reads a dozen objects of 30 to 60).
    tags = words[0::2]
    end = tags.index(DT_NULL) if DT_NULL in tags else len(tags)
    return _Layout(fd, size, order, is64, machine, loads, tags[:end], words[1:2 * end:2], interpreter)


def read_dynamic(path: str) -> DynamicInfo:
    """Return the dynamic-section facts of ``path``.

    Raises :class:`ElfError` for anything that is not a well-formed ELF object with a dynamic section, and
    :class:`UnreadableFile` (an ElfError) when the file cannot be opened or read, or is not a regular file (a
    FIFO named like a build is refused without blocking).
    """
    def parse(fd: int) -> "tuple[_Layout, list[tuple[int, int]], tuple[bytes, int, int], str | None]":
        layout = _layout(fd)
        tags, values = layout.tags, layout.values
        entries = [(tags[i], values[i]) for i in sorted(i for tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)
                                                        for i in positions(tags, tag))]
        return (layout, entries, (layout.strings(tuple(v for _, v in entries)) if entries else (b"", 0, 0)),
                layout.interpreter)

    layout, entries, (strings, start, strsz), interpreter = _parsed(path, parse)
    if not entries:
        return DynamicInfo(layout.elf_class, layout.machine, (), None, (), (), interpreter)

    needed: list[str] = []
    soname = None
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    for tag, val in entries:
        text = _cstr(strings, val, start, strsz)
        if tag == DT_NEEDED:
            needed.append(text)
        elif tag == DT_SONAME:
            soname = text
        elif tag == DT_RPATH:
            rpath = tuple(p for p in text.split(":") if p)
        else:
            runpath = tuple(p for p in text.split(":") if p)
    return DynamicInfo(layout.elf_class, layout.machine, tuple(needed), soname, rpath, runpath, interpreter)


def _symbol_count(layout: _Layout) -> int:
    """How many entries DT_SYMTAB has: DT_HASH's nchain, else the end of DT_GNU_HASH's last chain."""
    order = layout.order
    hash_addr = layout.value(DT_HASH)
    if hash_addr is not None:
        return _field(layout.read(layout.offset(hash_addr, "DT_HASH"), 8, "DT_HASH"), 4, 4, order)  # nchain
    gnu = layout.value(DT_GNU_HASH)
    if gnu is None:
        raise ElfError("no DT_HASH or DT_GNU_HASH: the symbol table's length is unknown")
    base = layout.offset(gnu, "DT_GNU_HASH")
    nbuckets, symoffset, bloom_size, _shift = _words(layout.read(base, 16, "DT_GNU_HASH"), 4, order)
    if nbuckets > _MAX_SYMBOLS or bloom_size > _MAX_SYMBOLS:
        raise ElfError(f"implausible DT_GNU_HASH (nbuckets={nbuckets}, bloom_size={bloom_size})")
    buckets_at = base + 16 + bloom_size * (8 if layout.is64 else 4)
    buckets = _words(layout.read(buckets_at, 4 * nbuckets, "DT_GNU_HASH buckets"), 4, order)
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset  # no hashed symbol: only the unhashed ones below symoffset
    chains_at = buckets_at + 4 * nbuckets
    index = last
    while True:  # follow the last chain to the entry whose low bit ends it
        if index - symoffset >= _MAX_SYMBOLS:
            raise ElfError("DT_GNU_HASH chain does not end")
        if _field(layout.read(chains_at + 4 * (index - symoffset), 4, "DT_GNU_HASH chain"), 0, 4, order) & 1:
            return index + 1
        index += 1


_BINDINGS = (STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE)


class _SymbolTable:
    """An object's dynamic symbol table as columns, entry 0 (the reserved null symbol) left out: each
    entry's name offset, st_info, st_other and st_shndx, and the string table the names are in."""

    __slots__ = ("names", "infos", "others", "sections", "strings")

    def __init__(self, table: bytes, strings: bytes, is64: bool, order: "ByteOrder") -> None:
        # Elf64_Sym: st_name (4 bytes), st_info, st_other (1 each), st_shndx (2), st_value, st_size (8 each);
        # Elf32_Sym: st_name, st_value, st_size (4 each), st_info, st_other (1 each), st_shndx (2).
        size, info_at = (24, 4) if is64 else (16, 3 * 4)
        self.names = _column(table, 4, order, size, size)
        self.infos = table[size + info_at::size]
        self.others = table[size + info_at + 1::size]
        self.sections = _column(table, 2, order, size + info_at + 2, size)
        self.strings = strings

    def exported(self, i: int) -> bool:
        """Entry ``i`` is a definition other objects bind to: global, weak or unique binding, defined here,
        and not hidden."""
        return (self.infos[i] >> 4 in _BINDINGS and self.sections[i] != SHN_UNDEF
                and self.others[i] & 3 not in (STV_HIDDEN, STV_INTERNAL))


def _symbol_table(path: str) -> "_SymbolTable | None":
    """``path``'s dynamic symbol table, None where it has none; raises ElfError (:func:`read_symbols`)."""
    def parse(fd: int) -> "_SymbolTable | None":
        layout = _layout(fd)
        symtab = layout.value(DT_SYMTAB)
        if symtab is None:
            return None
        entsize = 24 if layout.is64 else 16
        if layout.value(DT_SYMENT) not in (None, entsize):
            raise ElfError(f"unexpected DT_SYMENT {layout.value(DT_SYMENT)} (want {entsize})")
        count = _symbol_count(layout)
        if count > _MAX_SYMBOLS:
            raise ElfError(f"implausible symbol count {count}")
        table = layout.read(layout.offset(symtab, "DT_SYMTAB"), count * entsize, "dynamic symbol table")
        return _SymbolTable(table, layout.strings()[0], layout.is64, layout.order)

    return _parsed(path, parse)


def read_symbols(path: str) -> Symbols:
    """The names ``path`` defines for, and needs from, other objects (its dynamic symbol table).

    Raises :class:`ElfError` for a malformed object, :class:`UnreadableFile` (an ElfError) when it cannot be read.
    """
    table = _symbol_table(path)
    if table is None:
        return Symbols(frozenset(), frozenset())
    defined: set[str] = set()
    undefined: set[str] = set()
    strings, infos, sections = table.strings, table.infos, table.sections
    for i, name in enumerate(table.names):
        if not name or infos[i] >> 4 not in _BINDINGS:
            continue
        if sections[i] == SHN_UNDEF:
            undefined.add(_cstr(strings, name))
        elif table.exported(i):
            defined.add(_cstr(strings, name))
    return Symbols(frozenset(defined), frozenset(undefined))


def defined_among(path: str, wanted: "Iterable[str]") -> "frozenset[str]":
    """Those of ``wanted`` that ``path`` defines for other objects: ``read_symbols(path).defined & wanted``,
    without decoding every name of the table. Each wanted name is found in the string table (also as
    the tail of a longer string: linkers share tails), and only the entries naming it there are read.

    Raises :class:`ElfError` as :func:`read_symbols` does (but for a malformed entry that names none of
    ``wanted``, which is not read)."""
    table = _symbol_table(path)
    if table is None:
        return frozenset()
    strings, names = table.strings, table.names
    found: set[str] = set()
    for name in wanted:
        key = name.encode("utf-8", "surrogateescape") + b"\0"
        at = strings.find(key, 1)  # offset 0 names no symbol
        while at > 0 and name not in found:
            if any(table.exported(i) for i in positions(names, at)):
                found.add(name)
            at = strings.find(key, at + 1)
    return frozenset(found)
