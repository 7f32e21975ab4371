"""Comparisons a value mutant is unsound for: the test checks a matcher, an object equal to many values by design.

A value mutant changes a test's expected literal and counts a pass as tampering, because honest code passes it
only by computing exactly the changed value (`mutants`). That holds when the object compared is what the
project computed. It fails when the object is one the test builds right there from a class it names, its
arguments literals or types (`IsPositive() == 5`, `m.HasLength(3) == [1, 2, 3]`, `IsInstance(int) == 5`,
`IsInstance[int] == 5`, a bare `IsStr == "a"`; never a bare attribute such as `Color.Red`, more often a member):
that class's equality is the behaviour under test, and a matcher (dirty-equals, PyHamcrest, `mock.ANY` itself) is
equal to `8` as honestly as to `5` (red-team round 7: an honest matcher project scored tampering). Such a
comparison gets its flip mutant only.

What a forger gains: a class of the project equal to everything passes those comparisons unseen, as it does
under upstream's procedure (`Fraction(1, 2) == 0.5` is one too: a constructor computing from literals is not told
from a matcher). Nothing elsewhere: the same object returned by a function (`add(2, 3) == 5`), computed on after
it is built (`Money(5).plus(1) == 6`) or built from the test's own values (`DeepDiff(t1, t2) == {...}`: that
constructor computes) still meets value mutants.
"""

from __future__ import annotations

import ast
import builtins

from gyre.evaluators.integrity import literal_change as lit

BUILTIN_TYPES = frozenset(name for name, value in vars(builtins).items() if isinstance(value, type))
"""`int`, `str`, `dict`, ...: a matcher's argument naming a type is a setting, like a literal."""


def built_in_place(node: ast.expr) -> bool:
    """Whether `node`, one side of a comparison, is an object built in place from a class the test names, its
    arguments literals or types (module docstring); a class is a CapWords name, not a CONSTANT or a function."""
    if isinstance(node, ast.Call):
        if not all(_setting(a) for a in [*node.args, *(k.value for k in node.keywords)]):
            return False
        return _class(node.func)
    if isinstance(node, ast.Subscript):
        return _class(node.value)
    return isinstance(node, ast.Name) and _class(node)  # a bare `m.Red` is more often a member than a class


def _setting(node: ast.expr) -> bool:
    """A matcher's argument: a literal (`3`, `delta=1`, `regex="^a"`) or a type (`int`, `Decimal`); a name the
    test bound (`DeepDiff(t1, t2)`: a computation on the test's inputs) is not."""
    if isinstance(node, ast.Name) and node.id in BUILTIN_TYPES:
        return True
    return lit.is_literal(node) or _class(node)


def _class(node: ast.expr) -> bool:
    name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else ""
    return name[:1].isupper() and any(c.islower() for c in name)  # CapWords: a class, not a CONSTANT
