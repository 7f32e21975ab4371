"""Which results count: the pristine tests' own ids, each from the run where it is itself.

Agent code runs inside the test process, so it can add test functions to a hidden module at import
time, or report tests that never ran. Only ids the pristine files define count: `defined_tests` reads
a pristine file's syntax tree (never imports it) and lists what pytest would collect by default:
module functions `test*`, methods `test*` of classes `Test*` (nested too) and of `unittest.TestCase`
subclasses, with methods inherited from classes of the same file; a `test*` name bound otherwise (an assignment,
an import) is pytest's test when its value is a function, so it counts when reported. A parametrized id `test_x[1-2]`
counts as `test_x`'s. A docstring example (`>>>`) of the file's module, functions and classes is pytest's doctest item
when the command asks for `--doctest-modules` (`doctest_holders`): it counts when reported, as pytest's "N passed"
counts it, never required. Anything else reported (a function injected at run time, a test the agent wrote)
is ignored and recorded.

Each evaluation runs twice, each run on its own variant of the pristine files (`PristineFile.variant`):
some real tests carry one changed assertion (`mutants`, the canaries). A test's result counts from the
run where it is not mutated (`PristineFile.scoring_run`); its mutant's result is evidence
(`gyre.evaluators.integrity.tally`).
"""

from __future__ import annotations

import ast
import fnmatch
import hashlib
import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from gyre.evaluators import pyparse
from gyre.evaluators.integrity.mutants import Mutation, apply

TestId = tuple[str, ...]
"""(class, nested class, ..., function) of a test inside its file."""
_PARAMS = re.compile(r"\[.*\]$", re.S)


def defined_tests(source: str, elsewhere: dict[str, ast.ClassDef] | None = None) -> set[TestId]:
    """Test ids pytest would collect from `source` by default (see the module docstring); empty if unparsable.
    `elsewhere`: classes the other pristine files define (`pristine_classes`): a base imported from one of them
    brings its tests, as pytest collects them (a test class inheriting the checks of a base in `tests/base.py`)."""
    return _tests(source, elsewhere or {})[0]


def maybe_tests(source: str, elsewhere: dict[str, ast.ClassDef] | None = None) -> set[TestId]:
    """The `test*` methods of classes pytest may collect or not, by what their base turns out to be at run time:
    a class not named `Test*` whose base is imported from outside the pristine files (`class Checks(MyTestCase)`,
    `MyTestCase` the project's). Counted when reported, never required."""
    return _tests(source, elsewhere or {})[1]


def pristine_classes(sources: list[str]) -> dict[str, ast.ClassDef]:
    """Every class the pristine files define at their top level, by name (the last one of a name wins)."""
    found = {}
    for source in sources:
        try:
            tree = pyparse.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        found.update((node.name, node) for node in _statements(tree.body) if isinstance(node, ast.ClassDef))
    return found


def _tests(source: str, elsewhere: dict[str, ast.ClassDef]) -> tuple[set[TestId], set[TestId]]:
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(), set()
    classes = {**elsewhere, **{node.name: node for node in _statements(tree.body) if isinstance(node, ast.ClassDef)}}
    found: set[TestId] = set()
    maybe: set[TestId] = {(name,) for name in _bound_tests(tree.body)}
    for node in _statements(tree.body):
        if isinstance(node, ast.ImportFrom):  # a test class imported from another hidden file is collected here too
            for alias in node.names:
                cls, bound = elsewhere.get(alias.name), alias.asname or alias.name
                if cls is not None and (bound.startswith("Test") or _is_testcase(cls, classes)):
                    also: set[TestId] = set()
                    methods = _class_tests(cls, classes, (), force=True, bound=also)
                    maybe |= {(bound, *tid[1:]) for tid in methods | also}
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test") \
                and not _is_fixture(node):
            found.add((node.name,))
        elif isinstance(node, ast.ClassDef):
            found |= _class_tests(node, classes, (), bound=maybe)
            if not node.name.startswith("Test") and not _is_testcase(node, classes) and _unknown_base(node, classes):
                maybe |= _class_tests(node, classes, (), force=True, bound=maybe)
    return found, maybe - found


def _bound_tests(body: list[ast.stmt]) -> set[str]:
    """Names `test*` a module or class body binds without a `def`: `test_x = make_check(3)`, `test_y = other_test`,
    `from .shared import test_roundtrip`. pytest collects such a name when its value turns out to be a function (a
    list named `test_data` it leaves alone), so they are counted when reported, never required."""
    names: set[str] = set()
    for node in _statements(body):
        if isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
            names.add(node.target.id)
        elif isinstance(node, ast.ImportFrom):
            names |= {alias.asname or alias.name for alias in node.names}
    return {name for name in names if name.startswith("test")}


