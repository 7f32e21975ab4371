"""Harness timeout and overall timeout, separate as in the paper.

The harness timeout stops the agent and its workspace is scored; the overall timeout
bounds the execution with its evaluation: the agent is stopped early enough to be scored
inside it (`overall_timeout`, still scored), and an evaluation still running at the
overall deadline is an evaluator failure marked `overall_timeout`, never a zero. The
builtin agent runs against the real proxy with a scripted model; the evaluator is real.
"""

from __future__ import annotations

import json
import time

import pytest

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.config.run import RunConfig
from gyre.evaluators import evaluate_query
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.builtin import BuiltinHarness
from gyre.harnesses.timeouts import Timeouts, execution_timeouts
from gyre.records import EvalStatus, ExecutionStatus
from gyre.sandboxes.local.sandbox import LocalSandbox
from tests.fakes import ScriptedEngine, serve_proxy


def _tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_the_earlier_deadline_stops_the_harness_and_names_the_status():
    own = Timeouts(harness_s=10, overall_s=100, evaluation_reserve_s=20).start(now=0.0)
    assert (own.harness_s, own.overall_s) == (10, 100)
    assert own.status(ExecutionStatus.harness_timeout) is ExecutionStatus.harness_timeout
    cut = Timeouts(harness_s=90, overall_s=100, evaluation_reserve_s=20).start(now=0.0)
    assert (cut.harness_s, cut.overall_s) == (80, 100)  # stopped in time to be scored inside the budget
    assert cut.status(ExecutionStatus.harness_timeout) is ExecutionStatus.overall_timeout
    assert cut.status(ExecutionStatus.completed) is ExecutionStatus.completed
    assert Timeouts(harness_s=90).start(agent_timeout_s=30, now=0.0).harness_s == 30  # the format's own limit
    assert Timeouts(harness_s=90).start(now=0.0).overall_s is None


def test_the_evaluation_keeps_its_reserve_whatever_the_harness_did():
    timeouts = Timeouts(harness_s=90, overall_s=100, evaluation_reserve_s=20)
    assert timeouts.evaluation_deadline(100.0, now=75.0) == 100.0  # started in time: the overall deadline
    assert timeouts.evaluation_deadline(100.0, now=99.0) == 119.0  # the harness overran its stop at 80
    assert timeouts.evaluation_deadline(None, now=99.0) is None


def test_an_overall_budget_that_leaves_the_harness_no_time_is_a_config_error():
    config = RunConfig.model_validate({"harness": {"overall_timeout_s": 100}, "evaluator": {"timeout_s": 120}})
    with pytest.raises(ValueError, match="overall_timeout_s=100 leaves the harness no time"):
        execution_timeouts(config)
    assert execution_timeouts(RunConfig()).overall_s is None  # the default: no overall bound


def _run_slow_agent(tmp_path, tokenizer, timeouts: Timeouts):
    """The agent writes the solution, then hangs in a command: only a deadline ends it."""
    query = load_benchmark("nl2repo", generate_tiny(tmp_path / "bench", num_queries=1, seed=3), "tiny")[0]
    reference = next((query.root / "reference").iterdir())
    replies = [_tool_call("write_file", path=reference.name, content=reference.read_text()),
               _tool_call("run_shell", command="sleep 60")]
    server, sessions, _ = serve_proxy([ScriptedEngine(tokenizer, replies)], tokenizer)
    key = sessions.mint("exec")
    sandbox = LocalSandbox.create(query, tmp_path / "ws", env={"OPENAI_API_KEY": key})
    deadlines = timeouts.start()
    started = time.monotonic()
    try:
        outcome = BuiltinHarness(max_turns=4, command_timeout_s=120).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), deadlines.harness_s)
    finally:
        sandbox.close()
        server.stop()
    return query, sandbox, deadlines, deadlines.status(outcome.status), time.monotonic() - started


def test_harness_timeout_stops_the_agent_and_the_workspace_is_scored(tmp_path, tiny_tokenizer):
    query, sandbox, deadlines, status, took = _run_slow_agent(
        tmp_path, tiny_tokenizer, Timeouts(harness_s=3, overall_s=120, evaluation_reserve_s=60))
    assert status is ExecutionStatus.harness_timeout and took < 20
    score = evaluate_query(query, sandbox.workspace, tmp_path / "eval", "exec", deadline_s=deadlines.overall_s)
    assert score.status is EvalStatus.ok and score.score == 1.0


def test_overall_timeout_stops_the_agent_in_time_to_be_scored_inside_the_budget(tmp_path, tiny_tokenizer):
    query, sandbox, deadlines, status, took = _run_slow_agent(
        tmp_path, tiny_tokenizer, Timeouts(harness_s=120, overall_s=63, evaluation_reserve_s=60))
    assert status is ExecutionStatus.overall_timeout and took < 20
    score = evaluate_query(query, sandbox.workspace, tmp_path / "eval", "exec", deadline_s=deadlines.overall_s)
    assert score.status is EvalStatus.ok and score.score == 1.0
    assert time.monotonic() < deadlines.overall_s


def _hanging_workspace(tmp_path):
    """A solution whose import hangs: the test command only ends at a timeout."""
    query = load_benchmark("nl2repo", generate_tiny(tmp_path / "bench", num_queries=1, seed=3), "tiny")[0]
    reference = next((query.root / "reference").iterdir())
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / reference.name).write_text("import time\ntime.sleep(600)\n")
    return query, workspace


def test_an_evaluation_cut_by_the_overall_deadline_is_an_evaluator_failure_not_a_zero(tmp_path):
    query, workspace = _hanging_workspace(tmp_path)
    own_timeout = evaluate_query(query, workspace, tmp_path / "eval-own", "exec", timeout_s=2)
    assert own_timeout.status is EvalStatus.ok and own_timeout.score == 0.0  # a hanging solution: the agent's fault
    started = time.monotonic()
    cut = evaluate_query(query, workspace, tmp_path / "eval-cut", "exec", timeout_s=120, deadline_s=started + 2)
    assert cut.status is EvalStatus.error and cut.score is None
    # cut mid-run, or the second of the paired runs finds no time left: an evaluator failure either way
    assert cut.detail.startswith("overall_timeout: ")
    assert time.monotonic() - started < 30  # cut at the deadline (plus pytest's grace), not at 120 s
    spent = evaluate_query(query, workspace, tmp_path / "eval-late", "exec", deadline_s=time.monotonic() - 1)
    assert spent.status is EvalStatus.error and spent.detail.startswith("overall_timeout: ")
    assert json.loads((tmp_path / "eval-late" / "score.json").read_text())["status"] == "error"
