"""The Anthropic Messages front end: request schema, template messages, responses.

What Claude Code sends (see DEPENDENCIES.md): streaming `POST /v1/messages?beta=true`
with `system` as blocks, 12-24 `tools`, `thinking`, `context_management`, `metadata`,
`max_tokens` 64000, `tool_use` / `tool_result` blocks, sometimes a `role: "system"` entry
inside `messages`. Unknown fields and block types are accepted (ignored or kept as a
placeholder), so a new client version does not break a run. Sampling: `temperature`,
`top_p`, `top_k`, `max_tokens`, `stop_sequences` (cut as `stops.py` says; stop_reason
"stop_sequence" with `stop_sequence` set). `tool_choice`: "auto" (default), "none" (tools
not rendered, output never parsed for tool calls); "any" and "tool" are a 400, since
decoding cannot be constrained here; `disable_parallel_tool_use` is accepted and not
enforced. The call itself runs in `completion.py`; this module maps blocks to template messages and the outcome back to
Anthropic's message shape and its SSE order: message_start, ping, per block
content_block_start / deltas / content_block_stop, message_delta, message_stop.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter
from starlette.responses import Response, StreamingResponse

from gyre.proxy.completion import MAX_STOP_CHARS, MAX_STOP_STRINGS, CompletionCore, TurnRequest, TurnResult
from gyre.proxy.errors import ProxyError, anthropic_error_body
from gyre.proxy.output import ParsedOutput
from gyre.proxy.sessions import ExecutionSession

THINKING_SIGNATURE = "gyre"
"""Signature on thinking blocks (clients require the field; nothing verifies it here)."""


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class TextBlock(_Open):
    type: Literal["text"]
    text: str


class MediaBlock(_Open):
    type: Literal["image", "document"]


class ToolUseBlock(_Open):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any] = Field(default_factory=dict)


class ThinkingBlock(_Open):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class OtherBlock(_Open):
    """Block types this proxy does not interpret (redacted thinking, server tools, ...)."""

    type: str


_KNOWN = {"text", "image", "document", "tool_use", "thinking", "tool_result"}


def _block_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return None
    if kind in ("image", "document"):
        return "media"
    return kind if kind in _KNOWN else "other"


ResultContent = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[MediaBlock, Tag("media")] | Annotated[OtherBlock, Tag("other")]
    | Annotated[ToolUseBlock, Tag("tool_use")] | Annotated[ThinkingBlock, Tag("thinking")]
    | Annotated[OtherBlock, Tag("tool_result")],
    Discriminator(_block_tag),
]


class ToolResultBlock(_Open):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[ResultContent] | None = None
    is_error: bool | None = None


Block = Annotated[
    Annotated[TextBlock, Tag("text")] | Annotated[MediaBlock, Tag("media")] | Annotated[ToolUseBlock, Tag("tool_use")]
    | Annotated[ThinkingBlock, Tag("thinking")] | Annotated[ToolResultBlock, Tag("tool_result")]
    | Annotated[OtherBlock, Tag("other")],
    Discriminator(_block_tag),
]


class Message(_Open):
    role: Literal["user", "assistant", "system"]
    content: str | list[Block]


class SystemBlock(_Open):
    type: Literal["text"] = "text"
    text: str


class Tool(_Open):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class Metadata(_Open):
    user_id: str | None = None


class ToolChoice(_Open):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class CountTokensRequest(_Open):
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    system: str | list[SystemBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None


StopSequence = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


MESSAGE = TypeAdapter(Message)
"""One message, validated on its own (`message_cache.py`)."""


class MessagesRequest(CountTokensRequest):
    max_tokens: int = Field(ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stop_sequences: Annotated[list[StopSequence], Field(max_length=MAX_STOP_STRINGS)] | None = None
    stream: bool = False
    metadata: Metadata | None = None


def _text(blocks: list[Any]) -> str:
    parts = []
    for b in blocks:
        if isinstance(b, TextBlock):
            parts.append(b.text)
        elif isinstance(b, MediaBlock):
            parts.append(f"[{b.type}]")
    return "\n".join(parts)


def _message(m: Message, inline_reasoning: bool) -> list[dict[str, Any]]:
    if isinstance(m.content, str):
        return [{"role": m.role, "content": m.content}]
    if m.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": _text(m.content)}
        reasoning = "".join(b.thinking for b in m.content if isinstance(b, ThinkingBlock))
        if any(isinstance(b, ThinkingBlock) for b in m.content):
            if inline_reasoning:
                out["content"] = f"<think>{reasoning}</think>\n\n{out['content']}"
            else:
                out["reasoning_content"] = reasoning
        calls = [b for b in m.content if isinstance(b, ToolUseBlock)]
        if calls:
            out["tool_calls"] = [
                {"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}} for b in calls
            ]
        return [out]
    if m.role == "system":
        return [{"role": "system", "content": _text(m.content)}]
    messages: list[dict[str, Any]] = []
    pending: list[Any] = []
    for b in m.content:
        if isinstance(b, ToolResultBlock):
            if pending:
                messages.append({"role": "user", "content": _text(pending)})
                pending = []
            content = b.content if isinstance(b.content, str) else _text(b.content or [])
            if b.is_error:
                content = f"[error] {content}"
            messages.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": content})
        else:
            pending.append(b)
    if pending or not messages:
        messages.append({"role": "user", "content": _text(pending)})
    return messages


def template_messages(body: CountTokensRequest, inline_reasoning: bool) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if body.system:
        system = body.system if isinstance(body.system, str) else "\n".join(b.text for b in body.system)
        out.append({"role": "system", "content": system})
    for m in body.messages:
        out += _message(m, inline_reasoning)
    return out


def template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [
        {"type": "function", "function": {"name": t.name, "description": t.description or "",
                                          "parameters": t.input_schema or {"type": "object", "properties": {}}}}
        for t in tools
    ]


def content_blocks(parsed: ParsedOutput) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if parsed.reasoning is not None:
        blocks.append({"type": "thinking", "thinking": parsed.reasoning, "signature": THINKING_SIGNATURE})
    if parsed.content or not parsed.tool_calls:
        blocks.append({"type": "text", "text": parsed.content})
    for tc in parsed.tool_calls:
        blocks.append({"type": "tool_use", "id": f"toolu_{tc.call_id}", "name": tc.name, "input": tc.arguments})
    return blocks


def _stop_reason(result: TurnResult) -> str:
    if result.parsed.tool_calls:
        return "tool_use"
    if result.stop_sequence is not None:
        return "stop_sequence"
    return "end_turn" if result.finish_reason == "stop" else "max_tokens"


def _stop_sequence(result: TurnResult) -> str | None:
    return result.stop_sequence if _stop_reason(result) == "stop_sequence" else None


def _request(body: CountTokensRequest, session: ExecutionSession, headers, inline_reasoning: bool) -> TurnRequest:
    full = body if isinstance(body, MessagesRequest) else None  # count_tokens has no sampling fields
    metadata = full.metadata if full else None
    choice = body.tool_choice.type if body.tool_choice else "auto"
    if full is not None and choice in ("any", "tool"):  # counting tokens needs no constraint
        raise ProxyError(400, f"tool_choice type {choice!r} is not supported: this proxy cannot constrain decoding "
                         "to a tool call; use 'auto' (the model decides) or 'none'")
    plain = choice == "none"
    return TurnRequest(
        session=session,
        messages=template_messages(body, inline_reasoning),
        tools=None if plain else template_tools(body.tools),
        temperature=full.temperature if full else None,
        top_p=full.top_p if full else None,
        top_k=full.top_k if full else None,
        stop=tuple(dict.fromkeys(full.stop_sequences or ())) if full else (),
        parse_tool_calls=not plain,
        max_tokens=full.max_tokens if full else None,
        kind="messages",
        assistant_message=lambda p: _message(
            Message.model_validate({"role": "assistant", "content": content_blocks(p)}), inline_reasoning
        )[0],
        agent_id=headers.get("x-gyre-agent-id"),
        session_hint=headers.get("x-claude-code-session-id") or (metadata.user_id if metadata else None),
    )


async def count_tokens(core: CompletionCore, body: CountTokensRequest, session: ExecutionSession, headers,
                       inline_reasoning: bool) -> Response:
    prompt = await core.build_prompt(_request(body, session, headers, inline_reasoning))
    return Response(orjson.dumps({"input_tokens": len(prompt.ids)}), media_type="application/json")


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


async def messages(core: CompletionCore, body: MessagesRequest, session: ExecutionSession, headers, model_name: str,
                   inline_reasoning: bool, receive=None) -> Response:
    turn = await core.turn(_request(body, session, headers, inline_reasoning))
    model = body.model or model_name
    message_id = f"msg_{turn.call_id[5:]}"
    if not body.stream:
        result = await turn.complete(receive)
        payload = {
            "id": message_id, "type": "message", "role": "assistant", "model": model,
            "content": content_blocks(result.parsed), "stop_reason": _stop_reason(result),
            "stop_sequence": _stop_sequence(result),
            "usage": {"input_tokens": result.prompt_tokens, "output_tokens": result.output_tokens},
        }
        return Response(orjson.dumps(payload), media_type="application/json")
    events = turn.stream()
    first = await anext(events)  # errors before the first token still get a proper status
    start = {"id": message_id, "type": "message", "role": "assistant", "model": model, "content": [],
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": len(turn.prompt.ids), "output_tokens": 0}}
    return StreamingResponse(_message_stream(start, first, events), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})


async def _message_stream(start: dict[str, Any], first, events) -> AsyncIterator[bytes]:
    """A streamed message's server-sent events: `message_start`, the content blocks as the turn's
    events arrive, then `message_delta` and `message_stop`; an error mid-stream is an `error` event."""
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    blocks = _Blocks()
    try:
        event = first
        while True:
            kind, value = event
            if kind not in ("reasoning", "content"):
                for chunk in blocks.finish(value):
                    yield chunk
                return
            for chunk in blocks.delta(kind, value):
                yield chunk
            event = await anext(events)
    except ProxyError as exc:
        yield _sse("error", anthropic_error_body(exc))
    finally:
        await events.aclose()


class _Blocks:
    """The content blocks of one streamed message: which one is open, and the events that open,
    extend and close them (a thinking block closes with its signature)."""

    def __init__(self) -> None:
        self.index, self.open_kind = -1, None

    def start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self.close()
        self.index, self.open_kind = self.index + 1, kind
        out.append(_sse("content_block_start", {"type": "content_block_start", "index": self.index,
                                                "content_block": block}))
        return out

    def close(self) -> list[bytes]:
        out = []
        if self.open_kind == "thinking":
            out.append(self._delta({"type": "signature_delta", "signature": THINKING_SIGNATURE}))
        if self.open_kind is not None:
            out.append(_sse("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        self.open_kind = None
        return out

    def delta(self, kind: str, value: str) -> list[bytes]:
        """A piece of reasoning (a thinking block) or of content (a text block), its block opened first."""
        if kind == "reasoning":
            out = [] if self.open_kind == "thinking" else self.start(
                "thinking", {"type": "thinking", "thinking": "", "signature": ""})
            return out + [self._delta({"type": "thinking_delta", "thinking": value})]
        out = [] if self.open_kind == "text" else self.start("text", {"type": "text", "text": ""})
        return out + [self._delta({"type": "text_delta", "text": value})]

    def finish(self, result: TurnResult) -> list[bytes]:
        """The end of the turn: a text block if nothing else was said, each tool call as a
        `tool_use` block, then the message's stop reason and usage."""
        parsed = result.parsed
        out = []
        if self.open_kind != "text" and not parsed.content and not parsed.tool_calls:
            out += self.start("text", {"type": "text", "text": ""})
        for block in content_blocks(parsed):
            if block["type"] == "tool_use":
                out += self.start("tool_use", {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}})
                out.append(self._delta({"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}))
        out += self.close()
        out.append(_sse("message_delta", {"type": "message_delta",
                                          "delta": {"stop_reason": _stop_reason(result),
                                                    "stop_sequence": _stop_sequence(result)},
                                          "usage": {"output_tokens": result.output_tokens}}))
        out.append(_sse("message_stop", {"type": "message_stop"}))
        return out

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _sse("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})
