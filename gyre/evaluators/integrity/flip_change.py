"""How a flip mutant negates an assertion: as a person would write the negation, never in a form that marks it.

A flip once wrapped any assertion as `assert not (E)`, a shape almost no real test has: a workspace that reads its
caller's assertion (through a frame, a recorded flag on real benchmarks) could tell every flip from every original
and run only the flips (red-team 6). Now the negation is the one the language offers for E's own shape:

- a single comparison swaps its operator (`==` <-> `!=`, `<` <-> `>=`, `>` <-> `<=`, `in` <-> `not in`, `is` <->
  `is not`), in place, the operands' spelling untouched;
- `not X` loses its `not`;
- a name, call, attribute or subscript gains `not ` (`assert not f(x)`);
- `A and B` flips its last operand (`A and not B`, `A and x != 3`): honest code passing the original fails it;
- anything else (a chained comparison, `or`, arithmetic) gets no flip at all: the test is no mutant.
"""

from __future__ import annotations

import ast
import re

from gyre.evaluators.integrity import literal_change as lit

_FLIPPED = {ast.Eq: "!=", ast.NotEq: "==", ast.Lt: ">=", ast.GtE: "<", ast.Gt: "<=", ast.LtE: ">", ast.In: "not in",
            ast.NotIn: "in", ast.Is: "is not", ast.IsNot: "is"}
_SPELLED = {ast.Eq: r"(?<![=<>!])==", ast.NotEq: r"!=", ast.Lt: r"<(?![=<])", ast.GtE: r">=",
            ast.Gt: r"(?<![>-])>(?![=>])", ast.LtE: r"<=", ast.In: r"\bin\b", ast.NotIn: r"\bnot\s+in\b",
            ast.Is: r"\bis\b", ast.IsNot: r"\bis\s+not\b"}
_PREFIXED = (ast.Name, ast.Call, ast.Attribute, ast.Subscript)


def flipped(test: ast.expr, lines: list[str]) -> tuple[tuple[int, int], tuple[int, int], str] | None:
    """(start, end, text) replacing part of the assertion `test` with its natural negation, or None (see above)."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and type(test.ops[0]) in _FLIPPED:
        start, end = lit.span(test.left)[1], lit.span(test.comparators[0])[0]  # the operator between the operands
        text = lit.text_at(start, end, lines)
        found = re.search(_SPELLED[type(test.ops[0])], text)
        if found is None:
            return None
        return start, end, text[:found.start()] + _FLIPPED[type(test.ops[0])] + text[found.end():]
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return flipped(test.values[-1], lines)  # `A and B` -> `A and not B`: still no honest code passes both
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return (*lit.span(test), lit.source(test.operand, lines))
    if isinstance(test, _PREFIXED):
        return (*lit.span(test), "not " + lit.source(test, lines))
    return None
