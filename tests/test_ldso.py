"""tms_autopreload.ldso's loader model, in-process, on small objects gcc builds: the search order of
ld.so(8) ("Finding shared objects"): DT_RPATH, LD_LIBRARY_PATH, DT_RUNPATH, the cache, the default
directories; ``$ORIGIN``; a file of another ELF class or machine skipped; LD_PRELOAD matched first.

The real loader's agreement with this model, on real hooks and runtimes, is test_runpath_model's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import need
from support import HWCAPS_TUNABLES, ROOT, cc, retyped

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


def test_the_rpath_of_each_object_up_the_chain_that_loaded_it_is_searched(place, tmp_path):
    """For the needs of a library a preloaded hook brought in: its own DT_RPATH, then the hook's (the object
    whose need loaded it), and on up to the program's (elf/dl-load.c: "Then that object's dependent, and on
    up"), all before LD_LIBRARY_PATH; an object with DT_RUNPATH lends none."""
    exe = build(tmp_path / "exe", rpath(place("exe-rpath")))
    hook = build(tmp_path / "hook.so", rpath(place("hook-rpath")))
    library = build(tmp_path / "library.so")
    brought = Object(library.path, library.info, hook)
    llp = place("llp")
    assert answer(Loader(exe, llp, Cache()), brought) == found(f"{tmp_path}/hook-rpath/{NAME}", "DT_RPATH")
    deeper = Object(library.path, library.info, brought)
    assert answer(Loader(exe, llp, Cache()), deeper) == found(f"{tmp_path}/hook-rpath/{NAME}", "DT_RPATH")
    hook_both = Object(hook.path, DynamicInfo(64, hook.info.machine, (), None, hook.info.rpath, (place("run"),)))
    assert answer(Loader(exe, llp, Cache()), Object(library.path, library.info, hook_both)) == \
        found(f"{tmp_path}/exe-rpath/{NAME}", "DT_RPATH")


def test_an_empty_runpath_still_turns_rpath_off(place, tmp_path):
    """An object whose DT_RUNPATH is empty (``patchelf --set-rpath ''``, as a tool that strips a search path
    leaves it) searches no DT_RPATH, its own nor the executable's: the tag decides, though the loader
    searches no directory of it (elf/dl-load.c, _dl_map_new_object and decompose_rpath)."""
    exe = build(tmp_path / "exe", rpath(place("exe-rpath")))
    path = build(tmp_path / "needer.so").path
    subprocess.run(["patchelf", "--set-rpath", "", path], check=True)
    emptied = Object(path, read_dynamic(path))
    assert emptied.info.runpath == () and emptied.info.rpath == ()
    both = Object(path, DynamicInfo(64, exe.info.machine, (NAME,), None, (place("own-rpath"),), ()))
    llp = place("llp")
    for needer in (emptied, both):
        assert answer(Loader(exe, "", Cache()), needer) is None
        assert answer(Loader(exe, llp, Cache()), needer) == found(f"{llp}/{NAME}", "LD_LIBRARY_PATH")


@pytest.mark.parametrize("tag", [rpath, runpath], ids=["DT_RPATH", "DT_RUNPATH"])
def test_an_empty_entry_of_a_search_path_is_the_current_directory(place, tmp_path, monkeypatch, tag):
    """``/nowhere:`` (a build script appending an unset variable writes it): the empty entry is the current
    directory, as in LD_LIBRARY_PATH (elf/dl-load.c, fillin_rpath); the file is found by its name alone."""
    exe = build(tmp_path / "exe")
    needer = build(tmp_path / "needer.so", tag(f"{tmp_path}/nowhere:"))
    assert needer.info.rpath + (needer.info.runpath or ()) == (f"{tmp_path}/nowhere", "")
    rule = "DT_RPATH" if tag is rpath else "DT_RUNPATH"
    assert answer(Loader(exe, "", Cache()), needer) is None
    monkeypatch.chdir(place("cwd"))
    assert answer(Loader(exe, "", Cache()), needer) == (NAME, rule)


# ---------------------------------------------------------------- $ORIGIN

