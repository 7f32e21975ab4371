"""gyre's result plugin and pipe, run with a real pytest on every kind of outcome pytest has."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gyre.evaluators.integrity.channel import PluginInstall, ResultChannel

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
