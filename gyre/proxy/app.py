"""The model-call proxy's HTTP app: an OpenAI chat-completions endpoint that records TITO.

Every harness reaches the policy only through here. A request is authenticated by its
per-execution key, rendered to prompt ids (with exact sampled ids spliced back in, see
`prompt.py`), generated on a rollout engine chosen by the router, and recorded as a `Call`
before the response leaves. Errors come back in the OpenAI error shape.

Streaming, the Anthropic Messages API, draining and failover belong to the proxy issue and
extend this module; a request asking for streaming gets a clear 400 until then.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from gyre.engines.base import ContextLengthError, GenerationRequest, SamplingParams
from gyre.proxy.prompt import PromptBuilder, Segment
from gyre.proxy.router import EngineRouter, NoEngineError
from gyre.proxy.sessions import SessionRegistry
from gyre.proxy.toolcalls import QwenToolCallParser, ToolCallParser, template_message
from gyre.records import Call, utc_now


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str = Field(pattern="^(system|developer|user|assistant|tool)$")
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str = ""
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=10.0)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n: int = 1
    stream: bool = False


class ProxyError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


class ProxyDefaults(BaseModel):
    """Sampling applied when a request does not say (the run's rollout settings)."""

    temperature: float = 1.0
    max_new_tokens: int = 128
    max_new_tokens_cap: int = 4096


def create_app(
    router: EngineRouter,
    sessions: SessionRegistry,
    tokenizer,
    *,
    model_name: str,
    stop_token_ids: tuple[int, ...],
    defaults: ProxyDefaults = ProxyDefaults(),
    parser: ToolCallParser | None = None,
) -> FastAPI:
    app = FastAPI(title="gyre proxy")
    builder = PromptBuilder(tokenizer)
    parser = parser or QwenToolCallParser()

    @app.exception_handler(ProxyError)
    async def _proxy_error(_: Request, exc: ProxyError) -> JSONResponse:
        return _error(exc.status, exc.message, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        return _error(400, f"invalid request: {where}: {first.get('msg', 'bad input')}", "invalid_request_error")

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", "engines": [e.engine_id for e in router.engines()]}

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": model_name, "object": "model", "owned_by": "gyre"}]}

    @app.post("/v1/chat/completions")
    def chat_completions(body: ChatCompletionRequest, request: Request) -> dict[str, Any]:
        auth = request.headers.get("authorization", "")
        key = auth[7:].strip() if auth.lower().startswith("bearer ") else ""
        session = sessions.session(key) if key else None
        if session is None:
            raise ProxyError(401, "unknown or missing API key", "authentication_error")
        if body.stream:
            raise ProxyError(400, "stream=true is not supported by this proxy yet")
        if body.n != 1:
            raise ProxyError(400, "only n=1 is supported")
        messages = [template_message(m.model_dump(exclude_none=True)) for m in body.messages]
        try:
            prompt = builder.build(messages, body.tools, session.segments)
        except Exception as exc:  # the chat template rejected the conversation: bad input
            raise ProxyError(400, f"cannot render messages with the chat template: {exc}") from exc
        max_new = body.max_completion_tokens or body.max_tokens or defaults.max_new_tokens
        params = SamplingParams(
            temperature=defaults.temperature if body.temperature is None else body.temperature,
            max_new_tokens=min(max_new, defaults.max_new_tokens_cap),
            stop_token_ids=stop_token_ids,
        )
        started = utc_now()
        try:
            with router.lease(session.execution_id) as engine:
                result = engine.generate(GenerationRequest(prompt_ids=prompt.ids, params=params))
        except ContextLengthError as exc:
            raise ProxyError(400, str(exc), "context_length_exceeded") from exc
        except NoEngineError as exc:
            raise ProxyError(503, str(exc), "server_error") from exc
        ended = bool(result.output_ids) and result.output_ids[-1] in stop_token_ids
        text_ids = result.output_ids[:-1] if ended else result.output_ids
        text = tokenizer.decode(text_ids, skip_special_tokens=False)
        content, tool_calls = parser.parse(text)
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
        if tool_calls:
            assistant["tool_calls"] = [tc.to_openai() for tc in tool_calls]
        call = Call(
            call_id=f"call-{uuid.uuid4().hex[:16]}",
            execution_id=session.execution_id,
            agent_id=request.headers.get("x-gyre-agent-id"),
            kind="chat",
            prompt_ids=prompt.ids,
            output_ids=result.output_ids,
            logprobs=result.logprobs,
            policy_version=result.policy_version,
            engine_id=result.engine_id,
            finish_reason=result.finish_reason,
            started_at=started,
            finished_at=utc_now(),
        )
        canonical = builder.canonical_segment(messages, body.tools, template_message(assistant))
        sessions.record(session, call, canonical, Segment(result.output_ids, ended), prompt.fallback_turns)
        finish_reason = "tool_calls" if tool_calls else ("stop" if result.finish_reason == "stop" else "length")
        return {
            "id": f"chatcmpl-{call.call_id}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.model or model_name,
            "choices": [{"index": 0, "message": assistant, "finish_reason": finish_reason}],
            "usage": {
                "prompt_tokens": len(prompt.ids),
                "completion_tokens": len(result.output_ids),
                "total_tokens": len(prompt.ids) + len(result.output_ids),
            },
        }

    return app
