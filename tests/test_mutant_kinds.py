"""Bugs a person could make in the decision core that no other test caught, one test for each kind.

Each was made by hand (``tests/mutants/``: the patch that makes it, and ``make mutants-patches`` counts how many
such bugs the suite catches) and got through the suite before: the step it breaks was never reached by a
host whose files disagree, whose copies compete, or whose children need what the plan moves. The
conda-layout kind (a user's own ``LD_PRELOAD`` kept beside the runtime preloaded by path) is in
``tests/test_conda.py``, with the worlds it needs. The last three are pure steps the fast lane reached only
where they could not fail (no hard-linked build, no group-writable file, an interpreter without site.py's
hidden-file check).

The tests after those are a later sample's kinds, each made by hand and seen to get through the fast lane:
``doctor --deep`` answering ok where one library bypasses the hook beside others that reach it (no test had
such a mix); a child started with other overrides than its parent's keeping its parent's build (only a docs
test read the state variable's fields); without torch, NVIDIA's pip wheel's runtime copy taken over the one the
loader finds (the world with both was checked only for ``doctor`` agreeing with the hook). Two more of that
sample are tested beside the worlds they need: a venv given its base interpreter's site-packages
(``tests/test_sitepath.py``) and pip's own reinstall command losing ``--force-reinstall``
(``tests/test_way_out.py``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from types import SimpleNamespace

import pytest
import support
from conftest import assert_applied, mode_env, report_host
from support import MAPPED, REEXECD, assert_stopped

sys.path.insert(0, str(support.ROOT))

from tms_autopreload import builds, elf, ldcache, sitepath, trust

CU12 = "torch_memory_saver_hook_mode_preload_cu12.abi3.so"
CU13 = "torch_memory_saver_hook_mode_preload_cu13.abi3.so"

# A flagged process's report: after torch's first load (libtorch_global_deps.so; the stand-in cannot be
# imported), what is mapped, whether the hook's exec started this image, and whether a bash child runs.
PROBE = REEXECD + MAPPED + """
import ctypes, json, os, subprocess, sys
site = next(p for p in sys.path if p.endswith('site-packages'))
ctypes.CDLL(os.path.join(site, 'torch', 'lib', 'libtorch_global_deps.so'))
child = subprocess.run(['bash', '-c', 'true'], capture_output=True, text=True)
print(json.dumps({'maps': mapped('.so'), 'reexecd': reexecd(), 'child': [child.returncode, child.stderr]}))
"""


def probe(scn, mode: str, env: dict[str, str] | None = None) -> dict:
    r = scn.flagged(PROBE, {**mode_env(mode), **(env or {})})
    assert r.returncode == 0, f"rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return json.loads(r.stdout.strip().splitlines()[-1])


def named(out: dict, part: str) -> list[str]:
    return [m for m in out["maps"] if part in os.path.basename(m)]


def test_doctor_fails_when_torchs_version_and_its_linked_runtime_disagree(scenario):
    """torch/version.py says CUDA 12 while libtorch_global_deps.so links libcudart.so.13 (a torch reinstalled
    over another, half of each): no plan for either major, ``doctor`` names the inconsistent-torch cause,
    and a flagged start stops before user code."""
    scn = scenario(tms="0.0.10", torch=None, host=("driver", "cuda12", "cuda13"), tag="torch-disagrees")
    support.write_torch_standin(scn.site, cuda="12.8", hip=None, deps_lib=scn.parts.global_deps("cu13-sys"))
    doc = scn.doctor()
    assert not doc["ok"] and doc["cause"] == "torch-inconsistent", doc
    assert "torch/version.py says cuda 12" in doc["error"] and "links libcudart.so.13" in doc["error"], doc["error"]
    assert_stopped(scn.flagged("print('user code ran')"), "inconsistent", "reinstall torch")


@pytest.mark.parametrize("mode", ["exec", "dlopen"])
def test_the_wheel_copy_torch_loads_by_path_is_bound_when_global_deps_finds_another(scenario, mode):
    """A pip CUDA 13 torch whose libtorch_global_deps.so has no DT_RPATH to NVIDIA's wheel (so alone it finds
    the system CUDA 13 runtime in the loader cache), with that wheel installed: torch loads the wheel's copy
    by path once imported, so that copy is the runtime; the hook alone would bind the system one, and the
    plan puts the wheel's directory first on LD_LIBRARY_PATH. One copy is mapped: the wheel's."""
    scn = scenario(tms="0.0.9.post1", torch=None, pip=(13,), host=("driver", "cuda13"), tag="deps-find-system")
    support.write_torch_standin(scn.site, cuda="13.0", hip=None, deps_lib=scn.parts.global_deps("cu13-sys"))
    wheel_dir = scn.site / "nvidia" / "cu13" / "lib"
    system_copy = scn.parts.rt[13] / "libcudart.so.13"
    doc = scn.doctor()
    assert doc["ok"], doc["error"]
    assert doc["runtime"]["library"] == str(wheel_dir / "libcudart.so.13"), doc["runtime"]
    assert doc["runtime"]["library_rule"] == "torch by path", doc["runtime"]
    assert f"libtorch_global_deps.so alone would find {system_copy}" in doc["runtime"]["library_why"], doc["runtime"]
    assert doc["plan"]["env"]["LD_LIBRARY_PATH"].split(":")[0] == str(wheel_dir), doc["plan"]
    out = probe(scn, mode)
    assert_applied(mode, out["reexecd"], named(out, "torch_memory_saver"), scn.site / CU13)
    assert named(out, "libcudart") == [str(wheel_dir / "libcudart.so.13")], out["maps"]
    assert out["child"] == [0, ""], out["child"]


def test_a_build_is_classified_by_what_it_links_never_by_its_name(scenario, tmp_path):
    """The CUDA 13 build copied to a ``_cu12`` name is a CUDA 13 build (its DT_NEEDED says libcudart.so.13),
    and forced with TMS_AUTOPRELOAD_PATH on a CUDA 13 host it is the plan and is mapped; the CUDA 12 build
    under the ``_cu13`` name is refused as the CUDA 12 build it is."""
    scn = scenario(tms="0.0.10", torch="cu13-sys", host=("driver", "cuda13"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cu13_as_cu12 = str(shutil.copy(scn.site / CU13, tmp_path / "a" / CU12))
    cu12_as_cu13 = str(shutil.copy(scn.site / CU12, tmp_path / "b" / CU13))
    want = elf.read_dynamic(os.path.realpath(sys.executable))
    assert (builds.read_build(cu13_as_cu12, want).kind, builds.read_build(cu13_as_cu12, want).major) == ("cuda", 13)
    assert builds.read_build(cu12_as_cu13, want).major == 12
    env = {"TMS_AUTOPRELOAD_PATH": cu13_as_cu12}
    doc = scn.doctor(env)
    assert doc["ok"] and doc["plan"]["build"] == cu13_as_cu12, doc
    out = probe(scn, "exec", env)
    assert_applied("exec", out["reexecd"], named(out, "torch_memory_saver"), cu13_as_cu12)
    doc = scn.doctor({"TMS_AUTOPRELOAD_PATH": cu12_as_cu13})
    assert not doc["ok"] and "not for this process's CUDA 13" in doc["error"], doc


def test_a_child_whose_own_library_the_plan_shadows_gives_the_child_fails_cause(scenario, tmp_path):
    """The plan binds torch's pip runtime by putting ``nvidia/cu13/lib`` first on LD_LIBRARY_PATH (the hook
    alone would bind the system CUDA 13 copy). A ``libtinfo.so.6`` there that needs a missing library is
    what bash would then load instead of its own: the interpreter starts, its bash child would not (127).
    The candidate is refused with the child-fails cause, and a flagged start stops before user code."""
    scn = scenario(tms="0.0.9.post1", torch="cu13-pip", pip=(13,), host=("driver", "cuda13"), tag="child-shadowed")
    lib = scn.site / "nvidia" / "cu13" / "lib"
    missing = support.cc(tmp_path / "libtms_test_gone.so.1", "int tms_test_gone(void) { return 0; }\n",
                         "-Wl,-soname,libtms_test_gone.so.1")
    support.cc(lib / "libtinfo.so.6", "int tms_test_tinfo(void) { return 0; }\n", "-Wl,-soname,libtinfo.so.6",
               "-Wl,--no-as-needed", f"-L{tmp_path}", "-l:libtms_test_gone.so.1")
    missing.unlink()
    r = subprocess.run(["bash", "-c", "true"], env={"PATH": os.environ["PATH"], "LD_LIBRARY_PATH": str(lib)},
                       capture_output=True, text=True)
    assert r.returncode == 127 and "libtms_test_gone.so.1" in r.stderr, r.stderr  # what the plan would do to bash
    doc = scn.doctor()
    assert not doc["ok"], doc["plan"]
    cu13 = next(c for c in doc["candidates"] if os.path.basename(c["path"]) == CU13)
    assert cu13["cause"] == "child-fails" and "a non-Python child" in cu13["reason"], cu13
    assert_stopped(scn.flagged("print('user code ran')"), "a non-Python child")


@pytest.mark.parametrize("mode", ["exec", "dlopen"])
def test_two_builds_mapped_at_start_end_with_only_the_right_one(scenario, mode):
    """``LD_PRELOAD=<cu12>:<cu13>`` on a host with both runtimes: both load, and two hooks fight over the same
    calls. The start re-execs once (dlopen mode cannot unmap a build, so it execs too) and then maps the
    CUDA 13 build alone."""
    scn = scenario(tms="0.0.10", torch="cu13-sys", host=("driver", "cuda12", "cuda13"))
    out = probe(scn, mode, {"LD_PRELOAD": f"{scn.site / CU12}:{scn.site / CU13}"})
    assert_applied("exec", out["reexecd"], named(out, "torch_memory_saver"), scn.site / CU13)
    assert out["child"] == [0, ""], out["child"]


# ld.so.cache in glibc's new format (sysdeps/generic/dl-cache.h): the header, then one file_entry_new
# (flags, key, value, osversion: 4 bytes each; hwcap: 8) per entry, then the strings; every offset counts
# from the header's start.
X86_64, X32, I386 = 0x0303, 0x0803, 0x0003  # FLAG_ELF_LIBC6 with FLAG_X8664_LIB64, FLAG_X8664_LIBX32, none


def cache_bytes(entries: list[tuple[int, str, str]], hwcaps: tuple[int, ...] = (),
                subdirs: tuple[str, ...] = ()) -> bytes:
    """``hwcaps``: each entry's hwcap word (0, a plain entry, where not given); ``subdirs``: the glibc-hwcaps
    names an extension section lists (struct cache_extension, tag 1), by index."""
    header, entry = 48, 24
    strings = b""
    where: dict[str, int] = {}
    for text in [t for _, key, value in entries for t in (key, value)] + list(subdirs):
        if text not in where:
            where[text] = header + entry * len(entries) + len(strings)
            strings += text.encode() + b"\0"
    strings += bytes(-len(strings) % 4)
    extension_at = header + entry * len(entries) + len(strings) if subdirs else 0
    out = b"glibc-ld.so.cache1.1" + len(entries).to_bytes(4, "little") + len(strings).to_bytes(4, "little")
    out += bytes(4) + extension_at.to_bytes(4, "little") + bytes(12)  # flags, padding; extension_offset; unused
    for i, (flags, key, value) in enumerate(entries):
        hwcap = hwcaps[i] if i < len(hwcaps) else 0
        out += b"".join(v.to_bytes(4, "little") for v in (flags, where[key], where[value], 0))
        out += hwcap.to_bytes(8, "little")
    out += strings
    if subdirs:
        words = (0xEAA42174, 1, 1, 0, extension_at + 24, 4 * len(subdirs), *(where[n] for n in subdirs))
        out += b"".join(w.to_bytes(4, "little") for w in words)
    return out


def test_an_x32_entry_ahead_of_the_x86_64_one_is_passed_over(tmp_path):
    """ldconfig sorts a name's entries by flags, highest first (elf/cache.c ``compare``), so an x32 library
    (``/libx32``) comes before the x86-64 one of the same name. The reader takes the entry of the
    interpreter's own ABI, as ld.so does, and none where the cache has none; glibc's own reader
    (``ldconfig -p``) reads the same bytes as these entries."""
    name = "libtms_test.so.1"
    data = cache_bytes([(X32, name, f"/libx32/{name}"), (X86_64, name, f"/lib/x86_64-linux-gnu/{name}"),
                        (I386, "libonly32.so.1", "/lib/i386-linux-gnu/libonly32.so.1")])
    (tmp_path / "ld.so.cache").write_bytes(data)
    listed = support.ldconfig_listing(tmp_path / "ld.so.cache")
    assert (name, "libc6,x32", None, f"/libx32/{name}") in listed, listed
    assert (name, "libc6,x86-64", None, f"/lib/x86_64-linux-gnu/{name}") in listed, listed
    assert ldcache.LdCache(data, 62).lookup(name) == f"/lib/x86_64-linux-gnu/{name}"
    assert ldcache.LdCache(data, 62).lookup("libonly32.so.1") is None
    assert ldcache.LdCache(data, 3).lookup(name) is None
    assert ldcache.LdCache(data, 3).lookup("libonly32.so.1") == "/lib/i386-linux-gnu/libonly32.so.1"
    assert ldcache.load(62, str(tmp_path / "ld.so.cache")).lookup(name) == f"/lib/x86_64-linux-gnu/{name}"


def test_a_name_the_cache_holds_only_in_a_glibc_hwcaps_subdirectory_is_found_there(tmp_path):
    """ldconfig writes a library found only in a glibc-hwcaps subdirectory (``glibc-hwcaps/x86-64-v2``) as an
    entry with its hwcap word set (DL_CACHE_HWCAP_EXTENSION and the subdirectory's index: 1 << 62 for the first,
    what glibc 2.36's ldconfig writes for this layout). Where the cache has
    no plain entry for the name, that one is the cache's answer where the loader uses the subdirectory (every
    x86-64 CPU of the last fifteen years runs x86-64-v2), and none where it does not, or where the cache lists
    no such subdirectory; a name with no entry at all is none."""
    name = "libtms_test_hw.so.1"
    hwcaps_path = f"/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/{name}"
    data = cache_bytes([(X86_64, name, hwcaps_path)], hwcaps=(1 << 62,), subdirs=("x86-64-v2",))
    (tmp_path / "ld.so.cache").write_bytes(data)
    listed = support.ldconfig_listing(tmp_path / "ld.so.cache")
    assert (name, "libc6,x86-64", "x86-64-v2", hwcaps_path) in listed, listed  # glibc's reading
    assert ldcache.LdCache(data, 62, lambda: ("x86-64-v3", "x86-64-v2")).lookup(name) == hwcaps_path
    assert ldcache.LdCache(data, 62, lambda: ("x86-64-v3",)).lookup(name) is None
    assert ldcache.LdCache(data, 62).lookup(name) is None
    assert ldcache.LdCache(data[:data.find(b"x86-64-v2")], 62, lambda: ("x86-64-v2",)).lookup(name) is None
    assert ldcache.LdCache(data, 62, lambda: ("x86-64-v2",)).lookup("libtms_test_other.so.1") is None


def test_a_glibc_hwcaps_copy_needs_the_isa_level_its_mark_names_from_the_cpu():
    """A glibc-hwcaps entry's hwcap word also holds the x86 ISA level the copy needs (bits 32-41: level N asks
    for x86-64-v(N+1)); the loader takes the copy only where the CPU runs that level, judged apart from the
    subdirectories GLIBC_TUNABLES leaves it (a level past x86-64-v4 never)."""
    name = "libtms_test_isa.so.1"
    plain, copy = f"/usr/lib/x86_64-linux-gnu/{name}", f"/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v2/{name}"
    for level, cpu, used, want in ((2, ("x86-64-v3", "x86-64-v2"), ("x86-64-v2",), copy),
                                   (2, ("x86-64-v2",), ("x86-64-v2",), plain),
                                   (0, (), ("x86-64-v2",), copy),
                                   (4, ("x86-64-v4", "x86-64-v3", "x86-64-v2"), ("x86-64-v2",), plain)):
        data = cache_bytes([(X86_64, name, copy), (X86_64, name, plain)], hwcaps=((1 << 62) | (level << 32), 0),
                           subdirs=("x86-64-v2",))
        assert ldcache.LdCache(data, 62, lambda used=used: used, lambda cpu=cpu: cpu).lookup(name) == want, level


def test_a_cache_whose_extensions_run_past_its_end_has_no_glibc_hwcaps_list(tmp_path):
    """Where any section of the cache's extension directory runs past the file's end the loader drops every
    extension, the glibc-hwcaps list too, whichever section comes first (cache_extension_load)."""
    name = "libtms_test_ext.so.1"
    plain, copy = f"/usr/lib/{name}", f"/usr/lib/glibc-hwcaps/x86-64-v2/{name}"
    data = bytearray(cache_bytes([(X86_64, name, copy), (X86_64, name, plain)], hwcaps=(1 << 62, 0),
                                 subdirs=("x86-64-v2",)))
    assert ldcache.LdCache(bytes(data), 62, lambda: ("x86-64-v2",)).lookup(name) == copy
    names_at = int.from_bytes(data[32:36], "little") + 24  # the list: after the directory's magic, count, section
    directory = len(data)  # a second directory, its glibc-hwcaps section first, then one past the end
    words = (0xEAA42174, 2, 1, 0, names_at, 4, 0, 0, directory + 40, 4)
    data += b"".join(w.to_bytes(4, "little") for w in words)
    data[32:36] = directory.to_bytes(4, "little")
    assert ldcache.LdCache(bytes(data), 62, lambda: ("x86-64-v2",)).lookup(name) == plain
    (tmp_path / "ld.so.cache").write_bytes(bytes(data))
    listed = subprocess.run(["ldconfig", "-p", "-C", str(tmp_path / "ld.so.cache")], capture_output=True, text=True)
    assert "Malformed extension data" in listed.stderr, listed  # glibc's own reader refuses its extensions too


def _second_directory(data: bytearray, sections: "list[tuple[int, int, int]]") -> bytes:
    """``data`` with its extension directory replaced by one at the file's end listing ``sections`` ((tag,
    offset, size) each), which ends the file."""
    directory = len(data)
    data += b"".join(w.to_bytes(4, "little") for w in (0xEAA42174, len(sections)))
    data += b"".join(w.to_bytes(4, "little") for tag, at, size in sections for w in (tag, 0, at, size))
    data[32:36] = directory.to_bytes(4, "little")
    return bytes(data)


def test_a_glibc_hwcaps_list_is_read_only_where_glibc_reads_it(tmp_path):
    """glibc takes the cache's list of glibc-hwcaps names only from a section aligned to 4 bytes whose size is
    a multiple of 4 (cache_extension_verify), and from a directory that fits the file, to its last byte; the
    reader does the same, and glibc's own reader (``ldconfig -p``) names the subdirectory exactly where it does."""
    name = "libtms_test_align.so.1"
    plain, copy = f"/usr/lib/{name}", f"/usr/lib/glibc-hwcaps/x86-64-v2/{name}"
    base = bytearray(cache_bytes([(X86_64, name, copy), (X86_64, name, plain)], hwcaps=(1 << 62, 0),
                                 subdirs=("x86-64-v2",)))
    names_at = int.from_bytes(base[32:36], "little") + 24
    string = base[names_at:names_at + 4]  # the name's offset: the list's one word

    def tail(extra: bytes) -> "tuple[bytearray, int]":
        grown = bytearray(base) + extra
        return grown, len(base)

    fits, _ = tail(b"")
    odd, odd_at = tail(b"\0" + string + b"\0\0\0")  # the same word at an odd offset
    padded, padded_at = tail(string + b"\0\0")  # the word and two bytes more
    cases = {"ends-the-file": (_second_directory(fits, [(1, names_at, 4)]), copy),
             "misaligned": (_second_directory(odd, [(1, odd_at + 1, 4)]), plain),
             "size-not-words": (_second_directory(padded, [(1, padded_at, 6)]), plain)}
    for case, (data, want) in cases.items():
        assert ldcache.LdCache(data, 62, lambda: ("x86-64-v2",)).lookup(name) == want, case
        (tmp_path / "ld.so.cache").write_bytes(data)
        listed = support.ldconfig_listing(tmp_path / "ld.so.cache")
        assert any(sub == "x86-64-v2" for _, _, sub, _ in listed) == (want == copy), (case, listed)


