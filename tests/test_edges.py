"""Every row of the package's own tables and every limit it keeps, tested at its value and one past it.

Each test is generated from the table or the constant itself (parametrized over its rows, or computed from
its value), so that a new row, or a changed limit, gets its edges tested the day it is written: the oldest
driver of each CUDA major (judged by ``doctor``'s verdict, and by the function that applies it for majors no
torch stand-in has), torch_memory_saver's releases (judged by ``doctor`` with each real wheel), torch's
``_preload_cuda_deps`` releases, the kernel's limit on one environment string, the file system's on a kernel
name, how much of a value a message quotes, and the readers' bounds on what they read.

Not here: limits written inline rather than as a constant (a version's digits and parts, a CUDA major below
100), :data:`tms_autopreload.sitepath._BATCHED` (the interpreter's own version decides it: the 3.15 root
file systems of the slow lane judge it), and the symbol reader's bound on a DT_HASH chain count (at the
value, a 96 MB symbol table to read: its DT_GNU_HASH bounds are here).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TORCH_FIELDS, Scenario, need, report_host
from support import ROOT, Host, assert_stopped, cc, clean_env, driver_stub
from test_driver import module

sys.path.insert(0, str(ROOT))

from tms_autopreload import elf, environment, errors, sitepath, symbols
from tms_autopreload.environment import MAX_ARG_STRLEN, env_string_size
from tms_autopreload.builds import DRIVER_ONLY_PREFIX
from tms_autopreload.commands import kernelspec
from tms_autopreload.commands.doctor import driver as nvidia_driver
from tms_autopreload.gpu_libraries import CUDA, CUDA_MAJORS, release
from tms_autopreload.ldso import Loader
from tms_autopreload.reinstall import build_install_hint
from tms_autopreload.releases import RELEASED_CUDA_MAJORS, RELEASES, reads_one_path
from tms_autopreload.runtime import _TORCH_RELEASES as TORCH_RELEASES
from tms_autopreload.runtime import code_of

# The largest part of a driver version the reader takes (nvidia_driver.version_key: 1 to 6 digits a part).
PART_MAX = 999999


# ---------------------------------------------------------------- the oldest driver of each CUDA major

def at_and_below(minimum: str) -> tuple[str, str]:
    """(a driver version exactly at ``minimum``, the greatest one below it), as NVIDIA names drivers (at
    least two parts: ``580`` is ``580.0``), in the reader's order: the last part one less, where it is 0 the
    part before one less and the last the largest a part may be."""
    key = list(nvidia_driver.version_key(minimum) or ())
    assert key, minimum
    key += [0] * (2 - len(key))
    below = list(key)
    i = len(below) - 1
    while below[i] == 0:
        below[i] = PART_MAX
        i -= 1
    below[i] -= 1
    return ".".join(map(str, key)), ".".join(map(str, below))


def test_the_edge_versions_are_the_neighbours_the_reader_sees():
    """The helper's own check: nothing the reader accepts lies between a minimum and the version below it."""
    assert at_and_below("580") == ("580.0", "579.999999")
    assert at_and_below("525.60.13") == ("525.60.13", "525.60.12")
    assert at_and_below("450.80.02") == ("450.80.2", "450.80.1")
    assert at_and_below("470.0.0") == ("470.0.0", "469.999999.999999")


@pytest.fixture(scope="module")
def stub_bytes(tmp_path_factory) -> bytes:
    """A ``libcuda.so.1`` stand-in, compiled once: installed under each version's file name below."""
    return need(driver_stub, tmp_path_factory.mktemp("libcuda")).read_bytes()


