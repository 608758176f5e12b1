"""Write the start-up files from the package's own checked code: ``python tools/pthfile.py`` (``--check``: exit
1 where a file in the tree differs from what this writes).

Three files at the root of site-packages, shipped by setup.py (their names: ``tms_autopreload.startup``):

* ``tms_autopreload.pth``: one import line, which site.py runs in every start of the environment. It reads
  the two flags and nothing else, and only where one is set runs a ``try`` that imports :data:`START`; its
  ``except`` runs the file's second line, a comment site.py skips: :func:`tms_autopreload.leftover.start_gone`,
  with what it uses, for a start whose start module (or the fallback and the package) is gone. Its cost over a
  ``.pth`` of one ``import os`` line is the line's own compile and the comment's read (docs/performance.md).
* ``_tms_autopreload_start.py`` (:data:`START`): :func:`tms_autopreload.startup.process_startup` with
  every definition it reaches, copied here the same way, then the call. So a start with nothing to do, and a
  hooked child (the hook it was resolved for already mapped), import no module of the package; a start with
  work to do imports ``tms_autopreload.startup`` by its absolute name, and where that finds no package (the
  ``.pth`` left over: its directory deleted), imports :data:`LEFT_OVER` instead of letting site.py print a
  traceback. An editable install gets the entry imported from the checkout instead of copied
  (:func:`editable_start`, setup.py): a copy made at install time would keep the rules of that day.
* ``_tms_autopreload_left_over.py`` (:data:`LEFT_OVER`): :func:`tms_autopreload.leftover.left_over`, with
  every function and constant of the package it uses, copied here from the package's source by name, each
  top-level definition whole. So the fallback obeys the same flag rules, kill switch and unhooked programs
  as the package, from one source that ruff and mypy check. It is compiled only where it runs.

What the second line runs is copied the same way, then made short by python-minifier (pinned in
tests/requirements.txt: names the code binds renamed to a letter or two, annotations, docstrings and spaces
dropped), since every start reads it: the same program in about half the characters of the code copied. Every
Python from 3.10 writes the same files (python-minifier prints the tree itself, whatever Python parsed it).
Run it with the test venv's interpreter, which has python-minifier: ``.venv-test/bin/python tools/pthfile.py``.

tests/test_packaging.py holds this output, the files in the tree, the sdist's and the wheel's members
identical.

Why a generator of our own: coverage.py writes its ``.pth`` from a template string, which would put the
fallback outside the checks; what is copied here must be whole definitions of real modules.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tms_autopreload.environment import FLAG_VARS  # noqa: E402 - the checkout's package, on the path just above
from tms_autopreload.startup import FALLBACK as LEFT_OVER  # noqa: E402
from tms_autopreload.startup import PTH, START  # noqa: E402

PACKAGE = "tms_autopreload"
ENTRY = ("leftover", "left_over")  # (module, function) the fallback calls with the .pth file's path
GONE = ("leftover", "start_gone")  # (module, function) the .pth's second line calls with the .pth file's path
GIVEN = ("fullname",)  # the names that code is run with: site.py's name for the .pth file it reads
GENERATED = "# Written by tools/pthfile.py from the tms_autopreload package's source; do not edit.\n"
STARTUP = ("startup", "process_startup")  # (module, function) the start module runs
START_DOC = '''"""tms_autopreload's start-up entry, imported by tms_autopreload.pth where a flag is set:
tms_autopreload.startup.process_startup with what it uses, copied here (imported from the checkout in an
editable install), so that a start with nothing to do imports no module of the package."""'''
# Between these two lines the start module holds its copy of the entry; an editable install's start module
# imports the checkout's own there instead (setup.py, which cannot run this generator, cuts at these lines).
COPY_BEGINS = "# The entry, copied from the package (an editable install imports it instead):"
COPY_ENDS = "# The call."
START_CALL = f'''try:
    process_startup()
except ModuleNotFoundError as exc:  # work to do, and no package: its .pth left over; say so once, with the fix
    if exc.name != "{PACKAGE}" and not (exc.name or "").startswith("{PACKAGE}."):
        raise
    import {LEFT_OVER}  # noqa: F401 - it runs on import
'''
EDITABLE_ENTRY = f"from {PACKAGE}.{STARTUP[0]} import {STARTUP[1]}"


class _Module:
    """One module of the package, parsed: its top-level definitions and imports, by the name they bind."""

    def __init__(self, name: str) -> None:
        self.name = name
        path = ROOT / PACKAGE / ("__init__.py" if name == "" else f"{name}.py")
        self.source = path.read_text()
        tree = ast.parse(self.source)
        self.defined: dict[str, ast.stmt] = {}
        self.relative: dict[str, tuple[str, str]] = {}  # name -> (module, name there)
        self.absolute: dict[str, str] = {}  # name -> the import statement that binds it
        self.typing: list[str] = []  # its TYPE_CHECKING imports, which its string annotations name
        for node in tree.body:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                self.typing += [ast.unparse(n) for n in node.body if isinstance(n, (ast.Import, ast.ImportFrom))
                                and not getattr(n, "level", 0)]
                continue
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                self.defined[node.name] = node
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for bound in target.elts if isinstance(target, ast.Tuple) else [target]:
                        if isinstance(bound, ast.Name) and bound.id not in ("TYPE_CHECKING", "__all__"):
                            self.defined[bound.id] = node
            elif isinstance(node, ast.ImportFrom) and node.level == 1:
                for alias in node.names:
                    if alias.asname:
                        raise SystemExit(f"{path}: `as` in a relative import is not copied: {alias.asname}")
                    self.relative[alias.name] = (node.module or "", alias.name)
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                for alias in node.names:
                    self.absolute[(alias.asname or alias.name).split(".")[0]] = ast.unparse(node)

    def segment(self, node: ast.stmt) -> str:
        """A definition's source as written, its docstring left out (it is for the module's readers)."""
        lines = self.source.splitlines()[node.lineno - 1:node.end_lineno]
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str) and len(body) > 1:
            first, last = body[0].lineno - node.lineno, body[0].end_lineno - node.lineno  # type: ignore[operator]
            lines = lines[:first] + lines[last + 1:]
        return "\n".join(lines)


def definitions(*entries: tuple[str, str]) -> tuple[list[str], list[str], list[tuple[_Module, ast.stmt]]]:
    """What ``entries`` (module, function) reach: the standard library imports they use, the ``TYPE_CHECKING``
    imports of their modules, and every definition, each once, each module's in its source order, the
    environment's rules first and the entries' module last."""
    modules: dict[str, _Module] = {}

    def module(name: str) -> _Module:
        if name not in modules:
            modules[name] = _Module(name)
        return modules[name]

    wanted: dict[str, tuple[str, ast.stmt]] = {}  # name -> (module, definition)
    imports: set[str] = set()
    todo = list(entries)
    while todo:
        mod_name, name = todo.pop()
        mod = module(mod_name)
        if name in mod.relative:
            todo.append(mod.relative[name])
            continue
        if name in mod.absolute:
            imports.add(mod.absolute[name])
            continue
        node = mod.defined.get(name)
        if node is None:
            continue  # a builtin, a parameter or a local
        if name in wanted:
            if wanted[name][0] != mod_name:
                raise SystemExit(f"{name} is defined in both {PACKAGE}.{wanted[name][0]} and {PACKAGE}.{mod_name}")
            continue
        wanted[name] = (mod_name, node)
        # Not the names a function binds by an import of its own: what a start with work to do imports.
        local = {(a.asname or a.name).split(".")[0] for n in ast.walk(node) if n is not node
                 and isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
        todo.extend((mod_name, n.id) for n in ast.walk(node) if isinstance(n, ast.Name) and n.id not in local)
    last = entries[0][0]
    order = sorted({(m, id(node)): (m, node) for m, node in wanted.values()}.values(),  # one assignment, many names
                   key=lambda item: (item[0] != "environment", item[0] == last, item[0], item[1].lineno))
    # The TYPE_CHECKING imports of the modules copied from, but those no copied definition names (in its
    # annotations, strings mostly: a word search).
    words = set(re.findall(r"\w+", "".join(module(m).segment(node) for m, node in order)))
    typing = sorted({i for m in {m for m, _ in order} for i in module(m).typing
                     if words & {n.asname or n.name for n in ast.parse(i).body[0].names}})  # type: ignore[attr-defined]
    return sorted(imports, key=lambda i: (i.startswith("from"), i)), typing, [(module(m), n) for m, n in order]


def _body(order: list[tuple[_Module, ast.stmt]]) -> str:
    """The definitions as written, two blank lines apart, a module's constants together."""
    body, last = "", None
    for mod, node in order:
        plain = isinstance(node, (ast.Assign, ast.AnnAssign))
        sep = "\n\n" if last is None else "\n" if plain and last == (mod.name, True) else "\n\n\n"
        body += sep + mod.segment(node)
        last = (mod.name, plain)
    return body


