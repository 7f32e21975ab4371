"""`case_counts`: which pristine tests have a case count their source makes certain, read from real-shaped modules
(gyre/evaluators/integrity/cases.py). A wrong cap is a false tampering; a missing one lets a workspace conftest
multiply a test's passing cases."""

from gyre.evaluators.integrity.cases import case_counts, data_driven, padded_cases, skip_marked

CLASSES = '''import unittest

import pytest

from calc import add


def test_module_level():
    assert add(1, 1) == 2


class TestPlain:
    def test_one(self):
        assert add(0, 0) == 0

    @pytest.mark.parametrize("a, b", [(1, 2), (3, 4), (5, 6)])
    def test_three(self, a, b):
        assert add(a, b) == a + b

    def test_with_tmp_path(self, tmp_path):
        assert tmp_path.is_dir()

    def test_with_a_fixture(self, calculator):
        assert calculator

    @staticmethod
    def test_static():
        assert add(1, 2) == 3

    def helper(self):
        return 1


@pytest.mark.parametrize("base", [2, 8, 10])
class TestMarked:
    def test_each_base(self, base):
        assert base

    @pytest.mark.parametrize("digits", ["1", "11"])
    def test_each_base_and_digits(self, base, digits):
        assert int(digits, base)

    class TestNested:
        def test_inner(self, base):
            assert base


class TestObject(object):
    def test_it(self):
        assert True


class TestUnit(unittest.TestCase):
    def test_method(self):
        self.assertEqual(add(1, 2), 3)


class TestInherits(Base):
    def test_it(self):
        assert True


class TestWithMeta(metaclass=Meta):
    def test_it(self):
        assert True


@some_decorator
class TestDecorated:
    def test_it(self):
        assert True


class Helper:
    def test_not_collected(self):
        assert True
'''


def test_the_methods_of_plain_and_unittest_classes_are_capped_and_nothing_else():
    assert case_counts(CLASSES) == {
        ("test_module_level",): 1,
        ("TestPlain", "test_one"): 1,
        ("TestPlain", "test_three"): 3,
        ("TestPlain", "test_with_tmp_path"): 1,
        ("TestMarked", "test_each_base"): 3,
        ("TestMarked", "test_each_base_and_digits"): 6,
        ("TestMarked", "TestNested", "test_inner"): 3,
        ("TestObject", "test_it"): 1,
        ("TestUnit", "test_method"): 1,
    }


def test_a_module_that_may_parametrize_at_run_time_caps_nothing():
    for dynamic in ("pytestmark = pytest.mark.parametrize('x', [1, 2])\n",
                    "def pytest_generate_tests(metafunc):\n    pass\n",
                    "@pytest.fixture(params=[1, 2])\ndef calculator(request):\n    return request.param\n",
                    "@pytest.mark.usefixtures('calculator')\nclass TestUses:\n    def test_it(self):\n        pass\n"):
        assert case_counts(CLASSES + "\n\n" + dynamic) == {}, dynamic


def test_a_method_without_self_or_with_a_star_argument_is_left_uncapped():
    source = ("class TestOdd:\n    def test_no_self():\n        pass\n\n"
              "    def test_star(self, *args):\n        pass\n\n"
              "    def test_default(self, x=3):\n        pass\n")
    assert case_counts(source) == {("TestOdd", "test_default"): 1}


def test_a_unittest_method_with_a_parametrize_mark_is_left_uncapped():
    source = ("import unittest, pytest\n\n\nclass TestU(unittest.TestCase):\n"
              "    @pytest.mark.parametrize('x', [1, 2])\n    def test_x(self):\n        pass\n")
    assert case_counts(source) == {}