def nvidia_install(directory: Path, version: str, stub: bytes) -> Path:
    """``libcuda.so.<version>`` and the link ``libcuda.so.1`` to it, as NVIDIA's installer leaves them."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"libcuda.so.{version}").write_bytes(stub)
    (directory / "libcuda.so.1").symlink_to(f"libcuda.so.{version}")
    return directory


@pytest.mark.parametrize("major", sorted(CUDA_MAJORS))
def test_a_driver_exactly_at_a_majors_minimum_runs_it_and_one_below_does_not(major, stub_bytes, tmp_path):
    """The verdict of the function ``doctor`` asks (:func:`nvidia_driver.examine`), for a kernel module and
    a ``libcuda`` of the same version, installed as NVIDIA installs them: at the row's minimum OK, the
    version below FAILING with the minimum named; and the newest major each runs."""
    minimum = CUDA_MAJORS[major].minimum_driver
    at, below = at_and_below(minimum)
    verdicts = {}
    for version in (at, below):
        d = nvidia_install(tmp_path / version, version, stub_bytes)
        proc = tmp_path / f"{version}.proc"
        proc.write_text(f"NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Sat Aug 19 01:15:15 UTC 2023\n")
        facts = nvidia_driver.examine(Loader.for_executable(sys.executable, str(d)), major, str(proc))
        assert facts.module_version == facts.library_version == version, facts.to_dict()
        verdicts[version] = facts
    for version in (minimum, at):  # the row's own words too: the reader takes a version of one part
        assert (nvidia_driver.newest_major(version) or 0) >= major, version
    assert (nvidia_driver.newest_major(below) or 0) < major
    assert verdicts[at].verdict == nvidia_driver.OK, verdicts[at].to_dict()
    assert verdicts[at].message == f"driver {at} runs CUDA {verdicts[at].newest_major}.x (>= {minimum} needed for " \
                                   f"CUDA {major})", verdicts[at].message
    assert verdicts[below].verdict == nvidia_driver.FAILING, verdicts[below].to_dict()
    assert f"which needs a driver >= {minimum}" in verdicts[below].message, verdicts[below].message
    assert f"upgrade the NVIDIA driver to >= {minimum}" in verdicts[below].fix, verdicts[below].fix


# The majors a torch stand-in exists for (conftest's kinds): doctor judges them end to end.
DOCTOR_MAJORS = sorted(m for m in CUDA_MAJORS if f"cu{m}-sys" in TORCH_FIELDS)


@pytest.mark.parametrize("major", DOCTOR_MAJORS)
def test_doctor_passes_a_driver_at_the_minimum_and_fails_the_one_below(major, scenario, parts, stub_bytes,
                                                                       tmp_path):
    """``doctor`` on a host whose kernel module and ``libcuda`` are exactly the row's minimum: exit 0 and
    verdict ``ok``; the version below: exit 1, ``failing``, naming the minimum. A torch for that major and
    torch_memory_saver 0.0.10, the real runtime on the host."""
    venv = scenario(tms="0.0.10", torch=f"cu{major}-sys", host=("driver", f"cuda{major}")).venv
    minimum = CUDA_MAJORS[major].minimum_driver
    for version, verdict, code in zip(at_and_below(minimum), ("ok", "failing"), (0, 1), strict=True):
        d = nvidia_install(tmp_path / version, version, stub_bytes)
        scn = Scenario(venv, need(Host, tmp_path / f"host-{version}", [d, parts.rt[major]]), parts)
        r = scn.host.run([str(venv.python), "-m", "tms_autopreload", "doctor", "--json"], clean_env(),
                         setup=module(version))
        doc = json.loads(r.stdout)
        assert doc["plan"] is not None, doc["error"]
        assert (r.returncode, doc["driver"]["verdict"]) == (code, verdict), (version, doc["driver"])
        assert doc["driver"]["wanted"] == major and doc["driver"]["module_version"] == version, doc["driver"]
        if verdict == "failing":
            assert f">= {minimum}" in doc["driver"]["message"], doc["driver"]


# ---------------------------------------------------------------- torch_memory_saver's releases

def _first_shipping(major: int) -> str | None:
    return next((r.version for r in RELEASES if major in r.majors), None)


@pytest.mark.parametrize("major", RELEASED_CUDA_MAJORS)
@pytest.mark.parametrize("rel", RELEASES, ids=[r.version for r in RELEASES])
def test_each_release_fits_the_majors_its_row_names_and_splits_preload_as_it_says(rel, major, scenario, parts,
                                                                                 tmp_path_factory):
    """``doctor`` with each release's real wheel, a torch of each major a release ships and that runtime on
    the host, and this shell's own ``LD_PRELOAD`` entry (a library of its own): a release whose row ships
    the major (or whose build links only the driver) gets a plan with a build of that major, and keeps the
    shell's entry after the hook, warned exactly where its row says its check reads ``LD_PRELOAD`` as one
    path; a release before the first that ships the major has none, and its fix installs that first one."""
    scn = scenario(tms=rel.version, torch=f"cu{major}-sys", host=("driver", f"cuda{major}"))
    own = tmp_path_factory.getbasetemp() / "edges-own-preload" / "libown.so"
    if not own.exists():
        own.parent.mkdir(exist_ok=True)
        need(cc, own, "int own_preload(void) { return 0; }\n", "-Wl,-soname,libown.so")
    doc = scn.doctor({"LD_PRELOAD": str(own)})
    first = _first_shipping(major)
    if not (rel.driver_only or major in rel.majors):
        assert doc["plan"] is None and first is not None, doc
        assert RELEASES.index(rel) < [r.version for r in RELEASES].index(first), (rel.version, first)
        assert f"torch-memory-saver>={first}" in doc["fix"], doc["fix"]
        return
    assert doc["plan"] is not None, doc["error"]
    chosen = next(c for c in doc["candidates"] if c["status"] == "chosen")
    if rel.driver_only:
        assert os.path.basename(chosen["path"]).startswith(DRIVER_ONLY_PREFIX) and chosen["major"] is None, chosen
    else:
        assert (chosen["kind"], chosen["major"]) == (CUDA, major), chosen
    assert doc["plan"]["env"]["LD_PRELOAD"] == f"{doc['plan']['build']}:{own}", doc["plan"]
    one_path = [w for w in doc["warnings"] if "reads LD_PRELOAD as a single path" in w]
    assert bool(one_path) == (not rel.splits_preload), (rel.version, doc["warnings"])


@pytest.mark.parametrize("rel", RELEASES, ids=[r.version for r in RELEASES])
def test_reads_one_path_follows_each_rows_version(rel, tmp_path):
    """Where only the installed version says (a dist-info beside the package, no source to read)."""
    package = tmp_path / "torch_memory_saver"
    package.mkdir()
    info = tmp_path / f"torch_memory_saver-{rel.version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch_memory_saver\nVersion: {rel.version}\n")
    assert reads_one_path(str(package)) == (not rel.splits_preload)


def test_the_releases_are_in_order_and_splitting_once_starts_stays():
    """The table's own edges: releases oldest first, and the rule that reads the installed version (its
    release numbers: a ``.postN`` counts as its release) tells every row apart at the first splitting
    release: every row before it is below it, and no row after it reads one path again."""
    versions = [release(r.version) for r in RELEASES]
    assert versions == sorted(versions), versions
    splits = [r.splits_preload for r in RELEASES]
    assert splits == sorted(splits) and True in splits, splits
    first = release(next(r.version for r in RELEASES if r.splits_preload))
    assert all(release(r.version) < first for r in RELEASES if not r.splits_preload), versions


@pytest.mark.parametrize("major", sorted({*CUDA_MAJORS, *RELEASED_CUDA_MAJORS, max(CUDA_MAJORS) + 1}))
def test_the_install_fix_names_the_first_release_that_ships_a_major_or_the_driver_only_one(major):
    first = _first_shipping(major)
    hint = build_install_hint(CUDA, major)
    if first is not None:
        assert f"torch-memory-saver>={first}" in hint, hint
    else:
        driver_only = next(r.version for r in RELEASES if r.driver_only)
        assert f"torch-memory-saver=={driver_only}" in hint and f"CUDA {major}" in hint, hint


# ---------------------------------------------------------------- torch's own releases (_preload_cuda_deps)

def _before(version: tuple[int, ...]) -> tuple[int, ...]:
    """The greatest release (major, minor, patch) below ``version`` (major, minor)."""
    major, minor = version
    return (major, minor - 1, 99) if minor else (major - 1, 99, 99)


@pytest.mark.parametrize("i", range(len(TORCH_RELEASES)), ids=[".".join(map(str, e[0])) for e in TORCH_RELEASES])
def test_torchs_code_is_read_as_the_release_at_or_before_it(i):
    """A torch at a read release has that release's code, the one just below it the release before (the
    first's below it); a torch of no known version, the newest."""
    entry = TORCH_RELEASES[i]
    at = ".".join(map(str, entry[0]))
    below = ".".join(map(str, _before(entry[0])))
    for version in (at, at + ".0"):  # the row's own words, and as torch writes a release
        assert code_of(version) == (at, entry[1], entry[2]), version
    earlier = TORCH_RELEASES[max(i - 1, 0)]
    assert code_of(below) == (".".join(map(str, earlier[0])), earlier[1], earlier[2])
    assert code_of(at + "+cu130") == code_of(at)
    newest = TORCH_RELEASES[-1]
    assert code_of(None) == code_of("") == (".".join(map(str, newest[0])), newest[1], newest[2])


