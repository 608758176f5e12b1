"""``doctor --nodes``: read back the ``doctor --json`` documents that many nodes printed into one stream.

A cluster without Ray (Slurm) runs ``tms-autopreload doctor --json`` once per node with its own
launcher (``srun --ntasks-per-node=1``) and collects the output. The format read here:

* the output of ``srun --label``: every line starts with its task's number (``0: ``, `` 3: ``).
  The lines are regrouped per task before parsing, so several nodes' pretty-printed documents survive
  srun interleaving their lines, and a long line srun cut into labelled pieces is joined again. A task's
  text around its documents (warnings, with ``2>&1``) is skipped; a task whose text holds no document
  (``tms-autopreload: command not found``) is one entry carrying its first line. Lines without a label are
  srun's own (with ``2>&1``): its error about tasks that printed nothing
  (``srun: error: node2: task 1: Exited with exit code 127``) makes each of them a failing entry, and so does
  a task missing between the numbers of those that printed (srun numbers them from 0); the rest are skipped.
* or a stream of JSON documents, concatenated, whitespace between them (so one per line works too). Nothing
  tells which node printed the text between them, so each stretch of it but blank lines and the package's own
  warnings is a failing entry of its own, carrying its first line: a node that could not run ``doctor``.

Either way a document that breaks off (its node died while printing it, or other output was written into it),
or one that lacks a key the table reads, is known by how every document begins, ``{"hostname": ...`` (the first
key ``doctor --json`` prints), and is a failing entry under the name it had printed: so that no node vanishes
from the table, and the preflight never passes without it. Documents are checked for the keys the per-node
table reads; nothing else of them is trusted.
"""

import itertools
import json
import re

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["Entry", "read_documents"]

# srun --label: "%*d: " (right-aligned task number, a colon, one space) before each line; an empty line's label
# may have lost its space to a tool that strips lines. Never a number and a colon before more text (a log line's
# time, 12:34:56), which no label is.
_LABEL = re.compile(r" *(\d{1,9})(?:: |:$)")


class Entry:
    """One node's document, or the text found where a document was expected (``error`` says what)."""

    __slots__ = ("task", "document", "error", "hostname")

    def __init__(self, task: "str | None", document: "dict[str, Any] | None", error: "str | None",
                 hostname: "str | None" = None) -> None:
        self.task = task  # srun's task number when the input was labelled, else None
        self.document = document
        self.error = error
        self.hostname = hostname  # the node's name where a document says it, one that cannot be read too


def read_documents(text: str) -> "list[Entry]":
    """Every document in ``text`` (see the module's docstring for the format): by task for ``srun
    --label`` output, else in input order."""
    labelled, groups = _groups(text)
    entries = [entry for task, body in groups
               for entry in _parse(task, body, labelled, keep_other=task is not None)]
    if not labelled:
        return entries
    # srun's own lines, unlabelled: an error about a task that printed nothing is that task's row
    seen = {entry.task for entry in entries}
    for line in "\n".join(body for task, body in groups if task is None).splitlines():
        said = _SRUN_ERROR.match(line.strip())
        if said is None:
            continue
        for task in _tasks(said.group(1)):
            if task not in seen:
                seen.add(task)
                entries.append(Entry(task, None, f"it printed nothing, and srun says: {_cut(said.group(0))}"))
    # srun numbers its tasks from 0: one missing below the highest printed nothing (without 2>&1, no line says so)
    last = max((int(task) for task in seen if task is not None), default=-1)
    for number in itertools.islice((n for n in range(last + 1) if str(n) not in seen), _MOST_TASKS):
        entries.append(Entry(str(number), None, "it printed nothing (srun numbers its tasks from 0, and this one's "
                                                "lines are missing)"))
    return sorted(entries, key=lambda entry: -1 if entry.task is None else int(entry.task))


# srun's error about tasks (``srun: error: node2: task 1: Exited with exit code 127``; ``tasks 0-3``, ``tasks 0,2``).
_SRUN_ERROR = re.compile(r"srun: error: (?:[^:]*: )?tasks? ([\d,-]+)\b.*")


# The most task rows one srun line, or the gaps between the tasks that printed, make.
_MOST_TASKS = 4096


def _tasks(spec: str) -> "list[str]":
    """The task numbers of srun's ``0-3,5``, each as a label names it (no more than a label's nine digits), and
    no more than :data:`_MOST_TASKS` of them in all (a line of many ranges made millions of rows)."""
    out: "list[str]" = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()) and len(first) <= 9 and len(last) <= 9:
            start = int(first)
            out += [str(n) for n in range(start, min(int(last or first), start + _MOST_TASKS - len(out) - 1) + 1)]
        if len(out) >= _MOST_TASKS:
            break
    return out


def _groups(text: str) -> "tuple[bool, list[tuple[str | None, str]]]":
    """(is it ``srun --label`` output, each task's text: in task order, srun's own lines first)."""
    lines = text.splitlines()
    # No line of a JSON document starts with digits and a colon, so one such line means srun labelled them.
    if not any(_LABEL.match(line) for line in lines):
        return False, [(None, text)]
    groups: "dict[str | None, list[str]]" = {}
    for line in lines:
        m = _LABEL.match(line)
        task, body = (m.group(1), line[m.end():]) if m else (None, line)
        groups.setdefault(task, []).append(body)
    order = sorted(groups, key=lambda task: -1 if task is None else int(task))
    return True, [(task, "\n".join(groups[task])) for task in order]


