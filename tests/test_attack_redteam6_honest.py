"""Red-team round 6 on NL2RepoBench, honest layouts and the two runs' isolation (the forging routes:
tests/test_attack_redteam6.py, whose helpers these use).

An honest workspace must score what upstream's procedure gives it; a route gyre still scores below upstream is kept
as `xfail(strict=True)` with the reason until the code changes.
"""

from __future__ import annotations

import pytest

from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.test_attack_redteam6 import SOLVED, _project, _score
from tests.test_evaluator_nl2repo import CALC_TESTS

pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")


# --- 3. the image's own addopts name an option of pytest's cache plugin -------------------------------------------
# Upstream runs the task's commands with pytest's plugins as the image has them; gyre adds `-p no:cacheprovider`
# (`plugin_install.PluginInstall.env`), which also blocks the plugins that depend on it (`--ff`, `--nf`, `--lf`,
# `--sw`). A project whose settings name one must still score an honest solution as upstream does; and `--sw`
# (stepwise: stop at the first failure, like `-x`) must stop a half solution where upstream's pytest stops it (fixed:
# gyre's plugin sends `--sw` as a maxfail of 1, `--sw-skip` of 2).

@pytest.mark.parametrize("option", ["--ff", "--sw"])
def test_the_images_cache_plugin_options_keep_an_honest_score(tmp_path, option):
    settings = f'[project]\nname = "calc"\nversion = "1"\n\n[tool.pytest.ini_options]\naddopts = "{option}"\n'
    query = _project(tmp_path, {"tests/test_calc.py": CALC_TESTS}, 4, image={"pyproject.toml": settings})
    score = _score(tmp_path, query, {"calc.py": SOLVED})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 4), (score.status, score.detail)


HALF = "def add(a, b):\n    return a + b if a >= 0 else 5\n"
"""Right on test_zero, test_small, test_larger; wrong on test_opposites (the second test)."""


def test_a_half_solution_under_the_images_stepwise_scores_what_upstream_gives(tmp_path):
    settings = '[project]\nname = "calc"\nversion = "1"\n\n[tool.pytest.ini_options]\naddopts = "--sw"\n'
    query = _project(tmp_path, {"tests/test_calc.py": CALC_TESTS}, 4, image={"pyproject.toml": settings})
    score = _score(tmp_path, query, {"calc.py": HALF})
    assert (score.status, score.tests_passed) == (EvalStatus.ok, 1), (score.status, score.detail)


# --- 4. a pristine conftest that stops a class after its first failure (pytest's own "incremental" recipe) ----------
# pytest's documentation (example/simple.html, "incremental testing - test steps") puts these two hooks in a
# conftest: a failed test marks the rest of its class xfail. Every qualifying test is a mutant in one of the two
# runs, so in each run a mutant's (expected) failure xfails the real tests after it, which count from that run:
# an honest solution that upstream scores full marks loses them.

INCREMENTAL_CONFTEST = '''import pytest


def pytest_runtest_makereport(item, call):
    if "incremental" in item.keywords and call.excinfo is not None:
        item.parent._previousfailed = item


def pytest_runtest_setup(item):
    if "incremental" in item.keywords:
        previousfailed = getattr(item.parent, "_previousfailed", None)
        if previousfailed is not None:
            pytest.xfail(f"previous test failed ({previousfailed.name})")
'''
INCREMENTAL_STEPS = 16
"""Each test's run is a coin of its own: with 16 steps all coins agree (no real step after a mutant in its own
run) with probability 2^-15, so the loss below is certain but for that."""
INCREMENTAL_TESTS = "import pytest\n\nfrom calc import add\n\n\n@pytest.mark.incremental\nclass TestSteps:\n" + "".join(
    f"    def test_step_{i:02d}(self):\n        assert add({i}, {10 * i}) == {11 * i}\n\n" for i in range(INCREMENTAL_STEPS))


def test_an_incremental_class_keeps_an_honest_score(tmp_path):
    hidden = {"tests/conftest.py": INCREMENTAL_CONFTEST, "tests/test_calc.py": INCREMENTAL_TESTS}
    query = _project(tmp_path, hidden, INCREMENTAL_STEPS)
    score = _score(tmp_path, query, {"calc.py": SOLVED})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, INCREMENTAL_STEPS), (
        score.status, score.detail)


# --- 8. an honest project that counts its own open descriptors ------------------------------------------------------
# `monitor: zero` acted on `fd-scan` on every format (`zero_policy.RUNTIME_ON_REAL`): `/proc/self/fd` listed by the
# workspace's code, how a forger finds the result pipe (fixed: a recorded flag; opening the pipe is `result-channel`). A project whose job is to count or list a process's open
# descriptors (a leak checker, a daemon's close-all helper, psutil's `num_fds`) lists it honestly; upstream scores
# the solution by its tests alone.

FD_TESTS = '''from calc import num_fds


def test_a_file_opened_is_counted():
    before = num_fds()
    with open(__file__) as f:
        during = num_fds()
    assert during - before == 1


def test_a_file_closed_is_not():
    with open(__file__):
        pass
    before = num_fds()
    assert num_fds() == before
'''
FD_HONEST = '''import os


def num_fds():
    """How many descriptors this process holds open (psutil's Process.num_fds on Linux)."""
    return len(os.listdir("/proc/self/fd"))
'''


