"""Fuzz every parser of untrusted bytes. Only the documented exception may escape, no input
may hang (hypothesis' deadline) and none may make memory grow past a bound (tracemalloc).

CI runs a short pass; ``make fuzz`` runs TMS_FUZZ_EXAMPLES (100,000) examples per target.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tracemalloc
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tms_autopreload import elf, environment, glibc_hwcaps, ldcache, runtime, sitepath, symbols, trace
from tms_autopreload.commands.doctor import deep as bindings
from tms_autopreload.commands import main as cli
from tms_autopreload.commands.doctor import nodes
from tms_autopreload.commands.doctor import driver
from tms_autopreload.commands.doctor import ray_cluster as preflight
from tms_autopreload.commands.doctor.node_table import document_rows

EXAMPLES = int(os.environ.get("TMS_FUZZ_EXAMPLES", "300"))
# The deadline catches a hang, not a slow machine: 500 ms failed now and then on a loaded 2-core machine
# (one example 1 s, then 0.2 s when hypothesis ran it again), never on a parser that hung.
FUZZ = settings(max_examples=EXAMPLES, deadline=5000, suppress_health_check=list(HealthCheck), database=None)
MEMORY_BOUND = 8 << 20
# Whole small objects too, so that mutations reach the dynamic symbol table and its hash sections.
SEEDS = [Path(os.path.realpath(sys.executable)).read_bytes()[:65536], Path("/bin/true").read_bytes()[:65536],
         Path("/lib/x86_64-linux-gnu/libdl.so.2").read_bytes()[:65536]]
TMP = Path(os.environ.get("TMPDIR", "/tmp")) / f"tms-fuzz-{os.getpid()}.so"


@pytest.fixture(scope="module", autouse=True)
def _scratch_file_removed():
    """The fuzzed bytes go through one scratch file (a path, as the readers take); it goes with the module."""
    yield
    TMP.unlink(missing_ok=True)


def _bounded(fn, *args):
    tracemalloc.start()
    try:
        return fn(*args)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < MEMORY_BOUND, peak


mutated_elf = st.builds(
    lambda seed, edits, cut: _mutate(SEEDS[seed], edits, cut),
    st.integers(0, len(SEEDS) - 1),
    st.lists(st.tuples(st.integers(0, 4095), st.integers(0, 255)), max_size=24),
    st.one_of(st.none(), st.integers(0, 65536)),
)


def _mutate(seed: bytes, edits, cut) -> bytes:
    data = bytearray(seed if cut is None else seed[:cut])
    for offset, value in edits:
        if offset < len(data):
            data[offset] = value
    return bytes(data)


elf_like = st.one_of(mutated_elf, st.binary(max_size=4096).map(lambda b: b"\x7fELF" + b),
                     st.binary(max_size=256))


@FUZZ
@given(elf_like)
def test_elf_reader_raises_only_elferror(data):
    TMP.write_bytes(data)
    for reader in (elf.read_dynamic, elf.read_kind, symbols.read_symbols):
        try:
            _bounded(reader, str(TMP))
        except elf.ElfError:
            pass
    try:
        table = _bounded(symbols.read_symbols, str(TMP))
    except elf.ElfError:
        table = None
    names = {"cudaMalloc", "main", ""} | (set(table.defined) | set(table.undefined) if table else set())
    try:
        found = _bounded(symbols.defined_among, str(TMP), names)
    except elf.ElfError:
        assert table is None  # it reads less than read_symbols: no error where that has none
    else:
        assert table is None or found == table.defined & names


@FUZZ
@given(st.one_of(st.binary(max_size=8192),
                 st.binary(max_size=8192).map(lambda b: b"glibc-ld.so.cache1.1" + b),
                 st.binary(max_size=8192).map(lambda b: Path("/etc/ld.so.cache").read_bytes()[:4096] + b)),
       st.text(max_size=40))
def test_ld_cache_parser_never_raises(data, name):
    for cache in (_bounded(ldcache.LdCache, data, 62), _bounded(ldcache.LdCache, data, 62, lambda: ("x86-64-v2",))):
        result = _bounded(cache.lookup, name)
        assert result is None or isinstance(result, str)


@FUZZ
@given(st.one_of(st.text(max_size=512),
                 st.builds(lambda head, lines: head + "\n".join(lines),
                           st.sampled_from(["Subdirectories of glibc-hwcaps directories, in priority order:\n", ""]),
                           st.lists(st.builds("  {} {}".format, st.text(max_size=12),
                                              st.sampled_from(["(supported, searched)", "(supported)", "",
                                                               "(searched)"])), max_size=6))))
def test_loader_hwcaps_list_parser_never_raises(text):
    """``ld.so --help``'s glibc-hwcaps list (glibc_hwcaps.parse): names without blanks, whatever the text."""
    names = _bounded(glibc_hwcaps.parse, text)
    assert isinstance(names, tuple) and all(isinstance(n, str) and n and " " not in n for n in names)


