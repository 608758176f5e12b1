"""tms_autopreload.ldso's loader model, in-process, on small objects gcc builds: the search order of
ld.so(8) ("Finding shared objects"): DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, the cache, the default
directories; ``$ORIGIN``; a file of another ELF class or machine skipped; LD_PRELOAD matched first.

The real loader's agreement with this model, on real hooks and runtimes, is test_runpath_model's.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from conftest import need
from support import ROOT, cc

sys.path.insert(0, str(ROOT))

from tms_autopreload.elf import DynamicInfo, read_dynamic, read_kind
from tms_autopreload.ldso import PRELOADED, Loader, Object, default_dirs

NAME = "libfound.so.1"  # the DT_NEEDED name every test looks for


class Cache:
    """A loader cache answering from a dict: what Loader asks of one (``lookup``), read elsewhere
    (ldcache, test_fuzz) and built for real hosts in support."""

    def __init__(self, entries: dict[str, str] | None = None) -> None:
        self.entries = entries or {}

    def lookup(self, soname: str) -> str | None:
        return self.entries.get(soname)


@pytest.fixture(scope="module")
def lib(tmp_path_factory) -> Path:
    """One object with the SONAME ``NAME``, copied into each directory a test searches."""
    out = tmp_path_factory.mktemp("lib") / NAME
    return need(cc, out, "int found(void) { return 1; }\n", f"-Wl,-soname,{NAME}")


@pytest.fixture
def place(lib, tmp_path):
    """``place("a")``: the directory ``tmp_path/a`` holding a copy of ``lib``, as a string."""

    def make(name: str) -> str:
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, d / NAME)
        return str(d)

    return make


def build(path: Path, *link: str) -> Object:
    """An object built at ``path`` with ``link`` options (a search path, say), as Loader reads it. The
    executable a test gives Loader is one too: the model reads nothing of it but its dynamic section."""
    need(cc, path, "int needer(void) { return 0; }\n", *link)
    return Object(str(path), read_dynamic(str(path)))


def rpath(d: str) -> str:
    return f"-Wl,--disable-new-dtags,-rpath,{d}"


def runpath(d: str) -> str:
    return f"-Wl,--enable-new-dtags,-rpath,{d}"


def retyped(src: str, dst: Path, *, elf_class: int | None = None, machine: int | None = None) -> None:
    """A copy of ``src`` whose ELF header says another class (EI_CLASS) or machine (e_machine): the two
    fields the loader compares before it maps a candidate file, and the only ones changed."""
    data = bytearray(Path(src).read_bytes())
    if elf_class is not None:
        data[4] = {32: 1, 64: 2}[elf_class]
    if machine is not None:
        data[18:20] = machine.to_bytes(2, "little")
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_bytes(bytes(data))


def found(path: str, rule: str) -> tuple[str, str]:
    return (os.path.normpath(path), rule)


def answer(loader: Loader, needed_by: Object | None = None, name: str = NAME) -> tuple[str, str] | None:
    result = loader.find(name, needed_by)
    return None if result is None else (result.path, result.rule)


# ---------------------------------------------------------------- the order of ld.so(8)

def test_each_rule_is_taken_before_the_next(place, tmp_path):
    """With ``NAME`` in every searched place, the first rule of the order answers; with that place
    emptied, the next one does: DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, the cache, the default dirs."""
    dirs = {rule: place(rule) for rule in ("rpath", "llp", "runpath", "cache")}
    exe = build(tmp_path / "exe", "-Wl,--disable-new-dtags")  # no search path of its own
    cache = Cache({NAME: os.path.join(dirs["cache"], NAME)})
    with_rpath = build(tmp_path / "rp" / "needer.so", rpath(dirs["rpath"]))
    with_runpath = build(tmp_path / "run" / "needer.so", runpath(dirs["runpath"]))
    loader = Loader(exe, dirs["llp"], cache)
    assert answer(loader, with_rpath) == found(f"{dirs['rpath']}/{NAME}", "DT_RPATH")
    assert answer(loader, with_runpath) == found(f"{dirs['llp']}/{NAME}", "LD_LIBRARY_PATH")
    assert answer(Loader(exe, "", cache), with_runpath) == found(f"{dirs['runpath']}/{NAME}", "DT_RUNPATH")
    assert answer(Loader(exe, "", cache)) == found(f"{dirs['cache']}/{NAME}", "/etc/ld.so.cache")
    assert answer(Loader(exe, "", Cache())) is None  # not in any default directory


def test_a_name_in_no_search_path_is_found_in_the_default_dirs(tmp_path):
    """libc.so.6 with no search path and an empty cache: one of the loader's built-in directories for
    the executable's machine (multiarch first), as ld.so(8) step 5 says."""
    exe = build(tmp_path / "exe")
    result = Loader(exe, "", Cache()).find("libc.so.6")
    assert result is not None and result.rule == "default path", result
    assert os.path.dirname(result.path) in default_dirs(exe.info.machine), result