def test_an_honest_descriptor_counter_keeps_its_score_under_monitor_zero(tmp_path):
    query = _project(tmp_path, {"tests/test_calc.py": FD_TESTS}, 2)
    score = _score(tmp_path, query, {"calc.py": FD_HONEST})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 2), (score.status, score.detail,
                                                                                           score.flags)


# --- 10. a mutant's failure runs the project's code: pytest's explanation calls `repr` ------------------------------
# `mutants` holds that a mutant fails only at its very end, so the tests after it meet the same state. But a failing
# assertion is explained: pytest's rewritten assert calls `repr` on the objects it shows (`where 1 =
# <bound method Var.degree of _v1>()`), which a passing one never does. A project whose objects are named lazily,
# when first shown (a symbolic library's fresh variables), counts differently after a mutant: the honest test that
# checks the first name shown loses in every run where an earlier test is a mutant (all but 2^-12 evaluations here:
# each degree test compares its own literal, so each has its own coin; tests sharing one literal share a coin).

SHOWN_TESTS = "from calc import Var\n" + "".join(
    f"\n\ndef test_degree_{i:02d}():\n    assert Var().degree() * {i + 1} == {i + 1}\n" for i in range(12)) + '''

def test_the_first_variable_shown_is_v1():
    assert str(Var()) == "_v1"
'''
SHOWN_HONEST = '''_SHOWN = [0]


class Var:
    """A fresh variable; named `_v1`, `_v2`, ... in the order variables are first shown."""

    def __init__(self):
        self._name = None

    def degree(self):
        return 1

    def __repr__(self):
        if self._name is None:
            _SHOWN[0] += 1
            self._name = f"_v{_SHOWN[0]}"
        return self._name

    __str__ = __repr__
'''


def test_state_a_mutants_explanation_changes_does_not_cost_an_honest_solution(tmp_path):
    query = _project(tmp_path, {"tests/test_calc.py": SHOWN_TESTS}, 13)
    score = _score(tmp_path, query, {"calc.py": SHOWN_HONEST})
    assert (score.status, score.score, score.tests_passed) == (EvalStatus.ok, 1.0, 13), (score.status, score.detail)


# --- 11. an honest but order-dependent answer: a flaky test turns into tampering ------------------------------------
# Upstream runs the tests once: a test whose honest answer depends on set order (string hashes are salted per process)
# passes about half the time and costs half a test on average. gyre runs each test twice, as itself and as its flip:
# when the original passes in one run and the flip in the other ("no correct code passes both"), the whole
# evaluation was tampering, a 0 (fixed: one `PYTHONHASHSEED` per evaluation, both runs alike, `Observer.hash_seed`). With 24 such tests that happens in all but 0.1 % of evaluations; upstream's expected
# score is about one half, never a 0 on every test.

FLAKY_CASES = 24
FLAKY_TESTS = "from calc import first_tag\n" + "".join(
    f"\n\ndef test_first_tag_{i:02d}():\n    assert first_tag(['a{i}', 'b{i}']) in ('a{i}',)\n" for i in range(FLAKY_CASES))
FLAKY_HONEST = '''def first_tag(tags):
    """The first of the distinct tags (in set order: the spec did not say which)."""
    return next(iter(set(tags)))
'''


def test_an_honest_order_dependent_answer_is_never_tampering(tmp_path):
    query = _project(tmp_path, {"tests/test_calc.py": FLAKY_TESTS}, FLAKY_CASES)
    score = _score(tmp_path, query, {"calc.py": FLAKY_HONEST})
    assert score.status is EvalStatus.ok, (score.status, score.detail, score.evidence[:2])


# --- 13. the first run leaves a mark the second reads: an extended attribute on the environment's directory ---------
# `observed` promises that both runs start from the same environment and "nothing the first run's workspace code
# wrote there reaches the second" (`reset_env` empties the directory and copies the kept one back in). The directory
# itself stays, and so did its extended attributes, which its owner (the commands' user) may set (fixed:
# `reset_env` removes them). A workspace that
# marks it in one run and reads the mark in the next knows which run it is in and carries anything it saw across
# (the pair of values each test showed: the likelihood a value is the original is then the forger's to weigh). Here
# it answers correctly until it finds the mark; a workspace that cannot tell the runs apart scores the same in both.

MARKED_CASES = 16
MARKED_TESTS = "from calc import add\n" + "".join(
    f"\n\ndef test_sum_{i:02d}():\n    assert add({i}, {i + 1}) == {2 * i + 1}\n" for i in range(MARKED_CASES))
MARKED_ACROSS_RUNS = '''import os, sys

try:
    _SECOND = os.getxattr(sys.prefix, "user.redteam6") == b"1"
except OSError:
    _SECOND = False
    os.setxattr(sys.prefix, "user.redteam6", b"1")


def add(a, b):
    return a + b if not _SECOND else a + b + 1
'''


def test_the_second_run_sees_nothing_the_first_run_wrote(tmp_path):
    query = _project(tmp_path, {"tests/test_calc.py": MARKED_TESTS}, MARKED_CASES)
    score = _score(tmp_path, query, {"calc.py": MARKED_ACROSS_RUNS})
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), (score.status, score.detail)