# ---------------------------------------------------------------- limits the kernel and file systems keep

def test_max_arg_strlen_is_the_kernels_limit_on_one_environment_string():
    """The package's MAX_ARG_STRLEN, as :func:`env_string_size` counts (NUL included): a string exactly that
    long is carried by execve, one byte more fails with E2BIG."""
    value = "x" * (MAX_ARG_STRLEN - len("X=") - 1)
    assert env_string_size("X", value) == MAX_ARG_STRLEN
    assert subprocess.run(["true"], env={"PATH": os.environ["PATH"], "X": value}).returncode == 0
    with pytest.raises(OSError) as exc:
        subprocess.run(["true"], env={"PATH": os.environ["PATH"], "X": value + "x"})
    assert exc.value.errno == errno.E2BIG


def test_a_kernel_name_of_the_limit_is_a_directory_and_one_more_is_refused(tmp_path):
    """MAX_NAME_LENGTH is the file system's own limit on a name (NAME_MAX): a kernel name that long is
    accepted and is a directory; one character more is refused by both, the refusal naming the limit."""
    assert os.pathconf(tmp_path, "PC_NAME_MAX") == kernelspec.MAX_NAME_LENGTH
    at, past = "k" * kernelspec.MAX_NAME_LENGTH, "k" * (kernelspec.MAX_NAME_LENGTH + 1)
    assert kernelspec._checked_name(at) == at
    (tmp_path / at).mkdir()
    with pytest.raises(kernelspec.InvalidRequest) as refused:
        kernelspec._checked_name(past)
    assert f"at most {kernelspec.MAX_NAME_LENGTH} of them" in str(refused.value), str(refused.value)
    with pytest.raises(OSError) as exc:
        (tmp_path / past).mkdir()
    assert exc.value.errno == errno.ENAMETOOLONG


