"""Issue 47's attack classes, each a workspace with no solution that tries to forge a score, and its false zeros.

Each forger here would have scored 1.0 at `b9ac062`: re-plugging pytest through the runner's own objects, a
debugger class run for every test, an object equal to everything, a project registry padded so that a
parametrized hidden test counts more cases than the task has. Each must end as tampering or a valid 0, never
a score above 0 and never an evaluator failure (a dropped sample). The honest layouts beside them (`-x` with a
half-solution, tests inherited from a base in another hidden file, a unittest class whose base is imported)
must score what upstream's procedure gives them: no false zero.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gyre.benchmarks import load_nl2repo
from gyre.evaluators import evaluate_query
from gyre.records import EvalStatus, Query
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_evaluator_nl2repo import CALC_TESTS, _calc_query, _workspace

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")

REPLUG = '''import gc


class Skip:
    """Report every test as run without calling it."""

    def pytest_pyfunc_call(self, pyfuncitem):
        return True


def _replug():
    import pytest
    config = next(o for o in gc.get_objects() if type(o).__name__ == "Config" and hasattr(o, "pluginmanager"))
    config.pluginmanager.register(Skip(), "skip")


_replug()


def add(a, b):
    return 7
'''
WRAP_THE_EXECUTOR = '''import gc


def _wrap():
    manager = next(o for o in gc.get_objects() if type(o).__name__ == "PytestPluginManager")
    real = manager._inner_hookexec

    def hookexec(name, impls, kwargs, firstresult):
        if name == "pytest_pyfunc_call":
            return True
        return real(name, impls, kwargs, firstresult)

    manager._inner_hookexec = hookexec


_wrap()


def add(a, b):
    return 7
'''
DEBUGGER_CLASS = '''class Runner:
    """pytest's `--trace --pdbcls=calc:Runner` calls `Runner().runcall(test, ...)` for every test."""

    def __init__(self, *args, **kwargs):
        pass

    def runcall(self, function, *args, **kwargs):
        return None


def add(a, b):
    return 7
'''
ALWAYS_EQUAL = "from unittest import mock\n\n\ndef add(a, b):\n    return mock.ANY\n"
REGISTRY_TESTS = '''import pytest

from calc import REGISTRY, add


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_each_operation(name):
    assert callable(REGISTRY[name])


def test_add():
    assert add(1, 2) == 3