def fallback() -> str:
    """The fallback's code: every definition :data:`ENTRY` reaches, each module's in its source order, the
    environment's rules first, then the standard library imports they use, then the call."""
    imports, typing, order = definitions(ENTRY, ("startup", "processed_pth"))
    head = "".join(f"{i}\n" for i in imports)
    head += "\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n" + "".join(f"    {i}\n" for i in typing)
    call = f"{ENTRY[1]}(processed_pth(os.path.join(os.path.dirname(__file__), {PTH!r})))"
    return f"{head}{_body(order)}\n\n\n{call}\n"


def gone() -> str:
    """The ``.pth`` file's second line after its ``#``: one statement that runs :data:`GONE` with every definition it
    reaches, made short (python-minifier), in a namespace of its own that knows the ``.pth`` file's path."""
    from python_minifier import minify  # a test and tool dependency, never the package's: not for setup.py

    imports, _, order = definitions(GONE)
    code = minify("".join(f"{i}\n" for i in imports) + _body(order) + f"\n{GONE[1]}(fullname)\n",
                  rename_globals=True, preserve_globals=list(GIVEN), remove_annotations=True, hoist_literals=False)
    compile(code, PTH, "exec")
    return f"exec({code!r},{{'fullname':fullname}})"


def pth() -> str:
    """The ``.pth`` file: the import line, then the comment its ``except`` runs (the file's second line, after
    its ``#``). Where a flag is set the line runs a ``try`` that imports the start module, a string with ``%c``
    where its line break goes, formatted with 10 where it runs: an escape (``\\n``) in the line would cost every
    start its decoding, flag or not, when site.py compiles the line."""
    flags = " or".join(f'"{name}"in os.environ' for name in FLAG_VARS)
    attempt = f"try:import {START}%cexcept:exec([*open(fullname)][1][1:])"
    return f'import os;({flags})and exec("exec({attempt!r}%10)")\n#{gone()}\n'


