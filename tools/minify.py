"""Python code made as short as its syntax tree allows, the same program up to the names it binds:
:func:`short`, for the code that every start of an environment reads in ``tms_autopreload.pth``
(tools/pthfile.py), where each character costs every start, flag or not (docs/performance.md).

What goes: comments and blank lines, the annotations of functions, every space that no token needs, the line
breaks between simple statements (joined by ``;``, and put after their header where a block holds nothing
else), all but one space of each level of indentation, and the length of each name the code binds (one or two
letters, the most used first). A string literal is written from its value, an implicit concatenation as one
literal. The rest is the code's own tokens, so that every Python writes the same text; only an f-string
field's expression is unparsed (a name, an attribute, a call: written alike by every Python).

Refused (``SystemExit``) where the result does not parse to the tree of the code with those names replaced.
"""

from __future__ import annotations

import ast
import builtins
import io
import itertools
import keyword
import string
import tokenize
from collections import Counter
from typing import NamedTuple

Place = tuple[int, int]  # (row, column) in the code's text
# The first tokens of the statements that hold a block, or may: never joined to another by ";" (a soft keyword
# starting a simple statement is taken for one too, which only leaves it on a line of its own).
COMPOUND = {"def", "class", "if", "elif", "else", "for", "while", "try", "except", "finally", "with", "async", "@",
            "match", "case"}
DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)  # the statements that bind their own name


class Statement(NamedTuple):
    """One logical line: its text, spaced where tokens need it; whether it holds a block; that block."""

    text: str
    compound: bool
    block: list[Statement]


def short(code: str, given: tuple[str, ...]) -> str:
    """``code``, ASCII, made short as the module says; ``given``: the names it is run with, kept as they are."""
    if not code.isascii():  # the tree counts columns in bytes, the tokens in characters
        raise SystemExit("tools/minify.py: the code to make short is not ASCII")
    plain = _unannotated(code)
    names = _renaming(ast.parse(plain), given)
    text = "".join(_lines(_statements(_logical_lines(plain, _renamed(plain, names), names)), 0))
    want = _renamed(code, names)  # what text must parse to: the tree of code, renamed, but for the annotations
    for node in ast.walk(want):
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
    try:
        same = ast.dump(ast.parse(text)) == ast.dump(want)
    except SyntaxError:
        same = False
    if not same:
        raise SystemExit("tools/minify.py: the code changes when it is made short")
    return text


def _unannotated(code: str) -> str:
    """``code`` without the annotations of its functions, each with the ``:`` or ``->`` before it."""
    lines = code.splitlines()
    cuts = []  # (row, start column, end column) of each annotation, with the ": " or " -> " before it
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = node.args
            for arg in (*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg):
                if arg is not None and arg.annotation is not None:
                    cuts.append((arg.lineno, arg.col_offset + len(arg.arg), arg.annotation.end_col_offset))
            if node.returns is not None:
                row, end = node.returns.lineno, node.returns.end_col_offset
                cuts.append((row, lines[row - 1].rindex("->", 0, node.returns.col_offset), end))
    for row, start, end in sorted(cuts, reverse=True):
        lines[row - 1] = lines[row - 1][:start].rstrip() + lines[row - 1][end:]
    return "\n".join(lines) + "\n"


def _renaming(tree: ast.Module, given: tuple[str, ...]) -> dict[str, str]:
    """A short name for each name ``tree`` binds (a function, a parameter, a variable), the most used first;
    none for a name that a node also holds as text, where renaming would miss it (an import, a keyword
    argument, an attribute, ``global``, ``except ... as``), for a name a class binds (an attribute, which may
    be looked up by text) or a dunder, nor for ``given``. Every use of a name is renamed alike, in every scope,
    to a name the code does not use: so the program stays the same. (A name looked up by text elsewhere,
    through ``globals()`` or ``getattr``, would be missed: the code made short has none.)"""
    uses: Counter[str] = Counter()
    bound: set[str] = set()
    kept: set[str] = set(given)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            uses[node.id] += 1
            if isinstance(node.ctx, ast.Store):
                bound.add(node.id)
        elif isinstance(node, ast.arg):
            uses[node.arg] += 1
            bound.add(node.arg)
        elif isinstance(node, DEFINITIONS):
            uses[node.name] += 1
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            kept.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            kept.update(node.names)
        elif isinstance(node, ast.keyword) and node.arg is not None:
            kept.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name is not None:
            kept.add(node.name)
        elif isinstance(node, ast.Attribute):
            kept.add(node.attr)
        if isinstance(node, ast.ClassDef):  # its names are attributes, which a program may look up by text
            kept.update(n.id if isinstance(n, ast.Name) else n.name for statement in node.body
                        for n in ast.walk(statement) if isinstance(n, (ast.Name, *DEFINITIONS)))
    taken = set(uses) | kept | set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))
    free = (name for size in (1, 2) for name in map("".join, itertools.product(string.ascii_letters, repeat=size))
            if name not in taken)
    kept.update(name for name in bound if name.startswith("__"))  # a dunder's meaning is its name
    return {name: next(free) for name in sorted(bound - kept, key=lambda name: (-uses[name], name))}


