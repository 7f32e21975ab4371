"""The builtin agent's compaction and sub-agents, end to end through the real proxy.

Only the model is scripted (tests/fakes.py). The main agent spawns a sub-agent that writes
the reference solution, runs a command, compacts its context and finishes. What the proxy
recorded must then classify like a Claude Code execution: one `main`, one `main-summary`
(the compaction call ends it) and one `sub-agent` trajectory, from the agent ids the
harness sends and, with them erased, from the call stream alone.
"""

from __future__ import annotations

import json
import time

from gyre.benchmarks import generate_tiny, load_benchmark
from gyre.config.run import HarnessConfig
from gyre.evaluators.formats.nl2repo import evaluate
from gyre.harnesses import make_harness
from gyre.harnesses.base import ModelEndpoint
from gyre.harnesses.builtin import TOOLS, BuiltinHarness
from gyre.harnesses.compaction import COMPACTION_PROMPT, CONTINUATION_PREFIX
from gyre.harnesses.subagents import SPAWN_AGENT_TOOL
from gyre.records import EvalStatus, ExecutionStatus
from gyre.sandboxes.local.sandbox import LocalSandbox
from gyre.trajectories.classify import ClassifierHints, RuleClassifier
from gyre.trajectories.tokens import as_call_tokens
from gyre.trajectories.tree import build_tree
from tests.fakes import ScriptedEngine, serve_proxy

REPORT = ("I wrote the module with every function the task asks for, checked that it imports cleanly and "
          "left the tests untouched. ") * 6
SUMMARY = ("Summary so far: a sub-agent wrote the module with the reference solution and it imports cleanly; "
           "listing the repository showed the new file next to the starting files. Left to do: finish.")

# Summaries differ, as real ones do: two equal fresh contexts would be one prompt re-sent.
LATER_SUMMARIES = (
    "Progress report: the module exists and was written by a sub-agent, whose report says it imports. "
    "Nothing else was changed. Next step: decide whether another check is needed.",
    "Where things stand: a second sub-agent could not be started because the budget is spent; "
    "the module from the first one is in place. Next step: stop.",
)


def _tool_call(name: str, **arguments) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _execute(tmp_path, tokenizer, name, harness, replies_for):
    root = generate_tiny(tmp_path / f"bench-{name}", num_queries=1, seed=3)
    query = load_benchmark("nl2repo", root, "tiny")[0]
    reference = next((query.root / "reference").iterdir())
    engine = ScriptedEngine(tokenizer, replies_for(reference.name, reference.read_text()))
    server, sessions, _ = serve_proxy([engine], tokenizer)
    key = sessions.mint("exec")
    sandbox = LocalSandbox.create(query, tmp_path / f"ws-{name}", env={"OPENAI_API_KEY": key})
    try:
        outcome = harness.run(query, sandbox, ModelEndpoint(server.base_url, key, "tiny"), time.monotonic() + 60)
    finally:
        sandbox.close()
        server.stop()
    return query, outcome, sessions.close("exec").calls, sandbox, engine


def _script(file: str, solution: str) -> list[str]:
    return [
        _tool_call("spawn_agent", task=f"Write {file} so that the task's tests pass."),  # main
        _tool_call("write_file", path=file, content=solution),  # sub-1
        _tool_call("finish", summary=REPORT),  # sub-1: its report is main's tool result
        _tool_call("run_shell", command="ls"),  # main; its context now passes the threshold
        SUMMARY,  # main's compaction call
        _tool_call("finish", summary="done"),  # main, in the fresh context
    ]


def _context(call) -> int:
    return len(call.prompt_ids) + len(call.output_ids)