@FUZZ
@given(st.one_of(st.text(max_size=512),
                 st.builds(lambda m, a, b: f"NVRM version: NVIDIA UNIX {m} {a} {b}",
                           st.sampled_from(["x86_64 Kernel Module", "aarch64 Kernel Module",
                                            "Open Kernel Module for x86_64", "Open Kernel Module for aarch64"]),
                           st.text(max_size=40), st.text(max_size=40))))
def test_kernel_module_version_parser_never_raises(text):
    """/proc/driver/nvidia/version: a version-shaped word or None, whatever the bytes."""
    found = _bounded(driver.parse_module_version, text)
    assert found is None or driver.version_key(found) is not None
    assert driver.newest_major(found or "") in (None, *driver.MINIMUM_DRIVER)


@FUZZ
@given(st.one_of(st.text(max_size=300), st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=12).map(lambda v: __import__("json").dumps({"env_vars": v}))), st.text(max_size=60))
def test_preflight_options_are_a_usage_error_or_accepted(runtime_env, address):
    """doctor --ray's --runtime-env and --address: accepted as Ray would take them, or UsageError; nothing else."""
    try:
        env = _bounded(preflight.check_runtime_env, runtime_env)
    except preflight.UsageError:
        pass
    else:
        assert isinstance(env, dict)
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in (env.get("env_vars") or {}).items())
    try:
        preflight.check_address(address, {})
    except preflight.UsageError:
        pass
    else:
        assert address == "auto" or ":" in address


def test_kernel_module_version_parser_reads_both_module_kinds():
    """Proprietary and open modules, as each writes its first line on x86-64 and on aarch64: the open one's
    ID is NVIDIA's build rule ``NVIDIA UNIX Open Kernel Module for $(TARGET_ARCH)  <version>  Release Build
    (<user>@<host>)  <date>`` with ``TARGET_ARCH`` from ``uname -m`` (open-gpu-kernel-modules utils.mk,
    GENERATE_NVIDSTRING); the proprietary aarch64 one as an aarch64 machine's kernel log printed it
    ("NVRM: loading <the same ID>", nv.c)."""
    assert driver.parse_module_version(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n") == "535.104.05"
    assert driver.parse_module_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  (dvs-builder@U16)\n"
    ) == "580.95.05"
    assert driver.parse_module_version(
        "NVRM version: NVIDIA UNIX aarch64 Kernel Module  460.73.01  Thu Apr  1 21:51:06 UTC 2021\n") == "460.73.01"
    assert driver.parse_module_version(
        "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.95.05  Release Build  "
        "(dvs-builder@U22-I3-B17-02-5)  Tue Sep 23 09:55:41 UTC 2025\nGCC version:  gcc version 13.3.0\n"
    ) == "580.95.05"
    assert driver.newest_major("535.104.05") == 12 and driver.newest_major("580.95.05") == 13
    assert driver.newest_major("525.60.11") == 11 and driver.newest_major("418.39") is None

@FUZZ
@given(st.text(max_size=2000))
def test_torch_version_parser_never_raises(text):
    values = _bounded(runtime._parse_version_py, text)
    assert set(values) <= {"__version__", "cuda", "hip"}


@FUZZ
@given(st.text(max_size=4000), st.integers(-255, 255))
def test_loader_trace_parser_never_raises(text, status):
    t = _bounded(trace._parse, text, status)
    assert isinstance(t.reason(), str)


REAL_BINDING = ("     12345:\tbinding file /x/torch/lib/libc10_cuda.so [0] to /x/hook cu13.so [0]: "
                "normal symbol `cudaMalloc' [libcudart.so.13]")


@FUZZ
@given(st.one_of(st.text(max_size=400),
                 st.builds(lambda cut, ins: REAL_BINDING[:cut] + ins + REAL_BINDING[cut:],
                           st.integers(0, len(REAL_BINDING)), st.text(max_size=20))))
def test_binding_log_parser_never_raises(line):
    b = _bounded(bindings.parse_binding, line)
    assert b is None or (isinstance(b.symbol, str) and b.symbol and isinstance(b.pid, int))


@FUZZ
@given(st.one_of(st.binary(max_size=300),
                 st.builds(lambda cut, ins: REAL_MAPS[:cut] + ins + REAL_MAPS[cut:],
                           st.integers(0, 120), st.binary(max_size=30))))
