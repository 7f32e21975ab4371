"""Which new value a value mutant takes so that "is it held elsewhere in the test" says nothing (red-team 7).

Tests very often expect back a value they handed in (`s.push(12); s.push(40); assert s.peek() == 40`,
`db.put("k", "teal"); assert db.get("k") == "teal"`). A mutant moved by a few units (`== 46`) expects a value
that no other place of its test holds, while its original's value is held: a forger that answers the caller's
expected literal only when the test spells it elsewhere (its source, or the count of its code object's constant
loads) passed every original and failed every mutant. So a mutant keeps its original's answer to that question:

- the original's value is held elsewhere in the test: the mutant takes another value the test holds, of the same
  type and look (`== 12`, `== "k"`), when there is one (a string differing in more than case: a
  case-insensitive type of the project's would take `"content-type"` for `"Content-Type"`); honest code passing
  the original fails it, and a forger answering held values passes both runs (tampering, `tally`). A buggy
  honest solution that returns the other input fails the original with that value in its message
  (`mutants.shows`): never tampering.
- it is not held: the mutant's value is moved as before (`literal_change.changed`), redrawn while the move lands
  on a value the test holds.

A test whose expected value is its only literal of that type (`push(31)` then `== 31`) has nothing to take: its
mutant's value stays unheld, as the original's is not (docs/sandbox.md says so).
"""

from __future__ import annotations

import ast
import random

from gyre.evaluators.integrity import literal_change as lit

REDRAWS = 8
"""How many times a moved value is drawn again while it lands on a value the test holds."""


def new_text(chosen: ast.expr, function: ast.AST, lines: list[str], rng: random.Random) -> str:
    """The replacement text of the scalar literal `chosen` inside the test `function` (module docstring)."""
    value = lit.spelled(chosen)
    others = [node for node in _scalars(function) if node is not chosen]
    held = {(type(v), v) for v in (lit.spelled(node) for node in others)}
    if (type(value), value) in held:
        look = _look(chosen, lines)
        echoes = sorted({lit.source(node, lines) for node in others
                         if _look(node, lines) == look and _apart(lit.spelled(node), value)})
        if echoes:
            return rng.choice(echoes)
    text = lit.changed(chosen, lines, rng)
    for _ in range(REDRAWS):
        moved = ast.literal_eval(text.strip())
        if (type(moved), moved) not in held:
            break
        text = lit.changed(chosen, lines, rng)
    return text


def _scalars(function: ast.AST) -> list[ast.expr]:
    """Every changeable scalar literal (`lit.changeable`) in `function`, its nested scopes excluded."""
    found, stack = [], [function]
    while stack:
        node = stack.pop()
        if node is not function and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda,
                                                       ast.ClassDef, ast.JoinedStr)):
            continue  # another scope, or an f-string's parts (no literal of their own)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)) and lit.changeable(node):
            found.append(node)
            continue  # its operand is the same literal
        if isinstance(node, ast.Constant) and lit.changeable(node):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def _apart(a: object, b: object) -> bool:
    """Two values no loose equality of the project's would take for one: strings that differ in more than case and
    surrounding space (a case-insensitive key, a header name), numbers that differ at all."""
    if isinstance(a, (str, bytes)):
        return a.strip().lower() != b.strip().lower()
    return a != b


def _look(node: ast.expr, lines: list[str]) -> tuple:
    """What a literal's spelling tells besides its value: its type and sign, an int's base and grouping, a float's
    notation, a string's prefix and quotes. A value of another look would stand out where the original stood."""
    value, token = lit.spelled(node), lit.source(node, lines).strip()
    if isinstance(value, (str, bytes)):
        return type(value), _opening(token)
    digits = token.lstrip("+- ").lower()
    if isinstance(value, int):
        return type(value), value < 0, _base(digits), "_" in digits
    return type(value), value < 0, "e" in digits, digits.startswith(".")


def _base(digits: str) -> str:
    """An int literal's base prefix (`0x`, `0o`, `0b`), or "" for decimal."""
    return digits[:2] if digits[:2] in ("0x", "0o", "0b") else ""


def _opening(token: str) -> str:
    """A string literal's prefix and opening quotes (`rb'''`)."""
    body = token.lstrip("rRbBuUfF")
    quote = body[:3] if body[:3] in ('"""', "'''") else body[:1]
    return token[:len(token) - len(body)].lower() + quote