@pytest.mark.parametrize("origin", ["$ORIGIN", "${ORIGIN}"])
@pytest.mark.parametrize("tag", [rpath, runpath], ids=["DT_RPATH", "DT_RUNPATH"])
def test_origin_is_the_directory_of_the_object_whose_entry_it_is(place, tmp_path, origin, tag):
    """``$ORIGIN/../lib`` in a library under ``pkg/bin`` finds ``pkg/lib``; the same in the executable
    (elsewhere) expands to the executable's directory, not the library's."""
    lib_dir = place("pkg/lib")
    needer = build(tmp_path / "pkg" / "bin" / "needer.so", tag(f"{origin}/../lib"))
    exe = build(tmp_path / "exe")
    assert needer.info.rpath + (needer.info.runpath or ()) == (f"{origin}/../lib",)  # the linker kept it as written
    rule = "DT_RPATH" if tag is rpath else "DT_RUNPATH"
    assert answer(Loader(exe, "", Cache()), needer) == found(f"{lib_dir}/{NAME}", rule)
    exe_with_origin = build(tmp_path / "pkg" / "bin" / "sub" / "exe", rpath(f"{origin}/../lib"))
    assert Loader(exe_with_origin, "", Cache()).library_dirs() == [f"{tmp_path}/pkg/bin/sub/../lib"]


def test_dot_dot_after_a_directory_link_is_the_parent_of_the_links_target(place, tmp_path):
    """``$ORIGIN/../deps`` of a library reached through a directory link (``lnk -> store/lib``, as a package
    manager's view links a package's directory) is ``store/deps``: the kernel takes ``..`` after a link to its
    target's parent, not the link's. The path is written without ``..`` only where that names the same file."""
    exe = build(tmp_path / "exe")
    deps = place("store/deps")
    needer = build(tmp_path / "store" / "lib" / "needer.so", runpath("$ORIGIN/../deps"))
    (tmp_path / "lnk").symlink_to("store/lib")
    through_link = Object(str(tmp_path / "lnk" / "needer.so"), needer.info)
    assert answer(Loader(exe, "", Cache()), needer) == (f"{deps}/{NAME}", "DT_RUNPATH")
    assert answer(Loader(exe, "", Cache()), through_link) == (f"{tmp_path}/lnk/../deps/{NAME}", "DT_RUNPATH")
    place("deps")  # the link's own parent's deps/: not the one the kernel reaches
    assert answer(Loader(exe, "", Cache()), through_link) == (f"{tmp_path}/lnk/../deps/{NAME}", "DT_RUNPATH")


def test_origin_in_ld_library_path_and_in_a_path_is_the_directory_of_the_program_or_the_needer(place, tmp_path):
    """ld.so(8) expands ``$ORIGIN`` also in LD_LIBRARY_PATH and in a name with a slash: to the program's
    directory there and in an LD_PRELOAD entry (the program loads it), to the needing object's in a DT_NEEDED
    path."""
    lib_dir = place("pkg/lib")
    exe = build(tmp_path / "pkg" / "bin" / "exe")
    assert answer(Loader(exe, "$ORIGIN/../lib", Cache())) == found(f"{lib_dir}/{NAME}", "LD_LIBRARY_PATH")
    entry = f"$ORIGIN/../lib/{NAME}"
    preloading = Loader(exe, "", Cache(), preload=entry)
    assert preloading.preloaded == [(entry, f"{tmp_path}/pkg/bin/../lib/{NAME}")]
    assert answer(preloading) == (f"{tmp_path}/pkg/bin/../lib/{NAME}", PRELOADED)
    needer = build(tmp_path / "pkg" / "lib" / "needer.so")
    assert answer(Loader(exe, "", Cache()), needer, name="${ORIGIN}/" + NAME) == (f"{lib_dir}/{NAME}", "path")