def test_proc_maps_line_parser_never_raises(line):
    path = _bounded(environment._maps_path, line)
    assert path is None or (isinstance(path, str) and path.startswith("/"))


_MAPS_PIECES = st.sampled_from([b"\n", b" ", b"\r", b"/", b"x", b"\xff", b"torch_memory_saver",
                                b"/a/torch_memory_saver_x.so", b"7f00-7f10 r-xp 00000000 08:01 123   ",
                                b"\n/torch_memory_saver"])


@FUZZ
@given(st.one_of(st.binary(max_size=600), st.lists(_MAPS_PIECES, max_size=40).map(b"".join),
                 st.lists(_MAPS_PIECES, max_size=20).map(lambda p: REAL_MAPS + b"\n" + b"".join(p))))
def test_proc_maps_hooks_are_the_mapped_files_that_name_torch_memory_saver(data):
    """mapped_hooks cuts out only the lines naming torch_memory_saver; what it finds is what reading every
    line finds."""
    with mock.patch.object(environment, "read_maps", lambda: data):
        hooks = _bounded(environment.mapped_hooks)
        every = environment.mapped_objects()
    assert hooks == [path for path in every if environment.is_tms_entry(path)]


@FUZZ
@given(st.lists(st.binary(max_size=20).map(lambda arg: arg.replace(b"\0", b"")), max_size=6) | st.binary(max_size=60))
def test_the_command_line_read_from_the_kernel_is_the_one_given(argv):
    """Where Python has no ``sys.orig_argv`` (3.8, 3.9), ``original_argv`` reads ``/proc/self/cmdline``: each
    argument ended by a NUL, any bytes but NUL in it. It gives back the arguments the process was given, as
    ``os.fsdecode`` names them; any other bytes never raise."""
    data = b"".join(arg + b"\0" for arg in argv) if isinstance(argv, list) else argv
    with mock.patch.object(environment, "sys", type(sys)("sys")), \
            mock.patch.object(environment, "open", lambda *a: io.BytesIO(data), create=True):
        got = environment.original_argv()
    if isinstance(argv, list):
        assert got == [os.fsdecode(arg) for arg in argv]
    assert all(isinstance(arg, str) for arg in got)


def test_the_command_line_is_empty_where_the_kernel_has_no_record_of_it():
    """No ``sys.orig_argv`` and no ``/proc`` (not mounted): no command line, so no program is known, and a
    flagged start goes on to decide as for any program."""
    def unmounted(*args):
        raise FileNotFoundError(2, "No such file or directory", "/proc/self/cmdline")

    with mock.patch.object(environment, "sys", type(sys)("sys")), \
            mock.patch.object(environment, "open", unmounted, create=True):
        assert environment.original_argv() == []


# A node's `doctor --json` document as `srun --label` prints it (the keys the per-node table reads).
REAL_NODE = "\n".join(f"0: {line}" for line in json.dumps(
    {"hostname": "n1", "python": "3.11.7", "ok": True, "runtime": {"kind": "cuda", "major": 13},
     "plan": {"build": "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so"}, "error": None}, indent=2).splitlines())


def _node_saying(name: str, error: str, python: str) -> str:
    """A failing node's document whose words are any text (JSON escapes what it must: a terminal's too)."""
    return json.dumps({"hostname": name, "python": python, "ok": False, "runtime": None, "plan": None, "error": error})


# Any JSON value: what another node's document may hold where the table reads a field.
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=8)


def _node_holding(ok: bool, fields: dict) -> str:
    """A node's document with a plan, whose other fields the table reads hold any JSON value."""
    plan = {"build": "/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so", **fields.pop("plan", {})}
    return json.dumps({"hostname": "n1", "python": "3.11.7", "ok": ok, "error": None, "plan": plan, **fields})


@FUZZ
@given(st.one_of(st.text(max_size=2000),
                 st.builds(lambda cut, ins: REAL_NODE[:cut] + ins + REAL_NODE[cut:],
                           st.integers(0, len(REAL_NODE)), st.text(max_size=40)),
                 st.builds(_node_saying, st.text(max_size=20), st.text(max_size=40), st.text(max_size=10)),
                 st.builds(_node_holding, st.booleans(),
                           st.fixed_dictionaries({}, optional={
                               "plan": st.fixed_dictionaries({}, optional={"file": JSON, "runtime_rule": JSON}),
                               "runtime": st.none() | st.dictionaries(st.sampled_from(
                                   ["kind", "major", "torch_version", "split", "library"]), JSON),
                               "candidates": JSON, "driver": JSON, "start_up": JSON, "versions": JSON}))),
       st.booleans())
