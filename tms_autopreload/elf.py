"""An ELF object's dynamic section, read without loading it, and the readers of its layout.

The dynamic section (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH) and PT_INTERP: what the loader reads from
an object before it maps it. :mod:`tms_autopreload.symbols` reads the dynamic symbol table with the same
readers of the layout (:func:`read_layout`, :func:`parsed` and the table readers below).

Why our own reader: the resolver runs inside interpreter start-up with a 10 ms budget, and
pyelftools costs about 35 ms to import. This reader reads just the headers and the part of the string
table it needs (never the whole file), and bounds every count and size it takes from the file, so a
hostile or truncated file costs at most a few reads and raises :class:`ElfError`, never anything else.
Every table is decoded with ``int.from_bytes`` and ``memoryview.cast``, not ``struct``: where ``_struct`` is
an extension module (pyenv, conda), importing it maps one more shared object, about a quarter of the
instructions the flagged start-up's imports take (callgrind).

Layout follows the System V gABI (``elf(5)``): ELF header -> program headers -> PT_DYNAMIC ->
dynamic entries; DT_STRTAB is a virtual address mapped back to a file offset through PT_LOAD.
"""

import os
import sys

from .environment import open_regular

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Literal, TypeVar

    ByteOrder = Literal["little", "big"]
    T = TypeVar("T")

__all__ = ["ElfError", "UnreadableFile", "DynamicInfo", "read_dynamic", "read_kind", "MACHINE_NAMES", "Layout",
           "read_layout", "parsed", "cstr", "field", "words_of", "column", "positions"]

PT_LOAD = 1
PT_DYNAMIC = 2
PT_INTERP = 3
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_STRSZ = 10
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29

# Bounds on what a file may make us read: far above any real shared object.
_MAX_PHNUM = 4096
_MAX_DYN_ENTRIES = 65536
_MAX_INTERP = 4096  # PATH_MAX: the kernel reads no longer PT_INTERP
_MAX_STRTAB = 64 << 20  # libtorch_cuda.so's is 4.5 MB
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


def parsed(path: str, parse: "Callable[[int], T]") -> "T":
    """``parse`` of ``path`` opened for reading (:func:`.environment.open_regular`: regular files only, no
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
                 rpath: tuple[str, ...], runpath: "tuple[str, ...] | None",
                 interpreter: "str | None" = None) -> None:
        self.elf_class = elf_class  # 32 or 64
        self.machine = machine  # e_machine
        self.needed = needed
        self.soname = soname
        # DT_RPATH's and DT_RUNPATH's entries, as ld.so splits them (_search_path_entries). DT_RUNPATH is None
        # where the object has none: an empty one holds no directory, yet it turns DT_RPATH off all the same.
        self.rpath = rpath
        self.runpath = runpath
        self.interpreter = interpreter  # PT_INTERP: the loader a program is started by (None for a library)

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"e_machine={self.machine}")


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


def cstr(table: bytes, offset: int, start: int = 0, size: int | None = None) -> str:
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
    head = parsed(path, lambda fd: os.pread(fd, 20, 0))
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise ElfError("not an ELF file")
    return 32 * head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


class Layout:
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
            return self.read(base, strsz, "dynamic string table"), 0, strsz  # cstr names the bad offset
        lo, hi = min(wanted), min(strsz, max(wanted) + _STRING_SPAN)
        data = self.read(base + lo, hi - lo, "dynamic string table")
        if hi < strsz and data.find(b"\0", max(wanted) - lo) < 0:  # a longer last string: read on
            data = self.read(base + lo, strsz - lo, "dynamic string table")
        return data, lo, strsz


def field(data: bytes, offset: int, width: int, order: "ByteOrder") -> int:
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


def words_of(data: bytes, width: int, order: "ByteOrder") -> "list[int]":
    """``data`` (a multiple of ``width`` bytes long) as unsigned integers of ``width`` bytes: one cast
    where the file's byte order is this machine's, which is how every object a process loads is."""
    if order == sys.byteorder:
        return memoryview(data).cast(_CAST[width]).tolist()
    return [int.from_bytes(data[i:i + width], order) for i in range(0, len(data), width)]


def column(data: bytes, width: int, order: "ByteOrder", start: int, step: int) -> "list[int]":
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


def read_layout(fd: int) -> Layout:
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
    machine = field(head, at_machine, 2, order)
    phoff = field(head, at_phoff, word, order)
    phentsize, phnum = field(head, at_phentsize, 2, order), field(head, at_phnum, 2, order)
    if phnum == 0:
        raise ElfError("no program headers (not a loadable object)")
    if phnum > _MAX_PHNUM or phentsize != phsize:  # the loader refuses another e_phentsize too (elf/dl-load.c)
        raise ElfError(f"implausible program header table (phnum={phnum}, phentsize={phentsize})")
    span = phnum * phsize
    table = head[phoff:phoff + span] if phoff + span <= len(head) else _read_at(fd, size, phoff, span,
                                                                                 "program header table")
    headers = words_of(table, word, order)

    types = column(table, 4, order, 0, phsize)  # p_type: the first 4 bytes of a program header in both classes
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
    words = words_of(_read_at(fd, size, dynamic[0], count * 2 * word, "dynamic section"), word, order)
    # d_tag is signed, read unsigned here: no tag this reader knows is negative. Up to DT_NULL, found with
    # list.index rather than a Python loop over each entry (a resolve reads a dozen objects of 30 to 60).
    tags = words[0::2]
    end = tags.index(DT_NULL) if DT_NULL in tags else len(tags)
    return Layout(fd, size, order, is64, machine, loads, tags[:end], words[1:2 * end:2], interpreter)


def read_dynamic(path: str) -> DynamicInfo:
    """Return the dynamic-section facts of ``path``.

    Raises :class:`ElfError` for anything that is not a well-formed ELF object with a dynamic section, and
    :class:`UnreadableFile` (an ElfError) when the file cannot be opened or read, or is not a regular file (a
    FIFO named like a build is refused without blocking).
    """
    def parse(fd: int) -> "tuple[Layout, list[tuple[int, int]], tuple[bytes, int, int], str | None]":
        layout = read_layout(fd)
        tags, values = layout.tags, layout.values
        entries = [(tags[i], values[i]) for i in sorted(i for tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH)
                                                        for i in positions(tags, tag))]
        return (layout, entries, (layout.strings(tuple(v for _, v in entries)) if entries else (b"", 0, 0)),
                layout.interpreter)

    layout, entries, (strings, start, strsz), interpreter = parsed(path, parse)
    if not entries:
        return DynamicInfo(layout.elf_class, layout.machine, (), None, (), None, interpreter)

    needed: list[str] = []
    soname = None
    rpath: tuple[str, ...] = ()
    runpath: "tuple[str, ...] | None" = None
    for tag, val in entries:
        text = cstr(strings, val, start, strsz)
        if tag == DT_NEEDED:
            needed.append(text)
        elif tag == DT_SONAME:
            soname = text
        elif tag == DT_RPATH:
            rpath = _search_path_entries(text)
        else:
            runpath = _search_path_entries(text)
    return DynamicInfo(layout.elf_class, layout.machine, tuple(needed), soname, rpath, runpath, interpreter)


def _search_path_entries(text: str) -> "tuple[str, ...]":
    """The entries of a DT_RPATH or DT_RUNPATH value as ld.so reads them (elf/dl-load.c, decompose_rpath and
    fillin_rpath): split at ':'; an empty value has none, and an empty entry of another value is the current
    directory (``$ORIGIN/lib:``, as a build script that appends an unset variable writes it)."""
    return tuple(text.split(":")) if text else ()
