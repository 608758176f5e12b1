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
    for path in sorted(PACKAGE.rglob("*.py")):
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
    text = "\n".join(p.read_text() for p in PACKAGE.rglob("*.py") if p.name != "errors.py")
    errors_py = (PACKAGE / "errors.py").read_text()
    unused = [name for name in _causes().values()
              if not re.search(rf"\b{name}\b", text)  # a whole name: CAUSE_NO_RUNTIME is in CAUSE_NO_RUNTIME_FILE
              and f"cause: str = {name}" not in errors_py and f"cause = {name}" not in errors_py]
    assert not unused, unused


def _module_name(path: Path, root: Path) -> str:
    """A module's name inside its root (the package's: ``decision``, ``commands.doctor.deep``; tools/: ``sandbox``)."""
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str], package: str | None, root: Path | None = None) -> set[str]:
    """The modules of ``modules`` that ``path`` imports, wherever (deferred and TYPE_CHECKING imports too).
    ``package``: the package's name, whose modules are named inside it (``commands.doctor.document``), relative
    imports resolved from ``path``'s own package; or None for top-level modules (tools/)."""
    out: set[str] = set()
    here = _module_name(path, root).split(".") if root else []
    home = here if path.name == "__init__.py" else here[:-1]  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if package is None:
                    out.add(alias.name.split(".")[0])
                elif alias.name.startswith(package + "."):  # import tms_autopreload.attempt
                    out.add(alias.name.removeprefix(package + "."))
        elif isinstance(node, ast.ImportFrom):
            if package is None:
                if node.level == 0 and node.module:
                    out.add(node.module.split(".")[0])
                continue
            if node.level:
                base = home[:len(home) - (node.level - 1)] if node.level > 1 else home
            elif node.module and (node.module == package or node.module.startswith(package + ".")):
                base, node_module = [], node.module.removeprefix(package).lstrip(".")
                target = node_module.split(".") if node_module else []
                out |= _resolved(target, node.names, modules)
                continue
            else:
                continue
            target = base + (node.module.split(".") if node.module else [])
            out |= _resolved(target, node.names, modules)
    return out & modules


def _resolved(target: list[str], names: list[ast.alias], modules: set[str]) -> set[str]:
    """What ``from <target> import <names>`` imports of ``modules``: the module itself, or its names that
    are modules (``from . import report``); the package's ``__init__`` where it names only functions."""
    dotted = ".".join(target)
    found = {f"{dotted}.{a.name}" if dotted else a.name for a in names} & modules
    if dotted in modules:
        found.add(dotted)
    elif not dotted and not found:
        found.add("__init__")
    return found


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


def _graph(where: str) -> dict[str, set[str]]:
    """Module -> the modules it imports, for the package (its modules named inside it, ``__init__`` for the
    front door) or for tools/."""
    root, package = (PACKAGE, "tms_autopreload") if where == "tms_autopreload" else (TOOLS, None)
    paths = {(_module_name(p, root) or "__init__") if package else p.stem: p
             for p in root.rglob("*.py") if "__pycache__" not in p.parts}
    return {m: _imports(p, set(paths), package, root) - {m} for m, p in paths.items()}


@pytest.mark.parametrize("where", ["tms_autopreload", "tools"])
def test_no_import_circle(where):
    """The package's modules, and tools/, import one another in layers: no circle, counting deferred and
    TYPE_CHECKING imports. The commands' wing's ``__init__`` is left out: it holds only the helper its command
    modules make their parsers with. (The package's loads the public API lazily, by name: no edge.)"""
    graph = {m: deps - {"commands"} for m, deps in _graph(where).items() if m != "commands"}
    assert _circle(graph) is None, " -> ".join(_circle(graph) or [])