# ---------------------------------------------------------------- how much of a value a message quotes

@pytest.mark.parametrize("limit", [errors.PATH_SHOWN, errors.VALUE_SHOWN])
def test_a_value_of_the_limit_is_quoted_whole_and_one_more_is_cut(limit):
    at, past = "v" * limit, "v" * (limit + 1)
    assert errors.shown(at, limit) == repr(at)
    assert errors.shown(past, limit) == f"{past[:limit]!r}... ({limit + 1} characters)"


def test_a_forced_path_and_an_override_are_quoted_to_their_limits(scenario):
    """Through the start that says them: ``TMS_AUTOPRELOAD_PATH`` (a path: :data:`errors.PATH_SHOWN`) and
    ``TMS_AUTOPRELOAD_CUDA_MAJOR`` (a value: :data:`errors.VALUE_SHOWN`), each at its limit quoted whole, one
    character longer cut with its length."""
    scn = report_host(scenario)
    cases = {environment.PATH_VAR: (errors.PATH_SHOWN, lambda n: "/" + "p" * (n - 1)),
             environment.CUDA_MAJOR_VAR: (errors.VALUE_SHOWN, lambda n: "x" * n)}
    for name, (limit, value_of) in cases.items():
        for length in (limit, limit + 1):
            value = value_of(length)
            r = scn.flagged("print('user code ran')", {name: value})
            message = assert_stopped(r, f"{name}=")
            quoted = repr(value) if length == limit else f"{value[:limit]!r}... ({length} characters)"
            assert f"{name}={quoted} " in message, (name, length, message[:300])


