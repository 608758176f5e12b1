"""Write ``tms_autopreload.pth`` from the package's own checked code: ``python tools/pthfile.py`` (``--check``:
exit 1 where the file in the tree differs from what this writes).

The file is one import line, which site.py runs in every start of the environment, and ``#: `` comment lines,
which site.py skips and the import line runs only when a flag is on and ``import tms_autopreload`` fails (the
file is left over): :func:`tms_autopreload.leftover.left_over`, with every function and constant of the
package it uses, copied here from the package's source by name, each top-level definition whole. So the
fallback obeys the same flag rules, kill switch and unhooked programs as the package, from one source that
ruff and mypy check; tests/test_packaging.py holds this output, the file in the tree, the sdist's and the
wheel's member identical.

Why a generator of our own: coverage.py writes its ``.pth`` from a template string, which would put the
fallback back outside the checks; what is copied here must be whole definitions of real modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "tms_autopreload"
PTH = ROOT / f"{PACKAGE}.pth"
ENTRY = ("leftover", "left_over")  # (module, function) the fallback calls with the .pth file's path
# The import line: the flags' names are the package's; it reads nothing else, so a start with no flag pays
# for one `import os` (already imported by site.py) and two dictionary lookups.
LINE = ('import os;e=os.environ;({flags})and exec("try:from {package} import process_startup as s\\nexcept '
        'ImportError:exec(f)\\nelse:s()",{{"e":e,"os":os,"pth":vars().get("fullname"),"f":"pth and exec(\'\'.join('
        'l[3:]for l in open(pth)if l[:3]==\'#: \'))"}})\n')
HEADER = """\
# tms_autopreload start-up hook (tms_autopreload/__init__.py): imports nothing unless a flag variable exists.
# Written by tools/pthfile.py; do not edit. If the package is gone (this file left over: its directory deleted,
# or an editable checkout moved), the import line runs the "#: " lines below instead of letting site.py print a
# traceback (site.py names this file ``fullname`` where it runs import lines, 3.10 to 3.17): tms_autopreload/
# leftover.py's left_over() with what it uses of the package, copied from its source. Comments cost a start
# with no flag only their reading; a flagged start compiles them only when the import fails.
"""


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
        for node in tree.body:
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


def fallback() -> str:
    """The fallback's code: every definition :data:`ENTRY` reaches, each module's in its source order, the
    package's front door first, then the standard library imports they use, then the call."""
    modules: dict[str, _Module] = {}

    def module(name: str) -> _Module:
        if name not in modules:
            modules[name] = _Module(name)
        return modules[name]

    wanted: dict[str, tuple[str, ast.stmt]] = {}  # name -> (module, definition)
    imports: set[str] = set()
    todo = [ENTRY]
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
        todo.extend((mod_name, n.id) for n in ast.walk(node) if isinstance(n, ast.Name))
    order = sorted(wanted.values(), key=lambda item: (item[0] != "", item[0] == ENTRY[0], item[0], item[1].lineno))
    parts = sorted(imports) + [module(m).segment(node) for m, node in order] + [f"{ENTRY[1]}(pth)"]
    return "\n".join(parts) + "\n"


def text() -> str:
    """The whole ``.pth`` file."""
    sys.path.insert(0, str(ROOT))
    from tms_autopreload import FLAG_VARS

    code = fallback()
    compile(code, "tms_autopreload.pth fallback", "exec")  # what the import line execs must compile
    flags = " or".join(f'"{name}"in e' for name in FLAG_VARS)
    lines = [line for line in code.splitlines() if line.strip()]  # site.py reads every line of it in every start
    return HEADER + "".join(f"#: {line}\n" for line in lines) + LINE.format(flags=flags, package=PACKAGE)


def main() -> int:
    want = text()
    if sys.argv[1:] == ["--check"]:
        if PTH.read_text() != want:
            print(f"{PTH} is not what tools/pthfile.py writes: run `python tools/pthfile.py`", file=sys.stderr)
            return 1
        return 0
    PTH.write_text(want)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