def test_the_hook_wing_never_imports_the_commands_wing():
    """Two wings: the package's top level is what a flagged start and the public API need; the commands and
    what only they use are ``tms_autopreload.commands``. Nothing of the top level imports the commands'
    wing but the two ways into it: ``python -m tms_autopreload`` (``__main__``) and the console script of an
    older install (``cli``). A newcomer sees the line in ``ls``."""
    crossing = {m: sorted(d for d in deps if d == "commands" or d.startswith("commands."))
                for m, deps in _graph("tms_autopreload").items() if "." not in m and m != "commands"}
    assert {m for m, deps in crossing.items() if deps} == {"__main__", "cli"}, crossing
    wing = {_module_name(p, PACKAGE) for p in (PACKAGE / "commands").rglob("*.py") if "__pycache__" not in p.parts}
    assert {"commands", "commands.main", "commands.doctor", "commands.which", "commands.env", "commands.run",
            "commands.kernel"} <= wing, wing


def test_the_circle_finder_finds_one():
    assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _module_map() -> list[tuple[str, int, str]]:
    """docs/development.md's map of the package: (module, its layer's index, its line), in the order listed;
    a module named inside the package (``decision``, ``commands.doctor.deep``, ``commands`` for that wing's front)."""
    import re

    text = (ROOT / "docs" / "development.md").read_text()
    section = text[text.index("`tms_autopreload/` is two wings"):text.index("`patches/`:")]
    layer, out = 0, []
    for line in section.splitlines():
        if line.endswith(":") and not line.startswith("-"):
            layer += 1
        elif match := re.match(r"- `([\w/]+)\.py`: (\S.*)$", line):
            name = match.group(1).replace("/", ".").removesuffix(".__init__")
            out.append((name, layer, match.group(2)))
    return out


def _paths() -> dict[str, Path]:
    return {(_module_name(p, PACKAGE) or "__init__"): p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}


def test_the_module_map_lists_every_module_once_as_its_docstring_says():
    """A newcomer's map (docs/development.md): every module of both wings on a line of its own, once, and
    that line is the module's docstring's first line (reST's ``code`` and roles read as markdown's `code`)."""
    import re

    listed = [name for name, _, _ in _module_map()]
    paths = _paths()
    assert sorted(set(listed)) == sorted(paths), set(listed) ^ set(paths)
    assert len(listed) == len(set(listed)), [n for n in listed if listed.count(n) > 1]

    def plain(text: str) -> str:
        return re.sub(r":(mod|func|class|data|meth):`~?([^`]+)`", r"`\2`", text).replace("``", "`").strip()

    wrong = [f"{name}: map {line!r}, docstring {first!r}" for name, _, line in _module_map()
             if plain(first := (ast.get_docstring(ast.parse(paths[name].read_text())) or "").split("\n")[0])
             != plain(line)]
    assert not wrong, "\n".join(wrong)


def test_the_module_map_is_in_layers():
    """Each module imports only from its own layer of the map or the layers listed before it."""
    where = {name: layer for name, layer, _ in _module_map()}
    graph = _graph("tms_autopreload")
    wrong = [f"{m} imports {dep}" for m in sorted(where) for dep in sorted(graph.get(m, set()))
             if dep in where and where[dep] > where[m]]
    assert not wrong, wrong


def test_the_front_door_lends_no_helper():
    """``__init__`` is what the package is, its version and its public API: a module that imports a name from
    it imports ``__version__`` or a submodule, never a helper; the environment's rules are
    :mod:`tms_autopreload.environment`'s, and the start module copies them from there (tools/pthfile.py)."""
    submodules = {p.stem for p in PACKAGE.glob("*.py")} | {"commands"}
    wrong = []
    for path in PACKAGE.rglob("*.py"):
        home = len(path.relative_to(PACKAGE).parts)  # the dots of an import of the package's __init__
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level, node.module) in ((home, None), (0, "tms_autopreload")):
                wrong += [f"{path.relative_to(PACKAGE)}: {a.name}" for a in node.names
                          if a.name not in submodules | {"__version__"}]
    assert not wrong, wrong


