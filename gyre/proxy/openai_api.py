"""The OpenAI chat-completions front end: request schema, template messages, responses.

What mini-swe-agent (through litellm), the builtin harness and any OpenAI-SDK agent send:
`POST /v1/chat/completions` with `messages`, optional `tools`, streaming or not, `n=1`.
Sampling: `temperature`, `top_p`, `max_tokens` / `max_completion_tokens`, `stop` (cut as
`stops.py` says; finish_reason "stop"). `tool_choice`: "auto" (default; the model decides),
"none" (tools are not rendered into the prompt and the output is never parsed for tool
calls); "required" and a named function are a 400, since decoding cannot be constrained
here. `parallel_tool_calls` is accepted and not enforced (the model calls what it calls).
Requests are validated here (pydantic, unknown fields ignored so new client versions keep
working); the call itself runs in `completion.py`. Streaming follows OpenAI's SSE:
a role chunk, content deltas, tool calls, a finish chunk, an optional usage chunk, then
`data: [DONE]`. An error after streaming began is sent as a `data: {"error": ...}` event.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from starlette.responses import Response, StreamingResponse

from gyre.proxy.completion import MAX_STOP_CHARS, MAX_STOP_STRINGS, CompletionCore, TurnRequest, TurnResult
from gyre.proxy.errors import ProxyError, openai_error_body
from gyre.proxy.output import ParsedOutput
from gyre.proxy.sessions import ExecutionSession


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class FunctionCallIn(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Open):
    id: str | None = None
    type: str = "function"
    function: FunctionCallIn


class ContentPart(_Open):
    type: str
    text: str | None = None


class ChatMessage(_Open):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(_Open):
    type: str = "function"
    function: FunctionDef


class StreamOptions(_Open):
    include_usage: bool = False


class NamedFunction(_Open):
    name: str


class ToolChoiceFunction(_Open):
    type: Literal["function"] = "function"
    function: NamedFunction


StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]


class ChatCompletionRequest(_Open):
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, ge=0.0, le=1.0)
    stop: StopString | Annotated[list[StopString], Field(max_length=MAX_STOP_STRINGS)] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None


MESSAGE = TypeAdapter(ChatMessage)
"""One message, validated on its own (`message_cache.py`)."""


def _arguments(raw: str | dict[str, Any]) -> dict[str, Any] | str:
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    return parsed if isinstance(parsed, dict) else raw


def template_message(message: ChatMessage, inline_reasoning: bool) -> dict[str, Any]:
    """An OpenAI chat message as a chat template expects it (tool-call arguments as dicts)."""
    content = message.content
    if isinstance(content, list):  # content parts: the text parts, in order
        content = "".join(p.text or "" for p in content if p.text is not None)
    out: dict[str, Any] = {"role": "system" if message.role == "developer" else message.role, "content": content or ""}
    if message.reasoning_content:
        if inline_reasoning:
            out["content"] = f"<think>{message.reasoning_content}</think>\n\n{out['content']}"
        else:
            out["reasoning_content"] = message.reasoning_content
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function", "function": {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)}}
            for tc in message.tool_calls
        ]
    return out


def response_message(parsed: ParsedOutput, call_ids: list[str]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content or None}
    if parsed.reasoning is not None:
        message["reasoning_content"] = parsed.reasoning
    if parsed.tool_calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function",
             "function": {"name": tc.name, "arguments": json.dumps(tc.arguments, ensure_ascii=False)}}
            for cid, tc in zip(call_ids, parsed.tool_calls)
        ]
    return message


def _choice_name(choice: str | ToolChoiceFunction) -> str:
    return choice if isinstance(choice, str) else f"function {choice.function.name}"


def _stops(stop: str | list[str] | None) -> tuple[str, ...]:
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(dict.fromkeys(stop))


def _finish_reason(result: TurnResult) -> str:
    if result.parsed.tool_calls:
        return "tool_calls"
    return "stop" if result.finish_reason == "stop" else "length"


def _usage(result: TurnResult) -> dict[str, int]:
    return {"prompt_tokens": result.prompt_tokens, "completion_tokens": result.output_tokens,
            "total_tokens": result.prompt_tokens + result.output_tokens}


def _call_ids(parsed: ParsedOutput) -> list[str]:
    return [f"call_{tc.call_id}" for tc in parsed.tool_calls]


def _turn_request(body: ChatCompletionRequest, session: ExecutionSession, headers, inline_reasoning: bool,
                  templated: list[dict[str, Any]] | None) -> TurnRequest:
    """The API-neutral turn of a chat completion request; what the proxy cannot honour is a 400."""
    if body.n != 1:
        raise ProxyError(400, "only n=1 is supported", param="n")
    if body.tool_choice is not None and body.tool_choice not in ("auto", "none"):
        raise ProxyError(400, f"tool_choice {_choice_name(body.tool_choice)!r} is not supported: this proxy cannot "
                         "constrain decoding to a tool call; use 'auto' (the model decides) or 'none'",
                         param="tool_choice")
    plain = body.tool_choice == "none"
    return TurnRequest(
        session=session,
        messages=templated or [template_message(m, inline_reasoning) for m in body.messages],
        tools=[t.model_dump(exclude_none=True) for t in body.tools] if body.tools and not plain else None,
        temperature=body.temperature,
        top_p=body.top_p,
        stop=_stops(body.stop),
        parse_tool_calls=not plain,
        max_tokens=body.max_completion_tokens or body.max_tokens,
        kind="chat",
        assistant_message=lambda p: template_message(
            ChatMessage.model_validate(response_message(p, _call_ids(p))), inline_reasoning
        ),
        agent_id=headers.get("x-gyre-agent-id"),
        session_hint=headers.get("x-gyre-session-id") or body.user,
    )


async def chat_completions(
    core: CompletionCore, body: ChatCompletionRequest, session: ExecutionSession, headers, model_name: str,
    inline_reasoning: bool, receive=None, templated: list[dict[str, Any]] | None = None,
) -> Response:
    """`templated`: `template_message` of each message, when the caller has them already."""
    turn = await core.turn(_turn_request(body, session, headers, inline_reasoning, templated))
    head = {"id": f"chatcmpl-{turn.call_id}", "created": int(time.time()), "model": body.model or model_name}
    if not body.stream:
        result = await turn.complete(receive)
        payload = {
            "id": head["id"], "object": "chat.completion", "created": head["created"], "model": head["model"],
            "choices": [{"index": 0, "message": response_message(result.parsed, _call_ids(result.parsed)),
                         "finish_reason": _finish_reason(result), "logprobs": None}],
            "usage": _usage(result),
        }
        return Response(orjson.dumps(payload), media_type="application/json")
    events = turn.stream()
    first = await anext(events)  # errors before the first token still get a proper status
    include_usage = bool(body.stream_options and body.stream_options.include_usage)
    return StreamingResponse(_chunk_stream(head, first, events, include_usage), media_type="text/event-stream",
                             headers={"cache-control": "no-cache"})


async def _chunk_stream(head: dict[str, Any], first, events, include_usage: bool) -> AsyncIterator[bytes]:
    """A streamed completion's chunks: the role, content and reasoning as the turn's events
    arrive, each tool call, the finish reason, the usage when asked for, then `[DONE]`; an error
    mid-stream is an error body."""
    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        body = {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"], "model": head["model"],
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]}
        return b"data: " + orjson.dumps(body) + b"\n\n"

    yield chunk({"role": "assistant", "content": ""})
    try:
        event = first
        while True:
            kind, value = event
            if kind == "content":
                yield chunk({"content": value})
            elif kind == "reasoning":
                yield chunk({"reasoning_content": value})
            else:
                result: TurnResult = value
                for i, tc in enumerate(response_message(result.parsed, _call_ids(result.parsed)).get("tool_calls", [])):
                    yield chunk({"tool_calls": [dict(tc, index=i)]})
                yield chunk({}, _finish_reason(result))
                if include_usage:
                    usage = {"id": head["id"], "object": "chat.completion.chunk", "created": head["created"],
                             "model": head["model"], "choices": [], "usage": _usage(result)}
                    yield b"data: " + orjson.dumps(usage) + b"\n\n"
                yield b"data: [DONE]\n\n"
                return
            event = await anext(events)
    except ProxyError as exc:
        yield b"data: " + orjson.dumps(openai_error_body(exc)) + b"\n\n"
    finally:
        await events.aclose()