def test_node_documents_reader_never_raises(text, as_json):
    """`doctor --nodes` input: any text gives rows, and the table (or the --json document) shows them."""
    rows = _bounded(document_rows, text)
    for row in rows:
        assert isinstance(row["ok"], bool) and (row["ok"] or isinstance(row["error"], str)), row
        # A node whose own doctor says it is not ok never passes the preflight.
        assert not (row["ok"] and row["answer"]["survey"]["ok"] is False), row
    TMP.write_bytes(text.encode())
    with contextlib.redirect_stdout(io.StringIO()) as out:
        code = cli.main(["doctor", "--nodes", str(TMP), *(["--json"] if as_json else [])])
    assert code == (0 if rows and all(row["ok"] for row in rows) else 1)
    summary = json.loads(out.getvalue())["summary"] if as_json else out.getvalue().splitlines()[-1]
    assert summary.startswith(f"{len(rows)} node{'' if len(rows) == 1 else 's'}: "), summary
    # A table is read in a terminal: what other nodes wrote reaches it printable (no escape sequence, no \r).
    assert as_json or all(c.isprintable() for line in out.getvalue().split("\n") for c in line), out.getvalue()


# A node's document as ``doctor --json`` prints it (its first key the hostname), and the words of the warning the
# node printed after it, on one line of its own.
_LINE = st.text(alphabet=st.characters(blacklist_characters="{\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029",
                                       blacklist_categories=["Cs"]), max_size=30)
_NODE = st.tuples(st.text(max_size=8), st.booleans(), st.booleans(), _LINE)
_OWN_WARNING = "tms-autopreload: warning: "


def _node_document(name: str, ok: bool, pretty: bool) -> str:
    return json.dumps({"hostname": name, "python": "3.11.7", "ok": ok, "runtime": None, "plan": None,
                       "error": None if ok else "x"}, indent=2 if pretty else None)


def _collected(outputs: list[str], labelled: bool) -> str:
    """Nodes' outputs as ``srun --label`` collects them, or one after another."""
    return ("\n".join(f"{task}: {line}" for task, out in enumerate(outputs) for line in out.split("\n"))
            if labelled else "".join(outputs))


@FUZZ
@given(st.lists(_NODE, min_size=1, max_size=4), st.booleans(), st.data())
def test_no_node_vanishes_where_its_document_breaks_off(printed, labelled, data):
    """Nodes' documents, compact or pretty, each with its node's warning after it, collected one after another or
    by ``srun --label``; one of them breaks off anywhere after its first key (its node died while printing it, or
    its launcher cut it). Every node that began a document is its own entry, in order, and the broken one's
    entry fails the table, under its name where the whole name was printed: none vanishes, so that the preflight
    never passes without it."""
    docs = [_node_document(name, ok, pretty) for name, ok, pretty, _ in printed]
    broken = data.draw(st.integers(0, len(docs) - 1))
    named = docs[broken].index('"hostname"') + len('"hostname"')
    cut = data.draw(st.integers(named, len(docs[broken]) - 1))
    whole_name = cut >= docs[broken].index(json.dumps(printed[broken][0]), named) + len(json.dumps(printed[broken][0]))
    docs[broken] = docs[broken][:cut]
    text = _collected([doc + "\n" + _OWN_WARNING + warning + "\n" for doc, (*_, warning) in zip(docs, printed,
                                                                                              strict=True)], labelled)
    entries = nodes.read_documents(text)
    assert [e.task for e in entries] == [str(t) if labelled else None for t in range(len(docs))], text
    for task, (entry, (name, ok, *_)) in enumerate(zip(entries, printed, strict=True)):
        if task == broken:
            assert entry.document is None and entry.error, (entry.error, entry.document)
            assert not whole_name or entry.hostname == name, (entry.hostname, name)
        else:
            assert entry.document is not None and (entry.document["hostname"], entry.document["ok"]) == (name, ok), (
                entry.error, name)
    rows = document_rows(text)
    assert len(rows) == len(docs) and not rows[broken]["ok"], rows


@FUZZ
@given(st.lists(_NODE, min_size=1, max_size=4), st.data())
def test_no_node_vanishes_where_it_printed_no_document(printed, data):
    """Whole documents one after another, and among them a node's output that is no document (``bash:
    tms-autopreload: command not found``, with ``2>&1``), neither blank nor the package's own warning: nothing
    tells which node printed it, so it is a failing entry of its own where it stands, and the preflight fails."""
    docs = [_node_document(name, ok, pretty) + "\n" for name, ok, pretty, _ in printed]
    where = data.draw(st.integers(0, len(docs)))
    said = data.draw(_LINE.filter(lambda line: line.strip() and not line.strip().startswith(_OWN_WARNING.strip())))
    text = "".join(docs[:where]) + said + "\n" + "".join(docs[where:])
    entries = nodes.read_documents(text)
    assert [e.document and e.document["hostname"] for e in entries] == [
        *(name for name, *_ in printed[:where]), None, *(name for name, *_ in printed[where:])], text
    assert entries[where].error.startswith("output that is no doctor --json document: "), entries[where].error
    rows = document_rows(text)
    assert len(rows) == len(docs) + 1 and not rows[where]["ok"], rows


