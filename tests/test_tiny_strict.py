"""The tiny benchmark's hidden tests check type and value, so an always-equal object earns nothing.

An agent trained by RL finds the cheapest module that passes `assert f(x) == y`: an object
whose `__eq__` is always True. Here every query of a 64-query set is run twice over, on
real files with real pytest: its reference solution must pass every hidden test, and
"always-equal" modules (a plain object, and subclasses of int, str and float that override
the comparison and arithmetic operators) exposing every name the tests ask for must pass
none. All queries share one pytest subprocess (`_run_hidden_tests`); three go end to end
through `gyre.evaluators.evaluate_query` as well.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.benchmarks.tiny import tiny_reference
from gyre.evaluators import evaluate_query
from gyre.records import EvalStatus, Query

NUM_QUERIES = 64

# Everything an always-equal cheat overrides; `{base}` is object, int, str or float.
ALWAYS_EQUAL = '''\
class _AlwaysEqual({base}):
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    def __hash__(self): return 0
    def __bool__(self): return True
    def __abs__(self): return 0
    def __neg__(self): return self
    def __pos__(self): return self
    def __sub__(self, other): return self
    def __rsub__(self, other): return self
    def __add__(self, other): return self
    def __radd__(self, other): return self
    def __mul__(self, other): return self
    def __rmul__(self, other): return self
    def __call__(self, *args, **kwargs): return self
    def __repr__(self): return "AlwaysEqual()"


_cheat = _AlwaysEqual()
'''
BASES = ("object", "int", "str", "float")

# Shared by every query of one pytest run: before a test module is imported, drop the previous
# query's module (same names recur across queries) and put this query's repository first.
CONFTEST = '''\
import sys

import pytest

_MODULES = {modules!r}
_ROOTS = set()


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):
        root = str(collector.path.parent.parent)  # <query>/tests/test_<module>.py
        for name in _MODULES:
            sys.modules.pop(name, None)
        sys.path[:] = [root] + [p for p in sys.path if p not in _ROOTS]
        _ROOTS.add(root)
'''


def always_equal_module(test_source: str, module: str, base: str = "object") -> str:
    """A module binding every name the hidden tests take from `module` to an always-equal object."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(test_source)):
        if isinstance(node, ast.ImportFrom) and node.module == module:
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == module:
            names.add(node.attr)
    assert names, f"the tests import nothing from {module}"
    return ALWAYS_EQUAL.format(base=base) + "".join(f"{name} = _cheat\n" for name in sorted(names))


def _module_of(query: Query) -> str:
    (test_file,) = query.test_files
    return test_file.removeprefix("tests/test_").removesuffix(".py")


def _test_source(query: Query) -> str:
    return (query.hidden_tests_dir / query.test_files[0]).read_text(encoding="utf-8")


def solutions(queries: list[Query]) -> dict[str, dict[str, str]]:
    """Per variant ("reference", "always_equal_<base>"), per query id: the module's source."""
    out: dict[str, dict[str, str]] = {"reference": {q.query_id: tiny_reference(q)[1] for q in queries}}
    for base in BASES:
        out[f"always_equal_{base}"] = {
            q.query_id: always_equal_module(_test_source(q), _module_of(q), base) for q in queries
        }
    return out


def _run_hidden_tests(run_dir: Path, queries: list[Query], variants: dict[str, dict[str, str]]):
    """Run every query's hidden tests against every variant's module in one pytest subprocess.

    Returns {variant: {query_id: (passed, collected)}}, read from a JUnit XML report.
    """
    modules = sorted({_module_of(q) for q in queries})
    (run_dir / "pytest.ini").write_text("[pytest]\n")
    (run_dir / "conftest.py").write_text(CONFTEST.format(modules=modules))
    for variant, sources in variants.items():
        for q in queries:
            project = run_dir / variant / q.query_id
            (project / "tests").mkdir(parents=True)
            (project / f"{_module_of(q)}.py").write_text(sources[q.query_id])
            (project / q.test_files[0]).write_text(_test_source(q))
    report = run_dir / "junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--import-mode=importlib",
         "--rootdir", str(run_dir), "-c", str(run_dir / "pytest.ini"), f"--junitxml={report}", *variants],
        cwd=run_dir, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode in (0, 1), proc.stdout[-3000:] + proc.stderr[-3000:]  # 1: some tests failed
    results = {v: {q.query_id: [0, 0] for q in queries} for v in variants}
    for case in ET.parse(report).iter("testcase"):
        # classname: "<variant>.<query id>.tests.test_<module>"; a collection error has none.
        variant, query_id, *_ = case.get("classname", "").split(".") + ["", ""]
        assert variant in results and query_id in results[variant], ET.tostring(case, encoding="unicode")[:2000]
        counts = results[variant][query_id]
        counts[1] += 1
        if not any(child.tag in ("failure", "error", "skipped") for child in case):
            counts[0] += 1
    return {v: {qid: tuple(c) for qid, c in per.items()} for v, per in results.items()}


def mean_score(queries: list[Query], per_query: dict[str, tuple[int, int]]) -> float:
    return sum(min(1.0, per_query[q.query_id][0] / q.test_case_count) for q in queries) / len(queries)


@pytest.fixture(scope="module")
def queries(tmp_path_factory) -> list[Query]:
    root = generate_tiny(tmp_path_factory.mktemp("bench") / "tiny", NUM_QUERIES, seed=0)
    return load_benchmark("nl2repo", root, "tiny")