def _parse(task: "str | None", text: str, labelled: bool, keep_other: bool) -> "list[Entry]":
    """The documents in one task's text (or the whole text, unlabelled), and what else it holds.

    Labelled, the line breaks go first: JSON needs none between its tokens, so taking them out changes no
    document, and joins the pieces of a long line that srun ``--label`` cut (at 1024 bytes in Slurm 22.05) and
    labelled each; the task's text around its documents is skipped, and a task that printed no document at all
    is one entry naming its first line (when ``keep_other``). Unlabelled, the text is read as it is: JSON allows
    no line break inside a string, so other output written into a document breaks it; and nothing tells which
    node printed the text outside the documents, so each stretch of it is a failing entry of its own (a node
    that could not run ``doctor``: ``command not found``), but for the blank lines and the package's own warnings.
    """
    flat = "".join(text.splitlines()) if labelled else text
    decoder = json.JSONDecoder(parse_constant=_no_constant)
    out: "list[Entry]" = []
    outside = 0  # where the text outside documents that no entry has accounted for begins
    pos = flat.find("{")
    while pos >= 0:
        begun = _BEGUN.match(flat, pos)
        try:
            value, after = decoder.raw_decode(flat, pos)
        except (ValueError, RecursionError):
            value, after = None, -1
        if value is None:  # no JSON from here: a document that breaks off where it began as every document does
            problem: "str | None" = "" if begun is None else _BROKEN
        else:
            problem = _problem(value, begun is not None)
        if problem == "":  # not a document: other output, JSON or not
            pos = flat.find("{", pos + 1)
            continue
        if not labelled:
            out += _other_output(flat[outside:pos])
        name = _string_at(decoder, flat, begun.end()) if begun is not None and begun.group(1) else None
        if value is None:  # a document that breaks off: its node's entry, up to where the next document begins
            out.append(Entry(task, None, _UNREADABLE + _BROKEN, name))  # the rest of it is not other output
            following = _BEGUN.search(flat, pos + 1)
            outside = following.start() if following is not None else len(flat)
            pos = following.start() if following is not None else -1
            continue
        if problem is None:
            out.append(Entry(task, value, None, value.get("hostname")))
        else:  # the document's keys missing, or a value of the wrong type: that node's entry, saying which
            given = value.get("hostname")
            out.append(Entry(task, None, _UNREADABLE + problem, given if isinstance(given, str) else name))
        outside = after
        pos = flat.find("{", after)
    if not labelled:
        return out + _other_output(flat[outside:])
    first = next((line.strip() for line in text.splitlines() if line.strip()), None)
    if not out and first is not None and keep_other:
        out.append(Entry(task, None, f"no doctor --json document in its output, which begins: {_cut(first)}"))
    return out


def _other_output(text: str) -> "list[Entry]":
    """Text outside the documents of an unlabelled stream: one failing entry naming its first line that is
    neither blank nor one of the package's own warnings (``tms-autopreload: warning: ...``, which ``doctor``
    prints beside its document); none where there is no such line."""
    line = next((line.strip() for line in text.splitlines()
                 if line.strip() and not line.strip().startswith(_OWN_WARNING)), None)
    return [] if line is None else [Entry(None, None, f"output that is no doctor --json document: {_cut(line)}")]


def _no_constant(name: str) -> None:
    """NaN and Infinity, which Python's JSON reads and no other does: no document holds them."""
    raise ValueError(f"{name} is not JSON")


# How every ``doctor --json`` document begins (commands/doctor/document.py writes the hostname first), and what
# every entry of a document that cannot be read begins with.
_BEGUN = re.compile(r'\{\s*"hostname"(\s*:\s*)?')
_UNREADABLE = "its doctor --json document cannot be read: "
_BROKEN = "it is no whole JSON (cut short, or other output written into it)"
_OWN_WARNING = "tms-autopreload: warning:"  # how the package's commands begin a warning (commands/exitpolicy.py)


def _string_at(decoder: json.JSONDecoder, text: str, pos: int) -> "str | None":
    """The JSON string at ``pos`` in ``text``, where a whole one is."""
    try:
        value = decoder.raw_decode(text, pos)[0]
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def _problem(value: object, begun: bool) -> "str | None":
    """What keeps ``value`` from being a ``doctor --json`` document the per-node table can read: None where
    nothing does; "" where it is no such document at all (not an object with its keys ``ok``, ``error``,
    ``plan`` and ``runtime``, nor one that begins as every document does: other JSON in a node's output); else
    what is wrong: the keys it lacks, or which value has the wrong type."""
    keys = ("ok", "error", "plan", "runtime")
    if not isinstance(value, dict) or not all(key in value for key in keys):
        missing = [key for key in keys if not isinstance(value, dict) or key not in value]
        return f"it has no {', '.join(missing)}" if begun else ""
    plan = value["plan"]
    wanted = [("ok", value["ok"], isinstance(value["ok"], bool), "true or false"),
              *((key, value.get(key), value.get(key) is None or isinstance(value[key], str), "a string or null")
                for key in ("error", "hostname", "python")),
              ("plan", plan, plan is None or isinstance(plan, dict), "an object or null"),
              ("runtime", value["runtime"], value["runtime"] is None or isinstance(value["runtime"], dict),
               "an object or null")]
    if isinstance(plan, dict):
        wanted.append(("plan.build", plan.get("build"), isinstance(plan.get("build"), str), "a string"))
        wanted.append(("plan.file", plan.get("file"), plan.get("file") is None or isinstance(plan["file"], str),
                       "a string or null"))
    return next((f"its {key} is {_json_type(got)}, not {want}" for key, got, fits, want in wanted if not fits), None)


def _json_type(value: object) -> str:
    """What ``value``, decoded from JSON, is, in JSON's words."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    return "a string" if isinstance(value, str) else "a number"


def _cut(line: str) -> str:
    return line if len(line) <= 200 else line[:197] + "..."