def test_node_documents_reader_reads_srun_label_output():
    """Two tasks' lines interleaved, a long line cut by srun into labelled 1024-byte pieces, a task that
    printed no document, and srun's own messages: one about a task that printed something adds nothing, one
    about tasks that printed nothing at all (a range among them) makes each of them a failing entry."""
    error = "x" * 1011 + "\n" + "y" * 2000  # its line, '  "error": "x...', is cut between the backslash and n
    doc = json.dumps({"error": error, "hostname": "n2", "ok": False, "runtime": None, "plan": None}, indent=2)
    pieces = [p for line in doc.splitlines() for p in (line[i:i + 1024] for i in range(0, len(line), 1024))]
    assert any(p.endswith("\\") for p in pieces)
    ours = REAL_NODE.splitlines()
    mixed = [line for pair in zip(ours, (f"1: {p}" for p in pieces), strict=False) for line in pair]
    mixed += ours[len(pieces):]
    mixed += [f"1: {p}" for p in pieces[len(ours):]]
    died = ["srun: error: x", "srun: error: node2: task 2: Exited with exit code 127",
            "srun: error: node4: task 3: Exited with exit code 127", "srun: error: node5: tasks 4-5: Killed"]
    text = "\n".join(mixed + ["2: bash: tms-autopreload: command not found", *died, ""])
    entries = nodes.read_documents(text)
    said = "it printed nothing, and srun says: srun: error: "
    assert [(e.task, e.document and e.document["hostname"], e.error) for e in entries] == [
        ("0", "n1", None), ("1", "n2", None),
        ("2", None, "no doctor --json document in its output, which begins: bash: tms-autopreload: command not found"),
        ("3", None, said + "node4: task 3: Exited with exit code 127"), ("4", None, said + "node5: tasks 4-5: Killed"),
        ("5", None, said + "node5: tasks 4-5: Killed")]
    assert entries[1].document["error"] == error


def test_a_task_missing_between_those_that_printed_is_a_failing_entry():
    """srun numbers its tasks from 0: tasks 0 and 3 printed documents, srun says task 2 failed, task 1's lines are
    missing (its output went elsewhere): each is an entry, in task order."""
    one = "\n".join(line[3:] for line in REAL_NODE.splitlines())
    text = "\n".join(["3: " + json.dumps({**json.loads(one), "hostname": "n4"}), "srun: error: node3: task 2: Exited",
                      *(f"0: {line}" for line in one.splitlines())])
    entries = nodes.read_documents(text)
    assert [(e.task, e.document and e.document["hostname"], e.error) for e in entries] == [
        ("0", "n1", None),
        ("1", None, "it printed nothing (srun numbers its tasks from 0, and this one's lines are missing)"),
        ("2", None, "it printed nothing, and srun says: srun: error: node3: task 2: Exited"), ("3", "n4", None)]


def test_srun_lines_of_many_ranges_make_a_bounded_number_of_rows():
    """One srun line naming 200 ranges of 4,096 tasks each: no more rows than one range may make."""
    ranges = ",".join(f"{n * 4096}-{n * 4096 + 4095}" for n in range(200))
    entries = _bounded(nodes.read_documents, "0: x\nsrun: error: n: tasks " + ranges + ": Killed\n")
    assert len(entries) <= 4097, len(entries)


def test_doctor_nodes_with_its_standard_input_closed_says_so():
    """``doctor --nodes -`` started with its standard input closed (``<&-``): the usage exit, one line."""
    with mock.patch.object(sys, "stdin", None), contextlib.redirect_stderr(io.StringIO()) as err:
        code = cli.main(["doctor", "--nodes", "-"])
    assert (code, err.getvalue()) == (2, "tms-autopreload doctor --nodes: cannot read -: standard input is closed\n")


