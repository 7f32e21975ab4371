"""Parsing a model's tool-call text into API tool calls, per model family.

Two formats, one parser each (`PARSERS` maps a family name to its parser; add a family by
adding a class):

- `<tool_call>` blocks (`qwen`, `hermes`, `smollm2`): Qwen2.5 and Qwen3 (their templates ask
  for `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one block per call),
  Hermes-style models, the bundled model, and the SmolLM2 family, which writes a JSON list of
  calls in one block, `<tool_call>[{"name": ...}, ...]</tool_call>` (`gyre.engines.models.smollm2`).
  A block holds one call object or a list of them (an empty list, SmolLM2's "no call needed",
  is no call). Reasoning is never parsed for calls: when the text holds a `</think>` that is
  not inside a `<tool_call>` block, only what follows it is searched. (The proxy splits a
  leading `<think>...</think>` off as reasoning before any parser runs, `output.py`; this
  guard covers outputs whose `<think>` was written by the prompt, as Qwen3-2507 thinking
  templates do, and whose text therefore starts inside the reasoning. Such reasoning then stays
  in the content, before the calls; see docs/models.md.)
- `llama3` (Llama 3.1, 3.2, 3.3 with JSON tool calling): the templates ask for a bare JSON
  object, `{"name": function name, "parameters": dictionary of argument name and its value}`;
  the models also write `<|python_tag|>` before it (ipython mode) and may end with
  `<|eom_id|>`, some write `"arguments"` instead of `"parameters"`, and several calls come
  separated by `;` or new lines (what vLLM's `llama3_json` parser,
  `vllm/entrypoints/openai/tool_parsers/llama_tool_parser.py`, reads too). The calls are the
  text's tail from `<|python_tag|>`, or from a `{` that starts the text or a line, when that whole
  tail is call objects; what comes before is the content. The built-in tools' Python form
  (`<|python_tag|>brave_search.call(query="...")`) is not read: it stays content. The Llama 3.x
  templates render at most one call per assistant turn, so by default an output with several
  stays content (`Llama3ToolCallParser.max_calls`).

The proxy turns calls into OpenAI `tool_calls` and Anthropic `tool_use` blocks; output that
does not parse stays plain content, never an error. A parser also names the text that opens a
call (`open_tag`), so a streaming response can hold text back from the moment a call may have
begun: `<tool_call>` for the block format; for `llama3` the empty string, since a call may
begin with its first token (`<|python_tag|>` or `{`): streamed content is then held to the end.

Content, when calls parse, is the text before the first call with trailing whitespace
removed (what follows the calls is dropped from the content, as vLLM's Hermes parser
does; the sampled tokens are recorded whole either way). Streaming relies on this: the
content is always a prefix-extension of what a stream has sent.
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
    (None: no text ever starts one; "": a call may start anywhere, all content is held)."""

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls); (text, []) when the text holds no well-formed call."""
        ...


_ID_PREFIX = secrets.token_hex(8)  # per process; a counter makes ids unique within it
_ID_NUMBERS = itertools.count()


def _call_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_NUMBERS):08x}"


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
THINK_CLOSE = "</think>"


def _reasoning_end(text: str) -> int:
    """Where reasoning ends: just after the first `</think>` that is not inside a `<tool_call>`
    block (a call's arguments may hold that text); 0 when there is none."""
    at = text.find(THINK_CLOSE)
    if at < 0:
        return 0
    opened = text.rfind("<tool_call>", 0, at)
    if opened >= 0 and text.find("</tool_call>", opened, at) < 0:
        return 0
    return at + len(THINK_CLOSE)


class QwenToolCallParser:
    """`<tool_call>{json}</tool_call>` blocks (Qwen2.5/Qwen3, Hermes, the bundled model), and
    `<tool_call>[{json}, ...]</tool_call>` blocks (the SmolLM2 family); never inside reasoning."""

    open_tag = "<tool_call>"

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        calls: list[ToolCall] = []
        first = None
        for match in _TOOL_CALL.finditer(text, _reasoning_end(text)):
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


def _call(obj: Any, key: str = "arguments") -> ToolCall | None:
    """`{"name": str, key: object or JSON text of one}` as a call; None otherwise."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    args = obj.get(key, {})
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(name=obj["name"], arguments=args, call_id=_call_id())


PYTHON_TAG = "<|python_tag|>"
END_OF_MESSAGE = "<|eom_id|>"
_LLAMA_START = re.compile(r"<\|python_tag\|>|(?:^|(?<=\n))[ \t]*\{")
_SEPARATOR = re.compile(r"\s*;?\s*")
_DECODER = json.JSONDecoder()


def _llama_call(obj: Any) -> ToolCall | None:
    """`{"name": ..., "parameters": {...}}` (the templates' key) or `"arguments"` (both: no call)."""
    if not isinstance(obj, dict) or ("parameters" in obj) == ("arguments" in obj):
        return None
    return _call(obj, "parameters" if "parameters" in obj else "arguments")


def _llama_calls(tail: str) -> list[ToolCall] | None:
    """Every call in `tail` (JSON objects, a `;` or a new line between two), or None when
    anything else is there."""
    tail = tail.rstrip()
    if tail.endswith(END_OF_MESSAGE):
        tail = tail[: -len(END_OF_MESSAGE)].rstrip()
    pos = len(PYTHON_TAG) if tail.startswith(PYTHON_TAG) else 0
    calls: list[ToolCall] = []
    while True:
        gap = _SEPARATOR.match(tail, pos)
        pos = gap.end()
        if pos >= len(tail):
            return calls or None
        between = gap.group()
        if calls and not (";" in between or "\n" in between):
            return None  # two calls need a `;` or a new line between them
        if not calls and ";" in between:
            return None
        try:
            obj, pos = _DECODER.raw_decode(tail, pos)
        except json.JSONDecodeError:
            return None
        call = _llama_call(obj)
        if call is None:
            return None
        calls.append(call)


class Llama3ToolCallParser:
    """Llama 3.x JSON tool calls: `[<|python_tag|>]{"name": ..., "parameters": {...}}`, several
    separated by `;` or new lines, after optional content.

    `max_calls` (default 1): an output with more calls than this stays plain content. The Llama
    3.1/3.2/3.3 templates raise "This model only supports single tool-calls at once!" for an
    assistant turn with more than one call, so such a turn could never be rendered back (not when
    the proxy remembers it, not when the harness sends it back); as content the conversation goes
    on. None reads any number (a template that renders several)."""

    open_tag = ""  # a call may begin at the first token: hold streamed content to the end

    def __init__(self, max_calls: int | None = 1) -> None:
        self.max_calls = max_calls

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        for start in _LLAMA_START.finditer(text):
            calls = _llama_calls(text[start.start() :].lstrip(" \t"))
            if calls:
                if self.max_calls is not None and len(calls) > self.max_calls:
                    return text, []
                return text[: start.start()].rstrip(), calls
        return text, []


class NoToolCallParser:
    """Every output is plain text (a request with tool_choice "none")."""

    open_tag = None

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        return text, []


NO_TOOL_CALLS = NoToolCallParser()

PARSERS: dict[str, type] = {
    "qwen": QwenToolCallParser, "hermes": QwenToolCallParser, "smollm2": QwenToolCallParser,
    "llama3": Llama3ToolCallParser,
}
"""Model family -> tool-call parser class."""


def parser_for(family: str) -> ToolCallParser:
    try:
        return PARSERS[family]()
    except KeyError:
        raise ValueError(f"no tool-call parser for model family {family!r}; known: {sorted(PARSERS)}") from None
