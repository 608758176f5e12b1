"""What a reader follows or copies from the documentation: every relative link resolves (file and
heading), and every ``tms-autopreload`` command line shown parses with the real command-line parser.

Runs in this process on the source tree: no venv, no host.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tms_autopreload.commands import main as cli  # noqa: E402

DOCS = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"(?ms)^```[^\n]*\n(.*?)^```")
# A block of what a command printed (```text), which shows no command even where a line begins with its name.
OUTPUT = re.compile(r"(?ms)^```text\n.*?^```")
INLINE = re.compile(r"`([^`\n]+)`")
# A synopsis (``doctor [--json]``, ``FILE|-``, ``CMD [ARGS...]``) describes commands; it is not one.
SYNOPSIS = re.compile(r"[\[\]]|\.\.\.|\|-|\b[A-Z]{2,}\b")


def test_every_page_exists():
    assert all(doc.exists() for doc in DOCS), [str(d) for d in DOCS if not d.exists()]


def _named_tests():
    for doc in DOCS:
        for path, name in re.findall(r"`(?:tests/)?(test_\w+\.py)::(\w+)", doc.read_text()):
            yield pytest.param(path, name, id=f"{doc.relative_to(ROOT)}:{path}::{name}")


@pytest.mark.parametrize(("path", "name"), list(_named_tests()))
def test_named_test_exists(path, name):
    """A page that names a test (``tests/test_x.py::name``) names one that exists."""
    assert re.search(rf"^def {name}\(", (ROOT / "tests" / path).read_text(), flags=re.M), f"{path}::{name}"


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = FENCE.sub("", path.read_text())
    return {_slug(m.group(1)) for m in re.finditer(r"(?m)^#{1,6} (.+)$", text)}


def _links():
    for doc in DOCS:
        text = FENCE.sub("", doc.read_text())
        for target in LINK.findall(text):
            if not re.match(r"[a-z]+:", target):
                yield pytest.param(doc, target, id=f"{doc.relative_to(ROOT)}->{target}")


@pytest.mark.parametrize(("doc", "target"), list(_links()))
def test_relative_link_resolves(doc, target):
    file, _, anchor = target.partition("#")
    path = (doc.parent / file).resolve() if file else doc
    assert path.exists(), f"{doc.relative_to(ROOT)} links to {target}: no such file"
    if anchor:
        assert anchor in _anchors(path), f"{doc.relative_to(ROOT)} links to {target}: no such heading"


def _invocations(snippet: str):
    """The argument lists of every ``tms-autopreload`` in a shell snippet, split as the shell splits
    it (quotes kept together, ``|``, ``&&``, ``;`` and redirections between commands), also inside
    ``$(...)`` substitutions."""
    for inner in re.findall(r"\$\(([^()]*)\)", snippet):
        yield from _invocations(inner)
    snippet = re.sub(r"\d*[<>]&?\d*", " > ", re.sub(r"\$\([^()]*\)", "X", snippet))  # 2>&1 and friends
    lexer = shlex.shlex(snippet, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    command: list[str] = []
    for token in [*lexer, ";"]:
        if token and set(token) <= set("|&;<>()"):
            if "tms-autopreload" in command:
                yield command[command.index("tms-autopreload") + 1:]
            command = []
        else:
            command.append(token)


def _command_lines():
    """Every ``tms-autopreload ...`` invocation in a code block or a code span (headings name a
    command, they do not show one)."""
    for doc in DOCS:
        text = doc.read_text()
        snippets = [line for b in FENCE.findall(OUTPUT.sub("", text)) for line in b.replace("\\\n", " ").splitlines()]
        prose = [line for line in FENCE.sub("", text).splitlines() if not line.startswith("#")]
        snippets += INLINE.findall("\n".join(prose))
        for snippet in snippets:
            try:
                found = list(_invocations(snippet))
            except ValueError:  # an unbalanced quote: a fragment, not a command line
                continue
            for argv in found:
                if argv and not SYNOPSIS.search(" ".join(argv)):
                    yield pytest.param(argv, id=f"{doc.relative_to(ROOT)}:{' '.join(argv)}")


COMMANDS = list(_command_lines())


def test_the_docs_show_commands():
    assert len(COMMANDS) >= 10, COMMANDS


@pytest.mark.parametrize("argv", COMMANDS)
def test_command_line_parses(argv, capsys):
    try:
        args = cli.parse(argv)
    except SystemExit as exc:  # --help and --version exit 0 after printing
        assert exc.code == 0, f"`tms-autopreload {' '.join(argv)}` is refused: {capsys.readouterr().err}"
    else:
        assert args.cmd


def test_a_wrong_command_line_is_refused(capsys):
    """The check above can fail: a combination the parser refuses is caught."""
    with pytest.raises(SystemExit) as exc:
        cli.parse(["doctor", "--deep", "--ray"])
    assert exc.value.code == 2


def test_every_variable_of_the_package_is_listed_once_and_documented():
    """``tms_autopreload.environment.OWN_VARS`` is every variable name the package's source spells (so the fuzz
    targets of test_inputs.py, derived from it, cover a new one), and docs/reference.md has a row for each."""
    from tms_autopreload import environment

    spelled = set()
    for module in (ROOT / "tms_autopreload").glob("*.py"):
        spelled |= set(re.findall(r"[\"'](TMS_AUTOPRELOAD\w*|SLIME_[A-Z_]+)[\"']", module.read_text()))
    assert spelled == set(environment.OWN_VARS), spelled ^ set(environment.OWN_VARS)
    rows = set(re.findall(r"^\| `(\w+)` \|", (ROOT / "docs" / "reference.md").read_text(), flags=re.M))
    assert set(environment.OWN_VARS) <= rows, set(environment.OWN_VARS) - rows


def _causes_given() -> set[str]:
    """Every cause the package's source gives: each call of an :class:`errors.Error` subclass or of
    :class:`verdict.Verdict` with a literal in its ``cause`` place (by keyword or by position, as the class's
    ``__init__`` orders its parameters), and each class body's ``cause = "..."``."""
    import ast
    import importlib
    import inspect

    from tms_autopreload import errors, verdict

    places: dict[str, int | None] = {}  # class name -> index of the cause among the positional arguments
    modules = sorted((ROOT / "tms_autopreload").glob("*.py"))
    for path in modules:
        module = importlib.import_module(f"tms_autopreload.{path.stem}") if not path.stem.startswith("__") else None
        for name, obj in vars(module).items() if module else ():
            if inspect.isclass(obj) and (issubclass(obj, errors.Error) or obj is verdict.Verdict):
                params = [p for p in inspect.signature(obj.__init__).parameters.values()][1:]
                positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
                places[name] = positional.index("cause") if "cause" in positional else None
    def cause(node: ast.AST) -> set[str]:
        """The cause a node gives: a string literal (refused by test_house.py), or an errors.CAUSE_* name."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return {node.value}
        if isinstance(node, ast.Name) and node.id.startswith("CAUSE_"):
            return {getattr(errors, node.id, f"<{node.id}: not in errors.py>")}
        return set()

    given: set[str] = set()
    for path in modules:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for n in node.body:
                    if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "cause" for t in n.targets):
                        given |= cause(n.value)
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", None)
            if name not in places:
                continue
            args = [k.value for k in node.keywords if k.arg == "cause"]
            if places[name] is not None and len(node.args) > places[name]:
                args.append(node.args[places[name]])
            given |= {c for a in args for c in cause(a)}
    return given


def test_every_cause_is_named_once_and_documented():
    """docs/reference.md's causes are exactly the ones the code names (tms_autopreload.errors.CAUSES, the
    one place), each a kebab-case word; every ``CAUSE_*`` constant is among them, and no module gives a
    cause the list lacks. Its verdict statuses are tms_autopreload.verdict.STATUSES."""
    from tms_autopreload import errors, verdict

    assert len(set(errors.CAUSES)) == len(errors.CAUSES), errors.CAUSES
    assert all(re.fullmatch(r"[a-z]+(-[a-z]+)*", c) for c in errors.CAUSES), errors.CAUSES
    named = {v for k, v in vars(errors).items() if k.startswith("CAUSE_")}
    assert named == set(errors.CAUSES), named ^ set(errors.CAUSES)
    given = _causes_given()
    assert given, "no cause found: the scan reads no call"
    assert given <= set(errors.CAUSES), given - set(errors.CAUSES)
    text = (ROOT / "docs" / "reference.md").read_text()
    statuses = re.search(r"`status`\s+\(((?:`\w+`,?\s*)+)\)", text).group(1)
    assert re.findall(r"`(\w+)`", statuses) == list(verdict.STATUSES), statuses
    section = text.split("\n### Causes\n", 1)[1].split("\n#", 1)[0]
    rows = re.findall(r"^\| `([^`]+)` \| \S", section, flags=re.M)
    assert len(rows) == len(set(rows)) and set(rows) == set(errors.CAUSES), set(rows) ^ set(errors.CAUSES)


def test_the_state_variables_fields_are_what_state_key_writes(monkeypatch):
    """reference.md names TMS_AUTOPRELOAD_STATE's fields; state_key() writes exactly those, in that order."""
    from tms_autopreload.environment import CUDA_MAJOR_VAR, PATH_VAR, STATE_VAR, state_key

    row = next(line for line in (ROOT / "docs" / "reference.md").read_text().splitlines()
               if line.startswith(f"| `{STATE_VAR}` |"))
    fields = re.search(r"\(`([^`]*::[^`]*)`", row).group(1).split("::")
    values = {"sys.prefix": sys.prefix, CUDA_MAJOR_VAR: "12", PATH_VAR: "/forced/build.so", "build": "/chosen.so"}
    monkeypatch.setenv(CUDA_MAJOR_VAR, values[CUDA_MAJOR_VAR])
    monkeypatch.setenv(PATH_VAR, values[PATH_VAR])
    assert state_key(values["build"]).split("::") == [values[f] for f in fields], fields


def test_the_commands_the_docs_give_name_files_that_exist():
    """A command the docs give to run from the checkout (`.venv-test/bin/...`, `python ...`, `make ...`) names
    only files of this tree: a module moved or renamed leaves no command behind that names its old path."""
    stale = [(doc.name, span) for doc in DOCS for span in re.findall(r"`([^`\n]+)`", doc.read_text())
             if span.startswith((".venv-test/bin/", "python ", "python3 ", "make "))
             for word in span.split() if word.endswith(".py") and "/" in word and not (ROOT / word).exists()]
    assert stale == []
