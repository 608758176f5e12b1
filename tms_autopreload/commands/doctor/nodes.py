"""``doctor --nodes``: read back the ``doctor --json`` documents that many nodes printed into one stream.

A cluster without Ray (Slurm) runs ``tms-autopreload doctor --json`` once per node with its own
launcher (``srun --ntasks-per-node=1``) and collects the output. The format read here:

* a stream of JSON documents, concatenated, whitespace between them (so one per line works too);
* or the output of ``srun --label``: every line starts with its task's number (``0: ``, `` 3: ``).
  The lines are regrouped per task before parsing, so several nodes' pretty-printed documents survive
  srun interleaving their lines, and a long line srun cut into labelled pieces is joined again. Lines
  without a label there are srun's own (with ``2>&1``): its error about tasks that printed nothing
  (``srun: error: node2: task 1: Exited with exit code 127``) makes each of them a failing entry, so that no
  node vanishes from the table; the rest are skipped.

A task's text around its documents (warnings, with ``2>&1``) is skipped; a task whose text holds no
document (``tms-autopreload: command not found``) is one entry carrying its first line, so that the node
shows as failing instead of vanishing. A document that breaks off (its node died while printing it, or
other output was written into it) is known by how every document begins, ``{"hostname": ...`` (the first
key ``doctor --json`` prints), and is a failing entry under the name it had printed, labelled or not: in
a stream of documents one after another nothing else would tell that a node is missing. Documents are
checked for the keys the per-node table reads; nothing else of them is trusted.
"""

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
               for entry in _parse(task, body, keep_other=task is not None or not labelled)]
    if labelled:  # srun's own lines, unlabelled: an error about a task that printed nothing is that task's row
        seen = {entry.task for entry in entries}
        for line in "\n".join(body for task, body in groups if task is None).splitlines():
            said = _SRUN_ERROR.match(line.strip())
            if said is None:
                continue
            for task in _tasks(said.group(1)):
                if task not in seen:
                    seen.add(task)
                    entries.append(Entry(task, None, f"it printed nothing, and srun says: {_cut(said.group(0))}"))
    return entries


# srun's error about tasks (``srun: error: node2: task 1: Exited with exit code 127``; ``tasks 0-3``, ``tasks 0,2``).
_SRUN_ERROR = re.compile(r"srun: error: (?:[^:]*: )?tasks? ([\d,-]+)\b.*")


def _tasks(spec: str) -> "list[str]":
    """The task numbers of srun's ``0-3,5``, each as a label names it (no more than a label's nine digits)."""
    out: "list[str]" = []
    for part in spec.split(","):
        first, _, last = part.partition("-")
        if first.isdigit() and (not last or last.isdigit()) and len(first) <= 9 and len(last) <= 9:
            start = int(first)
            out += [str(n) for n in range(start, min(int(last or first), start + 4095) + 1)]
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


def _parse(task: "str | None", text: str, keep_other: bool) -> "list[Entry]":
    """The documents in one task's text, and nothing else of it; a text holding no document at all is
    one entry naming its first line (when ``keep_other``).

    The line breaks go first: JSON needs none between its tokens and allows none inside a string, so
    taking them out changes no document, and joins the pieces of a long line that srun ``--label`` cut
    (at 1024 bytes in Slurm 22.05) and labelled each.
    """
    flat = "".join(text.splitlines())
    decoder = json.JSONDecoder()
    out: "list[Entry]" = []
    pos = flat.find("{")
    while pos >= 0:
        try:
            value, after = decoder.raw_decode(flat, pos)
        except (ValueError, RecursionError):
            value, after = None, pos + 1
            begun = _BEGUN.match(flat, pos)
            if begun is not None:  # a document that breaks off: its node's entry, under the name it printed
                name = _string_at(decoder, flat, begun.end()) if begun.group(1) else None
                out.append(Entry(task, None, _BROKEN, name))
                pos = flat.find("{", after)
                continue
        problem = _problem(value)
        if problem is None:
            out.append(Entry(task, value, None, value.get("hostname")))
        elif problem:  # the document's keys, a value of the wrong type: that node's entry, saying which
            name = value.get("hostname") if isinstance(value, dict) else None  # a dict, with the keys
            out.append(Entry(task, None, f"its doctor --json document cannot be read: {problem}",
                             name if isinstance(name, str) else None))
        else:
            after = pos + 1
        pos = flat.find("{", after)
    first = next((line.strip() for line in text.splitlines() if line.strip()), None)
    if not out and first is not None and keep_other:
        out.append(Entry(task, None, f"no doctor --json document in its output, which begins: {_cut(first)}"))
    return out


# How every ``doctor --json`` document begins (commands/doctor/document.py writes the hostname first), and what
# a document that begins so and is no JSON says.
_BEGUN = re.compile(r'\{\s*"hostname"(\s*:\s*)?')
_BROKEN = "its doctor --json document cannot be read: it breaks off (cut short, or other output written into it)"


def _string_at(decoder: json.JSONDecoder, text: str, pos: int) -> "str | None":
    """The JSON string at ``pos`` in ``text``, where a whole one is."""
    try:
        value = decoder.raw_decode(text, pos)[0]
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, str) else None


def _problem(value: object) -> "str | None":
    """What keeps ``value`` from being a ``doctor --json`` document the per-node table can read: None where
    nothing does; "" where it is no such document at all (not an object with its keys ``ok``, ``error``,
    ``plan`` and ``runtime``: other JSON in a node's output); else which value has the wrong type."""
    if not isinstance(value, dict) or not all(key in value for key in ("ok", "error", "plan", "runtime")):
        return ""
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
