"""An ELF object's dynamic symbol table, read without loading it: what it defines, what it needs.

Only dlopen mode (:func:`tms_autopreload.builds.interposed`, :mod:`tms_autopreload.inprocess`), a build that
``TMS_AUTOPRELOAD_PATH`` forces, ``doctor`` and ``doctor --deep`` read symbol tables: an exec-mode start that
chooses among the installed builds never does, so it never loads this module (docs/performance.md).

The table is read as the loader reads it, from the dynamic section (section headers may be stripped), with
the readers of :mod:`tms_autopreload.elf`: DT_SYMTAB is a virtual address mapped back to a file offset
through PT_LOAD, and its length comes from DT_HASH (nchain) or, as glibc computes it, from the highest chain
of DT_GNU_HASH. Its columns are cut out whole (every entry's name offset in one slice), not entry by entry:
libcudart's has 600 entries, and dlopen mode reads it at every start.
"""

from .elf import ElfError, Layout, column, cstr, field, parsed, positions, read_layout, words_of

TYPE_CHECKING = False  # typing costs milliseconds to import on the start-up path
if TYPE_CHECKING:
    from collections.abc import Iterable

    from .elf import ByteOrder

__all__ = ["Symbols", "read_symbols", "defined_among"]

DT_HASH = 4
DT_SYMTAB = 6
DT_SYMENT = 11
DT_GNU_HASH = 0x6FFFFEF5
SHN_UNDEF = 0
STB_GLOBAL, STB_WEAK, STB_GNU_UNIQUE = 1, 2, 10
STV_HIDDEN, STV_INTERNAL = 2, 1
_MAX_SYMBOLS = 1 << 22  # libtorch_cpu.so has about 300,000


class Symbols:
    """Names in an object's dynamic symbol table: those it defines for others (global, weak or
    unique binding, not hidden), and those it needs from others (undefined)."""

    __slots__ = ("defined", "undefined")

    def __init__(self, defined: frozenset, undefined: frozenset) -> None:
        self.defined = defined
        self.undefined = undefined



def _symbol_count(layout: Layout) -> int:
    """How many entries DT_SYMTAB has: DT_HASH's nchain, else the end of DT_GNU_HASH's last chain."""
    order = layout.order
    hash_addr = layout.value(DT_HASH)
    if hash_addr is not None:
        return field(layout.read(layout.offset(hash_addr, "DT_HASH"), 8, "DT_HASH"), 4, 4, order)  # nchain
    gnu = layout.value(DT_GNU_HASH)
    if gnu is None:
        raise ElfError("no DT_HASH or DT_GNU_HASH: the symbol table's length is unknown")
    base = layout.offset(gnu, "DT_GNU_HASH")
    nbuckets, symoffset, bloom_size, _shift = words_of(layout.read(base, 16, "DT_GNU_HASH"), 4, order)
    if nbuckets > _MAX_SYMBOLS or bloom_size > _MAX_SYMBOLS:
        raise ElfError(f"implausible DT_GNU_HASH (nbuckets={nbuckets}, bloom_size={bloom_size})")
    buckets_at = base + 16 + bloom_size * (8 if layout.is64 else 4)
    buckets = words_of(layout.read(buckets_at, 4 * nbuckets, "DT_GNU_HASH buckets"), 4, order)
    last = max(buckets, default=0)
    if last < symoffset:
        return symoffset  # no hashed symbol: only the unhashed ones below symoffset
    chains_at = buckets_at + 4 * nbuckets
    index = last
    while True:  # follow the last chain to the entry whose low bit ends it
        if index - symoffset >= _MAX_SYMBOLS:
            raise ElfError("DT_GNU_HASH chain does not end")
        if field(layout.read(chains_at + 4 * (index - symoffset), 4, "DT_GNU_HASH chain"), 0, 4, order) & 1:
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
        self.names = column(table, 4, order, size, size)
        self.infos = table[size + info_at::size]
        self.others = table[size + info_at + 1::size]
        self.sections = column(table, 2, order, size + info_at + 2, size)
        self.strings = strings

    def exported(self, i: int) -> bool:
        """Entry ``i`` is a definition other objects bind to: global, weak or unique binding, defined here,
        and not hidden."""
        return (self.infos[i] >> 4 in _BINDINGS and self.sections[i] != SHN_UNDEF
                and self.others[i] & 3 not in (STV_HIDDEN, STV_INTERNAL))


def _symbol_table(path: str) -> "_SymbolTable | None":
    """``path``'s dynamic symbol table, None where it has none; raises ElfError (:func:`read_symbols`)."""
    def parse(fd: int) -> "_SymbolTable | None":
        layout = read_layout(fd)
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

    return parsed(path, parse)


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
            undefined.add(cstr(strings, name))
        elif table.exported(i):
            defined.add(cstr(strings, name))
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