def test_one_loader_model_per_survey(monkeypatch):
    """``doctor``'s document reads the survey's own loader model (its driver facts, the search rule):
    the interpreter's ELF file and the loader cache are read once per survey, not once per reader."""
    from tms_autopreload import decision, ldso
    from tms_autopreload.commands.doctor import document as doctor

    made = []
    real = ldso.Loader.for_executable.__func__

    def counted(cls, *args, **kw):
        made.append(args[0])
        return real(cls, *args, **kw)

    monkeypatch.setattr(ldso.Loader, "for_executable", classmethod(counted))
    report = decision.survey({"PATH": "/usr/bin:/bin"})
    doc = doctor.document(report, {"PATH": "/usr/bin:/bin"})
    assert len(made) == 1 and report.loader is not None and doc["driver"] is not None, made


def test_the_cuda_majors_are_one_table():
    """What the package knows of each CUDA major (its runtime wheel, its oldest driver) is
    ``gpu_libraries.CUDA_MAJORS``, and which of them each torch_memory_saver release ships a build for is
    ``releases.RELEASES``; no other module lists majors."""
    def majors(node: ast.AST) -> bool:
        items = node.keys if isinstance(node, ast.Dict) else node.elts if isinstance(node, (ast.Tuple, ast.List,
                                                                                          ast.Set)) else []
        values = [i.value for i in items if isinstance(i, ast.Constant) and type(i.value) is int]
        return len(values) >= 2 and len(values) == len(items) and all(11 <= v <= 20 for v in values)

    found = [f"{p.name}:{n.lineno}" for p in sorted(PACKAGE.rglob("*.py"))
             if p.name not in ("gpu_libraries.py", "releases.py")
             for n in ast.walk(ast.parse(p.read_text())) if majors(n)]
    assert not found, found


# Each fact of the outside world, by the words that write it, and the one module that writes them: the GPU
# libraries' names and NVIDIA's wheel folders, torch_memory_saver's file names and its release numbers.
FACTS = {r"libcudart\.so": "gpu_libraries", r"libamdhip64\.so": "gpu_libraries", r"libcuda\.so": "gpu_libraries",
         r"nvidia/(cu|\{\})": "gpu_libraries", r"cuda_runtime": "gpu_libraries",
         r"torch_memory_saver_hook_mode_preload": "builds", r"torch_memory_saver_cpp": "builds",
         r"_cu(\d|\{)": "builds", r"\b0\.0\.\d": "releases"}


def _strings(tree: ast.AST) -> "list[ast.Constant]":
    """Every string constant of a module but its docstrings (what it says to its readers, not its users):
    a literal, or the literal parts of an f-string; and each path an ``os.path.join`` call spells in parts,
    joined as the call joins them (``{}`` for a part that is no literal), where a fact split in parts hides."""
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    found = [n for n in ast.walk(tree)
             if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]

    def part(arg: ast.expr) -> str:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.JoinedStr):
            return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values)
        return "{}"

    for call in ast.walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "join" \
                and ast.unparse(call.func.value) in ("os.path", "path", "posixpath"):
            found.append(ast.Constant("/".join(part(a) for a in call.args), lineno=call.lineno))
    return found


def test_each_fact_is_written_once():
    """A fact restated is found as a literal cause is: in any string of another module than its own. What
    a message says of it comes from its module (``runtime_soname(CUDA, 13)``, ``RELEASES``), so that a new
    release or library is one edit. torch.version's field names and JSON keys (``cuda``) are no such fact."""
    import re

    found = []
    for name, path in sorted(_paths().items()):
        for node in _strings(ast.parse(path.read_text())):
            for words, home in FACTS.items():
                if name != home and re.search(words, node.value):
                    found.append(f"{name}:{node.lineno}: {node.value!r} (ask {home})")
    assert not found, "\n".join(found)


def test_the_fact_finder_finds_a_restated_fact():
    tree = ast.parse('"""A docstring may name libcudart.so.13."""\nx = f"needs libcudart.so.{major}"\n'
                     'y = os.path.join(base, "nvidia", f"cu{major}", "lib")\n')
    assert [n.value for n in _strings(tree)] == ["needs libcudart.so.", "nvidia", "lib", "cu", "{}/nvidia/cu{}/lib"]
