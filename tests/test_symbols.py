"""The hook's interface, read from its dynamic symbol table, not assumed.

``symbols.read_symbols`` must agree with binutils' ``nm -D`` on real files (every released preload build,
NVIDIA's runtime libraries, this machine's system libraries), and a build's interposed set is what it
defines that the process's runtime library also defines.
"""

from __future__ import annotations

import glob
import math
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from support import dynamic_offset, runtime_wheel, tms_wheel
from tms_autopreload import elf, symbols
from tms_autopreload.builds import interposed

VERSIONS = ["0.0.8", "0.0.9", "0.0.9.post1", "0.0.10"]
SOURCE_BUILDS = ["0.0.10-source", "0.0.10-source-runpath"]  # built here from the sdist (tools/tms_source.py)


def _extract_builds(root: Path, versions: list[str]) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for version in versions:
        with zipfile.ZipFile(tms_wheel(version)) as z:
            for name in z.namelist():
                if name.startswith(("torch_memory_saver_hook_mode_preload", "torch_memory_saver_cpp")):
                    target = root / version / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(name))
                    out[f"{version}/{name}"] = target
    return out


@pytest.fixture(scope="module")
def source_files(files, tmp_path_factory) -> dict[str, Path]:
    """``files`` and the builds made here from source (minutes on a cold cache: the slow lane only)."""
    return {**files, **_extract_builds(tmp_path_factory.mktemp("symbols-source"), SOURCE_BUILDS)}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("symbols")
    out = _extract_builds(root, VERSIONS)
    for major, member in ((12, "nvidia/cuda_runtime/lib/libcudart.so.12"), (13, "nvidia/cu13/lib/libcudart.so.13")):
        with zipfile.ZipFile(runtime_wheel(major)) as z:
            target = root / f"libcudart.so.{major}"
            target.write_bytes(z.read(member))
            out[f"libcudart.so.{major}"] = target
    return out


def nm(path: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) dynamic symbols as binutils reports them."""
    r = subprocess.run(["nm", "-D", str(path)], capture_output=True, text=True, check=True)
    defined, undefined = set(), set()
    for line in r.stdout.splitlines():
        parts = line.split()
        name = parts[-1].split("@")[0]
        if len(parts) == 2 and parts[0] in ("U", "w", "v"):
            undefined.add(name)
        elif len(parts) == 3:
            defined.add(name)
    return defined, undefined


# symbols.defined_among is asked for a few names at a time, and finds each by a search of the string table:
# asked for all 45,000 names of a libLLVM it takes over a minute. Past this many names it is asked an even
# spread of them (every name of the package's own builds and runtimes: they have fewer).
ASKED = 2000


def agrees_with_nm(paths) -> int:
    """How many of ``paths`` are ELF objects; :func:`symbols.read_symbols` reads each as nm does, and
    :func:`symbols.defined_among`, asked for the names nm lists (:data:`ASKED` of them at most) and one it does
    not, answers nm's defined ones among them."""
    checked = 0
    for path in paths:
        try:
            got = symbols.read_symbols(str(path))
        except elf.ElfError:
            continue  # linker scripts and other non-objects
        defined, undefined = nm(path)
        assert (set(got.defined), set(got.undefined)) == (defined, undefined), path
        listed = sorted(defined | undefined)
        asked = {*listed[::max(1, math.ceil(len(listed) / ASKED))], "tms_no_such_symbol"}
        assert symbols.defined_among(str(path), asked) == defined & asked, path
        checked += 1
    return checked


@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is needed as the reference")
def test_read_symbols_agrees_with_nm(files):
    """The builds and runtimes the package reads, and a program."""
    assert agrees_with_nm([*files.values(), Path("/bin/true")]) == len(files) + 1


@pytest.mark.slow  # 150 runs of nm
@pytest.mark.skipif(shutil.which("nm") is None, reason="binutils' nm is needed as the reference")
def test_read_symbols_agrees_with_nm_on_the_systems_libraries():
    """150 files, each once (a library's names are links to few files)."""
    files = dict.fromkeys(map(os.path.realpath, sorted(glob.glob("/usr/lib/x86_64-linux-gnu/lib*.so.*"))))
    assert agrees_with_nm(map(Path, list(files)[:150])) >= 100


@pytest.mark.parametrize("version", ["0.0.9.post1", "0.0.10", *SOURCE_BUILDS])
def test_preload_builds_interpose_cuda_malloc_and_free(files, version, request):
    if version in SOURCE_BUILDS:
        files = request.getfixturevalue("source_files")
    for major in (12, 13):
        got = interposed(str(files[f"{version}/torch_memory_saver_hook_mode_preload_cu{major}.abi3.so"]),
                         str(files[f"libcudart.so.{major}"]))
        assert {"cudaMalloc", "cudaFree"} <= set(got), got


