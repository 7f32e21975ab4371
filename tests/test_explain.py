"""`inprocess/explain.py`: a failing assertion's reprs computed in a forked child, so that what a repr does never
reaches the tests after it (a mutation canary fails on correct code by design; its explanation must leave no trace),
with the same text as pytest and unittest print in place; a child that hangs is killed and the value said not shown.
The module as gyre's own (package) module, and pytest and unittest run for real in a subprocess."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from gyre.evaluators.integrity.inprocess import explain

ROOT = Path(__file__).resolve().parents[1]


class Shown:
    """Named when first shown, as a symbolic library names a fresh variable."""

    count = 0

    def __init__(self):
        self.name = None

    def __repr__(self):
        if self.name is None:
            Shown.count += 1
            self.name = f"_v{Shown.count}"
        return self.name


def test_the_childs_repr_is_returned_and_its_side_effects_stay_in_the_child():
    shown = Shown()
    assert explain.in_child(repr, shown) == "_v1"
    assert (shown.name, Shown.count) == (None, 0)  # nothing the repr did reached this process
    assert explain.in_child(lambda s: s * 3, "\udcff") == "\udcff" * 3  # a lone surrogate survives the pipe


def test_a_child_that_hangs_is_killed_and_the_value_is_not_shown(monkeypatch):
    monkeypatch.setattr(explain, "EXPLAIN_TIMEOUT_S", 0.3)
    children_before = _children()
    hung = explain.in_child(lambda: __import__("time").sleep(60))
    assert hung == "<not shown: its explanation did not finish in 0.3 s>"
    assert _children() == children_before  # killed and reaped: no zombie left


def test_an_exception_in_the_child_is_named_and_a_process_limit_computes_in_place(monkeypatch):
    with pytest.raises(RuntimeError, match="raised ZeroDivisionError"):
        explain.in_child(lambda: 1 / 0)

    def no_fork():
        raise BlockingIOError("fork: resource temporarily unavailable")

    monkeypatch.setattr(explain, "_fork", no_fork)
    shown = Shown()
    assert explain.in_child(repr, shown) == "_v1" and shown.name == "_v1"  # in place, as upstream does it
    Shown.count = 0


def test_a_process_holding_over_1024_descriptors_still_explains():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the descriptor limit here is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = []
    try:
        while not held or held[-1] < 1100:  # the pipe's descriptors lie past select()'s FD_SETSIZE
            held.append(os.dup(0))
        assert explain.in_child(repr, Shown()) == "_v1" and Shown.count == 0
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_bytes_that_are_not_the_childs_utf8_only_garble_its_own_text():
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # what a repr writing to the pipe itself leaves: not UTF-8
        os.write(write, b"+mine \xff\xfe")
        os._exit(0)
    os.close(write)
    assert explain._answer(pid, read) == "mine \ufffd\ufffd"


PROJECT = '''
count = [0]


class Shown:
    def __init__(self):
        self.name = None

    def __repr__(self):
        if self.name is None:
            count[0] += 1
            self.name = "_v%d" % count[0]
        return self.name

    def degree(self):
        return 1
'''
PYTEST_TESTS = '''
import unittest
from shown import Shown, count


def test_a_failing_assert_shows_its_values():
    assert Shown().degree() * 3 == 4


def test_nothing_was_shown_in_this_process():
    assert count[0] == 0


class TestCase(unittest.TestCase):
    def test_a_failing_assert_equal_shows_its_values(self):
        self.assertEqual([Shown()], 5)

    def test_then_nothing_was_shown_either(self):
        self.assertEqual(count[0], 0)
'''


@pytest.mark.parametrize("isolated", [True, False])
def test_under_pytest_a_failure_explains_the_same_and_only_isolated_leaves_no_trace(tmp_path, isolated):
    (tmp_path / "shown.py").write_text(PROJECT)
    (tmp_path / "test_shown.py").write_text(PYTEST_TESTS)
    (tmp_path / "conftest.py").write_text(
        "from gyre.evaluators.integrity.inprocess import explain\nexplain.isolate()\n" if isolated else "")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           "test_shown.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}"))
    out = done.stdout
    assert "assert (1 * 3) == 4" in out and "where 1 = degree()" in out, out  # the values shown, as pytest shows them
    assert "_v1.degree" in out, out  # the repr ran, in the child when isolated
    assert "AssertionError: [_v" in out, out  # unittest's message: its safe_repr ran too
    tally = out.strip().splitlines()[-1]
    assert tally.startswith("2 failed, 2 passed" if isolated else "4 failed"), out


def _children() -> list[str]:
    me = os.getpid()
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.append(stat.parent.name)
    return sorted(found)
