"""Parsing a model's tool-call text into API tool calls, per model family.

The bundled model (like Qwen and Hermes-style models) writes tool calls as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; the SmolLM2 family writes a
JSON list of them in one block, `<tool_call>[{"name": ...}, ...]</tool_call>`
(`gyre.engines.smollm2`). One parser reads both: a block holds one call object or a list
of them (an empty list, the family's "no call needed", is no call). The proxy turns them into
OpenAI `tool_calls` and Anthropic `tool_use` blocks; output that does not parse stays
plain content, never an error. A parser also names the tag that opens a call, so a
streaming response can hold text back from the moment a call may have begun.

Content, when calls parse, is the text before the first call with trailing whitespace
removed (what follows the calls is dropped from the content, as vLLM's Hermes parser
does; the sampled tokens are recorded whole either way). Streaming relies on this: the
content is always a prefix-extension of what a stream has sent.

Parsers are looked up per model family (`PARSERS`); add a family by adding a class.
"""

from __future__ import annotations

import itertools
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


class ToolCallParser(Protocol):
    open_tag: str | None
    """Text that starts a tool call; streamed content is held back once it appears
    (None: no text ever starts one)."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls); (text, []) when the text holds no well-formed call."""
        ...


_ID_PREFIX = secrets.token_hex(8)  # per process; a counter makes ids unique within it
_ID_NUMBERS = itertools.count()


def _call_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_NUMBERS):08x}"


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


class QwenToolCallParser:
    """`<tool_call>{json}</tool_call>` blocks (Qwen2.5/Qwen3, Hermes, the bundled model), and
    `<tool_call>[{json}, ...]</tool_call>` blocks (the SmolLM2 family)."""

    open_tag = "<tool_call>"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        first = None
        for match in _TOOL_CALL.finditer(text):
            try:
                obj = json.loads(match.group(1))
            except json.JSONDecodeError:
                return text, []
            for item in obj if isinstance(obj, list) else [obj]:
                call = _call(item)
                if call is None:
                    return text, []
                calls.append(call)
            first = match.start() if first is None else first
        if not calls:
            return text, []
        return text[:first].rstrip(), calls


def _call(obj: Any) -> ToolCall | None:
    """`{"name": str, "arguments": object or JSON text of one}` as a call; None otherwise."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(name=obj["name"], arguments=args, call_id=_call_id())


class NoToolCallParser:
    """Every output is plain text (a request with tool_choice "none")."""

    open_tag = None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, []


NO_TOOL_CALLS = NoToolCallParser()

PARSERS: dict[str, type] = {"qwen": QwenToolCallParser, "hermes": QwenToolCallParser, "smollm2": QwenToolCallParser}
"""Model family -> tool-call parser class."""


def parser_for(family: str) -> ToolCallParser:
    try:
        return PARSERS[family]()
    except KeyError:
        raise ValueError(f"no tool-call parser for model family {family!r}; known: {sorted(PARSERS)}") from None
