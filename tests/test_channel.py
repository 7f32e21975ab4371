"""gyre's result plugin and pipe, run with a real pytest on every kind of outcome pytest has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gyre.evaluators.integrity.channel import ResultChannel
from gyre.evaluators.integrity.plugin_install import PluginInstall

VARIED = '''
import pytest


@pytest.fixture
def broken_setup():
    raise RuntimeError("setup fails")


@pytest.fixture
def broken_teardown():
    yield
    raise RuntimeError("teardown fails")


def test_pass():
    assert True


def test_fail():
    assert 1 == 2


def test_setup_error(broken_setup):
    pass


def test_teardown_error(broken_teardown):
    pass


@pytest.mark.skip(reason="no")
def test_skipped():
    pass


@pytest.mark.xfail(reason="known")
def test_xfail():
    assert False


@pytest.mark.xfail(reason="known", strict=False)
def test_xpass():
    pass


@pytest.mark.parametrize("x", [1, 2])
def test_param(x):
    assert x == 1


class TestGroup:
    def test_method(self):
        pass
'''


def _run(tmp_path: Path, source: str, *args: str):
    (tmp_path / "test_varied.py").write_text(source)
    plugin = PluginInstall.write(tmp_path / "plugin")
    channel = ResultChannel()
    env = {**os.environ, **plugin.env(str(plugin.directory)), **channel.env()}
    subprocess.run([sys.executable, "-m", "pytest", "-q", *args, "test_varied.py"], cwd=tmp_path, env=env,
                   pass_fds=(channel.write_fd,), capture_output=True, timeout=120)
    return channel.close()


def test_every_outcome_arrives_in_order_with_no_conflict(tmp_path):
    said = _run(tmp_path, VARIED)
    assert said.hello and said.session and said.collected and said.ran_to_the_end
    assert said.conflicts == []
    outcomes = {nodeid.split("::", 1)[1]: r.outcome for nodeid, r in said.results.items()}
    assert outcomes == {
        "test_pass": "passed", "test_fail": "failed", "test_setup_error": "error", "test_teardown_error": "error",
        "test_skipped": "skipped", "test_xfail": "skipped", "test_xpass": "skipped", "test_param[1]": "passed",
        "test_param[2]": "failed", "TestGroup::test_method": "passed",
    }
    assert said.passed("test_varied.py::test_pass") and not said.passed("test_varied.py::test_teardown_error")


def test_a_test_that_kills_the_process_leaves_the_rest_unreported(tmp_path):
    source = "import os\n\ndef test_a():\n    pass\n\ndef test_b():\n    os._exit(0)\n\ndef test_c():\n    pass\n"
    said = _run(tmp_path, source)
    assert said.passed("test_varied.py::test_a") and not said.passed("test_varied.py::test_b")
    assert "test_varied.py::test_c" not in said.results and not said.finished and said.conflicts == []


SUBTESTS_AND_IDS = '''
import unittest

import pytest


class TestWithSubtests(unittest.TestCase):
    def test_all_pass(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertEqual(i, i)

    def test_one_fails(self):
        for i in range(3):
            with self.subTest(i=i):
                self.assertNotEqual(i, 1)


def test_fixture_subtests(subtests):
    for i in range(2):
        with subtests.test(i=i):
            assert i >= 0


@pytest.mark.parametrize("path", ["a::b", "plain", "x[y]"])
def test_ids(path):
    assert path
'''


def test_subtests_and_parameter_ids_holding_colons_count_as_pytest_counts_them(tmp_path):
    """pytest 9 reports each subtest as one more `call` report of its test ("1 failed, 5 passed, 7
    subtests passed"): not a phase reported twice (a real source was scored `tampering` for it), and
    the test's own outcome is its own call report's, as upstream's "(N) passed" reads it. Parameter
    ids holding `::` stay whole (45 of sqlparse's tests were dropped)."""
    from gyre.evaluators.integrity.pristine import PristineFile, defined_tests, full_id, test_id
    from gyre.evaluators.integrity.tally import tally

    said = _run(tmp_path, SUBTESTS_AND_IDS)
    assert said.conflicts == [] and said.ran_to_the_end
    results = {full_id(nodeid): r for nodeid, r in said.results.items()}
    assert {k: r.outcome for k, r in results.items()} == {
        ("TestWithSubtests", "test_all_pass"): "passed", ("TestWithSubtests", "test_one_fails"): "passed",
        ("test_fixture_subtests",): "passed", ("test_ids[a::b]",): "passed", ("test_ids[plain]",): "passed",
        ("test_ids[x[y]]",): "passed"}
    assert results[("TestWithSubtests", "test_one_fails")].subtests == {"passed": 2, "failed": 1}
    assert results[("test_fixture_subtests",)].subtests == {"passed": 2}
    assert test_id("test_varied.py::test_ids[a::b]") == ("test_ids",)
    pristine = PristineFile(str(tmp_path / "test_varied.py"), defined_tests(SUBTESTS_AND_IDS))
    counted = tally([pristine], [said])
    assert len(counted.passed) == 6 and counted.tampering == [] and counted.ignored == []


def test_a_subtest_report_outside_its_tests_call_is_forging(tmp_path):
    from gyre.evaluators.integrity.channel import ChannelResults

    said = ChannelResults()
    for message in ({"event": "collected"}, {"event": "report", "nodeid": "t.py::test_a", "when": "setup",
                                             "outcome": "passed"}):
        said.add(message)
    said.add({"event": "report", "nodeid": "t.py::test_b", "when": "call", "outcome": "passed", "subtest": True})
    said.add({"event": "report", "nodeid": "t.py::test_a", "when": "call", "outcome": "passed"})
    said.add({"event": "report", "nodeid": "t.py::test_a", "when": "call", "outcome": "passed", "subtest": True})
    assert len(said.conflicts) == 2 and all("subtest" in c for c in said.conflicts)
    assert not said.passed("t.py::test_b")


def test_tests_defined_under_if_else_try_and_with_are_the_files_own():
    """six defines the same test in both branches of an `if`: its results were dropped as not the
    pristine file's. Function bodies are not entered (a nested def is no test)."""
    from gyre.evaluators.integrity.pristine import defined_tests

    source = '''
import sys
if sys.version_info[0] >= 3:
    def test_text():
        pass
else:
    def test_text():
        pass
try:
    import json
except ImportError:
    def test_without_json():
        pass
else:
    def test_with_json():
        def test_nested_helper():
            pass
with open(__file__):
    pass
class TestMoves:
    if True:
        def test_move(self):
            pass
    try:
        pass
    finally:
        def test_always(self):
            pass
'''
    assert defined_tests(source) == {("test_text",), ("test_without_json",), ("test_with_json",),
                                     ("TestMoves", "test_move"), ("TestMoves", "test_always")}


def test_a_fixture_named_like_a_test_is_no_test():
    """Terminal-Bench's chem-property-targeting defines `@pytest.fixture def test_data()`: pytest never collects
    it, so gyre must not wait for its result (the task's own solution scored 0: 7 of 8 "tests" passed)."""
    from gyre.evaluators.integrity.pristine import defined_tests

    source = '''
import pytest
from pytest import fixture
import pytest_asyncio

@pytest.fixture
def test_data():
    return 1

@fixture(scope="module")
def test_config():
    return 2

@pytest_asyncio.fixture
async def test_client():
    return 3

@pytest.mark.parametrize("x", [1])
def test_real(x, test_data):
    assert test_data == x

class TestThing:
    @pytest.fixture
    def test_setup(self):
        return 4

    def test_it(self, test_setup):
        assert test_setup == 4
'''
    assert defined_tests(source) == {("test_real",), ("TestThing", "test_it")}
