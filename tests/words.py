"""Every word a user reads, on record: the normaliser and the file format of the suite's snapshots.

A snapshot is syrupy's, one plain text file per snapshot (:class:`Text`), under
``tests/__snapshots__/<test module>/<test name>[<parameters>].txt``: what a command or a start printed, read in
a diff as a user reads it. ``pytest --snapshot-update`` rewrites them. Before it is compared, everything that
is this machine's and this run's (paths, versions of the interpreter and of this package, PIDs, the host's
name, durations, temporary directories) is replaced by a named placeholder (:func:`normalise`), so that a
snapshot changes only when a word or a fact changes.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path

from syrupy.extensions.single_file import SingleFileSnapshotExtension, WriteMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tms_autopreload import __version__  # noqa: E402

SNAPSHOTS = Path(__file__).resolve().parent / "__snapshots__"
# The PATH of a transcript's shell: the system's, the same on every machine (a fix names what PATH finds).
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class Text(SingleFileSnapshotExtension):
    """One snapshot a file, written as text (UTF-8, ``\\n`` line ends): what was printed, line for line."""

    _write_mode = WriteMode.TEXT
    file_extension = "txt"


# Spellings of this run's own facts, each matched whole (never inside a longer name or number).
_EDGE_BEFORE, _EDGE_AFTER = r"(?<![\w.+-])", r"(?![\w+-]|\.\d)"
# A path is a whole spelling when what follows is not more of the same component.
_PATH_END = r"(?![\w.+-])"


# The suite's temporary directories: this session's base temp (pytest's numbered one under the system's temporary
# directory, or the one ``--basetemp`` names; a worker's own under xdist) and the whole run's (where the workers'
# shared parts are), named here by conftest.py.
SUITE_TEMP: list[str] = []


def _spellings(path: str) -> set[str]:
    """``path`` and the other spellings of it a program may print: its real path, and its real directory
    with its own name (a symbolic link's target printed beside the link's folder)."""
    found = {path, os.path.realpath(path)}
    found.add(os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path)))
    return {s for s in found if s not in ("", "/")}


def normalise(text: str, places: Mapping[str, str | os.PathLike[str]] = {}) -> str:
    """``text`` with this run's facts replaced by named placeholders.

    ``places`` maps a placeholder (``"<venv>"``, ``"<site>"``, ...) to a path of this run; each of its
    spellings (:func:`_spellings`) is replaced, the longest first, so that ``<site>`` wins over the ``<venv>``
    it lies in, and only where the path ends (``/venv`` is not a part of ``/venv2``). Then what is left of this
    run: the suite's temporary directory (``<tmp>``) and others made under the system's (``<tmpdir>``); this
    interpreter's version (``<python-version>``, its ``X.Y`` ``<python-minor>``) and this package's
    (``<tms-autopreload-version>``); the host's name (``<hostname>``); PIDs (``<pid>``); durations
    (``<seconds>``); sizes that count this run's paths (a binding log's, an environment string's: ``<bytes>``,
    ``<size>``); and argparse's usage lines (``<argparse's usage>``), which each Python version lays out
    its own way.
    """
    pairs = [(spelling, name) for name, path in places.items() for spelling in _spellings(os.fspath(path))]
    for spelling, name in sorted(pairs, key=lambda pair: -len(pair[0])):
        text = re.sub(re.escape(spelling) + _PATH_END, lambda _m, name=name: name, text)
    for spelling in sorted({s for base in SUITE_TEMP for s in _spellings(base)}, key=len, reverse=True):
        text = re.sub(re.escape(spelling) + _PATH_END, "<tmp>", text)
    temp = tempfile.gettempdir()
    text = re.sub(re.escape(temp) + r"/(?:tms-autopreload-[\w-]*?|tmp)[\w-]{6,}" + _PATH_END, "<tmpdir>", text)
    version = platform.python_version()
    minor = ".".join(version.split(".")[:2])
    text = re.sub(_EDGE_BEFORE + re.escape(version) + _EDGE_AFTER, "<python-version>", text)
    text = re.sub(r"(?<![\w.+-])" + re.escape(minor) + r"(?![\w+-]|\.\d)", "<python-minor>", text)
    text = re.sub(r"(?<=python)" + re.escape(minor) + r"(?![\d])", "<python-minor>", text)
    text = re.sub(r'("tms_autopreload": ")' + re.escape(__version__) + '"', r'\1<tms-autopreload-version>"', text)
    text = re.sub(r"(tms[-_]autopreload[ -])" + re.escape(__version__) + _EDGE_AFTER, r"\1<tms-autopreload-version>",
                  text)
    text = re.sub(_EDGE_BEFORE + re.escape(os.uname().nodename) + _EDGE_AFTER, "<hostname>", text)
    text = re.sub(r"(?i)\b(pid[ =:]*|process |EXEC_PID=)\d+\b", r"\1<pid>", text)
    text = re.sub(r"\b\d+(?:\.\d+)? s\b", "<seconds> s", text)
    # argparse's usage lines, which each Python version lays out its own way; its error line is ours.
    text = re.sub(r"^usage: .*?(?=^tms-autopreload[^\n]*: error: )", "usage: <argparse's usage>\n", text,
                  flags=re.M | re.S)
    text = re.sub(r'("seconds": )[\d.]+', r"\1<seconds>", text)
    # Sizes that count this run's paths: a binding log's, an environment string's.
    text = re.sub(r'("log_bytes": )\d+', r"\1<bytes>", text)
    text = re.sub(r"\b\d+\.\d MB of binding log", "<size> MB of binding log", text)
    text = re.sub(r"(would be )\d+( bytes)", r"\1<bytes>\2", text)
    return text


def places_of(scn, **more: str | os.PathLike[str]) -> dict[str, str | os.PathLike[str]]:
    """The placeholders of a scenario (conftest.py's ``Scenario``): its venv, site-packages and host, the parts
    its host is made of, and the interpreter its venv was made from; and ``more``."""
    parts = scn.parts
    base = os.path.realpath(scn.venv.python)
    return {"<venv>": scn.venv.path, "<site>": scn.site, "<host-cache>": scn.host.cache, "<driver-dir>": parts.stub,
            "<cuda12-dir>": parts.rt[12], "<cuda13-dir>": parts.rt[13], "<rocm6-dir>": parts.hip,
            "<own-wheel>": parts.own_wheel, "<base-python>": base, "<base-prefix>": Path(base).parent.parent, **more}


# One command's section of a transcript: its command line, then what it printed on each stream and its exit.
_SECTION = r'''
section() {
  title=$1; shift
  "$@" >"$out" 2>"$err"; code=$?
  printf '$ %s\n' "$title"
  if [ -s "$out" ]; then cat "$out"; fi
  if [ -s "$err" ]; then printf -- '--- stderr\n'; cat "$err"; fi
  printf -- '--- exit %s\n\n' "$code"
}
out=$(mktemp); err=$(mktemp)
'''


def transcript(host, steps: list[tuple[str, list[str]]], env: Mapping[str, str]) -> str:
    """What each step printed, in one shell on ``host`` (one namespace, one shell: each step is one more
    process, not one more of each): ``steps`` are (the title a reader sees, argv), run in order with ``env``;
    each section gives the title, stdout, stderr (where there is any) and the exit status."""
    script = _SECTION + "".join(f"section {shlex.quote(title)} {shlex.join(argv)}\n" for title, argv in steps)
    script += 'rm -f "$out" "$err"\n'
    r = host.run(["sh", "-c", script], dict(env), timeout=600)
    assert r.returncode == 0 and r.stderr == "", r.stderr
    return r.stdout


def snapshot_files() -> list[Path]:
    """Every snapshot on record, of every test module (both lanes')."""
    return sorted(SNAPSHOTS.rglob("*.txt"))
