"""One row per node, the table and its summary: the same for ``doctor --ray`` and ``doctor --nodes``.

A node's *answer* is what it said: a Ray worker's probe (:mod:`tms_autopreload.commands.doctor.ray_cluster`: its
interpreter, the versions of tms_autopreload and torch_memory_saver installed there, ``missing`` when
tms_autopreload is not importable there, ``started``: what the start-up hook really did in that process,
and ``survey``: its ``doctor --json`` document, :mod:`tms_autopreload.commands.doctor.document`), or a plain ``doctor
--json`` document that another launcher collected (:func:`document_answer`, read by
:mod:`tms_autopreload.commands.doctor.nodes`), which says what the hook will do there.
"""

import os

from .document import VERSIONED, chosen_build, is_ok, table
from ...errors import Error
from ...gpu_libraries import runtime_name
from .driver import FAILING, NOT_FOUND

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = ["node_row", "document_answer", "document_rows", "render", "summary", "failing", "passed", "not_installed",
           "VERSIONED"]


def _dict(value: object) -> "dict[str, Any]":
    """``value`` when it is a dict, else empty: documents read from files are checked only for the keys
    :mod:`.nodes` requires, so every other field is read defensively."""
    return value if isinstance(value, dict) else {}


def _str(value: object) -> "str | None":
    return value if isinstance(value, str) else None