def test_node_documents_reader_reads_documents_one_after_another():
    """Unlabelled: documents one per line, pretty-printed ones concatenated, a warning between them, and one
    that breaks off inside its node's name, which is then not known."""
    one = json.loads("\n".join(line[3:] for line in REAL_NODE.splitlines()))
    text = (json.dumps(one) + "\n" + json.dumps({**one, "hostname": "n2"}, indent=2)
            + "tms-autopreload: warning: x\n" + json.dumps({**one, "hostname": "n3"}) + '\n{"hostname": "n4')
    entries = nodes.read_documents(text)
    assert [(e.task, e.document and e.document["hostname"], e.hostname, e.error) for e in entries] == [
        (None, "n1", "n1", None), (None, "n2", "n2", None), (None, "n3", "n3", None),
        (None, None, None, "its doctor --json document cannot be read: it is no whole JSON (cut short, or other "
                           "output written into it)")]


REAL_MAPS = (b"7f2a4c000000-7f2a4c021000 r-xp 00000000 fd:01 1234567    "
             b"/x/torch_memory_saver_hook_mode_preload_cu13.abi3.so")


def test_binding_log_parser_reads_the_loader_format():
    b = bindings.parse_binding(REAL_BINDING)
    assert (b.pid, b.referrer, b.target, b.symbol, b.version) == (
        12345, "/x/torch/lib/libc10_cuda.so", "/x/hook cu13.so", "cudaMalloc", "libcudart.so.13")
    unversioned = bindings.parse_binding("  7:\tbinding file <main program> [0] to /lib/libc.so.6 [0]: "
                                         "protected symbol `free'")
    assert (unversioned.referrer, unversioned.symbol, unversioned.version) == ("<main program>", "free", None)
    assert bindings.parse_binding("     12345:\tsymbol=cudaMalloc;  lookup in file=/x/a.so [0]") is None


# The expected results below come from how each value was built (its entries, then separators between
# them as ld.so(8) defines them), not from the package's own splitters.
_PRELOAD_ENTRY = st.text(alphabet=st.sampled_from(list("ab/\t.")), min_size=1, max_size=12) | st.sampled_from(
    ["torch_memory_saver_hook_mode_preload_cu12.abi3.so", "/x/torch_memory_saver_cpp.abi3.so", "libjemalloc.so.2"])


@FUZZ
@given(st.lists(st.tuples(_PRELOAD_ENTRY, st.text(alphabet=" :", min_size=1, max_size=3)), max_size=8),
       st.text(alphabet=" :", max_size=2),
       st.text(alphabet=st.sampled_from(list("ab/._")), min_size=1, max_size=20))
def test_preload_composition_keeps_others_in_order(entries, lead, hook):
    """LD_PRELOAD built from entries separated by runs of spaces and colons (ld.so(8): "separated by spaces
    or colons"): the composed value is the hook, then every entry that is not a torch_memory_saver build,
    in order, colon-joined."""
    hook = "/x/torch_memory_saver_" + hook
    current = lead + "".join(entry + sep for entry, sep in entries)
    expected = [hook, *(e for e, _ in entries if "torch_memory_saver" not in e.rsplit("/", 1)[-1])]
    assert environment.compose_preload(current, hook) == ":".join(expected)


@FUZZ
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab/. ")), max_size=6), max_size=8),
       st.lists(st.sampled_from([":", ";"]), min_size=8, max_size=8),
       st.text(alphabet=st.sampled_from(list("ab/.")), min_size=1, max_size=20))
def test_search_path_prepend_keeps_what_every_other_entry_means(entries, seps, directory):
    """LD_LIBRARY_PATH built from entries joined by ':' or ';' (both separate, elf/dl-load.c; an empty entry
    is the cwd, '.'; an empty value is no entry at all): after prepending it is the directory, then every
    other entry of the old value in order, an empty one spelled '.'."""
    current = "".join(e + sep for e, sep in zip(entries, seps, strict=False))[:-1] if entries else ""
    meant = [e or "." for e in entries] if current else []
    expected = [directory, *(e for e in meant if e != directory)]
    assert environment.prepend_search_path(current, directory) == ":".join(expected)


_ADDED_ENTRY = st.text(alphabet=st.sampled_from(list("ab/._-")), min_size=1, max_size=12)


@FUZZ
@given(st.text(max_size=300), st.lists(_ADDED_ENTRY, max_size=4), st.lists(_ADDED_ENTRY, max_size=4))
def test_the_added_record_reads_back_and_any_value_reads(junk, preload, library_path):
    """TMS_AUTOPRELOAD_ADDED (written by a plan, read by every command from an environment anyone may have
    set): what a plan writes reads back as its two lists; any other value reads without raising, as
    entries without separators in them."""
    record = environment.added_record(tuple(preload), tuple(library_path))
    assert environment.read_added(record) == (preload, library_path)
    got = environment.read_added(junk)
    assert all(e and ":" not in e for part in got for e in part) and ";" not in "".join(got[0]), (junk, got)


