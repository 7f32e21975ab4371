"""The builtin harness end to end: proxy over HTTP, a real sandbox, the real evaluator.

Only the model is scripted (tests/fakes.py), so what the agent does is known: it writes
the reference solution of a generated tiny query, runs a command, and finishes.
"""

from __future__ import annotations

import json
import time

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.engines.models.hf import stop_token_ids
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.builtin import BuiltinHarness
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.records import EvalStatus, ExecutionStatus
from gyre.sandboxes.local.sandbox import LocalSandbox
from gyre.trajectories.chains import build_trajectories
from tests.fakes import ScriptedEngine


def _tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _run(tmp_path, tokenizer, replies, *, max_turns=6, timeout_s=60.0):
    root = generate_tiny(tmp_path / "bench", num_queries=2, seed=3)
    query = load_benchmark("nl2repo", root, "tiny")[0]
    reference = next((query.root / "reference").iterdir())
    # the placeholders sit inside JSON strings: substitute JSON-escaped text
    solution = json.dumps(reference.read_text())[1:-1]
    replies = [r.replace("@REFERENCE@", solution).replace("@FILE@", reference.name) for r in replies]
    engine = ScriptedEngine(tokenizer, replies)
    sessions = SessionRegistry()
    server = ServerThread(create_app(EngineRouter([engine]), sessions, tokenizer, model_name="tiny",
                                     stop_token_ids=stop_token_ids(tokenizer))).start()
    key = sessions.mint("exec")
    sandbox = LocalSandbox.create(query, tmp_path / "ws", env={"OPENAI_API_KEY": key})
    try:
        outcome = BuiltinHarness(max_turns=max_turns).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + timeout_s)
    finally:
        sandbox.close()
        server.stop()
    return query, outcome, sessions.close("exec"), sandbox


def test_agent_writes_a_solution_that_scores_full_marks(tmp_path, tiny_tokenizer):
    replies = [
        _tool_call("write_file", path="@FILE@", content="@REFERENCE@"),
        _tool_call("run_shell", command="ls; echo $OPENAI_API_KEY | cut -c1-5"),
        _tool_call("finish", summary="done"),
    ]
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, replies)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    assert len(session.calls) == 3
    (traj,) = build_trajectories(session.calls)  # the tool loop is one exact-token chain
    assert sum(traj.trainable) == sum(len(c.output_ids) for c in session.calls)
    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.status is EvalStatus.ok and score.score == 1.0


def test_bad_tool_arguments_go_back_to_the_model_and_silence_ends_the_run(tmp_path, tiny_tokenizer):
    replies = [_tool_call("write_file", path="../escape.py", content="x"), _tool_call("nope"), "I am done."]
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, replies)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    assert not (tmp_path / "escape.py").exists()
    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.status is EvalStatus.ok and score.score == 0.0  # nothing written: a valid zero


def test_harness_deadline_ends_the_execution_and_keeps_the_workspace(tmp_path, tiny_tokenizer):
    replies = [_tool_call("write_file", path="@FILE@", content="@REFERENCE@"),
               _tool_call("run_shell", command="sleep 30")]
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, replies, timeout_s=3.0)
    assert outcome.status is ExecutionStatus.harness_timeout
    assert any(sandbox.workspace.iterdir())
    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.score == 1.0  # the partial artifact is still scored


def test_a_command_stopped_at_a_limit_tells_the_model_which():
    """A command the sandbox stopped for a limit (the workspace past `max_workspace_bytes`) is not silent: the
    model reads why, as it reads a timeout."""
    import time

    from gyre.harnesses.builtin_tools import run_sandbox_tool
    from gyre.sandboxes.base import ExecResult

    class Stopped:
        def exec(self, command, timeout_s):
            return ExecResult(-9, "", "", False, 0.5, "disk limit: writable directories hold more than 8 bytes")

    text = run_sandbox_tool(Stopped(), "run_shell", {"command": "yes > f"}, time.monotonic() + 60, 10)
    assert text.startswith("exit code -9 (stopped: disk limit: writable directories hold more than 8 bytes)")