def test_ld_library_path_is_split_as_the_loader_splits_it(place, tmp_path):
    """Colons and semicolons separate entries; the first directory holding the name answers."""
    exe = build(tmp_path / "exe")
    d = place("second")
    assert answer(Loader(exe, f"{tmp_path / 'none'};{d}:{tmp_path}", Cache())) == \
        found(f"{d}/{NAME}", "LD_LIBRARY_PATH")


# ---------------------------------------------------------------- whose DT_RPATH, and when

def test_the_executables_rpath_serves_a_library_without_runpath(place, tmp_path):
    """A library without DT_RUNPATH: its own DT_RPATH, then the executable's (do_preload: a preloaded hook
    is loaded by the executable), both before LD_LIBRARY_PATH."""
    exe_dir = place("exe-lib")
    exe = build(tmp_path / "exe", rpath(exe_dir))
    needer = build(tmp_path / "needer.so", rpath(str(tmp_path / "empty")))
    assert answer(Loader(exe, place("llp"), Cache()), needer) == found(f"{exe_dir}/{NAME}", "DT_RPATH")
    assert Loader(exe, "", Cache()).library_dirs() == [exe_dir]


def test_an_executable_with_runpath_lends_no_rpath(place, tmp_path):
    """An executable with DT_RUNPATH has its DT_RPATH ignored, and its DT_RUNPATH serves its own needs
    only: a library's need goes to LD_LIBRARY_PATH. (With both tags, which older linkers wrote and this
    one does not, the executable's facts are given here.)"""
    built = build(tmp_path / "exe", runpath(place("exe-runpath")))
    both = Object(built.path, DynamicInfo(64, built.info.machine, (), None, (place("exe-rpath"),),
                                          built.info.runpath))
    needer = build(tmp_path / "needer.so")
    llp = place("llp")
    for exe in (built, both):
        assert answer(Loader(exe, llp, Cache()), needer) == found(f"{llp}/{NAME}", "LD_LIBRARY_PATH")
        assert answer(Loader(exe, "", Cache()), needer) is None
    assert answer(Loader(both, "", Cache())) == found(f"{tmp_path}/exe-runpath/{NAME}", "DT_RUNPATH")


def test_an_object_with_runpath_ignores_its_own_rpath(place, tmp_path):
    """An object with both tags (older linkers wrote both): DT_RPATH is not searched, DT_RUNPATH is, after
    LD_LIBRARY_PATH. (The linker writes one or the other, so the object's facts are given here.)"""
    exe = build(tmp_path / "exe")
    path = str(tmp_path / "both.so")
    both = Object(path, DynamicInfo(64, exe.info.machine, (NAME,), None, (place("rpath"),), (place("runpath"),)))
    assert answer(Loader(exe, "", Cache()), both) == found(f"{tmp_path}/runpath/{NAME}", "DT_RUNPATH")
    llp = place("llp")
    assert answer(Loader(exe, llp, Cache()), both) == found(f"{llp}/{NAME}", "LD_LIBRARY_PATH")


# ---------------------------------------------------------------- $ORIGIN

