"""Scoring the real-format fixtures (tests/fixtures/realformats): solved, unsolved, partly solved, unscorable.

Each fixture carries the quirks of its published format (see its README and
docs/benchmarks.md). Scores come from the same `evaluate_query` a run uses.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark_report
from gyre.evaluators import evaluate_query
from gyre.evaluators.integrity.control import environment_gaps
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import probe_bwrap
from tests.fixtures.realformats.build import build_r2e, workspace

FIXTURES = Path(__file__).parent / "fixtures" / "realformats"
pytestmark = pytest.mark.skipif(probe_bwrap() is None, reason="bubblewrap missing or unusable")


def _query(fmt: str, directory: str, task: str):
    queries, malformed = load_benchmark_report(fmt, FIXTURES / directory)
    assert malformed, "each fixture directory carries one malformed task beside the good ones"
    return {q.query_id: q for q in queries}[task]


@pytest.mark.parametrize("task", ["mathkit", "textkit"])
def test_nl2repo_solved_and_unsolved(tmp_path, task):
    query = _query("nl2repo", "nl2repo", task)
    solved = evaluate_query(query, workspace(FIXTURES / "nl2repo" / task, tmp_path / "a"), tmp_path / "e1", "s",
                            timeout_s=120)
    assert (solved.status, solved.score) == (EvalStatus.ok, 1.0), solved.detail
    unsolved = evaluate_query(query, workspace(FIXTURES / "nl2repo" / task, tmp_path / "b", solved=False),
                              tmp_path / "e2", "u", timeout_s=120)
    assert (unsolved.status, unsolved.score) == (EvalStatus.ok, 0.0), unsolved.detail


def test_nl2repo_partly_solved_scores_the_fraction(tmp_path):
    query = _query("nl2repo", "nl2repo", "mathkit")
    ws = workspace(FIXTURES / "nl2repo" / "mathkit", tmp_path / "a")
    (ws / "mathkit" / "arith.py").write_text((ws / "mathkit" / "arith.py").read_text().replace("a * b", "a + b"))
    score = evaluate_query(query, ws, tmp_path / "e", "p", timeout_s=120)
    assert score.status is EvalStatus.ok and 0.0 < score.score < 1.0, score.detail


def test_standard_installer_scripts_are_unscorable_here_not_zero(tmp_path):
    for fmt, directory, task in (("terminal-bench", "terminal_bench", "csv-rows"), ("harbor", "harbor", "count-lines")):
        query = _query(fmt, directory, task)
        ws = workspace(FIXTURES / directory / task, tmp_path / task)
        score = evaluate_query(query, ws, tmp_path / f"e-{task}", task, timeout_s=60)
        assert (score.status, score.score) == (EvalStatus.error, None), score.detail
        # astral.sh's uv installer: stood in for only in the task's own container with the index (uv_installer)
        assert "unscorable here" in score.detail and "uv-installer:" in score.detail


def test_harbor_json_reward_with_its_own_workdir(tmp_path):
    query = _query("harbor", "harbor", "json-report")
    solved = evaluate_query(query, workspace(FIXTURES / "harbor" / "json-report", tmp_path / "a"), tmp_path / "e1",
                            "s", timeout_s=60)
    assert (solved.status, solved.score) == (EvalStatus.ok, 1.0), solved.detail
    unsolved = evaluate_query(query, workspace(FIXTURES / "harbor" / "json-report", tmp_path / "b", solved=False),
                              tmp_path / "e2", "u", timeout_s=60)
    assert (unsolved.status, unsolved.score) == (EvalStatus.ok, 0.0), unsolved.detail


def test_r2e_upstream_keys_solved_and_unsolved(tmp_path):
    root = tmp_path / "r2e"
    build_r2e(root)
    queries, malformed = load_benchmark_report("r2e", root)
    assert len(malformed) == 1
    (query,) = queries
    unsolved = tmp_path / "u"
    shutil.copytree(query.start_dir, unsolved, symlinks=True)
    solved = tmp_path / "s"
    shutil.copytree(query.start_dir, solved, symlinks=True)
    shutil.copytree(FIXTURES / "r2e" / "solution", solved, dirs_exist_ok=True)
    good = evaluate_query(query, solved, tmp_path / "e1", "s", timeout_s=120)
    assert (good.status, good.score) == (EvalStatus.ok, 1.0), good.detail
    bad = evaluate_query(query, unsolved, tmp_path / "e2", "u", timeout_s=120)
    assert (bad.status, bad.score) == (EvalStatus.ok, 0.0), bad.detail


def _r2e_needing(tmp_path, module: str):
    """The R2E fixture, its hidden tests importing `module` as aiohttp's import `multidict` (a real R2E-Gym
    instance, hash-verified against R2E-Gym-Subset, scored its gold patch 0.0 here: the instance's image holds
    the repository's dependencies, gyre's environment does not)."""
    root = tmp_path / "r2e"
    build_r2e(root)
    (test,) = root.glob("hidden_tests/*/r2e_tests/test_1.py")
    test.write_text(f"import {module}\n" + test.read_text())
    queries, _ = load_benchmark_report("r2e", root)
    (query,) = queries
    solved = tmp_path / "s"
    shutil.copytree(query.start_dir, solved, symlinks=True)
    shutil.copytree(FIXTURES / "r2e" / "solution", solved, dirs_exist_ok=True)
    return query, solved


def test_an_r2e_instance_whose_environment_lacks_what_its_tests_import_is_unscorable_not_zero(tmp_path):
    query, solved = _r2e_needing(tmp_path, "multidict")
    score = evaluate_query(query, solved, tmp_path / "e1", "s", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.error, None), score.detail
    assert "lacks multidict" in score.detail and "starting files too" in score.detail


def test_a_module_of_the_repository_the_workspace_removed_is_its_own_zero(tmp_path):
    query, solved = _r2e_needing(tmp_path, "toylib")  # the repository's own package: the workspace deletes it
    shutil.rmtree(solved / "toylib")
    score = evaluate_query(query, solved, tmp_path / "e1", "s", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    # a top-level package of the repository may be the environment's gap (Pillow's unbuilt PIL): the control run
    # decides, and finds it importable from the starting files: the 0 stands
    assert (tmp_path / "e1" / "control").exists()


def test_a_repository_package_the_environment_cannot_import_on_the_starting_files_either_is_unscorable(tmp_path):
    """Pillow's tests import `PIL`, which its `src/PIL` holds as source only (the instance's image builds it): a
    real R2E-Gym gold patch scored 0.0 "ok" here before (docs/results/r2e-bundles-local-gold-pillow-4bc6483.json)."""
    query, solved = _r2e_needing(tmp_path, "srcpkg")
    for root in (query.start_dir, solved):  # in the repository, not importable from its root
        (root / "src" / "srcpkg").mkdir(parents=True)
        (root / "src" / "srcpkg" / "__init__.py").write_text("VALUE = 1\n")
    score = evaluate_query(query, solved, tmp_path / "e1", "s", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.error, None), score.detail
    assert "lacks srcpkg" in score.detail and "starting files too" in score.detail


def test_a_submodule_the_fix_adds_is_the_workspaces_zero_not_a_gap_of_the_environment(tmp_path):
    """The hidden tests import a module of the repository's package that the fix creates: missing on the starting
    files too, but the workspace's to write: an unsolved workspace is a 0, never dropped as unscorable."""
    query, unsolved = _r2e_needing(tmp_path, "toylib.added_by_the_fix")
    score = evaluate_query(query, unsolved, tmp_path / "e1", "u", timeout_s=120)
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail
    assert environment_gaps({"toylib.added_by_the_fix", "PIL", "multidict._c"}, {"toylib", "PIL"}) == {
        "PIL", "multidict"}