def test_an_entry_whose_path_lies_outside_the_cache_is_passed_over():
    """An entry of the name whose path offset lies past the strings is skipped, and the next one answers."""
    name = "libtms_test_gone.so.1"
    data = bytearray(cache_bytes([(X86_64, name, "/usr/lib/bad/" + name), (X86_64, name, "/usr/lib/" + name)]))
    data[48 + 8:48 + 12] = (len(data) + 100).to_bytes(4, "little")  # the first entry's value
    assert ldcache.LdCache(bytes(data), 62).lookup(name) == "/usr/lib/" + name


def test_one_build_under_two_names_is_one_candidate(tmp_path):
    """A build hard-linked under a second name (one file, two directory entries) is listed once: tried twice it
    would be judged, and reported, twice."""
    site = tmp_path / "site-packages"
    (site / "torch_memory_saver").mkdir(parents=True)
    build = shutil.copy(os.path.realpath(sys.executable), site / CU12)
    os.link(build, site / "torch_memory_saver_hook_mode_preload.abi3.so")
    want = elf.read_dynamic(os.path.realpath(sys.executable))
    found = builds.find_builds(str(site / "torch_memory_saver"), want, None)
    assert [os.path.basename(b.path) for b in found] == ["torch_memory_saver_hook_mode_preload.abi3.so"], found


