"""Red-team round 7: honest NL2RepoBench layouts gyre scores below what upstream's procedure gives them.

Same fixtures as `tests.test_attack_redteam7`. Each honest workspace here passes every hidden test under plain
pytest (upstream's full marks); a layout gyre scores lower is kept as `xfail(strict=True)` with the reason until the
code changes.
"""

from __future__ import annotations

import pytest

from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_attack_redteam6 import _project, _score

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")


# --- 1. a matcher project: its objects are equal to many values by design -----------------------------------------
# dirty-equals, PyHamcrest and `unittest.mock.ANY` style: `IsPositive() == 5` holds for every positive number. The
# value mutant `IsPositive() == 8` passed honestly, and `tally` makes a value mutant reported passed tampering ("no
# correct code passes both"): the honest matcher scored 0 where upstream gives 3 of 3. A comparison with an object
# the test builds in place from a class gets its flip only now (`matchers`); an always-equal object a function
# returns still meets value mutants (`tests/test_attack_integrity_iii.py`, `ALWAYS_EQUAL`).

MATCH_TESTS = '''from calc import IsPositive, IsWord


def test_positive():
    assert IsPositive() == 5


def test_positive_left():
    assert 7 == IsPositive()


def test_word():
    assert IsWord() == "hello"
'''
MATCH_HONEST = '''class IsPositive:
    """A matcher (dirty-equals, PyHamcrest style): equal to any number above zero."""

    def __eq__(self, other):
        return isinstance(other, (int, float)) and other > 0


class IsWord:
    def __eq__(self, other):
        return isinstance(other, str) and other.isalpha()
'''


def test_an_honest_matcher_keeps_its_score(tmp_path):
    query = _project(tmp_path, {"tests/test_calc.py": MATCH_TESTS}, 3)
    score = _score(tmp_path, query, {"calc.py": MATCH_HONEST})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 3), (score.status, score.detail)


# --- 2. doctests in a hidden test file, run by the task's `--doctest-modules` ---------------------------------------
# pytest collects the docstring example as its own item (`tests/test_doc.py::tests.test_doc.total`) and counts it in
# "2 passed", upstream's count. Its id names no test function of the pristine file; `tally` ignored it (1 of 2) until
# it counted a doctest item of a pristine file's own docstring (`pristine.doctest_holders`).

DOC_TESTS = '''from calc import add


def total(xs):
    """The sum through the project's own `add`.

    >>> total([1, 2, 3])
    6
    """
    out = 0
    for x in xs:
        out = add(out, x)
    return out


def test_add():
    assert add(2, 3) == 5
'''
DOC_HONEST = "def add(a, b):\n    return a + b\n"


def test_a_hidden_files_doctest_counts_as_upstream_counts_it(tmp_path):
    query = _project(tmp_path, {"tests/test_doc.py": DOC_TESTS}, 2,
                     commands=["python -m pytest -q --doctest-modules tests"])
    score = _score(tmp_path, query, {"calc.py": DOC_HONEST})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 2), (score.status, score.detail)


# --- 3. tests bound without a `def`: a factory's function, an imported test function or test class ---------------
# pytest collects every module attribute named `test*` whose value is a function, and every `Test*` class, wherever it
# was defined: `test_three = _make(3)`, `from helpers import test_roundtrip` and `from base_checks import TestCommon`
# are tests of `test_gen.py` ("4 passed" under plain pytest, upstream's count). Only `def`s counted: 1 of 4.

GEN_TESTS = '''from base_checks import TestCommon
from helpers import test_roundtrip

from calc import add


def _make(n):
    def check():
        assert add(n, n) == 2 * n
    return check


test_three = _make(3)


def test_own():
    assert add(2, 3) == 5
'''
GEN_HELPERS = '''from calc import add


def test_roundtrip():
    assert add(add(1, 2), -2) == 1
'''
GEN_BASE = '''from calc import add


class TestCommon:
    def test_zero(self):
        assert add(0, 0) == 0
'''


def test_tests_bound_by_assignment_or_import_count_as_pytest_collects_them(tmp_path):
    query = _project(tmp_path, {"tests/test_gen.py": GEN_TESTS, "tests/helpers.py": GEN_HELPERS,
                                "tests/base_checks.py": GEN_BASE}, 4)
    score = _score(tmp_path, query, {"calc.py": DOC_HONEST})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 4), (score.status, score.detail)
    unsolved = _score(tmp_path / "unsolved", query, {"calc.py": "def add(a, b):\n    return 0\n"})
    assert unsolved.status == EvalStatus.ok and unsolved.tests_passed == 1, (unsolved.status, unsolved.detail)