def start() -> str:
    """The start module: :data:`STARTUP` with every definition it reaches, then the call, where a missing
    package (only that) leads to the fallback."""
    imports, typing, order = definitions(STARTUP)
    head = "".join(f"{i}\n" for i in imports)
    head += "\nTYPE_CHECKING = False\nif TYPE_CHECKING:\n" + "".join(f"    {i}\n" for i in typing)
    return f"{GENERATED}{START_DOC}\n\n{COPY_BEGINS}\n{head}{_body(order)}\n\n\n{COPY_ENDS}\n{START_CALL}"


def editable_start(text: str) -> str:
    """An editable install's start module: ``text`` (:func:`start`) with its copy of the entry replaced by
    the checkout's own, imported, as setup.py writes it."""
    head, _, rest = text.partition(COPY_BEGINS + "\n")
    _, _, tail = rest.partition("\n" + COPY_ENDS + "\n")
    return f"{head}{EDITABLE_ENTRY}\n\n\n{tail}"


def texts() -> dict[str, str]:
    """Each file's text, by its name."""
    code = fallback()
    compile(code, LEFT_OVER, "exec")  # what the start imports where the package is gone must compile
    doc = '"""The start of a process whose tms_autopreload package is gone (tms_autopreload/leftover.py)."""'
    entry = start()
    compile(entry, START, "exec")
    return {PTH: pth(), f"{START}.py": entry, f"{LEFT_OVER}.py": f"{GENERATED}{doc}\n\n{code}"}


def main() -> int:
    want = texts()
    if sys.argv[1:] == ["--check"]:
        stale = [name for name, text in want.items() if (ROOT / name).read_text() != text]
        for name in stale:
            print(f"{name} is not what tools/pthfile.py writes: run `.venv-test/bin/python tools/pthfile.py`",
                  file=sys.stderr)
        return 1 if stale else 0
    for name, text in want.items():
        (ROOT / name).write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
