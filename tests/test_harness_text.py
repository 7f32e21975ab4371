"""The `text` harness: actions as fenced blocks, parsed, run, observed; through the real proxy.

The parser is checked on replies shaped like SmolLM2-135M-Instruct's (Markdown prose around
```python blocks, the file named in prose before the block or in a first-line comment); the
harness end to end with a scripted model (tests/fakes.py), a real sandbox and the real evaluator.
"""

from __future__ import annotations

import time

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.engines.models.hf import stop_token_ids
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.fenced_actions import RunCommand, WriteFile, parse
from gyre.harnesses.text_agent import TextHarness
from gyre.net.server_thread import ServerThread
from gyre.proxy.app import create_app
from gyre.proxy.router import EngineRouter
from gyre.proxy.sessions import SessionRegistry
from gyre.records import EvalStatus, ExecutionStatus
from gyre.sandboxes.local.sandbox import LocalSandbox
from gyre.trajectories.chains import build_trajectories
from tests.fakes import ScriptedEngine


def test_a_file_is_named_by_the_info_string_a_first_line_comment_or_the_line_before():
    reply = ("Here is a Python implementation of the `helpers.py` script:\n\n```python\ndef f():\n    return 1\n```\n"
             "```python calc.py\nX = 1\n```\n"
             "```python\n# file: pkg/util.py\nY = 2\n```\n"
             "**main.py**\n```\nprint(1)\n```\n")
    parsed = parse(reply)
    assert parsed.format_error is None and parsed.blocks == 4
    assert parsed.actions == [WriteFile("helpers.py", "def f():\n    return 1\n"), WriteFile("calc.py", "X = 1\n"),
                              WriteFile("pkg/util.py", "# file: pkg/util.py\nY = 2\n"),
                              WriteFile("main.py", "print(1)\n")]


def test_commands_run_in_order_and_unnamed_blocks_are_no_action():
    reply = "First:\n```bash\nls -la\n```\nthen some code with no file:\n```python\nprint(2)\n```\n~~~sh\necho hi\n~~~"
    parsed = parse(reply)
    assert parsed.actions == [RunCommand("ls -la"), RunCommand("echo hi")] and parsed.format_error is None


def test_code_without_an_action_is_a_format_error_and_prose_alone_is_done():
    error = parse("You can use:\n```python\ndef add(a, b):\n    return a + b\n```").format_error
    assert error and "no action" in error and "```bash" in error
    done = parse("The task is complete.")
    assert done.actions == [] and done.format_error is None and done.blocks == 0


def test_with_a_default_file_the_first_unnamed_block_writes_it_and_named_ones_keep_their_path():
    reply = ("```python\ndef f():\n    return 1\n```\nExample:\n```python\nprint(f())\n```\n"
             "other.py\n```python\nX = 2\n```")
    parsed = parse(reply, "solution.py")
    assert parsed.actions == [WriteFile("solution.py", "def f():\n    return 1\n"), WriteFile("other.py", "X = 2\n")]
    assert parse("```bash\nls\n```", "solution.py").actions == [RunCommand("ls")]


def test_paths_that_leave_the_repository_or_are_ambiguous_name_nothing():
    for line in ("`../x.py`", "/etc/passwd.txt", "Compare `a.py` with `b.py`:", "use this code"):
        assert parse(f"{line}\n```python\nx = 1\n```").actions == [], line
    # an unclosed block (a reply cut at max tokens) runs to the end
    assert parse("calc.py\n```python\nX = 1").actions == [WriteFile("calc.py", "X = 1\n")]


def _run(tmp_path, tokenizer, replies, *, max_turns=4, timeout_s=60.0, default_file=None):
    root = generate_tiny(tmp_path / "bench", num_queries=2, seed=3)
    query = load_benchmark("nl2repo", root, "tiny")[0]
    reference = next((query.root / "reference").iterdir())
    replies = [r.replace("@REFERENCE@", reference.read_text()).replace("@FILE@", reference.name) for r in replies]
    engine = ScriptedEngine(tokenizer, replies)
    sessions = SessionRegistry()
    server = ServerThread(create_app(EngineRouter([engine]), sessions, tokenizer, model_name="tiny",
                                     stop_token_ids=stop_token_ids(tokenizer))).start()
    key = sessions.mint("exec")
    sandbox = LocalSandbox.create(query, tmp_path / "ws", env={})
    try:
        default = default_file.replace("@FILE@", reference.name) if default_file else None
        outcome = TextHarness(max_turns=max_turns, default_file=default).run(
            query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + timeout_s)
    finally:
        sandbox.close()
        server.stop()
    return query, outcome, sessions.close("exec"), sandbox


