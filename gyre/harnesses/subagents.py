"""Sub-agents of the builtin agent: the `spawn_agent` tool, the sub-agent's role, the budget.

Why: Claude Code hands self-contained sub-tasks to sub-agents (its Task tool); each runs
in its own fresh context with its own system prompt, and only its final report comes
back to the main agent as the tool result. One execution thereby holds the main agent's
trajectory and one trajectory per sub-agent, trained with lower rank (`sub-agent`,
`sub-agent-summary` when it compacted). The builtin agent does the same so those call
streams come from a harness gyre controls:

    main  [MAIN system, tools + spawn_agent, task]        -> spawn_agent(task=T)
    sub   [SUB system, tools, T]                          -> write_file(...)
    sub   [SUB system, tools, T, out, result]             -> finish(summary=R)
    main  [MAIN system, tools + spawn_agent, task, out, R] -> ...

Sub-agents use the same sandbox, proxy, execution key and harness deadline as the main
agent, with agent id `sub-<n>`; they get the sandbox tools but not `spawn_agent` (one
level, as in Claude Code), and may compact like any agent. `max_sub_agents` bounds how
many one execution spawns; the tool is offered only when it is above 0, so a run with
sub-agents off sends exactly the prompts it sent before they existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SPAWN_AGENT = "spawn_agent"
MAIN_AGENT_ID = "main"

SUB_AGENT_SYSTEM_PROMPT = (
    "You are a sub-agent working in a repository on one sub-task for another agent. Use the tools, then "
    "call finish with a short report of what you did and found; the report is all the other agent sees."
)

SPAWN_AGENT_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": SPAWN_AGENT,
        "description": "Hand a self-contained sub-task to a sub-agent with a fresh context; returns its report",
        "parameters": {
            "type": "object",
            "properties": {"task": {"type": "string"}},
            "required": ["task"],
        },
    },
}


@dataclass
class SubAgentBudget:
    """How many sub-agents this execution may still spawn; hands out their agent ids."""

    limit: int
    spawned: int = 0

    def take(self) -> str | None:
        """The next sub-agent's id, or None when the budget is spent."""
        if self.spawned >= self.limit:
            return None
        self.spawned += 1
        return f"sub-{self.spawned}"


def no_report(agent_id: str, turns: int) -> str:
    return f"{agent_id} stopped after {turns} turns without a report"
