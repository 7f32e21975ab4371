"""Context compaction of the builtin agent, done the way Claude Code does it.

Why: a long execution outgrows any context window, so deployed harnesses compact: past
a token threshold the agent asks the model to summarise the conversation so far, then
continues in a fresh context that holds only its system prompt, its tools and that
summary. One execution thereby produces several trajectories, and gyre must train on
them as such (DESIGN.md: main > main-summary > ...). The builtin agent compacts for real
so the trajectory processor sees, from a harness gyre controls, the same call shapes it
sees from Claude Code:

    call k      [system, tools, task, ..., tool result]          -> next action
    compaction  [system, tools, task, ..., tool result, COMPACTION_PROMPT] -> summary
    call k+1    [system, tools, CONTINUATION_PREFIX + summary + task]      -> next action

The compaction call extends the agent's chain (its trajectory ends in the summary: a
`main-summary`, or `sub-agent-summary` for a sub-agent); call k+1 is a fresh context that
shares the system prompt and tools and carries the summary right after them, which is
what `gyre.trajectories.classify` looks for (rule b). The prompt text is also a
classifier hint: the coordinator adds `classifier_markers(harness config)` to
`trajectories.compaction_markers`, so a compaction that ends an execution is found too.

When: before a turn, if the context after the previous call (prompt + output tokens, as
the proxy reported in `usage`) reached `threshold_tokens`. Tool results added since are
not counted; a threshold a little below the model's context leaves room for them.
"""

from __future__ import annotations

import json
from typing import Any

from gyre.harnesses.model_client import ModelClient

COMPACTION_PROMPT = (
    "Your context is nearly full. Write a summary of this conversation for yourself to continue from: "
    "the task, what you did, the files you wrote or changed, what worked, what failed and what is left "
    "to do. Answer with the summary only, no tool call."
)
CONTINUATION_PREFIX = (
    "This session is being continued from a previous conversation that ran out of context. "
    "The conversation is summarized below:\n"
)
TASK_HEADER = "\n\nThe task, as first given:\n"


def classifier_markers(harness_config) -> list[str]:
    """Compaction markers the run should give the trajectory classifier for this harness:
    the builtin agent's own compaction prompt when it compacts, else none."""
    if harness_config.type == "builtin" and harness_config.compaction_threshold_tokens:
        return [COMPACTION_PROMPT]
    return []


def due(context_tokens: int, threshold_tokens: int | None) -> bool:
    return threshold_tokens is not None and context_tokens >= threshold_tokens


def summary_text(message: dict[str, Any]) -> str:
    """The summary in the model's answer; a tool call it made instead is kept as its JSON text."""
    content = message.get("content")
    if isinstance(content, str) and content.strip():
        return content
    calls = [tc.get("function", {}) for tc in message.get("tool_calls") or []]
    return json.dumps(calls) if calls else ""


def compact(
    client: ModelClient,
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    agent_id: str,
    task: str,
    deadline_s: float,
) -> list[dict[str, Any]] | None:
    """Ask for a summary; the fresh context to continue in, or None when out of time.

    The request keeps the agent's tools so its prompt extends the agent's own chain."""
    request = [*messages, {"role": "user", "content": COMPACTION_PROMPT}]
    response = client.chat(request, tools, agent_id, deadline_s)
    if response is None:
        return None
    summary = summary_text(response["choices"][0]["message"])
    return [messages[0], {"role": "user", "content": CONTINUATION_PREFIX + summary + TASK_HEADER + task}]
