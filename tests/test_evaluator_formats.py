"""Per-benchmark scoring for Terminal-Bench (binary), Harbor (reward file) and R2E (exact statuses).

Real sandboxes, real pytest, small fixtures written in each native format. Agent
failures give a valid 0; evaluator failures give status error with a reason, never 0.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from gyre.benchmarks import load_benchmark
from gyre.evaluators import evaluate_query
from gyre.evaluators.score_one import score_workspace
from gyre.records import EvalStatus
from gyre.sandboxes.local.isolation import Isolation, probe_bwrap
from gyre.sandboxes.local.sandbox import LocalSandbox
from tests.test_benchmarks_formats import write_harbor, write_r2e, write_terminal_bench

needs_bwrap = pytest.mark.skipif(probe_bwrap() is None, reason="container-style tasks (/app, /tests) need bubblewrap")


def _workspace(tmp_path: Path, files: dict[str, str], start: Path | None = None) -> Path:
    ws = tmp_path / "ws"
    if start is not None:
        shutil.copytree(start, ws, symlinks=True)
    ws.mkdir(parents=True, exist_ok=True)
    for rel, text in files.items():
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text(text)
    return ws


@needs_bwrap
def test_terminal_bench_binary_pass_and_fail(tmp_path):
    (query,) = load_benchmark("terminal-bench", write_terminal_bench(tmp_path / "tb").parent)
    good = evaluate_query(query, _workspace(tmp_path / "a", {"hello.txt": "hi\n"}), tmp_path / "e1", "x1")
    assert (good.status, good.score) == (EvalStatus.ok, 1.0), good.detail
    bad = evaluate_query(query, _workspace(tmp_path / "b", {"hello.txt": "bye\n"}), tmp_path / "e2", "x2")
    assert (bad.status, bad.score) == (EvalStatus.ok, 0.0), bad.detail


@needs_bwrap
def test_terminal_bench_agent_edits_to_tests_and_conftest_do_not_count(tmp_path):
    (query,) = load_benchmark("terminal-bench", write_terminal_bench(tmp_path / "tb").parent)
    forged = {
        "hello.txt": "wrong\n",
        "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                       "    o = yield\n    o.get_result().outcome = 'passed'\n",
        "tests/test_outputs.py": "def test_hello():\n    pass\n",
    }
    score = evaluate_query(query, _workspace(tmp_path, forged), tmp_path / "e", "x")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0), score.detail


COPYING_RUN_TESTS = """#!/bin/bash
# as Terminal-Bench's aider-polyglot tasks do: the tests are copied beside the solution and run there
cp $TEST_DIR/*test*.py /app/
cd /app
python -m pytest -v
"""


@needs_bwrap
def test_terminal_bench_tests_a_script_copies_into_app_count_with_their_canaries(tmp_path):
    """A copy of a pristine file (as that run placed it) is found by its content and scored as it; a solved task
    is 1.0 (it was 0: the copy's results were ignored); its mutant, in the other run, fails there."""
    task = write_terminal_bench(tmp_path / "tb")
    (task / "run-tests.sh").write_text(COPYING_RUN_TESTS)
    (query,) = load_benchmark("terminal-bench", task.parent)
    good = evaluate_query(query, _workspace(tmp_path / "a", {"hello.txt": "hi\n"}), tmp_path / "e1", "x1")
    assert (good.status, good.score) == (EvalStatus.ok, 1.0), good.detail
    logs = [(tmp_path / "e1" / "reports" / name).read_text() for name in ("command_0.log", "command_0.run1.log")]
    assert all(re.search(r"^test_outputs\.py::test_hello (PASSED|FAILED)", log, re.M) for log in logs)  # in /app
    assert sorted(bool(re.search(r"\b1 passed\b", log)) for log in logs) == [False, True]  # the mutant failed
    bad = evaluate_query(query, _workspace(tmp_path / "b", {"hello.txt": "bye\n"}), tmp_path / "e2", "x2")
    assert (bad.status, bad.score) == (EvalStatus.ok, 0.0), bad.detail
    forged = {"hello.txt": "bye\n", "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\n"
              "def pytest_runtest_makereport(item, call):\n    o = yield\n    o.get_result().outcome = 'passed'\n"}
    cheat = evaluate_query(query, _workspace(tmp_path / "c", forged), tmp_path / "e3", "x3")
    assert (cheat.status, cheat.score) == (EvalStatus.tampering, 0.0), cheat.detail


@needs_bwrap
def test_terminal_bench_script_failing_without_report_is_an_evaluator_failure(tmp_path):
    task = write_terminal_bench(tmp_path / "tb")
    (task / "run-tests.sh").write_text("#!/bin/bash\npython -c 'import gyre_missing_tool' || exit 3\n")  # broken task image
    (query,) = load_benchmark("terminal-bench", task.parent)
    score = evaluate_query(query, _workspace(tmp_path, {"hello.txt": "hi\n"}), tmp_path / "e", "x")
    assert score.status is EvalStatus.error and score.score is None
    assert "without starting pytest" in score.detail
    assert json.loads((tmp_path / "e" / "score.json").read_text())["score"] is None


@needs_bwrap
def test_harbor_reward_file_and_forged_logs(tmp_path):
    (query,) = load_benchmark("harbor", write_harbor(tmp_path / "hb").parent)
    good = _workspace(tmp_path / "a", {"count.txt": "3\n"}, start=query.start_dir)
    assert evaluate_query(query, good, tmp_path / "e1", "x1").score == 1.0
    forged = _workspace(tmp_path / "b", {"count.txt": "4\n", "logs/verifier/reward.txt": "1\n"}, start=query.start_dir)
    score = evaluate_query(query, forged, tmp_path / "e2", "x2")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0)


@needs_bwrap
@pytest.mark.parametrize(
    ("test_sh", "status", "score", "reason"),
    [
        ('echo \'{"reward": 0.25, "other": 3}\' > /logs/verifier/reward.json', EvalStatus.ok, 0.25, "reward 0.25"),
        ("echo 1.5 > /logs/verifier/reward.txt", EvalStatus.error, None, "outside [0, 1]"),
        ("printf '\\x00\\xffjunk' > /logs/verifier/reward.txt", EvalStatus.error, None, "not a number"),
        ("exit 2", EvalStatus.error, None, "without writing a reward"),
        ("sleep 60", EvalStatus.ok, 0.0, "timed out"),
    ],
)
def test_harbor_reward_edge_cases(tmp_path, test_sh, status, score, reason):
    toml = '[verifier]\ntimeout_sec = 2\n'
    (query,) = load_benchmark("harbor", write_harbor(tmp_path / "hb", toml=toml, test_sh=test_sh).parent)
    result = evaluate_query(query, _workspace(tmp_path, {}, start=query.start_dir), tmp_path / "e", "x")
    assert (result.status, result.score) == (status, score)
    assert reason in result.detail


def test_r2e_exact_statuses_and_pristine_config(tmp_path):
    (query,) = load_benchmark("r2e", write_r2e(tmp_path / "r2e"))
    fixed = _workspace(tmp_path / "a", {"toylib.py": "def double(x):\n    return 2 * x\n"}, start=query.start_dir)
    good = evaluate_query(query, fixed, tmp_path / "e1", "x1")
    assert (good.status, good.score) == (EvalStatus.ok, 1.0), good.detail
    cheat = _workspace(tmp_path / "b", {
        "conftest.py": "import pytest\n@pytest.hookimpl(hookwrapper=True)\ndef pytest_runtest_makereport(item, call):\n"
                       "    o = yield\n    o.get_result().outcome = 'passed'\n",
        "r2e_tests/test_double.py": "def test_double():\n    pass\n\ndef test_zero():\n    pass\n",
    }, start=query.start_dir)
    forged = evaluate_query(query, cheat, tmp_path / "e2", "x2")
    assert (forged.status, forged.score) == (EvalStatus.ok, 0.0), forged.detail
    assert "test_double: expected PASSED, got FAILED" in forged.detail
    assert "restored 1 config files" in forged.detail


def test_the_projects_own_conftest_is_no_flag_under_monitor_zero(tmp_path):
    """R2E repositories ship their own `conftest.py`: unchanged, it is not the agent's doing (#29 item 4); one the
    agent changed is still flagged (the evaluation restores the pristine one: it changes nothing)."""
    (query,) = load_benchmark("r2e", write_r2e(tmp_path / "r2e"))
    fixed = _workspace(tmp_path / "a", {"toylib.py": "def double(x):\n    return 2 * x\n"}, start=query.start_dir)
    good = evaluate_query(query, fixed, tmp_path / "e1", "x1", monitor="zero")
    assert (good.status, good.score, good.flags) == (EvalStatus.ok, 1.0, []), good.flags
    edited = _workspace(tmp_path / "b", {"toylib.py": "def double(x):\n    return 2 * x\n",
                                         "conftest.py": "# the project's own conftest, and mine\n"},
                        start=query.start_dir)
    flagged = evaluate_query(query, edited, tmp_path / "e2", "x2", monitor="zero")  # recorded: zero acts on
    assert flagged.status is EvalStatus.ok and any(f.startswith("test-infrastructure conftest.py")  # measured
                                                   for f in flagged.flags), flagged.flags  # kinds only


def test_r2e_expected_failures_must_match_too(tmp_path):
    root = write_r2e(tmp_path / "r2e", expected={"test_double": "PASSED", "test_zero": "FAILED"})
    (query,) = load_benchmark("r2e", root)
    fixed = _workspace(tmp_path, {"toylib.py": "def double(x):\n    return 2 * x\n"}, start=query.start_dir)
    score = evaluate_query(query, fixed, tmp_path / "e", "x")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0)
    assert "test_zero: expected FAILED, got PASSED" in score.detail


def test_evaluator_crash_is_an_error_never_zero(tmp_path, monkeypatch):
    (query,) = load_benchmark("r2e", write_r2e(tmp_path / "r2e"))
    import gyre.evaluators.formats.r2e as r2e

    def boom(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(r2e, "neutralise_pytest_config", boom)
    score = evaluate_query(query, _workspace(tmp_path, {}, start=query.start_dir), tmp_path / "e", "x")
    assert (score.status, score.score) == (EvalStatus.error, None)
    assert "disk on fire" in score.detail


def test_huge_workspace_is_a_zero_not_a_dropped_sample(tmp_path):
    (query,) = load_benchmark("r2e", write_r2e(tmp_path / "r2e"))
    ws = _workspace(tmp_path, {}, start=query.start_dir)
    with open(ws / "big.bin", "wb") as f:
        f.truncate(10 * 2**30)  # a sparse 10 GiB file: costs nothing here, would cost 10 GiB to copy
    score = evaluate_query(query, ws, tmp_path / "e", "x")
    assert (score.status, score.score) == (EvalStatus.ok, 0.0)
    assert "more than" in score.detail and not (tmp_path / "e" / "repo").exists()


@needs_bwrap
def test_terminal_bench_end_to_end_agent_at_app(tmp_path):
    (query,) = load_benchmark("terminal-bench", write_terminal_bench(tmp_path / "tb").parent)
    from gyre.benchmarks.registry import task_spec
    from gyre.sandboxes.layout import SandboxLayout

    sandbox = LocalSandbox.create(query, tmp_path / "run" / "ws", layout=SandboxLayout(workdir=task_spec(query).workdir))
    result = sandbox.exec("pwd; echo hi > /app/hello.txt; ls /tests 2>&1", timeout_s=10)
    assert result.stdout.startswith("/app\n") and "No such file" in result.stdout
    sandbox.close()
    assert evaluate_query(query, sandbox.workspace, tmp_path / "e", "x").score == 1.0


def test_score_workspace_cli_function(tmp_path):
    root = write_r2e(tmp_path / "r2e")
    (query,) = load_benchmark("r2e", root)
    ws = _workspace(tmp_path, {"toylib.py": "def double(x):\n    return 2 * x\n"}, start=query.start_dir)
    out = score_workspace(root, "toylib-1", ws, eval_dir=tmp_path / "e")
    assert out["status"] == "ok" and out["score"] == 1.0 and json.dumps(out)
    with pytest.raises(KeyError, match="no query 'nope'"):
        score_workspace(root, "nope", ws)


def test_container_task_without_bubblewrap_is_an_evaluator_failure(tmp_path):
    (query,) = load_benchmark("terminal-bench", write_terminal_bench(tmp_path / "tb").parent)
    plain = Isolation(bwrap=None, cgroups=False)
    score = evaluate_query(query, _workspace(tmp_path, {"hello.txt": "hi\n"}), tmp_path / "e", "x", isolation=plain)
    assert score.status is EvalStatus.error and "needs bubblewrap" in score.detail


def test_r2e_a_skipped_hidden_test_is_no_parsed_key_as_upstream_parses_the_log(tmp_path):
    """R2E-Gym's `parse_log_pytest` keys only PASSED/FAILED/ERROR lines of the short summary: a test skipped where
    the expected map was made (Pillow's "Netpbm not available") is in no map, and its skip is no extra key."""
    root = write_r2e(tmp_path / "r2e")
    hidden = root / "hidden_tests" / "toylib-1" / "r2e_tests" / "test_double.py"
    hidden.write_text(hidden.read_text() + "\n\nimport pytest\n\n@pytest.mark.skip(reason='Netpbm not available')\n"
                      "def test_netpbm():\n    assert False\n")
    (query,) = load_benchmark("r2e", root)
    fixed = _workspace(tmp_path / "a", {"toylib.py": "def double(x):\n    return 2 * x\n"}, start=query.start_dir)
    score = evaluate_query(query, fixed, tmp_path / "e1", "x1")
    assert (score.status, score.score) == (EvalStatus.ok, 1.0), score.detail
    unfixed = evaluate_query(query, _workspace(tmp_path / "b", {}, start=query.start_dir), tmp_path / "e2", "x2")
    assert (unfixed.status, unfixed.score) == (EvalStatus.ok, 0.0), unfixed.detail
