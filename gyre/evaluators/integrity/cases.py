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
(`params=`). A class with another base may inherit parametrization: its methods stay uncapped.
`dynamic_conftest` tells whether a pristine conftest could add cases to any test (a
`pytest_generate_tests`, `params=`, `pytest_plugins`, an autouse fixture): then nothing is capped.
`gyre.evaluators.integrity.tally` makes more reported cases than the cap tampering. Not caught: cases
swapped one for one (the count stays right).

`data_driven(source)` names the other side: tests whose `parametrize` values are computed from a name
the module imports (`@parametrize("name", sorted(REGISTRY))` over the project's own registry), whose
number of cases the workspace decides. A literal list or tuple of values has its count whatever its
elements read (freezegun's `(("monotonic_ns", HAS_MONOTONIC_NS, ...), ...)`), and the standard library's
data is no workspace's: neither is data-driven. A workspace that fails real cases can pad such a registry up
to the task's count; NL2RepoBench's scoring (`formats/nl2repo.py`) charges a run that reports more cases
than the task counts one case per failure, as far as such cases reach (`padded_cases`); more passed
cases than the count plus `case_slack` is tampering.
"""

from __future__ import annotations

import ast
import math
import sys

from gyre.evaluators import pyparse

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
        tree = pyparse.parse(source)
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


def data_driven(source: str) -> set[tuple[str, ...]]:
    """(class, ..., function name) of each test with a `parametrize` mark whose number of values depends on a
    name the module imports, or binds at its top level from one (never a builtin, the standard library's, or a
    literal list's fixed length): its cases are the workspace's data."""
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    imported = {(a.asname or a.name).split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for a in node.names if a.name.split(".")[0] not in sys.stdlib_module_names}
    imported |= {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                 and (node.level or (node.module or "").split(".")[0] not in sys.stdlib_module_names)
                 for a in node.names}
    for node in tree.body:  # a module-level name computed from an imported one (`OPS = sorted(REGISTRY)`) too
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None and _sized_by(node.value, imported):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            imported |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    found: set[tuple[str, ...]] = set()

    def visit(body: list[ast.stmt], prefix: tuple[str, ...], outer: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, (*prefix, node.name), outer or _reads(node.decorator_list, imported))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if outer or _reads(node.decorator_list, imported):
                    found.add((*prefix, node.name))

    visit(tree.body, (), False)
    return found


def _reads(decorators: list[ast.expr], imported: set[str]) -> bool:
    """Whether a `parametrize` call among `decorators` computes its values from an imported name."""
    for decorator in decorators:
        if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Attribute)
                and decorator.func.attr == "parametrize"):
            continue
        given = dict(zip(("argnames", "argvalues"), decorator.args))
        given.update({k.arg: k.value for k in decorator.keywords if k.arg == "argvalues"})
        values = given.get("argvalues")
        if values is not None and _sized_by(values, imported):
            return True
    return False


def _sized_by(values: ast.expr, imported: set[str]) -> bool:
    """Whether how many items `values` has depends on an imported name: it reads one and is no literal list,
    tuple or set of a fixed length (a `*` inside one unpacks what it reads)."""
    if isinstance(values, (ast.List, ast.Tuple, ast.Set)):
        return any(isinstance(v, ast.Starred) and _sized_by(v.value, imported) for v in values.elts)
    if isinstance(values, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):  # its loops and filters
        return any(_sized_by(g.iter, imported) or any(_reads_name(c, imported) for c in g.ifs)
                   for g in values.generators)
    return _reads_name(values, imported)


def _reads_name(node: ast.expr, imported: set[str]) -> bool:
    return any(isinstance(n, ast.Name) and n.id in imported for n in ast.walk(node))


def skip_marked(source: str) -> set[tuple[str, ...]]:
    """(class, ..., function name) of each test a pristine `skip`, `skipif` or `xfail` mark may apply to: on the
    function, a class around it or the module's `pytestmark`, or on one of its cases (`pytest.param(...,
    marks=pytest.mark.xfail)`, bleach's). Such a case skipped or xfailed is the test's own expectation, not a
    failure a workspace could hide behind padded cases."""
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    module = any(isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in node.targets)
                 and _skipping(node.value) for node in tree.body)
    found: set[tuple[str, ...]] = set()

    def visit(body: list[ast.stmt], prefix: tuple[str, ...], outer: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                visit(node.body, (*prefix, node.name), outer or any(_skipping(d) for d in node.decorator_list))
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if outer or any(_skipping(d) for d in node.decorator_list):
                    found.add((*prefix, node.name))

    visit(tree.body, (), module)
    return found


def _skipping(node: ast.expr) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in ("skip", "skipif", "xfail") for n in ast.walk(node))


def padded_cases(reported: int, passed: int, count: int, data_driven: int, excused: int = 0) -> int:
    """Passed cases not counted when a run reports more cases than the task counts and tests parametrized over
    the project's own data made them: a workspace that fails real cases could pad its registry up to the count
    in their place (red-team 6), so each failed case costs one passed case, as far as the excess and those tests'
    cases reach. `excused`: cases skipped or xfailed under a pristine mark (`skip_marked`), no failure. 0 when the
    run reported no more than the count (upstream's min(passed / count, 1) as it is)."""
    return max(0, min(reported - passed - excused, reported - count, data_driven))


CASE_SLACK_SHARE, CASE_SLACK_MIN = 0.10, 3
"""Passed cases beyond the task's count that are still honest: a task's `test_case_count` was taken on one version of
the project, and real releases pass a few more of the same hidden files' cases (10 of the 33 fidelity projects, by up
to 8 %: plac 27 of 25, python-pathspec 119 of 112, humanize 631 of 607; docs/results/nl2repo-fidelity-docker.json).
More than that is a workspace that made cases (issue 47: a registry padded to 40 cases where the task counts 6).
Chosen after seeing those 33 projects: in-sample."""


def case_slack(count: int) -> int:
    """How many more passed cases than the task's `test_case_count` are still honest (`CASE_SLACK_SHARE`)."""
    return max(CASE_SLACK_MIN, math.ceil(CASE_SLACK_SHARE * count))
