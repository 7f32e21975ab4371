"""A canary must not be told from the real test it copies by anything a workspace can read at run time.

Issue 47: canaries were told apart by their node id (an absolute path into gyre's plugin directory) and by
their function missing from their module, and answered wrong. Here the workspace's `add` records, at every
call, everything its process can observe about the test calling it: the node id in `PYTEST_CURRENT_TEST`,
the test function's name, `__qualname__`, module attribute, code object file and lines and argument names,
the module's file, pytest's item (class, node id, location, markers, fixtures, parametrization) found by
walking the frames, and the call's position in the run. The evaluation runs twice (`observed.run_pair`),
each run on its own variant of the pristine files: in each run some tests are mutants. For every test, what
its mutant saw must equal what its original saw in the other run, observable by observable; only the
expected value differs, and the workspace never sees that unless it compares it.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

from gyre.evaluators.integrity.channel import ResultChannel
from gyre.evaluators.integrity.plugin_install import PluginInstall
from gyre.evaluators.integrity.tally import tally
from gyre.evaluators.paired import plan_pristine, write_pristine

TESTS = '''import pytest

from calc import add


def test_zero():
    assert add(0, 0) == 0


@pytest.mark.slow
def test_marked():
    assert add(1, 2) == 3


@pytest.mark.parametrize("a, b, total", [(1, 1, 2), (2, 5, 7)])
def test_parametrized(a, b, total):
    assert add(a, b) == total


def test_fixture(tmp_path):
    assert add(2, 2) == 4


class TestGroup:
    def test_method(self):
        assert add(20, 22) == 42

    def test_text(self):
        assert add("a", "b") == "ab"


def test_flip():
    assert add(3, 3) > 5
'''

OBSERVER = '''import json, os, sys

_CALLS = []


def _item():
    frame = sys._getframe(2)
    while frame is not None:
        item = frame.f_locals.get("item") or frame.f_locals.get("pyfuncitem")
        if item is not None and hasattr(item, "nodeid"):
            return item
        frame = frame.f_back
    return None


def add(a, b):
    test = sys._getframe(1)
    code = test.f_code
    module = sys.modules[test.f_globals["__name__"]]
    item = _item()
    owner = test.f_locals.get("self")
    function = getattr(owner if owner is not None else module, code.co_name, None)
    _CALLS.append(1)
    seen = {
        "current": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
        "name": code.co_name, "file": code.co_filename, "first_line": code.co_firstlineno,
        "line": test.f_lineno, "args": list(code.co_varnames[:code.co_argcount]),
        "qualname": getattr(function, "__qualname__", None), "module_file": module.__file__,
        "is_module_attribute": getattr(function, "__code__", None) is code
        or getattr(getattr(function, "__func__", None), "__code__", None) is code,
        "item_class": type(item).__name__, "nodeid": item.nodeid, "location": list(item.location),
        "markers": sorted(m.name for m in item.iter_markers()), "fixtures": sorted(item.fixturenames),
        "params": sorted(getattr(getattr(item, "callspec", None), "params", {}).items()),
        "position": len(_CALLS),
    }
    with open(os.environ["OBSERVED"], "a") as f:
        f.write(json.dumps(seen, sort_keys=True) + "\\n")
    return a + b
'''


def _run_twice(tmp_path: Path) -> tuple[list, list, list[dict]]:
    """The pristine tests planned as an evaluation plans them, each run's variant placed at the same path in a fresh
    copy, pytest run with gyre's plugin: (pristine files, each run's channel, each run's observations)."""
    ws = tmp_path / "ws"
    pristine = plan_pristine({"test_calc.py": TESTS.encode()}, str(ws / "tests"), random.Random(11))
    plugin = PluginInstall.write(tmp_path / "plugin")
    channels, seen = [], []
    for run in (0, 1):
        if ws.exists():
            ws.rename(tmp_path / f"run{run - 1}")
        (ws / "tests").mkdir(parents=True)
        (ws / "calc.py").write_text(OBSERVER)
        write_pristine(ws / "tests", pristine, run)
        plugin.write_plan(pristine, run)
        observed = tmp_path / f"observed{run}.jsonl"
        channel, audits = ResultChannel(), ResultChannel(audit_only=True)
        env = {**os.environ, **plugin.env(str(plugin.directory)), **channel.env(), **audits.env(),
               "OBSERVED": str(observed)}
        env.pop("PYTEST_CURRENT_TEST", None)
        try:
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "tests"], cwd=ws, env=env,
                           pass_fds=(channel.write_fd, audits.write_fd), capture_output=True, text=True, timeout=120)
        finally:
            said = channel.close()
            audits.close()
        said.run = run
        channels.append(said)
        seen.append([json.loads(line) for line in observed.read_text().splitlines()])
    return pristine, channels, seen


def test_a_mutant_shows_its_workspace_exactly_what_its_original_shows(tmp_path):
    pristine, channels, seen = _run_twice(tmp_path)
    (test_file,) = pristine
    mutated = {m.test for m in test_file.mutations}
    assert len(mutated) == 7 and {m.run for m in test_file.mutations} == {0, 1}  # both runs hold mutants
    runs = [{(s["nodeid"]): s for s in observations} for observations in seen]
    assert set(runs[0]) == set(runs[1]) and len(runs[0]) == 8  # every test (and case) ran in both
    for nodeid, first in runs[0].items():
        second = runs[1][nodeid]
        assert first == second, (nodeid, {k: (first[k], second[k]) for k in first if first[k] != second[k]})
    assert all(s["is_module_attribute"] and not s["file"].startswith(str(tmp_path / "plugin")) for s in seen[0])
    # and the count: each test from the run where it is itself, all passed; no mutant passed
    counted = tally(pristine, channels)
    assert len(counted.passed) == 8 and counted.tampering == [], counted.tampering
    assert counted.mutants == {"value": 5, "flip": 3}  # cases: the parametrized test has two, negated