def test_tests_parametrized_over_what_the_module_imports_are_data_driven():
    source = ("import string\n\nimport pytest\nfrom calc import REGISTRY\n\nOPS = sorted(REGISTRY)\nLOCAL = [1, 2]\n\n\n"
              "@pytest.mark.parametrize('name', sorted(REGISTRY))\ndef test_each(name):\n    pass\n\n\n"
              "@pytest.mark.parametrize('op', OPS)\ndef test_ops(op):\n    pass\n\n\n"
              "@pytest.mark.parametrize('x', LOCAL)\ndef test_local(x):\n    pass\n\n\n"
              "@pytest.mark.parametrize('x', range(3))\ndef test_range(x):\n    pass\n\n\n"
              "@pytest.mark.parametrize('c', calc.DIGITS)\nclass TestDigits:\n    def test_c(self, c):\n        pass\n")
    source = source.replace("import string\n", "import string\nimport calc\n")
    assert data_driven(source) == {("test_each",), ("test_ops",), ("TestDigits", "test_c")}


def test_a_literal_list_of_values_or_the_standard_librarys_data_is_no_workspace_data():
    # freezegun's own tests (fidelity: a real solution lost 6 of 134 cases while they counted as data-driven)
    source = ("import datetime\nimport pickle\nfrom string import digits\n\nimport pytest\n"
              "from calc import REGISTRY, HAS_NS, parse\n\nCASES = [(parse(x), x) for x in ['a', 'b']]\n"
              "MORE = [(parse(x), x) for x in REGISTRY]\n\n\n"
              "@pytest.mark.parametrize('name, has', (('ns', HAS_NS), ('s', True)))\ndef test_literal(name, has):\n"
              "    pass\n\n\n"
              "@pytest.mark.parametrize('tick', [datetime.timedelta(1), 1])\ndef test_stdlib_values(tick):\n    pass\n\n\n"
              "@pytest.mark.parametrize('protocol', range(pickle.HIGHEST_PROTOCOL + 1))\ndef test_pickle(protocol):\n"
              "    pass\n\n\n"
              "@pytest.mark.parametrize('c', digits)\ndef test_digits(c):\n    pass\n\n\n"
              "@pytest.mark.parametrize('case', CASES)\ndef test_fixed_comprehension(case):\n    pass\n\n\n"
              "@pytest.mark.parametrize('case', MORE)\ndef test_registry_comprehension(case):\n    pass\n\n\n"
              "@pytest.mark.parametrize('x', [1, *REGISTRY])\ndef test_unpacked(x):\n    pass\n")
    assert data_driven(source) == {("test_registry_comprehension",), ("test_unpacked",)}


def test_each_failed_case_costs_a_passed_one_only_beyond_the_count_and_within_the_data_driven_cases():
    assert padded_cases(reported=8, passed=6, count=6, data_driven=6) == 2  # padded up to the count: 4 of 6
    assert padded_cases(reported=8, passed=8, count=6, data_driven=6) == 0  # a larger registry, all passing
    assert padded_cases(reported=6, passed=4, count=6, data_driven=4) == 0  # no excess: upstream's count as it is
    assert padded_cases(reported=206, passed=203, count=202, data_driven=0) == 0  # an excess of no data-driven test
    assert padded_cases(reported=210, passed=200, count=202, data_driven=3) == 3


def test_a_case_skipped_or_xfailed_under_a_pristine_mark_is_excused():
    source = ("import pytest\nfrom calc import REGISTRY\n\n\n"
              "@pytest.mark.parametrize('x', [1, pytest.param(2, marks=pytest.mark.xfail)])\ndef test_param(x):\n"
              "    pass\n\n\n@pytest.mark.skipif(True, reason='r')\ndef test_skipif():\n    pass\n\n\n"
              "@pytest.mark.xfail\nclass TestAll:\n    def test_m(self):\n        pass\n\n\n"
              "def test_plain():\n    pytest.skip('imperative: no mark')\n")
    assert skip_marked(source) == {("test_param",), ("test_skipif",), ("TestAll", "test_m")}
    assert skip_marked("import pytest\npytestmark = pytest.mark.skip\n\ndef test_a():\n    pass\n") == {("test_a",)}
    assert padded_cases(reported=452, passed=448, count=448, data_driven=6, excused=4) == 0  # bleach's 4 xfails
    assert padded_cases(reported=8, passed=6, count=6, data_driven=6, excused=0) == 2  # a skip with no mark counts
