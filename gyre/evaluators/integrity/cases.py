"""How many cases a pristine test has, when its source says so for certain: a cap on what counts.

Scores count cases, parameters included (`test_x[1]`, `test_x[2]`: NL2RepoBench's "N passed"),
and only ids whose base a pristine file defines. But the cases of a parametrized test are made at
run time, inside the test process, where the workspace's code runs: one patch of
`Metafunc.parametrize` at import turned `@parametrize("a,b,expected", [3 cases])` into 50 cases
its wrong `add` passes, 50/3 passed, score 1.0. Canaries are not parametrized and saw nothing.

`case_counts(source)` reads a pristine test module's syntax tree (never imports it) and gives, for
each test function whose case count is certain, that count: the product of the lengths of its
`parametrize` lists. Tests are module-level functions and the methods of `Test*` classes (nested
ones too, the classes' own `parametrize` marks multiplying their methods'), as pytest collects them:
a workspace conftest that parametrizes an autouse fixture of its own doubles a class's tests just as
a module's. Certain means: every decorator (of the function and of each class around it) is a
`pytest.mark.*` (or `mark.*`) one, every `parametrize` among them has literal argument names and a
literal list or tuple of values (no `*` unpacking), every argument of the function without a
default (a method's `self` aside) is a parametrized name or one of pytest's own fixtures (none of
which is parametrized), each class around it has no base (or `object`) or is a unittest
`TestCase` (whose methods pytest never parametrizes: one case each, subtests counted apart), no
`usefixtures`, and the module has no `pytestmark`, `pytest_generate_tests` or parametrized fixture
(`params=`). A class with another base may inherit parametrization: its methods stay uncapped. `dynamic_conftest` tells whether a pristine conftest could
add cases to any test (a `pytest_generate_tests`, `params=`, `pytest_plugins`, an autouse
fixture): then nothing is capped. `gyre.evaluators.integrity.tally` makes more reported cases than the
cap tampering. Not caught: cases swapped one for one (the count stays right).
"""

from __future__ import annotations

import ast

BUILTIN_FIXTURES = frozenset({
    "request", "tmp_path", "tmpdir", "tmp_path_factory", "tmpdir_factory", "monkeypatch", "capsys",
    "capsysbinary", "capfd", "capfdbinary", "caplog", "recwarn", "pytestconfig", "record_property",
    "record_testsuite_property", "record_xml_attribute", "cache", "doctest_namespace", "subtests",
})
_DYNAMIC_MARKERS = ("pytest_generate_tests", "params=", "pytestmark", "usefixtures")
_DYNAMIC_CONFTEST = ("pytest_generate_tests", "params=", "pytest_plugins", "autouse")


def dynamic_conftest(source: str) -> bool:
    """Whether a conftest's source may add cases to tests (read as text: conservative)."""
    return any(marker in source for marker in _DYNAMIC_CONFTEST)


def case_counts(source: str) -> dict[tuple[str, ...], int]:
    """(class, ..., function name) -> its certain case count; see the module docstring."""
    if any(marker in source for marker in _DYNAMIC_MARKERS):
        return {}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return {}
    counts: dict[tuple[str, ...], int] = {}
    _collect(tree.body, (), 1, set(), False, counts)
    return counts


def _collect(body: list[ast.stmt], prefix: tuple[str, ...], outer: int, outer_names: set[str], unittest: bool,
             counts: dict[tuple[str, ...], int]) -> None:
    """The certain counts of the tests in `body` (a module's, or a class's inside `prefix` whose own
    `parametrize` marks make `outer` cases over `outer_names`; `unittest`: a `TestCase`'s methods)."""
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            count = _count(node, outer_names, method=bool(prefix))
            if count is not None and not (unittest and count != 1):
                counts[(*prefix, node.name)] = count * outer
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            kind = _base_kind(node.bases)
            marks = _marks(node.decorator_list)
            if kind is None or node.keywords or marks is None or (kind == "unittest" and marks[0] != 1):
                continue  # a base that may parametrize, a metaclass, a decorator of unknown effect
            _collect(node.body, (*prefix, node.name), outer * marks[0], outer_names | marks[1],
                     unittest or kind == "unittest", counts)


def _base_kind(bases: list[ast.expr]) -> str | None:
    """"plain" for no base (or `object`), "unittest" for a unittest `TestCase`, else None."""
    if not bases or all(isinstance(b, ast.Name) and b.id == "object" for b in bases):
        return "plain"
    names = {ast.unparse(b) for b in bases}
    if len(bases) == 1 and names <= {"TestCase", "unittest.TestCase", "IsolatedAsyncioTestCase",
                                     "unittest.IsolatedAsyncioTestCase"}:
        return "unittest"
    return None


def _marks(decorators: list[ast.expr]) -> tuple[int, set[str]] | None:
    """(cases, argument names) the `parametrize` marks among `decorators` make, or None when one of them is not
    a literal mark (an alias of a parametrize mark, a wrapper: of unknown effect)."""
    total, names = 1, set()
    for decorator in decorators:
        call = decorator if isinstance(decorator, ast.Call) else None
        func = call.func if call else decorator
        mark = isinstance(func, ast.Attribute) and (
            isinstance(func.value, ast.Name) and func.value.id == "mark"
            or isinstance(func.value, ast.Attribute) and func.value.attr == "mark")
        if not mark:
            return None  # a decorator of unknown effect (an alias of a parametrize mark, a wrapper)
        if func.attr != "parametrize":
            continue  # `pytest.mark.skip`, `mark.slow(...)`: no cases added
        parsed = _parametrize(call)
        if parsed is None:
            return None
        argnames, num = parsed
        names |= argnames
        total *= max(num, 1)  # an empty list still makes one (skipped) case
    return total, names


def _count(node: ast.FunctionDef | ast.AsyncFunctionDef, outer_names: set[str], method: bool) -> int | None:
    marks = _marks(node.decorator_list)
    if marks is None:
        return None
    total, names = marks[0], marks[1] | outer_names
    args = node.args
    if args.vararg or args.kwarg:
        return None
    positional = [*args.posonlyargs, *args.args][1 if method else 0:]  # a method's `self`
    if method and not [*args.posonlyargs, *args.args]:
        return None  # a method without `self` is not what pytest calls it with
    without_default = positional[:len(positional) - len(args.defaults)] + [
        a for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    if any(a.arg not in names and a.arg not in BUILTIN_FIXTURES for a in without_default):
        return None  # a fixture that may itself be parametrized
    return total


def _parametrize(call: ast.Call | None) -> tuple[set[str], int] | None:
    """(argument names, number of value sets) of a literal `parametrize(...)` call, else None."""
    if call is None:
        return None
    given = dict(zip(("argnames", "argvalues"), call.args))
    given.update({k.arg: k.value for k in call.keywords if k.arg in ("argnames", "argvalues")})
    names, values = given.get("argnames"), given.get("argvalues")
    try:
        literal_names = ast.literal_eval(names) if names is not None else None
    except (ValueError, SyntaxError, TypeError):
        return None
    if isinstance(literal_names, str):
        argnames = {n.strip() for n in literal_names.split(",") if n.strip()}
    elif isinstance(literal_names, (list, tuple)) and all(isinstance(n, str) for n in literal_names):
        argnames = set(literal_names)
    else:
        return None
    if not isinstance(values, (ast.List, ast.Tuple)) or any(isinstance(v, ast.Starred) for v in values.elts):
        return None
    return argnames, len(values.elts)