@pytest.fixture(scope="module")
def results(tmp_path_factory, queries):
    return _run_hidden_tests(tmp_path_factory.mktemp("run"), queries, solutions(queries))


def test_every_template_is_covered(queries):
    assert len(queries) == NUM_QUERIES
    kinds = {q.query_id.split("-", 1)[1] for q in queries}
    assert kinds == {"add", "greet", "constant", "reverse_words", "divisible", "clamp", "scale"}


def test_references_pass_every_hidden_test(queries, results):
    per_query = results["reference"]
    failing = {q.query_id: per_query[q.query_id] for q in queries
               if per_query[q.query_id] != (q.test_case_count, q.test_case_count)}
    assert not failing, f"(passed, collected) per failing query: {failing}"
    assert mean_score(queries, results["reference"]) == 1.0


@pytest.mark.parametrize("base", BASES)
def test_always_equal_objects_pass_no_hidden_test(queries, results, base):
    per_query = results[f"always_equal_{base}"]
    # Every test was collected and ran (an import error would also score zero, for the wrong reason).
    assert {qid: collected for qid, (_, collected) in per_query.items()} == {
        q.query_id: q.test_case_count for q in queries}
    passing = {qid: passed for qid, (passed, _) in per_query.items() if passed}
    assert not passing, f"always-equal ({base}) passes tests of {passing}"
    assert mean_score(queries, per_query) == 0.0


def test_hidden_tests_check_the_type_first(queries):
    """`type(x) is T` cannot be overridden, and `and` short-circuits before any comparison."""
    for q in queries:
        for line in _test_source(q).splitlines():
            if line.strip().startswith("assert "):
                assertion = line.strip().removeprefix("assert ")
                assert assertion.startswith("type(") or assertion.endswith((" is True", " is False")), line


@pytest.mark.parametrize("index", [0, 1, 2])
def test_evaluate_query_end_to_end(tmp_path, queries, index):
    """Through the real evaluator (sandbox, pristine tests, JUnit): cheat 0.0, reference 1.0."""
    query = queries[index]
    module = _module_of(query)
    for label, source, expected in (
        ("cheat", always_equal_module(_test_source(query), module), 0.0),
        ("reference", tiny_reference(query)[1], 1.0),
    ):
        workspace = tmp_path / f"ws-{label}"
        workspace.mkdir()
        (workspace / f"{module}.py").write_text(source)
        score = evaluate_query(query, workspace, tmp_path / f"eval-{label}", f"exec-{label}")
        assert score.status is EvalStatus.ok, score.detail
        assert score.score == expected, (label, score.detail)
        assert score.tests_total == query.test_case_count
        assert json.loads((tmp_path / f"eval-{label}" / "score.json").read_text())["score"] == expected


def _as_format_1(out: Path) -> dict[str, bytes]:
    """Turn a freshly generated set into what format 1 left on disk (its manifest, an old test)."""
    manifest = json.loads((out / "tiny.json").read_text())
    fresh = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    (out / "tiny.json").write_text(json.dumps({**manifest, "format_version": 1}, indent=2, sort_keys=True) + "\n")
    for test_file in out.glob("*/hidden_tests/tests/test_*.py"):
        test_file.write_text("def test_old():\n    assert 1 == 1\n")
    return fresh


def test_an_outdated_cached_set_is_regenerated(tmp_path):
    from gyre.config.run import RunConfig
    from gyre.runtime.resolve import resolve_queries

    config = RunConfig.model_validate({
        "cache_dir": str(tmp_path / "cache"), "benchmark": {"num_queries": 6, "seed": 0},
        "rollout": {"queries_per_step": 1},
    })
    first = resolve_queries(config)
    (cached,) = (tmp_path / "cache" / "benchmarks").iterdir()
    fresh = _as_format_1(cached)
    again = resolve_queries(config)  # the cache path resolve.py uses: regenerated, not refused
    assert [q.query_id for q in again.train + again.eval] == [q.query_id for q in first.train + first.eval]
    assert {p.relative_to(cached).as_posix(): p.read_bytes() for p in sorted(cached.rglob("*")) if p.is_file()} == fresh
    assert sorted(p.name for p in cached.parent.iterdir()) == [cached.name]  # nothing left aside


def test_an_outdated_set_with_foreign_files_or_a_newer_set_is_refused(tmp_path):
    out = generate_tiny(tmp_path / "tiny", 3, seed=1)
    _as_format_1(out)
    notes = min(p for p in out.iterdir() if p.is_dir()) / "notes.txt"
    notes.write_text("mine\n")
    with pytest.raises(FileExistsError, match=rf"outdated format_version 1 \(now \d+\).*{notes.parent.name}/notes.txt"):
        generate_tiny(out, 3, seed=1)
    assert notes.read_text() == "mine\n"  # untouched
    notes.unlink()
    assert generate_tiny(out, 3, seed=1) == out
    assert json.loads((out / "tiny.json").read_text())["format_version"] > 1
    manifest = json.loads((out / "tiny.json").read_text())
    (out / "tiny.json").write_text(json.dumps({**manifest, "format_version": 999}))
    with pytest.raises(FileExistsError, match="newer gyre"):
        generate_tiny(out, 3, seed=1)
    with pytest.raises(FileExistsError, match="seed=2"):  # another set altogether: refused as before
        generate_tiny(out, 3, seed=2)