# ---------------------------------------------------------------- what the readers read at most

def test_proc_self_maps_is_taken_up_to_its_limit_and_dropped_past_it(monkeypatch):
    """:func:`tms_autopreload.environment.read_maps` asks for one byte past MAPS_LIMIT, so that it can tell: a list of
    exactly MAPS_LIMIT bytes is used, one byte more is taken as unreadable (b"")."""
    asked = []

    def reading(size):
        def read(path, limit):
            asked.append((path, limit))
            return b"m" * min(size, limit)
        return read

    limit = environment.MAPS_LIMIT
    monkeypatch.setattr(environment, "read_regular", reading(limit))
    assert len(environment.read_maps()) == limit
    monkeypatch.setattr(environment, "read_regular", reading(limit + 1))
    assert environment.read_maps() == b""
    assert asked == [("/proc/self/maps", limit + 1)] * 2


def elf_object(path: Path, *, phnum: int = 0, strsz: int | None = None, dyn_entries: int = 0,
               needed_at: int | None = None, interp: bytes | None = None, gnu_hash: tuple[int, int] | None = None,
               size: int = 0, needed: str = "libedge.so") -> Path:
    """A little-endian ELF64 x86-64 shared object, written field by field (elf(5)): one PT_LOAD over the whole
    file (file offsets are addresses), PT_DYNAMIC, PT_INTERP where ``interp`` is given (its bytes, NUL
    included), then PT_NULL up to ``phnum`` program headers (default: none). The dynamic section: DT_STRTAB, DT_STRSZ
    (``strsz``, else the table's own size), DT_NEEDED ``needed`` as entry ``needed_at`` (default: next),
    harmless DT_DEBUG entries up to ``dyn_entries``, and with ``gnu_hash`` (nbuckets, bloom_size) a
    DT_GNU_HASH and DT_SYMTAB whose table is the null symbol alone. ``size``: the file's length at least
    (a sparse tail)."""
    strings = b"\0" + needed.encode() + b"\0"
    headers = 2 + (interp is not None)
    phnum = phnum or headers
    ph_at, dyn_at = 64, 64 + 56 * phnum
    head = [(5, 0), (10, 0)]  # DT_STRTAB, DT_STRSZ: filled in below
    if gnu_hash is not None:
        head += [(0x6FFFFEF5, 0), (6, 0), (11, 24)]  # DT_GNU_HASH, DT_SYMTAB, DT_SYMENT
    needed_at = len(head) if needed_at is None else needed_at
    count = max(dyn_entries, needed_at + 1, len(head) + 1)
    entries = head + [(21, 0)] * (count - len(head))  # DT_DEBUG
    entries[needed_at] = (1, 1)  # DT_NEEDED "libedge.so"
    str_at = dyn_at + 16 * (count + 1)
    interp_at = str_at + len(strings)
    hash_at = interp_at + len(interp or b"")
    hash_at += -hash_at % 8
    symtab_at = hash_at + 16
    values = {5: str_at, 10: len(strings) if strsz is None else strsz, 0x6FFFFEF5: hash_at, 6: symtab_at}
    entries = [(tag, values.get(tag, value) if i < len(head) else value) for i, (tag, value) in enumerate(entries)]
    dynamic = b"".join(struct.pack("<qQ", tag, value) for tag, value in entries) + struct.pack("<qQ", 0, 0)
    tail = b""
    if gnu_hash is not None:
        nbuckets, bloom = gnu_hash
        tail = struct.pack("<IIII", nbuckets, 1, bloom, 6) + b"\0" * 24  # symoffset 1; the null symbol
    body = dynamic + strings + (interp or b"") + b"\0" * (hash_at - interp_at - len(interp or b"")) + tail
    total = max(dyn_at + len(body), size)
    ehdr = struct.pack("<4sBBBBB7xHHIQQQIHHHHHH", b"\x7fELF", 2, 1, 1, 0, 0, 3, 62, 1, 0, ph_at, 0, 0, 64, 56,
                       phnum, 64, 0, 0)
    phdrs = [struct.pack("<IIQQQQQQ", 1, 5, 0, 0, 0, total, total, 4096),
             struct.pack("<IIQQQQQQ", 2, 6, dyn_at, dyn_at, dyn_at, len(dynamic), len(dynamic), 8)]
    if interp is not None:
        phdrs.append(struct.pack("<IIQQQQQQ", 3, 4, interp_at, interp_at, interp_at, len(interp), len(interp), 1))
    phdrs += [b"\0" * 56] * (phnum - headers)
    with open(path, "wb") as f:
        f.write(ehdr + b"".join(phdrs) + body)
        f.truncate(total)
    return path