def test_a_group_writable_file_counts_its_group_as_a_writer(tmp_path):
    """Group write permission lets the group change the file, whether or not every user can: its group is one
    of its writers, and every user is only where the file is world-writable."""
    path = tmp_path / "hook.so"
    path.write_bytes(b"")
    os.chown(path, -1, 54321)
    path.chmod(0o664)
    assert ("gid", 54321) in trust.writers(str(path)) and trust.EVERYONE not in trust.writers(str(path))
    path.chmod(0o666)
    assert ("gid", 54321) in trust.writers(str(path)) and trust.EVERYONE in trust.writers(str(path))


@pytest.mark.parametrize("skip_dotted", [True, False])
def test_a_dotted_pth_file_is_skipped_where_site_py_skips_hidden_ones(tmp_path, skip_dotted):
    """site.py with the hidden-file check (gh-113659: 3.13, and the early-2024 backports) skips ``.x.pth``; one
    without it reads it. The model asks which the running site.py is, so each way is tested here directly."""
    (tmp_path / "a").mkdir()
    (tmp_path / ".x.pth").write_text("a\n")
    path: list[str] = []
    sitepath.add_site_dir(str(tmp_path), path, set(), skip_dotted)
    assert path == [str(tmp_path)] + ([] if skip_dotted else [str(tmp_path / "a")])