# Lines of a .pth file: names of directories that exist beside it (some with spaces, one a comment's look-alike),
# paths that do not, the characters that split or end lines in one version or another, and import lines on
# purpose: ones that import the empty directories beside it (namespace packages: site.py runs them, and they
# add nothing) and ones that do not compile (site.py's exec raises, and it ignores the rest of the file). Lines
# joined without an end can make other import lines; a file is kept only when each of its import lines, as
# either reading splits it, is one of those two kinds: one that compiles and raises (``import c``, no such
# module) stops site.py too, which no model can foresee without running it, and generated code must not run.
PTH_DIRS = ("a", "b", "a b", " c", "#d")
PTH_IMPORTS = ("import a", "import\tb", "import a, b", "import a; import b", "import a as b", "import ", "import\t",
               "import a b", "import #d", "import a.", "import a\x00", "import a\x0cb")
pth_line = st.one_of(st.sampled_from([*PTH_DIRS, "a ", "./a", "a/../b", "missing", "#a", "import", "importa", "",
                                      "/", "\ufeffa", *PTH_IMPORTS]),
                     st.text(alphabet="ab #\t\r\x0b\x0c\x1c\x85\u2028\ufeff/.", max_size=12))


def _runs_or_fails_to_compile(text: str) -> bool:
    """True when every import line of ``text``, split as 3.13's site.py splits it (``str.splitlines``) or as
    3.10-3.12's does (universal newlines), imports only the directories beside the file, or does not compile."""
    import ast
    import re

    for line in {*text.splitlines(), *re.split("\r\n|\r|\n", text)}:
        if not line.startswith(("import ", "import\t")):
            continue
        try:
            tree = ast.parse(line)
        except (SyntaxError, ValueError):
            continue
        if not all(isinstance(s, ast.Import) and all(n.name in ("a", "b") for n in s.names) for s in tree.body):
            return False
    return True


pth_text = st.lists(st.tuples(pth_line, st.sampled_from(["\n", "\r\n", "\r", ""])), max_size=8).map(
    lambda lines: "".join(line + end for line, end in lines)).filter(_runs_or_fails_to_compile)


@pytest.fixture(scope="module")
def pth_site(tmp_path_factory) -> Path:
    site_dir = tmp_path_factory.mktemp("pth-site")
    for name in PTH_DIRS:
        (site_dir / name).mkdir()
    return site_dir


@FUZZ
@given(pth_text, st.sampled_from(["utf-8", "utf-8-sig", "latin-1"]), st.sampled_from(["x.pth", ".x.pth"]))
def test_pth_files_add_what_site_py_adds(pth_site, text, encoding, name):
    """Differential: a site directory with one generated ``.pth`` file (see ``pth_line``) adds the same
    entries, in the same order, through this interpreter's own ``site.addsitedir`` and through
    ``sitepath.add_site_dir``."""
    import site

    for old in pth_site.glob("*.pth"):
        old.unlink()
    data = text.encode(encoding, "replace")
    (pth_site / name).write_bytes(data)
    before = list(sys.path)
    known = {os.path.normcase(os.path.abspath(p)) for p in before}
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            site.addsitedir(str(pth_site), set(known))
            theirs = sys.path[len(before):]
        except UnicodeDecodeError:
            theirs = None  # site.py stops the start there; the package skips the file
        finally:
            sys.path[:] = before
            for module in ("a", "b"):  # what its import lines imported
                sys.modules.pop(module, None)
    ours: "list[str]" = []
    _bounded(sitepath.add_site_dir, str(pth_site), ours, set(known), hasattr(site, "stat"))
    assert theirs is None or ours == theirs, (data, ours, theirs)


def test_pth_file_stops_at_an_import_line_that_does_not_compile():
    """Found by the generator above: site.py's exec of ``import `` raises SyntaxError and it ignores the
    rest of the file; the path lines after it are not added, and the model adds none either."""
    assert sitepath.pth_paths(b"a\nimport \nb\n") == ["a"]
    assert sitepath.pth_paths(b"a\nimport a b\nb\n") == ["a"]
    assert sitepath.pth_paths(b"a\nimport\ta\nb\n") == ["a", "b"]
    assert sitepath.pth_paths(b"a\nimport a\x00\nb\n") == ["a"]
    assert sitepath.pth_paths(b"a\nimport os\nimport a b\nimport os\nb\n") == ["a"]