@pytest.mark.parametrize("origin", ["$ORIGIN", "${ORIGIN}"])
@pytest.mark.parametrize("tag", [rpath, runpath], ids=["DT_RPATH", "DT_RUNPATH"])
def test_origin_is_the_directory_of_the_object_whose_entry_it_is(place, tmp_path, origin, tag):
    """``$ORIGIN/../lib`` in a library under ``pkg/bin`` finds ``pkg/lib``; the same in the executable
    (elsewhere) expands to the executable's directory, not the library's."""
    lib_dir = place("pkg/lib")
    needer = build(tmp_path / "pkg" / "bin" / "needer.so", tag(f"{origin}/../lib"))
    exe = build(tmp_path / "exe")
    assert needer.info.rpath + needer.info.runpath == (f"{origin}/../lib",)  # the linker kept it as written
    rule = "DT_RPATH" if tag is rpath else "DT_RUNPATH"
    assert answer(Loader(exe, "", Cache()), needer) == found(f"{lib_dir}/{NAME}", rule)
    exe_with_origin = build(tmp_path / "pkg" / "bin" / "sub" / "exe", rpath(f"{origin}/../lib"))
    assert Loader(exe_with_origin, "", Cache()).library_dirs() == [f"{tmp_path}/pkg/bin/sub/../lib"]


# ---------------------------------------------------------------- a file the loader would not map

@pytest.mark.parametrize("kind", [{"elf_class": 32}, {"machine": 183}, {"machine": 3}],
                         ids=["ELFCLASS32", "aarch64", "i386"])
def test_a_file_of_another_class_or_machine_is_skipped_and_the_search_goes_on(lib, place, tmp_path, kind):
    """The first LD_LIBRARY_PATH directory holds ``NAME`` for another ELF class or machine: the loader
    skips it and takes the next directory's; the same file in the cache, or named by path, is refused."""
    exe = build(tmp_path / "exe")
    other = tmp_path / "other" / NAME
    retyped(str(lib), other, **kind)
    assert read_kind(str(other)) != (exe.info.elf_class, exe.info.machine)
    good = place("good")
    assert answer(Loader(exe, f"{other.parent}:{good}", Cache())) == found(f"{good}/{NAME}", "LD_LIBRARY_PATH")
    assert answer(Loader(exe, "", Cache({NAME: str(other)}))) is None
    assert Loader(exe, "", Cache()).find(str(other)) is None
    assert answer(Loader(exe, "", Cache()), name=str(good) + "/" + NAME) == (f"{good}/{NAME}", "path")


def test_default_dirs_follow_the_executables_machine():
    """Debian's loader searches its machine's multiarch directories first; an unknown machine has none."""
    assert default_dirs(62)[:2] == ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu")
    assert default_dirs(183)[:2] == ("/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu")
    assert default_dirs(3) == ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


# ---------------------------------------------------------------- LD_PRELOAD

def test_a_preloaded_object_answers_its_name_and_soname_before_any_search(lib, place, tmp_path):
    """An LD_PRELOAD entry, by path, is matched by its DT_SONAME before DT_RPATH is searched; a
    torch_memory_saver entry is left out (a plan replaces it), and so is one the loader would skip."""
    exe = build(tmp_path / "exe", rpath(place("rpath")))
    preload = str(tmp_path / "pre" / "libpre.so")
    os.makedirs(os.path.dirname(preload))
    shutil.copy(lib, preload)  # SONAME NAME, under another file name
    tms = str(tmp_path / "torch_memory_saver_hook_mode_preload_cu13.abi3.so")
    shutil.copy(lib, tms)
    loader = Loader(exe, "", Cache(), preload=f"{tms} {tmp_path / 'missing.so'}:{preload}")
    assert loader.preloaded == [(preload, preload)]
    assert answer(loader) == (preload, PRELOADED)


