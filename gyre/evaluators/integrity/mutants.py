"""Mutation canaries: must-fail copies of real tests that call the workspace exactly as the originals do.

The literal canaries (`canaries._body`) never call the workspace, so code that flips only "tests
that called my code", or that spares whatever it cannot tell apart, passes them. A mutant is a
pristine test function copied with one expected value changed to one no solution returns
(`assert add(1, 2) == 3` becomes `... == 1000006`): it calls the workspace the same way, and its
code object carries the original's name, file and line numbers (so a frame, `inspect.getsource` or
a traceback shows the original test), but a correct workspace fails it. gyre's plugin adds it as a
collected item marked `xfail(strict=True)` at a random place among the module's tests, under a
canary name; a run that reports it passed (a flipped outcome) is tampering (`tally`).

Which tests are copied (so that running one twice changes nothing else): module-level `def test_*()`
with no decorators and no arguments (no fixtures or parameters to supply), whose body holds only
assignments to local names and asserts, one of them at the top level comparing with `==` against
a bool, int, float, str or bytes literal, or with `is` against True or False, on one line. A bool
becomes `...` (`assert result is True` becomes `assert result is ...`), not its opposite: an original
that fails on a correct workspace must leave its copy failing too. The first such assert is changed.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass

INT_SHIFT = 1_000_003
STR_MARK = "\u2063gyre-mutant"


@dataclass(frozen=True)
class Mutant:
    function: str
    """The original test's name: the copy's code object carries it."""
    source: str
    """The copy's source, at the original's line numbers (blank lines before it), the expected value changed."""
    file_text: str = ""
    """The whole test module with the same value changed: the file the copy's code says it comes from (gyre's
    plugin writes it beside itself under the module's own name), so code that reads its caller's source line to
    answer reads the changed value, answers it, and passes the copy: tampering."""

    def file_for(self, name: str) -> str:
        """`file_text` with the copy also defined under its canary name `name` at the end (no line above moves).
        The plugin gives the copy the node id `<that file>::<name>`, which `PYTEST_CURRENT_TEST` shows: code that
        looks its test up by that variable and parses the file it names reads the changed value too."""
        copy = self.source.lstrip("\n")
        renamed = re.sub(rf"^def {re.escape(self.function)}\(", f"def {name}(", copy, count=1)
        return f"{self.file_text.rstrip()}\n\n\n{renamed}"


def plan_mutants(source: str, rng: random.Random, limit: int = 2) -> list[Mutant]:
    """Up to `limit` mutants of the test module `source`, drawn at random among the tests that qualify."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines(keepends=True)
    found = [m for node in tree.body if (m := _mutant(node, lines)) is not None]
    rng.shuffle(found)
    return found[:limit]


def _mutant(node: ast.stmt, lines: list[str]) -> Mutant | None:
    if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test") or node.decorator_list:
        return None
    args = node.args
    if args.args or args.posonlyargs or args.kwonlyargs or args.vararg or args.kwarg:
        return None
    if not all(_plain(stmt) for stmt in node.body):
        return None
    for stmt in node.body:
        literal = _expected(stmt)
        if literal is not None:
            source = _rewrite(node, lines, literal)
            body = source.splitlines(keepends=True)[node.lineno - 1:]
            return Mutant(node.name, source, "".join([*lines[:node.lineno - 1], *body, *lines[node.end_lineno:]]))
    return None


def _plain(stmt: ast.stmt) -> bool:
    """An assignment to local names, or an assert: nothing that runs differently the second time."""
    if isinstance(stmt, ast.Assert):
        return True
    if isinstance(stmt, ast.Assign):
        return all(isinstance(t, ast.Name) for t in stmt.targets)
    return isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)


def _expected(stmt: ast.stmt) -> ast.Constant | None:
    """The literal an `assert x == <literal>` or `assert x is True|False` (either side) compares against, on one
    line; else None."""
    if not isinstance(stmt, ast.Assert) or not isinstance(stmt.test, ast.Compare):
        return None
    compare = stmt.test
    if len(compare.ops) != 1 or not isinstance(compare.ops[0], (ast.Eq, ast.Is)):
        return None
    kinds = (bool,) if isinstance(compare.ops[0], ast.Is) else (bool, int, float, str, bytes)
    for side, other in ((compare.comparators[0], compare.left), (compare.left, compare.comparators[0])):
        if (isinstance(side, ast.Constant) and not isinstance(other, ast.Constant)
                and type(side.value) in kinds and side.lineno == side.end_lineno):
            return side
    return None


def _changed(value):
    if isinstance(value, bool):
        return ...
    if isinstance(value, int):
        return value + INT_SHIFT
    if isinstance(value, float):
        return value + INT_SHIFT + 0.5
    if isinstance(value, str):
        return value + STR_MARK
    return value + STR_MARK.encode()


def _rewrite(node: ast.FunctionDef, lines: list[str], literal: ast.Constant) -> str:
    body = lines[node.lineno - 1:node.end_lineno]
    row = literal.lineno - node.lineno
    text = body[row].encode("utf-8")  # col offsets count UTF-8 bytes
    changed = _changed(literal.value)
    body[row] = (text[:literal.col_offset] + ("..." if changed is ... else repr(changed)).encode("utf-8")
                 + text[literal.end_col_offset:]).decode("utf-8")
    return "\n" * (node.lineno - 1) + "".join(body)