def test_compaction_and_a_sub_agent_make_main_summary_and_sub_agent_trajectories(tmp_path, tiny_tokenizer):
    # Pass 1, no compaction: measure each context, to put the threshold where only main's
    # second call reaches it (the token counts depend on the tokenizer, not on this test).
    _, _, plain, _, _ = _execute(tmp_path, tiny_tokenizer, "measure",
                                 BuiltinHarness(max_turns=4, max_sub_agents=1), _script)
    main_1, sub_1, sub_2, main_2 = (_context(c) for c in plain[:4])
    threshold = main_2
    assert max(main_1, sub_1, sub_2) < threshold

    harness = make_harness(HarnessConfig(max_turns=4, max_sub_agents=1, compaction_threshold_tokens=threshold))
    query, outcome, calls, sandbox, engine = _execute(tmp_path, tiny_tokenizer, "tree", harness, _script)

    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    assert len(calls) == 6 and {c.execution_id for c in calls} == {"exec"}  # one key, every call recorded
    assert [c.agent_id for c in calls] == ["main", "sub-1", "sub-1", "main", "main", "main"]
    compaction_prompt = tiny_tokenizer.decode(calls[4].prompt_ids)
    assert COMPACTION_PROMPT in compaction_prompt and compaction_prompt.startswith(
        tiny_tokenizer.decode(calls[3].prompt_ids + calls[3].output_ids))  # it extends main's chain
    fresh = tiny_tokenizer.decode(calls[5].prompt_ids)
    assert CONTINUATION_PREFIX + SUMMARY in fresh and REPORT not in fresh  # only the summary survives

    tree = build_tree(as_call_tokens(calls))
    kinds = {traj.leaf_call: kind for traj, kind in zip(tree.trajectories, RuleClassifier().classify(tree))}
    assert kinds == {2: "sub-agent", 4: "main-summary", 5: "main"}
    blind = build_tree(as_call_tokens([c.model_copy(update={"agent_id": None}) for c in calls]))  # as from Claude Code
    assert sorted(RuleClassifier().classify(blind)) == ["main", "main-summary", "sub-agent"]
    marker = tuple(tiny_tokenizer(COMPACTION_PROMPT, add_special_tokens=False)["input_ids"])
    cut = build_tree(as_call_tokens(calls[:5]))  # the summary is continued by nothing: only the marker hint tells
    hinted = RuleClassifier(ClassifierHints(compaction_markers=(marker,))).classify(cut)
    assert sorted(hinted) == ["main-summary", "sub-agent"]

    score = evaluate(query, sandbox.workspace, tmp_path / "eval", "exec")
    assert score.status is EvalStatus.ok and score.score == 1.0  # the sub-agent's work is the execution's


def test_a_sub_agent_compacts_too_and_the_budget_is_enforced(tmp_path, tiny_tokenizer):
    def script(file: str, solution: str) -> list[str]:
        return [
            _tool_call("spawn_agent", task=f"Write {file}."),  # main
            _tool_call("write_file", path=file, content=solution),  # sub-1
            SUMMARY,  # sub-1's compaction (every context passes a threshold of 1 token)
            _tool_call("finish", summary=REPORT),  # sub-1, fresh context
            LATER_SUMMARIES[0],  # main's compaction
            _tool_call("spawn_agent", task="Check it again."),  # main: the budget is spent
            LATER_SUMMARIES[1],  # main's compaction
            "All done.",  # main
        ]

    harness = BuiltinHarness(max_turns=4, max_sub_agents=1, compaction_threshold_tokens=1)
    _, outcome, calls, _, engine = _execute(tmp_path, tiny_tokenizer, "sub", harness, script)
    assert outcome.status is ExecutionStatus.completed and outcome.turns == 3
    assert [c.agent_id for c in calls] == ["main", "sub-1", "sub-1", "sub-1", "main", "main", "main", "main"]
    assert "no sub-agents left" in tiny_tokenizer.decode(calls[6].prompt_ids)
    tree = build_tree(as_call_tokens(calls))
    kinds = sorted(RuleClassifier().classify(tree))
    assert kinds == ["main", "main-summary", "main-summary", "sub-agent", "sub-agent-summary"]


def test_defaults_offer_the_tools_they_always_did(tmp_path, tiny_tokenizer):
    """Compaction and sub-agents off: the requests are those of the embedded default run."""
    default = make_harness(HarnessConfig())
    assert default.main_role.tools == TOOLS and default.compaction_threshold_tokens is None
    assert make_harness(HarnessConfig(max_sub_agents=2)).main_role.tools == TOOLS + [SPAWN_AGENT_TOOL]

    def script(file: str, solution: str) -> list[str]:
        return [_tool_call("spawn_agent", task="x"), "ok"]

    _, outcome, calls, _, _ = _execute(tmp_path, tiny_tokenizer, "off", default, script)
    assert outcome.status is ExecutionStatus.completed and len(calls) == 2
    assert "unknown tool 'spawn_agent'" in tiny_tokenizer.decode(calls[1].prompt_ids)


def test_a_compacting_builtin_agent_hands_its_prompt_to_the_classifier():
    from gyre.config.run import HarnessConfig
    from gyre.harnesses.compaction import classifier_markers

    assert classifier_markers(HarnessConfig(type="builtin", compaction_threshold_tokens=512)) == [COMPACTION_PROMPT]
    assert classifier_markers(HarnessConfig(type="builtin")) == []
    assert classifier_markers(HarnessConfig(type="command", command=["true"])) == []