def test_a_preload_entry_by_name_is_found_by_the_search_and_then_answers_that_name(place, tmp_path):
    """An LD_PRELOAD entry without a slash is searched for like a DT_NEEDED one (the executable's
    DT_RPATH here); a later need of that name is the object already loaded, not a second search."""
    exe = build(tmp_path / "exe", rpath(place("rpath")))
    loader = Loader(exe, place("llp"), Cache(), preload=NAME)
    assert loader.preloaded == [(NAME, f"{tmp_path}/rpath/{NAME}")]
    assert answer(loader, build(tmp_path / "needer.so", runpath(place("runpath")))) == \
        (f"{tmp_path}/rpath/{NAME}", PRELOADED)


# ---------------------------------------------------------------- glibc-hwcaps copies in the cache

# GLIBC_TUNABLES that take ISA levels away from this CPU: none, x86-64-v4's and v3's, all but the baseline.
HWCAPS_TUNABLES = ["", "glibc.cpu.hwcaps=-AVX512F,-AVX2", "glibc.cpu.hwcaps=-AVX512F,-AVX2,-SSE4_2"]


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64-vN subdirectories are x86-64's")
@pytest.mark.parametrize("tunables", HWCAPS_TUNABLES, ids=["all-levels", "up-to-v2", "baseline"])
def test_a_name_with_glibc_hwcaps_copies_is_answered_as_the_real_loader_maps_it(lib, tmp_path, tunables):
    """ldconfig lists a library found plainly and under ``glibc-hwcaps/x86-64-v2/`` and ``x86-64-v3/`` three
    times; ld.so maps the copy of the best subdirectory the CPU runs, the plain one where it runs none
    (elf/dl-cache.c). The model asks the loader which it runs (``ld.so --help``, under the same
    GLIBC_TUNABLES) and answers the file the real loader maps, from a cache built by the real ldconfig and
    mounted as /etc/ld.so.cache."""
    from support import Host
    from tms_autopreload import glibc_hwcaps, ldcache

    libdir = tmp_path / "lib"
    for sub in ("", "glibc-hwcaps/x86-64-v2", "glibc-hwcaps/x86-64-v3"):
        (libdir / sub).mkdir(parents=True, exist_ok=True)
        shutil.copy(lib, libdir / sub / NAME)
    host = need(Host, tmp_path / "host", [libdir])
    program = build(tmp_path / "needer", "-Wl,--no-as-needed", f"-L{libdir}", "-l:" + NAME)
    env = {"LD_TRACE_LOADED_OBJECTS": "1", **({"GLIBC_TUNABLES": tunables} if tunables else {})}
    loader = read_dynamic(os.path.realpath(sys.executable)).interpreter
    assert loader is not None
    traced = host.run([loader, program.path], env)  # as ldd asks: the loader lists a library's objects too
    assert traced.returncode == 0, traced
    mapped = next(line.split(" => ")[1].split(" (")[0] for line in traced.stdout.splitlines() if NAME in line)

    cache = ldcache.LdCache(host.cache.read_bytes(), program.info.machine,
                            lambda: glibc_hwcaps.used(loader, {"GLIBC_TUNABLES": tunables}))
    assert cache.lookup(NAME) == mapped
    if not tunables and glibc_hwcaps.used(loader):
        assert "/glibc-hwcaps/x86-64-v3/" in mapped  # this CPU runs x86-64-v3's code: that copy, not the plain
    if tunables.endswith("SSE4_2"):
        assert mapped == str(libdir / NAME)