@pytest.mark.parametrize("tag", [rpath, runpath], ids=["DT_RPATH", "DT_RUNPATH"])
def test_origin_of_an_object_found_in_the_current_directory_is_that_directory(lib, tmp_path, monkeypatch, tag):
    """An object found through an empty LD_LIBRARY_PATH entry has a relative path (``needer.so``); its
    ``$ORIGIN/../deps`` is the current directory's ``../deps``, as the loader makes the object's directory
    absolute when it maps it (elf/dl-object.c), not ``/../deps``. The real loader's trace says the same."""
    from tms_autopreload import trace

    deps = tmp_path / "deps"
    deps.mkdir()
    shutil.copy(lib, deps / NAME)
    here = tmp_path / "here"
    needer = here / "libneeder.so"
    need(cc, needer, "int needer(void) { return 0; }\n", "-Wl,--no-as-needed", f"-L{deps}", "-l:" + NAME,
         "-Wl,-soname,libneeder.so", tag("$ORIGIN/../deps"))
    program = tmp_path / "program"
    need(cc, program, "int main(void) { return 0; }\n", "-Wl,--no-as-needed", f"-L{here}", "-lneeder", shared=False)
    monkeypatch.chdir(here)
    traced = trace.run_trace(str(program), {"LD_LIBRARY_PATH": ":"})
    assert traced.ok and os.path.normpath(traced.resolved[NAME]) == str(deps / NAME), (traced.resolved, traced.errors)
    loader = Loader(Object(str(program), read_dynamic(str(program))), ":", Cache())
    found_needer = loader.find("libneeder.so")
    assert found_needer is not None and found_needer.path == "libneeder.so"
    rule = "DT_RPATH" if tag is rpath else "DT_RUNPATH"
    needing = Object(found_needer.path, read_dynamic(found_needer.path))
    assert answer(loader, needing) == found(f"{deps}/{NAME}", rule)


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


@pytest.mark.parametrize("content", [b"", b"INPUT(-lfound)\n"], ids=["empty", "linker-script"])
def test_a_file_that_is_no_elf_object_stops_the_search_as_it_stops_the_loader(lib, place, tmp_path, content):
    """A file named like the library that is no ELF object at all (an empty one, a truncated download, a linker
    script) is not passed over as another class's is: the loader stops there with an error (elf/dl-load.c,
    open_verify: "file too short", "invalid ELF header"), so the name is found nowhere, whatever comes later."""
    from tms_autopreload import trace

    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / NAME).write_bytes(content)
    good = place("good")
    program = tmp_path / "program"
    need(cc, program, "int main(void) { return 0; }\n", "-Wl,--no-as-needed", f"-L{good}", "-l:" + NAME, shared=False)
    traced = trace.run_trace(str(program), {"LD_LIBRARY_PATH": f"{bad}:{good}"})
    assert traced.status == 127 and str(bad / NAME) in traced.reason(), traced.reason()
    exe = Object(str(program), read_dynamic(str(program)))
    assert answer(Loader(exe, f"{bad}:{good}", Cache())) is None
    assert answer(Loader(exe, "", Cache({NAME: str(bad / NAME)}))) is None
    assert Loader(exe, "", Cache()).find(str(bad / NAME)) is None
    assert answer(Loader(exe, str(good), Cache({NAME: str(bad / NAME)}))) == found(f"{good}/{NAME}", "LD_LIBRARY_PATH")


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


# ---------------------------------------------------------------- the loader's trace, read

def test_a_name_found_in_the_current_directory_is_read_from_the_trace(lib, tmp_path, monkeypatch):
    """Through an empty LD_LIBRARY_PATH entry the loader opens the name itself, and its trace prints the name
    once, with no ``=>`` (``\tlibfound.so.1 (0x...)``): the reader takes that for the name resolved to itself,
    and the kernel's vDSO, printed the same way, for no object at all."""
    from tms_autopreload import trace

    program = tmp_path / "program"
    need(cc, program, "int main(void) { return 0; }\n", "-Wl,--no-as-needed", f"-L{lib.parent}", "-l:" + NAME,
         shared=False)
    monkeypatch.chdir(lib.parent)
    traced = trace.run_trace(str(program), {"LD_LIBRARY_PATH": f"{tmp_path}/nowhere:"})
    assert traced.ok and traced.resolved[NAME] == NAME, (traced.resolved, traced.errors)
    assert not any(name.startswith("linux-") for name in traced.resolved), traced.resolved
    assert answer(Loader(Object(str(program), read_dynamic(str(program))), f"{tmp_path}/nowhere:", Cache())) == \
        (NAME, "LD_LIBRARY_PATH")


# ---------------------------------------------------------------- glibc-hwcaps copies in the cache

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
    env = {"GLIBC_TUNABLES": tunables} if tunables else {}
    loader = read_dynamic(os.path.realpath(sys.executable)).interpreter
    assert loader is not None
    traced, = host.traces([([loader, program.path], env)])  # as ldd asks: the loader lists a library's objects too
    assert traced.ok, traced.reason()
    mapped = traced.resolved[NAME]

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
    env = {"GLIBC_TUNABLES": tunables} if tunables else {}
    traced, = host.traces([([loader, program.path], env)])
    assert traced.ok, traced.reason()
    mapped = traced.resolved[NAME]

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