def _renamed(code: str, names: dict[str, str]) -> ast.Module:
    """The tree of ``code`` with ``names`` replaced, each node where it was."""
    tree = ast.parse(code)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = names.get(node.id, node.id)
        elif isinstance(node, ast.arg):
            node.arg = names.get(node.arg, node.arg)
        elif isinstance(node, DEFINITIONS):
            node.name = names.get(node.name, node.name)
    return tree


def _logical_lines(plain: str, tree: ast.Module, names: dict[str, str]) -> list[tuple[int, list[str]]]:
    """Each logical line of ``plain`` as (its depth, its tokens), the comments left out, each name of ``names``
    renamed, each string literal written whole from ``tree`` (``plain``'s, renamed) at its first token."""
    renamed = set(names.values())
    at: dict[Place, str] = {}  # where a renamed name starts -> that name
    strings: dict[Place, tuple[Place, ast.expr]] = {}  # where a string literal starts -> (where it ends, its node)
    todo: list[ast.AST] = [tree]
    while todo:
        for node in ast.iter_child_nodes(todo.pop()):
            if isinstance(node, ast.JoinedStr) or isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings[node.lineno, node.col_offset] = ((node.end_lineno or 0, node.end_col_offset or 0), node)
                continue  # the fields' positions are each Python's own
            name = node.id if isinstance(node, ast.Name) else node.arg if isinstance(node, ast.arg) else ""
            if name in renamed:
                at[node.lineno, node.col_offset] = name  # type: ignore[attr-defined]
            todo.append(node)
    lines: list[tuple[int, list[str]]] = []
    depth, tokens, inside, previous = 0, [], (0, 0), ""
    for token in tokenize.generate_tokens(io.StringIO(plain).readline):
        if token.start < inside:
            continue  # a part of a string literal (3.12 tokenizes an f-string's parts), written whole already
        if token.start in strings:
            inside, node = strings[token.start]
            tokens.append(_string(node))
        elif token.type == tokenize.INDENT:
            depth += 1
        elif token.type == tokenize.DEDENT:
            depth -= 1
        elif token.type == tokenize.NEWLINE:
            lines.append((depth, tokens))
            tokens = []
        elif token.type not in (tokenize.NL, tokenize.COMMENT, tokenize.ENDMARKER):
            new = names.get(token.string) if previous in ("def", "class") else at.get(token.start)
            tokens.append(new or token.string)
        previous = token.string
    return lines


def _string(node: ast.expr, quote: str = "") -> str:
    """A string literal written from its node, in a quote its value leaves free (``"`` first), an f-string
    in one that no field holds (before 3.12 a field cannot), its fields' expressions unparsed; inside an
    f-string (``quote``), a part's text."""
    if isinstance(node, ast.Constant):
        text = str(node.value).encode("unicode_escape").decode("ascii")  # escapes all but the quotes
        if quote:
            return text.replace(quote, f"\\{quote}").replace("{", "{{").replace("}", "}}")
        return next((f"{q}{text}{q}" for q in "\"'" if q not in text), repr(node.value))
    if isinstance(node, ast.FormattedValue):
        field = ast.unparse(node.value)
        if field.startswith("{") or "\\" in field or quote in field:  # what an f-string before 3.12 cannot hold
            raise SystemExit(f"tools/minify.py: an f-string field that is not written as it is: {field}")
        conversion = f"!{chr(node.conversion)}" if node.conversion != -1 else ""
        spec = f":{_string(node.format_spec, quote)}" if node.format_spec is not None else ""
        return f"{{{field}{conversion}{spec}}}"
    assert isinstance(node, ast.JoinedStr), ast.dump(node)
    if quote:
        return "".join(_string(part, quote) for part in node.values)
    fields = [ast.unparse(part) for part in ast.walk(node) if isinstance(part, ast.FormattedValue)]
    quote = next((q for q in "\"'" if not any(q in field for field in fields)), "'")
    return f"f{quote}{_string(node, quote)}{quote}"


def _statements(lines: list[tuple[int, list[str]]]) -> list[Statement]:
    """The logical lines as statements in their blocks, each line's tokens spaced only where two names or
    numbers would run together."""
    root: list[Statement] = []
    blocks = [root]  # the block of each depth down to the last statement's
    for depth, tokens in lines:
        del blocks[depth + 1:]
        text = ""
        for token in tokens:
            if text and (text[-1].isalnum() or text[-1] == "_") and (token[0].isalnum() or token[0] == "_"):
                text += " "
            text += token
        statement = Statement(text, tokens[0] in COMPOUND, [])
        blocks[depth].append(statement)
        blocks.append(statement.block)
    return root


def _lines(statements: list[Statement], depth: int) -> list[str]:
    """The physical lines of ``statements`` at ``depth``: the simple ones in a row joined by ``;``; a compound
    one followed by its block's where that block holds only simple ones, else by its block's lines."""
    out: list[str] = []
    run: list[str] = []  # the simple statements since the last compound one
    for statement in [*statements, None]:
        if statement is not None and not statement.compound:
            run.append(statement.text)
            continue
        if run:
            out.append(" " * depth + ";".join(run) + "\n")
            run = []
        if statement is None:
            break
        if statement.block and not any(s.compound for s in statement.block):
            out.append(" " * depth + statement.text + ";".join(s.text for s in statement.block) + "\n")
        else:
            out += [" " * depth + statement.text + "\n", *_lines(statement.block, depth + 1)]
    return out