def test_the_elf_builder_writes_what_the_reader_and_readelf_read(tmp_path):
    so = elf_object(tmp_path / "plain.so")
    assert elf.read_dynamic(str(so)).needed == ("libedge.so",)
    r = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True)
    assert "Shared library: [libedge.so]" in r.stdout, r.stdout + r.stderr


def test_program_headers_up_to_the_limit_are_read_and_one_more_is_refused(tmp_path):
    at = elf_object(tmp_path / "at.so", phnum=elf._MAX_PHNUM)
    assert elf.read_dynamic(str(at)).needed == ("libedge.so",)
    past = elf_object(tmp_path / "past.so", phnum=elf._MAX_PHNUM + 1)
    with pytest.raises(elf.ElfError, match=f"phnum={elf._MAX_PHNUM + 1}"):
        elf.read_dynamic(str(past))


def test_program_headers_that_end_at_the_first_read_and_one_past_it_are_read_alike(tmp_path):
    """The first read (_HEAD bytes) holds the ELF header and, up to its end, the program headers; one header
    more and they are read on their own: the same object either way."""
    fit = (elf._HEAD - 64) // 56
    assert 64 + fit * 56 == elf._HEAD  # the last header ends exactly at the first read's end
    for phnum in (fit, fit + 1):
        assert elf.read_dynamic(str(elf_object(tmp_path / f"{phnum}.so", phnum=phnum))).needed == ("libedge.so",)


@pytest.mark.parametrize("length", [elf._STRING_SPAN - 1, elf._STRING_SPAN])
def test_a_needed_name_as_long_as_the_string_span_and_one_longer_is_read_whole(tmp_path, length):
    """The strings of the dynamic entries are read up to _STRING_SPAN bytes past the last one's start; a name
    that fills the span with its NUL, and one a byte longer (whose NUL lies past it), are read whole."""
    name = "l" * length
    assert elf.read_dynamic(str(elf_object(tmp_path / "long.so", needed=name))).needed == (name,)


