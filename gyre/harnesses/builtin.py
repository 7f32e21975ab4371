"""The builtin reference agent: an OpenAI tool-calling loop over a sandbox.

It is what `make run` drives and what CI exercises end to end: each turn it sends the whole
conversation to the proxy with its tools (run a shell command, write a file, finish;
`builtin_tools.py`), executes the tool calls it gets back inside the sandbox, and appends
the results. It stops when the model calls `finish`, answers without a tool call, runs out
of turns, or the harness deadline passes (the workspace is kept either way).

Like Claude Code, and so that its trajectory trees branch like Claude Code's, it can
- compact: past `compaction_threshold_tokens` of context, ask for a summary and continue
  in a fresh context (`compaction.py`);
- spawn sub-agents: with `max_sub_agents` > 0 the main agent gets a `spawn_agent` tool
  that runs a sub-agent loop (own system prompt, fresh context) and returns its report
  (`subagents.py`).
Both are off by default. Every call of every agent goes through the same proxy with the
same execution key (`model_client.py`), each naming its agent in a header.

`turns` in the outcome counts the main agent's turns; a sub-agent's turns are bounded by
`sub_agent_max_turns`, and compaction requests count as no turn (there is at most one
before each turn).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gyre.harnesses.base import ExecutionSlot, HarnessOutcome, ModelEndpoint
from gyre.harnesses.builtin_tools import FINISH, TOOLS, parse_arguments, run_sandbox_tool
from gyre.harnesses.compaction import compact, due
from gyre.harnesses.model_client import ModelClient, context_tokens
from gyre.harnesses.subagents import (
    MAIN_AGENT_ID,
    SPAWN_AGENT,
    SPAWN_AGENT_TOOL,
    SUB_AGENT_SYSTEM_PROMPT,
    SubAgentBudget,
    no_report,
)
from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox

__all__ = ["SYSTEM_PROMPT", "TOOLS", "BuiltinHarness"]

SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. Use the tools to create and test files. "
    "Call finish when the task is done."
)


@dataclass(frozen=True)
class AgentRole:
    agent_id: str
    system_prompt: str
    tools: list[dict[str, Any]]
    max_turns: int


@dataclass
class AgentResult:
    status: ExecutionStatus  # completed or harness_timeout
    turns: int
    report: str


@dataclass
class _Run:
    """What every agent of one execution shares."""

    client: ModelClient
    sandbox: Sandbox
    deadline_s: float
    budget: SubAgentBudget


class BuiltinHarness:
    name = "builtin"

    def __init__(
        self,
        *,
        max_turns: int = 4,
        max_tokens: int | None = None,
        command_timeout_s: float = 20.0,
        max_tool_output_chars: int = 2000,
        compaction_threshold_tokens: int | None = None,
        max_sub_agents: int = 0,
        sub_agent_max_turns: int = 4,
    ) -> None:
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.command_timeout_s = command_timeout_s
        self.max_tool_output_chars = max_tool_output_chars
        self.compaction_threshold_tokens = compaction_threshold_tokens
        self.max_sub_agents = max_sub_agents
        self.sub_agent_max_turns = sub_agent_max_turns

    @property
    def main_role(self) -> AgentRole:
        tools = TOOLS + [SPAWN_AGENT_TOOL] if self.max_sub_agents > 0 else TOOLS
        return AgentRole(MAIN_AGENT_ID, SYSTEM_PROMPT, tools, self.max_turns)

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float,
            slot: ExecutionSlot | None = None) -> HarnessOutcome:
        with ModelClient(endpoint, self.max_tokens) as client:
            run = _Run(client, sandbox, deadline_s, SubAgentBudget(self.max_sub_agents))
            result = self._agent(run, self.main_role, query.instruction)
        return HarnessOutcome(result.status, result.turns)

    def _agent(self, run: _Run, role: AgentRole, task: str) -> AgentResult:
        """One agent's loop, main or sub-agent, until it finishes, runs out of turns or time."""
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": role.system_prompt},
            {"role": "user", "content": task},
        ]
        used_tokens = 0
        report = ""
        for turn in range(role.max_turns):
            if due(used_tokens, self.compaction_threshold_tokens):
                fresh = compact(run.client, messages, role.tools, role.agent_id, task, run.deadline_s)
                if fresh is None:
                    return AgentResult(ExecutionStatus.harness_timeout, turn, report)
                messages = fresh
            response = run.client.chat(messages, role.tools, role.agent_id, run.deadline_s)
            if response is None:
                return AgentResult(ExecutionStatus.harness_timeout, turn, report)
            used_tokens = context_tokens(response)
            message = response["choices"][0]["message"]
            messages.append(message)
            report = message.get("content") or report
            tool_calls = message.get("tool_calls") or []
            if not tool_calls:
                return AgentResult(ExecutionStatus.completed, turn + 1, report)
            for tc in tool_calls:
                name = tc["function"]["name"]
                args = parse_arguments(tc["function"].get("arguments", "{}"))
                if name == FINISH:
                    summary = args.get("summary") if isinstance(args, dict) else None
                    return AgentResult(ExecutionStatus.completed, turn + 1,
                                       summary if isinstance(summary, str) else report)
                if isinstance(args, str):
                    result = args
                elif name == SPAWN_AGENT and role.agent_id == MAIN_AGENT_ID and self.max_sub_agents > 0:
                    sub = self._spawn(run, args)
                    if sub.status is ExecutionStatus.harness_timeout:
                        return AgentResult(ExecutionStatus.harness_timeout, turn + 1, report)
                    result = sub.report
                else:
                    result = run_sandbox_tool(run.sandbox, name, args, run.deadline_s, self.command_timeout_s)
                messages.append({"role": "tool", "tool_call_id": tc.get("id", ""),
                                 "content": result[: self.max_tool_output_chars]})
        return AgentResult(ExecutionStatus.completed, role.max_turns, report)

    def _spawn(self, run: _Run, args: dict[str, Any]) -> AgentResult:
        """Run a sub-agent on `args["task"]`; its report (or an error) is the tool result."""
        task = args.get("task")
        if not isinstance(task, str) or not task.strip():
            return AgentResult(ExecutionStatus.completed, 0, "error: spawn_agent needs a non-empty string 'task'")
        agent_id = run.budget.take()
        if agent_id is None:
            return AgentResult(ExecutionStatus.completed, 0,
                               f"error: no sub-agents left ({run.budget.limit} per execution)")
        role = AgentRole(agent_id, SUB_AGENT_SYSTEM_PROMPT, TOOLS, self.sub_agent_max_turns)
        result = self._agent(run, role, task)
        if not result.report:
            result.report = no_report(agent_id, result.turns)
        return result