def test_source_builds_link_as_the_release_does(source_files):
    files = source_files
    """Built here from the sdist against NVIDIA's pip headers: the driver and runtime the released 0.0.10
    builds need; the model of #108 adds only #108's DT_RUNPATH, ``$ORIGIN/<the pip runtime directory>``
    and ``$ORIGIN/../<the same>`` (LD_LIBRARY_PATH keeps precedence); the unsuffixed name holds the cu12
    build, as in the release."""
    for major, runtime_dir in ((12, "nvidia/cuda_runtime/lib"), (13, "nvidia/cu13/lib")):
        name = f"torch_memory_saver_hook_mode_preload_cu{major}.abi3.so"
        cuda = [n for n in elf.read_dynamic(str(files[f"0.0.10/{name}"])).needed if n.startswith("libcud")]
        assert cuda == ["libcuda.so.1", f"libcudart.so.{major}"]
        for build, runpath in (("0.0.10-source", None),
                               ("0.0.10-source-runpath", (f"$ORIGIN/{runtime_dir}", f"$ORIGIN/../{runtime_dir}"))):
            info = elf.read_dynamic(str(files[f"{build}/{name}"]))
            assert [n for n in info.needed if n.startswith("libcud")] == cuda
            assert (info.rpath, info.runpath) == ((), runpath), build
    for build in SOURCE_BUILDS:
        plain = files[f"{build}/torch_memory_saver_hook_mode_preload.abi3.so"].read_bytes()
        assert plain == files[f"{build}/torch_memory_saver_hook_mode_preload_cu12.abi3.so"].read_bytes()


def test_driver_only_build_interposes_what_the_runtime_defines(files):
    """0.0.8 links only libcuda.so.1, yet defines the runtime's allocator entry points."""
    build = files["0.0.8/torch_memory_saver_cpp.abi3.so"]
    assert "libcudart.so.13" not in elf.read_dynamic(str(build)).needed
    assert {"cudaMalloc", "cudaFree"} <= set(interposed(str(build), str(files["libcudart.so.13"])))


def test_symbol_table_without_a_hash_section_is_a_clear_error(tmp_path):
    """An object whose dynamic section gives no table length (its DT_HASH/DT_GNU_HASH turned into DT_DEBUG)."""
    data = bytearray(Path("/bin/true").read_bytes())
    dynamic = dynamic_offset(data)
    fd = os.open("/bin/true", os.O_RDONLY)
    try:
        tags = elf.read_layout(fd).tags
    finally:
        os.close(fd)
    for i, tag in enumerate(tags):
        if tag in (symbols.DT_HASH, symbols.DT_GNU_HASH):
            struct.pack_into("<q", data, dynamic + 16 * i, 21)  # DT_DEBUG
    target = tmp_path / "nohash.so"
    target.write_bytes(bytes(data))
    with pytest.raises(elf.ElfError, match="no DT_HASH or DT_GNU_HASH"):
        symbols.read_symbols(str(target))


def _readelf_dynamic(path: str) -> dict[str, list[str]]:
    """binutils' reading of ``path``'s dynamic entries: tag name -> the strings in brackets."""
    out: dict[str, list[str]] = {}
    readelf = subprocess.run(["readelf", "-dW", path], capture_output=True, text=True, check=True)
    for line in readelf.stdout.splitlines():
        for tag in ("NEEDED", "SONAME", "RPATH", "RUNPATH"):
            if f"({tag})" in line:
                out.setdefault(tag, []).append(line.split("[", 1)[1].rsplit("]", 1)[0])
    return out


def test_read_dynamic_agrees_with_readelf_where_the_strings_lie_far_apart(tmp_path):
    """The reader takes only the part of DT_STRTAB that holds the entries' strings: a DT_RUNPATH longer than
    its first read (10,000 bytes), a soname, the system's own programs (bash: 41 KB of symbol names)."""
    long_dir = "/opt/" + "d" * 9990
    src = tmp_path / "f.c"
    src.write_text("int f(void) { return 1; }\n")
    lib = tmp_path / "libf.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(src), "-Wl,-soname,libf.so.1",
                    f"-Wl,--enable-new-dtags,-rpath,{long_dir}:$ORIGIN", "-lm"], check=True)
    for path in (str(lib), os.path.realpath(sys.executable), "/bin/sh", shutil.which("bash")):
        info, want = elf.read_dynamic(path), _readelf_dynamic(path)
        assert list(info.needed) == want.get("NEEDED", []), path
        assert [info.soname] if info.soname else [] == want.get("SONAME", []), path
        for tag, got in (("RPATH", info.rpath), ("RUNPATH", info.runpath)):
            assert ":".join(got or ()) == ":".join(want.get(tag, [])), (path, tag)
    assert elf.read_dynamic(str(lib)).runpath == (long_dir, "$ORIGIN")


def test_a_programs_loader_is_read_and_a_bad_one_refuses_nothing(tmp_path):
    """PT_INTERP names the loader a program starts with (what the glibc-hwcaps rule asks); one that points
    past the file's end gives no loader, and the object is read all the same, as the loader reads a library."""
    good = elf.read_dynamic("/bin/true")
    assert good.interpreter and os.path.exists(good.interpreter), good.interpreter
    data = bytearray(Path("/bin/true").read_bytes())
    phoff, phnum = struct.unpack_from("<Q", data, 32)[0], struct.unpack_from("<H", data, 56)[0]
    at = next(phoff + 56 * i for i in range(phnum) if struct.unpack_from("<I", data, phoff + 56 * i)[0] == 3)
    struct.pack_into("<Q", data, at + 8, len(data) + 4096)  # p_offset past the end
    bad = tmp_path / "bad-interp"
    bad.write_bytes(bytes(data))
    broken = elf.read_dynamic(str(bad))
    assert broken.interpreter is None
    assert (broken.needed, broken.soname, broken.machine) == (good.needed, good.soname, good.machine)