def test_a_string_table_of_the_limit_is_read_and_one_byte_more_is_refused(tmp_path):
    """DT_STRSZ is taken as the table's size up to _MAX_STRTAB (only the strings asked for are read)."""
    at = elf_object(tmp_path / "at.so", strsz=elf._MAX_STRTAB, size=8192)
    assert elf.read_dynamic(str(at)).needed == ("libedge.so",)
    past = elf_object(tmp_path / "past.so", strsz=elf._MAX_STRTAB + 1, size=8192)
    with pytest.raises(elf.ElfError, match=f"implausible string table size {elf._MAX_STRTAB + 1}"):
        elf.read_dynamic(str(past))


def test_dynamic_entries_up_to_the_limit_are_read_and_those_past_it_are_not(tmp_path):
    """A DT_NEEDED that is the _MAX_DYN_ENTRIES-th entry is read; one entry later it lies past the bound."""
    last = elf._MAX_DYN_ENTRIES - 1
    at = elf_object(tmp_path / "at.so", dyn_entries=elf._MAX_DYN_ENTRIES, needed_at=last)
    assert elf.read_dynamic(str(at)).needed == ("libedge.so",)
    past = elf_object(tmp_path / "past.so", dyn_entries=elf._MAX_DYN_ENTRIES + 1, needed_at=last + 1)
    assert elf.read_dynamic(str(past)).needed == ()


def test_an_interpreter_path_of_the_limit_is_read_whole_and_a_longer_one_is_cut(tmp_path):
    """PT_INTERP is read up to _MAX_INTERP bytes (PATH_MAX, NUL included: the kernel runs no longer one)."""
    path = "/" + "i" * (elf._MAX_INTERP - 2)
    at = elf_object(tmp_path / "at.so", interp=path.encode() + b"\0")
    assert elf.read_dynamic(str(at)).interpreter == path
    past = elf_object(tmp_path / "past.so", interp=path.encode() + b"i\0")
    assert elf.read_dynamic(str(past)).interpreter == path + "i"  # its first _MAX_INTERP bytes: no NUL among them


@pytest.mark.parametrize("which", ["nbuckets", "bloom_size"])
def test_a_gnu_hash_of_the_limit_is_read_and_one_more_is_refused(tmp_path, which):
    """DT_GNU_HASH's bucket count and bloom size are taken up to _MAX_SYMBOLS (a sparse file: the buckets
    are zero, so no symbol is hashed and only the null symbol is read)."""
    def hashed(n):
        shape = (n, 1) if which == "nbuckets" else (1, n)
        return elf_object(tmp_path / f"{which}-{n}.so", gnu_hash=shape, size=4096 + 8 * n + 4 * n)

    assert symbols.read_symbols(str(hashed(symbols._MAX_SYMBOLS))).defined == frozenset()
    with pytest.raises(elf.ElfError, match=f"{which}={symbols._MAX_SYMBOLS + 1}"):
        symbols.read_symbols(str(hashed(symbols._MAX_SYMBOLS + 1)))


def test_a_pth_file_is_read_up_to_the_limit(tmp_path):
    """sitepath reads a .pth's first _LIMIT bytes: a path line that ends at the limit is added whole; one
    byte of padding more, and the line is cut before its last character (site.py reads on: a documented
    bound of the model, far above any real .pth)."""
    site = tmp_path / "site"
    (site / "edge").mkdir(parents=True)
    for pad, expected in ((0, [str(site), str(site / "edge")]), (1, [str(site)])):
        line = b"edge"
        (site / "x.pth").write_bytes(b"#" * (sitepath._LIMIT - len(line) - 1 + pad) + b"\n" + line)
        assert len((site / "x.pth").read_bytes()) == sitepath._LIMIT + pad
        path: list[str] = []
        sitepath.add_site_dir(str(site), path, set(), False)
        assert path == expected, (pad, path)
