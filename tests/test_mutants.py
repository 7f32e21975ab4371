"""Mutation canaries: must-fail copies of real tests (`integrity/mutants.py`), planned and run for real."""

from __future__ import annotations

import ast
import random

import pytest

from gyre.evaluators.formats.nl2repo import evaluate
from gyre.evaluators.integrity.canaries import plan_canaries
from gyre.evaluators.integrity.mutants import INT_SHIFT, plan_mutants
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_evaluator_nl2repo import CALC_TESTS, _calc_query, _workspace

MIXED = '''import os
import pytest
from calc import add


def helper():
    return 1


def test_uses_a_fixture(tmp_path):
    assert add(1, 1) == 2


@pytest.mark.parametrize("x", [1])
def test_parametrized(x):
    assert add(x, 0) == 1


def test_side_effect():
    os.makedirs("out")
    assert add(2, 2) == 4


def test_plain():
    total = add(3, 4)
    assert total == 7, "sums"


def test_string():
    assert add("a", "b") == "ab"


def test_no_literal():
    assert add(1, 2) == add(2, 1)


def test_flag():
    result = add(1, 1) > 1
    assert result is True


def test_none():
    assert add(None, None) is None
'''


def test_only_plain_argumentless_tests_with_a_literal_are_copied():
    mutants = {m.function: m for m in plan_mutants(MIXED, random.Random(0), limit=10)}
    assert set(mutants) == {"test_plain", "test_string", "test_flag"}  # `is None` has no opposite to write
    assert "assert result is ...\n" in mutants["test_flag"].source  # not `is False`: a failing original stays failing
    plain = mutants["test_plain"].source
    assert f"total == {7 + INT_SHIFT}" in plain and '"sums"' in plain
    tree = ast.parse(plain)
    (function,) = tree.body
    assert function.lineno == MIXED.splitlines().index("def test_plain():") + 1  # the original's lines
    assert "\\u2063gyre-mutant" in ascii(mutants["test_string"].source)


def test_mutants_are_must_fail_canaries_under_canary_names():
    canaries = plan_canaries(CALC_TESTS, random.Random(4))
    assert len(canaries.mutants) == 2 and len(canaries.sources) == 4
    for name, function, source, text in canaries.mutants:
        assert name in canaries.must_fail and name not in {m[1] for m in canaries.mutants}
        assert function in {"test_zero", "test_opposites", "test_small", "test_larger"}
        module = text.splitlines()[:CALC_TESTS.count("\n")]  # the module at its own lines, one value changed
        changed = [row for row, line in enumerate(CALC_TESTS.splitlines()) if line != module[row]]
        assert len(changed) == 1 and str(INT_SHIFT)[:4] in module[changed[0]]
        assert source.strip() in text
        # and the copy again under its canary name at the end: the file its node id names defines it
        defined = {node.name: node for node in ast.parse(text).body if isinstance(node, ast.FunctionDef)}
        assert ast.unparse(defined[name].body) == ast.unparse(defined[function].body)


def test_canary_names_are_found_for_a_file_that_takes_every_short_one():
    """A file defining test_0 .. test_2999 left no free `test_<0-99>` name: planning never ended (the evaluator
    hung on a pristine file)."""
    source = "\n".join(f"def test_{i}():\n    assert {i} + 1 == {i + 1}\n" for i in range(3000))
    canaries = plan_canaries(source, random.Random(1))
    assert len(canaries.names) == 6 and not canaries.names & {f"test_{i}" for i in range(3000)}


requires_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")

FLIP_WHAT_CALLED_ME = '''import gc, os

CALLED = set()


def add(a, b):
    CALLED.add(os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0])
    return 7


def _flip_reports():
    """A report hook registered through gc that flips only tests that called add: the literal canaries never
    do, and nothing reads them."""
    import pytest
    manager = next(o for o in gc.get_objects() if type(o).__name__ == "PytestPluginManager")

    class Flipper:
        @pytest.hookimpl(hookwrapper=True, tryfirst=True)  # outermost: after xfail's own handling
        def pytest_runtest_makereport(self, item, call):
            outcome = yield
            report = outcome.get_result()
            if item.nodeid in CALLED and report.when == "call":
                report.outcome = "passed"
                if hasattr(report, "wasxfail"):
                    del report.wasxfail

    manager.register(Flipper(), "flipper")


_flip_reports()
'''


@requires_bwrap
def test_flipping_what_called_the_workspace_is_caught_by_the_mutants(tmp_path):
    query = _calc_query(tmp_path)
    workspace = _workspace(tmp_path, query, {"calc.py": FLIP_WHAT_CALLED_ME})
    score = evaluate(query, workspace, tmp_path / "eval", "flipper", timeout_s=60)
    assert score.status is EvalStatus.tampering and score.score == 0.0, score
    assert any("must xfail and was reported passed" in e for e in score.evidence), score.evidence


@requires_bwrap
def test_a_correct_solution_xfails_its_mutants_and_scores_full_marks(tmp_path):
    query = _calc_query(tmp_path)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    score = evaluate(query, workspace, tmp_path / "eval", "honest", timeout_s=60)
    assert score.status is EvalStatus.ok and score.score == 1.0, score