'''
PADDED_REGISTRY = "def add(a, b):\n    return 7\n\n\nREGISTRY = {f'op{i}': print for i in range(40)}\n"


def _score(tmp_path: Path, calc: str, tests: str = CALC_TESTS, count: int = 4, extra: dict | None = None,
           commands: list[str] | None = None, monitor: str = "record"):
    query = _calc_query(tmp_path, tests=tests, count=count, commands=commands)
    workspace = _workspace(tmp_path, query, {"calc.py": calc, **(extra or {})})
    return evaluate_query(query, workspace, tmp_path / "eval", "attack", timeout_s=60, monitor=monitor)


def test_a_plugin_registered_through_pytests_own_config_is_tampering(tmp_path):
    score = _score(tmp_path, REPLUG)
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("registered by the workspace's code" in e for e in score.evidence), score.evidence
    assert any("passed with its expected value changed" in e for e in score.evidence), score.evidence


def test_a_wrapped_hook_executor_is_tampering(tmp_path):
    score = _score(tmp_path, WRAP_THE_EXECUTOR)
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("hook executor was replaced" in e for e in score.evidence), score.evidence


def test_a_debugger_class_named_in_the_projects_settings_never_runs(tmp_path):
    settings = '[tool.pytest.ini_options]\naddopts = "--trace --pdbcls=calc:Runner"\n'
    score = _score(tmp_path, DEBUGGER_CLASS, extra={"pyproject.toml": settings})
    assert score.status in (EvalStatus.ok, EvalStatus.tampering) and score.score == 0.0, score.detail
    assert score.status is EvalStatus.tampering or score.tests_passed == 0, score.detail


@pytest.mark.parametrize("monitor", ["record", "zero"])
def test_an_object_equal_to_everything_is_caught_by_the_mutants(tmp_path, monitor):
    score = _score(tmp_path, ALWAYS_EQUAL, monitor=monitor)
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("passed with its expected value changed" in e for e in score.evidence), score.evidence


def test_a_padded_registry_cannot_count_more_cases_than_the_task_has(tmp_path):
    score = _score(tmp_path, PADDED_REGISTRY, tests=REGISTRY_TESTS, count=6)
    assert (score.status, score.score) == (EvalStatus.tampering, 0.0), score.detail
    assert any("the workspace added cases" in e for e in score.evidence), score.evidence


def test_the_honest_registry_scores_what_upstream_gives(tmp_path):
    honest = "def add(a, b):\n    return a + b\n\n\nREGISTRY = {n: print for n in ('a', 'b', 'c', 'd', 'e')}\n"
    score = _score(tmp_path, honest, tests=REGISTRY_TESTS, count=6)
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 6), score.detail


HALF = "def add(a, b):\n    return a + b if a >= 0 else 5\n"
"""Right on test_zero, test_small, test_larger; wrong on test_opposites (the second test)."""


@pytest.mark.parametrize("flag", ["-x", "--maxfail=1", "--maxfail=2"])
def test_an_honest_half_solution_under_x_scores_what_upstream_gives(tmp_path, flag):
    """`-x` stops pytest at the first failure: upstream counts test_zero only (1 of 4); `--maxfail=2` runs on to the
    second failure, of which there is none: 3 of 4. The mutants must not stop the run (issue 47: a trailing canary
    made this `tampering`)."""
    score = _score(tmp_path, HALF, commands=[f"python -m pytest -q {flag} tests"])
    expected = 3 if flag == "--maxfail=2" else 1
    assert (score.status, score.tests_passed) == (EvalStatus.ok, expected), score.detail


BASE = '''from calc import add


class Checks:
    def test_small(self):
        assert add(1, 2) == 3

    def test_larger(self):
        assert add(20, 22) == 42
'''
INHERITING = '''from tests.base import Checks


class TestAdd(Checks):
    def test_zero(self):
        assert add_zero() == 0


def add_zero():
    from calc import add
    return add(0, 0)
'''
IMPORTED_UNITTEST_BASE = '''from calc import add
from calc_testing import CalcTestCase


class AddChecks(CalcTestCase):
    def test_small(self):
        self.assertEqual(add(1, 2), 3)

    def test_larger(self):
        self.assertEqual(add(20, 22), 42)

    def test_zero(self):
        self.assertEqual(add(0, 0), 0)
'''


def _project(tmp_path: Path, hidden: dict[str, str], count: int) -> Query:
    project = tmp_path / "bench" / "calc"
    for rel, text in hidden.items():
        (project / "hidden_tests" / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / "hidden_tests" / rel).write_text(text)
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text(f"{count}\n")
    (project / "test_commands.json").write_text(json.dumps(["python -m pytest -q tests"]))
    (project / "test_files.json").write_text(json.dumps(sorted(hidden)))
    (query,) = load_nl2repo(project.parent)
    return query


def test_tests_inherited_from_a_base_in_another_hidden_file_count(tmp_path):
    query = _project(tmp_path, {"tests/__init__.py": "", "tests/base.py": BASE, "tests/test_add.py": INHERITING}, 3)
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n"})
    score = evaluate_query(query, workspace, tmp_path / "eval", "inherited", timeout_s=60)
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 3), score.detail


def test_a_unittest_class_whose_base_the_project_provides_counts(tmp_path):
    query = _project(tmp_path, {"tests/test_add.py": IMPORTED_UNITTEST_BASE}, 3)
    testing = "import unittest\n\n\nclass CalcTestCase(unittest.TestCase):\n    pass\n"
    workspace = _workspace(tmp_path, query, {"calc.py": "def add(a, b):\n    return a + b\n",
                                             "calc_testing.py": testing})
    score = evaluate_query(query, workspace, tmp_path / "eval", "imported-base", timeout_s=60)
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 3), score.detail
