"""The loader model judged by the loader: in generated library trees, ``tms_autopreload.ldso`` must find every
DT_NEEDED name where glibc's own ld.so maps it, and the cache reader must read ``ldconfig``'s cache as
``ldconfig -p`` does.

A few real objects are built once per session (gcc): a program, an object to preload and a small library per
SONAME. Each example edits copies of them (patchelf: DT_NEEDED names, missing ones and repeated ones; DT_RPATH,
DT_RUNPATH or both, with ``$ORIGIN``, empty entries and missing directories; the program's DT_RPATH as conda
sets it, with ``--force-rpath``) and lays them out in a tree: copies named by their SONAME or by a versioned
name behind a link, links to another directory's copy, dangling links, copies of another ELF class, machine or
SONAME, files that are not ELF objects, copies in glibc-hwcaps subdirectories, a directory reached through a
link, the program started through a link. A loader cache lists some of its directories (``ldconfig -C``,
mounted over /etc/ld.so.cache in a private mount namespace: support.Host), and the program is started under a
few environments (LD_LIBRARY_PATH with empty, relative and repeated entries and either separator; LD_PRELOAD
by path and by name; GLIBC_TUNABLES taking ISA levels away), each traced by the real loader
(``LD_TRACE_LOADED_OBJECTS=1``), all from one shell in one namespace.

The trace is judged in the loader's own order (elf/rtld.c, elf/dl-deps.c: the preloaded objects, then the
program's needs, each preloaded object's, then breadth first): a name that matches an object already loaded
(the name it was loaded by, or its DT_SONAME) is not searched; a name searched is the model's answer for the
object that needs it (``Loader.find``), which must be the file the loader mapped, or "not found" where the
loader found none, and a file already mapped under another name is that object again. The model's rules are
ld.so(8)'s as the module's docstring names them; what it does not model (docs/design.md: glibc-hwcaps
subdirectories of the search path's directories) is generated too, and judged as documented: the loader maps
such a copy where the model answers the directory's own file, or none.

glibc-hwcaps choices depend on the CPU: they are judged by the loader's own list (``ld.so --help`` under the
run's GLIBC_TUNABLES, as the model asks it), never by this machine's.

``TMS_FUZZ_LOADER`` sets the number of examples (the fast lane's 60 in a fixed order; ``make fuzz``'s 600 in
a random one: a failure prints the example, the tree, the objects and the traces, and the seed to reproduce).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import need
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st
from support import HWCAPS_TUNABLES, ROOT, Host, cc, ldconfig_listing, retyped

sys.path.insert(0, str(ROOT))

from tms_autopreload import glibc_hwcaps, ldcache
from tms_autopreload.environment import split_preload
from tms_autopreload.elf import DT_NEEDED, DT_RUNPATH, UnreadableFile, read_dynamic, read_kind
from tms_autopreload.ldso import PRELOADED, Found, Loader, Object, loaded_as
from tms_autopreload.trace import Trace

EXAMPLES = int(os.environ.get("TMS_FUZZ_LOADER", "60"))
PROPERTY = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                    derandomize="TMS_FUZZ_LOADER" not in os.environ,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

pytestmark = pytest.mark.skipif(os.uname().machine != "x86_64",
                                reason="its objects are patched as ELFCLASS64 little-endian, its glibc-hwcaps "
                                       "subdirectories are x86-64's")

SONAMES = ("libtmsp_a.so.1", "libtmsp_b.so.1", "libtmsp_c.so.1")
GONE = "libtmsp_gone.so.1"  # a name no tree holds
# Directories of a tree (relative to its root, "{R}" below) that may hold copies; "lnk" is a link to store/lib.
PLACES = ("lib1", "lib2", "pkg/lib", "store/lib", "store/deps", "deps", "site")
LINKED = ("lnk", "store/lib")
# The program, the same edited copy in bin/ and in pkg/bin/ (where its DT_RPATH is conda's, CONDA below, pkg/lib
# is its environment's lib/), and run/prog, a link to the second: each run starts one of them.
PROGRAMS = ("bin/prog", "pkg/bin/prog", "run/prog")
HOOK = "site/hook.so"
HWCAPS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
# Entries of an object's DT_RPATH or DT_RUNPATH; "" makes an empty entry (the current directory), "lib1" a
# relative one (from the current directory of the run).
OBJECT_ENTRIES = ("{R}/lib1", "{R}/lib2", "{R}/pkg/lib", "{R}/lnk", "{R}/lnk/../deps", "{R}/none", "lib1", "",
                  "$ORIGIN", "$ORIGIN/../lib", "${ORIGIN}/../deps", "$ORIGIN/../lib1")
LIBRARY_PATH_ENTRIES = ("{R}/lib1", "{R}/lib2", "{R}/pkg/lib", "{R}/lnk", "{R}/lnk/../deps", "{R}/none", "lib2", "",
                        "$ORIGIN/../lib")
# The object to preload lies in site/ and in store/lib/, reached through the link lnk/ too.
PRELOAD_ENTRIES = ("{R}/" + HOOK, "hook.so", *SONAMES, "{R}/lib1/" + SONAMES[0], GONE, "$ORIGIN/../site/hook.so",
                   "{R}/lnk/hook.so")
# A conda interpreter's DT_RPATH (set with patchelf --force-rpath): the environment's lib/ beside its bin/.
CONDA = "$ORIGIN/../lib"
# DT_NEEDED names an object may be given: the SONAMEs, one no tree holds, a path from the object's directory.
NEEDS = (*SONAMES, GONE, "$ORIGIN/" + SONAMES[2])
# What a place holds under a SONAME, by weight: a copy of its library; a versioned file and a link to it; a
# link to the copy in a later place (kind "link:<place>": no loop); a dangling link; a copy of another ELF class
# or machine; another library's copy (kind "soname:<name>"); a file that is not an ELF object (a linker script,
# as libfoo.so is), where the loader stops.
KINDS = ("copy", "copy", "copy", "versioned", "link", "link", "dangling", "class", "machine", "soname", "not-elf")


@dataclass(frozen=True)
class Edit:
    """What patchelf changes in an object: DT_NEEDED names added before its own (in the order patchelf writes
    them: the judge reads the object), its DT_RPATH and DT_RUNPATH (None: no such entry; both: the two tags,
    as older linkers wrote them)."""

    needs: tuple[str, ...] = ()
    rpath: tuple[str, ...] | None = None
    runpath: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Run:
    """One start: the program (of PROGRAMS), LD_LIBRARY_PATH (None: unset), LD_PRELOAD, GLIBC_TUNABLES."""

    program: str
    library_path: str | None
    preload: str
    tunables: str


@dataclass(frozen=True)
class World:
    program: Edit
    hook: Edit
    libraries: tuple[Edit, ...]  # one for each of SONAMES
    copies: tuple[tuple[str, str, str], ...]  # (SONAME, place, kind)
    hwcaps: tuple[tuple[str, str, str], ...]  # (SONAME, place, glibc-hwcaps subdirectory)
    cache: tuple[str, ...] | None  # the places ldconfig lists (None: the system's directories only)
    cwd: str  # the current directory of every run, from the root
    runs: tuple[Run, ...]


def _entries(pool: tuple[str, ...], most: int = 3):
    return st.lists(st.sampled_from(pool), max_size=most).map(tuple)


@st.composite
def _edits(draw, most_needs: int, conda: bool = False) -> Edit:
    """An object's edit; with ``conda``, a program's may be a conda interpreter's: DT_RPATH ``$ORIGIN/../lib``
    alone: pkg/lib from pkg/bin/prog or its link run/prog, a directory no tree has from bin/prog."""
    tags = draw(st.sampled_from(("neither", "DT_RPATH", "DT_RUNPATH", "both", *(("conda",) if conda else ()))))
    rpath = draw(_entries(OBJECT_ENTRIES)) if tags in ("DT_RPATH", "both") else None
    if tags == "conda":
        rpath = (CONDA,)
    runpath = None
    if tags == "DT_RUNPATH":
        runpath = draw(_entries(OBJECT_ENTRIES))
    elif tags == "both":  # not empty: _retag_first_entry makes it from a DT_NEEDED string
        runpath = draw(st.lists(st.sampled_from([e for e in OBJECT_ENTRIES if e]), min_size=1, max_size=2))
    needs = draw(st.lists(st.sampled_from(NEEDS), min_size=1, max_size=most_needs).map(tuple))
    return Edit(needs, rpath, None if runpath is None else tuple(runpath))


@st.composite
def _joined(draw, pool: tuple[str, ...], most: int, separators: str) -> str:
    return draw(st.sampled_from(separators)).join(draw(_entries(pool, most)))


@st.composite
def _copy(draw) -> tuple[str, str, str]:
    name, place, kind = draw(st.sampled_from(SONAMES)), draw(st.sampled_from(PLACES)), draw(st.sampled_from(KINDS))
    if kind == "link":
        later = PLACES[PLACES.index(place) + 1:]
        kind = f"link:{draw(st.sampled_from(later))}" if later else "dangling"
    elif kind == "soname":
        kind = f"soname:{draw(st.sampled_from(SONAMES))}"
    return name, place, kind


_run = st.builds(Run, st.sampled_from(PROGRAMS), st.one_of(st.none(), _joined(LIBRARY_PATH_ENTRIES, 4, ":;")),
                 st.one_of(st.just("{R}/" + HOOK), _joined(PRELOAD_ENTRIES, 2, ": ")), st.sampled_from(HWCAPS_TUNABLES))

worlds = st.builds(
    World, program=_edits(3, conda=True), hook=_edits(3), libraries=st.tuples(*(_edits(2) for _ in SONAMES)),
    copies=st.lists(_copy(), min_size=3, max_size=14, unique_by=lambda c: c[:2]).map(tuple),
    hwcaps=st.lists(st.tuples(st.sampled_from(SONAMES), st.sampled_from(PLACES), st.sampled_from(HWCAPS)),
                    max_size=3, unique=True).map(tuple),
    cache=st.one_of(st.none(), st.lists(st.sampled_from(PLACES + LINKED[:1]), min_size=1, max_size=3, unique=True)
                    .map(tuple)),
    cwd=st.sampled_from((".", "lib1", "pkg/lib")), runs=st.lists(_run, min_size=1, max_size=8).map(tuple))


# ---------------------------------------------------------------- the objects, built once

class Objects:
    """The session's objects and the loader's facts they share: a program, an object to preload, a library per
    SONAME (gcc), the program's loader, a host whose cache lists the system's directories only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.program = cc(root / "objects" / "prog", "int main(void) { return 0; }\n", shared=False)
        self.hook = cc(root / "objects" / "hook.so", "int tmsp_hook(void) { return 0; }\n")
        self.libraries = [cc(root / "objects" / name, f"int tmsp_{i}(void) {{ return {i}; }}\n",
                             f"-Wl,-soname,{name}") for i, name in enumerate(SONAMES)]
        info = read_dynamic(str(self.program))
        self.interpreter, self.machine = info.interpreter, info.machine
        self.system = Host(root / "system", [])

    @functools.cache  # noqa: B019 (one instance a session)
    def hwcaps_used(self, tunables: str) -> tuple[str, ...]:
        """The glibc-hwcaps subdirectories the loader uses under ``tunables``, best first, in its own words."""
        return glibc_hwcaps.used(self.interpreter, {"GLIBC_TUNABLES": tunables} if tunables else {})


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> Objects:
    if shutil.which("patchelf") is None:
        pytest.skip("needs patchelf")
    return need(Objects, tmp_path_factory.mktemp("ldso-property"))


