"""Parsing a model's tool-call text into API tool calls, and back into template messages.

The bundled model (like Qwen) writes tool calls as `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`. The proxy turns them into OpenAI `tool_calls`; text that does not
parse stays plain content, never an error. Parsers are per model family behind
`ToolCallParser`; the Qwen-style one is the default.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]
    call_id: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": json.dumps(self.arguments, ensure_ascii=False)},
        }


class ToolCallParser(Protocol):
    def parse(self, text: str) -> tuple[str, list[ToolCall]]: ...


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class QwenToolCallParser:
    """`<tool_call>{json}</tool_call>` blocks; content is the text outside them."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        for block in _TOOL_CALL.findall(text):
            try:
                obj = json.loads(block)
            except json.JSONDecodeError:
                return text, []
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
                return text, []
            args = obj.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    return text, []
            if not isinstance(args, dict):
                return text, []
            calls.append(ToolCall(name=obj["name"], arguments=args, call_id=f"call_{secrets.token_hex(8)}"))
        if not calls:
            return text, []
        return _TOOL_CALL.sub("", text).strip(), calls


def template_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat message as a chat template expects it (tool-call arguments as dicts)."""
    out = {k: v for k, v in message.items() if k in ("role", "content", "name", "tool_call_id")}
    content = out.get("content")
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        out["content"] = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    elif content is None:
        out["content"] = ""
    if message.get("tool_calls"):
        calls = []
        for tc in message["tool_calls"]:
            fn = dict(tc.get("function") or {})
            args = fn.get("arguments", {})
            if isinstance(args, str):
                try:
                    args = json.loads(args)
                except json.JSONDecodeError:
                    pass
            calls.append({"type": "function", "function": {"name": fn.get("name", ""), "arguments": args}})
        out["tool_calls"] = calls
    return out