def test_the_loader_says_which_glibc_hwcaps_subdirectories_it_uses():
    """``ld.so --help``'s list, read: the names marked "(supported, searched)", best first; none from a
    loader that says nothing of them, or from one that cannot start."""
    text = ("\nSubdirectories of glibc-hwcaps directories, in priority order:\n  x86-64-v4\n"
            "  x86-64-v3 (supported, searched)\n  x86-64-v2 (supported, searched)\n\n"
            "Legacy HWCAP subdirectories under library search path directories:\n  x86_64 (supported, searched)\n")
    from tms_autopreload import glibc_hwcaps

    assert glibc_hwcaps.parse(text) == ("x86-64-v3", "x86-64-v2")
    assert glibc_hwcaps.parse("No subdirectories of glibc-hwcaps directories are searched.\n") == ()
    assert glibc_hwcaps.used("/nonexistent/ld.so") == ()
    assert glibc_hwcaps.used("/bin/false") == ()


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the x86-64-vN subdirectories are x86-64's")
@pytest.mark.parametrize("tunables", HWCAPS_TUNABLES, ids=["all-levels", "up-to-v2", "baseline"])
def test_a_glibc_hwcaps_copy_marked_for_an_isa_level_is_judged_by_the_cpu_as_the_real_loader_judges_it(
        tmp_path, tunables):
    """A copy in ``glibc-hwcaps/x86-64-v2/`` whose GNU property note asks for x86-64-v3 (``-z x86-64-v3``;
    ldconfig writes the level into the cache): ld.so takes it where it uses the subdirectory and the CPU runs
    that level, which GLIBC_TUNABLES does not change (it changes only the subdirectories used). The model
    answers the file the real loader maps, from a cache built by the real ldconfig."""
    from support import Host
    from tms_autopreload import glibc_hwcaps, ldcache

    libdir = tmp_path / "lib"
    (libdir / "glibc-hwcaps" / "x86-64-v2").mkdir(parents=True)
    need(cc, libdir / NAME, "int found(void) { return 1; }\n", f"-Wl,-soname,{NAME}")
    need(cc, libdir / "glibc-hwcaps" / "x86-64-v2" / NAME, "int found(void) { return 2; }\n", f"-Wl,-soname,{NAME}",
         "-Wl,-z,x86-64-v3")
    host = need(Host, tmp_path / "host", [libdir])
    program = build(tmp_path / "needer", "-Wl,--no-as-needed", f"-L{libdir}", "-l:" + NAME)
    loader = read_dynamic(os.path.realpath(sys.executable)).interpreter
    env = {"LD_TRACE_LOADED_OBJECTS": "1", **({"GLIBC_TUNABLES": tunables} if tunables else {})}
    traced = host.run([loader, program.path], env)
    assert traced.returncode == 0, traced
    mapped = next(line.split(" => ")[1].split(" (")[0] for line in traced.stdout.splitlines() if NAME in line)

    cache = ldcache.LdCache(host.cache.read_bytes(), program.info.machine,
                            lambda: glibc_hwcaps.used(loader, {"GLIBC_TUNABLES": tunables}),
                            lambda: glibc_hwcaps.used(loader, {}))
    assert cache.lookup(NAME) == mapped
    if tunables == HWCAPS_TUNABLES[1] and "x86-64-v3" in glibc_hwcaps.used(loader, {}):
        assert "/glibc-hwcaps/x86-64-v2/" in mapped  # v3 taken from the subdirectories, not from the CPU


def test_a_preload_entry_the_loader_cannot_map_answers_no_name(lib, place, tmp_path):
    """An LD_PRELOAD entry whose ELF header is whole but whose program headers are cut off: the real loader
    says it "cannot be preloaded" and searches every name as without it; the model, which cannot read that
    entry's dynamic section, finds each name where the loader does."""
    import subprocess

    from tms_autopreload.trace import run_trace

    cut = tmp_path / "libcut.so"
    cut.write_bytes(Path(lib).read_bytes()[:200])
    main = tmp_path / "main.c"
    main.write_text("int found(void);\nint main(void) { return found() - 1; }\n")
    exe = tmp_path / "exe"
    subprocess.run(["gcc", "-o", str(exe), str(main), f"-L{place('rpath')}", f"-l:{NAME}",
                    f"-Wl,--disable-new-dtags,-rpath,{tmp_path / 'rpath'}"], check=True, capture_output=True)
    trace = run_trace(str(exe), {"LD_PRELOAD": str(cut), "PATH": os.environ["PATH"]})
    assert trace.resolved[NAME] == f"{tmp_path}/rpath/{NAME}", trace
    loader = Loader.for_executable(str(exe), "", str(cut))
    assert answer(loader) == found(trace.resolved[NAME], "DT_RPATH")