# ---------------------------------------------------------------- doctor --deep: one library bypasses the hook

# Two libraries that call the allocator the way torch's own do, each linking the runtime by name.
CALLER = """
int cudaMalloc(void **p, unsigned long n);
int cudaFree(void *p);
int NAME(void) { void *p = 0; return cudaMalloc(&p, 16) + cudaFree(p); }
"""
# The module doctor --deep imports: one library loaded as torch loads its own, one with RTLD_DEEPBIND (its own
# dependencies first, so it binds libcudart's definitions before the hook's).
MIXED = """
import ctypes, os
here = os.path.dirname(os.path.abspath(__file__))
ctypes.CDLL(os.path.join(here, 'libtms_test_reaches.so'))
ctypes.CDLL(os.path.join(here, 'libtms_test_deepbound.so'), os.RTLD_NOW | os.RTLD_DEEPBIND)
"""


def test_doctor_deep_fails_where_one_library_bypasses_the_hook_and_another_reaches_it(scenario, parts, tmp_path):
    """The import loads two libraries that call cudaMalloc and cudaFree: one reaches the hook, one (opened with
    RTLD_DEEPBIND) binds the runtime's own definitions. reference.md: exit 0 only when every reference binds to
    the hook. A CI step trusts the exit status, so one bypassing library among intercepted ones must fail it, in
    the text and the JSON form alike, with each library's real bindings and status as the loader logged them."""
    scn = report_host(scenario)
    mods = tmp_path / "mods"
    link = ["-Wl,--no-as-needed", f"-L{parts.rt[13]}", "-l:libcudart.so.13"]
    for name in ("reaches", "deepbound"):
        support.cc(mods / f"libtms_test_{name}.so", CALLER.replace("NAME", name), *link)
    (mods / "tms_test_mixed.py").write_text(MIXED)
    argv = ["-m", "tms_autopreload", "doctor", "--deep", "--import", "tms_test_mixed"]
    env = {"PYTHONPATH": str(mods)}
    r = scn.run([*argv, "--json"], env)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["hook_mapped"] and not doc["error"] and not doc["import_error"], doc
    hook, runtime = os.path.realpath(scn.site / CU13), os.path.realpath(scn.parts.rt[13] / "libcudart.so.13")
    seen = {lib["name"]: (lib["status"], {s: os.path.realpath(t) for s, t in lib["bindings"].items()})
            for lib in doc["libraries"]}
    assert seen == {"libtms_test_reaches.so": ("intercepted", {"cudaMalloc": hook, "cudaFree": hook}),
                    "libtms_test_deepbound.so": ("bypassed", {"cudaMalloc": runtime, "cudaFree": runtime})}, seen
    assert doc["verdict"].startswith("BYPASSED: 1 of 2 libraries"), doc["verdict"]
    r = scn.run(argv, env)
    verdict = [line for line in r.stdout.splitlines() if line.startswith("verdict:")]
    assert r.returncode == 1 and len(verdict) == 1 and "INTERCEPTED" not in verdict[0], (r.returncode, r.stdout)
    assert "libtms_test_deepbound.so: cudaMalloc, cudaFree -> libcudart.so.13 (BYPASSED: " in r.stdout, r.stdout


