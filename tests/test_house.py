"""The house rules that keep the code one piece: one cause vocabulary, and no import circle.

Read from the source with ``ast``, so that what no test executes is held to them too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from support import ROOT

PACKAGE = ROOT / "tms_autopreload"
TOOLS = ROOT / "tools"


def _causes() -> dict[str, str]:
    from tms_autopreload import errors

    return {getattr(errors, name): name for name in dir(errors) if name.startswith("CAUSE_")}


# Cause words that are also words of another vocabulary: a document's "error" key, a build's "unusable"
# kind. A literal of these is a cause only where it is given as one (``cause=``, ``cause = ``).
SHARED_WORDS = {"error", "unusable"}


# Where a cause is given by position: the classes that carry one, and the index of that argument.
_CAUSE_POSITIONS = {"Verdict": 3, "Refusal": 0}


def _given_as_cause(tree: ast.AST) -> set[int]:
    """The ids of the expressions given as a cause: ``cause=...``, ``cause = ...``, ``x.cause = ...``, and a
    cause given by position to the classes that carry one (:data:`_CAUSE_POSITIONS`)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "cause":
            out.add(id(node.value))
        elif isinstance(node, ast.Assign) and any(isinstance(t, (ast.Name, ast.Attribute)) and
                                                  getattr(t, "id", getattr(t, "attr", None)) == "cause"
                                                  for t in node.targets):
            out.add(id(node.value))
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "id", getattr(node.func, "attr", None))
            at = _CAUSE_POSITIONS.get(name or "")
            if at is not None and len(node.args) > at:
                out.add(id(node.args[at]))
    return out


def test_every_cause_is_given_by_its_constant():
    """A cause given as a string literal anywhere but errors.py is a second vocabulary: refused."""
    causes = _causes()
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        if path.name == "errors.py":
            continue
        tree = ast.parse(path.read_text())
        as_cause = _given_as_cause(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Constant) and isinstance(node.value, str)):
                continue
            if id(node) in as_cause and node.value not in causes:  # a word of no vocabulary, given as a cause
                found.append(f"{path.name}:{node.lineno}: {node.value!r} (name it in errors.py)")
            elif node.value in causes and (node.value not in SHARED_WORDS or id(node) in as_cause):
                found.append(f"{path.name}:{node.lineno}: {node.value!r} (use errors.{causes[node.value]})")
    assert not found, "\n".join(found)


def test_every_cause_constant_is_given():
    """A cause constant that nothing gives is dead vocabulary (errors.py's own defaults count)."""
    text = "\n".join(p.read_text() for p in PACKAGE.glob("*.py") if p.name != "errors.py")
    errors_py = (PACKAGE / "errors.py").read_text()
    unused = [name for name in _causes().values()
              if not re.search(rf"\b{name}\b", text)  # a whole name: CAUSE_NO_RUNTIME is in CAUSE_NO_RUNTIME_FILE
              and f"cause: str = {name}" not in errors_py and f"cause = {name}" not in errors_py]
    assert not unused, unused


def _imports(path: Path, modules: set[str], package: str | None) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, wherever (deferred and TYPE_CHECKING imports too).
    ``package``: the package's name for relative imports, or None for top-level modules (tools/)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if package is None:
                    out.add(alias.name.split(".")[0])
                elif alias.name.startswith(package + "."):  # import tms_autopreload.results
                    out.add(alias.name.removeprefix(package + ".").split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if package is None and node.level == 0 and node.module:
                out.add(node.module.split(".")[0])
            elif package is not None and (node.level == 1 or node.module and node.module.startswith(package)):
                module = (node.module or "").removeprefix(package).lstrip(".")
                if module:
                    out.add(module.split(".")[0])
                else:  # from . import name: a module of the package, or a name of its __init__
                    out |= {a.name for a in node.names if a.name in modules}
    return out & modules


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of ``graph`` (module -> the modules it imports), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


@pytest.mark.parametrize("where", ["tms_autopreload", "tools"])
def test_no_import_circle(where):
    """The package's modules, and tools/, import one another in layers: no circle, counting deferred and
    TYPE_CHECKING imports. The package's ``__init__`` is left out: it is the start-up entry every module
    reads its shared rules from, and it loads the public API lazily (PEP 562) by name, not by import."""
    root, package = (PACKAGE, "tms_autopreload") if where == "tms_autopreload" else (TOOLS, None)
    modules = {p.stem for p in root.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(root / f"{m}.py", modules, package) - {m} for m in modules}
    assert _circle(graph) is None, " -> ".join(_circle(graph) or [])


def test_the_circle_finder_finds_one():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _module_map() -> list[tuple[str, int]]:
    """docs/development.md's map of the package: (module, its layer's index), in the order listed."""
    import re

    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("`tms_autopreload/`, one module a line"):text.index("`patches/`:")]
    layer, out = 0, []
    for line in section.splitlines():
        if line.endswith(":") and not line.startswith("-"):
            layer += 1
        elif match := re.match(r"- `(\w+)\.py`: \S", line):
            out.append((match.group(1), layer))
    return out


def test_the_module_map_lists_every_module_once():
    """A newcomer's map (docs/development.md): every module of the package on a line of its own, once."""
    listed = [name for name, _ in _module_map()]
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert sorted(set(listed)) == modules, set(listed) ^ set(modules)
    assert len(listed) == len(set(listed)), [n for n in listed if listed.count(n) > 1]


def test_the_module_map_is_in_layers():
    """Each module imports only from its own layer of the map or the layers listed before it (the start-up
    entry, ``__init__``, aside: every module reads the shared rules from it)."""
    where = dict(_module_map())
    modules = set(where) - {"__init__"}
    wrong = [f"{m} imports {dep}" for m in sorted(modules)
             for dep in sorted(_imports(PACKAGE / f"{m}.py", modules, "tms_autopreload")) if where[dep] > where[m]]
    assert not wrong, wrong


def test_one_loader_model_per_survey(monkeypatch):
    """``doctor``'s document reads the survey's own loader model (its driver facts, the search rule):
    the interpreter's ELF file and the loader cache are read once per survey, not once per reader."""
    from tms_autopreload import doctor, ldso, plan

    made = []
    real = ldso.Loader.for_executable.__func__

    def counted(cls, *args, **kw):
        made.append(args[0])
        return real(cls, *args, **kw)

    monkeypatch.setattr(ldso.Loader, "for_executable", classmethod(counted))
    report = plan.survey({"PATH": "/usr/bin:/bin"})
    doc = doctor.document(report, {"PATH": "/usr/bin:/bin"})
    assert len(made) == 1 and report.loader is not None and doc["driver"] is not None, made


def test_the_cuda_majors_are_one_table():
    """What the package knows of each CUDA major (its runtime wheel, its oldest driver, whether
    torch_memory_saver ships a build) is ``sonames.CUDA_MAJORS``; no other module lists majors."""
    def majors(node: ast.AST) -> bool:
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List,
                                                                                          ast.Set)) else []
        values = [i.value for i in items if isinstance(i, ast.Constant) and type(i.value) is int]
        return len(values) >= 2 and len(values) == len(items) and all(11 <= v <= 20 for v in values)

    found = [f"{p.name}:{n.lineno}" for p in sorted(PACKAGE.glob("*.py")) if p.name != "sonames.py"
             for n in ast.walk(ast.parse(p.read_text())) if majors(n)]
    assert not found, found
