"""The builtin reference agent: an OpenAI tool-calling loop over a sandbox.

It is what `make run` drives and what CI exercises end to end: each turn it sends the whole
conversation to the proxy with three tools (run a shell command, write a file, finish),
executes the tool calls it gets back inside the sandbox, and appends the results. It stops
when the model calls `finish`, answers without a tool call, runs out of turns, or the
harness deadline passes (the workspace is kept either way). Tool arguments that do not fit
a tool's schema go back to the model as an error message, as a real harness would.
Compaction and sub-agents (trajectory trees like Claude Code's) come with the harness issue.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

from gyre.harnesses.base import HarnessOutcome, ModelEndpoint
from gyre.records import ExecutionStatus, Query
from gyre.sandboxes.base import Sandbox

SYSTEM_PROMPT = (
    "You are a coding agent working in a repository. Use the tools to create and test files. "
    "Call finish when the task is done."
)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run_shell",
            "description": "Run a shell command in the repository and return its output",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file (path relative to the repository)",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "finish",
            "description": "Stop: the task is done",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}},
        },
    },
]

HTTP_RETRIES = 3
HTTP_BACKOFF_S = 0.5


class BuiltinHarness:
    name = "builtin"

    def __init__(
        self,
        *,
        max_turns: int = 4,
        max_tokens: int | None = None,
        command_timeout_s: float = 20.0,
        max_tool_output_chars: int = 2000,
    ) -> None:
        self.max_turns = max_turns
        self.max_tokens = max_tokens
        self.command_timeout_s = command_timeout_s
        self.max_tool_output_chars = max_tool_output_chars

    def run(self, query: Query, sandbox: Sandbox, endpoint: ModelEndpoint, deadline_s: float) -> HarnessOutcome:
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": query.instruction},
        ]
        headers = {"Authorization": f"Bearer {endpoint.api_key}"}
        with httpx.Client(base_url=endpoint.base_url, headers=headers) as client:
            for turn in range(self.max_turns):
                remaining = deadline_s - time.monotonic()
                if remaining <= 0:
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn)
                body: dict[str, Any] = {"model": endpoint.model, "messages": messages, "tools": TOOLS}
                if self.max_tokens:
                    body["max_tokens"] = self.max_tokens
                response = self._post(client, body, timeout_s=remaining)
                if response is None:
                    return HarnessOutcome(ExecutionStatus.harness_timeout, turn)
                message = response["choices"][0]["message"]
                messages.append(message)
                tool_calls = message.get("tool_calls") or []
                if not tool_calls:
                    return HarnessOutcome(ExecutionStatus.completed, turn + 1)
                for tc in tool_calls:
                    name = tc["function"]["name"]
                    if name == "finish":
                        return HarnessOutcome(ExecutionStatus.completed, turn + 1)
                    result = self._run_tool(sandbox, name, tc["function"].get("arguments", "{}"), deadline_s)
                    messages.append({"role": "tool", "tool_call_id": tc.get("id", ""), "content": result})
        return HarnessOutcome(ExecutionStatus.completed, self.max_turns)

    def _post(self, client: httpx.Client, body: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """POST with a bounded retry on connection errors and 5xx; None when out of time."""
        for attempt in range(HTTP_RETRIES):
            try:
                response = client.post("/chat/completions", json=body, timeout=timeout_s)
            except httpx.TimeoutException:
                return None
            except httpx.TransportError:
                if attempt == HTTP_RETRIES - 1:
                    raise
                time.sleep(HTTP_BACKOFF_S * 2**attempt)
                continue
            if response.status_code >= 500 and attempt < HTTP_RETRIES - 1:
                time.sleep(HTTP_BACKOFF_S * 2**attempt)
                continue
            response.raise_for_status()
            return response.json()
        raise RuntimeError("unreachable")

    def _run_tool(self, sandbox: Sandbox, name: str, raw_args: str, deadline_s: float) -> str:
        try:
            args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
        except json.JSONDecodeError as exc:
            return f"error: arguments are not valid JSON: {exc}"
        if not isinstance(args, dict):
            return "error: arguments must be a JSON object"
        if name == "run_shell":
            command = args.get("command")
            if not isinstance(command, str):
                return "error: run_shell needs a string 'command'"
            timeout = max(0.1, min(self.command_timeout_s, deadline_s - time.monotonic()))
            res = sandbox.exec(command, timeout_s=timeout)
            text = f"exit code {res.exit_code}" + (" (timed out)" if res.timed_out else "")
            text += f"\n{res.stdout}{res.stderr}"
        elif name == "write_file":
            path, content = args.get("path"), args.get("content")
            if not isinstance(path, str) or not isinstance(content, str):
                return "error: write_file needs string 'path' and 'content'"
            try:
                sandbox.write_file(path, content)
            except (ValueError, OSError) as exc:
                return f"error: {exc}"
            text = f"wrote {len(content)} characters to {path}"
        else:
            return f"error: unknown tool {name!r}"
        return text[: self.max_tool_output_chars]