# ---------------------------------------------------------------- a child with other overrides than its parent

# A flagged process that reports the builds mapped in it, then starts one child per entry of argv[1] (each the
# changes to its own environment: a value, or None to unset), each reporting the same or how it stopped.
CHILD = MAPPED + "import json; print(json.dumps(mapped('torch_memory_saver')))"
FAMILY = MAPPED + f"CHILD = {CHILD!r}\n" + r"""
import json, os, subprocess, sys
children = []
for changes in json.loads(sys.argv[1]):
    env = {k: v for k, v in os.environ.items() if k not in changes}
    env.update({k: v for k, v in changes.items() if v is not None})
    r = subprocess.run([sys.executable, '-c', CHILD], env=env, capture_output=True, text=True)
    children.append([r.returncode, r.stdout, r.stderr])
print(json.dumps({'hooks': mapped('torch_memory_saver'), 'children': children}))
"""
MAJOR, FORCED = "TMS_AUTOPRELOAD_CUDA_MAJOR", "TMS_AUTOPRELOAD_PATH"


def _key(overrides: dict[str, str]) -> tuple:
    return tuple(sorted(overrides.items()))


def _started(rc: int, stdout: str, stderr: str) -> list[str] | str:
    """What a flagged start did: the builds it mapped (real paths), or the stop message it ended with."""
    if rc == 78:
        return assert_stopped(SimpleNamespace(returncode=rc, stdout=stdout, stderr=stderr))
    assert rc == 0, (rc, stderr[-3000:])
    return [os.path.realpath(h) for h in json.loads(stdout.strip().splitlines()[-1])]


