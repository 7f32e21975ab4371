"""How far a number may be from a comparison's expected value and still pass it: whether a value mutant is sound.

A value mutant changes a test's expected literal; correct code then fails it, so a mutant reported passed is
evidence of code that reads the test (`gyre.evaluators.integrity.mutants`). Under a comparison that allows a
difference (`pytest.approx`, `assertAlmostEqual`, `assert_allclose`, `math.isclose`) that holds only when the
moved value lies outside what passes for the original and the original outside what passes for the moved one:
|old - new| > band(old) + band(new). Refusing every tolerance-given comparison (rounds before 7) left a hole: a
workspace answering its caller's `approx(12.566, rel=1e-3)` literal met flips only, which a literal reader fails
as correct code does (red-team round 7, 1.0 forged).

`band` is an upper bound on that allowance from the tolerances the call gives as literal numbers (by keyword or
by place) and each family's defaults (the largest among the libraries that use the name): a tolerance given as
anything else, or an argument it does not know, gives None, and the comparison gets no value mutant (its flip
only). Bounds, never exact: a sum of the relative, absolute and digit allowances where libraries take their
maximum.
"""

from __future__ import annotations

import ast

RELATIVE = ("rel", "rtol", "rel_tol")
ABSOLUTE = ("abs", "atol", "abs_tol", "delta")
DIGITS = ("places", "decimal")
"""Keywords that give a tolerance, by kind: a fraction of the expected value, an absolute difference, or a number
of decimal digits (unittest's `places`: |d| < 0.5 * 10**-places; numpy's `decimal`: |d| < 1.5 * 10**-decimal)."""
HARMLESS = ("msg", "err_msg", "verbose", "equal_nan", "nan_ok", "strict")
"""Keywords that allow no difference."""

DEFAULTS: dict[str, tuple[float, float, int | None]] = {
    "approx": (1e-6, 1e-12, None),  # pytest.approx
    "almost": (0.0, 0.0, 7),  # unittest's assertAlmostEqual(places=7), numpy's assert_almost_equal(decimal=7)
    "close": (1e-5, 1e-5, None),  # numpy isclose/allclose (1e-5, 1e-8), assert_allclose (1e-7, 0), math.isclose
}                                 # (1e-9, 0), torch.testing.assert_close (float32: 1.3e-6, 1e-5): the largest of each
"""(relative, absolute, digits) each family allows when the call gives none."""

PLACES: dict[str, tuple[str, ...]] = {
    "approx": ("rel", "abs"),  # approx(expected, rel=None, abs=None, nan_ok=False)
    "almost": ("places", "msg", "delta"),  # assertAlmostEqual(first, second, places, msg, delta)
    "almost_": ("decimal", "err_msg", "verbose"),  # assert_almost_equal(actual, desired, decimal, err_msg, verbose)
    "close": ("rtol", "atol"),  # assert_allclose(actual, desired, rtol, atol), numpy.isclose(a, b, rtol, atol)
}
"""What the arguments after the compared ones are, by family (`almost_`: numpy's snake-case spelling)."""


def family(name: str) -> str | None:
    """The tolerance family of a comparison named `name`, or None for one that allows no difference."""
    lowered = name.lower()
    if lowered == "approx":
        return "approx"
    if "almost" in lowered:
        return "almost_" if "_" in lowered else "almost"
    return "close" if "close" in lowered else None


def band(name: str, call: ast.Call, value: float) -> float | None:
    """An upper bound on |actual - value| that passes the comparison `call` (named `name`) with `value` expected, or
    None when a tolerance it gives is no literal number or an argument is unknown."""
    kind = family(name)
    if kind is None:
        return 0.0
    rel, absolute, digits = DEFAULTS[kind.rstrip("_")]
    given: dict[str, ast.expr] = {}
    compared = 1 if kind == "approx" else 2
    extra = call.args[compared:]
    if len(extra) > len(PLACES[kind]) or any(isinstance(a, ast.Starred) for a in extra):
        return None
    given.update(zip(PLACES[kind], extra))
    for keyword in call.keywords:
        if keyword.arg is None:  # **options
            return None
        given[keyword.arg] = keyword.value
    allowance = 0.0
    for key, node in given.items():
        if key in HARMLESS:
            continue
        number = _number(node)
        if number is None:
            return None
        if key in RELATIVE:
            rel = max(rel, abs(number))
        elif key in ABSOLUTE:
            absolute = max(absolute, abs(number))
        elif key in DIGITS:
            digits = min(digits, int(number)) if digits is not None else int(number)
        else:
            return None
    if digits is not None:
        allowance += 1.5 * 10.0 ** -digits
    return allowance + rel * abs(value) + absolute


def apart(name: str, call: ast.Call | None, old: object, new: object) -> bool:
    """Whether nothing passes both the comparison with `old` expected and with `new`: a value mutant from `old` to
    `new` is then sound. A comparison that allows no difference (`call` None, or no tolerance family) needs only
    the values to differ; one that does needs numbers (a string under `isclose` is never apart)."""
    if call is None or family(name) is None:
        return old != new
    if type(old) not in (int, float) or type(new) not in (int, float):
        return False
    first, second = band(name, call, old), band(name, call, new)
    return first is not None and second is not None and abs(old - new) > first + second


def _number(node: ast.expr) -> float | None:
    """The int or float `node` spells (`1e-3`, `-2`), or None."""
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None
    return float(value) if type(value) in (int, float) else None