def test_a_format_error_then_a_file_then_a_command_then_done_scores_and_is_one_exact_token_chain(
        tmp_path, tiny_tokenizer):
    replies = ["Sure:\n```python\nx = 1\n```",
               "@FILE@\n```python\n@REFERENCE@```",
               "```bash\nls\n```",
               "Done."]
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, replies)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 4
    assert len(session.calls) == 4
    prompts = [tiny_tokenizer.decode(c.prompt_ids) for c in session.calls]
    assert "Format error" in prompts[1]
    assert "<returncode>0</returncode>" in prompts[2]
    reference_name = next((query.root / "reference").iterdir()).name
    assert f"<output>\n{reference_name}\n</output>" in prompts[3]  # what `ls` printed came back
    (traj,) = build_trajectories(session.calls)  # every reply spliced back as sampled: one chain
    assert sum(traj.trainable) == sum(len(c.output_ids) for c in session.calls)
    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.status is EvalStatus.ok and score.score == 1.0


def test_a_write_outside_the_workspace_is_an_error_for_the_model_and_turns_run_out(tmp_path, tiny_tokenizer):
    replies = ["`sub/x.py`\n```python\nx = 1\n```", "```bash\nexit 3\n```", "```bash\nexit 4\n```"]
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, replies, max_turns=3)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    assert (sandbox.workspace / "sub" / "x.py").read_text() == "x = 1\n"
    assert "<returncode>3</returncode>" in tiny_tokenizer.decode(session.calls[2].prompt_ids)


def test_a_text_harness_config_whose_answer_budget_cannot_hold_a_solution_is_refused_before_any_step(
        tmp_path, tiny_model_dir, tiny_tokenizer):
    import pytest

    from gyre.config.run import RunConfig
    from gyre.runtime.resolve import check_answer_budget, resolve_queries

    config = RunConfig.model_validate({"cache_dir": str(tmp_path), "harness": {"type": "text"},
                                       "model": {"path": str(tiny_model_dir)},
                                       "rollout": {"max_new_tokens": 8}, "benchmark": {"num_queries": 8}})
    split = resolve_queries(config)
    with pytest.raises(ValueError, match=r"rollout.max_new_tokens 8 cannot fit the reference solution of q\d{4}-"):
        check_answer_budget(config, split, tiny_tokenizer)
    roomy = config.model_copy(update={"rollout": config.rollout.model_copy(update={"max_new_tokens": 96})})
    check_answer_budget(roomy, split, tiny_tokenizer)


def test_the_format_follows_the_task_and_a_default_file_takes_the_reply_s_code(tmp_path, tiny_tokenizer):
    query, outcome, session, sandbox = _run(tmp_path, tiny_tokenizer, ["```python\n@REFERENCE@```", "Done."],
                                            default_file="@FILE@")
    assert outcome.turns == 2
    first = tiny_tokenizer.decode(session.calls[0].prompt_ids)
    assert "complete code of the file in one ```python block" in first
    assert first.index(query.instruction) < first.index("```python block")
    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.status is EvalStatus.ok and score.score == 1.0


def test_a_single_file_tiny_set_names_one_module_and_is_otherwise_the_same_set(tmp_path):
    from gyre.benchmarks.tiny_tasks import tiny_task

    one = load_benchmark("nl2repo", generate_tiny(tmp_path / "one", num_queries=14, seed=0, module="solution"), "t")
    assert all("`solution.py`" in q.instruction for q in one)
    for i in range(14):
        drawn, fixed = tiny_task(0, i), tiny_task(0, i, "solution")
        assert fixed.instruction == drawn.instruction.replace(f"`{drawn.module}.py`", "`solution.py`")
        same = tuple(t.replace(f"{drawn.module}.", "solution.") for t in drawn.tests)
        assert fixed.tests == same and fixed.kind == drawn.kind
