"""Read the dynamic section of an ELF shared object: DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH.

Why our own reader: the resolver runs inside interpreter start-up with a 10 ms budget, and
pyelftools costs about 35 ms to import. This reader uses only ``struct``, reads just the
headers and the string table it needs (never the whole file), and bounds every count and
size it takes from the file, so a hostile or truncated file costs at most a few reads and
raises :class:`ElfError`, never anything else.

Layout follows the System V gABI (``elf(5)``): ELF header -> program headers -> PT_DYNAMIC ->
dynamic entries; DT_STRTAB is a virtual address mapped back to a file offset through PT_LOAD.
"""

import os
import struct

__all__ = ["ElfError", "DynamicInfo", "read_dynamic", "read_kind", "MACHINE_NAMES"]

PT_LOAD = 1
PT_DYNAMIC = 2
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
_MAX_STRTAB = 16 << 20

MACHINE_NAMES = {3: "i386", 8: "mips", 20: "ppc", 21: "ppc64", 22: "s390", 40: "arm", 62: "x86-64",
                 183: "aarch64", 243: "riscv"}


class ElfError(ValueError):
    """The file is not a readable ELF shared object; the message says what is wrong with it."""


class DynamicInfo:
    """What the dynamic loader reads from one object before it maps it.

    (Plain slotted classes here and elsewhere on the start-up path: ``dataclasses`` costs
    about 35 ms to import, several times the whole resolve budget.)
    """

    __slots__ = ("elf_class", "machine", "needed", "soname", "rpath", "runpath")

    def __init__(self, elf_class: int, machine: int, needed: tuple[str, ...], soname: str | None,
                 rpath: tuple[str, ...], runpath: tuple[str, ...]) -> None:
        self.elf_class = elf_class  # 32 or 64
        self.machine = machine  # e_machine
        self.needed = needed
        self.soname = soname
        self.rpath = rpath
        self.runpath = runpath

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"e_machine={self.machine}")


def _read_at(f, offset: int, size: int, what: str) -> bytes:
    if offset < 0 or size < 0:
        raise ElfError(f"{what}: negative offset or size")
    if offset + size > os.fstat(f.fileno()).st_size:  # also keeps seek() from an offset past off_t
        raise ElfError(f"truncated file: {what} at offset {offset} needs {size} bytes")
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise ElfError(f"truncated file: {what} at offset {offset} needs {size} bytes")
    return data


def _cstr(table: bytes, offset: int) -> str:
    if not 0 <= offset < len(table):
        raise ElfError(f"string offset {offset} outside the string table ({len(table)} bytes)")
    end = table.find(b"\0", offset)
    if end < 0:
        raise ElfError("unterminated string in the string table")
    return table[offset:end].decode("utf-8", "surrogateescape")


def read_kind(path: str) -> "tuple[int, int]":
    """(ELF class 32/64, e_machine) from the first 20 bytes: what the loader checks before mapping."""
    with open(path, "rb") as f:
        head = f.read(20)
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        raise ElfError("not an ELF file")
    return 32 * head[4], int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def read_dynamic(path: str) -> DynamicInfo:
    """Return the dynamic-section facts of ``path``.

    Raises :class:`ElfError` for anything that is not a well-formed ELF object with a
    dynamic section, and :class:`OSError` when the file cannot be opened or read.
    """
    with open(path, "rb") as f:
        ident = f.read(64)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ElfError("not an ELF file (bad magic)" if ident else "empty file")
        ei_class, ei_data = ident[4], ident[5]
        if ei_class not in (1, 2):
            raise ElfError(f"unknown ELF class {ei_class}")
        if ei_data not in (1, 2):
            raise ElfError(f"unknown ELF data encoding {ei_data}")
        end = "<" if ei_data == 1 else ">"
        is64 = ei_class == 2
        if is64:
            hdr_fmt, ph_fmt, dyn_fmt = end + "HHIQQQIHHH", end + "IIQQQQQQ", end + "qQ"
        else:
            hdr_fmt, ph_fmt, dyn_fmt = end + "HHIIIIIHHH", end + "IIIIIIII", end + "iI"
        hdr_size = struct.calcsize(hdr_fmt)
        if len(ident) < 16 + hdr_size:
            raise ElfError("truncated file: ELF header")
        (_e_type, machine, _version, _entry, phoff, _shoff, _flags, _ehsize, phentsize,
         phnum) = struct.unpack_from(hdr_fmt, ident, 16)
        ph_size = struct.calcsize(ph_fmt)
        if phnum == 0:
            raise ElfError("no program headers (not a loadable object)")
        if phnum > _MAX_PHNUM or phentsize < ph_size:
            raise ElfError(f"implausible program header table (phnum={phnum}, phentsize={phentsize})")
        table = _read_at(f, phoff, phnum * phentsize, "program header table")

        loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
        dynamic: tuple[int, int] | None = None
        for i in range(phnum):
            fields = struct.unpack_from(ph_fmt, table, i * phentsize)
            if is64:
                p_type, _p_flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = fields
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _p_flags, _align = fields
            if p_type == PT_LOAD:
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == PT_DYNAMIC and dynamic is None:
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            raise ElfError("no PT_DYNAMIC segment (statically linked or not a shared object)")

        dyn_size = struct.calcsize(dyn_fmt)
        count = min(dynamic[1] // dyn_size, _MAX_DYN_ENTRIES)
        raw = _read_at(f, dynamic[0], count * dyn_size, "dynamic section")
        entries: list[tuple[int, int]] = []
        strtab_addr = strsz = None
        for i in range(count):
            tag, val = struct.unpack_from(dyn_fmt, raw, i * dyn_size)
            if tag == DT_NULL:
                break
            if tag == DT_STRTAB:
                strtab_addr = val
            elif tag == DT_STRSZ:
                strsz = val
            elif tag in (DT_NEEDED, DT_SONAME, DT_RPATH, DT_RUNPATH):
                entries.append((tag, val))
        if not entries:
            return DynamicInfo(64 if is64 else 32, machine, (), None, (), ())
        if strtab_addr is None or strsz is None:
            raise ElfError("dynamic section has no DT_STRTAB/DT_STRSZ")
        if strsz > _MAX_STRTAB:
            raise ElfError(f"implausible string table size {strsz}")
        for vaddr, offset, filesz in loads:
            if vaddr <= strtab_addr < vaddr + filesz:
                strtab_off = strtab_addr - vaddr + offset
                break
        else:
            raise ElfError("DT_STRTAB is not inside any PT_LOAD segment")
        strings = _read_at(f, strtab_off, strsz, "dynamic string table")

    needed: list[str] = []
    soname = None
    rpath: tuple[str, ...] = ()
    runpath: tuple[str, ...] = ()
    for tag, val in entries:
        text = _cstr(strings, val)
        if tag == DT_NEEDED:
            needed.append(text)
        elif tag == DT_SONAME:
            soname = text
        elif tag == DT_RPATH:
            rpath = tuple(p for p in text.split(":") if p)
        else:
            runpath = tuple(p for p in text.split(":") if p)
    return DynamicInfo(64 if is64 else 32, machine, tuple(needed), soname, rpath, runpath)
