"""The builtin agent's sandbox tools: their OpenAI schemas and what running one does.

`TOOLS` (run a shell command, write a file, finish) is what every builtin agent is
offered, and exactly what the warm start's demonstrations and the bundled tokenizer's
corpus are built from (`gyre.runtime.warmstart`, `gyre.runtime.resolve`): changing a schema here changes
the cached warm-started model. Tools that exist only with a feature switched on (the
main agent's `spawn_agent`) live with that feature (`subagents.py`).

A tool call whose arguments do not fit its schema is answered with an error message to
the model, as a real harness would; nothing here raises for the model's mistakes.
"""

from __future__ import annotations

import json
import time
from typing import Any

from gyre.sandboxes.base import Sandbox

FINISH = "finish"

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
            "name": FINISH,
            "description": "Stop: the task is done",
            "parameters": {"type": "object", "properties": {"summary": {"type": "string"}}},
        },
    },
]


def parse_arguments(raw_args: str | dict[str, Any]) -> dict[str, Any] | str:
    """The tool call's arguments as a dict, or the error message for the model."""
    try:
        args = json.loads(raw_args) if isinstance(raw_args, str) else raw_args
    except json.JSONDecodeError as exc:
        return f"error: arguments are not valid JSON: {exc}"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    return args


def run_sandbox_tool(
    sandbox: Sandbox, name: str, args: dict[str, Any], deadline_s: float, command_timeout_s: float
) -> str:
    """Run `run_shell` or `write_file` in the sandbox; the text that goes back to the model."""
    if name == "run_shell":
        command = args.get("command")
        if not isinstance(command, str):
            return "error: run_shell needs a string 'command'"
        timeout = max(0.1, min(command_timeout_s, deadline_s - time.monotonic()))
        res = sandbox.exec(command, timeout_s=timeout)
        text = f"exit code {res.exit_code}" + (" (timed out)" if res.timed_out else "") + (
            f" (stopped: {res.limit_hit})" if res.limit_hit else "")
        return text + f"\n{res.stdout}{res.stderr}"
    if name == "write_file":
        path, content = args.get("path"), args.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            return "error: write_file needs string 'path' and 'content'"
        try:
            sandbox.write_file(path, content)
        except (ValueError, OSError) as exc:
            return f"error: {exc}"
        return f"wrote {len(content)} characters to {path}"
    return f"error: unknown tool {name!r}"