def _printable(text: str) -> str:
    """``text`` as a terminal may show it: every character that is not printable (an escape sequence's ESC, a
    carriage return, a bell) written as Python writes it in a string's repr (``\\x1b``). A row's words come from
    documents other nodes wrote, and a table is read in a terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def not_installed(python: str, prefix: "str | None") -> str:
    """The error of a node whose workers cannot import tms_autopreload, with the fix (made where the
    table is made: the machine that drives the preflight, whose install record is all that is known)."""
    from ...install_source import install_advice

    where = f" (sys.prefix {prefix})" if prefix else ""
    into = f"the environment Ray starts that node's workers from{where}"
    return str(Error(f"tms_autopreload is not installed for {python}: the flag does nothing there, and the job "
                     f"will die in torch_memory_saver's own check (`TorchMemorySaver observes invalid LD_PRELOAD`)",
                     fix=f"{install_advice(into, python)}; or restart the node (`ray start`) from an environment "
                         f"that has it"))


def node_row(name: "str | None", ip: "str | None", node_id: "str | None", answer: "dict[str, Any] | None",
             error: "str | None", gpus: "float | None" = None) -> "dict[str, Any]":
    """One node's row: ``ok``, and the error to show. ``gpus``: what the node offers Ray (None: unknown).

    A node is ok when its document is (:func:`.document.is_ok`: a plan, and a driver that can
    run torch's CUDA) and, when the answer says how its worker started, that worker came up hooked with
    at most one runtime library. ``answer`` None: the node did not answer (``error`` says why).
    """
    row = {"node_id": node_id, "ip": ip, "name": name, "gpus": gpus, "ok": False, "answer": answer, "error": error}
    if answer is None:
        return row
    if answer.get("missing"):
        row["error"] = error or not_installed(answer.get("executable") or answer.get("python") or "?",
                                              answer.get("prefix"))
        return row
    if answer.get("error") and not error:
        row["error"] = answer["error"]
        return row
    doc, started = _dict(answer.get("survey")), answer.get("started")
    driver = _dict(doc.get("driver"))
    hooked = started is None or (started["hooked"] and len(started["libcudart"]) <= 1)
    # The node's own verdict too: its doctor also judges what the row cannot see (its start-up files).
    row["ok"] = (is_ok(doc.get("plan"), driver, doc.get("runtime")) and doc.get("ok") is not False and hooked
                 and not error)
    if row["ok"] or row["error"]:
        return row
    start_up, split = _dict(doc.get("start_up")), _dict(_dict(doc.get("runtime")).get("split"))
    if doc.get("error"):
        row["error"] = doc["error"]
    elif driver.get("verdict") == FAILING:
        said = _str(driver.get("message")) or "the driver cannot run this torch"
        row["error"] = str(Error(said.rstrip("."), fix=_str(driver.get("fix")) or None))
    elif start_up:
        said = _str(start_up.get("message")) or "its start-up files leave flagged starts unhooked"
        row["error"] = str(Error(said, fix=_str(start_up.get("fix")) or None))
    elif split:
        named = split.get("overrides")
        overrides = [o for o in named if isinstance(o, str)] if isinstance(named, list) else []
        overrides = overrides or ["an override"]
        row["error"] = str(Error(f"{', '.join(overrides)} makes the hook use another CUDA runtime than torch links"
                                 f"{f' ({t})' if (t := _str(split.get('torch_library'))) else ''}",
                                 fix=_str(split.get("fix")) or None))
    elif doc.get("plan") and doc.get("ok") is False:
        row["error"] = "its doctor says it is not ok"
    elif started is None:
        row["error"] = "its doctor found no plan"
    else:
        row["error"] = (f"the worker started unhooked (mapped: {started['mapped'] or 'none'}, "
                        f"{len(started['libcudart'])} libcudart)")
    return row


def document_answer(doc: "dict[str, Any]") -> "dict[str, Any]":
    """A node's plain ``doctor --json`` document in the shape of a worker's answer (no start facts)."""
    return {"hostname": doc.get("hostname"), "python": doc.get("python"), "versions": _dict(doc.get("versions")),
            "survey": doc}


def document_rows(text: str) -> "list[dict[str, Any]]":
    """One row per ``doctor --json`` document in ``text`` (many nodes' output, :mod:`.nodes` reads it)."""
    from .nodes import read_documents

    rows = []
    for entry in read_documents(text):
        doc = entry.document
        name = entry.hostname or (f"task {entry.task}" if entry.task is not None else None)
        rows.append(node_row(name, None, None, None if doc is None else document_answer(doc), entry.error))
    return rows


def counted(row: "dict[str, Any]", all_nodes: bool) -> bool:
    """Whether a row decides the verdict: nodes that offer no GPU do only with ``all_nodes``."""
    return all_nodes or row.get("gpus") is None or row["gpus"] > 0


def failing(rows: "list[dict[str, Any]]", all_nodes: bool) -> "list[dict[str, Any]]":
    return [r for r in rows if counted(r, all_nodes) and not r["ok"]]


def passed(rows: "list[dict[str, Any]]", all_nodes: bool) -> bool:
    """The preflight's verdict, for ``doctor --ray`` and ``doctor --nodes`` alike: at least one node was
    counted, and no counted node fails. A preflight that counted no node checked nothing, so it does
    not pass: no input (``--nodes`` read no document), or only nodes that offer Ray no GPU."""
    return any(counted(r, all_nodes) for r in rows) and not failing(rows, all_nodes)


def _versions(answer: "dict[str, Any] | None") -> "dict[str, str | None]":
    return {name: _str(_dict(_dict(answer).get("versions")).get(name)) for name in VERSIONED}


def _label(row: "dict[str, Any]") -> str:
    """A node's name (when it is not just its IP) and the start of its id."""
    name = row["name"] if row.get("name") and row["name"] != row.get("ip") else ""
    return f"{name} {(row.get('node_id') or '')[:8]}".strip() or "?"


def _driver(answer: "dict[str, Any]") -> str:
    """The driver cell: the user-space driver's version (the module's when it has none in its name) and its verdict."""
    driver = _dict(_dict(answer.get("survey")).get("driver"))
    if not driver:
        return "-"
    version = _str(driver.get("library_version")) or _str(driver.get("module_version"))
    if driver.get("verdict") == FAILING:
        return f"{version or '?'} FAILING"
    if driver.get("verdict") == NOT_FOUND:
        return "NOT FOUND"
    return version or "unknown"


def render(rows: "list[dict[str, Any]]") -> str:
    """The table: one line per node, the first line of its error when it fails."""
    lines: "list[tuple[str, ...]]" = [("node", "ip", "GPUs", "python", "tms_autopreload", "torch_memory_saver",
                                       "torch (runtime)", "driver", "hooked", "build, or the first line of the error")]
    for r in rows:
        answer = r["answer"] or {}
        rt = (answer.get("survey") or {}).get("runtime") or {}
        torch = (f"{rt.get('torch_version') or 'no torch'} ({runtime_name(rt.get('kind') or '', rt.get('major'))})"
                 if rt else "-")
        plan = (answer.get("survey") or {}).get("plan")
        # The error's first line with words (split at line feeds alone: another control character is shown).
        what = (chosen_build(answer["survey"], name=os.path.basename) if plan and r["ok"] else
                next((line for line in (r["error"] or "").split("\n") if line.strip()), "-"))
        versions = _versions(answer)
        gpus = "-" if r.get("gpus") is None else f"{r['gpus']:g}" if r["gpus"] else "none"
        cells = [_printable(str(c)) for c in (
            _label(r), r.get("ip") or "-", gpus, answer.get("python") or "-",
            versions["tms_autopreload"] or ("NOT INSTALLED" if answer.get("missing") else "-"),
            versions["torch_memory_saver"] or "-", torch, _driver(answer), "yes" if r["ok"] else "NO", what)]
        lines.append((*cells[:-1], cells[-1] if len(cells[-1]) <= 160 else cells[-1][:157] + "..."))
    return table(lines)


def summary(rows: "list[dict[str, Any]]", here: "dict[str, str | None] | None", all_nodes: bool) -> "list[str]":
    """The summary line (counts, and the nodes without GPUs), then, when ``here`` is given (the versions of
    the machine that drives the job), one line per node whose versions differ from them."""
    bad = failing(rows, all_nodes)
    skipped = [r for r in rows if not counted(r, all_nodes)]
    nodes = f"{len(rows)} node{'' if len(rows) == 1 else 's'}"
    head = f"{nodes}: {len(rows) - len(bad) - len(skipped)} ok, {len(bad)} failing"
    if skipped:
        head += (f", {len(skipped)} without a GPU for Ray (shown, not counted: "
                 f"{sum(not r['ok'] for r in skipped)} of them failing; --all-nodes counts them)")
    if not rows:
        head += "; no node's doctor --json document was read, so nothing was checked"
    if rows and len(skipped) == len(rows):
        head += ("; no node was counted, so nothing was checked: declare each GPU node's GPUs to Ray "
                 "(`ray start --num-gpus N`), or pass --all-nodes to count every node")
    out = [head]
    if here is None:
        return out
    for r in rows:
        if not _dict(r["answer"]).get("versions"):
            continue
        theirs = _versions(r["answer"])
        differ = [f"{name} {theirs[name] or 'not installed'} (here {here.get(name) or 'not installed'})"
                  for name in VERSIONED if theirs[name] != here.get(name)]
        if differ:
            out.append(_printable(f"versions differ on {_label(r)} ({r.get('ip') or '?'}): {', '.join(differ)}"))
    return out