# ---------------------------------------------------------------- a world's tree

def _patchelf(path: Path, *args: str) -> None:
    r = subprocess.run(["patchelf", *args, str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r


def _retag_first_entry(path: Path, tag: int) -> None:
    """Give the first dynamic entry of the ELFCLASS64 little-endian object ``path`` (where ``patchelf
    --add-needed`` puts the entry it adds) the tag ``tag``: patchelf writes DT_RPATH or DT_RUNPATH, never both."""
    data = bytearray(path.read_bytes())
    phoff, phentsize, phnum = (int.from_bytes(data[at:at + n], "little") for at, n in ((32, 8), (54, 2), (56, 2)))
    dynamic = next(int.from_bytes(data[h + 8:h + 16], "little") for h in range(phoff, phoff + phnum * phentsize,
                                                                               phentsize)
                   if int.from_bytes(data[h:h + 4], "little") == 2)
    assert int.from_bytes(data[dynamic:dynamic + 8], "little") == DT_NEEDED
    data[dynamic:dynamic + 8] = tag.to_bytes(8, "little")
    path.write_bytes(bytes(data))


def edited(src: Path, dst: Path, edit: Edit, root: str) -> Path:
    """A copy of ``src`` at ``dst`` with ``edit`` made, each "{R}" of its entries the tree's root."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, dst)
    value = {k: None if v is None else ":".join(v).replace("{R}", root) for k, v in
             (("rpath", edit.rpath), ("runpath", edit.runpath))}
    if value["rpath"] is not None:
        _patchelf(dst, "--force-rpath", "--set-rpath", value["rpath"])
    elif value["runpath"] is not None:
        _patchelf(dst, "--set-rpath", value["runpath"])
    rounds: list[list[str]] = []  # patchelf adds each name of a call once (sorted): a repeated name waits
    for name in edit.needs:
        free = next((r for r in rounds if name not in r), None)
        if free is None:
            rounds.append(free := [])
        free.append(name)
    for names in rounds:
        _patchelf(dst, *(arg for name in names for arg in ("--add-needed", name)))
    if value["rpath"] is not None and value["runpath"] is not None:
        _patchelf(dst, "--add-needed", value["runpath"])
        _retag_first_entry(dst, DT_RUNPATH)
    return dst


def _link(link: Path, target: Path) -> None:
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def lay_out(world: World, objects: Objects, root: Path) -> None:
    """Build ``world``'s tree under ``root``."""
    r = str(root)
    program = edited(objects.program, root / PROGRAMS[0], world.program, r)
    (root / PROGRAMS[1]).parent.mkdir(parents=True)
    shutil.copy(program, root / PROGRAMS[1])
    _link(root / PROGRAMS[2], root / PROGRAMS[1])
    hook = edited(objects.hook, root / HOOK, world.hook, r)
    built = {name: edited(src, root / "build" / name, edit, r)
             for name, src, edit in zip(SONAMES, objects.libraries, world.libraries, strict=True)}
    for place in PLACES:
        (root / place).mkdir(parents=True, exist_ok=True)
    _link(root / LINKED[0], root / LINKED[1])
    shutil.copy(hook, root / LINKED[1] / "hook.so")
    for name, place, kind in world.copies:
        dst = root / place / name
        if kind == "copy":
            shutil.copy(built[name], dst)
        elif kind == "versioned":
            shutil.copy(built[name], dst.with_name(name + ".0"))
            _link(dst, dst.with_name(name + ".0"))
        elif kind == "dangling":
            _link(dst, root / "nowhere" / name)
        elif kind == "class":
            retyped(str(built[name]), dst, elf_class=32)
        elif kind == "machine":
            retyped(str(built[name]), dst, machine=183)
        elif kind == "not-elf":
            dst.write_text("INPUT(-ltmsp)\n")
        elif kind.startswith("link:"):
            _link(dst, root / kind[5:] / name)
        else:
            shutil.copy(built[kind.partition(":")[2]], dst)
    for name, place, sub in world.hwcaps:
        (root / place / "glibc-hwcaps" / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(built[name], root / place / "glibc-hwcaps" / sub / name)


# ---------------------------------------------------------------- the judge

class Stopped(Exception):
    """The loader stopped where the model said it would: at a file that is no ELF object."""


class NotModelled(Exception):
    """A run reached what docs/design.md says the model does not model, in a way that changes its later answers:
    the rest of the run is the loader's alone."""


def _expanded(entry: str, origin: str) -> str:
    return entry.replace("${ORIGIN}", origin).replace("$ORIGIN", origin)


class Judge:
    """One run's trace, replayed in the loader's order, each search asked of the model."""

    def __init__(self, loader: Loader, trace: Trace, used: tuple[str, ...], here: Path) -> None:
        self.loader, self.trace, self.used, self.here = loader, trace, used, here  # here: the current directory
        interpreter = loader.executable.info.interpreter
        self.loaded: list[tuple[str, str]] = [(interpreter, interpreter)]  # (a name it answers, its path)
        self.lines: dict[str, str] = {}  # the "name => path" lines the trace must hold
        self.missing: list[str] = []  # the "name => not found" lines
        self.by_path = [interpreter]  # the objects named by a path, which the trace prints alone
        self.objects = [loader.executable]  # in the loader's order
        # Where the loader stopped with an error ("...: error while loading shared libraries: PATH: why"): it
        # then prints no line, so the replay follows the model until the model stops too.
        self.stopped_at = next((e.split("error while loading shared libraries: ", 1)[1].split(": ")[0]
                                for e in trace.errors if "error while loading shared libraries: " in e), None)

    def where(self, path: str) -> str:
        return os.path.realpath(os.path.join(self.here, path))

    def twin(self, path: str) -> str | None:
        """The path of a loaded object that is the file ``path`` (the loader maps a file once)."""
        want = os.stat(os.path.join(self.here, path))
        for _, p in self.loaded:
            st = os.stat(os.path.join(self.here, p))
            if (st.st_dev, st.st_ino) == (want.st_dev, want.st_ino):
                return p
        return None

    def said(self, name: str) -> str | None:
        """The path the loader says it mapped for ``name`` (a name, or an LD_PRELOAD path with ``$ORIGIN``:
        "name => path"; a path it opened as it is written: the path alone), or None."""
        return self.trace.resolved.get(name) or (name if "/" in name and name in self.trace.loaded else None)

    def mapped(self, name: str, found: Found | None, needed_by: Object | None = None) -> None:
        """A name the loader looked for (a DT_NEEDED path with ``$ORIGIN`` expanded, as elf/dl-deps.c does before
        it looks), which the model answered with ``found``; ``needed_by``: the object that needs it (None:
        the program)."""
        if self.stopped_at is not None:
            self.followed(name, found, needed_by)
            return
        real = self.said(name)
        if self.trace.missing.count(name) > self.missing.count(name):
            real = None  # a name not found is looked for again by the next object that needs it: found, it is last
        if real is not None and (found is None or self.where(found.path) != self.where(real)) \
                and self.hwcaps_copy(real):
            found = Found(real, "not modelled: a glibc-hwcaps subdirectory of a search path's directory")
            event("a name: the loader mapped a glibc-hwcaps copy of a search path's directory (not modelled)")
        if found is None:
            assert real is None, (name, "model: not found", "loader:", real)
            self.missing.append(name)
            return
        twin = self.twin(found.path)
        if twin is not None:
            assert real is None, (name, f"model: {found}, mapped already", "loader:", real)
            self.loaded.append((name, twin))
            return
        assert real is not None, (name, f"model: {found}", "loader: not found or mapped already")
        assert self.where(found.path) == self.where(real), (name, f"model: {found}", f"loader: {real}")
        self.new(name, real, needed_by)

    def followed(self, name: str, found: Found | None, needed_by: Object | None) -> None:
        """The model's answer, where the loader stopped later and said nothing of it: where the model finds the
        name nowhere, the loader must have stopped at a file of that name that is no ELF object."""
        if found is None:
            stop = self.stopped_at or ""
            if os.path.basename(stop) == os.path.basename(name):
                try:
                    read_kind(stop)
                except UnreadableFile:
                    pass
                except ValueError:
                    raise Stopped(stop) from None
            self.missing.append(name)
        elif (twin := self.twin(found.path)) is not None:
            self.loaded.append((name, twin))
        else:
            self.loaded.append((name, found.path))
            self.objects.append(Object(found.path, read_dynamic(os.path.join(self.here, found.path)), needed_by))

    def new(self, name: str, real: str, needed_by: Object | None) -> None:
        """The loader mapped a new object for ``name`` from ``real``, brought in by ``needed_by``: its line,
        its needs later."""
        self.loaded.append((name, real))
        self.objects.append(Object(real, read_dynamic(os.path.join(self.here, real)), needed_by))
        if name in self.trace.resolved:
            self.lines[name] = real
        else:
            self.by_path.append(real)

    def searched(self) -> set[str]:
        """The directories on a search path so far (DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH), resolved."""
        found = {self.where(_expanded(d, os.path.dirname(os.path.join(self.here, o.path))))
                 for o in self.objects for d in (*o.info.rpath, *(o.info.runpath or ()))}
        program = os.path.dirname(self.loader.executable.path)
        return found | {self.where(_expanded(d, program) or ".")
                        for d in self.loader.ld_library_path.replace(";", ":").split(":")}

    def hwcaps_copy(self, path: str) -> bool:
        """True where ``path`` is what docs/design.md says the model does not model: a copy in a glibc-hwcaps
        subdirectory the loader uses of a directory on a search path."""
        hwcaps_dir, used = os.path.split(os.path.dirname(self.where(path)))
        return os.path.basename(hwcaps_dir) == "glibc-hwcaps" and used in self.used \
            and os.path.dirname(hwcaps_dir) in self.searched()

    def hwcaps_copies(self, name: str) -> bool:
        """True where a search path's directory has a copy of ``name`` in a glibc-hwcaps subdirectory the
        loader uses: where the loader may find what the model does not."""
        return any(os.path.exists(os.path.join(d, "glibc-hwcaps", used, name)) for d in self.searched()
                   for used in self.used)

    def preloads(self, preload: str) -> None:
        """LD_PRELOAD's entries, in order: each the model's (``Loader.preloaded``), each the loader's."""
        answers = list(self.loader.preloaded)
        for entry in split_preload(preload):
            path = answers.pop(0)[1] if answers and answers[0][0] == entry else None
            real = self.said(entry)
            if real is not None and (path is None or self.where(path) != self.where(real)) and self.hwcaps_copy(real):
                raise NotModelled(f"LD_PRELOAD's {entry}: {real}")  # the model's preloaded objects are others now
            if path is None and self.stopped_at is not None and self.trace.skip_of(os.path.basename(entry)) is None:
                # the loader stopped later and printed nothing: it found the entry, where the model does not model
                assert self.hwcaps_copies(entry), (entry, "model: not loaded", "loader: loaded, where it stopped later")
                raise NotModelled(f"LD_PRELOAD's {entry}, in a glibc-hwcaps subdirectory")
            if path is None:
                assert self.trace.skip_of(os.path.basename(entry)) is not None, (entry, "model: not loaded")
            elif loaded_as(entry, self.loaded) is not None:
                earlier = loaded_as(entry, self.loaded)
                assert self.where(path) == self.where(earlier), (entry, f"model: {path}", f"loader: {earlier}")
            else:
                self.mapped(entry, Found(path, "search"))

    def needs(self) -> None:
        """Every object's DT_NEEDED names, breadth first from the program and the preloaded objects."""
        for obj in self.objects:  # grows as the loop goes
            for name in obj.info.needed:
                needed_by = None if obj is self.loader.executable else obj
                found = self.loader.find(name, needed_by)
                if "/" in name:  # $ORIGIN is absolute, the current directory's where the object's path is not
                    name = _expanded(name, os.path.dirname(os.path.join(self.here, obj.path)))
                earlier = loaded_as(name, self.loaded)
                if earlier is None:
                    self.mapped(name, found, needed_by)
                elif loaded_as(name, self.loader.preloaded) is not None or (found and found.rule == PRELOADED):
                    assert found is not None and self.where(found.path) == self.where(earlier), \
                        (name, f"model: {found}", f"loader: the preloaded {earlier}")

    def complete(self) -> None:
        """The trace holds exactly the lines replayed: nothing the model did not predict."""
        assert self.stopped_at is None, (f"the loader stopped at {self.stopped_at}", "the model found every name")
        assert self.trace.resolved == self.lines, ("loader", self.trace.resolved, "model", self.lines)
        assert sorted(self.trace.missing) == sorted(self.missing), (self.trace.missing, self.missing)
        assert sorted(self.trace.loaded) == sorted(self.by_path), (self.trace.loaded, self.by_path)
        assert not self.trace.errors and self.trace.status == 0, (self.trace.errors, self.trace.status)


def _describe(root: Path, conf: list[str]) -> str:
    """The tree, its objects' dynamic facts and the cache's directories, for a failing example's report."""
    lines = [f"root {root}; the cache lists {conf}"]
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_symlink():
            lines.append(f"  {rel} -> {os.readlink(path)}")
        elif path.is_file() and not path.name.endswith(".c") and rel.parts[0] not in ("host",):
            try:
                info = read_dynamic(str(path))
                lines.append(f"  {rel}: needs {info.needed}, soname {info.soname}, rpath {info.rpath}, "
                             f"runpath {info.runpath}")
            except ValueError as exc:
                lines.append(f"  {rel}: {exc}")
    return "\n".join(lines)


def _environment(run: Run, root: str) -> dict[str, str]:
    env = {"LD_LIBRARY_PATH": run.library_path, "LD_PRELOAD": run.preload or None,
           "GLIBC_TUNABLES": run.tunables or None}
    return {k: v.replace("{R}", root) for k, v in env.items() if v is not None}


def judge_world(world: World, objects: Objects, root: Path) -> None:
    """Lay ``world`` out under ``root``, trace its runs, and judge the model by each trace, and the cache reader
    by ``ldconfig -p``; where a judgement fails, the tree and its objects are noted for the report."""
    lay_out(world, objects, root)
    conf = [root / place for place in world.cache or ()]
    host = objects.system if world.cache is None else Host(root / "host", conf)
    try:
        envs = [_environment(run, str(root)) for run in world.runs]
        cwd = root / world.cwd
        traces = host.traces([([str(root / run.program)], env) for run, env in zip(world.runs, envs, strict=True)],
                             cwd=cwd)
        before = os.getcwd()
        os.chdir(cwd)  # relative entries, the trace's and the model's, are the same directories
        try:
            for run, env, trace in zip(world.runs, envs, traces, strict=True):
                judge_run(objects, host, root / run.program, run, env, trace, cwd)
        finally:
            os.chdir(before)
        if world.cache is not None:
            event("a loader cache of the tree's directories (ldconfig -C)")
            names = {e[0] for e in ldconfig_listing(host.cache) if e[3].startswith(f"{root}/")}
            assert_read_as_listed(host.cache, objects.machine, names | set(SONAMES) | {GONE})
    except AssertionError:
        note(_describe(root, [str(d) for d in conf]))
        raise


def judge_run(objects: Objects, host: Host, program: Path, run: Run, env: dict[str, str], trace: Trace,
              cwd: Path) -> None:
    """One start of the program: the model, built as the package builds it for that process (its cache read
    from the host's file, its glibc-hwcaps names asked of the loader under the run's GLIBC_TUNABLES), judged
    by the loader's trace."""
    note(f"{run}: the loader's trace: resolved {trace.resolved}, missing {trace.missing}, loaded {trace.loaded}, "
         f"skipped {trace.skipped}, errors {trace.errors}, status {trace.status}")
    cache = ldcache.load(objects.machine, str(host.cache), hwcaps_used=lambda: objects.hwcaps_used(run.tunables),
                         cpu_hwcaps=lambda: objects.hwcaps_used(""))
    lender = Loader(Object(str(program), read_dynamic(str(program))), "", cache)  # lends its cache
    loader = Loader.for_executable(str(program), env.get("LD_LIBRARY_PATH", ""), env.get("LD_PRELOAD", ""),
                                   like=lender)
    judge = Judge(loader, trace, objects.hwcaps_used(run.tunables), cwd)
    try:
        judge.preloads(env.get("LD_PRELOAD", ""))
        judge.needs()
    except NotModelled as exc:
        note(f"not modelled, as documented: {exc}")
        event("a run: the loader preloaded a glibc-hwcaps copy of a search path's directory (not modelled)")
        return
    except Stopped as exc:
        assert trace.status == 127 and len(trace.errors) == 1, trace.errors
        note(f"the loader stopped at {exc}, as the model says")
        event("a run: the loader stopped at a file that is no ELF object")
        return
    judge.complete()
    event("a run: every line of the trace replayed")


def assert_read_as_listed(cache: Path, machine: int, names: set[str]) -> None:
    """The cache reader's answer for each of ``names`` is what ``ldconfig -p`` lists for it: the first plain
    entry of this machine where no glibc-hwcaps subdirectory is used, and with one used, the first entry of
    that subdirectory (none where it has neither)."""
    entries = [e for e in ldconfig_listing(cache) if e[1] == "libc6,x86-64"]
    data = cache.read_bytes()
    for name in sorted(names):
        listed = [e for e in entries if e[0] == name]
        plain = next((path for _, _, sub, path in listed if sub is None), None)
        assert ldcache.LdCache(data, machine).lookup(name) == plain, (name, listed)
        for sub in sorted({sub for _, _, sub, _ in listed if sub}):
            first = next(path for _, _, s, path in listed if s == sub)
            reader = ldcache.LdCache(data, machine, lambda sub=sub: (sub,), lambda: HWCAPS)
            assert reader.lookup(name) == first, (name, sub, listed)


@PROPERTY
@given(world=worlds)
def test_the_model_finds_every_name_where_the_loader_maps_it(objects, world):
    """The property, over generated worlds (module docstring); each example's tree is removed after it."""
    root = Path(tempfile.mkdtemp(prefix="tree-", dir=objects.root))
    try:
        judge_world(world, objects, root)
    finally:
        shutil.rmtree(root)


def test_the_cache_reader_answers_every_name_of_the_systems_cache_as_ldconfig_lists_it(objects):
    """The cache of the system's own directories (ldconfig's trusted ones), every name it lists."""
    names = {e[0] for e in ldconfig_listing(objects.system.cache)}
    assert len(names) > 10, names
    assert_read_as_listed(objects.system.cache, objects.machine, names)