def test_a_child_with_other_overrides_than_its_parent_gets_what_its_own_start_gets(scenario, tmp_path):
    """A flagged parent passes its plan and its state down; a child whose ``TMS_AUTOPRELOAD_CUDA_MAJOR`` or
    ``TMS_AUTOPRELOAD_PATH`` is another than the parent's (set where the parent had none, unset where it had one,
    or another value) was resolved for nothing yet (reference.md: only a child whose own overrides give the same
    key skips resolving). Each such child maps the build a flagged start of its own environment maps, or stops as
    that start stops, never keeping its parent's build. Host with both runtimes, CUDA 13 torch, two copies of the
    cu13 build for the path override."""
    scn = scenario(torch="cu13-sys", host=("driver", "cuda12", "cuda13"))
    copies = {}
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        copies[name] = os.path.realpath(shutil.copy(scn.site / CU13, tmp_path / name / CU13))
    families = [({}, [{MAJOR: "12"}, {FORCED: copies["a"]}]),
                ({MAJOR: "12"}, [{MAJOR: None}, {MAJOR: "11"}]),
                ({FORCED: copies["a"]}, [{FORCED: None}, {FORCED: copies["b"]}])]
    started = {}  # what a flagged start of each environment did, by its overrides
    seen = []
    for parent, children in families:
        r = scn.run(["-c", FAMILY, json.dumps(children)], {"TMS_AUTOPRELOAD": "1", **parent})
        assert r.returncode == 0, r.stderr[-3000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        started[_key(parent)] = [os.path.realpath(h) for h in out["hooks"]]
        seen += [(parent, changes, child) for changes, child in zip(children, out["children"], strict=True)]
    for parent, changes, child in seen:
        own = {k: v for k, v in {**parent, **changes}.items() if v is not None}
        if _key(own) not in started:
            r = scn.run(["-c", CHILD], {"TMS_AUTOPRELOAD": "1", **own})
            started[_key(own)] = _started(r.returncode, r.stdout, r.stderr)
        assert _started(*child) == started[_key(own)], (parent, changes, child, started[_key(own)])
    site = {k: os.path.realpath(scn.site / v) for k, v in (("cu12", CU12), ("cu13", CU13))}
    assert started[()] == [site["cu13"]] and started[((MAJOR, "12"),)] == [site["cu12"]], started
    assert started[((FORCED, copies["a"]),)] == [copies["a"]] and started[((FORCED, copies["b"]),)] == [copies["b"]]
    assert "CUDA 11" in started[((MAJOR, "11"),)], started


# ---------------------------------------------------------------- without torch: the loader's copy or the wheel's

RUNTIME_PROBE = MAPPED + """
import ctypes, json
ctypes.CDLL('libcudart.so.13')  # a program without torch links the runtime by its name
print(json.dumps({'hooks': mapped('torch_memory_saver'), 'runtimes': mapped('libcudart')}))
"""


NO_TORCH_WORLDS = {  # world: (NVIDIA's runtime wheels, the host's runtimes, overrides, the copy that wins)
    "loader-copy-only": ((), ("driver", "cuda13"), {}, "loader"),
    "pip-wheel-only": ((13,), ("driver",), {}, "pip"),
    "both": ((13,), ("driver", "cuda13"), {}, "loader"),
    "both-major-overridden": ((13,), ("driver", "cuda13"), {MAJOR: "13"}, "loader"),
}


@pytest.mark.parametrize("world, pip, host, env, copy", [(w, *v) for w, v in NO_TORCH_WORLDS.items()],
                         ids=list(NO_TORCH_WORLDS))
def test_without_torch_the_loaders_runtime_copy_wins_over_the_pip_wheels(scenario, world, pip, host, env, copy):
    """No torch (``tms-autopreload run -- CMD``'s users), CUDA 13 visible as the host's copy, NVIDIA's pip
    wheel, or both. reference.md: without torch the runtime library is "the copy the loader finds"; design.md:
    one visible libcudart, "loader or NVIDIA pip wheel", decides, so the wheel's only where the loader finds
    none. The hook binds that copy, and a program that then loads ``libcudart.so.13`` by name gets the same one:
    one runtime mapped, the one doctor names. The same with ``TMS_AUTOPRELOAD_CUDA_MAJOR`` naming that major."""
    scn = scenario(torch=None, pip=pip, host=host)
    want = str(scn.parts.rt[13] / "libcudart.so.13") if copy == "loader" else \
        str(scn.site / "nvidia" / "cu13" / "lib" / "libcudart.so.13")
    doc = scn.doctor(env)
    assert doc["ok"] and doc["runtime"]["library"] == want, (world, doc["runtime"], doc["error"])
    r = scn.flagged(RUNTIME_PROBE, env, flag="TMS_AUTOPRELOAD")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["hooks"] == [str(scn.site / CU13)] and out["runtimes"] == [want], (world, out)