def _unknown_base(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    """Whether a base of `node`'s lineage is neither a pristine class nor `object`: it may be a TestCase."""
    return any(_base_name(b) not in classes and _base_name(b) != "object"
               for cls in _lineage(node, classes) for b in cls.bases)


def _base_name(base: ast.expr) -> str:
    return base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")


def _is_fixture(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated `@pytest.fixture` / `@fixture(...)` (pytest_asyncio's too): a fixture named `test_*` is never
    collected as a test (Terminal-Bench's chem-property-targeting has `def test_data` as a fixture; counting it
    made the task's own solution a 0)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name == "fixture":
            return True
    return False


def _statements(body: list[ast.stmt]) -> list[ast.stmt]:
    """`body`'s statements, with those of its `if`/`else`, `try`/`except`/`else`/`finally` and `with`
    blocks in place of the block: a test defined under `if sys.version_info...:` (both branches, the
    same name) is still the module's (or class's) test; function bodies are not entered."""
    out: list[ast.stmt] = []
    stack = list(reversed(body))
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If):
            nested = [*node.body, *node.orelse]
        elif isinstance(node, (ast.Try, getattr(ast, "TryStar", ast.Try))):
            nested = [*node.body, *(s for h in node.handlers for s in h.body), *node.orelse, *node.finalbody]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            nested = list(node.body)
        else:
            out.append(node)
            continue
        stack += reversed(nested)
    return out


def _class_tests(node: ast.ClassDef, classes: dict[str, ast.ClassDef], outer: TestId,
                 force: bool = False, bound: set[TestId] | None = None) -> set[TestId]:
    """The `test*` methods pytest collects from class `node`; the names its lineage binds otherwise
    (`_bound_tests`) go into `bound`."""
    if not (force or node.name.startswith("Test") or _is_testcase(node, classes)):
        return set()
    prefix = (*outer, node.name)
    found: set[TestId] = set()
    for cls in _lineage(node, classes):
        if bound is not None:
            bound |= {(*prefix, name) for name in _bound_tests(cls.body)}
        for item in _statements(cls.body):
            if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name.startswith("test") \
                    and not _is_fixture(item):
                found.add((*prefix, item.name))
            elif isinstance(item, ast.ClassDef) and cls is node:
                found |= _class_tests(item, classes, prefix, bound=bound)
    return found


def _lineage(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> list[ast.ClassDef]:
    """The class and its bases defined in the pristine files (by simple name: `Base`, `base.Base`), nearest first,
    no repeats."""
    seen, order, stack = set(), [], [node]
    while stack:
        cls = stack.pop(0)
        if cls.name in seen:
            continue
        seen.add(cls.name)
        order.append(cls)
        stack += [classes[name] for b in cls.bases if (name := _base_name(b)) in classes]
    return order


def _is_testcase(node: ast.ClassDef, classes: dict[str, ast.ClassDef]) -> bool:
    for cls in _lineage(node, classes):
        for base in cls.bases:
            name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if name in ("TestCase", "IsolatedAsyncioTestCase"):
                return True
    return False


_EXAMPLE = re.compile(r"^\s*>>>", re.M)
DOCTEST_MAKER = ("_pytest", "doctest.py")
"""Where pytest's own doctest item class lives: a doctest id counts only from an item of that class."""


def doctest_holders(source: str) -> set[str]:
    """What `doctest.DocTestFinder` finds examples in, as it names them after the module's name: "" for the module's
    own docstring, `f`, `Cls`, `Cls.method`, `Cls.Inner` for the functions and classes the file defines (nested
    functions are not searched, as the finder does not search them); only those whose docstring holds a `>>>`
    example, as pytest makes items only for those. Empty if unparsable."""
    try:
        tree = pyparse.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set()
    found = {""} if _EXAMPLE.search(ast.get_docstring(tree, clean=False) or "") else set()
    stack: list[tuple[str, ast.stmt]] = [("", node) for node in _statements(tree.body)]
    while stack:
        outer, node = stack.pop()
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        name = f"{outer}.{node.name}" if outer else node.name
        if _EXAMPLE.search(ast.get_docstring(node, clean=False) or ""):
            found.add(name)
        if isinstance(node, ast.ClassDef):
            stack += [(name, item) for item in _statements(node.body)]
    return found


DEFAULT_PYTHON_FILES = ("test_*.py", "*_test.py")
"""pytest's default `python_files`."""


def is_test_module(rel: str, python_files: tuple[str, ...] = DEFAULT_PYTHON_FILES) -> bool:
    """Whether pytest collects `rel` under `python_files` (its glob patterns, matched against the file's name,
    or against its path when a pattern holds a '/', as pytest matches them)."""
    path = PurePosixPath(rel)
    return path.suffix == ".py" and any(
        fnmatch.fnmatch(rel if "/" in pattern else path.name, pattern) for pattern in python_files)


def test_id(nodeid: str) -> TestId:
    """The id inside its file of a pytest node id (`f.py::A::test_x[1]` -> ("A", "test_x")); a parameter id
    may itself hold `::` (`test_x[a::b]`), so the names end at the first `[` after the file."""
    parts = full_id(nodeid)
    return (*parts[:-1], _PARAMS.sub("", parts[-1])) if parts else ()


def full_id(nodeid: str) -> TestId:
    """A node id's parts after its file, parameters kept whole (`f.py::A::test_x[a::b]` -> ("A", "test_x[a::b]"))."""
    _, sep, rest = nodeid.partition("::")
    if not sep:
        return ()
    names, bracket, params = rest.partition("[")
    parts = names.split("::")
    parts[-1] += bracket + params
    return tuple(parts)


@dataclass
class PristineFile:
    """A pristine test file as the evaluation placed it: its path inside the sandbox, its ids, its mutations."""

    inside: str
    tests: set[TestId]
    data: bytes = b""
    """Its pristine bytes."""
    mutations: tuple[Mutation, ...] = ()
    """One per qualifying test, each run by one run only (`mutants`); the file each run sees is `variant(run)`."""
    collected_by: frozenset[str] = frozenset()
    """Not a Python test module but a file a pristine conftest's collector turns into tests (docopt-ng's
    `tests/testcases.docopt`): those conftests (paths as placed). Every case such an item reports counts, as
    pytest counts it, when its class comes from one of them."""
    cases: dict[TestId, int] = field(default_factory=dict)
    """Tests whose number of cases the source fixes (`gyre.evaluators.integrity.cases`): more reported is tampering."""
    optional: set[TestId] = field(default_factory=set)
    """Tests pytest may or may not collect (`maybe_tests`): counted when reported, never required."""
    data_driven: set[TestId] = field(default_factory=set)
    """Tests parametrized over what the module imports (`cases.data_driven`): how many cases they have is the
    workspace's doing."""
    skip_marked: set[TestId] = field(default_factory=set)
    """Tests a pristine skip or xfail mark may apply to (`cases.skip_marked`): their skipped cases are expected."""
    rel: str = ""
    """Its path relative to the directory the pristine files are written under."""
    doctests: set[str] = field(default_factory=set)
    """Where its docstring examples are (`doctest_holders`): pytest's doctest items of them count when reported."""

    def is_doctest(self, tid: TestId, maker: str | None) -> bool:
        """Whether `tid` is pytest's doctest item (made by `DOCTEST_MAKER`) of one of this file's docstring examples:
        named `<module>.<holder>` (or `<module>` for the module's own), the module's last name being the file's."""
        made_by = PurePosixPath((maker or "").replace("\\", "/")).parts[-2:]
        if len(tid) != 1 or not self.doctests or made_by != DOCTEST_MAKER:
            return False
        stem, name = PurePosixPath(self.inside).stem, tid[0]
        for holder in self.doctests:
            module = name if not holder else name[:-len(holder) - 1] if name.endswith("." + holder) else ""
            if module.rpartition(".")[2] == stem:
                return True
        return False

    def variant(self, run: int) -> bytes:
        """The file as run `run` sees it: the pristine bytes with that run's mutations."""
        mine = [m for m in self.mutations if m.run == run]
        return apply(self.data, mine) if mine else self.data

    def sha256(self, run: int) -> str:
        """Of `variant(run)`: gyre's plugin finds the module (or a copy of it) by it."""
        return hashlib.sha256(self.variant(run)).hexdigest()

    def mutated(self, tid: TestId, run: int) -> Mutation | None:
        """The mutation test `tid` (parameters dropped) carries in run `run`, if any."""
        return next((m for m in self.mutations if m.test == tid and m.run == run), None)

    def scoring_run(self, tid: TestId, unmutated: int = 0) -> int:
        """The run (of two) whose report of `tid` counts: the one where it is not mutated; `unmutated` for a test
        mutated in neither."""
        m = next((m for m in self.mutations if m.test == tid), None)
        return unmutated if m is None else 1 - m.run