def test_pth_import_lines_are_compiled_only_when_a_path_line_follows(monkeypatch):
    """A process's first compile() builds the compiler's AST types (millions of instructions, the flagged
    start's largest avoidable cost, callgrind): a ``.pth`` of import lines only, the common case (this
    package's own, virtualenv's, setuptools'), adds no path whatever they compile to, so none is compiled."""
    compiled: "list[str]" = []
    monkeypatch.setattr(sitepath, "_compiles", lambda line: compiled.append(line) or True)
    assert sitepath.pth_paths(b"import os\nimport a b\n# c\n") == []
    assert compiled == []
    assert sitepath.pth_paths(b"import os\nb\n") == ["b"]
    assert [line.rstrip() for line in compiled] == ["import os"]


@FUZZ
@given(st.one_of(st.binary(max_size=600), st.lists(st.sampled_from(
    ["home = /usr/bin", "include-system-site-packages = false", "include-system-site-packages=TRUE",
     " Include-System-Site-Packages =  False ", "include-system-site-packages", "version = 3.11", "=", "\xff"]),
    max_size=6).map(lambda ls: "\n".join(ls).encode("utf-8", "surrogateescape"))))
def test_pyvenv_cfg_reader_never_raises(data):
    assert isinstance(_bounded(sitepath.system_site, data), bool)


def test_skipped_preload_message_with_newlines_in_the_name_found_by_fuzzing():
    """The long run found it: an LD_PRELOAD entry '\\n0\\n' split the loader's "cannot be preloaded:
    ignored" message over three lines, and the middle piece ("0") read as an error of the build."""
    out = ("ERROR: ld.so: object '\n0\n' from LD_PRELOAD cannot be preloaded (cannot open shared object file): "
           "ignored.\n\tlinux-vdso.so.1 (0x1)\n\t/x/torch_memory_saver_cu13.so (0x2)\n")
    t = trace._parse(out, 0)
    assert t.ok is True and t.errors == () and t.skipped == (("\n0\n", "cannot open shared object file"),)
    assert t.loaded == ("/x/torch_memory_saver_cu13.so",) and t.skip_of("torch_memory_saver_cu13.so") is None
    # ``ok`` is the answer itself, a bool: a name the loader did not find is a start that would fail
    assert trace._parse(out + "\tlibtms_gone.so.1 => not found\n", 0).ok is False


def test_offset_past_off_t_found_by_fuzzing(tmp_path):
    """The first long run found it: a program-header offset past off_t made seek() raise OSError."""
    data = bytearray(Path("/bin/true").read_bytes())
    data[37] = 16  # the top byte of e_phoff
    target = tmp_path / "x.so"
    target.write_bytes(bytes(data))
    try:
        elf.read_dynamic(str(target))
    except elf.ElfError as exc:
        assert "truncated file" in str(exc)
    else:
        raise AssertionError("expected ElfError")


@FUZZ
@given(st.binary(max_size=480).map(lambda b: b[:len(b) // 24 * 24]), st.sampled_from([2, 4]), st.integers(0, 22))
def test_a_symbol_tables_column_reads_the_same_in_either_byte_order(data, width, start):
    """A column of a table of 24-byte entries (elf.column) in the other byte order, each word's bytes
    reversed, holds the same integers as read in this machine's (the strided view's)."""
    start = start // width * width
    native = elf.column(data, width, sys.byteorder, start, 24)
    swapped = b"".join(data[at:at + width][::-1] for at in range(0, len(data), width))
    other = "big" if sys.byteorder == "little" else "little"
    assert elf.column(swapped, width, other, start, 24) == native
    assert len(native) == len(data) // 24


def test_a_planned_file_is_known_in_maps_by_its_resolved_path_where_the_device_differs(tmp_path):
    """/proc/self/maps may give another device than ``stat`` for the same file (overlayfs): the planned file
    is then found by its resolved path, whether the planned name is that path, a symbolic link to it under
    another name, or a link to its directory; a maps line of another file is none of them."""
    build = tmp_path / "real" / "hook_torch_memory_saver.so"
    build.parent.mkdir()
    build.write_bytes(b"x")
    (tmp_path / "named_otherwise.so").symlink_to(build)
    (tmp_path / "dir").symlink_to(build.parent)
    line = b"7f00-7f10 r-xp 00000000 ff:0f 999999999   " + str(build).encode()
    for data in (line, line + b"\n", b"7f00-7f01 r--p 00000000 00:00 0 \n" + line + b"\n"):
        for planned in (build, tmp_path / "named_otherwise.so", tmp_path / "dir" / build.name):
            assert environment._mapped_as(data, str(planned)) == str(build), (data, planned)
    other = b"7f00-7f10 r-xp 00000000 ff:0f 999999999   " + str(tmp_path / "real" / "other.so").encode() + b"\n"
    for planned in (build, tmp_path / "named_otherwise.so", tmp_path / "dir" / build.name):
        assert environment._mapped_as(other, str(planned)) is None
