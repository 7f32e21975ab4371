"""Hostile content in a workspace is the workspace's result, never a crash or a dropped sample.

"Reward integrity II", item 2: whatever the evaluator meets while reading, copying, scanning or
running a workspace (a module shadowing the standard library, a name that is not UTF-8, a path past
PATH_MAX, a recursion bomb in a configuration file, a hostile `# coding:` line) ends as a valid score
(0 here: the calc is wrong or missing), with the reason, and never as an exception out of
`evaluate_query` or an evaluator failure. Each case is one workspace scored on the real NL2RepoBench
evaluator in the real sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gyre.evaluators import evaluate_query
from gyre.records import EvalStatus
from tests.test_evaluator_nl2repo import _calc_query

WRONG = "def add(a, b):\n    return -1\n"
RIGHT = "def add(a, b):\n    return a + b\n"


def _long_path(root: Path) -> None:
    """Directories nested past PATH_MAX (4096 bytes), made relative to each parent as a process inside could."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(40):
            os.mkdir("d" * 200, dir_fd=fd)
            child = os.open("d" * 200, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        done = os.open("deep.py", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.write(done, b"X = 1\n")
        os.close(done)
    finally:
        os.close(fd)


CASES = {
    "pdb.py shadows the standard library": {"calc.py": WRONG, "pdb.py": "raise SystemExit(3)\n"},
    "a 5000-deep TOML": {"calc.py": WRONG, "sub/pyproject.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n"},
    "a # coding: idna line": {"calc.py": WRONG, "odd.py": "# coding: idna\nX = 1\n"},
    "a 5000-deep JSON": {"calc.py": WRONG, "data.json": "[" * 5000 + "]" * 5000},
}


def _workspace(tmp_path: Path, files: dict[str, str]) -> Path:
    ws = tmp_path / "ws"
    ws.mkdir()
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_files_are_scored_never_crash(tmp_path, name):
    query = _calc_query(tmp_path)
    score = evaluate_query(query, _workspace(tmp_path, CASES[name]), tmp_path / "eval", "hostile", timeout_s=60)
    assert score.status in (EvalStatus.ok, EvalStatus.tampering), score.detail
    assert score.score == 0.0, score.detail


def test_a_module_named_like_the_standard_library_never_loads_in_its_place(tmp_path):
    """The right solution beside a `pdb.py` that would exit (pytest imports pdb at configure time): the standard
    library's pdb loads, the tests run, and the shadow is flagged."""
    query = _calc_query(tmp_path)
    ws = _workspace(tmp_path, {"calc.py": RIGHT, "pdb.py": "raise SystemExit(3)\n", "json/__init__.py": "X = 1\n"})
    score = evaluate_query(query, ws, tmp_path / "eval", "hostile", timeout_s=60)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    assert any(f.startswith("shadows-stdlib pdb.py") for f in score.flags), score.flags
    assert any(f.startswith("shadows-stdlib json") for f in score.flags), score.flags


def test_a_workspace_that_crashes_the_evaluator_scores_0_flagged(tmp_path):
    """Whatever still raises in the evaluator on this workspace, or stops pytest before it says hello (here: a
    TOML recursion bomb as the project's root pyproject.toml), is the workspace's 0 when the task's starting
    files evaluate: flagged with the reason."""
    query = _calc_query(tmp_path)
    ws = _workspace(tmp_path, {"calc.py": RIGHT, "pyproject.toml": "a = " + "[" * 5000 + "]" * 5000 + "\n"})
    score = evaluate_query(query, ws, tmp_path / "eval", "hostile", timeout_s=60)
    assert score.status is EvalStatus.ok and score.score in (0.0, 1.0), score.detail
    if score.score == 0.0:
        assert any(f.startswith(("evaluator-crash", "broke-runner")) for f in score.flags), score.flags


def test_a_name_that_is_not_utf8_is_scored(tmp_path):
    query = _calc_query(tmp_path)
    ws = _workspace(tmp_path, {"calc.py": RIGHT})
    os.mkdir(os.fsencode(ws) + b"/\xff\xfe-not-utf8")
    with open(os.fsencode(ws) + b"/\xff\xfe-not-utf8/conftest.py", "wb") as handle:
        handle.write(b"X = 1\n")
    score = evaluate_query(query, ws, tmp_path / "eval", "hostile", timeout_s=60)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail


def test_a_path_past_path_max_is_scored(tmp_path):
    query = _calc_query(tmp_path)
    ws = _workspace(tmp_path, {"calc.py": RIGHT})
    _long_path(ws)
    score = evaluate_query(query, ws, tmp_path / "eval", "hostile", timeout_s=60)
    assert score.status in (EvalStatus.ok, EvalStatus.tampering), score.detail
    assert score.score is not None, score.detail


def test_a_projects_own_test_package_is_not_the_standard_librarys(tmp_path):
    """CPython's `test` package is a standard library name too; a project's hidden tests under `test/` that
    import `test.helpers` still load their own (the stdlib-first rule leaves `test` alone)."""
    import json

    from gyre.benchmarks.nl2repo import load_nl2repo

    project = tmp_path / "bench" / "calc"
    (project / "hidden_tests" / "test").mkdir(parents=True)
    (project / "hidden_tests" / "test" / "__init__.py").write_text("")
    (project / "hidden_tests" / "test" / "helpers.py").write_text("PAIRS = [((1, 2), 3), ((20, 22), 42)]\n")
    (project / "hidden_tests" / "test" / "test_calc.py").write_text(
        "from calc import add\nfrom test.helpers import PAIRS\n\n\ndef test_pairs():\n"
        "    assert all(add(*args) == want for args, want in PAIRS)\n")
    (project / "start.md").write_text("Create `calc.py` with `add(a, b)` returning a + b.\n")
    (project / "test_case_count.txt").write_text("1\n")
    (project / "test_commands.json").write_text(json.dumps(["python -m pytest -q test"]))
    (project / "test_files.json").write_text(json.dumps(["test"]))
    (query,) = load_nl2repo(project.parent)
    score = evaluate_query(query, _workspace(tmp_path, {"calc.py": RIGHT}), tmp_path / "eval", "own-test", timeout_s=60)
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
